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

    /// `⌊n / T⌋`, by multiplication when the reciprocal was computed.
    #[inline]
    fn div_t(&self, n: u64) -> u64 {
        div_by(n, self.t, self.magic)
    }
}

/// `⌊n / d⌋` for `d ≥ 1`, by multiplication when `magic = ⌊(2⁶⁴ − 1) / d⌋` (`magic = 0`:
/// hardware division). The estimate `⌊n·magic / 2⁶⁴⌋` is at most 2 below the quotient
/// (`magic` underestimates `2⁶⁴ / d` by less than 2), then corrected exactly.
#[inline]
pub(crate) fn div_by(n: u64, d: u64, magic: u64) -> u64 {
    if magic == 0 {
        return n / d;
    }
    let mut q = ((u128::from(n) * u128::from(magic)) >> 64) as u64;
    // Two corrections, without branches (how many are needed depends on `n`).
    q += u64::from(n - q * d >= d);
    q += u64::from(n - q * d >= d);
    q
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

/// What an admission test needs that does not depend on the state, computed before the state
/// is read: a compare-and-swap loop then runs only [`Admission::new_tat`] (a max, a compare,
/// an add) between its load and its CAS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admission {
    now: Nanos,
    /// `cost·T`.
    inc: Nanos,
    /// The latest `max(TAT, now)` that admits: `now + B·T − cost·T` (with `now + B·T`
    /// saturating at u64::MAX, which changes no answer since every TAT is ≤ u64::MAX). Also
    /// rules out a TAT past u64::MAX (584 years), which cannot be stored.
    latest: Nanos,
}

impl Admission {
    /// `None` when no state can admit the request *and* change (cost 0, cost above the
    /// burst, or `cost·T` past `u64::MAX` or above `now + B·T`).
    #[inline]
    pub(crate) fn new(p: &GcraLimit, now: Nanos, cost: u64) -> Option<Self> {
        // `1 ≤ cost ≤ B` in one comparison.
        if cost.wrapping_sub(1) >= p.burst {
            return None;
        }
        let inc = cost.checked_mul(p.t)?;
        Some(Self {
            now,
            inc,
            latest: now.saturating_add(p.tolerance).checked_sub(inc)?,
        })
    }

    /// The new TAT if the request is admitted against `tat`: `max(TAT, now) + cost·T`, if
    /// that is at most `now + B·T`.
    #[inline]
    pub(crate) fn new_tat(&self, tat: Nanos) -> Option<Nanos> {
        let base = tat.max(self.now);
        // No overflow: base + inc ≤ latest + inc ≤ u64::MAX.
        (base <= self.latest).then(|| base + self.inc)
    }
}

/// The new TAT if a request of `cost` at `now` is admitted and changes the state; `None`
/// otherwise (denied, or cost 0). [`decide`] gives the full answer.
#[inline]
pub(crate) fn admit(tat: Nanos, p: &GcraLimit, now: Nanos, cost: u64) -> Option<Nanos> {
    Admission::new(p, now, cost)?.new_tat(tat)
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

    /// Pushes TAT forward by `min(n, burst)` emission intervals from `max(TAT, now)`, past
    /// the tolerance if need be: TAT stays within `now + 2·burst·T` (never moved back).
    fn charge(&self, state: &mut GcraState, limit: &Limit, now: Nanos, n: u64) {
        let p = GcraLimit::for_one_call(limit);
        let n = n.min(p.burst);
        if n == 0 {
            return;
        }
        let ahead = state.tat.max(now).saturating_add(n.saturating_mul(p.t));
        let reach = now.saturating_add(p.tolerance.saturating_mul(2));
        state.tat = state.tat.max(ahead.min(reach));
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

    proptest::proptest! {
        /// The reciprocal division equals the hardware one for every `n` and `d ≥ 1`
        /// (small and large divisors, numerators near `u64::MAX`).
        #[test]
        fn div_by_is_exact(
            n in proptest::prop_oneof![proptest::num::u64::ANY, (u64::MAX - 1000)..=u64::MAX],
            d in proptest::prop_oneof![1u64..=1000, 1u64..=u64::MAX],
        ) {
            proptest::prop_assert_eq!(div_by(n, d, u64::MAX / d), n / d);
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
