//! Weight synthesis (seed 000 §5.2): the fastest weights (SDP 33) and the most robust
//! weights (problem 34 / SDP 35) on a fixed set of links, for a given γ and Cov(v).
//!
//! Both are solved in pure Rust by the barrier method (Boyd & Vandenberghe §11.3): damped
//! Newton on `t·objective + barrier`, `t` growing geometrically. The variables are the `m`
//! link weights (plus θ for SDP 33), never an n×n matrix. With the rank-one structure
//! `L_e = u_e u_eᵀ`, `u_e = e_a − e_b`, every Hessian entry is a product of quadratic forms
//! such as `(u_eᵀ S u_f)²`, so a Newton step can be taken two ways:
//!
//! - **dense**: form the m×m Hessian and factor it, O(n³ + m³) per step. Best for sparse
//!   graphs (m a small multiple of n).
//! - **matrix-free** (Newton–CG): never form the Hessian. Because
//!   `Σ_f (u_eᵀ S u_f)(u_fᵀ P u_e) v_f = u_eᵀ (S L(v) P) u_e` with `L(v) = Σ_f v_f L_f`, one
//!   Hessian-vector product is two n×n matrix products and a diagonal read-out over the
//!   links, O(n³ + m), solved by conjugate gradients preconditioned with the Hessian's
//!   diagonal (itself O(n² + m)). Dense graphs (K100: m = 4,950) take this path; an m×m
//!   factorisation there costs ~4·10¹⁰ flops per step. CG needs few iterations for SDP 35
//!   and for edge-transitive graphs such as K_n.
//! - For SDP 33 on *irregular* graphs the diagonal is not enough: near the optimum CG needs
//!   hundreds to thousands of iterations per step. The Hessian is far from low-rank-plus-
//!   diagonal there (a Woodbury preconditioner built from the pairs of eigenvectors at λ2
//!   and λn was measured: only 10–20 % fewer iterations than the diagonal), so the
//!   matrix-free path then factors the Hessian once and keeps that factor as the CG
//!   preconditioner for the following steps, refactoring only when CG slows down (see
//!   `StaleFactor`): a factorisation every 5–6 steps instead of every step.
//!
//! [`NewtonSystem::Auto`] picks by the cost estimate. The certificate below does not depend
//! on how the steps were computed: an inexact Newton direction can only cost steps, never
//! a wrong bound.
//!
//! Every answer carries a certificate: a Lagrangian lower bound on the optimum, built from
//! the final point and checked in closed form (no trust in the iterations), and the duality
//! gap `objective − lower_bound`. Both bounds use that every link weight of a candidate at
//! least as good lies in a box `0 ≤ w_e ≤ W`, because `λn ≥ 2·w_e` (`L ⪰ w_e·L_e`).

use faer::linalg::solvers::{DenseSolveCore, Llt, Solve};
use faer::{Mat, Side};

use crate::analysis::{phi_cr, require_connected};
use crate::{GraphError, Noise, Spectrum, Topology};

/// Stopping rule and budget of the barrier method.
#[derive(Debug, Clone, Copy)]
pub struct SolverOptions {
    /// Stop when the barrier's gap bound falls below `tolerance · max(1, objective)`.
    pub tolerance: f64,
    /// Total Newton steps allowed.
    pub max_newton_steps: usize,
    /// How each Newton system is solved.
    pub newton_system: NewtonSystem,
}

impl Default for SolverOptions {
    fn default() -> Self {
        Self {
            tolerance: 1e-8,
            max_newton_steps: 3000,
            newton_system: NewtonSystem::Auto,
        }
    }
}

/// How the barrier method solves its Newton systems (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NewtonSystem {
    /// Dense when the m×m factorisation is estimated cheaper than the matrix-free solve, else
    /// matrix-free.
    #[default]
    Auto,
    /// Form and factor the m×m Hessian.
    Dense,
    /// Conjugate gradients on Hessian-vector products, preconditioned by the Hessian's
    /// diagonal; for SDP 33, when that converges slowly, by the Cholesky factor of the
    /// Hessian at an earlier step (refreshed when CG slows down), so an m×m matrix may
    /// still be formed, but only every few steps.
    MatrixFree,
}

