//! Capacity leases (seed 000 §7): the pure table under random asks, releases, expiries and
//! capacity changes (and changes of a rule's lease terms), `POST`/`DELETE /v1/lease` end to
//! end on 127.0.0.1 with a `ManualClock`, so expiries happen exactly when the test says, and
//! the per-rule `leases: { policy, duration }` settings: parsed, refused with their place,
//! and applied per rule (Alg. 1 on one rule, Alg. 2 on another, on one node).
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
use sluice_coord::allocation::{AllocationPolicy, allocate_max_min, allocate_proportional};
use sluice_limits::ManualClock;
use sluice_server::config::RuleLeases;
use sluice_server::lease::{Capacity, LeaseConfig, LeaseRequest, Leases, units_of};
use sluice_server::{Config, ConfigErrorKind, ConfigSource, Descriptor, Engine};
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A reload may change a rule's policy and lease duration while its clients hold grants
    /// (which cannot be recalled): with a constant capacity, what clients may still be
    /// using never exceeds it, old terms' grants and new ones together; every grant lasts
    /// one of the durations in force.
    #[test]
    fn changing_terms_never_exceed_capacity(
        ops in proptest::collection::vec(
            prop_oneof![
                6 => (0u8..6, 0u32..2_000).prop_map(|(client, wants)| Op::Ask { client, wants }),
                1 => (0u8..6).prop_map(|client| Op::Release { client }),
                3 => (0u32..1_500).prop_map(|ms| Op::Wait { ms }),
                // A change of terms: the capacity field picks the policy and duration.
                2 => (0u32..8).prop_map(|per_second| Op::Capacity { per_second }),
            ],
            1..120,
        ),
        per_second in 0u32..2_000,
    ) {
        let leases = Leases::new(LeaseConfig::with_lease(Duration::from_secs(1))).unwrap();
        let capacity = units_of(f64::from(per_second));
        let durations = [250_u64, 1_000, 2_000, 700].map(|ms| ms * 1_000_000);
        let mut terms = RuleLeases::default();
        let mut now = T0;
        let mut held: BTreeMap<u8, Vec<(u64, u64)>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Ask { client, wants } => {
                    let g = leases
                        .acquire_under(now, Capacity::fixed(capacity), terms, &ask(client, f64::from(wants)))
                        .unwrap();
                    prop_assert!(g.rate_units <= units_of(f64::from(wants)));
                    prop_assert!(durations.contains(&g.expires_in) || g.expires_in == S, "{g:?}");
                    held.entry(client).or_default().push((g.rate_units, g.expires_at));
                }
                Op::Release { client } => {
                    leases.release(now, "api", &Descriptor::new([("tenant", "acme")]), &format!("c{client}"));
                    held.remove(&client);
                }
                Op::Wait { ms } => now += u64::from(ms) * 1_000_000,
                Op::Capacity { per_second: pick } => {
                    terms = RuleLeases {
                        policy: Some(if pick % 2 == 0 {
                            AllocationPolicy::MaxMin
                        } else {
                            AllocationPolicy::Proportional
                        }),
                        duration: Some(Duration::from_nanos(durations[(pick / 2) as usize])),
                    };
                }
            }
            let in_use: u128 = held
                .values()
                .map(|gs| gs.iter().filter(|g| g.1 > now).map(|g| g.0).max().unwrap_or(0))
                .map(u128::from)
                .sum();
            prop_assert!(in_use <= u128::from(capacity), "in use {in_use} > {capacity} at {now}");
            let outstanding = leases.outstanding("api", &Descriptor::new([("tenant", "acme")]));
            prop_assert!(u128::from(outstanding) >= in_use, "the table forgot a grant in use");
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
        Self::start_with(RULES, LeaseConfig::with_lease(Duration::from_secs(1))).await
    }

    async fn start_with(rules: &str, config: LeaseConfig) -> Self {
        let engine = Arc::new(Engine::new(Config::from_yaml("t.yaml", rules).unwrap()));
        let clock = Arc::new(ManualClock::new(T0));
        let leases = Arc::new(Leases::new(config).unwrap());
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
        self.call_text(method, body.to_string()).await
    }

    /// [`Server::call`] with the body as written (JSON that `Value` cannot hold).
    async fn call_text(&self, method: Method, body: String) -> (StatusCode, String) {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = http::Request::builder()
            .method(method)
            .uri("/v1/lease")
            .header(http::header::HOST, "localhost")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn lease(&self, client: &str, wants: f64) -> Value {
        self.lease_on("tenant", client, wants).await
    }

    async fn lease_on(&self, key: &str, client: &str, wants: f64) -> Value {
        let (status, body) = self
            .call(
                Method::POST,
                &json!({"domain": "api", "descriptor": {"entries": [{"key": key, "value": "acme"}]},
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
        // Numbers beyond f64 (an infinite `wants` once parsed) and NaN-like text: refused.
        for wants in ["1e400", "-1e400", "NaN", "Infinity"] {
            let request = format!(
                r#"{{"domain": "api", "descriptor": {{"entries": [{{"key": "tenant", "value": "x"}}]}}, "client_id": "c", "wants": {wants}}}"#
            );
            let (status, reason) = s.call_text(Method::POST, request).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "wants {wants} → {reason}");
        }
        s.stop().await;
    })
    .await
    .unwrap();
}

// ---- per-rule lease terms --------------------------------------------------------------

/// Three rules of 60/s: one proportional (Alg. 1) with the node's duration, one max-min
/// (Alg. 2) with its own 2 s, one with the node's terms (proportional, 1 s, below).
const TERMS: &str = "
domain: api
descriptors:
  - key: prop
    rate_limit: { unit: second, requests_per_unit: 60, leases: { policy: proportional } }
  - key: fair
    rate_limit:
      unit: minute
      requests_per_unit: 3600
      algorithm: gcra
      leases:
        policy: max-min
        duration: 2s
  - key: plain
    rate_limit: { unit: second, requests_per_unit: 60 }
";

/// The node's own terms: proportional, 1 s leases refreshed after 1/3 s.
fn node_terms() -> LeaseConfig {
    LeaseConfig {
        policy: AllocationPolicy::Proportional,
        ..LeaseConfig::with_lease(Duration::from_secs(1))
    }
}

#[test]
fn rule_lease_terms_are_parsed() {
    let config = Config::from_yaml("t.yaml", TERMS).unwrap();
    let d = config.domain("api").unwrap();
    let terms = |k: &str| d.rule_for([(k, "x")]).unwrap().leases;
    assert_eq!(
        terms("prop"),
        RuleLeases {
            policy: Some(AllocationPolicy::Proportional),
            duration: None
        }
    );
    assert_eq!(
        terms("fair"),
        RuleLeases {
            policy: Some(AllocationPolicy::MaxMin),
            duration: Some(Duration::from_secs(2))
        }
    );
    assert_eq!(terms("plain"), RuleLeases::default());
    // Every spelling of the policies, and durations in any unit.
    for (text, policy, duration) in [
        (
            "{ policy: MAX-MIN, duration: 500ms }",
            AllocationPolicy::MaxMin,
            500,
        ),
        (
            "{ policy: max_min, duration: 1m }",
            AllocationPolicy::MaxMin,
            60_000,
        ),
        (
            "{ duration: 1ms, policy: Proportional }",
            AllocationPolicy::Proportional,
            1,
        ),
    ] {
        let yaml = format!(
            "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: second, requests_per_unit: 1, leases: {text} }}\n"
        );
        let config = Config::from_yaml("t.yaml", &yaml).unwrap();
        let rule = config
            .domain("x")
            .unwrap()
            .rule_for([("k", "v")])
            .unwrap()
            .leases;
        assert_eq!(rule.policy, Some(policy), "{text}");
        assert_eq!(
            rule.duration,
            Some(Duration::from_millis(duration)),
            "{text}"
        );
    }
    // envoyproxy/ratelimit's own files know nothing of it: no terms.
    let config = Config::from_yaml("t.yaml", RULES).unwrap();
    for rule in config.domain("api").unwrap().rules() {
        assert_eq!(rule.leases, RuleLeases::default());
    }
}

#[test]
fn bad_rule_lease_terms_are_refused_with_their_place() {
    /// A rule's line, where the error must point (line, column), and the reason expected.
    type Case = (&'static str, (usize, usize), fn(&ConfigErrorKind) -> bool);
    let cases: [Case; 8] = [
        (
            "    rate_limit: { unit: second, requests_per_unit: 1, leases: { policy: fair } }",
            (4, 73),
            |k| matches!(k, ConfigErrorKind::UnknownLeasePolicy(p) if p == "fair"),
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: 1, leases: { duration: 0s } }",
            (4, 75),
            |k| matches!(k, ConfigErrorKind::BadLeaseDuration(d) if d == "0s"),
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: 1, leases: { duration: 2d } }",
            (4, 75),
            |k| matches!(k, ConfigErrorKind::BadLeaseDuration(_)),
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: 1, leases: { duration: soon } }",
            (4, 75),
            |k| matches!(k, ConfigErrorKind::BadLeaseDuration(_)),
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: 1, leases: { refresh: 1s } }",
            (4, 65),
            |k| matches!(k, ConfigErrorKind::UnknownField { field, .. } if field == "refresh"),
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: 1, leases: max-min }",
            (4, 63),
            |k| matches!(k, ConfigErrorKind::WrongType { field, .. } if field == "leases"),
        ),
        (
            "    rate_limit: { unlimited: true, leases: { policy: max-min } }",
            (4, 44),
            |k| matches!(k, ConfigErrorKind::FieldWithUnlimited("leases")),
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: 1, coordination: token-server, leases: {} }",
            (4, 91),
            |k| matches!(k, ConfigErrorKind::LeasesUnsupported("token-server")),
        ),
    ];
    for (line, (l, c), kind) in cases {
        let yaml = format!("domain: x\ndescriptors:\n  - key: k\n{line}\n");
        let e = Config::from_yaml("bad.yaml", &yaml).unwrap_err();
        assert!(kind(&e.kind), "{line}: {e}");
        assert_eq!(
            (e.line, e.column),
            (Some(l), Some(c)),
            "{line}: {e} (column {} is `{}`)",
            c,
            &line[c - 1..]
        );
        assert!(
            e.to_string().starts_with(&format!("bad.yaml:{l}:{c}: ")),
            "{e}"
        );
    }
}

