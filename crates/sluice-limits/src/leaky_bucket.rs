//! Leaky bucket (seed 002 §3.3), as a meter (police: admit or refuse) and as a shaper
//! (delay requests so they leave at the rate), with nginx `limit_req` semantics.
//!
//! Every admitted request pours its cost into a bucket of capacity `burst`, which leaks
//! `count` permits per `period`. The level is kept exactly, as an integer in units of
//! `1/period` permit (one permit is `period` units; the bucket leaks `count` units per ns), so
//! no rate has to divide the period evenly (seed 002 §3.3 warns about that rounding).
//!
//! nginx `limit_req zone=.. burst=b [nodelay | delay=d]` with rate `r` is
//! `Limit` `r` per second with `burst = b + 1` (the bucket holds the request being served
//! plus `b` waiting ones) and [`DelayPolicy::Delay`], [`DelayPolicy::NoDelay`] or
//! [`DelayPolicy::DelayAfter`]`(d)`. nginx's `excess` is the level minus the request's cost.
//!
//! ```
//! use sluice_limits::{DelayPolicy, LeakyState, Limit, Shaped, Shaper};
//!
//! // limit_req rate=10r/s burst=2: three at once leave 0, 100 and 200 ms later.
//! let limit: Limit = "10/1s".parse::<Limit>()?.with_burst(3)?;
//! let shaper = Shaper::new(DelayPolicy::Delay);
//! let mut state = LeakyState::default();
//! let ms = 1_000_000;
//! assert_eq!(shaper.shape(&mut state, &limit, 0, 1), Shaped::Now);
//! assert_eq!(shaper.shape(&mut state, &limit, 0, 1), Shaped::Delay(100 * ms));
//! assert_eq!(shaper.shape(&mut state, &limit, 0, 1), Shaped::Delay(200 * ms));
//! assert_eq!(
//!     shaper.shape(&mut state, &limit, 0, 1),
//!     Shaped::Reject { retry_after: Some(100 * ms) }
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::algorithm::Algorithm;
use crate::any::measured_from_caller;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::limit::Limit;

/// Leaky bucket as a meter: nginx `limit_req` with `nodelay` (seed 002 §3.3
/// `LeakyBucketThrottler`).
///
/// **Guarantee.** For every interval `[s, e]`, the admitted costs add up to at most
/// `burst + (e − s)·count/period`. In particular at most `burst` at once, and the long-run
/// rate is at most `count/period` (the ~2N per window of seed 002 §3.3 "The issue" is this
/// bound with `burst = count` and `e − s` close to `period`).
///
/// A request whose cost exceeds `burst` is refused with `retry_after: None`. `remaining` is
/// the free room in the bucket, `reset_after` the time until it is empty, and `retry_after`
/// of a refusal the exact time until enough has leaked.
///
/// **Limit changes.** The level (permits in the bucket, rounded up to the new period's
/// resolution) is kept: a new rate changes how fast it leaks from the change on, a smaller
/// burst refuses until the level is below it. A change of period keeps at most twice the
/// new burst (a bucket that full still refuses until two bursts have leaked at the new
/// rate). The bound above holds for intervals starting at or after the change, with the new
/// limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeakyBucket;

/// Per-key state of a [`LeakyBucket`] (shared by the meter and the [`Shaper`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeakyState {
    /// Level at `last`, in units of `1/unit` permit.
    level: u128,
    /// The period the level is measured in (0: empty bucket, no unit yet).
    unit: Nanos,
    /// Time of the level, and the latest admission seen.
    last: Nanos,
}

impl LeakyState {
    /// Permits in the bucket at the last admission (rounded up).
    #[must_use]
    pub fn level_at_last(&self) -> u64 {
        if self.unit == 0 {
            return 0;
        }
        u64::try_from(self.level.div_ceil(u128::from(self.unit))).unwrap_or(u64::MAX)
    }

