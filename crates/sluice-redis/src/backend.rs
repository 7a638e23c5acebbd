//! Every place a key's state can live behind one interface ([`Center`]), so one
//! conformance suite runs against all of them: Redis, and the state in this process.

use std::future::Future;

use std::collections::HashMap;

use sluice_center::{AlgorithmId, Center};
use sluice_limits::{Algorithm, AnyAlgorithm, AnyState, Decision, Limit, Nanos};

use crate::error::Error;
use crate::store::RedisStore;

/// Exact mode: `check` is the default, a probe without a charge — the same script call.
impl Center for RedisStore {
    type Error = Error;

    async fn probe(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        charge: u64,
    ) -> Result<Decision, Error> {
        Ok(self
            .call(alg, key, limit, now, cost, false, charge)
            .await?
            .decision)
    }
}

/// The state in this process, decided by `sluice-limits` itself: the reference the Redis
/// scripts are held to, and the local limiter of the fallback.
#[derive(Debug, Default)]
pub struct MemoryStore {
    states: parking_lot::Mutex<StateMap>,
}

/// Per algorithm (its parameters included), per key state: the algorithm is part of the
/// key, as in Redis.
type StateMap = HashMap<AlgorithmId, HashMap<String, AnyState>>;

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides at once (no I/O).
    pub fn decide(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        self.with_state(alg, key, limit, now, |state| {
            alg.check(state, limit, now, cost)
        })
        .unwrap_or_else(|| alg.peek(&alg.new_state(limit, now), limit, now, cost))
    }

    /// Runs `f` on `key`'s state (created if new); `None` only if the map failed to hold it.
    fn with_state<R>(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        f: impl FnOnce(&mut AnyState) -> R,
    ) -> Option<R> {
        let mut states = self.states.lock();
        let keys = states.entry(AlgorithmId::of(alg)).or_default();
        // Looked up by the borrowed key: no allocation once the key is known.
        if !keys.contains_key(key) {
            keys.insert(key.to_string(), alg.new_state(limit, now));
        }
        keys.get_mut(key).map(f)
    }

    /// Counts `n` permits admitted elsewhere as admitted at `now`, whatever the limit says
    /// ([`Algorithm::charge`]): exactly as [`RedisStore::charge`] counts them.
    pub fn charge(&self, alg: &AnyAlgorithm, key: &str, limit: &Limit, now: Nanos, n: u64) {
        if n > 0 {
            self.with_state(alg, key, limit, now, |state| {
                alg.charge(state, limit, now, n);
            });
        }
    }

    /// Number of keys held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.states.lock().values().map(HashMap::len).sum()
    }

    /// Whether no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `check` is the default, a probe without a charge: [`MemoryStore::decide`].
impl Center for MemoryStore {
    type Error = Error;

    /// The charge is counted as Redis counts it ([`MemoryStore::charge`]), then the request
    /// decided.
    fn probe(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        charge: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        self.charge(alg, key, limit, now, charge);
        std::future::ready(Ok(self.decide(alg, key, limit, now, cost)))
    }
}
