//! Several nodes sharing one Redis: under concurrent load they never admit more than the
//! limit, in exact and in batched mode; server time makes the clients' clocks irrelevant.
//! Needs `redis-server` on PATH.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use sluice_limits::{AlgorithmKind, AnyAlgorithm, Limit, Options};
use sluice_redis::{BatchConfig, BatchedStore, RedisConfig, RedisStore, TimeSource};
use support::RedisServer;

fn config(prefix: &str) -> RedisConfig {
    RedisConfig {
        prefix: prefix.to_string(),
        timeout: std::time::Duration::from_secs(5),
        ..RedisConfig::default()
    }
}

/// Two nodes (two connections) × 4 tasks × 50 requests of 1 permit against a limit of 50
/// per hour, on the server's clock: exactly 50 admitted in all, for every algorithm
/// (within one hour the buckets refill less than one permit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_admit_more_than_the_limit() {
    let server = RedisServer::start();
    let limit: Limit = "50/1h".parse().unwrap();
    for kind in AlgorithmKind::ALL {
        if matches!(
            kind,
            AlgorithmKind::WarmUp | AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
        ) {
            // Epoch-aligned windows may end during the test; checked below on their own.
            continue;
        }
        let alg = AnyAlgorithm::new(kind, Options::default());
        let prefix = format!("{kind}:");
        let nodes = [
            Arc::new(RedisStore::new(&server.url(), config(&prefix)).unwrap()),
            Arc::new(RedisStore::new(&server.url(), config(&prefix)).unwrap()),
        ];
        let mut tasks = Vec::new();
        for node in &nodes {
            for _ in 0..4 {
                let node = Arc::clone(node);
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for _ in 0..50 {
                        let d = node.check(&alg, "shared", &limit, 0, 1).await.unwrap();
                        admitted += u64::from(d.allowed);
                    }
                    admitted
                }));
            }
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(
            total, 50,
            "{kind}: admitted {total} of 400 under a limit of 50"
        );
    }
}

/// Epoch-aligned windows on the caller's clock: every request of the run at one instant
/// of one window, from two nodes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_a_window_exactly() {
    let server = RedisServer::start();
    let limit: Limit = "50/1s".parse().unwrap();
    for kind in [AlgorithmKind::FixedWindow, AlgorithmKind::SlidingWindow] {
        let alg = AnyAlgorithm::new(kind, Options::default());
        let cfg = RedisConfig {
            prefix: format!("{kind}:"),
            ..RedisConfig::caller_time()
        };
        let nodes = [
            Arc::new(RedisStore::new(&server.url(), cfg.clone()).unwrap()),
            Arc::new(RedisStore::new(&server.url(), cfg).unwrap()),
        ];
        let mut tasks = Vec::new();
        for node in &nodes {
            for t in 0..4u64 {
                let node = Arc::clone(node);
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for i in 0..50u64 {
                        // Times spread inside [5 s, 5.5 s): one window of 1 s.
                        let now = 5_000_000_000 + (i * 4 + t) * 1_000_000;
                        let d = node.check(&alg, "shared", &limit, now, 1).await.unwrap();
                        admitted += u64::from(d.allowed);
                    }
                    admitted
                }));
            }
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(
            total, 50,
            "{kind}: admitted {total} of 400 under a limit of 50"
        );
    }
}

