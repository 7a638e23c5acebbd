//! `coordination: redis`: the rules every node decides through one Redis (seed 002 §4.3,
//! "Redis-based throttling"), exactly (one atomic script call per decision) or in batches
//! (seed 002 §4.4(5)), and locally while Redis does not answer (seed 002 §4.4(4)): from
//! the node's batch while it is valid, then with the node's share of the limit, on a state
//! that also counts what Redis admitted. What the share admits is charged to Redis before
//! the node's next central decision of the key (docs/PROTOCOL.md states the bounds per
//! window). The scripts, the batches and the fallback are `sluice-redis`;
//! this module gives the engine one [`Central`] to call and reports its state for
//! `/metrics` and `/v1/cluster` ([`CentralStatus`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use sluice_server::central::{self, RedisMode};
//! use sluice_server::{Config, Engine};
//!
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(Config::example());
//! // Does not connect yet: the first decision does, within the timeout.
//! let redis = central::connect("redis://127.0.0.1:6379/", RedisMode::Exact, Duration::from_millis(50), 3)?;
//! assert!(engine.attach_redis(redis));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_center::{FallbackConfig, FallbackLimiter, FallbackStats, Mode, Share};
use sluice_limits::{AlgorithmKind, AnyAlgorithm, Decision, Limit, Nanos, Options};
use sluice_redis::{
    BatchConfig, BatchedStore, Outcome, RedisConfig, RedisStore, TimeSource, Transition,
};

use crate::config::ConfigErrorKind;

/// How the daemon uses Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One atomic script call per decision: the limit holds exactly over all nodes, at one
    /// round trip per request.
    #[default]
    Exact,
    /// Each node takes permits in batches sized by its own rate and answers locally until
    /// the batch is used or its lease (100 ms) ends: about one Redis call per 20 ms of a
    /// node's traffic; never over the limit, but permits of an expired batch are lost.
    Batched,
}

impl RedisMode {
    /// The name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Batched => "batched",
        }
    }
}

impl fmt::Display for RedisMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RedisMode {
    type Err = CentralError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "exact" => Ok(Self::Exact),
            "batched" => Ok(Self::Batched),
            _ => Err(CentralError::UnknownMode(s.to_string())),
        }
    }
}

/// Why Redis could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CentralError {
    /// The URL is not a Redis URL.
    #[error("bad Redis URL {url:?}: {source}")]
    Url {
        /// The URL as given (any password replaced by `***`).
        url: String,
        /// Why.
        #[source]
        source: sluice_redis::Error,
    },
    /// Not `exact` or `batched`.
    #[error("unknown Redis mode {0:?} (expected exact or batched)")]
    UnknownMode(String),
}

/// Where `coordination: redis` rules are decided now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CentralMode {
    /// By Redis.
    Central,
    /// Locally, with this node's share, because Redis did not answer.
    Fallback,
}

/// The state of the Redis connection, for `/metrics` and `/v1/cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CentralStatus {
    /// Exact or batched.
    pub redis_mode: RedisMode,
    /// Central or fallback.
    pub mode: CentralMode,
    /// When the current mode began (ns since the unix epoch, the node's clock); `None`
    /// while Redis has answered since the start.
    pub since: Option<Nanos>,
    /// Changes of mode so far (to fallback and back count one each).
    pub transitions: u64,
    /// The fallback's share is `1/nodes` of each limit.
    pub nodes: u64,
    /// Decisions made by Redis (or from a batch taken from it).
    pub decisions_central: u64,
    /// Decisions made locally (fallback, or a rule Redis could not run).
    pub decisions_local: u64,
}

enum Limiter {
    Exact(FallbackLimiter<RedisStore>),
    Batched(FallbackLimiter<BatchedStore>),
}

/// Redis for the `coordination: redis` rules of one engine: the central store, its local
/// fallback and the counters of [`CentralStatus`]. Build it with [`connect`], give it to
/// [`crate::Engine::attach_redis`].
pub struct Central {
    limiter: Limiter,
    redis_mode: RedisMode,
    nodes: u64,
    /// The algorithms as the engine configures them (default options), by kind.
    algorithms: Vec<AnyAlgorithm>,
    /// The time of the last logged configuration problem + 1 (at most one a minute).
    problem_logged: AtomicU64,
}

