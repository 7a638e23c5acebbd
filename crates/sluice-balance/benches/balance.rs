//! Cost of one JSQT decision cycle (route + arrival + departure + slot end) and of the exact
//! offline optimum, for small and larger farms.
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_balance::{AlphaFair, DriftParams, Farm, Jsq, Jsqt, Policy, optimum};

fn farm(servers: usize, balancers: usize) -> Farm {
    let caps = (0..servers).map(|s| 1.0 + s as f64).collect();
    // Balancer b reaches every second server starting at b, plus server 0.
    let reach = (0..balancers)
        .map(|b| (0..servers).filter(|s| s % 2 == b % 2 || *s == 0).collect())
        .collect();
    Farm::new(caps, reach).unwrap()
}

fn policy_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy_slot");
    for (servers, balancers) in [(2, 1), (16, 4)] {
        let f = farm(servers, balancers);
        let pens = AlphaFair::per_server(2.0, &vec![1.0; servers]).unwrap();
        let mut jsqt =
            Jsqt::new(f.clone(), pens, DriftParams::new(100.0, 50.0, 1.0).unwrap()).unwrap();
        let mut jsq = Jsq::new(f);
        let step = |p: &mut dyn Policy| {
            for b in 0..balancers {
                let r = p.route(b).unwrap();
                p.on_arrival(r.server, 3, r.tag);
                p.on_departure(r.server, 2);
            }
            p.end_slot();
        };
        g.bench_function(format!("jsqt_{servers}s_{balancers}b"), |bch| {
            bch.iter(|| step(black_box(&mut jsqt)))
        });
        g.bench_function(format!("jsq_{servers}s_{balancers}b"), |bch| {
            bch.iter(|| step(black_box(&mut jsq)))
        });
    }
    g.finish();
}

fn offline_optimum(c: &mut Criterion) {
    let mut g = c.benchmark_group("optimum");
    for (servers, balancers) in [(3, 2), (10, 4)] {
        let f = farm(servers, balancers);
        let demand: Vec<f64> = (0..balancers).map(|b| 10.0 + b as f64).collect();
        let weights = vec![1.0; servers];
        g.bench_function(format!("alpha_fair_{servers}s_{balancers}b"), |bch| {
            bch.iter(|| optimum::alpha_fair(&f, black_box(&demand), 2.0, &weights).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, policy_step, offline_optimum);
criterion_main!(benches);
