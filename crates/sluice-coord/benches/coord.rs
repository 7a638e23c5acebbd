//! Message bytes and codec cost per active key, and the cost of a node's cycle, side by side
//! for 1, 100 and 10 000 active keys. Bytes per key are printed (they are exact, not timed).
#![allow(clippy::unwrap_used, clippy::print_stdout, missing_docs)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sluice_coord::node::{Config, Node};
use sluice_coord::wire;

const CYCLE: u64 = 100_000_000;

/// Two linked nodes after `cycles` cycles with `keys` active keys (demand at node 0).
fn pair(keys: u64, cycles: u64) -> (Node, Node) {
    let cfg = |id, peer| Config::new(id, vec![0, 1], vec![(peer, 1.0)], 1_000_000);
    let mut a = Node::new(cfg(0, 1), 0).unwrap();
    let mut b = Node::new(cfg(1, 0), 0).unwrap();
    let mut draw = || 0.5;
    for k in 0..keys {
        a.set_demand(0, k * 7919, 400_000.0 + k as f64);
    }
    for c in 1..=cycles {
        let now = c * CYCLE;
        a.tick(now, &mut draw);
        b.tick(now, &mut draw);
        for m in a.ready(now).messages {
            b.handle_message(now, 0, m.message, &mut draw);
        }
        for m in b.ready(now).messages {
            a.handle_message(now, 1, m.message, &mut draw);
        }
    }
    (a, b)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("coord");
    for keys in [1u64, 100, 10_000] {
        let (mut a, _) = pair(keys, 5);
        let now = 6 * CYCLE;
        a.tick(now, &mut || 0.5);
        let msg = a
            .ready(now)
            .messages
            .into_iter()
            .find(|m| m.to == 1)
            .unwrap()
            .message;
        let bytes = wire::encode(&msg);
        let empty = wire::encode(&wire::Message {
            keys: Vec::new(),
            ..msg.clone()
        })
        .len();
        println!(
            "keys={keys}: message {} bytes, {:.1} bytes/key, node state {} bytes/key",
            bytes.len(),
            (bytes.len() - empty) as f64 / keys as f64,
            a.state_bytes_per_key()
        );
        g.bench_with_input(BenchmarkId::new("encode", keys), &msg, |bch, m| {
            bch.iter(|| wire::encode(std::hint::black_box(m)));
        });
        g.bench_with_input(BenchmarkId::new("decode", keys), &bytes, |bch, b| {
            bch.iter(|| wire::decode(std::hint::black_box(b)).unwrap());
        });
        g.bench_function(BenchmarkId::new("tick", keys), |bch| {
            let (mut n, _) = pair(keys, 5);
            let mut t = 6 * CYCLE;
            bch.iter(|| {
                t += CYCLE;
                n.tick(t, &mut || 0.5);
                n.ready(t)
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
