//! `coordination: redis` through the engine, against a real `redis-server` on 127.0.0.1:
//! two engines ("nodes") sharing one Redis never admit more than the limit together; with
//! Redis killed mid-load every request is still answered within the timeout, locally with
//! the node's share (seed 002 §4.4(4)); when Redis is back, Redis decides again.
#![allow(clippy::unwrap_used)]

#[path = "../../sluice-redis/tests/support/mod.rs"]
mod support;
mod view;

use view::{cluster_view, unix_now};

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_server::engine::central::{self, CentralMode, RedisMode};
use sluice_server::peer::PeerKey;
use sluice_server::token_server::{ClientSpec, ServerAddr, TokenClient, TokenMode};
use sluice_server::{Code, Config, Descriptor, Engine, Request};
use support::RedisServer;

/// 100 per hour: a test lasts seconds, so every admission of a run is in one window.
const RULES: &str = "
domain: d
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 100
      algorithm: sliding-log
      coordination: redis
";

fn engine(url: &str, mode: RedisMode, timeout: Duration, nodes: u64) -> Arc<Engine> {
    let e = Engine::new(Config::from_yaml("rules.yaml", RULES).unwrap());
    assert!(e.attach_redis(central::connect(url, mode, timeout, nodes).unwrap()));
    Arc::new(e)
}

fn req(user: &str) -> Request {
    Request::new("d", [Descriptor::new([("user", user)])])
}

