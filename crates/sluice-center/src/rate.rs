//! How fast a node uses a key's permits: the size of the next batch or lease it asks a
//! center for.

use sluice_limits::Nanos;

/// How fast a node uses a key's permits, measured over horizons and smoothed, to size the
/// next batch it asks a central store for (the Redis batched mode, and the token server's
/// leases: seed 002 §4.4(5), quota pre-allocation sized by consumption).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConsumptionRate {
    /// Permits used since `since`.
    used: u64,
    since: Nanos,
    /// Permits per ns (0: not measured yet).
    rate: f64,
    /// The last batch asked for (slow start while the rate is unknown).
    last: u64,
}

impl ConsumptionRate {
    /// Counts `n` permits used.
    pub fn used(&mut self, n: u64) {
        self.used += n;
    }

    /// When the current measurement started (0: never used).
    #[must_use]
    pub fn since(&self) -> Nanos {
        self.since
    }

    /// Permits that cover `horizon` at the measured rate (each horizon of use folds a new
    /// measurement in with weight `smoothing`); until a rate is measured, twice the last
    /// batch, from 1.
    pub fn batch(&mut self, now: Nanos, horizon: Nanos, smoothing: f64) -> u64 {
        let elapsed = now.saturating_sub(self.since);
        if self.since == 0 && self.used == 0 {
            self.since = now;
        } else if elapsed >= horizon && elapsed > 0 {
            let r = self.used as f64 / elapsed as f64;
            self.rate = if self.rate == 0.0 {
                r
            } else {
                smoothing * r + (1.0 - smoothing) * self.rate
            };
            self.used = 0;
            self.since = now;
        }
        if self.rate > 0.0 {
            (self.rate * horizon as f64).ceil() as u64
        } else {
            self.last.saturating_mul(2).max(1)
        }
    }

    /// Records the size of the batch actually asked for.
    pub fn asked(&mut self, size: u64) {
        self.last = size;
    }
}

#[cfg(test)]
mod tests {
    use super::ConsumptionRate;

    #[test]
    fn slow_start_doubles_then_the_measured_rate_sizes_the_batch() {
        let mut r = ConsumptionRate::default();
        // Unknown rate: 1, then twice the last batch asked for.
        assert_eq!(r.batch(10, 100, 0.5), 1);
        r.asked(1);
        assert_eq!(r.batch(20, 100, 0.5), 2);
        r.asked(2);
        assert_eq!(r.batch(30, 100, 0.5), 4);
        // 50 permits over one horizon (100 ns from the start at 10): 0.5 per ns → 50.
        r.used(50);
        assert_eq!(r.batch(110, 100, 0.5), 50);
        assert_eq!(r.since(), 110);
        // Next horizon 150 permits (1.5 per ns), smoothed by half: 1.0 per ns → 100.
        r.used(150);
        assert_eq!(r.batch(210, 100, 0.5), 100);
    }
}
