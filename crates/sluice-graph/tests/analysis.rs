//! Analysis against closed forms and against a Monte-Carlo of the noisy iteration
//! (seed 000 §4, Thm 1, Remarks 2–3, Thm 2, Example 1; seed 003 Thm 1).
#![allow(clippy::unwrap_used)]

use std::f64::consts::PI;

use faer::Mat;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_graph::{
    Analysis, GraphError, Noise, Spectrum, Topology, TopologySpec, auto_gamma, phi_ss_trace_form,
};

const IID: Noise = Noise::Iid { sigma: 1.0 };

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

fn spec(s: &str) -> Topology {
    s.parse::<TopologySpec>().unwrap().build().unwrap()
}

fn assert_spectrum(t: &Topology, mut expected: Vec<f64>) {
    expected.sort_by(f64::total_cmp);
    let got = Spectrum::of(t).unwrap();
    assert_eq!(got.eigenvalues().len(), expected.len());
    for (g, e) in got.eigenvalues().iter().zip(&expected) {
        assert!(close(*g, *e, 1e-10), "{g} vs {e}");
    }
}

#[test]
fn eigenvalues_of_complete_star_path_cycle_match_their_formulas() {
    for n in [2usize, 3, 5, 9, 16] {
        // K_n: 0, n (n−1 times). S_n: 0, 1 (n−2 times), n.
        assert_spectrum(&spec(&format!("complete:{n}")), {
            let mut v = vec![n as f64; n];
            v[0] = 0.0;
            v
        });
        let mut s = vec![1.0; n];
        s[0] = 0.0;
        s[n - 1] = n as f64;
        assert_spectrum(&spec(&format!("star:{n}")), s);
        // P_n: 2 − 2cos(πk/n). C_n: 2 − 2cos(2πk/n).
        let nf = n as f64;
        assert_spectrum(
            &spec(&format!("path:{n}")),
            (0..n)
                .map(|k| 2.0 - 2.0 * (PI * k as f64 / nf).cos())
                .collect(),
        );
        if n >= 3 {
            assert_spectrum(
                &spec(&format!("ring:{n}")),
                (0..n)
                    .map(|k| 2.0 - 2.0 * (2.0 * PI * k as f64 / nf).cos())
                    .collect(),
            );
        }
    }
    // A grid is the Cartesian product of two paths: eigenvalues add.
    let (r, c) = (3usize, 4usize);
    let p = |k: usize, m: usize| 2.0 - 2.0 * (PI * k as f64 / m as f64).cos();
    assert_spectrum(
        &spec("grid:3x4"),
        (0..r)
            .flat_map(|i| (0..c).map(move |j| p(i, r) + p(j, c)))
            .collect(),
    );
}

/// Seed 000 Example 1 / Table 2: with γ = 1 the fastest uniform weights of K5 and S5 are
/// 1/5 and 1/3, with Φ_cr = 0 and 2/3. For uniform weights w, γλ_i scales with γw, so the
/// best w at γ = 1 is γ* of the unit-weight graph (Thm 2).
#[test]
fn example_1_fastest_uniform_weights_of_k5_and_s5() {
    for (s, w, phi) in [("complete:5", 0.2, 0.0), ("star:5", 1.0 / 3.0, 2.0 / 3.0)] {
        let unit = spec(s);
        let a = Analysis::new(&unit, Some(1.0), &IID).unwrap();
        assert!(close(a.gamma_opt, w, 1e-12), "{s}: γ* {}", a.gamma_opt);
        let m = unit.edges().len();
        let weighted = unit.with_weights(&vec![w; m]).unwrap();
        let b = Analysis::new(&weighted, Some(1.0), &IID).unwrap();
        assert!((b.phi_cr - phi).abs() < 1e-12, "{s}: Φ_cr {}", b.phi_cr);
        assert!(close(b.gamma_opt, 1.0, 1e-12));
    }
}

