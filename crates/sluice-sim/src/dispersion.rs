//! `sluice sim dispersion`: the steady-state dispersion Φ_ss of seed 000 §4.2, measured by
//! Monte-Carlo and set next to the closed forms (Thm 1 eq. 20 and Remark 3 eq. 24).
//!
//! **The model, exactly as the paper states it.** Each node `i` holds a share `x_i` and sees
//! a demand `r_i`; its performance measure is the throttled amount `p_i = r_i − x_i`
//! (Table 1 Case I, eq. 11). The shares follow the law `x(k+1) = x(k) + γ L p(k)` (eq. 3–4)
//! and the demands move by i.i.d. Gaussian steps `r_i(k+1) − r_i(k) = v_i(k+1) ~ N(0, γσ²)`
//! (eq. 16–17 with Remark 3's `Cov(v) = γ·σ²·I`). So the noise enters through the demand,
//! not the share, and the measured quantity is `p`:
//!
//! ```text
//! p(k+1) = (I − γL) p(k) + v(k+1)                                  (eq. 18)
//! Φ_ss   = lim E[ 1/(2n) Σ_{i,j} (p_i(k) − p_j(k))² ]              (eq. 19)
//!        = lim E[ Σ_i (p_i(k) − p̄(k))² ]
//! ```
//!
//! (the sum in eq. 19 runs over ordered pairs, so `1/(2n)·Σ_{i,j}` is the squared distance
//! from the mean). The estimate is the time average of that quantity over `cycles` cycles
//! after `warmup` cycles, which converges to the expectation because the disagreement part of
//! eq. 18 is a stable, ergodic Gauss–Markov chain. Its standard error comes from batch means
//! (the samples are correlated over about `1/(1 − Φ_cr²)` cycles).
//!
//! **What runs.** The share update is the production law of `sluice-coord`: every link
//! applies [`law::gift`] in both directions with the indicator [`Measure::Throttled`], the
//! two gifts summing to `γ w_ij (p_i − p_j)`, i.e. eq. 3. The gifts are applied as real
//! numbers, in synchronous rounds and without loss, because eq. 18 is that idealised model;
//! the protocol's integer units, message delays and demand filter are the business of
//! `sluice sim cluster`, not of this check. The normal draws are Box–Muller on a seeded
//! ChaCha8 stream, so the same seed gives the same output.
//!
//! ```
//! use sluice_graph::Topology;
//! use sluice_sim::dispersion::{Params, run};
//!
//! let ring = Topology::ring(10)?;
//! let p = Params { cycles: 20_000, ..Params::default() };
//! let out = run(&ring, &p)?;
//! // The closed forms agree with each other, and the simulation with them.
//! assert!((out.phi_ss_eq24 - out.phi_ss_eq20).abs() < 1e-9 * out.phi_ss_eq24);
//! assert!(out.rel_err_eq24.abs() < 0.1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sluice_coord::law::{self, Measure, Peer};
use sluice_graph::{GraphError, Noise, Spectrum, Topology, is_stable, phi_cr, phi_ss_trace_form};

/// Number of batches for the batch-means standard error.
const BATCHES: u64 = 20;

/// Why a run cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DispersionError {
    /// The topology cannot be analysed (disconnected, too small, bad γ).
    #[error("topology: {0}")]
    Graph(#[from] GraphError),
    /// Eq. 24 is +∞ and the simulated dispersion grows without bound.
    #[error(
        "γ = {gamma} is not stable on this topology (needs 0 < γ < 2/λn = {gamma_max}); Φ_ss is infinite (seed 000 eq. 24)"
    )]
    Unstable {
        /// The requested update cycle.
        gamma: f64,
        /// 2/λn, the stability limit (exclusive).
        gamma_max: f64,
    },
    /// σ must be finite and positive.
    #[error("sigma must be finite and > 0, got {0}")]
    BadSigma(f64),
    /// The time average needs at least one batch of samples per batch.
    #[error("cycles must be at least {BATCHES}, got {0}")]
    TooFewCycles(u64),
}

/// What to simulate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Update cycle γ; `None` is γ* = 2/(λ2 + λn) (seed 000 Thm 2).
    pub gamma: Option<f64>,
    /// Per-node demand noise level σ: `Cov(v) = γ·σ²·I`.
    pub sigma: f64,
    /// Cycles averaged after the warm-up.
    pub cycles: u64,
    /// Cycles discarded first, so the start `p(0) = 0` is forgotten (it decays as `Φ_cr^k`).
    pub warmup: u64,
    /// Seed of the noise.
    pub seed: u64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            gamma: None,
            sigma: 1.0,
            cycles: 200_000,
            warmup: 10_000,
            seed: 1,
        }
    }
}

/// The measured dispersion next to the closed forms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Nodes.
    pub nodes: usize,
    /// Links.
    pub links: usize,
    /// The update cycle used.
    pub gamma: f64,
    /// γ* of the topology.
    pub gamma_opt: f64,
    /// Φ_cr at `gamma` (eq. 15): the per-cycle contraction of the disagreement.
    pub phi_cr: f64,
    /// σ.
    pub sigma: f64,
    /// Cycles averaged.
    pub cycles: u64,
    /// Cycles discarded first.
    pub warmup: u64,
    /// Seed of the noise.
    pub seed: u64,
    /// The Monte-Carlo estimate of Φ_ss (time average of eq. 19's bracket).
    pub phi_ss_measured: f64,
    /// Its standard error (batch means over 20 batches).
    pub std_error: f64,
    /// Remark 3 eq. 24: Σ_{i≥2} σ²/(λ_i(2 − γλ_i)).
    pub phi_ss_eq24: f64,
    /// Thm 1 eq. 20: 1/(2γ)·Trace[(L − γ/2·L²)† Cov(v)], by LU, independently of eq. 24.
    pub phi_ss_eq20: f64,
    /// (measured − eq. 24)/eq. 24.
    pub rel_err_eq24: f64,
    /// (measured − eq. 20)/eq. 20.
    pub rel_err_eq20: f64,
}

