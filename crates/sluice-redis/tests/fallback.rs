//! Redis killed or frozen mid-load: decisions keep flowing from the local limiter within
//! the timeout, the change is reported once, and central decisions resume when Redis is
//! back. Needs `redis-server` on PATH.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_limits::{AlgorithmKind, AnyAlgorithm, Clock, Limit, Options, SystemClock};
use sluice_redis::{
    Error, FallbackConfig, FallbackLimiter, Mode, RedisConfig, RedisStore, Share, Source,
    Transition,
};
use support::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(50);
/// What "within the timeout" may take on a loaded 2-core machine: the timeout plus
/// scheduling slack. The guarantee is that no call waits on Redis past the timeout.
const BOUND: Duration = Duration::from_millis(50 + 400);

struct Rig {
    limiter: Arc<FallbackLimiter<RedisStore>>,
    clock: SystemClock,
    alg: AnyAlgorithm,
    limit: Limit,
}

impl Rig {
    fn new(server: &RedisServer) -> Self {
        let store = RedisStore::new(
            &server.url(),
            RedisConfig {
                timeout: TIMEOUT,
                ..RedisConfig::default()
            },
        )
        .unwrap();
        let limiter = FallbackLimiter::new(
            store,
            FallbackConfig {
                share: Share::one_of(2),
                probe_every: 20_000_000,
            },
        );
        Self {
            limiter: Arc::new(limiter),
            clock: SystemClock::new(),
            alg: AnyAlgorithm::new(AlgorithmKind::Gcra, Options::default()),
            limit: "100000/1s".parse().unwrap(),
        }
    }

    /// One call: its outcome, after checking it took no longer than the bound.
    async fn call(&self, key: &str) -> sluice_redis::Outcome {
        let start = Instant::now();
        let out = self
            .limiter
            .check(&self.alg, key, &self.limit, self.clock.now(), 1)
            .await;
        let took = start.elapsed();
        assert!(took < BOUND, "a call took {took:?} (timeout {TIMEOUT:?})");
        out
    }
}

async fn outage(pause: bool) {
    let mut server = RedisServer::start();
    let rig = Rig::new(&server);
    for _ in 0..20 {
        let out = rig.call("k").await;
        assert_eq!(out.source, Source::Central);
        assert!(out.decision.allowed && out.transition.is_none());
    }
    assert_eq!(rig.limiter.mode(), Mode::Central);

    if pause {
        server.pause(true);
    } else {
        server.kill();
    }
    // Load from several tasks while Redis is gone: every call answers, locally.
    let mut tasks = Vec::new();
    for t in 0..4 {
        let rig = Rig {
            limiter: Arc::clone(&rig.limiter),
            clock: rig.clock,
            alg: rig.alg,
            limit: rig.limit,
        };
        tasks.push(tokio::spawn(async move {
            let mut to_fallback = 0;
            let mut local = 0;
            for _ in 0..30 {
                let out = rig.call(&format!("k{t}")).await;
                if out.source == Source::Local {
                    local += 1;
                    assert!(out.decision.allowed, "the local share admits this load");
                }
                if let Some(Transition::ToFallback { cause }) = out.transition {
                    assert!(cause.is_unavailable());
                    if pause {
                        assert!(matches!(cause, Error::Timeout(_)), "{cause}");
                    }
                    to_fallback += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (to_fallback, local)
        }));
    }
    let (mut flips, mut local) = (0, 0);
    for t in tasks {
        let (f, l) = t.await.unwrap();
        flips += f;
        local += l;
    }
    assert_eq!(flips, 1, "the change to fallback is reported exactly once");
    assert!(
        local >= 100,
        "decisions kept flowing locally ({local} of 120)"
    );
    assert!(matches!(rig.limiter.mode(), Mode::Fallback { .. }));

    if pause {
        server.pause(false);
    } else {
        server.restart();
    }
    // Back: a probe (one per 20 ms) finds Redis and decisions are central again.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut back = None;
    while Instant::now() < deadline {
        let out = rig.call("k").await;
        if let Some(Transition::ToCentral { fallback_since }) = out.transition {
            assert_eq!(out.source, Source::Central);
            back = Some(fallback_since);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        back.is_some(),
        "central decisions did not resume within 5 s"
    );
    assert_eq!(rig.limiter.mode(), Mode::Central);
    for _ in 0..10 {
        assert_eq!(rig.call("k").await.source, Source::Central);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_falls_back_and_comes_back() {
    outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_times_out_falls_back_and_comes_back() {
    outage(true).await;
}

#[tokio::test]
async fn local_share_limits_during_a_fallback() {
    // Nothing listens on this port: every central call fails at once.
    let port = support::free_port();
    let store = RedisStore::new(
        &format!("redis://127.0.0.1:{port}/"),
        RedisConfig::default(),
    )
    .unwrap();
    let limiter = FallbackLimiter::new(
        store,
        FallbackConfig {
            share: Share::one_of(4),
            probe_every: u64::MAX,
        },
    );
    let alg = AnyAlgorithm::new(AlgorithmKind::FixedWindow, Options::default());
    let limit: Limit = "40/1h".parse().unwrap();
    let mut admitted = 0;
    for i in 0..30 {
        let out = limiter.check(&alg, "k", &limit, 1, 1).await;
        assert_eq!(out.source, Source::Local);
        assert_eq!(out.transition.is_some(), i == 0);
        admitted += u64::from(out.decision.allowed);
    }
    assert_eq!(admitted, 10, "a quarter of 40");
    assert_eq!(limiter.mode(), Mode::Fallback { since: 1 });
}
