//! Analysis of a weighted topology (seed 000 §4–5.1, seed 003 §II Thm 1).
//!
//! Everything comes from one symmetric eigendecomposition `L = U diag(λ) Uᵀ`: the optimal
//! update cycle γ* (Thm 2), the convergence rate Φ_cr (eq. 15), the steady-state dispersion
//! Φ_ss (Thm 1, eq. 20/24), effective resistances (eq. 2, 25) and centralities (Remark 2).

use faer::linalg::solvers::DenseSolveCore;
use faer::{Mat, Side};

use crate::{GraphError, Topology};

/// The weighted Laplacian `L` (seed 000 eq. 4): `L_ii = Σ_j w_ij`, `L_ij = −w_ij`.
pub fn laplacian(topology: &Topology) -> Mat<f64> {
    let n = topology.nodes();
    let mut l = Mat::<f64>::zeros(n, n);
    for e in topology.edges() {
        l[(e.a, e.a)] += e.weight;
        l[(e.b, e.b)] += e.weight;
        l[(e.a, e.b)] -= e.weight;
        l[(e.b, e.a)] -= e.weight;
    }
    l
}

/// Eigenvalues (ascending, λ1 = 0 ≤ λ2 ≤ … ≤ λn) and orthonormal eigenvectors of `L`.
#[derive(Debug, Clone)]
pub struct Spectrum {
    values: Vec<f64>,
    vectors: Mat<f64>,
}

impl Spectrum {
    /// Decomposes the Laplacian of a connected topology with at least 2 nodes.
    pub fn of(topology: &Topology) -> Result<Self, GraphError> {
        require_connected(topology)?;
        let evd = laplacian(topology)
            .self_adjoint_eigen(Side::Lower)
            .map_err(|e| GraphError::Numerical(format!("eigendecomposition: {e:?}")))?;
        let values: Vec<f64> = evd.S().column_vector().iter().copied().collect();
        Ok(Self {
            values,
            vectors: evd.U().to_owned(),
        })
    }

    /// All eigenvalues, ascending.
    pub fn eigenvalues(&self) -> &[f64] {
        &self.values
    }

    /// Eigenvectors, one per column, in the order of [`Spectrum::eigenvalues`].
    pub fn eigenvectors(&self) -> &Mat<f64> {
        &self.vectors
    }

    /// Algebraic connectivity λ2 (> 0 for a connected graph).
    pub fn lambda2(&self) -> f64 {
        self.values[1]
    }

    /// Largest eigenvalue λn.
    pub fn lambda_n(&self) -> f64 {
        self.values[self.values.len() - 1]
    }

    /// The non-zero eigenvalues λ2..λn.
    fn nonzero(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.values.iter().copied().enumerate().skip(1)
    }
}

/// Refuses graphs the analysis is not defined for (seed 000 §2 assumes connected graphs).
pub(crate) fn require_connected(topology: &Topology) -> Result<(), GraphError> {
    if topology.nodes() < 2 {
        return Err(GraphError::TooSmall {
            kind: "analysis",
            n: topology.nodes(),
            min: 2,
        });
    }
    match topology.components() {
        1 => Ok(()),
        components => Err(GraphError::Disconnected { components }),
    }
}

/// Optimal update cycle γ* = 2/(λ2 + λn) (seed 000 Thm 2, eq. 27).
pub fn optimal_gamma(lambda2: f64, lambda_n: f64) -> f64 {
    2.0 / (lambda2 + lambda_n)
}

/// Convergence rate Φ_cr = max_{i≥2} |1 − γλ_i| (seed 000 eq. 15); < 1 iff stable.
pub fn phi_cr(lambda2: f64, lambda_n: f64, gamma: f64) -> f64 {
    (1.0 - gamma * lambda2)
        .abs()
        .max((1.0 - gamma * lambda_n).abs())
}

/// Lemma 2 of seed 000: the steady-load iteration reaches consensus iff
/// max{1 − γλ2, γλn − 1} < 1, i.e. (λ2 > 0 and) 0 < γ < 2/λn.
pub fn is_stable(lambda2: f64, lambda_n: f64, gamma: f64) -> bool {
    lambda2 > 0.0 && (1.0 - gamma * lambda2).max(gamma * lambda_n - 1.0) < 1.0
}

/// Seed 003 Thm 1 (eq. 9): GDRL `C_i += η Σ_j w_ij (q_i − q_j)` converges when
/// η < ½ · min_i(−g_i') · 1/max_i d_i. `min_slope` is min_i(−g_i'), 1 for the spare-bandwidth
/// indicator, where the bound becomes η ≤ 1/(2d) (eq. 15). `d_i` is the weighted degree.
pub fn gdrl_eta_bound(topology: &Topology, min_slope: f64) -> f64 {
    let d_max = (0..topology.nodes())
        .map(|i| topology.weighted_degree(i))
        .fold(0.0_f64, f64::max);
    0.5 * min_slope / d_max
}