/// Runs the stochastic law on `topology` and measures Φ_ss.
pub fn run(topology: &Topology, p: &Params) -> Result<Report, DispersionError> {
    if !(p.sigma.is_finite() && p.sigma > 0.0) {
        return Err(DispersionError::BadSigma(p.sigma));
    }
    if p.cycles < BATCHES {
        return Err(DispersionError::TooFewCycles(p.cycles));
    }
    let spectrum = Spectrum::of(topology)?;
    let (l2, ln) = (spectrum.lambda2(), spectrum.lambda_n());
    let gamma_opt = sluice_graph::optimal_gamma(l2, ln);
    let gamma = p.gamma.unwrap_or(gamma_opt);
    if !(gamma.is_finite() && gamma > 0.0) {
        return Err(GraphError::BadGamma(gamma).into());
    }
    if !is_stable(l2, ln, gamma) {
        return Err(DispersionError::Unstable {
            gamma,
            gamma_max: 2.0 / ln,
        });
    }
    let s2 = p.sigma * p.sigma;
    // Eq. 24, literally from the eigenvalues.
    let eq24: f64 = spectrum.eigenvalues()[1..]
        .iter()
        .map(|&l| s2 / (l * (2.0 - gamma * l)))
        .sum();
    let eq20 = phi_ss_trace_form(topology, gamma, &Noise::Iid { sigma: p.sigma })?;

    let (measured, std_error) = simulate(topology, gamma, p);
    Ok(Report {
        nodes: topology.nodes(),
        links: topology.edges().len(),
        gamma,
        gamma_opt,
        phi_cr: phi_cr(l2, ln, gamma),
        sigma: p.sigma,
        cycles: p.cycles,
        warmup: p.warmup,
        seed: p.seed,
        phi_ss_measured: measured,
        std_error,
        phi_ss_eq24: eq24,
        phi_ss_eq20: eq20,
        rel_err_eq24: (measured - eq24) / eq24,
        rel_err_eq20: (measured - eq20) / eq20,
    })
}

/// Standard normal draws by Box–Muller, both values of each pair used.
#[derive(Debug)]
struct Normal {
    rng: ChaCha8Rng,
    spare: Option<f64>,
}

impl Normal {
    fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            spare: None,
        }
    }

    fn sample(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        // 1 − U lies in (0, 1], so the logarithm is finite.
        let u1: f64 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random::<f64>();
        let radius = (-2.0 * u1.ln()).sqrt();
        let angle = std::f64::consts::TAU * u2;
        self.spare = Some(radius * angle.sin());
        radius * angle.cos()
    }
}

/// The time average of Σ_i (p_i − p̄)² and its batch-means standard error.
fn simulate(topology: &Topology, gamma: f64, p: &Params) -> (f64, f64) {
    let n = topology.nodes();
    let measure = Measure::Throttled;
    let step_sd = (gamma * p.sigma * p.sigma).sqrt();
    let mut noise = Normal::new(p.seed);
    // Φ_ss does not depend on l_total or the starting demand; start both at 0.
    let mut x = vec![0.0_f64; n];
    let mut r = vec![0.0_f64; n];
    let mut q = vec![0.0_f64; n];
    let batch_len = p.cycles / BATCHES;
    let mut batch_sum = 0.0;
    let mut batch_means = Vec::with_capacity(BATCHES as usize);
    let mut total = 0.0;
    let mut counted = 0u64;
    for k in 0..p.warmup + p.cycles {
        for i in 0..n {
            q[i] = measure.indicator(r[i], x[i]);
        }
        if k >= p.warmup {
            let mean = q.iter().sum::<f64>() / n as f64;
            let d: f64 = q.iter().map(|v| (v - mean) * (v - mean)).sum();
            total += d;
            counted += 1;
            batch_sum += d;
            let done = k - p.warmup + 1;
            if done.is_multiple_of(batch_len) && batch_means.len() < BATCHES as usize {
                batch_means.push(batch_sum / batch_len as f64);
                batch_sum = 0.0;
            }
        }
        // One synchronous round of eq. 3 from the production law: each link's two gifts.
        for e in topology.edges() {
            let peer = |i: usize| Peer {
                indicator: q[i],
                saturated: false,
            };
            let a_to_b = law::gift(&measure, gamma, e.weight, q[e.a], peer(e.b));
            let b_to_a = law::gift(&measure, gamma, e.weight, q[e.b], peer(e.a));
            x[e.a] += b_to_a - a_to_b;
            x[e.b] += a_to_b - b_to_a;
        }
        // The demand's random step v(k+1) ~ N(0, γσ²) per node (Remark 3).
        for ri in &mut r {
            *ri += step_sd * noise.sample();
        }
    }
    let mean = total / counted as f64;
    let b = batch_means.len() as f64;
    let bm = batch_means.iter().sum::<f64>() / b;
    let var = batch_means.iter().map(|v| (v - bm) * (v - bm)).sum::<f64>() / (b - 1.0);
    (mean, (var / b).sqrt())
}
