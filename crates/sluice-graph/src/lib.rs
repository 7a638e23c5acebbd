//! Topology analysis and synthesis for Sluice clusters (seed 000 §4–5, seed 003 §II).
//!
//! A [`Topology`] is the communication graph between nodes (built from the shared spec
//! syntax, [`TopologySpec`]). [`Analysis`] gives its Laplacian spectrum, the optimal update
//! cycle γ* = 2/(λ2 + λn) (seed 000 Thm 2), the convergence rate Φ_cr (eq. 15), the
//! steady-state dispersion Φ_ss under demand noise (Thm 1), effective resistances and
//! per-node centralities. [`fastest_weights`] and [`robust_weights`] synthesise link weights
//! (SDP 33 and 35) and return a certified duality gap.
//!
//! ```
//! use sluice_graph::{Analysis, Noise, SolverOptions, TopologySpec, fastest_weights};
//!
//! // Seed 000 Example 1: the star S5 at γ = 1.
//! let star = "star:5".parse::<TopologySpec>()?.build()?;
//! let a = Analysis::new(&star, Some(1.0), &Noise::Iid { sigma: 1.0 })?;
//! assert!((a.lambda2 - 1.0).abs() < 1e-9 && (a.lambda_n - 5.0).abs() < 1e-9);
//! assert!((a.gamma_opt - 1.0 / 3.0).abs() < 1e-9); // γ* = 2/(1 + 5)
//!
//! // Fastest weights at γ = 1: uniform 1/3, Φ_cr = 2/3, with a certificate.
//! let fast = fastest_weights(&star, 1.0, SolverOptions::default())?;
//! assert!((fast.objective - 2.0 / 3.0).abs() < 1e-5 && fast.duality_gap < 1e-5);
//! for e in fast.topology.edges() {
//!     assert!((e.weight - 1.0 / 3.0).abs() < 1e-3);
//! }
//! # Ok::<(), sluice_graph::GraphError>(())
//! ```

mod analysis;
mod error;
mod spec;
mod synthesis;
mod topology;

pub use analysis::{
    Analysis, Noise, Spectrum, auto_gamma, gdrl_eta_bound, is_stable, laplacian, optimal_gamma,
    phi_cr, phi_ss_trace_form,
};
pub use error::GraphError;
pub use spec::{DEFAULT_SEED, TopologySpec};
pub use synthesis::{NewtonSystem, SolverOptions, Synthesis, fastest_weights, robust_weights};
pub use topology::{Edge, Topology};
