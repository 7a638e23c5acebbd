//! One conformance suite for every backend: the same trace gives the same decisions in
//! memory (`sluice-limits` itself) and in Redis (the Lua scripts, with the trace's time).
//!
//! Needs `redis-server` on PATH (scripts/test-all.sh installs it); without it these tests
//! fail and say how to install it.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice_limits::{AlgorithmKind, AnyAlgorithm, Decision, Limit, Options, WarmUp};
use sluice_redis::{Center, MemoryStore, RedisConfig, RedisStore};
use support::RedisServer;

/// Every algorithm, in the order of `AlgorithmKind::ALL`, with small parameters.
fn algorithms(sub_windows: u32) -> Vec<AnyAlgorithm> {
    with_warm_up(sub_windows, WarmUp::guava(200_000))
}

fn with_warm_up(sub_windows: u32, warm_up: WarmUp) -> Vec<AnyAlgorithm> {
    let options = Options {
        sub_windows,
        warm_up,
    };
    AlgorithmKind::ALL
        .into_iter()
        .map(|k| AnyAlgorithm::new(k, options))
        .collect()
}

/// A warm-up at the scale of the traces: no ramp, Guava's, or any cold factor up to 20,
/// over up to about a hundred periods of the limits below.
fn warm_up() -> impl Strategy<Value = WarmUp> {
    (
        prop_oneof![1 => Just(0u64), 4 => 1u64..300_000_000],
        prop_oneof![Just(1.0), Just(3.0), 1.0f64..20.0],
    )
        .prop_map(|(w, f)| WarmUp::new(w, f).unwrap())
}

fn unique_prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("t{}:", N.fetch_add(1, Ordering::Relaxed))
}

/// Runs `$body(backend)` once per backend, as limitador's `test_with_all_storage_impls!`:
/// each test exists as `memory::name` and `redis::name`.
macro_rules! test_with_all_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(&sluice_redis::MemoryStore::new()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let server = super::support::RedisServer::start();
                    let config = sluice_redis::RedisConfig {
                        prefix: super::unique_prefix(),
                        timeout: std::time::Duration::from_secs(2),
                        ..sluice_redis::RedisConfig::caller_time()
                    };
                    let store = sluice_redis::RedisStore::new(&server.url(), config).unwrap();
                    super::$name(&store).await;
                }
            )*
        }
    };
}

test_with_all_backends!(
    gcra_burst_then_rate,
    sliding_log_exact_retry,
    fixed_window_resets_on_boundaries,
    every_algorithm_refuses_what_never_fits,
    keys_and_algorithms_are_independent,
);

async fn gcra_burst_then_rate(b: &impl Center) {
    // sluice-limits' own example: 2 per second, burst 2.
    let alg = AnyAlgorithm::new(AlgorithmKind::Gcra, Options::default());
    let l: Limit = "2/1s".parse().unwrap();
    assert!(b.check(&alg, "k", &l, 0, 1).await.unwrap().allowed);
    assert!(b.check(&alg, "k", &l, 0, 1).await.unwrap().allowed);
    let refused = b.check(&alg, "k", &l, 0, 1).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Some(500_000_000));
    assert!(
        b.check(&alg, "k", &l, 500_000_000, 1)
            .await
            .unwrap()
            .allowed
    );
}

async fn sliding_log_exact_retry(b: &impl Center) {
    let alg = AnyAlgorithm::new(AlgorithmKind::SlidingLog, Options::default());
    let l = Limit::from_nanos(3, 100).unwrap();
    for t in [10, 20, 30] {
        assert!(b.check(&alg, "k", &l, t, 1).await.unwrap().allowed);
    }
    let d = b.check(&alg, "k", &l, 40, 2).await.unwrap();
    // The entries of 10 and 20 must leave: at 120.
    assert_eq!(
        (d.allowed, d.retry_after, d.reset_after),
        (false, Some(80), 90)
    );
    assert!(!b.check(&alg, "k", &l, 119, 2).await.unwrap().allowed);
    assert!(b.check(&alg, "k", &l, 120, 2).await.unwrap().allowed);
}

async fn fixed_window_resets_on_boundaries(b: &impl Center) {
    let alg = AnyAlgorithm::new(AlgorithmKind::FixedWindow, Options::default());
    let l = Limit::from_nanos(3, 100).unwrap();
    assert!(b.check(&alg, "k", &l, 95, 3).await.unwrap().allowed);
    let d = b.check(&alg, "k", &l, 99, 1).await.unwrap();
    assert_eq!((d.allowed, d.retry_after), (false, Some(1)));
    // seed 002 §3.1: a new window admits a full count right after the boundary.
    assert!(b.check(&alg, "k", &l, 100, 3).await.unwrap().allowed);
}

