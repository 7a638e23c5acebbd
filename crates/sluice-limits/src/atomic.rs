//! The lock-free single-key fast path: GCRA in one `AtomicU64`, updated by compare-and-swap.
//!
//! The token bucket needs (tokens, credit, last) — three words — but GCRA keeps the same
//! bucket as one instant (see [`crate::gcra`]), so a check is a load, a pure computation and
//! one CAS. The limit is an argument of every call, as everywhere in this crate: changing it
//! at run time (the coordination layer does, all the time) keeps the key's state, which
//! governor cannot do (its issues #273, #39).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::gcra::{Admission, AsGcraLimit, GcraLimit, GcraState, admitted, decide};

/// One 64-bit word that can be compare-and-swapped.
///
/// Implemented for [`AtomicU64`]; exists so the concurrency tests can run the *same* CAS loop
/// on a model checker's atomic (a newtype over `shuttle::sync::atomic::AtomicU64`).
pub trait Word: Send + Sync {
    /// A word holding `v`.
    fn new(v: u64) -> Self;
    /// The current value.
    fn load(&self) -> u64;
    /// Replaces `current` with `new` if the word still holds `current`; otherwise returns
    /// what it holds. May fail spuriously.
    ///
    /// # Errors
    /// The value actually held, when it was not `current` (or on a spurious failure).
    fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64>;
}

impl Word for AtomicU64 {
    fn new(v: u64) -> Self {
        AtomicU64::new(v)
    }

    #[inline]
    fn load(&self) -> u64 {
        // Relaxed is enough: the word guards nothing but itself, and read-modify-write
        // operations on one atomic are totally ordered, so no admission is lost or doubled.
        AtomicU64::load(self, Ordering::Relaxed)
    }

    #[inline]
    fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64> {
        AtomicU64::compare_exchange_weak(self, current, new, Ordering::Relaxed, Ordering::Relaxed)
    }
}

/// GCRA decision on a shared word: exactly [`Gcra`](crate::Gcra)'s `check`, made atomic.
#[inline]
pub(crate) fn check_word<W: Word + ?Sized>(
    word: &W,
    limit: &GcraLimit,
    now: Nanos,
    cost: u64,
) -> Decision {
    // Everything that does not depend on the state is computed before the load, so only
    // `new_tat` (a max, a compare, an add) runs between the load and the CAS: the shorter
    // that window, the fewer retries under contention. The full decision is built once the
    // CAS has succeeded.
    let admission = Admission::new(limit, now, cost);
    let mut tat = word.load();
    loop {
        let Some(new_tat) = admission.and_then(|a| a.new_tat(tat)) else {
            return decide(tat, limit, now, cost).0;
        };
        match word.compare_exchange_weak(tat, new_tat) {
            Ok(_) => return admitted(tat, new_tat, limit, now, cost),
            Err(actual) => tat = actual,
        }
    }
}

/// A single-key GCRA limiter shared by many threads without a lock.
///
/// Every [`AtomicGcra::check`] is linearizable: the decisions of concurrent calls are those
/// of [`Gcra`](crate::Gcra)'s `check` applied to the same calls in some sequential order (the
/// order of their successful CAS, or of their load for calls that change nothing). With one `now` for
/// all calls, N threads therefore admit exactly what one thread would
/// (`tests/buckets_concurrency.rs`, under `shuttle` and under real threads).
///
/// ```
/// use sluice_limits::{AtomicGcra, Limit};
/// let key = AtomicGcra::new();
/// let limit: Limit = "10/1s".parse().unwrap();
/// assert!((0..10).all(|_| key.check(&limit, 0, 1).allowed));
/// assert!(!key.check(&limit, 0, 1).allowed);
/// // The limit changes at run time; the state is kept.
/// let doubled: Limit = "20/1s".parse().unwrap();
/// assert!(key.check(&doubled, 550_000_000, 1).allowed);
/// ```
#[derive(Debug)]
pub struct AtomicGcra<W: Word = AtomicU64> {
    tat: W,
}

impl<W: Word> Default for AtomicGcra<W> {
    fn default() -> Self {
        Self::from_state(GcraState::default())
    }
}

impl AtomicGcra {
    /// A key that has seen no request (full bucket).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl<W: Word> AtomicGcra<W> {
    /// A key in the given state.
    #[must_use]
    pub fn from_state(state: GcraState) -> Self {
        Self {
            tat: W::new(state.tat()),
        }
    }

    /// The current state (a snapshot).
    #[must_use]
    pub fn state(&self) -> GcraState {
        GcraState::from_tat(self.tat.load())
    }

    /// Decides a request of `cost` permits at `now` under `limit`, consuming the permits if
    /// admitted. Lock-free: one load and, when the state changes, one CAS (retried only if
    /// another thread changed the state in between).
    ///
    /// `limit` is a [`crate::Limit`] or, on a hot path, a [`GcraLimit`] prepared once (no
    /// division per call). Passing a different limit from one call to the next is how the
    /// limit changes at run time.
    #[inline]
    pub fn check<L: AsGcraLimit + ?Sized>(&self, limit: &L, now: Nanos, cost: u64) -> Decision {
        check_word(&self.tat, &limit.gcra_limit(), now, cost)
    }

    /// [`AtomicGcra::check`] with a limit prepared once and read in place: the form for a hot
    /// path. Same decision and same new state as `check` (`tests/buckets_prepared.rs`);
    /// `check` with a `&GcraLimit` copies the 40-byte limit at each call, which measurably
    /// costs under contention (`docs/BENCHMARKS.md`).
    ///
    /// ```
    /// use sluice_limits::{AtomicGcra, GcraLimit, Limit};
    /// let limit: Limit = "10/1s".parse().unwrap();
    /// let prepared = GcraLimit::new(&limit);
    /// let key = AtomicGcra::new();
    /// assert!((0..10).all(|_| key.check_prepared(&prepared, 0, 1).allowed));
    /// assert_eq!(key.check_prepared(&prepared, 0, 1).retry_after, Some(100_000_000));
    /// ```
    #[inline]
    pub fn check_prepared(&self, limit: &GcraLimit, now: Nanos, cost: u64) -> Decision {
        check_word(&self.tat, limit, now, cost)
    }

    /// Decides as [`AtomicGcra::check`] would, without consuming anything.
    #[inline]
    #[must_use]
    pub fn peek<L: AsGcraLimit + ?Sized>(&self, limit: &L, now: Nanos, cost: u64) -> Decision {
        decide(self.tat.load(), &limit.gcra_limit(), now, cost).0
    }

    /// Whether the key is, at `now`, indistinguishable from a new one (full bucket).
    #[must_use]
    pub fn is_idle(&self, now: Nanos) -> bool {
        self.tat.load() <= now
    }
}
