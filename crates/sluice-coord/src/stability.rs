//! The stability bound on the gain `γ`, checked before a configuration is used.
//!
//! Two results bound `γ`:
//!
//! * seed 003 Thm 1 (eq. 9), for any indicator meeting Assumption 1, per node:
//!   `γ · d_i ≤ ½ · min(−g'_i)`, where `d_i = Σ_j w_ij` is the weighted degree and
//!   `−g'_i ≥` [`Measure::min_slope`]. For the spare-capacity indicator (slope 1) this is
//!   seed 003 eq. 15, `η ≤ 1/(2d)`. The proof keeps the diagonal of `B(t)` at ≥ ½, so the
//!   bound holds with equality too (eq. 15 writes `≤`). It also covers asynchronous
//!   pairwise updates (Appendix Thm 2 asks only `η < ½ min(−g')`, weaker).
//! * seed 000 Lemma 2, for the linear Case I, over the whole weighted graph: consensus iff
//!   `max{1 − γλ₂, γλₙ − 1} < 1`, i.e. the graph is connected (`λ₂ > 0`) and `γλₙ < 2`.
//!
//! A node checks the first with what it knows (its own links); [`check_cluster`] checks
//! both for a whole configuration. Thm 1 implies Lemma 2 (`λₙ ≤ 2·max d_i`), so a node-level
//! pass is enough for safety; Lemma 2 additionally catches a disconnected graph.

use crate::law::Measure;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The gain is not a positive finite number.
    #[error("the gain gamma must be positive and finite (got {gamma})")]
    BadGain {
        /// The gain given.
        gamma: f64,
    },
    /// A link weight is not a positive finite number.
    #[error("the weight of link {from}-{to} must be positive and finite (got {weight})")]
    BadWeight {
        /// One end.
        from: u32,
        /// The other end.
        to: u32,
        /// The weight given.
        weight: f64,
    },
    /// A measure parameter is not positive and finite.
    #[error("invalid parameter in measure {measure:?}")]
    BadMeasure {
        /// The measure given.
        measure: Measure,
    },
    /// Seed 003 Thm 1 (eq. 9 / eq. 15) is violated at a node.
    #[error(
        "gain gamma = {gamma} is too large for node {node} (weighted degree {degree}): \
         seed 003 Thm 1 (eq. 9) needs gamma * degree <= slope / 2 = {half_slope}; \
         use gamma <= {max_gamma}"
    )]
    Unstable {
        /// The node where the bound fails.
        node: u32,
        /// The gain given.
        gamma: f64,
        /// Its weighted degree.
        degree: f64,
        /// Half the measure's minimum slope.
        half_slope: f64,
        /// The largest gain allowed there.
        max_gamma: f64,
    },
    /// Seed 000 Lemma 2 is violated: `γλₙ ≥ 2`.
    #[error(
        "gain gamma = {gamma} diverges on this graph: seed 000 Lemma 2 needs \
         gamma * lambda_n < 2, lambda_n = {lambda_n}"
    )]
    Diverges {
        /// The gain given.
        gamma: f64,
        /// Largest Laplacian eigenvalue.
        lambda_n: f64,
    },
    /// The graph is not connected (`λ₂ = 0`): shares never equalise (seed 000 Lemma 2).
    #[error(
        "the communication graph is not connected (lambda_2 = {lambda_2}); shares cannot equalise"
    )]
    Disconnected {
        /// Second smallest Laplacian eigenvalue.
        lambda_2: f64,
    },
    /// Some other configuration value is unusable.
    #[error("invalid configuration: {0}")]
    Invalid(&'static str),
}

/// The largest gain seed 003 Thm 1 allows at a node of weighted degree `degree`.
#[must_use]
pub fn max_gain(measure: &Measure, degree: f64) -> f64 {
    if degree <= 0.0 {
        f64::INFINITY
    } else {
        measure.min_slope() / (2.0 * degree)
    }
}

/// Checks seed 003 Thm 1 at one node, from its own link weights.
///
/// # Errors
/// [`ConfigError::BadGain`], [`ConfigError::BadWeight`], [`ConfigError::BadMeasure`] or
/// [`ConfigError::Unstable`].
pub fn check_node(
    node: u32,
    gamma: f64,
    measure: &Measure,
    links: &[(u32, f64)],
) -> Result<(), ConfigError> {
    if !(gamma.is_finite() && gamma > 0.0) {
        return Err(ConfigError::BadGain { gamma });
    }
    if !measure.is_valid() {
        return Err(ConfigError::BadMeasure { measure: *measure });
    }
    let mut degree = 0.0;
    for &(to, weight) in links {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(ConfigError::BadWeight {
                from: node,
                to,
                weight,
            });
        }
        degree += weight;
    }
    let max_gamma = max_gain(measure, degree);
    // A relative tolerance so that η = 1/(2d) exactly (seed 003 §III-A uses η = 1/4, d = 2)
    // is accepted despite rounding.
    if gamma > max_gamma * (1.0 + 1e-9) {
        return Err(ConfigError::Unstable {
            node,
            gamma,
            degree,
            half_slope: measure.min_slope() / 2.0,
            max_gamma,
        });
    }
    Ok(())
}

