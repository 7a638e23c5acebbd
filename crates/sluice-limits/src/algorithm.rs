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

    /// Whether `state` is, at `now`, indistinguishable from [`Algorithm::new_state`]: such a
    /// key can be evicted without changing any future decision.
    fn is_idle(&self, state: &Self::State, limit: &Limit, now: Nanos) -> bool;
}