/// CG iterations per Newton step assumed by `Auto`, measured (release, 100 nodes): SDP 35
/// needs a handful. SDP 33 needs a handful on edge-transitive graphs such as K_n and, with
/// the stale-factor preconditioner, 10–20 per step on irregular graphs plus a
/// factorisation every 5–6 steps (`random-regular:100:30`, m = 1,500: 5–7 s matrix-free
/// against 9.6 s dense), so the factor path wins from m ≈ 800 on 100 nodes.
const FASTEST_CG_ESTIMATE: f64 = 20.0;
const ROBUST_CG_ESTIMATE: f64 = 20.0;

impl NewtonSystem {
    /// Whether a problem with `n` nodes and `m` links goes matrix-free.
    fn matrix_free(self, n: usize, m: usize, cg_iterations: f64) -> bool {
        match self {
            Self::Dense => false,
            Self::MatrixFree => true,
            Self::Auto => {
                // Dense: m³/3 (Cholesky) + ~4m² (forming). Matrix-free: ~8n³ per product
                // (two products A·L(v)·B of n×n matrices for each of two terms).
                let (n, m) = (n as f64, m as f64);
                m * m * m / 3.0 + 4.0 * m * m > 8.0 * n * n * n * cg_iterations
            }
        }
    }
}

/// Relative residual (in the preconditioner's norm, so that the diagonal scaling of the
/// barrier terms `1/w_e²`, which reach t², does not make the test unreachable) at which CG
/// stops: an inexact Newton step. Measured on SDP 33
/// (`random-regular:100:10`, matrix-free): 1e-6 takes the same number of Newton steps as
/// 1e-10 at a fraction of the CG iterations; 1e-2 doubles the Newton steps and loosens the
/// final gap.
const CG_TOLERANCE: f64 = 1e-6;
/// CG iterations allowed per Newton step (then the best iterate so far is used: still a
/// descent direction, because CG from 0 only ever decreases the quadratic model).
const CG_MAX_ITERATIONS: usize = 2000;

/// Synthesised weights with their certificate.
#[derive(Debug, Clone)]
pub struct Synthesis {
    /// The topology with the synthesised weights.
    pub topology: Topology,
    /// The objective at those weights (Φ_cr for fastest, Φ_ss for robust), computed afresh.
    pub objective: f64,
    /// A certified lower bound on the optimum of the problem (Lagrangian dual value).
    pub lower_bound: f64,
    /// `objective − lower_bound`: how far from optimal the answer can be at most.
    pub duality_gap: f64,
    /// Newton steps taken.
    pub newton_steps: usize,
    /// Conjugate-gradient iterations over all Newton steps (0 on the dense path).
    pub cg_iterations: usize,
}

/// `u_eᵀ X u_f` for links e = {a, b}, f = {c, d}.
#[inline]
fn quad(x: &Mat<f64>, e: (usize, usize), f: (usize, usize)) -> f64 {
    x[(e.0, f.0)] - x[(e.0, f.1)] - x[(e.1, f.0)] + x[(e.1, f.1)]
}

/// Σ_e w_e L_e without building a [`Topology`].
fn weighted_laplacian(n: usize, links: &[(usize, usize)], w: &[f64]) -> Mat<f64> {
    let mut l = Mat::<f64>::zeros(n, n);
    for (&(a, b), &x) in links.iter().zip(w) {
        l[(a, a)] += x;
        l[(b, b)] += x;
        l[(a, b)] -= x;
        l[(b, a)] -= x;
    }
    l
}

/// Cholesky-based inverse and log-determinant; `None` when not positive definite.
fn inv_logdet(a: &Mat<f64>) -> Option<(Mat<f64>, f64)> {
    let llt = a.llt(Side::Lower).ok()?;
    let l = llt.L();
    let logdet = 2.0 * (0..a.nrows()).map(|i| l[(i, i)].ln()).sum::<f64>();
    logdet.is_finite().then(|| (llt.inverse(), logdet))
}

fn logdet(a: &Mat<f64>) -> Option<f64> {
    let llt = a.llt(Side::Lower).ok()?;
    let l = llt.L();
    let v = 2.0 * (0..a.nrows()).map(|i| l[(i, i)].ln()).sum::<f64>();
    v.is_finite().then_some(v)
}

/// Below this Newton decrement λ², steps are taken in full (the quadratic phase).
const PURE_NEWTON_DECREMENT: f64 = 1e-3;
/// Full steps allowed per centering; quadratic convergence needs a handful.
const MAX_PURE_STEPS: usize = 12;

