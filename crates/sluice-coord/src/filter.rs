//! Demand estimation: seed 003 §III's low-pass filter, in time units.
//!
//! Seed 003 filters per time slot, `λ̂(t+1) = (1 − α) λ̂(t) + α δ(t)`. A per-slot `α` ties the
//! filter to the slot length; Sluice uses a time constant `τ` instead: a sample covering
//! `Δt` gets weight `1 − exp(−Δt/τ)`. For slots of length `s` this is the paper's filter
//! with `α = 1 − exp(−s/τ)` (≈ `s/τ`), and the estimate is the same whatever the cycle
//! length: two half-cycle samples give exactly the weight of one whole-cycle sample.

/// A sample at least this many times the estimate is a step up (see
/// [`DemandFilter::with_rise`]).
pub const RISE_STEP: f64 = 1.5;

/// Exponential smoothing of a rate with time constant `tau` (nanoseconds), and optionally a
/// shorter one for rises (see [`DemandFilter::with_rise`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemandFilter {
    tau: f64,
    tau_rise: f64,
    estimate: f64,
    last: Option<u64>,
}

impl DemandFilter {
    /// A filter with time constant `tau_ns` (`0` means no smoothing) and no sample yet.
    #[must_use]
    pub fn new(tau_ns: u64) -> Self {
        Self::with_rise(tau_ns, tau_ns)
    }

    /// A filter that follows a step up (a sample above [`RISE_STEP`] times the estimate)
    /// with time constant `rise_ns`, and anything else with `tau_ns`: demand that appears
    /// (new clients at a node, a joiner's first requests) is served within a cycle or two,
    /// and capacity is given back slowly. Seed 003's filter is the
    /// symmetric one ([`DemandFilter::new`]).
    #[must_use]
    pub fn with_rise(tau_ns: u64, rise_ns: u64) -> Self {
        Self {
            tau: tau_ns as f64,
            tau_rise: rise_ns as f64,
            estimate: 0.0,
            last: None,
        }
    }

    /// The current estimate (rate units as given).
    #[must_use]
    pub fn estimate(&self) -> f64 {
        self.estimate
    }

    /// Folds in a rate measured over the interval ending at `now` (since the previous
    /// sample). The first sample sets the estimate. Samples out of order count as `Δt = 0`.
    pub fn observe_rate(&mut self, now: u64, rate: f64) {
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        match self.last {
            None => self.estimate = rate,
            Some(last) => {
                let dt = now.saturating_sub(last) as f64;
                // A step up (new clients, traffic moved here) is followed fast; noise around
                // a steady rate is not, or the estimate would ride its peaks (a node below
                // the water level would then hold capacity it does not use).
                let tau = if rate > RISE_STEP * self.estimate {
                    self.tau_rise
                } else {
                    self.tau
                };
                let w = if tau <= 0.0 {
                    1.0
                } else {
                    1.0 - (-dt / tau).exp()
                };
                self.estimate += w * (rate - self.estimate);
            }
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }

    /// Folds in `count` arrivals seen since the previous sample, as a rate per `period`
    /// nanoseconds. The first call only starts the interval.
    pub fn observe_arrivals(&mut self, now: u64, count: u64, period: u64) {
        match self.last {
            None => self.last = Some(now),
            Some(last) => {
                let dt = now.saturating_sub(last);
                if dt > 0 {
                    let rate = count as f64 * period as f64 / dt as f64;
                    self.observe_rate(now, rate);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn independent_of_cycle_length() {
        // Same signal sampled every 10 ms and every 50 ms: same estimate after 1 s.
        let mut fine = DemandFilter::new(200_000_000);
        let mut coarse = DemandFilter::new(200_000_000);
        fine.observe_rate(0, 0.0);
        coarse.observe_rate(0, 0.0);
        for k in 1..=100u64 {
            fine.observe_rate(k * 10_000_000, 100.0);
        }
        for k in 1..=20u64 {
            coarse.observe_rate(k * 50_000_000, 100.0);
        }
        assert!((fine.estimate() - coarse.estimate()).abs() < 1e-9);
        // After 5τ the estimate is within e^-5 of the step.
        assert!((fine.estimate() - 100.0 * (1.0 - (-5.0f64).exp())).abs() < 1e-9);
    }

    /// A step up is followed with its own time constant; a fall, and noise around a steady
    /// rate, with the slower one.
    #[test]
    fn rises_fast_and_falls_slowly() {
        let (tau, rise) = (500_000_000, 100_000_000);
        let mut f = DemandFilter::with_rise(tau, rise);
        f.observe_rate(0, 0.0);
        f.observe_rate(100_000_000, 100.0);
        assert!((f.estimate() - 100.0 * (1.0 - (-1.0f64).exp())).abs() < 1e-9);
        for k in 2..=5u64 {
            f.observe_rate(k * 100_000_000, 100.0);
        }
        // Fast while the step is large (up to 1/1.5 of it), slow for the rest.
        assert!(f.estimate() > 90.0, "{}", f.estimate());
        let before = f.estimate();
        f.observe_rate(600_000_000, 0.0);
        let fall = before * (-0.2f64).exp();
        assert!(
            (f.estimate() - fall).abs() < 1e-9,
            "{} vs {fall}",
            f.estimate()
        );
        // The symmetric filter rises as slowly as it falls.
        let mut s = DemandFilter::new(tau);
        s.observe_rate(0, 0.0);
        s.observe_rate(100_000_000, 100.0);
        assert!(s.estimate() < 20.0);
    }
}