/// Batched mode: two nodes taking batches never give out more than the limit, ask Redis
/// far less often than once per request, and stop at the limit without starving it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_nodes_never_exceed_the_limit() {
    let server = RedisServer::start();
    let limit: Limit = "300/1h".parse().unwrap();
    let alg = AnyAlgorithm::new(AlgorithmKind::FixedWindowFirst, Options::default());
    let batch = BatchConfig {
        // Lease long enough that no batch expires during the run: the count is then exact.
        lease: 60_000_000_000,
        horizon: 50_000_000,
        ..BatchConfig::default()
    };
    let nodes = [
        Arc::new(BatchedStore::new(
            RedisStore::new(&server.url(), config("b:")).unwrap(),
            batch,
        )),
        Arc::new(BatchedStore::new(
            RedisStore::new(&server.url(), config("b:")).unwrap(),
            batch,
        )),
    ];
    let mut tasks = Vec::new();
    for node in &nodes {
        for t in 0..4u64 {
            let node = Arc::clone(node);
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                for i in 0..100u64 {
                    // The node's clock: 1 ms per request.
                    let now = 1_000_000 + (i * 4 + t) * 1_000_000;
                    let d = node.check(&alg, "shared", &limit, now, 1).await.unwrap();
                    admitted += u64::from(d.allowed);
                }
                admitted
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let calls: u64 = nodes.iter().map(|n| n.central_calls()).sum();
    assert!(total <= 300, "admitted {total} under a limit of 300");
    // No lease expires during the run and demand (400 per node) exceeds the limit, so a
    // node refused by Redis has used up its batches; only a batch racing the end of the
    // run can stay unused.
    assert!(total >= 200, "admitted only {total}");
    // Measured: 18 to 26 calls in three runs.
    assert!(calls < 100, "{calls} Redis calls for 800 requests");
}

/// Server time: the caller's `now` does not matter, and waits come back in whole µs.
#[tokio::test]
async fn server_time_ignores_the_callers_clock() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.url(), config("s:")).unwrap();
    assert_eq!(store.config().time, TimeSource::Server);
    let alg = AnyAlgorithm::new(AlgorithmKind::Gcra, Options::default());
    let limit: Limit = "10/1s".parse().unwrap();
    for i in 0..10u64 {
        // Wildly different client clocks.
        let d = store
            .check(&alg, "k", &limit, i * 1_000_000_000_000, 1)
            .await
            .unwrap();
        assert!(d.allowed);
    }
    let d = store.check(&alg, "k", &limit, 0, 1).await.unwrap();
    assert!(!d.allowed);
    let retry = d.retry_after.unwrap();
    assert!(retry > 0 && retry <= 100_000_000, "{retry}");
    assert_eq!(retry % 1000, 0, "whole microseconds");
    store.ping().await.unwrap();
}

/// Warm-up on the server's clock (µs): a cold key's first permit costs the first step of the
/// ramp (1/s, Guava's factor 3 over 10 s: stored permits 10, threshold 5, so the permit taken
/// at 10 costs (3 + 2.6) / 2 = 2.8 s), the next request waits for it, in whole µs, and a
/// second node sees the same state. Seconds, so the second call comes within them even on a
/// loaded machine.
#[tokio::test]
async fn warm_up_runs_on_server_time() {
    let server = RedisServer::start();
    let nodes = [
        RedisStore::new(&server.url(), config("w:")).unwrap(),
        RedisStore::new(&server.url(), config("w:")).unwrap(),
    ];
    let alg = AnyAlgorithm::WarmUp(sluice_limits::WarmUp::guava(10_000_000_000));
    let limit: Limit = "1/1s".parse().unwrap();
    let d = nodes[0].check(&alg, "k", &limit, 0, 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.reset_after, 2_800_000_000);
    let d = nodes[1].check(&alg, "k", &limit, 0, 1).await.unwrap();
    assert!(!d.allowed);
    let retry = d.retry_after.unwrap();
    // Less whatever time passed between the two calls (well under a second here).
    assert!(retry > 0 && retry <= 2_800_000_000, "{retry}");
    assert_eq!(retry % 1000, 0, "whole microseconds");
}

