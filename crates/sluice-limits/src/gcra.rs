//! GCRA, the generic cell rate algorithm: a token bucket kept as one number (seed 002 §3.4).
//!
//! A token bucket of size `B` refilled every `T` ns holds, at time `t`, `(t + B·T − TAT) / T`
//! tokens for one "theoretical arrival time" `TAT` (capped at `B` when `TAT ≤ t`). Keeping
//! `TAT` instead of (tokens, last refill) makes the state one `u64`, which is what lets
//! the atomic and keyed forms update it with a single compare-and-swap.

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::limit::Limit;

/// GCRA (virtual scheduling form of the token bucket).
///
/// With `T` = [`Limit::emission_interval`] (`period / count`, rounded up) and `B` =
/// [`Limit::burst`], a request of `n` permits at `t` is admitted iff
/// `max(TAT, t) + n·T ≤ t + B·T`, and then `TAT := max(TAT, t) + n·T`.
///
/// # Guarantees (checked by `tests/buckets_props.rs`)
/// - **Bound.** In every closed interval `[t1, t2]` of length `L = t2 − t1`, the permits
///   admitted at times in it are at most `B + ⌊L / T⌋ ≤ B + ⌊L·count / period⌋`. This holds
///   whatever the order in which the calls arrive (proof: each admission raises `TAT` by
///   `n·T` from at least `t1`, and after it `TAT ≤ t + B·T ≤ t2 + B·T`).
/// - **No false denial.** If every request of `n ≤ B` permits is followed by a gap of at least
///   `n·T` before the next request, every request is admitted (`TAT ≤ t` at each arrival).
/// - **Limit changes.** The state is the instant `TAT`, read under whatever limit comes with
///   the call: the key's debt `TAT − now` is carried over *as time*. After a change at `t0`,
///   the bound holds for every interval starting at or after `t0` with the new `B'`, `T'`
///   (the proof above does not depend on `TAT`'s value at `t0`). If the debt exceeds the new
///   `B'·T'`, the key waits until it fits; it never waits longer than the old `B·T`.
/// - **Time.** One word of state means no clock of its own: a `now` earlier than one already
///   seen is decided at that `now`, which never admits more than deciding at the latest time
///   would (the test `max(TAT, t) + n·T ≤ t + B·T` only gets harder as `t` decreases), and
///   the bound above still holds.
/// - Cost 0 is always admitted and changes nothing; a cost above `B` is denied with
///   `retry_after: None`, and so is a request whose `TAT` would pass `u64::MAX` ns (584
///   years); `B·T` saturates. Nothing panics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gcra;

/// The whole per-key state of [`Gcra`]: the theoretical arrival time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GcraState {
    tat: Nanos,
}

impl GcraState {
    /// A state whose theoretical arrival time is `tat` (0: a full bucket).
    #[must_use]
    pub fn from_tat(tat: Nanos) -> Self {
        Self { tat }
    }

    /// The theoretical arrival time: the instant at which the bucket is full again.
    #[must_use]
    pub fn tat(&self) -> Nanos {
        self.tat
    }
}

/// A [`Limit`] prepared for GCRA: its divisions done once.
///
/// [`Gcra`] (through [`Algorithm`]) prepares the limit at every call, which costs a 64-bit
/// division (two when the bucket is not full). The lock-free forms ([`crate::AtomicGcra`], [`crate::KeyedGcra`]) also accept
/// a `GcraLimit` prepared once: then a check does no division at all. A limit that changes
/// at run time is simply prepared again; the per-key state does not depend on it.
#[derive(Debug, Clone, Copy)]
pub struct GcraLimit {
    count: u64,
    burst: u64,
    /// Emission interval `T`, ns (≥ 1).
    t: Nanos,
    /// `B·T`, saturating.
    tolerance: Nanos,
    /// `⌊(2⁶⁴ − 1) / T⌋`, for dividing by `T` with a multiplication (0: not computed).
    magic: u64,
}

impl GcraLimit {
    /// Prepares `limit`.
    #[must_use]
    pub fn new(limit: &Limit) -> Self {
        let t = limit.emission_interval();
        Self {
            count: limit.count(),
            burst: limit.burst(),
            t,
            tolerance: limit.burst().saturating_mul(t),
            magic: u64::MAX / t,
        }
    }