/// Thm 2: γ* minimises Φ_cr over γ; Φ_cr(γ*) = (λn − λ2)/(λn + λ2).
#[test]
fn optimal_update_cycle_minimises_phi_cr() {
    for s in [
        "ring:10",
        "path:7",
        "grid:4x5",
        "random-regular:30:3:7",
        "tree:20:3",
    ] {
        let t = spec(s);
        let a = Analysis::new(&t, None, &IID).unwrap();
        assert!(close(
            a.phi_cr_opt,
            (a.lambda_n - a.lambda2) / (a.lambda_n + a.lambda2),
            1e-12
        ));
        assert_eq!(a.gamma, a.gamma_opt);
        for k in 1..200 {
            let g = a.gamma_max * k as f64 / 200.0;
            let other = Analysis::new(&t, Some(g), &IID).unwrap();
            assert!(other.phi_cr >= a.phi_cr_opt - 1e-12, "{s}: γ={g}");
        }
        assert!(close(auto_gamma(&t).unwrap(), a.gamma_opt, 1e-12));
    }
}

/// Lemma 2: stable iff γ < 2/λn; beyond it eq. 24 gives Φ_ss = ∞ and the iteration diverges.
#[test]
fn lemma_2_stability_boundary() {
    let t = spec("ring:6"); // λn = 4
    let inside = Analysis::new(&t, Some(0.49), &IID).unwrap();
    assert!(inside.stable && inside.phi_ss.is_finite() && inside.phi_cr < 1.0);
    assert!(close(inside.gamma_max, 0.5, 1e-12));
    let outside = Analysis::new(&t, Some(0.51), &IID).unwrap();
    assert!(!outside.stable && outside.phi_ss.is_infinite() && outside.phi_cr > 1.0);
    assert!(phi_ss_trace_form(&t, 0.51, &IID).unwrap().is_infinite());
    // The alternating vector is the λ = 4 eigenvector: |1 − 4γ| > 1 grows it.
    let mut p: Vec<f64> = (0..6)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    for _ in 0..200 {
        p = step(&t, &p, 0.51);
    }
    assert!(p[0].abs() > 1e3);
}

/// Seed 003 Thm 1 (eq. 9, 15): η < 1/(2d) for the spare-bandwidth indicator; the ring of
/// §III uses η = 1/4. This bound is never looser than Lemma 2 (λn ≤ 2·d_max).
#[test]
fn seed_003_eta_bound() {
    assert!(close(
        Analysis::new(&spec("ring:10"), None, &IID)
            .unwrap()
            .gdrl_eta_bound,
        0.25,
        0.0
    ));
    assert!(close(
        sluice_graph::gdrl_eta_bound(&spec("star:6"), 1.0),
        0.1,
        1e-15
    ));
    for s in [
        "random-regular:40:4:1",
        "tree:30:2",
        "grid:5x5",
        "complete:7",
    ] {
        let a = Analysis::new(&spec(s), None, &IID).unwrap();
        assert!(a.gdrl_eta_bound <= a.gamma_max + 1e-12, "{s}");
    }
}

/// Remark 3, eq. 24 (the spectral sum) against the trace form of Thm 1, eq. 20 (LU
/// pseudoinverse), and against eq. 20 fed an explicit Cov = γσ²I.
#[test]
fn phi_ss_eq_24_matches_trace_form_eq_20() {
    for (s, gamma) in [
        ("ring:12", None),
        ("star:7", Some(0.2)),
        ("grid:3x5", Some(0.1)),
    ] {
        let t = spec(s);
        let sigma = 1.7;
        let noise = Noise::Iid { sigma };
        let a = Analysis::new(&t, gamma, &noise).unwrap();
        let eq24: f64 = a.spectrum().eigenvalues()[1..]
            .iter()
            .map(|&l| sigma * sigma / (l * (2.0 - a.gamma * l)))
            .sum();
        assert!(close(a.phi_ss, eq24, 1e-10), "{s}");
        let eq20 = phi_ss_trace_form(&t, a.gamma, &noise).unwrap();
        assert!(close(a.phi_ss, eq20, 1e-9), "{s}: {} vs {eq20}", a.phi_ss);
        let n = t.nodes();
        let cov = Mat::from_fn(
            n,
            n,
            |i, j| if i == j { a.gamma * sigma * sigma } else { 0.0 },
        );
        let b = Analysis::new(&t, gamma, &Noise::Covariance(cov)).unwrap();
        assert!(close(b.phi_ss, a.phi_ss, 1e-10));
    }
}

