//! Cost of one `ShouldRateLimit` decision in the engine (no network): README Example 2's
//! two-descriptor request over 1 000 phone numbers, and a one-descriptor request for a
//! key-only rule over 10 000 addresses; consuming and look-only.
//!
//! Run: `cargo bench -p sluice-server --bench engine -- --warm-up-time 1 --measurement-time 3`
//!
//! Before criterion, the bench prints the *distribution* of one decision's time (p50, p99,
//! p99.9 over 2,000,000 timed calls, on 1 and on 2 threads deciding at once), because the
//! issue's target is a p99 and criterion reports means. `SLUICE_LATENCY_ONLY=1` skips the
//! criterion pass. Each call is timed with two clock reads (about 20 ns each, included).
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use hdrhistogram::Histogram;
use sluice_server::{Config, Descriptor, Engine, Request};

/// Times `calls` decisions on each of `threads` threads (each thread its own slice of
/// `requests`, all on the same engine) and prints the percentiles of one decision.
fn distribution(name: &str, engine: &Engine, requests: &[Request], threads: usize, calls: usize) {
    let t0 = 1_700_006_400_000_000_000u64;
    let hists: Vec<Histogram<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).unwrap();
                    let mut now = t0;
                    for i in 0..calls {
                        let r = &requests[(i * threads + t) % requests.len()];
                        now += 1_000;
                        let start = Instant::now();
                        black_box(engine.should_rate_limit(now, r).unwrap());
                        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        h.record(ns.max(1)).unwrap();
                    }
                    h
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).unwrap();
    for h in &hists {
        all.add(h).unwrap();
    }
    eprintln!(
        "latency {name} threads={threads}: p50 {} ns | p99 {} ns | p99.9 {} ns | max {} ns | calls {}",
        all.value_at_quantile(0.5),
        all.value_at_quantile(0.99),
        all.value_at_quantile(0.999),
        all.max(),
        all.len()
    );
}

const MESSAGING: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: { unit: day, requests_per_unit: 5 }
  - key: to_number
    rate_limit: { unit: day, requests_per_unit: 100 }
";

fn main() {
    latency_pass();
    if std::env::var_os("SLUICE_LATENCY_ONLY").is_some() {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));

    let engine = Engine::new(Config::from_yaml("m.yaml", MESSAGING).unwrap());
    let requests = example2_requests();
    let t0 = 1_700_006_400_000_000_000u64;
    let mut i = 0usize;
    g.bench_function("example2_two_descriptors", |b| {
        b.iter(|| {
            i = (i + 1) % requests.len();
            black_box(
                engine
                    .should_rate_limit(t0 + i as u64, &requests[i])
                    .unwrap(),
            )
        });
    });

    let engine = Engine::new(Config::example());
    let requests = address_requests();
    let mut now = t0;
    let mut i = 0usize;
    g.bench_function("one_descriptor_10k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % requests.len();
            now += 1_000;
            black_box(engine.should_rate_limit(now, &requests[i]).unwrap())
        });
    });
    g.bench_function("one_descriptor_check_only", |b| {
        b.iter(|| {
            i = (i + 1) % requests.len();
            black_box(engine.check_only(now, &requests[i]).unwrap())
        });
    });
    g.finish();
    c.final_summary();
}

fn example2_requests() -> Vec<Request> {
    (0..1_000)
        .map(|i| {
            let n = format!("206{i:07}");
            Request::new(
                "messaging",
                [
                    Descriptor::new([("message_type", "marketing"), ("to_number", n.as_str())]),
                    Descriptor::new([("to_number", n.as_str())]),
                ],
            )
        })
        .collect()
}

fn address_requests() -> Vec<Request> {
    (0..10_000)
        .map(|i| {
            let ip = format!("10.0.{}.{}", i / 256, i % 256);
            Request::new(
                "example",
                [Descriptor::new([("remote_address", ip.as_str())])],
            )
        })
        .collect()
}

/// The distribution of one decision, after a warm-up pass that stores every key.
fn latency_pass() {
    let calls = 2_000_000;
    let engine = Engine::new(Config::from_yaml("m.yaml", MESSAGING).unwrap());
    let requests = example2_requests();
    distribution("example2_two_descriptors", &engine, &requests, 1, 100_000);
    for threads in [1, 2] {
        distribution(
            "example2_two_descriptors",
            &engine,
            &requests,
            threads,
            calls,
        );
    }
    let engine = Engine::new(Config::example());
    let requests = address_requests();
    distribution("one_descriptor_10k_keys", &engine, &requests, 1, 100_000);
    for threads in [1, 2] {
        distribution(
            "one_descriptor_10k_keys",
            &engine,
            &requests,
            threads,
            calls,
        );
    }
}