    /// The emission interval `T` in ns.
    #[must_use]
    pub fn emission_interval(&self) -> Nanos {
        self.t
    }

    /// The limit's count (for `RateLimit-Limit`).
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The burst `B`.
    #[must_use]
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// `⌊n / T⌋` by multiplication: the estimate `⌊n·magic / 2⁶⁴⌋` is at most 2 below the
    /// quotient (magic underestimates `2⁶⁴ / T` by less than 2), then corrected exactly.
    #[inline]
    fn div_t(&self, n: u64) -> u64 {
        if self.magic == 0 {
            return n / self.t;
        }
        let mut q = ((u128::from(n) * u128::from(self.magic)) >> 64) as u64;
        while n - q * self.t >= self.t {
            q += 1;
        }
        q
    }
}

impl GcraLimit {
    /// As [`GcraLimit::new`] without the reciprocal (`magic = 0`: divide by `T` in hardware),
    /// for a limit used once: saves a division when the bucket is full.
    #[inline]
    fn for_one_call(limit: &Limit) -> Self {
        let t = limit.emission_interval();
        Self {
            count: limit.count(),
            burst: limit.burst(),
            t,
            tolerance: limit.burst().saturating_mul(t),
            magic: 0,
        }
    }
}

/// Equal when they decide alike (whether the reciprocal was computed does not matter).
impl PartialEq for GcraLimit {
    fn eq(&self, other: &Self) -> bool {
        (self.count, self.burst, self.t) == (other.count, other.burst, other.t)
    }
}

impl Eq for GcraLimit {}

impl From<Limit> for GcraLimit {
    fn from(limit: Limit) -> Self {
        Self::new(&limit)
    }
}

/// Anything a GCRA check can read its limit from: a [`Limit`] (prepared at each call) or a
/// [`GcraLimit`] (prepared once).
pub trait AsGcraLimit {
    /// The prepared limit.
    fn gcra_limit(&self) -> GcraLimit;
}

impl AsGcraLimit for Limit {
    #[inline]
    fn gcra_limit(&self) -> GcraLimit {
        GcraLimit::for_one_call(self)
    }
}

impl AsGcraLimit for GcraLimit {
    #[inline]
    fn gcra_limit(&self) -> GcraLimit {
        *self
    }
}

/// The new TAT if a request of `cost` at `now` is admitted and changes the state; `None`
/// otherwise (denied, or cost 0). The minimum a compare-and-swap loop must compute between its
/// load and its CAS; [`decide`] gives the full answer.
#[inline]
pub(crate) fn admit(tat: Nanos, p: &GcraLimit, now: Nanos, cost: u64) -> Option<Nanos> {
    if cost == 0 || cost > p.burst {
        return None;
    }
    // A TAT past u64::MAX (584 years) cannot be stored: such a request is never admitted.
    let new_tat = cost
        .checked_mul(p.t)
        .and_then(|inc| tat.max(now).checked_add(inc))?;
    (new_tat - now <= p.tolerance).then_some(new_tat)
}

/// The decision for a request admitted at `now`, which moved TAT from `tat` to `new_tat`.
#[inline]
pub(crate) fn admitted(
    tat: Nanos,
    new_tat: Nanos,
    p: &GcraLimit,
    now: Nanos,
    cost: u64,
) -> Decision {
    let new_debt = new_tat - now;
    // A full bucket (no debt) is the common case under normal load: no division needed.
    let remaining = if tat <= now && p.tolerance != u64::MAX {
        p.burst - cost
    } else {
        p.div_t(p.tolerance - new_debt)
    };
    Decision::allow(p.count, remaining, new_debt)
}