async fn every_algorithm_refuses_what_never_fits(b: &impl Center) {
    let l = Limit::from_nanos(5, 1000).unwrap();
    for alg in algorithms(4) {
        let d = b.check(&alg, "big", &l, 0, 6).await.unwrap();
        assert_eq!((d.allowed, d.retry_after), (false, None), "{alg:?}");
        let d = b.check(&alg, "big", &l, 0, 0).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 5), "{alg:?}");
    }
}

async fn keys_and_algorithms_are_independent(b: &impl Center) {
    let l = Limit::from_nanos(1, 1000).unwrap();
    for alg in algorithms(2) {
        assert!(
            b.check(&alg, "a", &l, 0, 1).await.unwrap().allowed,
            "{alg:?}"
        );
        assert!(
            !b.check(&alg, "a", &l, 0, 1).await.unwrap().allowed,
            "{alg:?}"
        );
        assert!(
            b.check(&alg, "b", &l, 0, 1).await.unwrap().allowed,
            "{alg:?}"
        );
    }
}

/// A request of a trace: time step (may go back), key, cost, and whether the limit
/// switches to the second one from here on.
#[derive(Debug, Clone)]
struct Step {
    dt: i64,
    key: u8,
    cost: u64,
    switch: bool,
}

fn limit() -> impl Strategy<Value = Limit> {
    (1u64..=12, 1u64..=400_000, 1u64..=16).prop_map(|(n, p, b)| {
        Limit::from_nanos(n, p * 7 + 1)
            .unwrap()
            .with_burst(b)
            .unwrap()
    })
}

fn trace() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![
            3 => Just(0i64),
            4 => 1i64..50_000,
            2 => 50_000i64..3_000_000,
            1 => -40_000i64..0,
        ],
        0u8..2,
        prop_oneof![6 => Just(1u64), 2 => 0u64..=4, 1 => 5u64..=20],
        proptest::bool::weighted(0.03),
    )
        .prop_map(|(dt, key, cost, switch)| Step {
            dt,
            key,
            cost,
            switch,
        });
    proptest::collection::vec(step, 1..120)
}

