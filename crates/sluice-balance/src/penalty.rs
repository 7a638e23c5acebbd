//! Overflow penalties h_s(q_s) (seed 001 §III) and the per-slot choice of the virtual-queue
//! service y_s(t), problem (25)–(26).

use crate::BalanceError;

/// A convex, increasing, continuous penalty of a server's overflow rate (seed 001 §III).
pub trait Penalty {
    /// h(q) for q ≥ 0.
    fn value(&self, q: f64) -> f64;
    /// h'(q) for q ≥ 0 (the right derivative where h has a kink). Non-decreasing in q.
    fn derivative(&self, q: f64) -> f64;

    /// Solves (25)–(26): minimise `V/E[X]² · h(y·E[X]) − Y·y` over y ∈ [0, y_max].
    ///
    /// The objective is convex in y, so its derivative `V/E[X] · h'(y·E[X]) − Y` is
    /// non-decreasing: the minimiser is 0 if the derivative is ≥ 0 at 0, y_max if it is ≤ 0 at
    /// y_max, and otherwise the unique sign change, found by bisection (each step halves an
    /// interval that contains it, so 64 steps reach f64 resolution). Penalties with a closed
    /// form override this.
    fn drift_minimiser(&self, virtual_queue: f64, p: &DriftParams) -> f64 {
        let slope =
            |y: f64| p.v / p.mean_job_size * self.derivative(y * p.mean_job_size) - virtual_queue;
        if slope(0.0) >= 0.0 {
            return 0.0;
        }
        if slope(p.y_max) <= 0.0 {
            return p.y_max;
        }
        let (mut lo, mut hi) = (0.0_f64, p.y_max);
        for _ in 0..64 {
            let mid = 0.5 * (lo + hi);
            if slope(mid) < 0.0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    }
}

/// Parameters of the virtual-queue mechanism (seed 001 §IV-A): the trade-off weight V, the
/// cap y_max on the virtual service (remark c) and the mean job size E\[X\].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftParams {
    /// V > 0: larger V brings the overflow closer to the optimum (Theorem 2: gap ≤ F/V) at
    /// the price of larger virtual queues.
    pub v: f64,
    /// y_max > 0: must exceed the per-slot tagged arrivals a server can see (remark c).
    pub y_max: f64,
    /// E\[X\] > 0, in the same work unit as capacities.
    pub mean_job_size: f64,
}

impl DriftParams {
    /// Validated parameters.
    pub fn new(v: f64, y_max: f64, mean_job_size: f64) -> Result<Self, BalanceError> {
        for (name, value) in [("V", v), ("y_max", y_max), ("E[X]", mean_job_size)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(BalanceError::BadParameter { name, value });
            }
        }
        Ok(Self {
            v,
            y_max,
            mean_job_size,
        })
    }
}

/// The weighted α-fair penalty h(q) = (q/ξ)^{1+α} / (1+α) (seed 001 eq. 11 and §V-A):
/// α = 0 is minimum weighted sum, α = 1 penalty-proportional fairness, α → ∞ weighted
/// min-max fairness (Lemma 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlphaFair {
    alpha: f64,
    weight: f64,
}

impl AlphaFair {
    /// h with exponent α ≥ 0 and weight ξ > 0.
    pub fn new(alpha: f64, weight: f64) -> Result<Self, BalanceError> {
        if !(alpha.is_finite() && alpha >= 0.0) {
            return Err(BalanceError::BadAlpha(alpha));
        }
        if !(weight.is_finite() && weight > 0.0) {
            return Err(BalanceError::BadWeights {
                servers: 1,
                got: vec![weight],
            });
        }
        Ok(Self { alpha, weight })
    }

    /// One penalty per server, all with the same α and weights ξ_s.
    pub fn per_server(alpha: f64, weights: &[f64]) -> Result<Vec<Self>, BalanceError> {
        if weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
            return Err(BalanceError::BadWeights {
                servers: weights.len(),
                got: weights.to_vec(),
            });
        }
        weights.iter().map(|&w| Self::new(alpha, w)).collect()
    }

    /// α.
    #[must_use]
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// ξ.
    #[must_use]
    pub fn weight(&self) -> f64 {
        self.weight
    }
}

