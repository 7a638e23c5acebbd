//! Trace replay with every decision made by Redis: the `sluice-redis` Lua scripts, run with
//! the trace's own timestamps ([`TimeSource::Caller`]), so the decisions are those of
//! `sluice-limits` request for request (the scripts mirror it line by line; see
//! `sluice-redis`'s `tests/conformance.rs`) and the output is byte-identical to
//! [`super::replay`]'s.
//!
//! The simulator stays synchronous: a current-thread tokio runtime owned by
//! [`RedisReplay`] drives one script call per request, in trace order.

use std::io::{Read, Write};
use std::time::Duration;

use sluice_limits::{AnyAlgorithm, Decision, Limit, Nanos};
use sluice_redis::{RedisConfig, RedisStore, TimeSource, check_limit};

use super::{Replay, ReplayError, ReplaySummary, replay_with};

/// How long one script call may take before the replay stops with an error. Generous: a
/// replay has no latency budget, and a slow answer is not a reason to give up.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A key's state stays in Redis this long after its last use. With the trace's (virtual)
/// time the scripts cannot know how long a replay takes in wall time, so this must outlast
/// any gap between two requests of a key; the state is then left to expire.
const STATE_TTL: Duration = Duration::from_secs(24 * 3600);

/// A connection to Redis deciding every request of a replay.
#[derive(Debug)]
pub struct RedisReplay {
    runtime: tokio::runtime::Runtime,
    store: RedisStore,
    algorithm: AnyAlgorithm,
    limit: Limit,
}

impl RedisReplay {
    /// Connects to the Redis at `url` (`redis://HOST:PORT/`) and checks that its scripts
    /// can run `config`'s algorithm and limit exactly. Every key is stored under `prefix`:
    /// give each replay its own, or a second replay starts from the first one's state.
    ///
    /// # Errors
    /// [`ReplayError::Backend`] for a limit whose arithmetic would pass 2^53 in Lua's
    /// doubles, a bad URL, or a Redis that does not answer `PING`.
    pub fn connect(url: &str, config: &Replay, prefix: &str) -> Result<Self, ReplayError> {
        let backend = |e: sluice_redis::Error| ReplayError::Backend(Box::new(e));
        check_limit(&config.algorithm, &config.limit, TimeSource::Caller).map_err(backend)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ReplayError::Backend(Box::new(e)))?;
        let store = RedisStore::new(
            url,
            RedisConfig {
                time: TimeSource::Caller,
                timeout: CALL_TIMEOUT,
                prefix: prefix.to_string(),
                min_ttl: STATE_TTL,
            },
        )
        .map_err(backend)?;
        runtime.block_on(store.ping()).map_err(|e| {
            ReplayError::Backend(format!("redis at {url} does not answer: {e}").into())
        })?;
        Ok(Self {
            runtime,
            store,
            algorithm: config.algorithm,
            limit: config.limit,
        })
    }

    /// Decides one request at time `now` (ns, the trace's clock).
    ///
    /// # Errors
    /// The store's error: Redis stopped answering, or a time past 2^53 ns (104 days).
    pub fn decide(
        &self,
        key: &str,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, sluice_redis::Error> {
        self.runtime.block_on(
            self.store
                .check(&self.algorithm, key, &self.limit, now, cost),
        )
    }
}

/// [`super::replay`] with every decision made by the Redis at `url`, keys under `prefix`.
///
/// # Errors
/// As [`super::replay`]; [`ReplayError::Backend`] as [`RedisReplay::connect`] before any
/// row is written; [`ReplayError::Decide`] naming the line if Redis fails mid-way.
pub fn replay_redis<R: Read, W: Write>(
    config: &Replay,
    url: &str,
    prefix: &str,
    input: R,
    output: W,
) -> Result<ReplaySummary, ReplayError> {
    let redis = RedisReplay::connect(url, config, prefix)?;
    replay_with(config.format, input, output, |key, now, cost| {
        redis.decide(key, now, cost)
    })
}