/// γ for `gamma: auto` in the server config: γ* of the configured topology (seed 000 Thm 2).
/// Call again whenever membership changes.
pub fn auto_gamma(topology: &Topology) -> Result<f64, GraphError> {
    require_connected(topology)?;
    // Eigenvalues only: several times cheaper than the full decomposition.
    let eigs = laplacian(topology)
        .self_adjoint_eigenvalues(Side::Lower)
        .map_err(|e| GraphError::Numerical(format!("eigenvalues: {e:?}")))?;
    Ok(optimal_gamma(eigs[1], eigs[eigs.len() - 1]))
}

/// The demand noise `v(k) = r(k) − r(k−1)` (seed 000 eq. 16–17).
#[derive(Debug, Clone)]
pub enum Noise {
    /// i.i.d. per node: Cov(v) = γ·σ²·I (seed 000 Remark 3, so eq. 24 applies).
    Iid {
        /// σ, the per-node demand noise level.
        sigma: f64,
    },
    /// An explicit n×n covariance matrix (symmetric, positive semidefinite).
    Covariance(Mat<f64>),
}

impl Noise {
    /// The covariance matrix this noise model means for `n` nodes and update cycle `gamma`.
    pub fn covariance(&self, n: usize, gamma: f64) -> Result<Mat<f64>, GraphError> {
        match self {
            Self::Iid { sigma } => {
                if !sigma.is_finite() || *sigma < 0.0 {
                    return Err(GraphError::BadSigma(*sigma));
                }
                Ok(Mat::from_fn(n, n, |i, j| {
                    if i == j { gamma * sigma * sigma } else { 0.0 }
                }))
            }
            Self::Covariance(c) => {
                validate_covariance(c, n)?;
                Ok(c.clone())
            }
        }
    }

    /// Parses a covariance file: n rows of n whitespace-separated numbers.
    pub fn parse_covariance(text: &str) -> Result<Self, GraphError> {
        let mut rows: Vec<Vec<f64>> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let content = line.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let row = content
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<f64>().map_err(|_| {
                        GraphError::BadCovariance(format!("line {}: `{s}` is not a number", i + 1))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            rows.push(row);
        }
        let n = rows.len();
        if let Some(bad) = rows.iter().position(|r| r.len() != n) {
            return Err(GraphError::BadCovariance(format!(
                "row {} has {} entries; a {n}×{n} matrix needs {n}",
                bad + 1,
                rows[bad].len()
            )));
        }
        Ok(Self::Covariance(Mat::from_fn(n, n, |i, j| rows[i][j])))
    }
}

fn validate_covariance(c: &Mat<f64>, n: usize) -> Result<(), GraphError> {
    if c.nrows() != n || c.ncols() != n {
        return Err(GraphError::BadCovariance(format!(
            "is {}×{}, the topology has {n} nodes",
            c.nrows(),
            c.ncols()
        )));
    }
    let scale = (0..n).map(|i| c[(i, i)].abs()).fold(1e-300, f64::max);
    for i in 0..n {
        for j in 0..n {
            if !c[(i, j)].is_finite() {
                return Err(GraphError::BadCovariance("has a non-finite entry".into()));
            }
            if (c[(i, j)] - c[(j, i)]).abs() > 1e-9 * scale {
                return Err(GraphError::BadCovariance(format!(
                    "is not symmetric at ({i}, {j})"
                )));
            }
        }
    }
    let eigs = c
        .self_adjoint_eigenvalues(Side::Lower)
        .map_err(|e| GraphError::Numerical(format!("covariance eigenvalues: {e:?}")))?;
    if eigs.first().is_some_and(|&l| l < -1e-9 * scale) {
        return Err(GraphError::BadCovariance(
            "is not positive semidefinite".into(),
        ));
    }
    Ok(())
}

fn check_gamma(gamma: f64) -> Result<(), GraphError> {
    if gamma.is_finite() && gamma > 0.0 {
        Ok(())
    } else {
        Err(GraphError::BadGamma(gamma))
    }
}

/// The full analysis of one weighted topology at one update cycle γ.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// Number of nodes.
    pub nodes: usize,
    /// λ2, algebraic connectivity.
    pub lambda2: f64,
    /// λn, largest Laplacian eigenvalue.
    pub lambda_n: f64,
    /// γ* = 2/(λ2 + λn) (Thm 2).
    pub gamma_opt: f64,
    /// Φ_cr at γ* = (λn − λ2)/(λn + λ2), the best rate these weights allow.
    pub phi_cr_opt: f64,
    /// The update cycle the remaining measures are computed at.
    pub gamma: f64,
    /// Φ_cr at `gamma` (eq. 15).
    pub phi_cr: f64,
    /// Lemma 2 holds at `gamma` (0 < γ < 2/λn).
    pub stable: bool,
    /// The largest stable γ (exclusive): 2/λn.
    pub gamma_max: f64,
    /// Φ_ss at `gamma` for the given noise (Thm 1, eq. 20); +∞ when not stable (eq. 24).
    pub phi_ss: f64,
    /// Σ_{i<j} r_ij = n · Trace(L†) (eq. 2, 25).
    pub total_effective_resistance: f64,
    /// c†_ii, the diagonal of (L − γ/2·L²)† (Remark 2); +∞ entries when not stable.
    pub centrality: Vec<f64>,
    /// Seed 003 eq. 9/15 bound on η for the spare-bandwidth indicator: 1/(2·max weighted degree).
    pub gdrl_eta_bound: f64,
    spectrum: Spectrum,
}