/// Remark 2: with independent v_i, Cov = γ·diag(σ_i²), Φ_ss = ½ Σ c†_ii σ_i².
#[test]
fn remark_2_centrality_decomposes_phi_ss() {
    let t = spec("tree:15:4");
    let gamma = 0.3;
    let sig2: Vec<f64> = (0..15).map(|i| 0.5 + (i % 4) as f64).collect();
    let cov = Mat::from_fn(15, 15, |i, j| if i == j { gamma * sig2[i] } else { 0.0 });
    let noise = Noise::Covariance(cov);
    let a = Analysis::new(&t, Some(gamma), &noise).unwrap();
    let half_sum: f64 = 0.5
        * a.centrality
            .iter()
            .zip(&sig2)
            .map(|(c, s)| c * s)
            .sum::<f64>();
    assert!(close(a.phi_ss, half_sum, 1e-10));
    assert!(close(
        phi_ss_trace_form(&t, gamma, &noise).unwrap(),
        a.phi_ss,
        1e-9
    ));
    // The star's hub matters least: every leaf's noise has to cross it.
    let s = Analysis::new(&spec("star:6"), Some(0.2), &IID).unwrap();
    assert!(s.centrality[1..].iter().all(|&c| c > s.centrality[0]));
}

/// Eq. 2 and 25: effective resistances of trees are path lengths, of K_n are 2/n, of C_n
/// are d(n−d)/n; and Φ_ss → σ²/(2n)·Σ_{i<j} r_ij as γ → 0.
#[test]
fn effective_resistance_and_eq_25_limit() {
    let p = Analysis::new(&spec("path:6"), None, &IID).unwrap();
    assert!(close(p.effective_resistance(0, 5), 5.0, 1e-10));
    assert!(close(p.effective_resistance(2, 3), 1.0, 1e-10));
    // Σ_{i<j} |i − j| over a path of 6 nodes = 35.
    assert!(close(p.total_effective_resistance, 35.0, 1e-10));
    let k = Analysis::new(&spec("complete:8"), None, &IID).unwrap();
    assert!(close(k.effective_resistance(1, 6), 0.25, 1e-10));
    assert!(close(k.total_effective_resistance, 7.0, 1e-10));
    let c = Analysis::new(&spec("ring:10"), None, &IID).unwrap();
    assert!(close(c.effective_resistance(0, 3), 3.0 * 7.0 / 10.0, 1e-10));
    for s in ["ring:9", "grid:3x3", "random-regular:20:3:5"] {
        let t = spec(s);
        let sigma = 2.0;
        let a = Analysis::new(&t, Some(1e-7), &Noise::Iid { sigma }).unwrap();
        let limit = sigma * sigma / (2.0 * t.nodes() as f64) * a.total_effective_resistance;
        assert!(close(a.phi_ss, limit, 1e-6), "{s}");
    }
}

fn step(t: &Topology, p: &[f64], gamma: f64) -> Vec<f64> {
    // p(k+1) = (I − γL) p(k), L p computed from the neighbour lists.
    (0..t.nodes())
        .map(|i| p[i] - gamma * t.neighbours(i).map(|(j, w)| w * (p[i] - p[j])).sum::<f64>())
        .collect()
}

fn gaussian(rng: &mut ChaCha8Rng) -> f64 {
    // Box–Muller.
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
}