/// Newton has converged at this `t`: the decrement λ²/2 is below 1e-10. (When rounding
/// stops the barrier value `phi` from decreasing first, the line search ends centering.)
fn centred(decrement: f64, _phi: f64) -> bool {
    decrement / 2.0 <= 1e-10
}

/// Cholesky factor of a symmetric positive definite `H`, with a tiny ridge if rounding made
/// it indefinite.
fn factor_spd(h: &Mat<f64>) -> Result<Llt<f64>, GraphError> {
    let k = h.nrows();
    let mut ridge = 0.0;
    let scale = (0..k)
        .map(|i| h[(i, i)].abs())
        .fold(0.0, f64::max)
        .max(1e-300);
    for _ in 0..8 {
        let factor = if ridge == 0.0 {
            h.llt(Side::Lower)
        } else {
            Mat::from_fn(k, k, |i, j| h[(i, j)] + if i == j { ridge } else { 0.0 }).llt(Side::Lower)
        };
        if let Ok(llt) = factor {
            return Ok(llt);
        }
        ridge = if ridge == 0.0 {
            1e-14 * scale
        } else {
            ridge * 100.0
        };
    }
    Err(GraphError::Numerical(
        "Newton system is not positive definite".into(),
    ))
}

/// `H⁻¹ r` from a Cholesky factor of `H`.
fn solve_with(llt: &Llt<f64>, r: &[f64]) -> Vec<f64> {
    let mut x = Mat::from_fn(r.len(), 1, |i, _| r[i]);
    llt.solve_in_place(x.as_mut());
    (0..r.len()).map(|i| x[(i, 0)]).collect()
}

/// Solves `H x = −g` for symmetric positive definite `H` (tiny ridge if needed).
fn newton_direction(h: &Mat<f64>, g: &[f64]) -> Result<Vec<f64>, GraphError> {
    let minus_g: Vec<f64> = g.iter().map(|v| -v).collect();
    let x = solve_with(&factor_spd(h)?, &minus_g);
    if x.iter().all(|v| v.is_finite()) {
        Ok(x)
    } else {
        Err(GraphError::Numerical(
            "Newton system is not positive definite".into(),
        ))
    }
}

/// Jacobi-preconditioned CG iterations tried per Newton step of SDP 33 before switching to
/// a factored Hessian for the rest of the solve. K_n and other edge-transitive graphs
/// converge in a handful; irregular graphs need hundreds to thousands near the optimum.
const JACOBI_CG_LIMIT: usize = 100;
/// With a stale factor as preconditioner: refactor at the next step when CG took more than
/// this many iterations (one refactorisation of m = 2,500 costs ~150 Hessian products)…
const STALE_CG_LIMIT: usize = 10;
/// …and refactor at once when it has not converged after this many.
const STALE_CG_MAX: usize = 100;

/// The matrix-free Newton solver of SDP 33: conjugate gradients preconditioned by the
/// Hessian's diagonal while that converges quickly, else by the Cholesky factor of the
/// Hessian at an earlier iterate, refreshed when CG slows down.
///
/// Why a stale factor is a good preconditioner: the Hessian here is the barrier's alone (the
/// objective `tθ` is linear, so raising t does not change it), and the barrier (−log det of
/// affine matrices, −Σ log w_e) is self-concordant, so after moves of total local norm
/// δ < 1, `(1 − δ)² H(x) ⪯ H(x + Δ) ⪯ H(x)/(1 − δ)²` (Nesterov, Introductory Lectures,
/// Thm 4.1.6): the preconditioned system has condition number at most `(1 − δ)⁻⁴`, and
/// near the centre, where Newton moves are short, CG converges in a few iterations.
/// After long moves (early damped steps) CG slows down, and its iteration count is the
/// signal to refactor. Whatever the factor's age, PCG with an SPD preconditioner converges,
/// and a step whose CG does not converge within [`STALE_CG_MAX`] is taken as an exact Newton
/// step from a fresh factor: every direction is either CG-converged to [`CG_TOLERANCE`] or
/// exact, as on the dense path.
#[derive(Default)]
struct StaleFactor {
    factor: Option<Llt<f64>>,
    /// Refactor at the next step.
    refresh: bool,
}

impl std::fmt::Debug for StaleFactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaleFactor")
            .field("factored", &self.factor.is_some())
            .field("refresh", &self.refresh)
            .finish()
    }
}