/// `tasks` concurrent callers per engine, `each` requests each: admissions in total.
async fn load(engines: &[Arc<Engine>], user: &str, tasks: usize, each: usize) -> usize {
    let mut handles = Vec::new();
    for e in engines {
        for _ in 0..tasks {
            let (e, r) = (e.clone(), req(user));
            handles.push(tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..each {
                    let resp = e.should_rate_limit_async(unix_now(), &r).await.unwrap();
                    ok += usize::from(resp.overall_code == Code::Ok);
                }
                ok
            }));
        }
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_limit_exactly() {
    let redis = RedisServer::start();
    // A generous timeout: this test is about sharing, not about falling back.
    let nodes = [
        engine(&redis.url(), RedisMode::Exact, Duration::from_secs(2), 2),
        engine(&redis.url(), RedisMode::Exact, Duration::from_secs(2), 2),
    ];
    let admitted = load(&nodes, "alice", 3, 60).await;
    for n in &nodes {
        let s = n.central_status().unwrap();
        assert_eq!((s.mode, s.decisions_local), (CentralMode::Central, 0));
    }
    // 360 requests for 100 permits: Redis admits exactly the limit over both nodes.
    assert_eq!(admitted, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_nodes_never_admit_more_than_the_limit() {
    let redis = RedisServer::start();
    let nodes = [
        engine(&redis.url(), RedisMode::Batched, Duration::from_secs(2), 2),
        engine(&redis.url(), RedisMode::Batched, Duration::from_secs(2), 2),
    ];
    let admitted = load(&nodes, "bob", 3, 60).await;
    // Batches only under-admit (an expired batch's permits are lost), never over.
    assert!(admitted <= 100 && admitted > 0, "admitted {admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_falls_back_to_the_share_and_comes_back() {
    const TIMEOUT: Duration = Duration::from_millis(50);
    // The timeout plus scheduling slack on a loaded 2-core machine.
    const BOUND: Duration = Duration::from_millis(50 + 400);
    let mut redis = RedisServer::start();
    let node = engine(&redis.url(), RedisMode::Exact, TIMEOUT, 2);
    let r = req("carol");
    // Central: 20 of the 100 permits used.
    for _ in 0..20 {
        let resp = node.should_rate_limit_async(unix_now(), &r).await.unwrap();
        assert_eq!(resp.overall_code, Code::Ok);
    }
    // Load from two tasks while Redis is killed under them. Before the kill each sends at
    // most `BEFORE` requests (then waits for it), however the machine schedules them: Redis
    // admits at most 20 + 2·BEFORE < 50, so the share keeps room after the kill.
    const BEFORE: usize = 5;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..2 {
        let (node, r, stop, dead) = (node.clone(), r.clone(), stop.clone(), dead.clone());
        handles.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut sent_before = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let before = !dead.load(std::sync::atomic::Ordering::Relaxed);
                if before && sent_before == BEFORE {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                sent_before += usize::from(before);
                let start = Instant::now();
                let resp = node.should_rate_limit_async(unix_now(), &r).await.unwrap();
                seen.push((start, start.elapsed(), resp.overall_code == Code::Ok));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    redis.kill();
    // Every request started before this instant was let through before `dead` is set: at
    // most `BEFORE` per task.
    let killed = Instant::now();
    dead.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // (requests, admitted) started before the kill returned, and after.
    let (mut before_kill, mut after_kill) = ((0, 0), (0, 0));
    for h in handles {
        for (start, took, ok) in h.await.unwrap() {
            assert!(took <= BOUND, "a request took {took:?}");
            let counted = if start > killed {
                &mut after_kill
            } else {
                &mut before_kill
            };
            counted.0 += 1;
            counted.1 += usize::from(ok);
        }
    }
    let s = node.central_status().unwrap();
    assert_eq!(s.mode, CentralMode::Fallback);
    assert_eq!(s.transitions, 1);
    // Operators see it on /metrics.
    let text = sluice_server::metrics::Metrics::new(node.clone(), None)
        .encode()
        .unwrap();
    assert!(text.contains("sluice_redis_fallback 1"), "{text}");
    assert!(text.contains("sluice_redis_transitions 1"), "{text}");
    // And on /v1/cluster, with the share's divisor.
    let v = cluster_view(&node).await;
    let redis_view = &v["redis"];
    assert_eq!(redis_view["mode"], "fallback", "{v}");
    assert_eq!(redis_view["transitions"], 1, "{v}");
    assert_eq!(redis_view["nodes"], 2, "{v}");
    assert!(redis_view["decisions_local"].as_u64().unwrap() > 0, "{v}");
    // Locally, half of the limit, on a state that counts what Redis admitted (as far as half
    // the limit goes): in the hour, at most max(admitted by Redis, 50).
    assert!(
        after_kill.0 > 50,
        "too few requests after the kill: {after_kill:?}"
    );
    let central_at_most = 20 + before_kill.1;
    let total = central_at_most + after_kill.1;
    assert!(
        total <= central_at_most.max(50),
        "{total} admitted: {before_kill:?} before the kill, {after_kill:?} after"
    );
    assert!(
        before_kill.0 <= 2 * BEFORE && central_at_most < 50,
        "the load leaves the share room: {before_kill:?} before the kill"
    );
    assert!(after_kill.1 > 0, "the share had room: {after_kill:?}");
    // Redis back (empty: no persistence): a probe finds it within 100 ms of the node's clock.
    redis.restart();
    let fresh = req("dave");
    let deadline = Instant::now() + Duration::from_secs(5);
    while node.central_status().unwrap().mode != CentralMode::Central {
        assert!(
            Instant::now() < deadline,
            "redis is back but the node stays in fallback"
        );
        let start = Instant::now();
        node.should_rate_limit_async(unix_now(), &req("probe"))
            .await
            .unwrap();
        assert!(start.elapsed() <= BOUND);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Central again: the whole limit, not the share.
    let mut ok = 0;
    for _ in 0..120 {
        let resp = node
            .should_rate_limit_async(unix_now(), &fresh)
            .await
            .unwrap();
        ok += usize::from(resp.overall_code == Code::Ok);
    }
    assert_eq!(ok, 100);
    assert_eq!(node.central_status().unwrap().transitions, 2);
    // The key decided locally during the fallback: its first central decision charged Redis
    // (restarted empty) with what the node admitted locally in the hour, so Redis admits the
    // rest of the limit, not all of it again.
    let mut ok = 0;
    for _ in 0..120 {
        let resp = node.should_rate_limit_async(unix_now(), &r).await.unwrap();
        ok += usize::from(resp.overall_code == Code::Ok);
    }
    assert!(
        ok + after_kill.1 <= 100 && ok > 0,
        "{ok} admitted by Redis after {after_kill:?} locally"
    );
    let v = cluster_view(&node).await;
    assert_eq!(v["redis"]["mode"], "central", "{v}");
    assert_eq!(v["redis"]["transitions"], 2, "{v}");
}

/// A request with a Redis rule and a token-server rule while both centers are frozen (they
/// accept connections and never answer): the two are asked at once, so the request waits
/// one timeout, not one per center; both rules then decide locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_centers_frozen_cost_one_timeout_not_two() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    // The timeout plus slack for a loaded machine, and less than two timeouts.
    const BOUND: Duration = Duration::from_millis(1_000 + 800);
    const BOTH: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 100, algorithm: sliding-log, coordination: redis }
  - key: team
    rate_limit: { unit: second, requests_per_unit: 100, coordination: token-server }
";
    // Never accepted: connections complete in the kernel's backlog and hear nothing back.
    let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = frozen.local_addr().unwrap();
    let e = Engine::new(Config::from_yaml("rules.yaml", BOTH).unwrap());
    let redis = central::connect(&format!("redis://{addr}/"), RedisMode::Exact, TIMEOUT, 2);
    assert!(e.attach_redis(redis.unwrap()));
    let mut spec = ClientSpec::new(
        vec![ServerAddr {
            id: 0,
            authority: addr.to_string(),
        }],
        1,
        PeerKey::from_text("redis-engine-test-key-0123456789").unwrap(),
        2,
    );
    spec.timeout = TIMEOUT;
    assert!(e.attach_token_server(TokenClient::new(spec)));
    let r = Request::new(
        "d",
        [
            Descriptor::new([("user", "u")]),
            Descriptor::new([("team", "t")]),
        ],
    );
    let start = Instant::now();
    let resp = e.should_rate_limit_async(unix_now(), &r).await.unwrap();
    let took = start.elapsed();
    // Both centers were asked and did not answer (a refused connection would be at once).
    assert!(took >= TIMEOUT, "{took:?}");
    assert!(
        took <= BOUND,
        "a request waited {took:?}, timeout {TIMEOUT:?}"
    );
    assert_eq!(resp.overall_code, Code::Ok, "{resp:?}");
    assert_eq!(resp.statuses.len(), 2);
    assert_eq!(e.central_status().unwrap().mode, CentralMode::Fallback);
    assert_eq!(e.token_status().unwrap().mode, TokenMode::Fallback);
    drop(frozen);
}

#[test]
fn a_redis_rule_without_redis_decides_locally_with_the_whole_limit() {
    let e = Engine::new(Config::from_yaml("rules.yaml", RULES).unwrap());
    let r = req("erin");
    let ok = (0..120)
        .filter(|_| e.should_rate_limit(0, &r).unwrap().overall_code == Code::Ok)
        .count();
    assert_eq!(ok, 100);
    assert!(e.central_status().is_none());
}

/// A warm-up rule runs in Redis too (it was refused at load before its script existed): two
/// engines share its state, so the permit one admits on a cold key is paid forward for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_rule_shares_its_state_through_redis() {
    const WARM: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 10, algorithm: warm-up, coordination: redis }
";
    let redis = RedisServer::start();
    let nodes: Vec<Arc<Engine>> = (0..2)
        .map(|_| {
            let e = Engine::new(Config::from_yaml("rules.yaml", WARM).unwrap());
            let c = central::connect(&redis.url(), RedisMode::Exact, Duration::from_secs(2), 2);
            assert!(e.attach_redis(c.unwrap()));
            Arc::new(e)
        })
        .collect();
    let r = req("grace");
    let first = nodes[0]
        .should_rate_limit_async(unix_now(), &r)
        .await
        .unwrap();
    assert_eq!(first.overall_code, Code::Ok);
    // A cold key's first permit costs 280 ms (10/s, Guava's ramp over 1 s): the other node
    // is refused meanwhile, by Redis.
    let second = nodes[1]
        .should_rate_limit_async(unix_now(), &r)
        .await
        .unwrap();
    assert_eq!(second.overall_code, Code::OverLimit, "{second:?}");
    for n in &nodes {
        let s = n.central_status().unwrap();
        assert_eq!((s.mode, s.decisions_local), (CentralMode::Central, 0));
    }
}
