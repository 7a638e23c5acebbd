//! One interface for every place a key's state can live, so one conformance suite runs
//! against all of them.

use std::future::Future;

use std::collections::HashMap;

use sluice_limits::{Algorithm, AnyAlgorithm, AnyState, Decision, Limit, Nanos};

use crate::error::Error;
use crate::script::AlgorithmId;
use crate::store::RedisStore;

/// Where the per-key state lives: decides a request of `cost` permits for `key` under
/// `limit` with `alg` at `now`.
pub trait Backend: Send + Sync {
    /// Decides, consuming the permits if admitted. By default a [`Backend::probe`] without
    /// a charge: a store that holds nothing locally has no cheaper answer.
    fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        self.probe(alg, key, limit, now, cost, 0)
    }

    /// Decides from what this backend already holds for `key` (a batch taken from the
    /// central store earlier and still valid), without I/O: `None` when it holds nothing
    /// valid (the exact store never does). While the batch is valid but cannot cover
    /// `cost`, a refusal until the batch ends. A fallback asks this before using its own
    /// share, so a node keeps to its batch, at its rate, while the batch lasts.
    fn held(
        &self,
        _alg: &AnyAlgorithm,
        _key: &str,
        _limit: &Limit,
        _now: Nanos,
        _cost: u64,
    ) -> Option<Decision> {
        None
    }

    /// As [`Backend::check`], but the answer always comes from the central store (a batch
    /// held, or an earlier refusal, does not answer it), and the store first counts
    /// `charge` permits the caller admitted without it (a fallback's local decisions) as
    /// admitted now, whatever the limit says — both within one timeout, so a decision that
    /// follows a fallback is taken on a count that holds what the node admitted meanwhile.
    /// A probe must reach the store to count as a fallback's recovery.
    ///
    /// An error says nothing of the charge: it may have been counted, and counting it again
    /// only over-counts.
    fn probe(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        charge: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;
}

/// `check` is the default, a probe without a charge: the same script call.
impl Backend for RedisStore {
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
impl Backend for MemoryStore {
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
