//! One decision in memory, in Redis (exact: one script call), and in batched mode, on a
//! local `redis-server` started for the run (127.0.0.1, a free port). Sequential calls on
//! one connection: the exact figure is a round trip plus the script; batched is mostly
//! local (at 10 000 requests per second of the node's clock, a batch covers the default
//! 20 ms horizon: about 200 permits per Redis call).
//!
//! Run: `cargo bench -p sluice-redis --bench redis -- --warm-up-time 1 --measurement-time 3`
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::Criterion;
use sluice_limits::{AlgorithmKind, AnyAlgorithm, Limit, Options};
use sluice_redis::{BatchConfig, BatchedStore, MemoryStore, RedisConfig, RedisStore};

fn bench(c: &mut Criterion) {
    let server = support::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Every request admitted: the common path.
    let limit: Limit = "1000000000/1s".parse().unwrap();
    let config = || RedisConfig {
        timeout: std::time::Duration::from_secs(1),
        ..RedisConfig::caller_time()
    };
    let now = AtomicU64::new(0);
    // The node's clock: 100 µs per request (10 000 requests per second).
    let tick = || now.fetch_add(100_000, Ordering::Relaxed);
    let mut g = c.benchmark_group("decision");
    for kind in [
        AlgorithmKind::Gcra,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingLog,
    ] {
        let alg = AnyAlgorithm::new(kind, Options::default());
        let memory = MemoryStore::new();
        g.bench_function(format!("{kind}/memory"), |b| {
            b.iter(|| black_box(memory.decide(&alg, "k", &limit, tick(), 1)))
        });
        let exact = RedisStore::new(&server.url(), config()).unwrap();
        g.bench_function(format!("{kind}/redis-exact"), |b| {
            b.to_async(&rt).iter(|| async {
                black_box(exact.check(&alg, "k", &limit, tick(), 1).await.unwrap())
            })
        });
        let batched = BatchedStore::new(
            RedisStore::new(&server.url(), config()).unwrap(),
            BatchConfig::default(),
        );
        g.bench_function(format!("{kind}/redis-batched"), |b| {
            b.to_async(&rt).iter(|| async {
                black_box(batched.check(&alg, "k", &limit, tick(), 1).await.unwrap())
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
