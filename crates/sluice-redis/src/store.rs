//! The exact mode: one script call per decision.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use sluice_limits::{AnyAlgorithm, Decision, Limit, Nanos};
use tokio::sync::Mutex;

use crate::error::Error;
use crate::script::{Call, Reply, TimeSource};

/// How a [`RedisStore`] talks to Redis.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Where scripts read the time (default: the Redis server's clock). The stored times
    /// are in the source's unit (µs or ns): do not share a [`RedisConfig::prefix`] between
    /// stores with different time sources.
    pub time: TimeSource,
    /// The longest a call may take, connecting included (default 50 ms). Past it the call
    /// fails with [`Error::Timeout`] and the connection is dropped and made again.
    pub timeout: Duration,
    /// Prefix of every Redis key (default `sluice:`).
    pub prefix: String,
    /// A key's state expires once it is idle (it decides as a missing key would), but never
    /// sooner than this (default 1 s). With [`TimeSource::Caller`], whose clock may be
    /// virtual, keep it longer than a run (`RedisConfig::caller_time` sets an hour).
    pub min_ttl: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            time: TimeSource::Server,
            timeout: Duration::from_millis(50),
            prefix: "sluice:".to_string(),
            min_ttl: Duration::from_secs(1),
        }
    }
}

impl RedisConfig {
    /// The defaults with the caller's time ([`TimeSource::Caller`]) and a TTL of an hour.
    #[must_use]
    pub fn caller_time() -> Self {
        Self {
            time: TimeSource::Caller,
            min_ttl: Duration::from_secs(3600),
            ..Self::default()
        }
    }
}