/// Batched mode on one node: batches grow (slow start) up to `max_batch`, then never take
/// more than half of what Redis said was left, so they shrink with the quota down to one
/// permit; every permit of the limit is given out, none more.
#[tokio::test]
async fn batches_shrink_with_what_is_left() {
    const LIMIT: u64 = 10_000;
    let server = RedisServer::start();
    let node = BatchedStore::new(
        RedisStore::new(
            &server.url(),
            RedisConfig {
                prefix: "shrink:".into(),
                ..RedisConfig::caller_time()
            },
        )
        .unwrap(),
        BatchConfig {
            // Neither a measured rate nor an expiry during the run: sizes are the slow
            // start, `max_batch` and the share of what is left, nothing else.
            horizon: 3_600_000_000_000,
            lease: 3_600_000_000_000,
            ..BatchConfig::default()
        },
    );
    let alg = AnyAlgorithm::new(AlgorithmKind::FixedWindowFirst, Options::default());
    let limit = Limit::from_nanos(LIMIT, 3_600_000_000_000).unwrap();
    let (mut admitted, mut sizes) = (0u64, Vec::new());
    for i in 0..LIMIT + 10 {
        let calls = node.central_calls();
        let d = node
            .check(&alg, "k", &limit, 1_000_000 + i * 1_000, 1)
            .await
            .unwrap();
        if d.allowed {
            admitted += 1;
            if node.central_calls() > calls {
                // A new batch: this permit and what is left of it.
                sizes.push(d.remaining + 1);
            }
        }
    }
    assert_eq!(admitted, LIMIT);
    assert_eq!(sizes.iter().sum::<u64>(), LIMIT, "{sizes:?}");
    let mut left = LIMIT;
    for (i, &s) in sizes.iter().enumerate() {
        // The first batch sizes by the limit (nothing heard from Redis yet).
        let cap = if i == 0 { LIMIT / 2 } else { (left / 2).max(1) };
        assert!(
            s <= cap.min(1000),
            "batch {i}: {s} with {left} left: {sizes:?}"
        );
        left -= s;
    }
    // From the largest batch on, each is smaller or equal, ending at single permits.
    let peak = sizes.iter().position(|&s| s == 1000).unwrap();
    let tail = &sizes[peak..];
    assert!(tail.windows(2).all(|w| w[1] <= w[0]), "{sizes:?}");
    assert!(tail.iter().any(|&s| s < 100), "{sizes:?}");
    assert_eq!(sizes.last(), Some(&1), "{sizes:?}");
}

/// Batched mode keeps a record per key (its batch and consumption rate); a record whose batch
/// expired long ago is swept, so the map follows the keys in use, not every key ever seen —
/// and a batch still valid is never dropped (its permits may still be given out).
#[tokio::test]
async fn idle_batches_are_swept_and_live_ones_kept() {
    const S: u64 = 1_000_000_000;
    let server = RedisServer::start();
    // Longer than the sweep period, so a sweep meets a valid batch.
    let lease = 60 * S;
    let node = BatchedStore::new(
        RedisStore::new(
            &server.url(),
            RedisConfig {
                prefix: "sweep:".into(),
                ..RedisConfig::caller_time()
            },
        )
        .unwrap(),
        BatchConfig {
            lease,
            ..BatchConfig::default()
        },
    );
    let alg = AnyAlgorithm::new(AlgorithmKind::Gcra, Options::default());
    let limit = Limit::from_nanos(1_000, S).unwrap();
    let t0 = S;
    for i in 0..200 {
        let d = node
            .check(&alg, &format!("idle-{i}"), &limit, t0, 1)
            .await
            .unwrap();
        assert!(d.allowed);
    }
    assert_eq!(node.keys(), 200);
    // Long after those batches expired, one key is busy: the others' records are swept.
    let later = t0 + 100 * S;
    for _ in 0..2 {
        // Slow start: a batch of 1, then of 2 (one permit of it left).
        assert!(
            node.check(&alg, "busy", &limit, later, 1)
                .await
                .unwrap()
                .allowed
        );
    }
    assert_eq!(node.keys(), 1, "only the key in use keeps a record");
    // Past the next sweep its batch is still valid: kept, and it still gives out its permit
    // without asking Redis.
    let calls = node.central_calls();
    let d = node
        .check(&alg, "busy", &limit, later + 20 * S, 1)
        .await
        .unwrap();
    assert!(d.allowed);
    assert_eq!(node.central_calls(), calls, "served from the kept batch");
    assert_eq!(node.keys(), 1);
}