impl StaleFactor {
    /// Solves `H x = −g`, where `hv` computes `H·v`, `diag` is H's diagonal and `dense`
    /// forms H. Returns the direction and the CG iterations taken.
    fn direction(
        &mut self,
        hv: impl Fn(&[f64]) -> Vec<f64>,
        diag: &[f64],
        dense: impl FnOnce() -> Mat<f64>,
        g: &[f64],
    ) -> Result<(Vec<f64>, usize), GraphError> {
        let mut iterations = 0;
        match &self.factor {
            None => {
                let (x, its, converged) = cg_direction(&hv, jacobi(diag), g, JACOBI_CG_LIMIT)?;
                if converged {
                    return Ok((x, its));
                }
                iterations += its;
            }
            Some(llt) if !self.refresh => {
                let (x, its, converged) =
                    cg_direction(&hv, |r| solve_with(llt, r), g, STALE_CG_MAX)?;
                if converged {
                    self.refresh = its > STALE_CG_LIMIT;
                    return Ok((x, its));
                }
                iterations += its;
            }
            Some(_) => {}
        }
        // Factor the current Hessian: the step is then an exact Newton step.
        self.factor = None; // free the old factor before building the new one
        let llt = factor_spd(&dense())?;
        let minus_g: Vec<f64> = g.iter().map(|v| -v).collect();
        let x = solve_with(&llt, &minus_g);
        if !x.iter().all(|v| v.is_finite()) {
            return Err(GraphError::Numerical(
                "Newton system is not positive definite".into(),
            ));
        }
        self.factor = Some(llt);
        self.refresh = false;
        Ok((x, iterations))
    }
}

/// Jacobi preconditioner: `r ↦ r / diag` (entries without curvature passed through).
fn jacobi(diag: &[f64]) -> impl Fn(&[f64]) -> Vec<f64> + '_ {
    move |r: &[f64]| {
        r.iter()
            .zip(diag)
            .map(|(ri, di)| if *di > 0.0 { ri / di } else { *ri })
            .collect()
    }
}