    /// The level in units of `1/period` permit for `limit`'s period. After a change of
    /// period it is re-expressed exactly, rounded up (a change of period never loses water),
    /// and kept at most twice the burst: a level that high refuses until two bursts have
    /// leaked, and it is the most a charge leaves. Without the cap, many permits taken into a
    /// much longer period (a much smaller rate) pass what the Redis script computes exactly
    /// (its range check covers a level of two bursts).
    fn level_in(&self, limit: &Limit) -> u128 {
        let (from, to) = (u128::from(self.unit), u128::from(limit.period()));
        if from == to || self.level == 0 {
            return self.level;
        }
        if from == 0 {
            return 0;
        }
        let bursts = 2 * u128::from(limit.burst());
        let full = bursts.saturating_mul(to);
        let (q, r) = (self.level / from, self.level % from);
        if q >= bursts {
            return full;
        }
        // `q < 2·burst`, so this is at most `(q + 1)·to ≤ full`; `r·to < from·to` fits.
        q.saturating_mul(to)
            .saturating_add((r * to).div_ceil(from))
            .min(full)
    }
}

/// What [`Shaper::shape`] says to do with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shaped {
    /// Forward it now.
    Now,
    /// Admitted: forward it after this many nanoseconds.
    Delay(Nanos),
    /// Refused (nginx answers 503/429). `retry_after` as in [`Decision::retry_after`]:
    /// `None` when the cost exceeds the bucket.
    Reject {
        /// Earliest wait after which the same request would be admitted.
        retry_after: Option<Nanos>,
    },
}

/// Which admitted requests wait (nginx `limit_req` options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DelayPolicy {
    /// nginx default: every request waits until the bucket ahead of it has drained, so
    /// requests leave exactly at the rate.
    #[default]
    Delay,
    /// nginx `nodelay`: admitted requests leave at once (the meter).
    NoDelay,
    /// nginx `delay=d`: the first `d` permits of excess leave at once, the rest wait.
    DelayAfter(u64),
}

/// Leaky bucket as a shaper: nginx `limit_req` with a [`DelayPolicy`].
///
/// A request of cost `c` arriving at `t` finds level `ℓ` (permits, after leaking). If
/// `ℓ + c > burst` it is rejected and nothing changes; otherwise the level becomes `ℓ + c`
/// and the request waits `max(0, ℓ − d)·period/count` (rounded up to the ns) where `d` is
/// 0 for [`DelayPolicy::Delay`], `d` for [`DelayPolicy::DelayAfter`] and infinite for
/// [`DelayPolicy::NoDelay`].
///
/// **Guarantee.** With [`DelayPolicy::Delay`], requests leave paced at the rate: if
/// requests `i` before `j` leave at `r_i ≤ r_j`, then `r_j − r_i ≥ ⌊C·period/count⌋` where
/// `C` is the cost of the requests admitted from `i` up to, not including, `j`. With
/// `DelayAfter(d)`, the same with `C − d` (a burst of `d` leaves at once). Admission is the
/// meter's ([`LeakyBucket`]), so at most `burst` permits are waiting or leaving at any time,
/// and the wait is at most `(burst − c)·period/count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shaper {
    policy: DelayPolicy,
}

/// The level after leaking until `now`, and the clamped `now`.
fn leaked(state: &LeakyState, limit: &Limit, now: Nanos) -> (u128, Nanos) {
    let now = now.max(state.last);
    let drained = u128::from(now - state.last) * u128::from(limit.count());
    (state.level_in(limit).saturating_sub(drained), now)
}

/// Nanoseconds to leak `units` at `count` units per ns, rounded up.
fn drain_time(units: u128, limit: &Limit) -> Nanos {
    u64::try_from(units.div_ceil(u128::from(limit.count()))).unwrap_or(u64::MAX)
}

/// Level, clamped time, and the admission decision with the level after it.
fn meter(state: &LeakyState, limit: &Limit, now: Nanos, cost: u64) -> (Decision, u128, Nanos) {
    let d = meter_at(state, limit, now, cost);
    (
        measured_from_caller(d.0, state.last.saturating_sub(now)),
        d.1,
        d.2,
    )
}

