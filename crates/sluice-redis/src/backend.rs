//! One interface for every place a key's state can live, so one conformance suite runs
//! against all of them.

use std::future::Future;

use std::collections::HashMap;

use sluice_limits::{Algorithm, AnyAlgorithm, AnyState, Decision, Limit, Nanos};

use crate::error::Error;
use crate::store::RedisStore;

/// Where the per-key state lives: decides a request of `cost` permits for `key` under
/// `limit` with `alg` at `now`.
pub trait Backend: Send + Sync {
    /// Decides, consuming the permits if admitted.
    fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

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
    /// held, or an earlier refusal, does not answer it): a fallback's probe must reach the
    /// store to count as its recovery.
    fn probe(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        self.check(alg, key, limit, now, cost)
    }
}

impl Backend for RedisStore {
    fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        RedisStore::check(self, alg, key, limit, now, cost)
    }
}

/// The state in this process, decided by `sluice-limits` itself: the reference the Redis
/// scripts are held to, and the local limiter of the fallback.
#[derive(Debug, Default)]
pub struct MemoryStore {
    states: parking_lot::Mutex<StateMap>,
}

/// Per algorithm, per key state: the algorithm is part of the key, as in Redis.
type StateMap = HashMap<String, HashMap<String, AnyState>>;

/// A name for `alg` with its parameters, so two differently configured algorithms never
/// share a state.
fn algorithm_id(alg: &AnyAlgorithm) -> std::borrow::Cow<'static, str> {
    use sluice_limits::Alignment;
    match alg {
        AnyAlgorithm::FixedWindow(f) => match f.alignment() {
            Alignment::Epoch => "fixed-window".into(),
            Alignment::FirstRequest => "fixed-window-first".into(),
        },
        AnyAlgorithm::SlidingWindow(s) => format!("sliding-window/{}", s.sub_windows()).into(),
        AnyAlgorithm::SlidingLog(_) => "sliding-log".into(),
        AnyAlgorithm::LeakyBucket(_) => "leaky-bucket".into(),
        AnyAlgorithm::TokenBucket(_) => "token-bucket".into(),
        AnyAlgorithm::Gcra(_) => "gcra".into(),
        AnyAlgorithm::WarmUp(w) => format!("{w:?}").into(),
    }
}

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
        let id = algorithm_id(alg);
        let mut states = self.states.lock();
        // Look up by borrowed names: no allocation once the key is known.
        if !states.contains_key(id.as_ref()) {
            states.insert(id.to_string(), HashMap::new());
        }
        let Some(keys) = states.get_mut(id.as_ref()) else {
            return alg.peek(&alg.new_state(limit, now), limit, now, cost);
        };
        if !keys.contains_key(key) {
            keys.insert(key.to_string(), alg.new_state(limit, now));
        }
        let Some(state) = keys.get_mut(key) else {
            return alg.peek(&alg.new_state(limit, now), limit, now, cost);
        };
        alg.check(state, limit, now, cost)
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

impl Backend for MemoryStore {
    fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        std::future::ready(Ok(self.decide(alg, key, limit, now, cost)))
    }
}
