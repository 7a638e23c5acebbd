//! The share update law (seed 000 eq. 3, seed 003 Fig. 1) and its performance measures.
//!
//! Node `i` holds a share `x_i` of the global limit `L`. Every cycle it compares its
//! performance measure `p_i` with its neighbours' and moves capacity toward the worse off:
//!
//! ```text
//! x_i(k+1) = x_i(k) + γ Σ_{j~i} w_ij (p_i(k) − p_j(k))        (seed 000 eq. 3)
//! ```
//!
//! Sluice never applies the negative half of that sum on its own: capacity only moves as a
//! *gift* from the giver, `γ·w_ij·(p_j − p_i)` when positive (see [`gift`]); the receiver's
//! negative term is the other side's gift seen from here. Summed over a link, both halves
//! give exactly eq. 3, and the sum of shares is conserved (seed 000 Lemma 1, seed 003 Lemma 1).

/// The performance measure `p_i = f_i(r_i, x_i)`: larger means worse off, so the node
/// should get more capacity. All are decreasing and convex in the share `x` (seed 003
/// Assumption 1); `r` is the demand estimate, `x` the share, both in capacity units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measure {
    /// Seed 000 Table 1 Case I, amount of throttled traffic: `p = r − x`. The same as seed
    /// 003 eq. 14 ("spare bandwidth" `q = λ − C`).
    Throttled,
    /// Seed 000 Table 1 Case II, throttled-to-requested ratio: `p = (r − x)/r`. The demand
    /// is floored at `min_demand > 0` so that `−dx/dp = r ≥ min_demand` (the slope the
    /// stability bound needs, seed 000 App. eq. 42: effective gain `γ / r`).
    ThrottledRatio {
        /// Smallest demand used in the denominator.
        min_demand: f64,
    },
    /// Seed 000 Table 1 Case III, log of requested-to-allowed: `p = ln(r / x)`. Shares are
    /// floored at `min_share > 0` (`−dx/dp = x ≥ min_share`, seed 000 App. eq. 44).
    LogRatio {
        /// Smallest share used in the logarithm.
        min_share: f64,
    },
    /// Seed 000 Table 1 Case IV, amount of allowed traffic: `p = x`, with the appendix's
    /// bounds: a node whose share reached its demand takes no more, a node at 0 gives
    /// nothing (without them eq. 48 `p(k+1) = (I + γL) p(k)` diverges).
    Allowed,
    /// Max-min fairness (water-filling across nodes): `p = −x`, so the law levels the shares
    /// of the nodes that want more, and a node whose share reached its demand takes no more
    /// (Case IV's bound). What a saturated node holds above its demand reaches the others
    /// through the relay (spare to unmet demand, see `node`'s "Relay"). At rest every node
    /// holds `min(r_i, λ)` with one level `λ`: a node's demand, however large, never pushes
    /// another below its max-min fair share. Slope 1, the stability bound of Case I.
    MaxMin,
    /// Seed 003 §III mean response time of an M/M/1 queue, `q = 1/(x − r)`, capped at
    /// `max_response` (also when `x ≤ r`), so `−dx/dq = 1/q² ≥ 1/max_response²`.
    MeanResponseTime {
        /// Cap on the indicator, in inverse capacity units.
        max_response: f64,
    },
}

impl Measure {
    /// The indicator for demand `r` and share `x`.
    #[must_use]
    pub fn indicator(&self, r: f64, x: f64) -> f64 {
        match *self {
            Self::Throttled => r - x,
            Self::ThrottledRatio { min_demand } => {
                let r = r.max(min_demand);
                (r - x) / r
            }
            Self::LogRatio { min_share } => (r.max(min_share) / x.max(min_share)).ln(),
            Self::Allowed => x,
            Self::MaxMin => -x,
            Self::MeanResponseTime { max_response } => {
                let spare = x - r;
                if spare * max_response <= 1.0 {
                    max_response
                } else {
                    1.0 / spare
                }
            }
        }
    }