/// As `meter`, with waits measured from the latest time seen.
fn meter_at(state: &LeakyState, limit: &Limit, now: Nanos, cost: u64) -> (Decision, u128, Nanos) {
    let (level, now) = leaked(state, limit, now);
    let unit = u128::from(limit.period());
    let cap = u128::from(limit.burst()) * unit;
    let b = limit.burst();
    // Whole permits of free room.
    let room = |level: u128| u64::try_from(cap.saturating_sub(level) / unit).unwrap_or(u64::MAX);
    if cost == 0 {
        return (
            Decision::allow(limit.count(), room(level), drain_time(level, limit)),
            level,
            now,
        );
    }
    if cost > b {
        return (
            Decision::deny(limit.count(), room(level), drain_time(level, limit), None),
            level,
            now,
        );
    }
    let after = level.saturating_add(u128::from(cost) * unit);
    if after <= cap {
        (
            Decision::allow(limit.count(), room(after), drain_time(after, limit)),
            after,
            now,
        )
    } else {
        let retry = drain_time(after - cap, limit);
        (
            Decision::deny(
                limit.count(),
                room(level),
                drain_time(level, limit),
                Some(retry),
            ),
            level,
            now,
        )
    }
}

impl LeakyBucket {
    /// A leaky bucket meter.
    #[must_use]
    pub fn new() -> Self {
        Self
    }
}

impl Algorithm for LeakyBucket {
    type State = LeakyState;

    fn new_state(&self, _limit: &Limit, _now: Nanos) -> Self::State {
        LeakyState::default()
    }

    fn check(&self, state: &mut Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        let (d, level, now) = meter(state, limit, now, cost);
        if d.allowed && cost > 0 {
            *state = LeakyState {
                level,
                unit: limit.period(),
                last: now,
            };
        }
        d
    }

    fn peek(&self, state: &Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        meter(state, limit, now, cost).0
    }

    fn is_idle(&self, state: &Self::State, limit: &Limit, now: Nanos) -> bool {
        leaked(state, limit, now).0 == 0
    }

    /// Pours `min(n, burst)` permits in at `now` (read as the latest time seen), past the
    /// burst if need be: the level stays within `2·burst` (never lowered).
    fn charge(&self, state: &mut Self::State, limit: &Limit, now: Nanos, n: u64) {
        let n = n.min(limit.burst());
        if n == 0 {
            return;
        }
        let (level, now) = leaked(state, limit, now);
        let unit = u128::from(limit.period());
        let cap = u128::from(limit.burst()) * unit;
        let poured = level.saturating_add(u128::from(n) * unit);
        *state = LeakyState {
            level: level.max(poured.min(cap.saturating_mul(2))),
            unit: limit.period(),
            last: now,
        };
    }
}

impl Shaper {
    /// A shaper with the given nginx delay policy.
    #[must_use]
    pub fn new(policy: DelayPolicy) -> Self {
        Self { policy }
    }

    /// The delay policy.
    #[must_use]
    pub fn policy(&self) -> DelayPolicy {
        self.policy
    }

    /// Decides a request of `cost` at `now`: forward now, delay, or reject. An admitted
    /// request is accounted at once (it occupies the bucket while it waits), as nginx does.
    pub fn shape(&self, state: &mut LeakyState, limit: &Limit, now: Nanos, cost: u64) -> Shaped {
        let (shaped, next) = self.decide(state, limit, now, cost);
        if let Some(next) = next {
            *state = next;
        }
        shaped
    }

    /// What [`Shaper::shape`] would answer, without changing anything.
    #[must_use]
    pub fn peek(&self, state: &LeakyState, limit: &Limit, now: Nanos, cost: u64) -> Shaped {
        self.decide(state, limit, now, cost).0
    }

