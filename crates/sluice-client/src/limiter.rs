//! The local decision: GCRA on one atomic word ([`sluice_limits::AtomicGcra`]) under the
//! rate of the current lease, or a safe fallback rate once the lease has expired.
//!
//! The rate is an argument of every GCRA call, so a refreshed lease changes the rate without
//! losing the bucket's state: permits taken under the old rate still count.

use std::time::Duration;

use parking_lot::RwLock;
use sluice_limits::{AtomicGcra, GcraLimit, Limit, Nanos};

/// Rates are turned into GCRA limits of `rate·10⁹` permits per 10⁹ seconds: nano-request
/// resolution, with the period still far below `u64::MAX` ns.
const SCALE: f64 = 1e9;
const PERIOD: Nanos = 1_000_000_000 * 1_000_000_000;

/// The GCRA limit of `rate` requests per second with a bucket of `burst` worth of it (at
/// least one permit); `None` for a rate below one nano-request per second (admit nothing).
#[must_use]
pub fn gcra_limit(rate: f64, burst: Duration) -> Option<GcraLimit> {
    if !rate.is_finite() || rate * SCALE < 1.0 {
        return None;
    }
    // Finite and ≥ 1: `as` truncates (rounds down, so never above the granted rate) and
    // saturates above u64::MAX.
    let count = (rate * SCALE) as u64;
    let permits = ((rate * burst.as_secs_f64()) as u64).max(1);
    let limit = Limit::from_nanos(count, PERIOD)
        .ok()?
        .with_burst(permits)
        .ok()?;
    Some(GcraLimit::new(&limit))
}

#[derive(Debug, Clone, Copy)]
struct Rates {
    /// The lease's limit (`None`: a grant of 0, or no lease yet).
    granted: Option<GcraLimit>,
    granted_rate: f64,
    /// The lease is valid strictly before this instant.
    expires_at: Nanos,
    fallback: Option<GcraLimit>,
    fallback_rate: f64,
    burst: Duration,
}

/// A local limiter whose rate is set from outside (by the lease refresher) and reverts to a
/// fallback when the rate's validity ends. Every decision takes `now`; the limiter never
/// reads a clock.
///
/// ```
/// use std::time::Duration;
/// use sluice_client::LocalLimiter;
///
/// const S: u64 = 1_000_000_000;
/// let limiter = LocalLimiter::new(0.0, Duration::from_millis(100));
/// assert!(!limiter.try_acquire(0, 1)); // no lease yet, fallback 0: nothing
/// limiter.set_grant(100.0, 10 * S); // 100/s until t = 10 s, burst 10
/// assert_eq!((0..20).filter(|_| limiter.try_acquire(0, 1)).count(), 10);
/// assert!(limiter.try_acquire(S / 100, 1)); // one more every 10 ms
/// assert!(!limiter.try_acquire(10 * S, 1)); // expired: the fallback, 0
/// ```
#[derive(Debug)]
pub struct LocalLimiter {
    gcra: AtomicGcra,
    rates: RwLock<Rates>,
}

impl LocalLimiter {
    /// A limiter with no lease, admitting `fallback_rate` per second (0: nothing) until a
    /// grant arrives, with bursts of `burst` worth of the rate in force.
    #[must_use]
    pub fn new(fallback_rate: f64, burst: Duration) -> Self {
        let fallback_rate = sanitize(fallback_rate);
        Self {
            gcra: AtomicGcra::new(),
            rates: RwLock::new(Rates {
                granted: None,
                granted_rate: 0.0,
                expires_at: 0,
                fallback: gcra_limit(fallback_rate, burst),
                fallback_rate,
                burst,
            }),
        }
    }

    /// From now on, `rate` per second is in force until `expires_at` (exclusive), then the
    /// fallback. The bucket's state is kept.
    pub fn set_grant(&self, rate: f64, expires_at: Nanos) {
        let rate = sanitize(rate);
        let mut r = self.rates.write();
        r.granted = gcra_limit(rate, r.burst);
        r.granted_rate = rate;
        r.expires_at = expires_at;
    }

