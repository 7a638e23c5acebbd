//! The baselines table: same workload for everyone, the qualitative differences the designs
//! imply, and same seed ⇒ same table.
#![allow(clippy::unwrap_used)]

mod support;

use sluice_sim::baselines::{Baseline, Row, Setup, Table, run, total_demand};
use sluice_sim::cluster::{Scenario, Strategy, Workload, run as cluster_run};

const WORKLOADS: [Workload; 5] = [
    Workload::Steady,
    Workload::Skewed,
    Workload::Shift,
    Workload::Hotspot,
    Workload::PaperEx2,
];

#[test]
fn every_strategy_sees_the_cluster_workload() {
    // The direct baselines regenerate the demand; it must be the one the real nodes see.
    for w in WORKLOADS {
        let mut sc = Scenario::new("ring:6".parse().unwrap(), Strategy::Static, w);
        sc.cycles = 120;
        sc.seed = 3;
        sc.limit = Some(10_000);
        let trace = cluster_run(&sc, &mut |_, _| {}).unwrap().trace;
        let ours = total_demand(w, 6, 10_000, 120, 3);
        assert_eq!(trace.len(), ours.len());
        for (c, d) in trace.iter().zip(&ours) {
            assert!(
                (c.demand - d).abs() <= 1e-9 * d.abs().max(1.0),
                "{w}: {c:?} vs {d}"
            );
        }
    }
}

fn table(workloads: Vec<Workload>, losses: Vec<f64>, cycles: u64) -> Table {
    let mut s = Setup::new("ring:6".parse().unwrap());
    s.workloads = workloads;
    s.losses = losses;
    s.cycles = cycles;
    run(&s, &mut |_, _| {}).unwrap()
}

fn row(t: &Table, loss: f64, b: Baseline) -> &Row {
    t.rows
        .iter()
        .find(|r| r.strategy == b && r.loss == loss)
        .unwrap()
}

#[test]
fn skewed_overload_orders_the_designs() {
    // Total demand 1.2·L, Zipf over the nodes.
    let t = table(vec![Workload::Skewed], vec![0.0, 0.2], 200);
    assert_eq!(t.rows.len(), 2 * Baseline::ALL.len());
    let r = |loss, b| row(&t, loss, b);
    // Sluice: never above L (conservation), far less over-throttling than a static split
    // (seed 000 §6).
    for loss in [0.0, 0.2] {
        assert_eq!(r(loss, Baseline::Sluice).overshoot_pct, 0.0);
        assert!(
            r(loss, Baseline::Sluice).over_throttling_pct
                < r(loss, Baseline::Static).over_throttling_pct / 2.0
        );
    }
    // A central exact bucket is exact on a perfect network, and pays a round trip per
    // request; with loss it fails closed on every lost answer: 0.8 of the requests reach
    // the bucket (0.96·L, all admitted), 0.8 of the answers come back, 0.768·L admitted.
    assert!(r(0.0, Baseline::Central).over_throttling_pct < 1e-6);
    assert_eq!(r(0.0, Baseline::Central).overshoot_pct, 0.0);
    assert!((r(0.2, Baseline::Central).over_throttling_pct - 23.2).abs() < 0.01);
    assert!(
        r(0.0, Baseline::Central).messages_per_node_per_s
            > 100.0 * r(0.0, Baseline::Sluice).messages_per_node_per_s
    );
    // Owner forwarding answers from caches: in overload it admits more than L.
    assert!(r(0.0, Baseline::Owner).overshoot_pct > 1.0);
    // GRD with an all-to-all exchange tracks the aggregate: little error, N − 1 messages
    // per node per cycle.
    assert!(r(0.0, Baseline::Grd).over_throttling_pct < 1.0);
    assert!((r(0.0, Baseline::Grd).messages_per_node_per_s - 50.0).abs() < 1e-9);
    // Leases never hand out more than L: no overshoot on a perfect network.
    assert_eq!(r(0.0, Baseline::Doorman).overshoot_pct, 0.0);
}

/// Writes the table's files and its JSON to a fresh `dir`; every file's name and bytes.
fn outputs(t: &Table, dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let _ = std::fs::remove_dir_all(dir);
    t.write(dir).unwrap();
    std::fs::write(dir.join("table.json"), serde_json::to_string(t).unwrap()).unwrap();
    support::files(dir)
}

#[test]
fn same_seed_same_files_other_seed_other_files() {
    let setup = |seed| {
        let mut s = Setup::new("ring:6".parse().unwrap());
        s.workloads = vec![Workload::Shift, Workload::PaperEx2];
        s.losses = vec![0.0, 0.1];
        s.cycles = 120;
        s.seed = seed;
        s
    };
    let base = std::env::temp_dir().join(format!("sluice-baselines-{}", std::process::id()));
    let a = outputs(&run(&setup(1), &mut |_, _| {}).unwrap(), &base.join("a"));
    let b = outputs(&run(&setup(1), &mut |_, _| {}).unwrap(), &base.join("b"));
    let names: Vec<&str> = a.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "baselines.csv",
            "error-loss-0.1.svg",
            "error-loss-0.svg",
            "table.json"
        ]
    );
    assert_eq!(a, b, "same seed, same bytes");
    // The workload's curves and the network's losses are random: another seed moves every
    // number, so every file changes.
    let c = outputs(&run(&setup(2), &mut |_, _| {}).unwrap(), &base.join("c"));
    let _ = std::fs::remove_dir_all(&base);
    for (x, y) in a.iter().zip(&c) {
        assert_eq!(x.0, y.0);
        assert_ne!(x.1, y.1, "{} did not change with the seed", x.0);
    }
}

#[test]
fn unknown_strategy_is_an_error() {
    assert!("gubernator".parse::<Baseline>().is_err());
    assert_eq!("owner".parse::<Baseline>().unwrap(), Baseline::Owner);
}
