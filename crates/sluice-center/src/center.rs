//! The contract of a center: what a fallback needs of any store that decides for every
//! node (Redis, a token server, or a future one).

use std::future::Future;

use sluice_limits::{Alignment, AnyAlgorithm, Decision, Limit, Nanos};

/// An error of a center, saying whether it means the center cannot be reached.
pub trait CenterError: std::error::Error + Send + Sync + 'static {
    /// Whether the center is unreachable (a time out, a refused or dropped connection, a
    /// server that does not serve): the cases in which a node decides locally until the
    /// center answers again. Any other error is a rule the center cannot run: decided
    /// locally, mode unchanged ([`crate::Outcome::problem`]).
    fn is_unavailable(&self) -> bool;
}

/// A central store that decides a request of `cost` permits for `key` under `limit` with
/// `alg` at `now` (the caller's clock) for every node.
pub trait Center: Send + Sync {
    /// What can go wrong asking it.
    type Error: CenterError;

    /// Decides, consuming the permits if admitted (from what the node holds of the center,
    /// a batch or a lease, when it can). By default a [`Center::probe`] without a charge: a
    /// center that holds nothing locally has no cheaper answer.
    fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send {
        self.probe(alg, key, limit, now, cost, 0)
    }

    /// Decides from what the node already holds for `key` (a batch or a lease taken from
    /// the center earlier and still valid), without I/O: `None` when it holds nothing
    /// valid. While the batch is valid but cannot cover `cost`, a refusal until the batch
    /// ends. A fallback asks this before using its own share, so a node keeps to its
    /// batch, at its rate, while the batch lasts.
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

    /// As [`Center::check`], but the answer always comes from the center itself (a batch
    /// held, or an earlier refusal, does not answer it), and the center first counts
    /// `charge` permits the caller admitted without it (a fallback's local decisions) as
    /// admitted now, whatever the limit says — both in one call, so a decision that follows
    /// a fallback is taken on a count that holds what the node admitted meanwhile. A probe
    /// must reach the center to count as a fallback's recovery.
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
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send;
}

/// An algorithm with its parameters (the fixed window's alignment, the sliding window's
/// sub-windows, the warm-up's period and cold factor), as a key of per-algorithm state
/// maps: two differently configured algorithms never share a state. Copied and hashed as
/// three words, so a lookup on the hot path neither formats nor allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AlgorithmId {
    kind: sluice_limits::AlgorithmKind,
    param: u64,
    /// The cold factor's bits (every factor is finite: one bit pattern per value).
    factor: u64,
}

impl AlgorithmId {
    /// `alg`'s id.
    #[must_use]
    pub fn of(alg: &AnyAlgorithm) -> Self {
        let (param, factor) = match alg {
            AnyAlgorithm::FixedWindow(f) => {
                (u64::from(f.alignment() == Alignment::FirstRequest), 0.0)
            }
            AnyAlgorithm::SlidingWindow(s) => (u64::from(s.sub_windows()), 0.0),
            AnyAlgorithm::WarmUp(w) => (w.warmup(), w.cold_factor()),
            _ => (0, 0.0_f64),
        };
        Self {
            kind: alg.kind(),
            param,
            factor: factor.to_bits(),
        }
    }
}