    fn decide(
        &self,
        state: &LeakyState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Shaped, Option<LeakyState>) {
        let (d, after, now) = meter(state, limit, now, cost);
        if !d.allowed {
            return (
                Shaped::Reject {
                    retry_after: d.retry_after,
                },
                None,
            );
        }
        if cost == 0 {
            return (Shaped::Now, None);
        }
        let unit = u128::from(limit.period());
        let ahead = after - u128::from(cost) * unit;
        let free = match self.policy {
            DelayPolicy::Delay => 0,
            DelayPolicy::NoDelay => u128::MAX,
            DelayPolicy::DelayAfter(d) => u128::from(d) * unit,
        };
        let wait = drain_time(ahead.saturating_sub(free), limit);
        let shaped = if wait == 0 {
            Shaped::Now
        } else {
            Shaped::Delay(wait)
        };
        (
            shaped,
            Some(LeakyState {
                level: after,
                unit: limit.period(),
                last: now,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_burst_is_delayed_one_interval_apart() {
        // limit_req rate=10r/s burst=3: 4 at once, leaving 0, 100, 200, 300 ms later.
        let l = Limit::from_nanos(10, 1_000_000_000)
            .unwrap()
            .with_burst(4)
            .unwrap();
        let sh = Shaper::new(DelayPolicy::Delay);
        let mut s = LeakyState::default();
        let ms = 1_000_000;
        let got: Vec<_> = (0..5).map(|_| sh.shape(&mut s, &l, 0, 1)).collect();
        assert_eq!(
            got,
            [
                Shaped::Now,
                Shaped::Delay(100 * ms),
                Shaped::Delay(200 * ms),
                Shaped::Delay(300 * ms),
                Shaped::Reject {
                    retry_after: Some(100 * ms)
                },
            ]
        );
        let mut s = LeakyState::default();
        let nd = Shaper::new(DelayPolicy::NoDelay);
        assert!((0..4).all(|_| nd.shape(&mut s, &l, 0, 1) == Shaped::Now));
        let mut s = LeakyState::default();
        let da = Shaper::new(DelayPolicy::DelayAfter(2));
        let got: Vec<_> = (0..4).map(|_| da.shape(&mut s, &l, 0, 1)).collect();
        assert_eq!(
            got,
            [
                Shaped::Now,
                Shaped::Now,
                Shaped::Now,
                Shaped::Delay(100 * ms)
            ]
        );
    }

    /// `a·b` as its high and low 128 bits.
    fn wide(a: u128, b: u128) -> (u128, u128) {
        let m = u128::from(u64::MAX);
        let (a1, a0, b1, b0) = (a >> 64, a & m, b >> 64, b & m);
        let (mid, carry) = (a0 * b1).overflowing_add(a1 * b0);
        let (low, carry_low) = (a0 * b0).overflowing_add(mid << 64);
        let high = a1 * b1 + (mid >> 64) + (u128::from(carry) << 64) + u128::from(carry_low);
        (high, low)
    }

    fn wide_values() -> impl proptest::strategy::Strategy<Value = u64> {
        proptest::prop_oneof![1u64..=1000, 1u64..=u64::MAX, (u64::MAX - 1000)..=u64::MAX]
    }

    proptest::proptest! {
        /// A level re-expressed in another period is `min(⌈level·to/from⌉, 2·burst·to)`,
        /// exactly (checked in 256-bit products), for any level, periods and burst, and
        /// never panics.
        #[test]
        fn a_change_of_period_is_exact_up_to_two_bursts(
            level in proptest::prop_oneof![
                proptest::num::u128::ANY,
                0u128..(1 << 70),
                0u128..1_000_000,
            ],
            from in wide_values(),
            to in wide_values(),
            burst in wide_values(),
        ) {
            let s = LeakyState { level, unit: from, last: 0 };
            let l = Limit::from_nanos(1, to).unwrap().with_burst(burst).unwrap();
            let got = s.level_in(&l);
            if from == to {
                proptest::prop_assert_eq!(got, level);
                return Ok(());
            }
            let full = (2 * u128::from(burst)).saturating_mul(u128::from(to));
            proptest::prop_assert!(got <= full, "{} past two bursts, {}", got, full);
            let exact = wide(level, u128::from(to));
            if got < full {
                proptest::prop_assert!(wide(got, u128::from(from)) >= exact, "lost water");
            }
            if got > 0 {
                proptest::prop_assert!(wide(got - 1, u128::from(from)) < exact, "not the ceiling");
            }
        }
    }

    #[test]
    fn wide_products() {
        assert_eq!(wide(u128::MAX, u128::MAX), (u128::MAX - 1, 1));
        assert_eq!(wide(1 << 64, 1 << 64), (1, 0));
        assert_eq!(wide(3, 5), (0, 15));
    }

    #[test]
    fn meter_leaks_exactly_with_uneven_rates() {
        // 3 per 10 ns: one permit leaks every 3⅓ ns; saturating demand gets exactly
        // burst + 3·t/10, no rounding drift.
        let l = Limit::from_nanos(3, 10).unwrap().with_burst(10).unwrap();
        let a = LeakyBucket;
        let mut s = a.new_state(&l, 0);
        let mut admitted = 0;
        for t in 0..=1000 {
            while a.check(&mut s, &l, t, 1).allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 310);
        let d = a.check(&mut s, &l, 1000, 11);
        assert_eq!(d.retry_after, None);
    }
}