/// Solves `H x = −g` by preconditioned conjugate gradients, where `hv` computes `H·v`
/// (symmetric positive definite) and `precond` applies an approximation of `H⁻¹`. Stops when
/// the residual, measured in the preconditioner's norm, has fallen by [`CG_TOLERANCE`], or
/// after `max_iterations`; returns the direction, the iterations taken and whether it
/// converged.
fn cg_direction(
    hv: impl Fn(&[f64]) -> Vec<f64>,
    precond: impl Fn(&[f64]) -> Vec<f64>,
    g: &[f64],
    max_iterations: usize,
) -> Result<(Vec<f64>, usize, bool), GraphError> {
    let k = g.len();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut x = vec![0.0; k];
    let mut r: Vec<f64> = g.iter().map(|v| -v).collect();
    let mut z = precond(&r);
    let mut p = z.clone();
    let mut rz = dot(&r, &z);
    let stop = CG_TOLERANCE * CG_TOLERANCE * rz;
    let mut iterations = 0;
    let mut converged = false;
    for _ in 0..max_iterations {
        if rz <= stop {
            converged = true;
            break;
        }
        iterations += 1;
        let ap = hv(&p);
        let pap = dot(&p, &ap);
        if !(pap > 0.0 && pap.is_finite() && rz > 0.0) {
            // Rounding made the curvature vanish: keep what CG has (a descent direction),
            // or the preconditioned gradient if it has nothing yet.
            break;
        }
        let alpha = rz / pap;
        for i in 0..k {
            x[i] += alpha * p[i];
            r[i] -= alpha * ap[i];
        }
        z = precond(&r);
        let rz_next = dot(&r, &z);
        let beta = rz_next / rz;
        rz = rz_next;
        for i in 0..k {
            p[i] = z[i] + beta * p[i];
        }
    }
    if x.iter().all(|v| *v == 0.0) {
        x = precond(&g.iter().map(|v| -v).collect::<Vec<_>>());
    }
    if x.iter().all(|v| v.is_finite()) {
        Ok((x, iterations, converged || rz <= stop))
    } else {
        Err(GraphError::Numerical(
            "conjugate gradients diverged on the Newton system".into(),
        ))
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `[u_eᵀ (A L(v) B) u_e]_e` for every link: the matrix-free Hessian-vector product's core
/// (the (e, f) entry of the Hessian term is `(u_eᵀ A u_f)(u_fᵀ B u_e)`).
fn link_quads(
    n: usize,
    links: &[(usize, usize)],
    a: &Mat<f64>,
    v: &[f64],
    b: &Mat<f64>,
) -> Vec<f64> {
    let lv = weighted_laplacian(n, links, v);
    let m = a * &lv * b;
    links.iter().map(|&le| quad(&m, le, le)).collect()
}

/// Structural setup shared by both problems: unit-weight connectivity and the link list.
fn setup(topology: &Topology, gamma: f64) -> Result<(Vec<(usize, usize)>, f64), GraphError> {
    if !(gamma.is_finite() && gamma > 0.0) {
        return Err(GraphError::BadGamma(gamma));
    }
    let unit = topology.with_weights(&vec![1.0; topology.edges().len()])?;
    require_connected(&unit)?;
    let links = topology.edges().iter().map(|e| (e.a, e.b)).collect();
    // Start at uniform weights with γλn = 1: stable, and strictly inside both domains.
    let lambda_n = Spectrum::of(&unit)?.lambda_n();
    Ok((links, 1.0 / (gamma * lambda_n)))
}

/// The fastest weights for update cycle `gamma`: minimise Φ_cr = max_{i≥2}|1 − γλ_i| over
/// w ≥ 0 on the links of `topology` (seed 000 eq. 32, SDP 33).
pub fn fastest_weights(
    topology: &Topology,
    gamma: f64,
    opts: SolverOptions,
) -> Result<Synthesis, GraphError> {
    let (links, w0) = setup(topology, gamma)?;
    let n = topology.nodes();
    let m = links.len();
    let inv_n = 1.0 / n as f64;
    // B(w) = I − 11ᵀ/n − γ L(w); the SDP is min θ s.t. −θI ⪯ B(w) ⪯ θI, w ≥ 0.
    let b_of = |w: &[f64]| -> Mat<f64> {
        let l = weighted_laplacian(n, &links, w);
        Mat::from_fn(n, n, |i, j| {
            (if i == j { 1.0 } else { 0.0 }) - inv_n - gamma * l[(i, j)]
        })
    };
    let shifted = |b: &Mat<f64>, theta: f64, sign: f64| {
        Mat::from_fn(n, n, |i, j| {
            sign * b[(i, j)] + if i == j { theta } else { 0.0 }
        })
    };
    // Barrier objective; None outside the domain.
    let phi = |t: f64, w: &[f64], theta: f64| -> Option<f64> {
        if w.iter().any(|&x| !(x > 0.0 && x.is_finite())) || !theta.is_finite() {
            return None;
        }
        let b = b_of(w);
        let l1 = logdet(&shifted(&b, theta, -1.0))?;
        let l2 = logdet(&shifted(&b, theta, 1.0))?;
        Some(t * theta - l1 - l2 - w.iter().map(|x| x.ln()).sum::<f64>())
    };

    let matrix_free = opts.newton_system.matrix_free(n, m, FASTEST_CG_ESTIMATE);
    let mut stale = StaleFactor::default();
    let mut w = vec![w0; m];
    let mut theta = 1.5;
    let nu = (2 * n + m) as f64;
    let mut t = nu;
    let mut steps = 0;
    let mut cg_iterations = 0;
    let k = m + 1;
    'outer: loop {
        // Centering by damped Newton.
        let mut pure_steps = 0;
        loop {
            if steps >= opts.max_newton_steps {
                break 'outer;
            }
            steps += 1;
            let b = b_of(&w);
            let (s1, _) = inv_logdet(&shifted(&b, theta, -1.0))
                .ok_or_else(|| GraphError::Numerical("left the domain".into()))?;
            let (s2, _) = inv_logdet(&shifted(&b, theta, 1.0))
                .ok_or_else(|| GraphError::Numerical("left the domain".into()))?;
            let s1s = &s1 * &s1;
            let s2s = &s2 * &s2;
            let mut g = vec![0.0; k];
            // The θ column of the Hessian, and its diagonal (the CG preconditioner).
            let mut h_theta = vec![0.0; k];
            let mut diag = vec![0.0; k];
            for (e, &le) in links.iter().enumerate() {
                g[e] = gamma * (quad(&s2, le, le) - quad(&s1, le, le)) - 1.0 / w[e];
                h_theta[e] = gamma * (quad(&s1s, le, le) - quad(&s2s, le, le));
                let (q1, q2) = (quad(&s1, le, le), quad(&s2, le, le));
                diag[e] = gamma * gamma * (q1 * q1 + q2 * q2) + 1.0 / (w[e] * w[e]);
            }
            let tr = |x: &Mat<f64>| (0..n).map(|i| x[(i, i)]).sum::<f64>();
            g[m] = t - tr(&s1) - tr(&s2);
            h_theta[m] = tr(&s1s) + tr(&s2s);
            diag[m] = h_theta[m];
            let dense_hessian = || {
                let mut h = Mat::<f64>::zeros(k, k);
                for (e, &le) in links.iter().enumerate() {
                    for (f, &lf) in links.iter().enumerate().take(e + 1) {
                        let (q1, q2) = (quad(&s1, le, lf), quad(&s2, le, lf));
                        let v = gamma * gamma * (q1 * q1 + q2 * q2)
                            + if e == f { 1.0 / (w[e] * w[e]) } else { 0.0 };
                        h[(e, f)] = v;
                        h[(f, e)] = v;
                    }
                    h[(e, m)] = h_theta[e];
                    h[(m, e)] = h_theta[e];
                }
                h[(m, m)] = h_theta[m];
                h
            };
            let dx = if matrix_free {
                // H·v = γ²[u_eᵀ(S1 L(v) S1 + S2 L(v) S2)u_e] + v_e/w_e² + θ column terms.
                let hv = |v: &[f64]| -> Vec<f64> {
                    let vw = &v[..m];
                    let a = link_quads(n, &links, &s1, vw, &s1);
                    let b = link_quads(n, &links, &s2, vw, &s2);
                    let mut out: Vec<f64> = (0..m)
                        .map(|e| {
                            gamma * gamma * (a[e] + b[e])
                                + vw[e] / (w[e] * w[e])
                                + h_theta[e] * v[m]
                        })
                        .collect();
                    out.push(dot(&h_theta, v));
                    out
                };
                let (dx, its) = stale.direction(hv, &diag, dense_hessian, &g)?;
                cg_iterations += its;
                dx
            } else {
                newton_direction(&dense_hessian(), &g)?
            };
            let decrement: f64 = -g.iter().zip(&dx).map(|(a, b)| a * b).sum::<f64>();
            let f0 = phi(t, &w, theta).ok_or_else(|| GraphError::Numerical("domain".into()))?;
            if centred(decrement, f0) || pure_steps >= MAX_PURE_STEPS {
                break;
            }
            // Near the centre a full Newton step is safe (quadratic convergence); there the
            // barrier value is compared no longer, as rounding at large t would stall it.
            let pure = decrement < PURE_NEWTON_DECREMENT;
            pure_steps += usize::from(pure);
            let mut s = 1.0;
            let mut moved = false;
            for _ in 0..60 {
                let wn: Vec<f64> = w.iter().zip(&dx).map(|(a, d)| a + s * d).collect();
                let tn = theta + s * dx[m];
                if let Some(f1) = phi(t, &wn, tn)
                    && (pure || f1 <= f0 - 0.25 * s * decrement)
                {
                    w = wn;
                    theta = tn;
                    moved = true;
                    break;
                }
                s *= 0.5;
            }
            if !moved {
                break; // numerical floor reached at this t
            }
        }
        if nu / t < opts.tolerance {
            break;
        }
        t *= 8.0;
    }

    // Certificate. Dual point from the central path: Z1 = (θI − B)⁻¹, Z2 = (θI + B)⁻¹,
    // scaled so Tr Z1 + Tr Z2 = 1. For any feasible (θ, w) in the box,
    // θ ≥ ⟨Z1 − Z2, I − 11ᵀ/n⟩ + γ Σ_e w_e u_eᵀ(Z2 − Z1)u_e.
    let weighted = topology.with_weights(&w)?;
    let spec = Spectrum::of(&weighted)?;
    let objective = phi_cr(spec.lambda2(), spec.lambda_n(), gamma);
    let b = b_of(&w);
    let (z1, _) = inv_logdet(&shifted(&b, theta, -1.0))
        .ok_or_else(|| GraphError::Numerical("final point outside the domain".into()))?;
    let (z2, _) = inv_logdet(&shifted(&b, theta, 1.0))
        .ok_or_else(|| GraphError::Numerical("final point outside the domain".into()))?;
    let trace_sum: f64 = (0..n).map(|i| z1[(i, i)] + z2[(i, i)]).sum();
    let d = Mat::from_fn(n, n, |i, j| (z1[(i, j)] - z2[(i, j)]) / trace_sum);
    let row_sums: Vec<f64> = (0..n).map(|i| (0..n).map(|j| d[(i, j)]).sum()).collect();
    let mut lower = (0..n).map(|i| d[(i, i)]).sum::<f64>() - inv_n * row_sums.iter().sum::<f64>();
    // Any weights at least as good as ours have γλn ≤ 1 + objective, so w_e ≤ (1 + obj)/(2γ).
    let box_w = (1.0 + objective) / (2.0 * gamma);
    for &le in &links {
        let q = -quad(&d, le, le); // u_eᵀ(Z2 − Z1)u_e, normalised
        lower += (gamma * box_w * q).min(0.0);
    }
    let lower_bound = lower.max(0.0); // Φ_cr ≥ 0 always
    Ok(Synthesis {
        topology: weighted,
        objective,
        lower_bound,
        duality_gap: (objective - lower_bound).max(0.0),
        newton_steps: steps,
        cg_iterations,
    })
}

/// The most robust weights for update cycle `gamma` and demand noise `noise`: minimise
/// Φ_ss = 1/(2γ)·Trace[(L − γ/2·L²)† Cov(v)] over w ≥ 0 with the iteration stable
/// (seed 000 problem 34 / SDP 35).
///
/// Uses (L − γ/2·L²)† = (L + 11ᵀ/n)⁻¹ + γ(2I − γL)⁻¹ − (1 + γ/2)·11ᵀ/n, which follows from
/// 2/(λ(2 − γλ)) = 1/λ + γ/(2 − γλ): two traces of inverses of matrices affine in w,
/// convex, with closed-form gradient and Hessian.
pub fn robust_weights(
    topology: &Topology,
    gamma: f64,
    noise: &Noise,
    opts: SolverOptions,
) -> Result<Synthesis, GraphError> {
    let (links, w0) = setup(topology, gamma)?;
    let n = topology.nodes();
    let m = links.len();
    let inv_n = 1.0 / n as f64;
    let cov = noise.covariance(n, gamma)?;
    let ones_c_ones: f64 = (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .map(|ij| cov[ij])
        .sum();
    let constant = (1.0 + 0.5 * gamma) * ones_c_ones * inv_n;
    let tr_prod = |a: &Mat<f64>| -> f64 {
        (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .map(|(i, j)| a[(i, j)] * cov[(j, i)])
            .sum()
    };
    // (A1, A2) = (L + 11ᵀ/n, 2I − γL).
    let mats = |w: &[f64]| -> Option<(Mat<f64>, Mat<f64>)> {
        if w.iter().any(|&x| !(x > 0.0 && x.is_finite())) {
            return None;
        }
        let l = weighted_laplacian(n, &links, w);
        let a1 = Mat::from_fn(n, n, |i, j| l[(i, j)] + inv_n);
        let a2 = Mat::from_fn(
            n,
            n,
            |i, j| if i == j { 2.0 } else { 0.0 } - gamma * l[(i, j)],
        );
        Some((a1, a2))
    };
    // Φ_ss and the inverses; None outside the domain (disconnected or unstable).
    let eval = |w: &[f64]| -> Option<(f64, Mat<f64>, Mat<f64>)> {
        let (a1, a2) = mats(w)?;
        let (s1, _) = inv_logdet(&a1)?;
        let (s2, _) = inv_logdet(&a2)?;
        let f = (tr_prod(&s1) + gamma * tr_prod(&s2) - constant) / (2.0 * gamma);
        Some((f, s1, s2))
    };
    let gradient = |s1: &Mat<f64>, s2: &Mat<f64>| -> (Vec<f64>, Mat<f64>, Mat<f64>) {
        let p1 = s1 * &cov * s1;
        let p2 = s2 * &cov * s2;
        let g = links
            .iter()
            .map(|&le| -quad(&p1, le, le) / (2.0 * gamma) + 0.5 * gamma * quad(&p2, le, le))
            .collect();
        (g, p1, p2)
    };
    let barrier = |t: f64, f: f64, w: &[f64]| t * f - w.iter().map(|x| x.ln()).sum::<f64>();

    let matrix_free = opts.newton_system.matrix_free(n, m, ROBUST_CG_ESTIMATE);
    let mut w = vec![w0; m];
    let (f_start, _, _) =
        eval(&w).ok_or_else(|| GraphError::Numerical("uniform start is not stable".into()))?;
    let nu = m as f64;
    let mut t = nu / f_start.max(1e-300);
    let mut steps = 0;
    let mut cg_iterations = 0;
    'outer: loop {
        let mut pure_steps = 0;
        loop {
            if steps >= opts.max_newton_steps {
                break 'outer;
            }
            steps += 1;
            let (f, s1, s2) = eval(&w).ok_or_else(|| GraphError::Numerical("domain".into()))?;
            let (gf, p1, p2) = gradient(&s1, &s2);
            let g: Vec<f64> = gf
                .iter()
                .zip(&w)
                .map(|(gi, wi)| t * gi - 1.0 / wi)
                .collect();
            let dx = if matrix_free {
                // H·v = t[u_eᵀ(S1 L(v) P1)u_e/γ + γ² u_eᵀ(S2 L(v) P2)u_e] + v_e/w_e².
                let diag: Vec<f64> = links
                    .iter()
                    .zip(&w)
                    .map(|(&le, we)| {
                        t * (quad(&s1, le, le) * quad(&p1, le, le) / gamma
                            + gamma * gamma * quad(&s2, le, le) * quad(&p2, le, le))
                            + 1.0 / (we * we)
                    })
                    .collect();
                let hv = |v: &[f64]| -> Vec<f64> {
                    let a = link_quads(n, &links, &s1, v, &p1);
                    let b = link_quads(n, &links, &s2, v, &p2);
                    (0..m)
                        .map(|e| t * (a[e] / gamma + gamma * gamma * b[e]) + v[e] / (w[e] * w[e]))
                        .collect()
                };
                let (dx, its, _) = cg_direction(hv, jacobi(&diag), &g, CG_MAX_ITERATIONS)?;
                cg_iterations += its;
                dx
            } else {
                let mut h = Mat::<f64>::zeros(m, m);
                for (e, &le) in links.iter().enumerate() {
                    for (f2, &lf) in links.iter().enumerate().take(e + 1) {
                        let hf = quad(&s1, le, lf) * quad(&p1, le, lf) / gamma
                            + gamma * gamma * quad(&s2, le, lf) * quad(&p2, le, lf);
                        let v = t * hf + if e == f2 { 1.0 / (w[e] * w[e]) } else { 0.0 };
                        h[(e, f2)] = v;
                        h[(f2, e)] = v;
                    }
                }
                newton_direction(&h, &g)?
            };
            let decrement: f64 = -g.iter().zip(&dx).map(|(a, b)| a * b).sum::<f64>();
            let f0 = barrier(t, f, &w);
            if centred(decrement, f0) || pure_steps >= MAX_PURE_STEPS {
                break;
            }
            // Near the centre a full Newton step is safe (quadratic convergence); there the
            // barrier value is compared no longer, as rounding at large t would stall it.
            let pure = decrement < PURE_NEWTON_DECREMENT;
            pure_steps += usize::from(pure);
            let mut s = 1.0;
            let mut moved = false;
            for _ in 0..60 {
                let wn: Vec<f64> = w.iter().zip(&dx).map(|(a, d)| a + s * d).collect();
                if let Some((f1, _, _)) = eval(&wn)
                    && (pure || barrier(t, f1, &wn) <= f0 - 0.25 * s * decrement)
                {
                    w = wn;
                    moved = true;
                    break;
                }
                s *= 0.5;
            }
            if !moved {
                break;
            }
        }
        let (f, _, _) = eval(&w).ok_or_else(|| GraphError::Numerical("domain".into()))?;
        if nu / t < opts.tolerance * f.max(1.0) {
            break;
        }
        t *= 8.0;
    }

    // Certificate: Φ_ss is convex, so Φ* ≥ Φ(w) + min over the box of ∇Φ(w)ᵀ(w' − w), with
    // the box 0 ≤ w'_e ≤ 1/γ (stability needs λn < 2/γ, and λn ≥ 2w_e).
    let (objective, s1, s2) =
        eval(&w).ok_or_else(|| GraphError::Numerical("final point outside the domain".into()))?;
    let (g, _, _) = gradient(&s1, &s2);
    let box_w = 1.0 / gamma;
    let lower_bound = objective
        + g.iter()
            .zip(&w)
            .map(|(gi, wi)| (-gi * wi).min(gi * (box_w - wi)))
            .sum::<f64>();
    Ok(Synthesis {
        topology: topology.with_weights(&w)?,
        objective,
        lower_bound,
        duality_gap: (objective - lower_bound).max(0.0),
        newton_steps: steps,
        cg_iterations,
    })
}
