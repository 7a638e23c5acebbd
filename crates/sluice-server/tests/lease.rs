//! Capacity leases (seed 000 §7): the pure table under random asks, releases, expiries and
//! capacity changes, and `POST`/`DELETE /v1/lease` end to end on 127.0.0.1 with a
//! `ManualClock`, so expiries happen exactly when the test says.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_limits::ManualClock;
use sluice_server::lease::{Capacity, LeaseConfig, LeaseRequest, Leases, units_of};
use sluice_server::{Config, Descriptor, Engine};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_700_006_400 * S;
const BOUND: Duration = Duration::from_secs(20);

const RULES: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit: { unit: second, requests_per_unit: 1000 }
  - key: batch
    rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: internal
    rate_limit: { unlimited: true }
";

fn ask(client: u8, wants: f64) -> LeaseRequest {
    LeaseRequest {
        domain: "api".into(),
        descriptor: Descriptor::new([("tenant", "acme")]),
        client_id: format!("c{client}"),
        wants,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Ask { client: u8, wants: u32 },
    Release { client: u8 },
    Wait { ms: u32 },
    Capacity { per_second: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..8, 0u32..2_000).prop_map(|(client, wants)| Op::Ask { client, wants }),
        1 => (0u8..8).prop_map(|client| Op::Release { client }),
        3 => (0u32..1_500).prop_map(|ms| Op::Wait { ms }),
        1 => (0u32..2_000).prop_map(|per_second| Op::Capacity { per_second }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Seed 000 §7 with non-recallable grants: whatever clients ask, release or stop
    /// refreshing, the grants a client may still be using (its largest unexpired one — a
    /// smaller refresh may not have reached it) never add up to more than the largest
    /// capacity in force during the last lease duration; with a constant capacity, never
    /// more than it. No grant exceeds the ask. Checked against the grants as handed out,
    /// not the table's own bookkeeping.
    #[test]
    fn grants_never_exceed_capacity(
        ops in proptest::collection::vec(op(), 1..120),
        first in 0u32..2_000,
        constant in any::<bool>(),
    ) {
        let lease = S;
        let leases = Leases::new(LeaseConfig::with_lease(Duration::from_nanos(lease))).unwrap();
        let mut now = T0;
        let mut capacity = units_of(f64::from(first));
        // (since, capacity) history, to find the largest capacity of the last lease.
        let mut history = vec![(now, capacity)];
        // What each client holds: every grant it received, as (rate, expires_at).
        let mut held: BTreeMap<u8, Vec<(u64, u64)>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Ask { client, wants } => {
                    let g = leases
                        .acquire_with(now, Capacity::fixed(capacity), &ask(client, f64::from(wants)))
                        .unwrap();
                    prop_assert!(g.rate_units <= units_of(f64::from(wants)));
                    prop_assert!(g.rate_units <= capacity);
                    prop_assert_eq!(g.expires_at, now + lease);
                    held.entry(client).or_default().push((g.rate_units, g.expires_at));
                }
                Op::Release { client } => {
                    // A client that releases stops using every grant it had.
                    leases.release(now, "api", &Descriptor::new([("tenant", "acme")]), &format!("c{client}"));
                    held.remove(&client);
                }
                Op::Wait { ms } => now += u64::from(ms) * 1_000_000,
                Op::Capacity { per_second } => {
                    if !constant {
                        capacity = units_of(f64::from(per_second));
                        history.push((now, capacity));
                    }
                }
            }
            let in_use: u128 = held
                .values()
                .map(|gs| gs.iter().filter(|g| g.1 > now).map(|g| g.0).max().unwrap_or(0))
                .map(u128::from)
                .sum();
            // The capacities in force at some instant of (now − L, now].
            let bound = history
                .iter()
                .enumerate()
                .filter(|(i, (since, _))| {
                    let until = history.get(i + 1).map_or(u64::MAX, |n| n.0);
                    *since <= now && until > now.saturating_sub(lease)
                })
                .map(|(_, (_, c))| *c)
                .max()
                .unwrap();
            prop_assert!(in_use <= u128::from(bound), "in use {in_use} > {bound} at {now}");
            if constant {
                prop_assert!(in_use <= u128::from(capacity));
            }
        }
    }
}

struct Server {
    addr: SocketAddr,
    clock: Arc<ManualClock>,
    leases: Arc<Leases>,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), sluice_server::http::ServeError>>,
}