/// Every algorithm, random traces (with same-instant requests, time going back, costs
/// above the limit and a change of limit): Redis with the trace's time decides exactly as
/// `sluice-limits`, field by field.
#[test]
fn redis_decides_as_sluice_limits_on_random_traces() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        0..AlgorithmKind::ALL.len(),
        1u32..=5,
        warm_up(),
        limit(),
        limit(),
        trace(),
    );
    let result = runner.run(&strategy, |(which, k, w, first, second, steps)| {
        let alg = with_warm_up(k, w)[which];
        let config = RedisConfig {
            prefix: unique_prefix(),
            timeout: std::time::Duration::from_secs(2),
            ..RedisConfig::caller_time()
        };
        let redis = RedisStore::new(&server.url(), config).unwrap();
        let memory = MemoryStore::new();
        rt.block_on(async {
            let mut now: u64 = 1_000_000;
            let mut limit = first;
            for (i, s) in steps.iter().enumerate() {
                now = now.saturating_add_signed(s.dt);
                if s.switch {
                    limit = second;
                }
                let key = if s.key == 0 { "a" } else { "b" };
                let want: Decision = memory.check(&alg, key, &limit, now, s.cost).await.unwrap();
                let got = redis
                    .check(&alg, key, &limit, now, s.cost)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(
                    got,
                    want,
                    "request {} ({:?}) at {} under {}",
                    i,
                    s,
                    now,
                    limit
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Warm-up's state is floating point: the script stores it so that it reads back as the same
/// double, and computes it with the same operations in the same order, so after every
/// request of a random trace the coldness Redis holds is `sluice-limits`' to the bit (the
/// decisions alone, rounded up to whole ns, would hide a lost digit).
#[test]
fn warm_up_state_is_sluice_limits_to_the_bit() {
    use sluice_limits::Algorithm;
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (warm_up(), limit(), limit(), trace());
    let result = runner.run(&strategy, |(w, first, second, steps)| {
        let prefix = unique_prefix();
        let config = RedisConfig {
            prefix: prefix.clone(),
            timeout: std::time::Duration::from_secs(2),
            ..RedisConfig::caller_time()
        };
        let redis = RedisStore::new(&server.url(), config).unwrap();
        let alg = AnyAlgorithm::WarmUp(w);
        rt.block_on(async {
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            let mut state = w.new_state(&first, 0);
            let mut now: u64 = 1_000_000;
            let mut limit = first;
            for (i, s) in steps.iter().enumerate() {
                now = now.saturating_add_signed(s.dt);
                if s.switch {
                    limit = second;
                }
                let want = w.check(&mut state, &limit, now, s.cost);
                let got = redis
                    .check(&alg, "a", &limit, now, s.cost)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(got, want, "request {} ({:?})", i, s);
                let stored: Option<String> = ::redis::cmd("HGET")
                    .arg(format!("{prefix}{{a}}:warm-up"))
                    .arg("c")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                let coldness = stored.map_or(1.0, |c| c.parse::<f64>().unwrap());
                prop_assert_eq!(
                    coldness.to_bits(),
                    state.coldness().to_bits(),
                    "request {} ({:?}): {} in Redis, {} in memory",
                    i,
                    s,
                    coldness,
                    state.coldness()
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Charges (a fallback's local admissions, counted when Redis answers again) that the limit
/// holds change Redis' state exactly as admissions do: random traces in which some requests
/// are admitted in memory and only charged to Redis decide alike afterwards.
#[test]
fn a_charge_that_fits_is_counted_as_an_admission() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let charged = proptest::collection::vec(proptest::bool::weighted(0.3), 120);
    let strategy = (
        0..AlgorithmKind::ALL.len(),
        1u32..=5,
        warm_up(),
        limit(),
        trace(),
        charged,
    );
    let result = runner.run(&strategy, |(which, k, w, limit, steps, charged)| {
        let alg = with_warm_up(k, w)[which];
        let config = RedisConfig {
            prefix: unique_prefix(),
            timeout: std::time::Duration::from_secs(2),
            ..RedisConfig::caller_time()
        };
        let redis = RedisStore::new(&server.url(), config).unwrap();
        let memory = MemoryStore::new();
        rt.block_on(async {
            let mut now: u64 = 1_000_000;
            for (i, (s, charge)) in steps.iter().zip(&charged).enumerate() {
                now = now.saturating_add_signed(s.dt);
                let key = if s.key == 0 { "a" } else { "b" };
                let want: Decision = memory.check(&alg, key, &limit, now, s.cost).await.unwrap();
                if *charge && s.cost > 0 && want.allowed {
                    // Admitted elsewhere (in memory here): Redis is charged with it. A refused
                    // one is decided by Redis too: a key's first request, even refused, starts
                    // its state (the token bucket's refill clock), in memory as in Redis.
                    redis
                        .charge(&alg, key, &limit, now, s.cost)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    continue;
                }
                let got = redis
                    .check(&alg, key, &limit, now, s.cost)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(got, want, "request {} ({:?}) at {}", i, s, now);
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Unconditional charges, admitted or not, of any size (above the limit too), between
/// requests: memory (`sluice-limits`' `charge`) and Redis (the scripts' charge step) count
/// them alike, so every later decision is the same.
#[test]
fn memory_and_redis_charge_alike() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let charged = proptest::collection::vec(proptest::bool::weighted(0.3), 120);
    let strategy = (
        0..AlgorithmKind::ALL.len(),
        1u32..=5,
        warm_up(),
        limit(),
        limit(),
        trace(),
        charged,
    );
    let result = runner.run(&strategy, |(which, k, w, first, second, steps, charged)| {
        let alg = with_warm_up(k, w)[which];
        let config = RedisConfig {
            prefix: unique_prefix(),
            timeout: std::time::Duration::from_secs(2),
            ..RedisConfig::caller_time()
        };
        let redis = RedisStore::new(&server.url(), config).unwrap();
        let memory = MemoryStore::new();
        rt.block_on(async {
            let mut now: u64 = 1_000_000;
            let mut limit = first;
            for (i, (s, charge)) in steps.iter().zip(&charged).enumerate() {
                now = now.saturating_add_signed(s.dt);
                if s.switch {
                    limit = second;
                }
                let key = if s.key == 0 { "a" } else { "b" };
                if *charge {
                    // Three times the cost: past the per-call cap and the saturation too.
                    let n = s.cost * 3;
                    memory.charge(&alg, key, &limit, now, n);
                    redis
                        .charge(&alg, key, &limit, now, n)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    continue;
                }
                let want = memory.check(&alg, key, &limit, now, s.cost).await.unwrap();
                let got = redis
                    .check(&alg, key, &limit, now, s.cost)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(
                    got,
                    want,
                    "request {} ({:?}) at {} under {}",
                    i,
                    s,
                    now,
                    limit
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The leaky bucket across changes of period far apart (a reload from a rate per µs or ms
/// to one per hours, and back), charges included: re-expressed in the new period, a level
/// of many permits passes 2^53 units unless it is kept within two bursts, and the remainder
/// times the new period passes 2^53 too, so the script must compute the conversion exactly
/// to decide as `sluice-limits` at every step.
#[test]
fn leaky_bucket_changes_of_period_are_sluice_limits_to_the_bit() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let lim = |(n, p, b): (u64, u64, u64)| Limit::from_nanos(n, p).unwrap().with_burst(b).unwrap();
    let short = (1u64..=1000, 1_000u64..=1_000_000_000, 1u64..=1000).prop_map(lim);
    // `(3·16 + 1)·2·10^13 + 16 < 2^53`: within the range check.
    let long = (1u64..=16, 1_000_000_000u64..=20_000_000_000_000, 1u64..=16).prop_map(lim);
    let step = (
        prop_oneof![
            2 => Just(0u64),
            3 => 1u64..1_000_000,
            2 => 1_000_000u64..1_000_000_000_000,
        ],
        prop_oneof![1 => 0u64..=3, 2 => 1u64..=1000],
        proptest::bool::weighted(0.15),
        proptest::bool::weighted(0.2),
    );
    let strategy = (short, long, proptest::collection::vec(step, 1..120));
    let result = runner.run(&strategy, |(short, long, steps)| {
        let alg = AnyAlgorithm::new(AlgorithmKind::LeakyBucket, Options::default());
        let config = RedisConfig {
            prefix: unique_prefix(),
            timeout: std::time::Duration::from_secs(2),
            ..RedisConfig::caller_time()
        };
        let redis = RedisStore::new(&server.url(), config).unwrap();
        let memory = MemoryStore::new();
        rt.block_on(async {
            let mut now: u64 = 1_000_000;
            let mut limit = short;
            for (i, &(dt, cost, switch, charge)) in steps.iter().enumerate() {
                now += dt;
                if switch {
                    limit = if limit == short { long } else { short };
                }
                if charge {
                    memory.charge(&alg, "k", &limit, now, cost);
                    redis
                        .charge(&alg, "k", &limit, now, cost)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    continue;
                }
                let want = memory.check(&alg, "k", &limit, now, cost).await.unwrap();
                let got = redis
                    .check(&alg, "k", &limit, now, cost)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(
                    got,
                    want,
                    "request {} (cost {}) at {} under {}",
                    i,
                    cost,
                    now,
                    limit
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The sliding log's running total only grows while a key lives; a hot key would pass 2^53
/// (104 days at 10^9 permits per second) and lose permits in Lua's doubles. Keys whose
/// totals already sit near 2^52 or just below 2^53 (seeded: as an empty log that has
/// counted that many) decide as fresh keys in memory at every step of random traces with
/// charges, across the rebase that moves every total kept back near 0, and keep their
/// total below 2^52 afterwards.
#[test]
fn sliding_log_totals_are_rebased_without_changing_decisions() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let e52 = 1u64 << 52;
    let seed = prop_oneof![e52 - 200..e52, (e52 << 1) - 60..(e52 << 1)];
    let charged = proptest::collection::vec(proptest::bool::weighted(0.2), 120);
    let strategy = ((seed.clone(), seed), limit(), limit(), trace(), charged);
    let result = runner.run(&strategy, |(seeds, first, second, steps, charged)| {
        let alg = AnyAlgorithm::new(AlgorithmKind::SlidingLog, Options::default());
        let prefix = unique_prefix();
        let config = RedisConfig {
            prefix: prefix.clone(),
            timeout: std::time::Duration::from_secs(2),
            ..RedisConfig::caller_time()
        };
        let redis = RedisStore::new(&server.url(), config).unwrap();
        let memory = MemoryStore::new();
        rt.block_on(async {
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            let meta = |key: &str| format!("{prefix}{{{key}}}:sliding-log:meta");
            for (key, total) in [("a", seeds.0), ("b", seeds.1)] {
                let () = ::redis::cmd("HSET")
                    .arg(meta(key))
                    .arg("b")
                    .arg(total)
                    .arg("c")
                    .arg(total)
                    .query_async(&mut con)
                    .await
                    .unwrap();
            }
            let mut now: u64 = 1_000_000;
            let mut limit = first;
            for (i, (s, charge)) in steps.iter().zip(&charged).enumerate() {
                now = now.saturating_add_signed(s.dt);
                if s.switch {
                    limit = second;
                }
                let key = if s.key == 0 { "a" } else { "b" };
                if *charge {
                    memory.charge(&alg, key, &limit, now, s.cost);
                    redis
                        .charge(&alg, key, &limit, now, s.cost)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    continue;
                }
                let want = memory.check(&alg, key, &limit, now, s.cost).await.unwrap();
                let got = redis
                    .check(&alg, key, &limit, now, s.cost)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(
                    got,
                    want,
                    "request {} ({:?}) at {} under {}",
                    i,
                    s,
                    now,
                    limit
                );
            }
            for (key, seeded) in [("a", seeds.0), ("b", seeds.1)] {
                let total: Option<u64> = ::redis::cmd("HGET")
                    .arg(meta(key))
                    .arg("c")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                let total = total.unwrap_or(0);
                prop_assert!(
                    total == seeded || total < e52,
                    "{} total {} (seeded {})",
                    key,
                    total,
                    seeded
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A rebase of a long log (more entries than one `ZADD` of the rewrite takes) keeps every
/// entry and its order: the refusals after it, whose waits come from a search over the
/// rewritten totals, are memory's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebase_rewrites_a_long_log() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let config = RedisConfig {
        prefix: prefix.clone(),
        timeout: std::time::Duration::from_secs(2),
        ..RedisConfig::caller_time()
    };
    let redis = RedisStore::new(&server.url(), config).unwrap();
    let memory = MemoryStore::new();
    let client = ::redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let (meta, log) = (
        format!("{prefix}{{k}}:sliding-log:meta"),
        format!("{prefix}{{k}}:sliding-log:log"),
    );
    let e52 = 1u64 << 52;
    let () = ::redis::cmd("HSET")
        .arg(&meta)
        .arg("b")
        .arg(e52 - 1200)
        .arg("c")
        .arg(e52 - 1200)
        .query_async(&mut con)
        .await
        .unwrap();
    let alg = AnyAlgorithm::new(AlgorithmKind::SlidingLog, Options::default());
    let l = Limit::from_nanos(1500, 1_000_000).unwrap();
    let decide = async |t: u64, cost: u64| {
        let got = redis.check(&alg, "k", &l, t, cost).await.unwrap();
        assert_eq!(
            got,
            memory.decide(&alg, "k", &l, t, cost),
            "at {t}, cost {cost}"
        );
        got
    };
    // 1,400 entries 100 ns apart, all in one window: the 1,200th reaches 2^52.
    for i in 0..1400 {
        assert!(decide(1_000 + i * 100, 1).await.allowed);
    }
    let total: u64 = ::redis::cmd("HGET")
        .arg(&meta)
        .arg("c")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(total < e52, "rebased: {total}");
    let kept: u64 = ::redis::cmd("ZCARD")
        .arg(&log)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(kept, 1400);
    // 100 left: 150 waits for the first 50 entries to leave, then the window slides.
    let end = 1_000 + 1400 * 100;
    assert!(!decide(end, 150).await.allowed);
    assert!(decide(end, 100).await.allowed);
    for t in [1_001_000, 1_004_900, 1_005_000, 1_060_000, 1_139_999] {
        decide(t, 60).await;
    }
}

/// Charges past the limit are counted too (within twice the limit): every algorithm refuses
/// until the excess has left the window or drained, not only until the limit would have;
/// memory charges and decides alike at every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_past_the_limit_holds_until_it_is_paid_back() {
    let server = RedisServer::start();
    let config = RedisConfig {
        prefix: unique_prefix(),
        timeout: std::time::Duration::from_secs(2),
        ..RedisConfig::caller_time()
    };
    let redis = RedisStore::new(&server.url(), config).unwrap();
    let memory = MemoryStore::new();
    let l = Limit::from_nanos(10, 1000).unwrap();
    let alg = |k| AnyAlgorithm::new(k, Options::default());
    // A request for `key` under `limit`: Redis and memory decide alike.
    let ok_for = |k: AlgorithmKind, key: &'static str, limit: Limit, t: u64, cost: u64| {
        let (redis, memory) = (&redis, &memory);
        async move {
            let got = redis.check(&alg(k), key, &limit, t, cost).await.unwrap();
            let want = memory.decide(&alg(k), key, &limit, t, cost);
            assert_eq!(got, want, "{k} {key} at {t}");
            got.allowed
        }
    };
    let ok = |k: AlgorithmKind, t: u64, cost: u64| ok_for(k, "k", l, t, cost);
    let charge_for = |k: AlgorithmKind, key: &'static str, t: u64, n: u64| {
        let (redis, memory) = (&redis, &memory);
        async move {
            memory.charge(&alg(k), key, &l, t, n);
            redis.charge(&alg(k), key, &l, t, n).await.unwrap();
        }
    };
    let charge = |k: AlgorithmKind, t: u64, n: u64| charge_for(k, "k", t, n);

    // Fixed window: 20 counted, the window refuses until it ends.
    let fw = AlgorithmKind::FixedWindow;
    charge(fw, 0, 10).await;
    charge(fw, 1, 10).await;
    // Under 15 per window the 20 refuse where 10 would admit: the second charge was
    // neither dropped nor capped at the limit.
    let fifteen = Limit::from_nanos(15, 1000).unwrap();
    assert!(!ok_for(fw, "k", fifteen, 999, 1).await);
    charge_for(fw, "ten", 0, 10).await;
    assert!(ok_for(fw, "ten", fifteen, 999, 1).await);
    assert!(!ok(fw, 999, 1).await);
    assert!(ok(fw, 1000, 10).await);

    // Sliding log: 10 at 0 and 5 at 100: at 1000 the first 10 leave, 5 still weigh.
    let log = AlgorithmKind::SlidingLog;
    charge(log, 0, 10).await;
    charge(log, 100, 5).await;
    assert!(!ok(log, 999, 1).await);
    assert!(ok(log, 1000, 5).await);
    assert!(!ok(log, 1000, 1).await);
    assert!(ok(log, 1100, 5).await);

    // GCRA (one per 100, tolerance 1000): two bursts charged push TAT to 2000.
    let gcra = AlgorithmKind::Gcra;
    charge(gcra, 0, 10).await;
    charge(gcra, 0, 10).await;
    assert!(!ok(gcra, 1099, 1).await);
    assert!(ok(gcra, 1100, 1).await);

    // Token bucket: the second burst is owed, paid back at 1000; one token at 1100.
    let tb = AlgorithmKind::TokenBucket;
    charge(tb, 0, 10).await;
    charge(tb, 0, 10).await;
    assert!(!ok(tb, 1099, 1).await);
    assert!(ok(tb, 1100, 1).await);

    // Leaky bucket: twice the burst poured in, one permit of room at 1100.
    let lb = AlgorithmKind::LeakyBucket;
    charge(lb, 0, 10).await;
    charge(lb, 0, 10).await;
    assert!(!ok(lb, 1099, 1).await);
    assert!(ok(lb, 1100, 1).await);

    // Sliding window counter (10 sub-windows of 100): 20 in the first sub-window leave the
    // window when it slides past it.
    let sw = AlgorithmKind::SlidingWindow;
    charge(sw, 0, 10).await;
    charge(sw, 0, 10).await;
    assert!(!ok(sw, 999, 1).await);
    assert!(ok(sw, 1000, 10).await);
    // 10 at 0 and 10 at 500: at 1000 the first have left and the second still fill the
    // window (dropped or capped, they would not), until they leave it at 1500.
    charge_for(sw, "apart", 0, 10).await;
    charge_for(sw, "apart", 500, 10).await;
    assert!(!ok_for(sw, "apart", l, 999, 1).await);
    assert!(!ok_for(sw, "apart", l, 1000, 1).await);
    assert!(!ok_for(sw, "apart", l, 1499, 1).await);
    assert!(ok_for(sw, "apart", l, 1500, 10).await);

    // Warm-up without a ramp and a cold factor of 1: a burst costs 1000; three charged
    // push the next free instant to 2000, then to its reach, 2 × (1000 + 1) ahead.
    let flat = AnyAlgorithm::WarmUp(WarmUp::new(0, 1.0).unwrap());
    for _ in 0..3 {
        memory.charge(&flat, "k", &l, 0, 10);
        redis.charge(&flat, "k", &l, 0, 10).await.unwrap();
    }
    let d = redis.check(&flat, "k", &l, 2001, 1).await.unwrap();
    assert_eq!(d, memory.decide(&flat, "k", &l, 2001, 1));
    assert_eq!((d.allowed, d.retry_after), (false, Some(1)));
    assert!(redis.check(&flat, "k", &l, 2002, 1).await.unwrap().allowed);
}
