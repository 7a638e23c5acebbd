//! Targets (seed 000 tooling): analysis of a 1,000-node topology in ≤ 2 s; weight synthesis
//! for 100 nodes in ≤ 60 s. Run: `cargo bench -p sluice-graph --bench graph`.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use sluice_graph::{Analysis, Noise, SolverOptions, Topology, fastest_weights, robust_weights};

fn analysis(c: &mut Criterion) {
    let mut g = c.benchmark_group("analysis");
    g.sample_size(10);
    let t = Topology::random_regular(1000, 4, 0).unwrap();
    g.bench_function("random-regular:1000:4", |b| {
        b.iter(|| Analysis::new(black_box(&t), None, &Noise::Iid { sigma: 1.0 }).unwrap())
    });
    let grid = Topology::grid(25, 40).unwrap();
    g.bench_function("grid:25x40", |b| {
        b.iter(|| Analysis::new(black_box(&grid), None, &Noise::Iid { sigma: 1.0 }).unwrap())
    });
    let rr8 = Topology::random_regular(1000, 8, 0).unwrap();
    g.bench_function("random-regular:1000:8", |b| {
        b.iter(|| Analysis::new(black_box(&rr8), None, &Noise::Iid { sigma: 1.0 }).unwrap())
    });
    // m = 499,500 links: the Laplacian is dense, the decomposition the same O(n³).
    let k1000 = Topology::complete(1000).unwrap();
    g.bench_function("complete:1000", |b| {
        b.iter(|| Analysis::new(black_box(&k1000), None, &Noise::Iid { sigma: 1.0 }).unwrap())
    });
    g.finish();
}

fn synthesis(c: &mut Criterion) {
    let mut g = c.benchmark_group("synthesis");
    g.sample_size(10);
    let t = Topology::random_regular(100, 4, 0).unwrap();
    let gamma = Analysis::new(&t, None, &Noise::Iid { sigma: 1.0 })
        .unwrap()
        .gamma_opt;
    g.bench_function("fastest random-regular:100:4", |b| {
        b.iter(|| fastest_weights(black_box(&t), gamma, SolverOptions::default()).unwrap())
    });
    g.bench_function("robust random-regular:100:4", |b| {
        b.iter(|| {
            robust_weights(
                black_box(&t),
                gamma,
                &Noise::Iid { sigma: 1.0 },
                SolverOptions::default(),
            )
            .unwrap()
        })
    });
    // Denser: m = 500 links, so the m×m Newton systems dominate.
    let dense = Topology::random_regular(100, 10, 0).unwrap();
    let gamma = Analysis::new(&dense, None, &Noise::Iid { sigma: 1.0 })
        .unwrap()
        .gamma_opt;
    g.bench_function("fastest random-regular:100:10", |b| {
        b.iter(|| fastest_weights(black_box(&dense), gamma, SolverOptions::default()).unwrap())
    });
    g.bench_function("robust random-regular:100:10", |b| {
        b.iter(|| {
            let noise = Noise::Iid { sigma: 1.0 };
            robust_weights(black_box(&dense), gamma, &noise, SolverOptions::default()).unwrap()
        })
    });
    g.finish();
}

/// The densest 100-node case: K100, m = 4,950 links. The m×m Newton system would cost
/// ~4·10¹⁰ flops per step; the matrix-free path (Newton–CG) is what makes it fit.
fn synthesis_dense(c: &mut Criterion) {
    let mut g = c.benchmark_group("synthesis-dense");
    g.sample_size(10);
    let k100 = Topology::complete(100).unwrap();
    let noise = Noise::Iid { sigma: 1.0 };
    let gamma = Analysis::new(&k100, None, &noise).unwrap().gamma_opt;
    g.bench_function("fastest complete:100", |b| {
        b.iter(|| fastest_weights(black_box(&k100), gamma, SolverOptions::default()).unwrap())
    });
    g.bench_function("robust complete:100", |b| {
        b.iter(|| {
            robust_weights(black_box(&k100), gamma, &noise, SolverOptions::default()).unwrap()
        })
    });
    g.finish();
}

/// Dense *irregular* 100-node graph (issue 6): `random-regular:100:50`, m = 2,500 links.
/// SDP 33 takes the matrix-free path with a stale-factor preconditioner (a Hessian
/// factorisation every few Newton steps). One run takes seconds, so the group takes the
/// fewest runs criterion allows: flat sampling, 10 samples of one run each, no warm-up loop.
fn synthesis_irregular(c: &mut Criterion) {
    let mut g = c.benchmark_group("synthesis-irregular");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    let t = Topology::random_regular(100, 50, 0).unwrap();
    let noise = Noise::Iid { sigma: 1.0 };
    let gamma = Analysis::new(&t, None, &noise).unwrap().gamma_opt;
    g.bench_function("fastest random-regular:100:50", |b| {
        b.iter(|| fastest_weights(black_box(&t), gamma, SolverOptions::default()).unwrap())
    });
    g.bench_function("robust random-regular:100:50", |b| {
        b.iter(|| robust_weights(black_box(&t), gamma, &noise, SolverOptions::default()).unwrap())
    });
    g.finish();
}

criterion_group!(
    benches,
    analysis,
    synthesis,
    synthesis_dense,
    synthesis_irregular
);
criterion_main!(benches);