/// Thm 1 against a Monte-Carlo of the noisy iteration itself, eq. 18:
/// p(k+1) = (I − γL) p(k) + v(k+1), v ~ N(0, γσ²I); the time average of
/// (1/2n) Σ_{i,j} (p_i − p_j)² = Σ_i (p_i − p̄)² must match Φ_ss within 5%.
#[test]
fn phi_ss_matches_monte_carlo_dispersion_within_5_percent() {
    for (s, gamma, seed) in [
        ("ring:8", None, 1u64),
        ("path:5", Some(0.2), 2),
        ("random-regular:12:3:3", None, 3),
    ] {
        let t = spec(s);
        let sigma = 1.5;
        let a = Analysis::new(&t, gamma, &Noise::Iid { sigma }).unwrap();
        let n = t.nodes();
        let sd = (a.gamma).sqrt() * sigma;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut p = vec![0.0; n];
        let (burn, steps) = (2_000, 300_000);
        let mut acc = 0.0;
        for k in 0..burn + steps {
            p = step(&t, &p, a.gamma);
            for x in &mut p {
                *x += sd * gaussian(&mut rng);
            }
            if k >= burn {
                let mean = p.iter().sum::<f64>() / n as f64;
                acc += p.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>();
            }
        }
        let measured = acc / steps as f64;
        let rel = (measured - a.phi_ss).abs() / a.phi_ss;
        assert!(
            rel < 0.05,
            "{s}: Monte-Carlo {measured} vs Φ_ss {} ({rel})",
            a.phi_ss
        );
    }
}

#[test]
fn spec_syntax_and_errors() {
    let ok = |s: &str| s.parse::<TopologySpec>().unwrap();
    assert_eq!(ok("ring:5"), TopologySpec::Ring(5));
    assert_eq!(ok("grid:3x4"), TopologySpec::Grid(3, 4));
    assert_eq!(
        ok("random-regular:10:3"),
        TopologySpec::RandomRegular {
            n: 10,
            d: 3,
            seed: None
        }
    );
    assert_eq!(
        ok("tree:9:42"),
        TopologySpec::Tree {
            n: 9,
            seed: Some(42)
        }
    );
    for s in [
        "ring:5",
        "grid:3x4",
        "random-regular:10:4:9",
        "tree:9",
        "star:4",
    ] {
        assert_eq!(ok(s).to_string(), s);
    }
    let err = |s: &str| {
        s.parse::<TopologySpec>()
            .and_then(|x| x.build())
            .unwrap_err()
    };
    assert!(matches!(err("hypercube:8"), GraphError::UnknownKind { .. }));
    assert!(matches!(err("ring:x"), GraphError::MalformedSpec { .. }));
    assert!(matches!(err("grid:3"), GraphError::MalformedSpec { .. }));
    assert!(matches!(
        err("random-regular:10"),
        GraphError::MalformedSpec { .. }
    ));
    assert!(matches!(err("ring:2"), GraphError::TooSmall { min: 3, .. }));
    assert!(matches!(err("path:1"), GraphError::TooSmall { .. }));
    assert!(matches!(
        err("random-regular:7:3"),
        GraphError::OddDegreeSum { n: 7, d: 3 }
    ));
    assert!(matches!(
        err("random-regular:6:6"),
        GraphError::BadDegree { .. }
    ));
    assert!(matches!(
        err("random-regular:6:0"),
        GraphError::BadDegree { .. }
    ));
    assert!(matches!(
        err("random-regular:6:1"),
        GraphError::NeverConnected { n: 6 }
    ));
    assert_eq!(spec("random-regular:2:1").edges().len(), 1);
    assert!(matches!(
        err("/nonexistent/edges.txt"),
        GraphError::Io { .. }
    ));
    assert!(
        err("hypercube:8")
            .to_string()
            .contains("unknown topology kind `hypercube`")
    );
}

#[test]
fn random_topologies_are_seeded_regular_connected_trees() {
    for (n, d) in [(10, 3), (50, 4), (100, 2), (1000, 4), (9, 8)] {
        let t = Topology::random_regular(n, d, 11).unwrap();
        assert!(t.is_connected());
        assert!((0..n).all(|i| t.degree(i) == d), "{n}:{d}");
        assert_eq!(t, Topology::random_regular(n, d, 11).unwrap());
    }
    assert_ne!(
        Topology::random_regular(30, 3, 1).unwrap(),
        Topology::random_regular(30, 3, 2).unwrap()
    );
    // No SEED in the spec means seed 0, unless the caller passes its own.
    assert_eq!(
        spec("random-regular:20:3"),
        Topology::random_regular(20, 3, 0).unwrap()
    );
    let sim_seeded = "tree:20"
        .parse::<TopologySpec>()
        .unwrap()
        .build_seeded(Some(5))
        .unwrap();
    assert_eq!(sim_seeded, Topology::random_tree(20, 5).unwrap());
    for n in [2, 3, 10, 200] {
        let t = Topology::random_tree(n, 3).unwrap();
        assert_eq!(t.edges().len(), n - 1);
        assert!(t.is_connected());
    }
}

