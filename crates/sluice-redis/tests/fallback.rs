//! Redis killed or frozen mid-load: decisions keep flowing from the local limiter within
//! the timeout, the change is reported once, and central decisions resume when Redis is
//! back. Needs `redis-server` on PATH.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_limits::{AlgorithmKind, AnyAlgorithm, Clock, Limit, Options, SystemClock};
use sluice_redis::{
    BatchConfig, BatchedStore, Error, FallbackConfig, FallbackLimiter, Mode, RedisConfig,
    RedisStore, Share, Source, Transition,
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

/// Batched mode, Redis killed: a key whose batch is still valid is decided from that batch
/// only (its permits, then refusals until it expires) and then with the node's share; a
/// probe answered by the batch or by an earlier refusal is not Redis answering, so the mode
/// stays `Fallback` until Redis itself answers.
#[tokio::test]
async fn batched_fallback_keeps_to_the_batch_and_only_redis_ends_it() {
    const MS: u64 = 1_000_000;
    let mut server = RedisServer::start();
    let store = RedisStore::new(
        &server.url(),
        RedisConfig {
            timeout: TIMEOUT,
            ..RedisConfig::caller_time()
        },
    )
    .unwrap();
    let lease = 60_000 * MS;
    let limiter = FallbackLimiter::new(
        BatchedStore::new(
            store,
            BatchConfig {
                lease,
                ..BatchConfig::default()
            },
        ),
        FallbackConfig {
            share: Share::one_of(4),
            probe_every: 10 * MS,
        },
    );
    let alg = AnyAlgorithm::new(AlgorithmKind::FixedWindowFirst, Options::default());
    let limit: Limit = "40/1h".parse().unwrap();
    let one: Limit = "1/1h".parse().unwrap();
    let t = 1_000 * MS;
    // "held": slow start asks 1, then 2 → one permit left in a batch valid for a minute.
    for i in 0..2 {
        let out = limiter.check(&alg, "held", &limit, t + i, 1).await;
        assert!(out.decision.allowed && out.source == Source::Central);
    }
    // "refused": its one permit used, then refused by Redis (no asking again until then).
    assert!(
        limiter
            .check(&alg, "refused", &one, t, 1)
            .await
            .decision
            .allowed
    );
    assert!(
        !limiter
            .check(&alg, "refused", &one, t, 1)
            .await
            .decision
            .allowed
    );
    let calls = limiter.central().central_calls();
    assert_eq!(
        limiter.check(&alg, "refused", &one, t + 1, 1).await.source,
        Source::Central
    );
    assert_eq!(limiter.central().central_calls(), calls, "refused locally");

    server.kill();
    let out = limiter.check(&alg, "other", &limit, t + 2 * MS, 1).await;
    assert!(matches!(
        out.transition,
        Some(Transition::ToFallback { .. })
    ));
    // Probe time, on a key the batch can serve: served by the batch, still in fallback.
    let out = limiter.check(&alg, "held", &limit, t + 100 * MS, 1).await;
    assert!(out.decision.allowed, "{out:?}");
    assert_eq!(out.source, Source::Central, "from the batch");
    assert!(out.transition.is_none(), "{:?}", out.transition);
    assert!(matches!(limiter.mode(), Mode::Fallback { .. }));
    // Probe time, on the key Redis refused earlier: the probe goes to Redis (down), so the
    // refusal comes from the batch and the mode does not change.
    let out = limiter.check(&alg, "refused", &one, t + 200 * MS, 1).await;
    assert!(!out.decision.allowed);
    assert!(out.transition.is_none(), "{:?}", out.transition);
    assert!(matches!(limiter.mode(), Mode::Fallback { .. }));
    // The batch of "held" is used up but valid: refused until it expires, not the share.
    let out = limiter.check(&alg, "held", &limit, t + 300 * MS, 1).await;
    assert!(!out.decision.allowed, "{out:?}");
    let wait = out.decision.retry_after.unwrap();
    assert!(wait > 0 && wait <= lease, "{wait}");
    // Once the batch expired: the node's share (a quarter of 40), which counts the 3
    // permits the node took from batches in this window: 10 in the window, not 13.
    let later = t + lease + 1_000 * MS;
    let mut admitted = 0;
    for i in 0..20 {
        let out = limiter.check(&alg, "held", &limit, later + i, 1).await;
        assert!(out.transition.is_none());
        if out.decision.allowed {
            assert_eq!(out.source, Source::Local);
            admitted += 1;
        }
    }
    assert_eq!(admitted, 7);
    assert_eq!(limiter.owed(&alg, "held", &limit, later + 20), 7);
    assert!(matches!(limiter.mode(), Mode::Fallback { .. }));

    // Redis back: the next probe reaches it and ends the fallback, once.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut at = later + 100 * MS;
    loop {
        let out = limiter.check(&alg, "other", &limit, at, 1).await;
        if matches!(out.transition, Some(Transition::ToCentral { .. })) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "redis is back, still in fallback"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        at += 20 * MS;
    }
    assert_eq!(limiter.mode(), Mode::Central);
}

/// The node's clock: ns since the unix epoch, as Redis' `TIME` (windows line up).
fn wall() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

const SECOND: u64 = 1_000_000_000;

/// Waits until `ms` milliseconds into the window after the current one; returns its index.
async fn into_next_window(ms: u64) -> u64 {
    let w = wall() / SECOND + 1;
    let at = w * SECOND + ms * 1_000_000;
    tokio::time::sleep(Duration::from_nanos(at.saturating_sub(wall()))).await;
    w
}

/// One node (a share of 1/2) under load on a fixed window of 100/s: Redis killed 30 ms into
/// a window, restarted (empty) 300 ms into the second window after, watched until the
/// return and 500 ms into the window after it, every admission counted per window. The bounds of docs/PROTOCOL.md for one node: in the window Redis stops
/// answering at most `max(a, L/2)` (`a` what Redis and its batches admitted), in a window
/// spent in fallback `L/2`, and in the window it answers again `L` — the local permits are
/// charged to Redis before it decides again.
async fn every_window_across_a_kill_and_a_return<B>(make: impl FnOnce(RedisStore) -> B)
where
    B: sluice_redis::Center<Error = sluice_redis::Error> + Send + Sync + 'static,
{
    const L: u64 = 100;
    let mut server = RedisServer::start();
    let store = RedisStore::new(
        &server.url(),
        RedisConfig {
            // Long: a SIGKILL resets the connections, so the fallback still comes at once,
            // while a stall of a loaded machine is no spurious fallback (a third flip).
            timeout: Duration::from_secs(1),
            ..RedisConfig::default()
        },
    )
    .unwrap();
    let limiter = Arc::new(FallbackLimiter::new(
        make(store),
        FallbackConfig {
            share: Share::one_of(2),
            probe_every: 20_000_000,
        },
    ));
    let alg = AnyAlgorithm::new(AlgorithmKind::FixedWindow, Options::default());
    let limit = Limit::from_nanos(L, SECOND).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // (start, end, admitted, source, transition: 1 to fallback, 2 to central)
    type Seen = Vec<(u64, u64, bool, Source, u8)>;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let start = wall();
                let out = limiter.check(&alg, "k", &limit, start, 1).await;
                let t = match out.transition {
                    Some(Transition::ToFallback { .. }) => 1,
                    Some(Transition::ToCentral { .. }) => 2,
                    None => 0,
                };
                seen.push((start, wall(), out.decision.allowed, out.source, t));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen
        }));
    }
    let killed = into_next_window(30).await;
    server.kill();
    into_next_window(0).await;
    into_next_window(300).await;
    // Kept until the end: dropping it stops the server.
    let _server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    // Until the return is seen (a probe after the restart), however slow the restart was.
    let deadline = Instant::now() + Duration::from_secs(30);
    while limiter.mode() != Mode::Central {
        assert!(
            Instant::now() < deadline,
            "redis restarted, still in fallback"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    into_next_window(500).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut seen = Seen::new();
    for t in tasks {
        seen.extend(t.await.unwrap());
    }

    // Per window: (central, local). A decision is taken somewhere between the call's start
    // and end: at Redis, or on the share, which reads a time earlier than one it has seen as
    // the latest (a call preempted after reading the clock). One whose call spans a window's
    // end is left out (and counted).
    let mut windows: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
    let mut spanning = 0;
    let mut flips = 0;
    for &(start, end, ok, source, t) in &seen {
        let w = start / SECOND;
        flips += u32::from(t != 0);
        if !ok {
            continue;
        }
        if end / SECOND != w {
            spanning += 1;
            continue;
        }
        match source {
            Source::Local => windows.entry(w).or_default().1 += 1,
            Source::Central => windows.entry(w).or_default().0 += 1,
        }
    }
    assert_eq!(flips, 2, "to fallback and back, once each: {windows:?}");
    assert!(spanning <= 4, "{spanning} calls spanned a window's end");
    // The window Redis decides again in: its first central admission after the kill's window
    // (the call that saw the return may itself span into the next window).
    let returned = windows
        .iter()
        .find(|&(&w, &(central, _))| w > killed && central > 0)
        .map(|(&w, _)| w)
        .unwrap_or_else(|| panic!("no central admission after the kill: {windows:?}"));
    assert!(
        returned > killed + 1,
        "returned in {returned}, killed in {killed}"
    );
    for (w, &(central, local)) in &windows {
        let total = central + local;
        assert!(total <= L, "window {w}: {total} > {L}: {windows:?}");
        if *w == killed {
            assert!(central > 0, "{windows:?}");
            assert!(
                total <= central.max(L / 2),
                "the window of the kill: {central} central + {local} local > max({central}, {}): {windows:?}",
                L / 2
            );
        } else if *w > killed && *w < returned {
            // No central admission here: `returned` is the first.
            assert!(local <= L / 2, "window {w}: {windows:?}");
        } else if *w == returned {
            // Both kinds in it, or the window would not test the return.
            assert!(local > 0 && central > 0, "window {w}: {windows:?}");
        }
    }
    assert_eq!(limiter.mode(), Mode::Central);
    assert_eq!(limiter.owed(&alg, "k", &limit, wall()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_every_window_stays_within_the_bounds_across_a_kill_and_a_return() {
    every_window_across_a_kill_and_a_return(|store| store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_every_window_stays_within_the_bounds_across_a_kill_and_a_return() {
    every_window_across_a_kill_and_a_return(|store| {
        BatchedStore::new(store, BatchConfig::default())
    })
    .await;
}
