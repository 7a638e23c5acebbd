//! Seed 000 Thm 1 / Remark 3 against Monte-Carlo: the stochastic law
//! p(k+1) = (I − γL) p(k) + v(k+1), v ~ N(0, γσ²·I), run with the production share law, has
//! a time-averaged dispersion within 5 % of eq. 24 (and eq. 20) on several graphs; and the
//! same seed gives the same numbers.
#![allow(clippy::unwrap_used)]

use sluice_graph::{Topology, TopologySpec};
use sluice_sim::dispersion::{DispersionError, Params, Report, run};

fn params(gamma: Option<f64>, sigma: f64, cycles: u64) -> Params {
    Params {
        gamma,
        sigma,
        cycles,
        warmup: 2_000,
        seed: 7,
    }
}

fn check(name: &str, t: &Topology, p: &Params) -> Report {
    let r = run(t, p).unwrap();
    // The two closed forms are the same number by two independent computations.
    assert!(
        (r.phi_ss_eq24 - r.phi_ss_eq20).abs() <= 1e-8 * r.phi_ss_eq24,
        "{name}: eq. 24 {} vs eq. 20 {}",
        r.phi_ss_eq24,
        r.phi_ss_eq20
    );
    // Issue 6's bar: the Monte-Carlo estimate within 5 % of eq. 24.
    assert!(r.rel_err_eq24.abs() < 0.05, "{name}: {r:?}");
    assert!(r.rel_err_eq20.abs() < 0.05, "{name}: {r:?}");
    // And the run is long enough that 5 % is a real test, not noise: the standard error is
    // well below it, so a model off by 5 % (e.g. Cov(v) = σ²I instead of γσ²I, or the
    // dispersion of x instead of p) would fail.
    assert!(
        r.std_error < 0.015 * r.phi_ss_eq24,
        "{name}: s.e. {} too large for a 5 % test",
        r.std_error
    );
    r
}

#[test]
fn monte_carlo_matches_eq24_ring10_at_gamma_opt() {
    let t = Topology::ring(10).unwrap();
    check("ring:10", &t, &params(None, 1.0, 150_000));
}

#[test]
fn monte_carlo_matches_eq24_star8_at_gamma_opt() {
    let t = Topology::star(8).unwrap();
    check("star:8", &t, &params(None, 2.0, 150_000));
}

#[test]
fn monte_carlo_matches_eq24_complete6_off_optimum() {
    // γ away from γ* = 1/3: the 1/(2 − γλ) factor of eq. 24 matters (γλ = 1.5 here).
    let t = Topology::complete(6).unwrap();
    let r = check("complete:6", &t, &params(Some(0.25), 1.0, 150_000));
    assert!((r.gamma - 0.25).abs() < 1e-15);
}

#[test]
fn monte_carlo_matches_eq24_random_tree_and_weights() {
    // A random tree with non-uniform weights, at a small γ where the chain is slow (Φ_cr close
    // to 1): the weights enter through the gifts, the closed forms through L.
    let tree = "tree:12:3"
        .parse::<TopologySpec>()
        .unwrap()
        .build()
        .unwrap();
    let weights: Vec<f64> = (0..tree.edges().len())
        .map(|i| 0.5 + 0.1 * i as f64)
        .collect();
    let t = tree.with_weights(&weights).unwrap();
    check("tree:12:3 weighted", &t, &params(None, 0.5, 200_000));
}

#[test]
fn same_seed_same_numbers_other_seed_other_numbers() {
    let t = Topology::ring(8).unwrap();
    let p = params(None, 1.0, 5_000);
    let a = run(&t, &p).unwrap();
    let b = run(&t, &p).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    let c = run(&t, &Params { seed: 8, ..p }).unwrap();
    assert_ne!(a.phi_ss_measured, c.phi_ss_measured);
    assert_eq!(a.phi_ss_eq24, c.phi_ss_eq24);
}

#[test]
fn unstable_gamma_is_refused_not_simulated() {
    // Eq. 24 is ∞ for γ ≥ 2/λn; the simulation would diverge, so the run refuses.
    let t = Topology::complete(6).unwrap(); // λn = 6, 2/λn = 1/3
    let e = run(&t, &params(Some(0.34), 1.0, 1_000)).unwrap_err();
    assert!(matches!(e, DispersionError::Unstable { .. }), "{e}");
    assert!(matches!(
        run(&t, &params(None, 0.0, 1_000)).unwrap_err(),
        DispersionError::BadSigma(_)
    ));
}

/// The long run behind the REPRODUCTION rows (1,000,000 cycles per graph, seconds in
/// release): `cargo test -p sluice-sim --release --test dispersion -- --ignored --nocapture`.
#[test]
#[ignore = "long run for the documentation; the tests above cover the guarantee"]
fn long_run_for_the_docs() {
    for s in ["ring:10", "star:8", "complete:6", "tree:12:3"] {
        let t = s.parse::<TopologySpec>().unwrap().build().unwrap();
        let p = Params {
            gamma: None,
            sigma: 1.0,
            cycles: 1_000_000,
            warmup: 10_000,
            seed: 1,
        };
        let r = run(&t, &p).unwrap();
        eprintln!(
            "{s}: γ {:.6} measured {:.5} ± {:.5} eq24 {:.5} eq20 {:.5} rel24 {:+.3}% rel20 {:+.3}%",
            r.gamma,
            r.phi_ss_measured,
            r.std_error,
            r.phi_ss_eq24,
            r.phi_ss_eq20,
            100.0 * r.rel_err_eq24,
            100.0 * r.rel_err_eq20
        );
        assert!(r.rel_err_eq24.abs() < 0.02, "{s}: {r:?}");
    }
}