#[test]
fn edge_lists_parse_with_line_numbers_and_disconnected_graphs_are_refused() {
    let t = Topology::parse_edge_list("# a triangle\n0 1\n1 2 0.5\n\n2 0 2 # heavy\n").unwrap();
    assert_eq!(t.nodes(), 3);
    assert_eq!(t.edges()[1].weight, 0.5);
    assert!(close(t.weighted_degree(2), 2.5, 0.0));
    assert_eq!(Topology::parse_edge_list(&t.to_edge_list()).unwrap(), t);
    let line = |text: &str| match Topology::parse_edge_list(text).unwrap_err() {
        GraphError::EdgeListLine { line, .. } => line,
        e => panic!("{e}"),
    };
    assert_eq!(line("0 1\n1 x\n"), 2);
    assert_eq!(line("0 1\n\n1 2 -3\n"), 3);
    assert_eq!(line("0 1\n1 1\n"), 2);
    assert_eq!(line("0 1\n1 0\n"), 2);
    assert_eq!(line("0 1 2 3\n"), 1);
    let two = Topology::parse_edge_list("0 1\n2 3\n").unwrap();
    let e = Analysis::new(&two, None, &IID).unwrap_err();
    assert!(matches!(e, GraphError::Disconnected { components: 2 }));
    assert!(e.to_string().contains("disconnected"));
    // Weights override: unknown links are refused, listed ones replaced.
    let ring = spec("ring:4");
    let w = ring.with_weights_from_edge_list("1 0 3\n").unwrap();
    assert_eq!(w.edges()[0].weight, 3.0);
    assert!(ring.with_weights_from_edge_list("0 2 1\n").is_err());
}

fn arbitrary_graph() -> impl Strategy<Value = Topology> {
    // A random tree plus extra links, all with random positive weights: always connected.
    (
        3usize..12,
        any::<u64>(),
        proptest::collection::vec((0usize..12, 0usize..12, 0.1f64..3.0), 0..12),
    )
        .prop_map(|(n, seed, extra)| {
            let tree = Topology::random_tree(n, seed).unwrap();
            let mut edges: Vec<(usize, usize, f64)> = tree
                .edges()
                .iter()
                .enumerate()
                .map(|(i, e)| (e.a, e.b, 0.2 + (i % 5) as f64 * 0.4))
                .collect();
            for (a, b, w) in extra {
                let (a, b) = (a % n, b % n);
                if a != b
                    && !edges
                        .iter()
                        .any(|e| (e.0.min(e.1), e.0.max(e.1)) == (a.min(b), a.max(b)))
                {
                    edges.push((a, b, w));
                }
            }
            Topology::from_edges(n, edges).unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Thm 1 on arbitrary weighted graphs and γ: eq. 24 (spectral) = eq. 20 (trace form).
    #[test]
    fn phi_ss_spectral_equals_trace_form(t in arbitrary_graph(), frac in 0.05f64..0.95) {
        let a = Analysis::new(&t, None, &IID).unwrap();
        let gamma = frac * a.gamma_max;
        let b = Analysis::new(&t, Some(gamma), &IID).unwrap();
        let c = phi_ss_trace_form(&t, gamma, &IID).unwrap();
        prop_assert!(close(b.phi_ss, c, 1e-7), "{} vs {}", b.phi_ss, c);
        // Trace(L) = 2 Σ w: the spectrum adds up.
        let sum: f64 = b.spectrum().eigenvalues().iter().sum();
        let w2: f64 = 2.0 * t.edges().iter().map(|e| e.weight).sum::<f64>();
        prop_assert!(close(sum, w2, 1e-10));
        prop_assert!(b.stable && b.phi_cr < 1.0);
    }
}