impl Penalty for AlphaFair {
    fn value(&self, q: f64) -> f64 {
        (q.max(0.0) / self.weight).powf(1.0 + self.alpha) / (1.0 + self.alpha)
    }

    fn derivative(&self, q: f64) -> f64 {
        if self.alpha == 0.0 {
            return 1.0 / self.weight;
        }
        (q.max(0.0) / self.weight).powf(self.alpha) / self.weight
    }

    /// Closed form of seed 001 §IV-B: y = min{y_max, (ξ/E\[X\]) · (Y·E\[X\]·ξ / V)^{1/α}};
    /// for α = 0 the objective is linear, so y is y_max when Y > V/(E\[X\]·ξ) and 0 otherwise.
    fn drift_minimiser(&self, virtual_queue: f64, p: &DriftParams) -> f64 {
        let y = virtual_queue.max(0.0);
        if self.alpha == 0.0 {
            return if y > p.v / (p.mean_job_size * self.weight) {
                p.y_max
            } else {
                0.0
            };
        }
        let base = y * p.mean_job_size * self.weight / p.v;
        let root = (self.weight / p.mean_job_size) * base.powf(1.0 / self.alpha);
        // powf may overflow to +inf for tiny α; the clamp turns that into y_max.
        if root.is_nan() {
            0.0
        } else {
            root.clamp(0.0, p.y_max)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same penalty without the closed form, to check §IV-B against the generic solver.
    struct Generic(AlphaFair);
    impl Penalty for Generic {
        fn value(&self, q: f64) -> f64 {
            self.0.value(q)
        }
        fn derivative(&self, q: f64) -> f64 {
            self.0.derivative(q)
        }
    }

    #[test]
    fn closed_form_matches_bisection_of_problem_25() {
        let p = DriftParams::new(100.0, 50.0, 1.3).unwrap();
        for alpha in [0.1, 0.5, 1.0, 2.0, 10.0, 100.0] {
            for xi in [0.1, 0.5, 1.0, 3.0] {
                let h = AlphaFair::new(alpha, xi).unwrap();
                for y in [0.0, 0.01, 1.0, 17.0, 100.0, 1e3, 1e5] {
                    let closed = h.drift_minimiser(y, &p);
                    let generic = Generic(h).drift_minimiser(y, &p);
                    assert!(
                        (closed - generic).abs() <= 1e-9 * (1.0 + closed),
                        "alpha {alpha} xi {xi} Y {y}: {closed} vs {generic}"
                    );
                }
            }
        }
    }

    #[test]
    fn quadratic_gives_y_over_v() {
        // Seed 001 §IV-B: h = q²/2 gives y_s(t) = min{y_max, Y_s(t)/V} (E[X] = 1).
        let p = DriftParams::new(100.0, 5.0, 1.0).unwrap();
        let h = AlphaFair::new(1.0, 1.0).unwrap();
        assert!((h.drift_minimiser(250.0, &p) - 2.5).abs() < 1e-12);
        assert_eq!(h.drift_minimiser(1e6, &p), 5.0);
    }

    #[test]
    fn linear_penalty_is_bang_bang() {
        let p = DriftParams::new(10.0, 4.0, 1.0).unwrap();
        let h = AlphaFair::new(0.0, 0.5).unwrap();
        assert_eq!(h.drift_minimiser(19.0, &p), 0.0);
        assert_eq!(h.drift_minimiser(21.0, &p), 4.0);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(AlphaFair::new(-1.0, 1.0).is_err());
        assert!(AlphaFair::new(f64::INFINITY, 1.0).is_err());
        assert!(AlphaFair::new(1.0, 0.0).is_err());
        assert!(DriftParams::new(0.0, 1.0, 1.0).is_err());
        assert!(AlphaFair::per_server(1.0, &[1.0, -2.0]).is_err());
    }
}
