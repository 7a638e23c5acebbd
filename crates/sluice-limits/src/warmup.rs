//! Warm-up ramp: Guava's `SmoothWarmingUp` (seed 002 §3.4), as an admit-or-refuse
//! [`Algorithm`].
//!
//! A cold key is served slowly, `cold_factor` times the stable interval between permits, and
//! the interval shrinks linearly to the stable one as the key is used; under saturating
//! demand this takes the warm-up period. Idle keys cool down again. Guava's model: the state
//! holds *stored permits* `s ∈ [0, max]` (a cold key holds `max`); taking a permit from the
//! store costs `stable` below `threshold` and rises linearly to `cold` at `max`; idle time
//! refills the store at `max / warmup` permits per ns; with `stable = period/count`,
//! `cold = cold_factor·stable`, `threshold = ½·warmup/stable`,
//! `max = threshold + 2·warmup/(stable + cold)`, the area under the cost curve from
//! `threshold` to `max` is exactly `warmup`.

use crate::algorithm::Algorithm;
use crate::any::measured_from_caller;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::limit::Limit;

/// An invalid warm-up configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WarmUpError {
    /// The cold factor was below 1 (a cold key faster than a warm one) or not finite.
    #[error("the cold factor must be a finite number of at least 1 (got {0})")]
    ColdFactor(f64),
}

/// Warm-up ramp (Guava `SmoothWarmingUp`), reject-instead-of-wait.
///
/// Like Guava's `tryAcquire()` (no timeout), a request is admitted when the key is *free*
/// (its next free instant has come) and its cost is at most `limit.burst()`; its cost is then
/// paid by pushing the next free instant forward ("pay later"): by the stored-permit cost
/// for the permits taken from the store, `stable` for the others.
///
/// **Guarantee.** After an admission of cost `c` at `t`, the next admission is no earlier than
/// `t + I`, where `I ≥ c·period/count` (rounded up to the ns) is the cost above; so the rate
/// never exceeds `count/period` (any interval `[s, e]` admits at most
/// `burst + (e − s)·count/period`), and on a cold key the first permit costs up to
/// `cold_factor` stable intervals, falling linearly to one as stored permits are used.
///
/// A request costing more than `burst` is refused with `retry_after: None`; otherwise
/// `retry_after` is the time until the key is free. `remaining` is `burst` while the key is
/// free and 0 otherwise; `reset_after` is the time until it is free.
///
/// **Limit changes.** The state keeps the fraction `s/max` of stored permits, so a new rate
/// keeps the key as warm as it was (Guava's `setRate` scales stored permits the same way);
/// cost already paid forward stays paid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmUp {
    warmup: Nanos,
    cold_factor: f64,
}

/// Per-key state of a [`WarmUp`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmUpState {
    /// When the key is next free (Guava `nextFreeTicketMicros`).
    next_free: Nanos,
    /// Stored permits as a fraction of the maximum, in `[0, 1]` (1 = cold).
    coldness: f64,
    /// Latest admission time seen.
    last: Nanos,
}

impl WarmUpState {
    /// Stored permits as a fraction of the maximum at the last admission: 1 is cold, 0 warm.
    #[must_use]
    pub fn coldness(&self) -> f64 {
        self.coldness
    }
}

/// Guava's curve for one limit.
struct Curve {
    stable: f64,
    threshold: f64,
    max: f64,
    slope: f64,
}

impl Curve {
    fn new(limit: &Limit, warmup: Nanos, cold_factor: f64) -> Self {
        let stable = limit.period() as f64 / limit.count() as f64;
        let cold = stable * cold_factor;
        let w = warmup as f64;
        let threshold = 0.5 * w / stable;
        let max = threshold + 2.0 * w / (stable + cold);
        let span = max - threshold;
        let slope = if span > 0.0 {
            (cold - stable) / span
        } else {
            0.0
        };
        Self {
            stable,
            threshold,
            max,
            slope,
        }
    }

    /// Interval of the permit at stored level `x`.
    fn interval(&self, x: f64) -> f64 {
        self.stable + x * self.slope
    }

