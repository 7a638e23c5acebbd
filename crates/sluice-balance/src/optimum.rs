//! The offline optimum of seed 001 §III: minimise Σ_s h_s(q_s) over the feasible overflow
//! region Q (problem (9)–(13)) for the weighted α-fair penalties h_s(q) = (q/ξ_s)^{1+α}/(1+α).
//!
//! Method (exact, finite). For increasing penalties only the lower boundary of Q matters, and
//! by max-flow/min-cut (Hall's condition on the graph of Appendix A) a q ≥ 0 can be reached
//! by some routing iff q(A) ≥ g(A) for every server set A, where
//! g(A) = D(A) − c(A) and D(A) is the demand of the balancers whose S_b ⊆ A. D is
//! supermodular, so {q ≥ 0 : q(A) ≥ g(A)} is a contra-polymatroid. The weighted α-fair
//! marginals h'_s(q) = (q/ω_s)^α with ω_s = ξ_s^{1+1/α} share one increasing shape, so the
//! minimiser is the lexicographically optimal base with weights ω (Fujishige 1980,
//! "Lexicographically optimal base of a polymatroid with respect to a weight vector"), built
//! level by level by the decomposition algorithm:
//!
//! 1. t* = max over non-empty A of g(A)/ω(A); A* the largest maximiser (maximisers are closed
//!    under union because g − t*·ω is supermodular).
//! 2. If t* ≤ 0 the remaining servers need no overflow: q = 0 there, stop.
//! 3. Else q_s = t*·ω_s on A*; contract A* (g(B) ← g(A* ∪ B) − g(A*)) and repeat.
//!
//! Each level fixes at least one server, so it ends after at most |S| levels. The maximiser is
//! found by enumerating subsets, which limits the method to [`MAX_SERVERS`] servers — seed
//! 001's farms have two or three. Ratios are compared in log space so that large exponents
//! 1 + 1/α (small α) do not overflow; α = 0 (a linear programme, possibly with many
//! minimisers) is solved as the limit α → 0⁺, approximated by α = 10⁻⁶.
//!
//! The same vector with all ω_s equal is the most-balanced vector q^MB of seed 001 §III
//! (min-max fair and throughput optimal).

use crate::maxflow::{max_flow, max_throughput};
use crate::{AlphaFair, BalanceError, Farm, Penalty};

/// The largest farm (in servers) the exact optimum handles.
pub const MAX_SERVERS: usize = 16;

/// α used in place of 0 (see the module documentation).
const ALPHA_ZERO: f64 = 1e-6;

/// An optimal superflow: overflow q, one routing w_bs achieving it, and its throughput.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimum {
    /// Optimal overflow rates q_s.
    pub q: Vec<f64>,
    /// `routing[b][s]` = w_bs of a superflow achieving q (eq. 1–4).
    pub routing: Vec<Vec<f64>>,
    /// Throughput Σ_s w_sτ = demand − Σ_s q_s (eq. 6).
    pub throughput: f64,
}

/// q^(α) for weights ξ_s: the minimiser of Σ (q_s/ξ_s)^{1+α}/(1+α) over Q.
pub fn alpha_fair(
    farm: &Farm,
    demand: &[f64],
    alpha: f64,
    weights: &[f64],
) -> Result<Optimum, BalanceError> {
    AlphaFair::per_server(alpha, weights)?;
    if weights.len() != farm.servers() {
        return Err(BalanceError::BadWeights {
            servers: farm.servers(),
            got: weights.to_vec(),
        });
    }
    let a = if alpha == 0.0 { ALPHA_ZERO } else { alpha };
    let exponent = 1.0 + 1.0 / a;
    let log_w: Vec<f64> = weights.iter().map(|x| exponent * x.ln()).collect();
    lex_optimal(farm, demand, &log_w)
}

/// The most-balanced overflow vector q^MB (seed 001 §III, \[8\]).
pub fn most_balanced(farm: &Farm, demand: &[f64]) -> Result<Optimum, BalanceError> {
    lex_optimal(farm, demand, &vec![0.0; farm.servers()])
}

/// Σ_s h_s(q_s) for the weighted α-fair penalty.
pub fn alpha_fair_penalty(q: &[f64], alpha: f64, weights: &[f64]) -> Result<f64, BalanceError> {
    let hs = AlphaFair::per_server(alpha, weights)?;
    Ok(hs.iter().zip(q).map(|(h, &x)| h.value(x)).sum())
}

fn log_sum_exp(xs: impl Iterator<Item = f64> + Clone) -> f64 {
    let m = xs.clone().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return m;
    }
    m + xs.map(|x| (x - m).exp()).sum::<f64>().ln()
}