    /// Ends the grant now: the fallback applies from the next decision.
    pub fn revoke(&self) {
        let mut r = self.rates.write();
        r.granted = None;
        r.granted_rate = 0.0;
        r.expires_at = 0;
    }

    /// The rate in force at `now`, per second.
    #[must_use]
    pub fn rate(&self, now: Nanos) -> f64 {
        let r = self.rates.read();
        if now < r.expires_at {
            r.granted_rate
        } else {
            r.fallback_rate
        }
    }

    /// Whether the grant is still valid at `now`.
    #[must_use]
    pub fn has_grant(&self, now: Nanos) -> bool {
        now < self.rates.read().expires_at
    }

    /// Takes `n` permits at `now` if the rate in force admits them: a read lock, a load and
    /// one compare-and-swap, no allocation and no I/O.
    #[inline]
    pub fn try_acquire(&self, now: Nanos, n: u64) -> bool {
        let limit = {
            let r = self.rates.read();
            if now < r.expires_at {
                r.granted
            } else {
                r.fallback
            }
        };
        match limit {
            Some(l) => self.gcra.check_prepared(&l, now, n).allowed,
            None => false,
        }
    }
}

/// Negative, NaN and infinite rates mean nothing sensible: admit nothing rather than
/// everything.
fn sanitize(rate: f64) -> f64 {
    if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn a_rate_change_keeps_the_bucket() {
        let l = LocalLimiter::new(0.0, Duration::from_secs(1));
        l.set_grant(10.0, 100 * S);
        assert_eq!((0..20).filter(|_| l.try_acquire(0, 1)).count(), 10);
        // Doubling the rate does not refill the bucket: the 10 permits taken still count.
        l.set_grant(20.0, 100 * S);
        assert!(!l.try_acquire(0, 1));
        assert!(l.try_acquire(S / 20, 1));
    }

    #[test]
    fn expiry_falls_back() {
        let l = LocalLimiter::new(1.0, Duration::from_secs(1));
        l.set_grant(1_000.0, S);
        assert_eq!(l.rate(S - 1), 1_000.0);
        assert_eq!(l.rate(S), 1.0);
        assert!(!l.has_grant(S));
        l.revoke();
        assert_eq!(l.rate(0), 1.0);
    }

    proptest! {
        /// Over any span, what the limiter admits is at most `rate·t + burst` (GCRA's
        /// bound) and, with demand always above the rate, at least `rate·t − 1` less what
        /// polling every `step` costs.
        #[test]
        fn admits_rate_times_time(rate in 1.0f64..10_000.0, span_ms in 1u64..5_000, step_us in 50u64..5_000) {
            let burst = Duration::from_millis(100);
            let l = LocalLimiter::new(0.0, burst);
            l.set_grant(rate, u64::MAX);
            let span = span_ms * 1_000_000;
            let step = step_us * 1_000;
            let mut admitted = 0u64;
            let mut now = 0;
            while now <= span {
                while l.try_acquire(now, 1) {
                    admitted += 1;
                }
                now += step;
            }
            let t = span as f64 / 1e9;
            let bucket = ((rate * burst.as_secs_f64()) as u64).max(1) as f64;
            prop_assert!(admitted as f64 <= rate * t + bucket + 1.0, "{admitted} > {rate}·{t} + {bucket}");
            // Polled every `step`, an admission can come up to a step after the bucket allows
            // it. A bucket with room for a second permit absorbs that lateness when the room
            // outlasts a step; a bucket of one permit loses it at every admission, so its
            // gaps are at most one interval plus one step.
            let (interval, step_s) = (1.0 / rate, step as f64 / 1e9);
            let lower = if (bucket - 1.0) * interval >= step_s {
                rate * (t - step_s) - 1.0
            } else {
                t / (interval + step_s) - 1.0
            };
            prop_assert!(admitted as f64 >= lower, "{admitted} < {lower} ({rate}/s over {t} s)");
        }
    }
}