    /// Stored permits left, as a fraction of the maximum, after taking `take` from `stored`.
    fn left(&self, stored: f64, take: f64) -> f64 {
        if self.max > 0.0 {
            ((stored - take).max(0.0) / self.max).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// Guava `storedPermitsToWaitTime` plus the fresh permits: the cost of taking `take`
    /// permits when `stored` are in the store.
    fn cost(&self, stored: f64, take: f64) -> f64 {
        let from_store = take.min(stored);
        let above = (stored - self.threshold).max(0.0);
        let mut ns = 0.0;
        let mut rest = from_store;
        if above > 0.0 {
            let a = above.min(rest);
            ns += a * (self.interval(above) + self.interval(above - a)) / 2.0;
            rest -= a;
        }
        ns + (rest + (take - from_store)) * self.stable
    }
}

impl WarmUp {
    /// A warm-up over `warmup` ns where a cold key is `cold_factor` times slower.
    ///
    /// # Errors
    /// [`WarmUpError::ColdFactor`] when `cold_factor` is below 1 or not finite.
    pub fn new(warmup: Nanos, cold_factor: f64) -> Result<Self, WarmUpError> {
        if !cold_factor.is_finite() || cold_factor < 1.0 {
            return Err(WarmUpError::ColdFactor(cold_factor));
        }
        Ok(Self {
            warmup,
            cold_factor,
        })
    }

    /// Guava's `RateLimiter.create(rate, warmupPeriod)`: cold factor 3.
    #[must_use]
    pub fn guava(warmup: Nanos) -> Self {
        Self {
            warmup,
            cold_factor: 3.0,
        }
    }

    /// The warm-up period in ns.
    #[must_use]
    pub fn warmup(&self) -> Nanos {
        self.warmup
    }

    /// How many times slower than the stable interval a cold key is served.
    #[must_use]
    pub fn cold_factor(&self) -> f64 {
        self.cold_factor
    }

    /// How far ahead of `now` an admission or a [`Algorithm::charge`] at `now` can put the
    /// next free instant under `limit`: `2·(⌈B·c⌉ + 1)` ns, `B` the burst and `c` the cold
    /// interval (`cold_factor` stable intervals). No permit costs more than `c`, so one
    /// admission pays at most `⌈B·c⌉` ahead; charges pay forward from a next free instant
    /// that may already be ahead, and stop here. Computed in `f64` with the operations of
    /// the curve (the Redis script computes it alike); saturates at `Nanos::MAX`.
    ///
    /// An admission weighs in later decisions for at most this plus the warm-up period (the
    /// stored permits it took come back within it once the key is free).
    #[must_use]
    pub fn reach(&self, limit: &Limit) -> Nanos {
        let cold = limit.period() as f64 / limit.count() as f64 * self.cold_factor;
        let reach = 2.0 * ((limit.burst() as f64 * cold).ceil() + 1.0);
        // `as` saturates for floats out of range.
        reach as Nanos
    }

    /// Coldness and next free instant after idling until `now` (Guava `resync`).
    fn resync(&self, state: &WarmUpState, now: Nanos) -> (f64, Nanos) {
        if now <= state.next_free {
            return (state.coldness, state.next_free);
        }
        let coldness = if self.warmup == 0 {
            0.0
        } else {
            (state.coldness + (now - state.next_free) as f64 / self.warmup as f64).min(1.0)
        };
        (coldness, now)
    }

    fn decide(
        &self,
        state: &WarmUpState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Option<WarmUpState>) {
        let (d, next) = self.decide_at(state, limit, now.max(state.last), cost);
        (
            measured_from_caller(d, state.last.saturating_sub(now)),
            next,
        )
    }

    /// As `decide`, at a time no earlier than the latest seen.
    fn decide_at(
        &self,
        state: &WarmUpState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Option<WarmUpState>) {
        let b = limit.burst();
        let (coldness, next_free) = self.resync(state, now);
        let wait = next_free - now;
        let free = wait == 0;
        if cost == 0 {
            return (
                Decision::allow(limit.count(), if free { b } else { 0 }, wait),
                None,
            );
        }
        if cost > b {
            return (
                Decision::deny(limit.count(), if free { b } else { 0 }, wait, None),
                None,
            );
        }
        if !free {
            return (Decision::deny(limit.count(), 0, wait, Some(wait)), None);
        }
        let curve = Curve::new(limit, self.warmup, self.cold_factor);
        let stored = coldness * curve.max;
        let take = cost as f64;
        let pay = curve.cost(stored, take).ceil().max(1.0);
        // `as` saturates for floats out of range.
        let next_free = now.saturating_add(pay as u64);
        let next = WarmUpState {
            next_free,
            coldness: curve.left(stored, take),
            last: now,
        };
        let d = Decision::allow(
            limit.count(),
            if next_free > now { 0 } else { b },
            next_free - now,
        );
        (d, Some(next))
    }
}

impl Algorithm for WarmUp {
    type State = WarmUpState;

    fn new_state(&self, _limit: &Limit, _now: Nanos) -> Self::State {
        WarmUpState {
            next_free: 0,
            coldness: 1.0,
            last: 0,
        }
    }

    fn check(&self, state: &mut Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        let (decision, next) = self.decide(state, limit, now, cost);
        if let Some(next) = next {
            *state = next;
        }
        decision
    }

    fn peek(&self, state: &Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        self.decide(state, limit, now, cost).0
    }

    /// Takes `min(n, burst)` permits at `now` (read as the latest time seen) whether the key
    /// is free or not: their cost is paid forward from the next free instant (and the stored
    /// permits taken), which stays within [`WarmUp::reach`] of `now`, `2·(⌈burst·cold⌉ + 1)`
    /// ns (`cold` the cold interval; never moved back). Same floating-point operations as
    /// `check`.
    fn charge(&self, state: &mut Self::State, limit: &Limit, now: Nanos, n: u64) {
        let n = n.min(limit.burst());
        if n == 0 {
            return;
        }
        let now = now.max(state.last);
        let (coldness, next_free) = self.resync(state, now);
        let curve = Curve::new(limit, self.warmup, self.cold_factor);
        let stored = coldness * curve.max;
        let take = n as f64;
        let pay = curve.cost(stored, take).ceil().max(1.0);
        // `as` saturates for floats out of range.
        let ahead = next_free
            .saturating_add(pay as u64)
            .min(now.saturating_add(self.reach(limit)));
        *state = WarmUpState {
            next_free: next_free.max(ahead),
            coldness: curve.left(stored, take),
            last: now,
        };
    }

    fn is_idle(&self, state: &Self::State, _limit: &Limit, now: Nanos) -> bool {
        let now = now.max(state.last);
        let (coldness, next_free) = self.resync(state, now);
        next_free <= now && (coldness >= 1.0 || self.warmup == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admission times under saturating demand (a request every ns).
    fn admissions(a: &WarmUp, l: &Limit, until: Nanos) -> Vec<Nanos> {
        let mut s = a.new_state(l, 0);
        (0..until)
            .filter(|&t| a.check(&mut s, l, t, 1).allowed)
            .collect()
    }

    #[test]
    fn ramps_from_cold_to_stable_over_the_warmup() {
        // 1 per 100 ns, warm-up 10_000 ns, cold factor 3 (Guava's).
        let l = Limit::from_nanos(1, 100).unwrap();
        let a = WarmUp::guava(10_000);
        let times = admissions(&a, &l, 40_000);
        let gaps: Vec<_> = times.windows(2).map(|w| w[1] - w[0]).collect();
        // Cold: close to 3 stable intervals; then never faster than stable.
        assert!(gaps[0] >= 290, "{gaps:?}");
        assert!(
            gaps.windows(2).all(|g| g[1] <= g[0]),
            "gaps only shrink: {gaps:?}"
        );
        assert!(gaps.iter().all(|&g| g >= 100));
        // The ramp (time spent above the stable interval) lasts the warm-up period.
        let ramp_end = times[gaps.iter().position(|&g| g == 100).unwrap()];
        assert!(
            (9_000..=11_000).contains(&ramp_end),
            "ramp ended at {ramp_end}"
        );
    }

    #[test]
    fn cools_down_when_idle_and_refuses_oversized() {
        let l = Limit::from_nanos(1, 100).unwrap();
        let a = WarmUp::guava(10_000);
        let mut s = a.new_state(&l, 0);
        for t in 0..20_000 {
            a.check(&mut s, &l, t, 1);
        }
        assert!(s.coldness() < 0.01);
        assert!(!a.is_idle(&s, &l, 20_000));
        assert!(a.is_idle(&s, &l, 40_000));
        assert_eq!(a.check(&mut s, &l, 40_000, 2).retry_after, None);
        assert!(WarmUp::new(1, 0.5).is_err());
    }
}