fn lex_optimal(farm: &Farm, demand: &[f64], log_w: &[f64]) -> Result<Optimum, BalanceError> {
    farm.check_demand(demand)?;
    let ns = farm.servers();
    if ns > MAX_SERVERS {
        return Err(BalanceError::TooManyServers {
            max: MAX_SERVERS,
            got: ns,
        });
    }
    let masks: Vec<u32> = (0..farm.balancers())
        .map(|b| farm.reach(b).iter().fold(0u32, |m, &s| m | (1 << s)))
        .collect();
    let caps = farm.capacities();
    let members = |set: u32| (0..ns).filter(move |s| set & (1 << s) != 0);
    let all: u32 = if ns == 32 { u32::MAX } else { (1u32 << ns) - 1 };
    let mut q = vec![0.0; ns];
    let mut fixed: u32 = 0;
    // g(B) of the problem contracted by `fixed`: demand of balancers newly enclosed by
    // fixed ∪ B, minus the capacity of B.
    let g = |fixed: u32, b: u32| -> f64 {
        let enclosed: f64 = masks
            .iter()
            .zip(demand)
            .filter(|&(&m, _)| m & !(fixed | b) == 0 && m & !fixed != 0)
            .map(|(_, w)| w)
            .sum();
        enclosed - members(b).map(|s| caps[s]).sum::<f64>()
    };
    while fixed != all {
        let free = all & !fixed;
        // Enumerate non-empty subsets of the free servers; keep log(g/ω) of those with g > 0.
        let mut best = f64::NEG_INFINITY;
        let mut scored: Vec<(u32, f64)> = Vec::new();
        let mut sub = free;
        while sub != 0 {
            let gv = g(fixed, sub);
            if gv > 1e-12 {
                let lr = gv.ln() - log_sum_exp(members(sub).map(|s| log_w[s]));
                best = best.max(lr);
                scored.push((sub, lr));
            }
            sub = (sub - 1) & free;
        }
        if scored.is_empty() {
            break; // t* ≤ 0: zero overflow satisfies every remaining constraint.
        }
        let union = scored
            .iter()
            .filter(|(_, lr)| *lr >= best - 1e-9)
            .fold(0u32, |u, (s, _)| u | s);
        let gv = g(fixed, union);
        let lse = log_sum_exp(members(union).map(|s| log_w[s]));
        for s in members(union) {
            q[s] = (gv.ln() + log_w[s] - lse).exp();
        }
        fixed |= union;
    }
    let server_caps: Vec<f64> = caps.iter().zip(&q).map(|(c, x)| c + x).collect();
    let flow = max_flow(farm, demand, &server_caps);
    let throughput = max_throughput(farm, demand);
    Ok(Optimum {
        q,
        routing: flow.routing,
        throughput,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    #[test]
    fn section_v_a_two_servers() {
        // c = (1, 2), λ = 4: most balanced (1/2, 1/2) (seed 001 §V-A-1).
        let farm = Farm::fully_connected(vec![1.0, 2.0], 1).unwrap();
        let mb = most_balanced(&farm, &[4.0]).unwrap();
        assert!(close(&mb.q, &[0.5, 0.5], 1e-12), "{:?}", mb.q);
        assert!((mb.throughput - 3.0).abs() < 1e-12);
        // ξ = (0.5, 1): stationarity (2q₁)^α·2 = q₂^α with q₁ + q₂ = 1 gives
        // q₁ = 1 / (1 + 2^{(1+α)/α}).
        for alpha in [0.1, 1.0, 10.0, 100.0] {
            let o = alpha_fair(&farm, &[4.0], alpha, &[0.5, 1.0]).unwrap();
            let q1 = 1.0 / (1.0 + 2f64.powf((1.0 + alpha) / alpha));
            assert!(
                close(&o.q, &[q1, 1.0 - q1], 1e-12),
                "alpha {alpha}: {:?}",
                o.q
            );
        }
        // α = 1: q₁ = 0.2, the value behind the paper's measured 0.21 (Fig. 4).
        let o = alpha_fair(&farm, &[4.0], 1.0, &[0.5, 1.0]).unwrap();
        assert!((o.q[0] - 0.2).abs() < 1e-12);
    }

    #[test]
    fn section_v_c_two_balancers() {
        // Seed 001 Fig. 6: the most-balanced vector is (2, 1).
        let farm = Farm::new(vec![1.0, 1.0], vec![vec![0], vec![0, 1]]).unwrap();
        let mb = most_balanced(&farm, &[3.0, 2.0]).unwrap();
        assert!(close(&mb.q, &[2.0, 1.0], 1e-12), "{:?}", mb.q);
        assert!((mb.routing[0][0] - 3.0).abs() < 1e-9 && (mb.routing[1][1] - 2.0).abs() < 1e-9);
    }

    #[test]
    fn underload_has_zero_overflow_and_alpha_zero_is_a_vertex() {
        let farm = Farm::fully_connected(vec![1.0, 2.0], 1).unwrap();
        assert!(close(
            &most_balanced(&farm, &[2.5]).unwrap().q,
            &[0.0, 0.0],
            1e-12
        ));
        // α = 0 with ξ = (0.5, 1): overflow costs 2 at server 1 and 1 at server 2 → all on 2.
        let o = alpha_fair(&farm, &[4.0], 0.0, &[0.5, 1.0]).unwrap();
        assert!(close(&o.q, &[0.0, 1.0], 1e-9), "{:?}", o.q);
    }

    #[test]
    fn rejects_large_farms_and_bad_input() {
        let farm = Farm::fully_connected(vec![1.0; MAX_SERVERS + 1], 1).unwrap();
        assert!(most_balanced(&farm, &[1.0]).is_err());
        let farm = Farm::fully_connected(vec![1.0], 1).unwrap();
        assert!(alpha_fair(&farm, &[1.0], -1.0, &[1.0]).is_err());
        assert!(alpha_fair(&farm, &[1.0], 1.0, &[1.0, 2.0]).is_err());
        assert!(most_balanced(&farm, &[-1.0]).is_err());
    }
}
