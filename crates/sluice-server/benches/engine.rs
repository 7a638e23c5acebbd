//! Cost of one `ShouldRateLimit` decision in the engine (no network): README Example 2's
//! two-descriptor request over 1 000 phone numbers, and a one-descriptor request for a
//! key-only rule over 10 000 addresses; consuming and look-only.
//!
//! Run: `cargo bench -p sluice-server --bench engine -- --warm-up-time 1 --measurement-time 3`
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use sluice_server::{Config, Descriptor, Engine, Request};

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
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));

    let engine = Engine::new(Config::from_yaml("m.yaml", MESSAGING).unwrap());
    let requests: Vec<Request> = (0..1_000)
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
        .collect();
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
    let requests: Vec<Request> = (0..10_000)
        .map(|i| {
            let ip = format!("10.0.{}.{}", i / 256, i % 256);
            Request::new(
                "example",
                [Descriptor::new([("remote_address", ip.as_str())])],
            )
        })
        .collect();
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