#[test]
fn a_refused_reload_keeps_the_old_terms() {
    let dir = std::env::temp_dir().join(format!("sluice-lease-terms-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.yaml");
    std::fs::write(&file, TERMS).unwrap();
    let source = ConfigSource::Path(file.clone());
    let engine = Engine::new(source.load().unwrap());
    std::fs::write(
        &file,
        TERMS.replace("policy: proportional", "policy: fairest"),
    )
    .unwrap();
    let e = engine.reload(&source).unwrap_err();
    assert!(
        matches!(e.kind, ConfigErrorKind::UnknownLeasePolicy(_)),
        "{e}"
    );
    assert_eq!((e.line, e.column), (Some(5), Some(74)), "{e}");
    let leases = Leases::new(node_terms()).unwrap();
    let g = leases
        .acquire(&engine, T0, &ask_on("prop", "c", 1.0))
        .unwrap();
    assert_eq!(
        g.policy,
        AllocationPolicy::Proportional,
        "the old terms stay"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn ask_on(key: &str, client: &str, wants: f64) -> LeaseRequest {
    LeaseRequest {
        domain: "api".into(),
        descriptor: Descriptor::new([(key, "acme")]),
        client_id: client.into(),
        wants,
    }
}

/// Seed 000 §7 on one node, per rule: three clients wanting 10, 30 and 60 of a 60/s rule
/// get 6/18/36 under Alg. 1 (proportional) and 10/25/25 under Alg. 2 (max-min), each rule
/// with its own lease duration. Grants cannot be recalled, so the fair parts are reached
/// once the first round's grants (cut to what was left) have expired: three rounds, the
/// last just after the first round's expiry.
#[tokio::test]
async fn each_rule_divides_with_its_own_policy_and_duration() {
    tokio::time::timeout(BOUND, async {
        let s = Server::start_with(TERMS, node_terms()).await;
        let clients = [("a", 10.0), ("b", 30.0), ("c", 60.0)];
        let wants: Vec<u64> = clients.iter().map(|(_, w)| units_of(*w)).collect();
        let mut base = T0;
        for (key, policy, lease_ms, refresh_ms, expected) in [
            ("prop", "proportional", 1_000, 333, [6.0, 18.0, 36.0]),
            ("fair", "max-min", 2_000, 666, [10.0, 25.0, 25.0]),
            ("plain", "proportional", 1_000, 333, [6.0, 18.0, 36.0]),
        ] {
            let lease = lease_ms * 1_000_000;
            let mut last = Vec::new();
            for at in [base, base + lease / 2, base + lease + 1_000_000] {
                s.clock.set(at);
                last.clear();
                for (client, w) in clients {
                    let v = s.lease_on(key, client, w).await;
                    assert_eq!(v["policy"], json!(policy), "{key}: {v}");
                    assert_eq!(v["expires_in_ms"], json!(lease_ms), "{key}: {v}");
                    assert_eq!(v["refresh_in_ms"], json!(refresh_ms), "{key}: {v}");
                    assert_eq!(v["share"], json!(60.0), "{key}: {v}");
                    last.push(rate(&v));
                }
                let descriptor = Descriptor::new([(key, "acme")]);
                assert!(
                    s.leases.outstanding("api", &descriptor) <= units_of(60.0),
                    "{key}"
                );
            }
            assert_eq!(last, expected, "{key}");
            // The numbers are the algorithms' own.
            let units = if policy == "proportional" {
                allocate_proportional(units_of(60.0), &wants)
            } else {
                allocate_max_min(units_of(60.0), &wants)
            };
            let from_algorithm: Vec<f64> = units.iter().map(|&u| u as f64 / 1e9).collect();
            assert_eq!(last, from_algorithm, "{key}");
            base += 10 * S;
        }
        s.stop().await;
    })
    .await
    .unwrap();
}
