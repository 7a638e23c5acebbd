//! Cost of one decision of every algorithm, through the run-time dispatch `AnyAlgorithm`.
//!
//! `cargo bench -p sluice-limits --bench windows -- --warm-up-time 1 --measurement-time 2`
#![allow(clippy::unwrap_used, missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_limits::{Algorithm, AlgorithmKind, AnyAlgorithm, Limit, Options};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let l = Limit::from_nanos(1000, 1_000_000_000).unwrap();
    let mut g = c.benchmark_group("check");
    for kind in AlgorithmKind::ALL {
        let alg = AnyAlgorithm::new(kind, Options::default());
        // Mixed: 1 request per 500 ns against 1000/s: mostly refused (the hot path under load).
        g.bench_function(format!("{kind}/overloaded"), |b| {
            let mut s = alg.new_state(&l, 0);
            let mut t = 0u64;
            b.iter(|| {
                t += 500;
                black_box(alg.check(&mut s, &l, black_box(t), 1))
            })
        });
        // Every request admitted: 1 per 1.1 ms.
        g.bench_function(format!("{kind}/admitted"), |b| {
            let mut s = alg.new_state(&l, 0);
            let mut t = 0u64;
            b.iter(|| {
                t += 1_100_000;
                black_box(alg.check(&mut s, &l, black_box(t), 1))
            })
        });
    }
    g.finish();
}
criterion_group!(benches, bench);
criterion_main!(benches);
