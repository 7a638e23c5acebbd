//! The contract every standalone algorithm keeps.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::limit::Limit;

/// A rate limiting algorithm: parameters in `self`, per-key state passed in, the limit and
/// the time passed in.
///
/// Keeping state, limit and time apart is what lets one algorithm serve millions of keys
/// (state is small and stored by the caller), lets the coordination layer change a key's
/// limit at any moment without losing state, and lets tests and simulations run on
/// virtual time.
///
/// Contract (checked by the property tests of every algorithm):
/// - `peek` never changes state and answers what `check` would answer at the same instant;
/// - `check` with a denial leaves the state as `peek` would (a refused request costs nothing);
/// - a `now` earlier than one the state has already seen is never a panic, and never admits
///   more than deciding at the latest time seen would (most algorithms decide as at that
///   latest time; GCRA, whose whole state is one timestamp, decides at the `now` given);
/// - after a change of limit at time t0, every guarantee stated by the algorithm holds for
///   intervals starting at or after t0.
pub trait Algorithm {
    /// Per-key state.
    type State;

    /// The state of a key that has seen no request.
    fn new_state(&self, limit: &Limit, now: Nanos) -> Self::State;

    /// Decides a request of `cost` permits at `now`, consuming them if admitted.
    fn check(&self, state: &mut Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision;

    /// Decides as [`Algorithm::check`] would, without consuming anything.
    fn peek(&self, state: &Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision;

    /// Counts `n` permits admitted elsewhere (a node's fallback, a token client's share) as
    /// admitted at `now`, whatever the limit says: nothing is decided.
    ///
    /// Exact where it fits: when a check of cost `n` at `now` would be admitted, the state
    /// changes exactly as that check would change it (so does it when `n` one-permit checks
    /// would all be admitted, for every algorithm but the warm-up, which admits one request
    /// per free instant). Past the limit the state takes the excess as it takes admissions
    /// (the window's count, a bucket's level, a time ahead), saturating: at most one limit's
    /// worth per call (the count for the window algorithms, the burst for the others) and a
    /// bounded state, about twice the limit — each algorithm's `charge` says exactly where.
    /// A charge never lowers what the state holds, and never panics. The Redis scripts of
    /// `sluice-redis` charge exactly so.
    fn charge(&self, state: &mut Self::State, limit: &Limit, now: Nanos, n: u64);

    /// Whether `state` is, at `now`, indistinguishable from [`Algorithm::new_state`]: such a
    /// key can be evicted without changing any future decision.
    fn is_idle(&self, state: &Self::State, limit: &Limit, now: Nanos) -> bool;
}