/// Decides a request of `cost` permits against `tat`: the decision, and the new `TAT` when
/// the state must change (admitted with `cost > 0`). Shared by [`Gcra`], the atomic and the
/// keyed forms so all three decide identically.
#[inline]
#[must_use]
pub(crate) fn decide(
    tat: Nanos,
    p: &GcraLimit,
    now: Nanos,
    cost: u64,
) -> (Decision, Option<Nanos>) {
    if let Some(new_tat) = admit(tat, p, now, cost) {
        return (admitted(tat, new_tat, p, now, cost), Some(new_tat));
    }
    let debt = tat.max(now) - now;
    let remaining = p.div_t(p.tolerance.saturating_sub(debt));
    if cost == 0 {
        return (Decision::allow(p.count, remaining, debt), None);
    }
    // Past the burst, or past u64::MAX ns: never under this limit.
    let retry = cost
        .checked_mul(p.t)
        .and_then(|inc| tat.max(now).checked_add(inc))
        .filter(|_| cost <= p.burst)
        .map(|new_tat| new_tat - now - p.tolerance);
    (Decision::deny(p.count, remaining, debt, retry), None)
}

impl Algorithm for Gcra {
    type State = GcraState;

    fn new_state(&self, _limit: &Limit, _now: Nanos) -> GcraState {
        GcraState { tat: 0 }
    }

    fn check(&self, state: &mut GcraState, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        let (decision, new_tat) = decide(state.tat, &GcraLimit::for_one_call(limit), now, cost);
        if let Some(tat) = new_tat {
            state.tat = tat;
        }
        decision
    }

    fn peek(&self, state: &GcraState, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        decide(state.tat, &GcraLimit::for_one_call(limit), now, cost).0
    }

    /// Idle once `TAT ≤ now`: the bucket is full, as in a new state, under any limit.
    fn is_idle(&self, state: &GcraState, _limit: &Limit, now: Nanos) -> bool {
        state.tat <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(count: u64, period: Nanos, burst: u64) -> Limit {
        Limit::from_nanos(count, period)
            .unwrap()
            .with_burst(burst)
            .unwrap()
    }

    #[test]
    fn burst_then_rate() {
        // 10 per 100 ns, burst 3: T = 10 ns.
        let l = lim(10, 100, 3);
        let mut s = Gcra.new_state(&l, 0);
        for i in 0..3 {
            let d = Gcra.check(&mut s, &l, 0, 1);
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 2 - i);
        }
        let d = Gcra.check(&mut s, &l, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(10));
        assert_eq!(d.reset_after, 30);
        assert!(Gcra.check(&mut s, &l, 10, 1).allowed);
        assert!(!Gcra.check(&mut s, &l, 10, 1).allowed);
    }

    #[test]
    fn division_by_multiplication_is_exact() {
        let ts = [
            1u64,
            2,
            3,
            7,
            10,
            1_000_000_007,
            u64::MAX / 3,
            u64::MAX - 1,
            u64::MAX,
        ];
        let ns = [
            0u64,
            1,
            2,
            5,
            999,
            1 << 40,
            u64::MAX / 2,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &t in &ts {
            let p = GcraLimit {
                count: 1,
                burst: 1,
                t,
                tolerance: t,
                magic: u64::MAX / t,
            };
            for &n in &ns {
                assert_eq!(p.div_t(n), n / t, "{n} / {t}");
                assert_eq!(p.div_t(n.wrapping_sub(t)), n.wrapping_sub(t) / t);
            }
        }
    }

    #[test]
    fn edge_cases_do_not_panic() {
        let l = lim(1, u64::MAX, u64::MAX);
        let mut s = Gcra.new_state(&l, 0);
        let _ = Gcra.check(&mut s, &l, u64::MAX, u64::MAX);
        let _ = Gcra.check(&mut s, &l, 0, u64::MAX);
        let l = lim(5, 10, 5);
        let mut s = Gcra.new_state(&l, 0);
        let d = Gcra.check(&mut s, &l, 0, 6);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None);
        assert_eq!(s, GcraState::default());
        let d = Gcra.check(&mut s, &l, 0, 0);
        assert!(d.allowed);
        assert_eq!(s, GcraState::default());
        assert!(Gcra.check(&mut s, &l, 100, 5).allowed);
        // Time going backwards: decided at the earlier time, no panic, no extra admission.
        assert!(!Gcra.check(&mut s, &l, 50, 1).allowed);
    }
}
