//! Time as an argument.
//!
//! Every algorithm takes `now` explicitly (as governor's `test_and_update(.., now)` does), so
//! tests, simulations and replays run on virtual time. Callers that want wall time use a
//! [`Clock`]: [`SystemClock`] in production, [`ManualClock`] in tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds since an arbitrary, caller-chosen epoch. Monotone for a given clock.
pub type Nanos = u64;

/// Converts a [`Duration`] to [`Nanos`], saturating at `u64::MAX` (about 584 years).
#[must_use]
pub fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of monotone time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Nanos;
}

/// Monotone wall time, measured from the moment the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose epoch is now.
    #[must_use]
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        nanos(self.origin.elapsed())
    }
}

/// A clock that moves only when told to: for tests and replays.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start`.
    #[must_use]
    pub fn new(start: Nanos) -> Self {
        Self {
            now: AtomicU64::new(start),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(nanos(d), Ordering::Relaxed);
    }

    /// Sets the clock to `t`. Time never goes backwards: an earlier `t` is ignored.
    pub fn set(&self, t: Nanos) {
        self.now.fetch_max(t, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_never_goes_back() {
        let c = ManualClock::new(10);
        c.set(5);
        assert_eq!(c.now(), 10);
        c.advance(Duration::from_nanos(7));
        assert_eq!(c.now(), 17);
    }

    #[test]
    fn system_clock_is_monotone() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }
}