/// What [`check_cluster`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StabilityReport {
    /// Second smallest eigenvalue of the weighted Laplacian (algebraic connectivity).
    pub lambda_2: f64,
    /// Largest eigenvalue.
    pub lambda_n: f64,
    /// Seed 000 eq. 15, `Φ_cr = max{|1 − γλ₂|, |1 − γλₙ|}` (for Case I).
    pub phi_cr: f64,
    /// The largest gain seed 003 Thm 1 allows on this graph.
    pub max_gamma: f64,
}

/// Checks a whole configuration: seed 003 Thm 1 at every node and seed 000 Lemma 2 on the
/// weighted Laplacian of `n` nodes (ids `0..n`) with the undirected `edges` `(i, j, w_ij)`.
///
/// # Errors
/// Any [`ConfigError`] of [`check_node`], [`ConfigError::Disconnected`] or
/// [`ConfigError::Diverges`].
pub fn check_cluster(
    n: usize,
    edges: &[(u32, u32, f64)],
    gamma: f64,
    measure: &Measure,
) -> Result<StabilityReport, ConfigError> {
    let mut lap = vec![vec![0.0; n]; n];
    let mut links: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
    for &(i, j, w) in edges {
        let (a, b) = (i as usize, j as usize);
        if a >= n || b >= n || a == b {
            return Err(ConfigError::Invalid(
                "edge endpoint out of range or self-loop",
            ));
        }
        links[a].push((j, w));
        links[b].push((i, w));
        lap[a][a] += w;
        lap[b][b] += w;
        lap[a][b] -= w;
        lap[b][a] -= w;
    }
    let mut max_gamma = f64::INFINITY;
    for (i, l) in links.iter().enumerate() {
        let id = u32::try_from(i).map_err(|_| ConfigError::Invalid("too many nodes"))?;
        check_node(id, gamma, measure, l)?;
        max_gamma = max_gamma.min(max_gain(measure, l.iter().map(|&(_, w)| w).sum()));
    }
    let mut eig = symmetric_eigenvalues(lap);
    eig.sort_by(f64::total_cmp);
    let lambda_2 = eig.get(1).copied().unwrap_or(0.0);
    let lambda_n = eig.last().copied().unwrap_or(0.0);
    if n > 1 && lambda_2 <= 1e-9 * lambda_n.max(1.0) {
        return Err(ConfigError::Disconnected { lambda_2 });
    }
    if gamma * lambda_n >= 2.0 {
        return Err(ConfigError::Diverges { gamma, lambda_n });
    }
    let phi_cr = (1.0 - gamma * lambda_2)
        .abs()
        .max((1.0 - gamma * lambda_n).abs());
    Ok(StabilityReport {
        lambda_2,
        lambda_n,
        phi_cr,
        max_gamma,
    })
}

/// Eigenvalues of a small symmetric matrix by cyclic Jacobi rotations (exact enough for the
/// graphs a cluster has; sluice-graph has the full spectral toolkit).
fn symmetric_eigenvalues(mut a: Vec<Vec<f64>>) -> Vec<f64> {
    let n = a.len();
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i][j] * a[i][j])
            .sum();
        if off < 1e-22 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                if a[p][q].abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q][q] - a[p][p]) / (2.0 * a[p][q]);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for row in a.iter_mut() {
                    let (akp, akq) = (row[p], row[q]);
                    row[p] = c * akp - s * akq;
                    row[q] = s * akp + c * akq;
                }
                let (rp, rq) = (a[p].clone(), a[q].clone());
                for (k, (apk, aqk)) in rp.into_iter().zip(rq).enumerate() {
                    a[p][k] = c * apk - s * aqk;
                    a[q][k] = s * apk + c * aqk;
                }
            }
        }
    }
    (0..n).map(|i| a[i][i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: u32) -> Vec<(u32, u32, f64)> {
        (0..n).map(|i| (i, (i + 1) % n, 1.0)).collect()
    }

    #[test]
    fn ring_spectrum_matches_closed_form() {
        // Ring C_n: λ_k = 2 − 2cos(2πk/n).
        let r = check_cluster(10, &ring(10), 0.25, &Measure::Throttled).unwrap();
        let l2 = 2.0 - 2.0 * (2.0 * std::f64::consts::PI / 10.0).cos();
        assert!((r.lambda_2 - l2).abs() < 1e-9, "{r:?}");
        assert!((r.lambda_n - 4.0).abs() < 1e-9, "{r:?}");
        assert!((r.max_gamma - 0.25).abs() < 1e-12);
    }

    #[test]
    fn disconnected_graph_is_refused() {
        let e = [(0, 1, 1.0), (2, 3, 1.0)];
        assert!(matches!(
            check_cluster(4, &e, 0.1, &Measure::Throttled),
            Err(ConfigError::Disconnected { .. })
        ));
    }
}