enum Target {
    Single(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

enum Live {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// Redis as the central store of every key's state: one atomic script call per decision.
///
/// Both a single Redis (multiplexed connection) and Redis Cluster (`MOVED`/`ASK` followed
/// by the client) are supported; every key of a rule carries one hash tag, so its state
/// lives in one slot. The connection is made on the first call and made again after a
/// failure, each time within [`RedisConfig::timeout`].
pub struct RedisStore {
    target: Target,
    live: Mutex<Option<Live>>,
    config: RedisConfig,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = match self.target {
            Target::Single(ref c) => format!("{:?}", c.get_connection_info().addr()),
            Target::Cluster(_) => "cluster".to_string(),
        };
        f.debug_struct("RedisStore")
            .field("target", &target)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on one Redis server (`redis://127.0.0.1:6379/`). Does not connect yet.
    ///
    /// # Errors
    /// [`Error::Redis`] if the URL is not valid.
    pub fn new(url: &str, config: RedisConfig) -> Result<Self, Error> {
        Ok(Self {
            target: Target::Single(redis::Client::open(url)?),
            live: Mutex::new(None),
            config,
        })
    }

    /// A store on a Redis Cluster, given some of its nodes. Does not connect yet.
    ///
    /// # Errors
    /// [`Error::Redis`] if a URL is not valid.
    pub fn cluster(nodes: &[&str], config: RedisConfig) -> Result<Self, Error> {
        let client = redis::cluster::ClusterClient::builder(nodes.iter().copied())
            .connection_timeout(config.timeout)
            .response_timeout(config.timeout)
            .build()?;
        Ok(Self {
            target: Target::Cluster(Box::new(client)),
            live: Mutex::new(None),
            config,
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Decides a request of `cost` permits for `key` under `limit` with `alg`, in Redis,
    /// atomically. `now` is used only with [`TimeSource::Caller`].
    ///
    /// # Errors
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis does not answer (see
    /// [`Error::is_unavailable`]); [`Error::OutOfRange`] for a limit the scripts cannot run
    /// exactly.
    pub async fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, Error> {
        Ok(self
            .call(alg, key, limit, now, cost, false, 0)
            .await?
            .decision)
    }

    /// Answers `PING` within the timeout.
    ///
    /// # Errors
    /// As [`RedisStore::check`].
    pub async fn ping(&self) -> Result<(), Error> {
        self.bounded(async {
            let cmd = redis::cmd("PING");
            let mut live = self.connection().await?;
            let _: String = match &mut live {
                Live::Single(c) => cmd.query_async(c).await?,
                Live::Cluster(c) => cmd.query_async(c).await?,
            };
            Ok(())
        })
        .await
    }

    /// Counts `n` permits of `key` that were admitted without Redis (a fallback's local
    /// decisions) as admitted now, whatever the limit says: the algorithm's state takes
    /// them as it takes admissions, past the limit if need be (the count for the windows,
    /// a level or a time ahead for the buckets, GCRA and warm-up; at most the count (windows)
    /// or the burst (the others) per call, within twice the limit in all). Nothing is decided.
    ///
    /// # Errors
    /// As [`RedisStore::check`]. A time out says nothing of whether the charge was counted.
    pub async fn charge(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        n: u64,
    ) -> Result<(), Error> {
        if n == 0 {
            return Ok(());
        }
        let call = self.prepare(alg, key, limit, now, 0, false, n)?;
        self.run(None, &call).await.map(|_| ())
    }

    /// [`RedisStore::charge`] of `charge` permits, then a decision (or a partial grant) of
    /// `cost`, on one connection and within one timeout: the decision is taken after the
    /// charge was counted. An error says nothing of the charge.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        partial: bool,
        charge: u64,
    ) -> Result<Reply, Error> {
        let call = self.prepare(alg, key, limit, now, cost, partial, 0)?;
        let first = match charge {
            0 => None,
            n => Some(self.prepare(alg, key, limit, now, 0, false, n)?),
        };
        let v = self.run(first.as_ref(), &call).await?;
        call.reply(&v)
    }

    /// Runs `first` (a charge), if any, then `call`, on one connection and within one
    /// timeout: `call` is taken after `first` was counted. `call`'s raw reply.
    async fn run(&self, first: Option<&Call>, call: &Call) -> Result<Vec<i64>, Error> {
        self.bounded(async {
            let mut live = self.connection().await?;
            if let Some(first) = first {
                invoke(&mut live, first).await?;
            }
            invoke(&mut live, call).await
        })
        .await
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        partial: bool,
        charge: u64,
    ) -> Result<Call, Error> {
        let ttl = u64::try_from(self.config.min_ttl.as_millis()).unwrap_or(u64::MAX);
        Call::new(
            alg,
            &self.config.prefix,
            key,
            limit,
            self.config.time,
            now,
            cost,
            partial,
            ttl,
            charge,
        )
    }

    /// Runs `f` within the timeout; on a failure that says the connection is bad, drops it
    /// so the next call connects again.
    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let r = match tokio::time::timeout(self.config.timeout, f).await {
            // The client's own timeouts (set to the same value) may fire first.
            Ok(Err(Error::Redis(e))) if e.is_timeout() => Err(Error::Timeout(self.config.timeout)),
            Ok(r) => r,
            Err(_) => Err(Error::Timeout(self.config.timeout)),
        };
        if let Err(e) = &r
            && e.is_unavailable()
            && matches!(self.target, Target::Single(_))
        {
            // A cluster connection re-routes and reconnects by itself.
            if let Ok(mut slot) = self.live.try_lock() {
                *slot = None;
            }
        }
        r
    }

    /// The live connection, connecting if there is none.
    async fn connection(&self) -> Result<Live, Error> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref() {
            return Ok(match live {
                Live::Single(c) => Live::Single(c.clone()),
                Live::Cluster(c) => Live::Cluster(c.clone()),
            });
        }
        let live = match &self.target {
            Target::Single(client) => {
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.config.timeout))
                    .set_response_timeout(Some(self.config.timeout));
                Live::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                )
            }
            Target::Cluster(client) => Live::Cluster(client.get_async_connection().await?),
        };
        let copy = match &live {
            Live::Single(c) => Live::Single(c.clone()),
            Live::Cluster(c) => Live::Cluster(c.clone()),
        };
        *slot = Some(live);
        Ok(copy)
    }
}

/// One script call on `live`.
async fn invoke(live: &mut Live, call: &Call) -> Result<Vec<i64>, Error> {
    let mut inv = call.shape.script().prepare_invoke();
    for k in &call.keys {
        inv.key(k);
    }
    for a in &call.args {
        inv.arg(a);
    }
    Ok(match live {
        Live::Single(c) => inv.invoke_async(c).await?,
        Live::Cluster(c) => inv.invoke_async(c).await?,
    })
}