impl Analysis {
    /// Analyses `topology` at update cycle `gamma` (γ* when `None`) under `noise`.
    pub fn new(topology: &Topology, gamma: Option<f64>, noise: &Noise) -> Result<Self, GraphError> {
        let spectrum = Spectrum::of(topology)?;
        let n = topology.nodes();
        let (l2, ln) = (spectrum.lambda2(), spectrum.lambda_n());
        let gamma_opt = optimal_gamma(l2, ln);
        let gamma = gamma.unwrap_or(gamma_opt);
        check_gamma(gamma)?;
        let cov = noise.covariance(n, gamma)?;
        let stable = is_stable(l2, ln, gamma);
        let u = spectrum.eigenvectors();

        let (phi_ss, centrality) = if stable {
            // u_kᵀ C u_k for every k: Φ_ss = Σ_{k≥2} u_kᵀCu_k / (γ λ_k (2 − γλ_k)).
            let cu = &cov * u;
            let mut phi = 0.0;
            for (k, lk) in spectrum.nonzero() {
                let quad: f64 = (0..n).map(|i| u[(i, k)] * cu[(i, k)]).sum();
                phi += quad / (gamma * lk * (2.0 - gamma * lk));
            }
            let cent = (0..n)
                .map(|i| {
                    spectrum
                        .nonzero()
                        .map(|(k, lk)| u[(i, k)] * u[(i, k)] / (lk * (1.0 - 0.5 * gamma * lk)))
                        .sum()
                })
                .collect();
            (phi, cent)
        } else {
            (f64::INFINITY, vec![f64::INFINITY; n])
        };
        let trace_pinv: f64 = spectrum.nonzero().map(|(_, l)| 1.0 / l).sum();

        Ok(Self {
            nodes: n,
            lambda2: l2,
            lambda_n: ln,
            gamma_opt,
            phi_cr_opt: phi_cr(l2, ln, gamma_opt),
            gamma,
            phi_cr: phi_cr(l2, ln, gamma),
            stable,
            gamma_max: 2.0 / ln,
            phi_ss,
            total_effective_resistance: n as f64 * trace_pinv,
            centrality,
            gdrl_eta_bound: gdrl_eta_bound(topology, 1.0),
            spectrum,
        })
    }

    /// The Laplacian spectrum the analysis was computed from.
    pub fn spectrum(&self) -> &Spectrum {
        &self.spectrum
    }

    /// Effective resistance r_ij = l†_ii + l†_jj − 2 l†_ij (eq. 2), from the eigenvectors.
    pub fn effective_resistance(&self, i: usize, j: usize) -> f64 {
        let u = self.spectrum.eigenvectors();
        self.spectrum
            .nonzero()
            .map(|(k, l)| {
                let d = u[(i, k)] - u[(j, k)];
                d * d / l
            })
            .sum()
    }
}

/// Φ_ss straight from the trace form of seed 000 Thm 1 (eq. 20), with the pseudoinverse of
/// §2, A† = (A + 11ᵀ/n)⁻¹ − 11ᵀ/n, by LU instead of an eigendecomposition. An independent
/// path used to check [`Analysis::phi_ss`]; +∞ when the iteration is not stable.
pub fn phi_ss_trace_form(
    topology: &Topology,
    gamma: f64,
    noise: &Noise,
) -> Result<f64, GraphError> {
    require_connected(topology)?;
    check_gamma(gamma)?;
    let n = topology.nodes();
    let cov = noise.covariance(n, gamma)?;
    let l = laplacian(topology);
    let eigs = l
        .self_adjoint_eigenvalues(Side::Lower)
        .map_err(|e| GraphError::Numerical(format!("{e:?}")))?;
    if !is_stable(eigs[1], eigs[n - 1], gamma) {
        return Ok(f64::INFINITY);
    }
    let inv_n = 1.0 / n as f64;
    let l2 = &l * &l;
    let a = Mat::from_fn(n, n, |i, j| l[(i, j)] - 0.5 * gamma * l2[(i, j)] + inv_n);
    let inv = a.partial_piv_lu().inverse();
    let mut trace = 0.0;
    for i in 0..n {
        for j in 0..n {
            trace += (inv[(i, j)] - inv_n) * cov[(j, i)];
        }
    }
    Ok(trace / (2.0 * gamma))
}
