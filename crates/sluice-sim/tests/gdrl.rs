//! Seed 003 §III on the production nodes: each experiment's qualitative result at small size,
//! and same seed ⇒ same output.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;

use sluice_sim::gdrl::{self, Demand, RunReport, Setup};

fn ring(slots: u64) -> Setup {
    let mut s = Setup::ring(10, 1.1, Demand::Constant);
    s.slots = slots;
    s
}

#[test]
fn ring_n10_equalises_indicators_seed003_iiia() {
    // Seed 003 §III-A, Figs. 3–4: from the 1/N rule (JFI ≈ 0.04) the q_i converge to one
    // value and JFI(q) to "very close to 1"; Σ C_i = C throughout (Lemma 1).
    let s = ring(3000);
    let out = gdrl::ring(&s, &mut |_, _| {}).unwrap();
    let r = &out.report;
    assert!(r.jfi_first < 0.2, "{r:?}");
    assert!(r.jfi_mean_last_10pct >= 0.99, "{r:?}");
    assert!(r.settle_slots_099.is_some_and(|t| t < 500), "{r:?}");
    assert!(r.max_sum_over_limit <= 0.0, "{r:?}");
    // Every q_i ends near the equilibrium q* = (Λ − C)/N, up to the error of λ̂.
    let q = out.trace.q.last().unwrap();
    for qi in q {
        assert!((qi - r.q_star).abs() < 0.03, "q {q:?} vs q* {}", r.q_star);
    }
    // Two links per node, one message per link and cycle.
    assert!((r.messages_per_node_per_cycle - 2.0).abs() < 0.01, "{r:?}");
}

#[test]
fn dynamic_recovers_after_each_change_seed003_iiib() {
    // Seed 003 §III-B, Fig. 6: after the abrupt swap and during and after the linear shift
    // JFI returns to ≈ 1 ("GDRL stabilizes after the transient periods").
    let mut s = Setup::ring(10, 1.0 / 0.9, Demand::Dynamic { tau0: 2500 });
    s.slots = 10_000;
    let out = gdrl::dynamic(&s, &mut |_, _| {}).unwrap();
    let rep = &out.report;
    assert_eq!(rep.phases.len(), 4);
    for p in &rep.phases {
        assert!(p.jfi_end >= 0.99, "{p:?}");
        assert!(p.settle_slots_099.is_some(), "{p:?}");
    }
    // The abrupt swap is a real disturbance: JFI dips right after it, below the level it
    // holds at the end of the phase before.
    let before = &rep.phases[0];
    let swap = &rep.phases[1];
    assert!(swap.jfi_min < before.jfi_end, "{rep:?}");
    assert!(rep.run.max_sum_over_limit <= 0.0, "{rep:?}");
}

#[test]
fn scale_all_converge_and_ring_is_slowest_seed003_iiic() {
    // Seed 003 §III-C, Fig. 7: on random d-regular graphs at η = 1/(2d) every case reaches
    // JFI ≈ 1, and "convergence to the steady-state is slowest for d = 2".
    let mut t = Setup::regular(10, 2, 1).unwrap();
    t.slots = 1500;
    let out = gdrl::scale(&t, &[10, 100], &[2, 4, 8], &mut |_| {}).unwrap();
    assert_eq!(out.cases.len(), 6);
    for (n, d, r) in &out.cases {
        assert!(r.jfi_final >= 0.99, "N={n} d={d}: {r:?}");
        // The nodes are not recorded per cycle, yet the final mean q is reported: q*, up to
        // the error of λ̂ (the capacities add up to C, so Σ q_i = Σ λ̂_i − C).
        assert!(
            (r.q_mean_final - r.q_star).abs() < 0.01,
            "N={n} d={d}: {} vs {}",
            r.q_mean_final,
            r.q_star
        );
        assert!(r.max_sum_over_limit <= 0.0, "N={n} d={d}: {r:?}");
        assert!((r.eta - 1.0 / (2.0 * *d as f64)).abs() < 1e-12);
    }
    let settle = |n: usize, d: usize| -> u64 {
        let r: &RunReport = &out.cases.iter().find(|c| c.0 == n && c.1 == d).unwrap().2;
        r.settle_slots_099.unwrap()
    };
    assert!(settle(100, 2) > settle(100, 4), "d = 2 slowest at N = 100");
    assert!(settle(100, 2) > settle(100, 8), "d = 2 slowest at N = 100");
}