    /// A lower bound of `−g'(p) = −dx/dp` over the operating region: the slope seed 003
    /// Thm 1 (eq. 9) needs. 1 for the linear measures.
    #[must_use]
    pub fn min_slope(&self) -> f64 {
        match *self {
            Self::Throttled | Self::Allowed | Self::MaxMin => 1.0,
            Self::ThrottledRatio { min_demand } => min_demand,
            Self::LogRatio { min_share } => min_share,
            Self::MeanResponseTime { max_response } => 1.0 / (max_response * max_response),
        }
    }

    /// Whether a node whose share reached its demand takes no more (Case IV's bound).
    #[must_use]
    pub fn bounded_by_demand(&self) -> bool {
        matches!(self, Self::Allowed | Self::MaxMin)
    }

    /// Whether the parameters are usable (positive and finite where required).
    #[must_use]
    pub fn is_valid(&self) -> bool {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        match *self {
            Self::Throttled | Self::Allowed | Self::MaxMin => true,
            Self::ThrottledRatio { min_demand } => ok(min_demand),
            Self::LogRatio { min_share } => ok(min_share),
            Self::MeanResponseTime { max_response } => ok(max_response),
        }
    }
}

/// What a giver knows about a receiver when it decides a gift.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peer {
    /// The receiver's last reported indicator `p_j`.
    pub indicator: f64,
    /// Case IV bound: the receiver's share reached its demand, it takes no more.
    pub saturated: bool,
}

/// The gift `i → j` of the law, in capacity units (fractional; the caller rounds down):
/// `γ·w_ij·(p_j − p_i)` when positive, else 0. Case IV (`Allowed`) and max-min honour the
/// appendix bound: no gift to a saturated receiver.
#[must_use]
pub fn gift(measure: &Measure, gamma: f64, weight: f64, own: f64, peer: Peer) -> f64 {
    if measure.bounded_by_demand() && peer.saturated {
        return 0.0;
    }
    let flow = gamma * weight * (peer.indicator - own);
    if flow.is_finite() && flow > 0.0 {
        flow
    } else {
        0.0
    }
}

/// Jain's fairness index (seed 003 eq. 16): `(Σq)² / (N Σq²)`, 1 when all equal. An empty
/// or all-zero vector counts as perfectly fair.
#[must_use]
pub fn jfi(q: &[f64]) -> f64 {
    let sum: f64 = q.iter().sum();
    let sq: f64 = q.iter().map(|v| v * v).sum();
    if q.is_empty() || sq == 0.0 {
        1.0
    } else {
        sum * sum / (q.len() as f64 * sq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_decrease_in_share() {
        // Seed 003 Assumption 1: every indicator is non-increasing in the share.
        let ms = [
            Measure::Throttled,
            Measure::ThrottledRatio { min_demand: 1.0 },
            Measure::LogRatio { min_share: 1.0 },
            Measure::MeanResponseTime { max_response: 10.0 },
        ];
        for m in ms {
            let mut last = f64::INFINITY;
            for x in 0..200 {
                let p = m.indicator(50.0, f64::from(x));
                assert!(p <= last, "{m:?} increased at x={x}");
                last = p;
            }
        }
    }

    #[test]
    fn gift_goes_to_the_worse_off_only() {
        let peer = Peer {
            indicator: 10.0,
            saturated: false,
        };
        assert!((gift(&Measure::Throttled, 0.25, 2.0, 6.0, peer) - 2.0).abs() < 1e-12);
        assert_eq!(gift(&Measure::Throttled, 0.25, 2.0, 12.0, peer), 0.0);
        let sat = Peer {
            indicator: 10.0,
            saturated: true,
        };
        assert_eq!(gift(&Measure::Allowed, 0.25, 1.0, 6.0, sat), 0.0);
        assert_eq!(gift(&Measure::MaxMin, 0.25, 1.0, -12.0, sat), 0.0);
        // Max-min: from the larger share to the smaller (p = −x).
        let small = Peer {
            indicator: -2.0,
            saturated: false,
        };
        assert!((gift(&Measure::MaxMin, 0.25, 1.0, -10.0, small) - 2.0).abs() < 1e-12);
    }

    #[test]
    fn jfi_bounds() {
        assert!((jfi(&[3.0, 3.0, 3.0]) - 1.0).abs() < 1e-12);
        assert!((jfi(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }
}