impl Server {
    async fn start() -> Self {
        let engine = Arc::new(Engine::new(Config::from_yaml("t.yaml", RULES).unwrap()));
        let clock = Arc::new(ManualClock::new(T0));
        let leases =
            Arc::new(Leases::new(LeaseConfig::with_lease(Duration::from_secs(1))).unwrap());
        let state = sluice_server::http::HttpState::new(engine, None)
            .with_clock(clock.clone())
            .with_leases(Arc::clone(&leases));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(sluice_server::http::run(listener, state, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            clock,
            leases,
            stop,
            done,
        }
    }

    async fn call(&self, method: Method, body: &Value) -> (StatusCode, String) {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = http::Request::builder()
            .method(method)
            .uri("/v1/lease")
            .header(http::header::HOST, "localhost")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn lease(&self, client: &str, wants: f64) -> Value {
        let (status, body) = self
            .call(
                Method::POST,
                &json!({"domain": "api", "descriptor": {"entries": [{"key": "tenant", "value": "acme"}]},
                        "client_id": client, "wants": wants}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.done.await.unwrap().unwrap();
    }
}

fn rate(v: &Value) -> f64 {
    v["rate"].as_f64().unwrap()
}

#[tokio::test]
async fn http_leases_are_max_min_fair_and_expire() {
    tokio::time::timeout(BOUND, async {
        let s = Server::start().await;
        let a = s.lease("a", 300.0).await;
        let b = s.lease("b", 900.0).await;
        // Seed 000 §7 Alg. 2 on 1,000/s: the small demand in full, the rest to the large one.
        assert_eq!(rate(&a), 300.0);
        assert_eq!(rate(&b), 700.0);
        assert_eq!(b["limit"], json!(1000.0));
        assert_eq!(b["share"], json!(1000.0));
        assert_eq!(b["policy"], json!("max-min"));
        assert_eq!(b["clients"], json!(2));
        assert_eq!(b["expires_in_ms"], json!(1000));
        assert_eq!(b["refresh_in_ms"], json!(333));
        let descriptor = Descriptor::new([("tenant", "acme")]);
        assert!(s.leases.outstanding("api", &descriptor) <= units_of(1000.0));

        // `a` stops refreshing; `b` keeps at it. Before `a`'s expiry nothing changes...
        s.clock.set(T0 + 999_000_000);
        assert_eq!(rate(&s.lease("b", 900.0).await), 700.0);
        // ...after it, `b` gets what it wants.
        s.clock.set(T0 + S);
        let b = s.lease("b", 900.0).await;
        assert_eq!(rate(&b), 900.0);
        assert_eq!(b["clients"], json!(1));

        // A released lease frees its capacity at once.
        let a = s.lease("a", 300.0).await;
        assert_eq!(rate(&a), 100.0, "b still holds 900 until its grant expires");
        let (status, _) = s
            .call(
                Method::DELETE,
                &json!({"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}],
                        "client_id": "b"}),
            )
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert_eq!(rate(&s.lease("a", 300.0).await), 300.0);
        let (status, _) = s
            .call(
                Method::DELETE,
                &json!({"domain": "api", "descriptor": {"entries": [{"key": "tenant", "value": "acme"}]},
                        "client_id": "b"}),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        s.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn http_lease_answers_for_every_kind_of_rule_and_refuses_bad_requests() {
    tokio::time::timeout(BOUND, async {
        let s = Server::start().await;
        let body = |k: &str, wants: Value| {
            json!({"domain": "api", "descriptor": {"entries": [{"key": k, "value": "x"}]},
                   "client_id": "c", "wants": wants})
        };
        // 60 per minute is 1 per second.
        let (status, answer) = s.call(Method::POST, &body("batch", json!(5))).await;
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["rate"], json!(1.0));
        assert_eq!(v["limit"], json!(1.0));
        // Unlimited: what is asked, no limit.
        let (status, answer) = s.call(Method::POST, &body("internal", json!(12345))).await;
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["rate"], json!(12345.0));
        assert_eq!(v["limit"], Value::Null);

        for (request, expected) in [
            (body("nothing", json!(1)), StatusCode::NOT_FOUND),
            (
                json!({"domain": "nope", "descriptor": {"entries": [{"key": "tenant", "value": "x"}]},
                       "client_id": "c", "wants": 1}),
                StatusCode::NOT_FOUND,
            ),
            (body("tenant", json!(-1)), StatusCode::BAD_REQUEST),
            (body("tenant", json!("many")), StatusCode::BAD_REQUEST),
            (
                json!({"domain": "api", "descriptor": {"entries": [{"key": "tenant", "value": "x"}]}, "wants": 1}),
                StatusCode::BAD_REQUEST,
            ),
            (
                json!({"domain": "api", "descriptors": [], "client_id": "c", "wants": 1}),
                StatusCode::BAD_REQUEST,
            ),
            (
                json!({"domain": "api", "descriptor": {"entries": [{"key": "tenant", "value": "x"}]},
                       "client_id": "c"}),
                StatusCode::BAD_REQUEST,
            ),
            (
                json!({"domain": "api", "descriptor": {"entries": []}, "client_id": "c", "wants": 1}),
                StatusCode::BAD_REQUEST,
            ),
            (
                json!({"domain": "api", "descriptor": {"entries": [{"key": "tenant", "value": "x"}]},
                       "client_id": "c", "wants": 1, "extra": true}),
                StatusCode::BAD_REQUEST,
            ),
        ] {
            let (status, reason) = s.call(Method::POST, &request).await;
            assert_eq!(status, expected, "{request} → {reason}");
            assert!(!reason.trim().is_empty());
        }
        s.stop().await;
    })
    .await
    .unwrap();
}