#[test]
fn loss_keeps_the_sum_within_capacity() {
    // Seed 003 §IV "message passing": a lost packet must not let a limiter gain capacity.
    let mut s = ring(1500);
    s.loss = 0.3;
    let out = gdrl::ring(&s, &mut |_, _| {}).unwrap();
    assert!(out.report.max_sum_over_limit <= 0.0, "{:?}", out.report);
    assert!(out.report.jfi_mean_last_10pct >= 0.95, "{:?}", out.report);
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-gdrl-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn same_seed_same_files() {
    let s = {
        let mut s = Setup::ring(10, 1.0 / 0.9, Demand::Dynamic { tau0: 300 });
        s.slots = 1200;
        s.loss = 0.1;
        s
    };
    let (a, b) = (tmp("a"), tmp("b"));
    for dir in [&a, &b] {
        let out = gdrl::dynamic(&s, &mut |_, _| {}).unwrap();
        out.trace.write(dir, s.demand, "t").unwrap();
        std::fs::write(
            dir.join("summary.json"),
            serde_json::to_string(&out.report).unwrap(),
        )
        .unwrap();
    }
    assert_eq!(support::files(&a), support::files(&b));
    let mut t = Setup::regular(10, 2, 5).unwrap();
    t.slots = 300;
    let (c, d) = (tmp("c"), tmp("d"));
    for dir in [&c, &d] {
        gdrl::scale(&t, &[10], &[2, 4], &mut |_| {})
            .unwrap()
            .write(dir)
            .unwrap();
    }
    assert_eq!(support::files(&c), support::files(&d));
    // Another seed gives other arrivals.
    let mut s2 = s.clone();
    s2.seed = 2;
    let x = gdrl::simulate(&s, &mut |_, _| {}).unwrap();
    let y = gdrl::simulate(&s2, &mut |_, _| {}).unwrap();
    assert_ne!(x.jfi, y.jfi);
    for dir in [a, b, c, d] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn ring_same_seed_same_files_other_seed_other_files() {
    // gdrl-ring's files (trace.csv, q.svg, jfi.svg, lambda.svg) and its JSON summary, byte
    // for byte; arrivals and message loss are random, so another seed changes the trace.
    let mut s = ring(600);
    s.loss = 0.1;
    let write = |s: &Setup, dir: &PathBuf| {
        let out = gdrl::ring(s, &mut |_, _| {}).unwrap();
        out.trace.write(dir, s.demand, "seed 003 §III-A").unwrap();
        std::fs::write(
            dir.join("summary.json"),
            serde_json::to_string(&out.report).unwrap(),
        )
        .unwrap();
        support::files(dir)
    };
    let (a, b, c) = (tmp("ring-a"), tmp("ring-b"), tmp("ring-c"));
    let (fa, fb) = (write(&s, &a), write(&s, &b));
    let names: Vec<&str> = fa.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "jfi.svg",
            "lambda.svg",
            "q.svg",
            "summary.json",
            "trace.csv"
        ]
    );
    assert_eq!(fa, fb);
    let mut other = s.clone();
    other.seed = 2;
    let fc = write(&other, &c);
    for (x, y) in fa.iter().zip(&fc) {
        assert_ne!(x.1, y.1, "{} did not change with the seed", x.0);
    }
    for dir in [a, b, c] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn bad_parameters_are_errors() {
    let mut s = ring(10);
    s.alpha = 0.0;
    assert!(gdrl::simulate(&s, &mut |_, _| {}).is_err());
    let mut s = ring(10);
    s.eta = Some(1.0); // above seed 003 eq. 15's 1/(2d) = 1/4: the node refuses it
    assert!(matches!(
        gdrl::simulate(&s, &mut |_, _| {}),
        Err(gdrl::GdrlError::Config(_))
    ));
    assert!(Setup::regular(10, 10, 1).is_err());
}