impl fmt::Debug for Central {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Central")
            .field("redis_mode", &self.redis_mode)
            .field("nodes", &self.nodes)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// Sets up Redis at `url` for the `coordination: redis` rules: `redis://HOST:PORT[/DB]`
/// (`rediss://` for TLS is not built in), or several such URLs separated by commas for a Redis
/// Cluster (its nodes, or some of them). `timeout` bounds every call, connecting included:
/// past it the request is decided locally — in batched mode from the key's batch while it is
/// valid, then — with `1/nodes_hint` of the limit (the number of nodes sharing the Redis,
/// `--redis-nodes`; 1 or 0 means the whole limit) less what Redis admitted for the node, and
/// the engine stays in fallback, trying Redis with one request per 100 ms, until Redis
/// itself answers; a key's local admissions are charged to Redis before it decides the key
/// again.
///
/// Scripts read Redis' own clock (in µs), so the nodes' clocks need not agree.
///
/// Does not connect yet: the first decision does. A Redis that is down at start means
/// local decisions from the first request, not a failure to start.
///
/// # Errors
/// [`CentralError::Url`] when a URL cannot be parsed.
pub fn connect(
    url: &str,
    mode: RedisMode,
    timeout: Duration,
    nodes_hint: u64,
) -> Result<Central, CentralError> {
    let config = RedisConfig {
        time: TimeSource::Server,
        timeout,
        ..RedisConfig::default()
    };
    let urls: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let store = if urls.len() > 1 {
        RedisStore::cluster(&urls, config)
    } else {
        RedisStore::new(url.trim(), config)
    }
    .map_err(|source| CentralError::Url {
        url: redact(url),
        source,
    })?;
    let fallback = FallbackConfig {
        share: Share::one_of(nodes_hint.max(1)),
        ..FallbackConfig::default()
    };
    let limiter = match mode {
        RedisMode::Exact => Limiter::Exact(FallbackLimiter::new(store, fallback)),
        RedisMode::Batched => Limiter::Batched(FallbackLimiter::new(
            BatchedStore::new(store, BatchConfig::default()),
            fallback,
        )),
    };
    Ok(Central {
        limiter,
        redis_mode: mode,
        nodes: nodes_hint.max(1),
        algorithms: AlgorithmKind::ALL
            .iter()
            .map(|&k| AnyAlgorithm::new(k, Options::default()))
            .collect(),
        problem_logged: AtomicU64::new(0),
    })
}

/// `url` without its password, for messages.
fn redact(url: &str) -> String {
    // redis://user:password@host → redis://user:***@host
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((auth, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

/// Whether `coordination: redis` can run `algorithm` under `limit` (the configuration
/// refuses the rule otherwise, at its place in the file).
///
/// # Errors
/// [`ConfigErrorKind::RedisRange`] for a limit whose script values would pass 2^53 µs (e.g. a
/// token bucket of more than 100,000 per day; GCRA has no such bound). Every algorithm has a
/// script.
pub(crate) fn check_rule(algorithm: AlgorithmKind, limit: &Limit) -> Result<(), ConfigErrorKind> {
    let alg = AnyAlgorithm::new(algorithm, Options::default());
    match sluice_redis::check_limit(&alg, limit, TimeSource::Server) {
        Ok(()) => Ok(()),
        Err(e) => Err(ConfigErrorKind::RedisRange(format!(
            "{e}; use gcra, a smaller burst or a shorter unit"
        ))),
    }
}

/// The Redis key of a descriptor: the domain, then `|key=value` per entry, with `\`, `|` and
/// `=` escaped by `\` so that two descriptors never share a key (readable in `redis-cli`,
/// unlike a hash, and without a hash's collisions).
pub(crate) fn redis_key<'a>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    fn push(out: &mut String, s: &str) {
        for c in s.chars() {
            if matches!(c, '\\' | '|' | '=') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    let mut key = String::with_capacity(domain.len() + 32);
    push(&mut key, domain);
    for (k, v) in entries {
        key.push('|');
        push(&mut key, k);
        key.push('=');
        push(&mut key, v);
    }
    key
}

impl Central {
    /// Exact or batched.
    #[must_use]
    pub fn redis_mode(&self) -> RedisMode {
        self.redis_mode
    }

    /// The current state and counters.
    #[must_use]
    pub fn status(&self) -> CentralStatus {
        let stats: FallbackStats = match &self.limiter {
            Limiter::Exact(l) => l.stats(),
            Limiter::Batched(l) => l.stats(),
        };
        CentralStatus {
            redis_mode: self.redis_mode,
            mode: match stats.mode {
                Mode::Central => CentralMode::Central,
                Mode::Fallback { .. } => CentralMode::Fallback,
            },
            since: stats.since,
            transitions: stats.transitions,
            nodes: self.nodes,
            decisions_central: stats.decisions_central,
            decisions_local: stats.decisions_local,
        }
    }

    /// The local limit this node applies in fallback: its share of `limit`.
    #[must_use]
    pub fn fallback_limit(&self, limit: &Limit) -> Limit {
        Share::one_of(self.nodes).apply(limit)
    }

    /// Answers `PING` within the timeout (for a start-up log line; decisions do not need it).
    ///
    /// # Errors
    /// The Redis error or the timeout.
    pub async fn ping(&self) -> Result<(), sluice_redis::Error> {
        match &self.limiter {
            Limiter::Exact(l) => l.central().ping().await,
            Limiter::Batched(l) => l.central().store().ping().await,
        }
    }

    /// Decides `cost` permits of `key` under `limit` with `algorithm` at `now` (ns since the
    /// unix epoch, the node's clock: used by the fallback, the probes and the batches; the
    /// scripts read Redis' clock). Never fails; never waits longer than the timeout.
    pub(crate) async fn decide(
        &self,
        algorithm: AlgorithmKind,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        let index = algorithm.index();
        let Some(alg) = self.algorithms.get(index) else {
            return Decision::deny(limit.count(), 0, limit.period(), None);
        };
        let out = match &self.limiter {
            Limiter::Exact(l) => l.check(alg, key, limit, now, cost).await,
            Limiter::Batched(l) => l.check(alg, key, limit, now, cost).await,
        };
        self.account(out, now)
    }

    fn account(&self, out: Outcome, now: Nanos) -> Decision {
        if let Some(t) = out.transition {
            // Only the call that changed the mode carries the transition: one line per change.
            match t {
                Transition::ToFallback { cause } => tracing::warn!(
                    %cause,
                    nodes = self.nodes,
                    "redis does not answer: deciding coordination: redis rules locally with 1/{} of each limit",
                    self.nodes
                ),
                Transition::ToCentral { fallback_since } => tracing::info!(
                    fallback_ms = now.saturating_sub(fallback_since) / 1_000_000,
                    "redis answers again: coordination: redis rules are decided by redis"
                ),
            }
        }
        if let Some(problem) = out.problem {
            // The configuration refuses rules Redis cannot run, so this is rare; still, at
            // most one line a minute.
            let last = self.problem_logged.load(Ordering::Relaxed);
            if last == 0 || now.saturating_sub(last - 1) >= 60_000_000_000 {
                self.problem_logged
                    .store(now.saturating_add(1), Ordering::Relaxed);
                tracing::warn!(%problem, "redis cannot decide a rule; deciding it locally");
            }
        }
        out.decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_never_collide_by_concatenation() {
        let a = redis_key("d", [("a", "b=c")]);
        let b = redis_key("d", [("a=b", "c")]);
        let c = redis_key("d|a=b", []);
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert_eq!(redis_key("d", [("k", "v"), ("x", "y")]), "d|k=v|x=y");
        assert_eq!(a, "d|a=b\\=c");
    }

    #[test]
    fn modes_parse_and_passwords_stay_out_of_messages() {
        assert_eq!("Batched".parse::<RedisMode>().unwrap(), RedisMode::Batched);
        assert!("both".parse::<RedisMode>().is_err());
        assert_eq!(
            redact("redis://u:secret@h:6379/0"),
            "redis://u:***@h:6379/0"
        );
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        let e = connect("nope://x", RedisMode::Exact, Duration::from_millis(5), 2).unwrap_err();
        assert!(matches!(e, CentralError::Url { .. }), "{e}");
    }

    #[test]
    fn rules_redis_cannot_run_are_named() {
        let day: Limit = "1000000/1d".parse().unwrap();
        assert!(matches!(
            check_rule(AlgorithmKind::TokenBucket, &day),
            Err(ConfigErrorKind::RedisRange(_))
        ));
        assert!(check_rule(AlgorithmKind::Gcra, &day).is_ok());
        // Warm-up runs in Redis too; a burst that pays too far ahead at the cold interval
        // does not.
        assert!(check_rule(AlgorithmKind::WarmUp, &day).is_ok());
        let slow: Limit = "1/1d".parse().unwrap();
        let slow = slow.with_burst(1 << 40).unwrap();
        assert!(matches!(
            check_rule(AlgorithmKind::WarmUp, &slow),
            Err(ConfigErrorKind::RedisRange(_))
        ));
    }
}
