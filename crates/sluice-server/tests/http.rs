//! The HTTP shell, end to end: a server on 127.0.0.1:0 in this process, called over real
//! sockets with a plain HTTP/1.1 client. Time is a `ManualClock` pinned 250 ms into a unix
//! day, so window edges never move under a test; every test is bounded by a timeout.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sluice_limits::{Clock as _, ManualClock};
use sluice_server::http::{HttpState, MAX_BODY, ServeError};
use sluice_server::status::{ClusterInfo, ClusterStatus, KeyShareStatus, MemberStatus};
use sluice_server::{Code, Config, Descriptor, Engine, Request, Response};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Start of a unix day (so also of a second and a minute) plus 250 ms, in nanoseconds.
const T0: u64 = 1_700_006_400 * 1_000_000_000 + 250_000_000;
/// Every test finishes well within this, or fails.
const BOUND: Duration = Duration::from_secs(20);

/// envoyproxy/ratelimit README "Example 3", plus a shadowed rule and an unlimited one.
const EDGE: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0

  - key: user
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2

  - key: internal
    rate_limit:
      unlimited: true
";

struct Server {
    addr: SocketAddr,
    state: HttpState,
    engine: Arc<Engine>,
    clock: Arc<ManualClock>,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Server {
    async fn start(yaml: &str) -> Self {
        Self::start_with(yaml, None).await
    }

    async fn start_with(yaml: &str, cluster: Option<Arc<dyn ClusterInfo>>) -> Self {
        Self::start_opts(yaml, cluster, false).await
    }

    async fn start_opts(
        yaml: &str,
        cluster: Option<Arc<dyn ClusterInfo>>,
        subsecond_reset: bool,
    ) -> Self {
        let engine = Arc::new(Engine::new(Config::from_yaml("test.yaml", yaml).unwrap()));
        let clock = Arc::new(ManualClock::new(T0));
        let state = HttpState::new(Arc::clone(&engine), cluster)
            .with_clock(clock.clone())
            .with_subsecond_reset(subsecond_reset);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(sluice_server::http::run(listener, state.clone(), async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            state,
            engine,
            clock,
            stop,
            done,
        }
    }

    async fn call(&self, method: Method, path: &str, body: impl Into<Bytes>) -> Reply {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost")
            .body(Full::new(body.into()))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, Bytes::new()).await
    }

    async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.call(Method::POST, path, body.to_string()).await
    }

    async fn metrics(&self) -> Metrics {
        let r = self.get("/metrics").await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(
            r.header("content-type")
                .starts_with("application/openmetrics-text")
        );
        Metrics::parse(&r.body)
    }

    /// Graceful shutdown: the server returns Ok once told to stop.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.done.await.unwrap().unwrap();
    }
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", |v| v.to_str().unwrap())
    }
}

async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(BOUND, test)
        .await
        .expect("test exceeded its time bound");
}

fn ip(address: &str) -> Value {
    json!({"domain": "edge_proxy_per_ip", "descriptors": [{"entries": [{"key": "remote_address", "value": address}]}]})
}

/// The protojson `RateLimitResponse` for an engine answer, written out from the protobuf
/// definitions (the test's oracle, independent of the server's serialiser).
fn protojson(r: &Response) -> Value {
    let code = |c: Code| match c {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    };
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut v = json!({"code": code(s.code)});
            if let Some(l) = s.current_limit {
                let mut limit = json!({"unit": l.unit.name().to_uppercase()});
                if let Some(name) = &s.limit_name {
                    limit["name"] = json!(name.as_ref());
                }
                if l.requests_per_unit != 0 {
                    limit["requestsPerUnit"] = json!(l.requests_per_unit);
                }
                v["currentLimit"] = limit;
            }
            if s.limit_remaining != 0 {
                v["limitRemaining"] = json!(s.limit_remaining);
            }
            if let Some(d) = s.duration_until_reset {
                // Upstream's whole seconds, rounded up.
                v["durationUntilReset"] = json!(format!("{}s", d.div_ceil(1_000_000_000)));
            }
            v
        })
        .collect();
    json!({"overallCode": code(r.overall_code), "statuses": statuses})
}

/// `--subsecond-reset`: `/json` gives the time left to the nanosecond (the window ends 750 ms
/// after T0), where upstream, and the default, round it up to a whole second.
#[tokio::test]
async fn json_reset_to_the_nanosecond_is_opt_in() {
    bounded(async {
        let s = Server::start_opts(EDGE, None, true).await;
        let r = s.post_json("/json", &ip("10.0.0.1")).await;
        assert_eq!(
            r.json()["statuses"][0]["durationUntilReset"],
            json!("0.750s")
        );
        let s = Server::start_opts(EDGE, None, false).await;
        let r = s.post_json("/json", &ip("10.0.0.1")).await;
        assert_eq!(r.json()["statuses"][0]["durationUntilReset"], json!("1s"));
    })
    .await;
}

/// The envoyproxy/ratelimit README's example answers, literally: 10 per second for an
/// address (the window ends 750 ms after T0), then 429; the blocked address always 429.
#[tokio::test]
async fn json_answers_like_envoyproxy_ratelimit() {
    bounded(async {
        let s = Server::start(EDGE).await;
        let r = s.post_json("/json", &ip("10.0.0.1")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("content-type"), "application/json");
        assert_eq!(
            r.body,
            r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":10,"unit":"SECOND"},"limitRemaining":9,"durationUntilReset":"1s"}]}"#
        );
        for _ in 2..=10 {
            assert_eq!(
                s.post_json("/json", &ip("10.0.0.1")).await.status,
                StatusCode::OK
            );
        }
        let r = s.post_json("/json", &ip("10.0.0.1")).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            r.body,
            r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":10,"unit":"SECOND"},"durationUntilReset":"1s"}]}"#
        );
        // A block rule (requests_per_unit 0): protojson leaves the zero out.
        let r = s.post_json("/json", &ip("50.0.0.5")).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            r.json()["statuses"][0]["currentLimit"],
            json!({"unit": "SECOND"})
        );
        // An unknown domain is OK with no limit; the next second is a new window.
        let r = s
            .post_json(
                "/json",
                &json!({"domain": "nope", "descriptors": [{"entries": [{"key": "k"}]}]}),
            )
            .await;
        assert_eq!(r.body, r#"{"overallCode":"OK","statuses":[{"code":"OK"}]}"#);
        s.clock.advance(Duration::from_secs(1));
        assert_eq!(
            s.post_json("/json", &ip("10.0.0.1")).await.status,
            StatusCode::OK
        );
        s.stop().await;
    })
    .await;
}

/// Every answer of `/json` is the protojson of what an engine with the same configuration
/// answers to the same requests at the same times — several descriptors, shadow mode,
/// unlimited, `hits_addend` in both spellings and a descriptor's own limit included.
#[tokio::test]
async fn json_matches_the_engine() {
    bounded(async {
        let s = Server::start(EDGE).await;
        let reference = Engine::new(Config::from_yaml("test.yaml", EDGE).unwrap());
        let d = |pairs: &[(&str, &str)]| Descriptor::new(pairs.iter().copied());
        let mut cases: Vec<(Value, Request)> = Vec::new();
        for _ in 0..4 {
            let mut own = d(&[("remote_address", "10.9.9.9")]);
            own.hits_addend = Some(3);
            cases.push((
                json!({"domain": "edge_proxy_per_ip", "hitsAddend": 2, "descriptors": [
                    {"entries": [{"key": "remote_address", "value": "10.0.0.2"}]},
                    {"entries": [{"key": "user", "value": "alice"}]},
                    {"entries": [{"key": "internal", "value": "x"}]},
                    {"entries": [{"key": "remote_address", "value": "10.9.9.9"}], "hits_addend": "3"},
                    {"entries": [{"key": "other"}]},
                ]}),
                Request {
                    domain: "edge_proxy_per_ip".into(),
                    descriptors: vec![
                        d(&[("remote_address", "10.0.0.2")]),
                        d(&[("user", "alice")]),
                        d(&[("internal", "x")]),
                        own,
                        d(&[("other", "")]),
                    ],
                    hits_addend: 2,
                },
            ));
            let mut over = d(&[("remote_address", "10.0.0.3")]);
            over.limit = Some(sluice_server::RateLimit {
                requests_per_unit: 2,
                unit: sluice_server::Unit::Minute,
            });
            cases.push((
                json!({"domain": "edge_proxy_per_ip", "descriptors": [
                    {"entries": [{"key": "remote_address", "value": "10.0.0.3"}],
                     "limit": {"requests_per_unit": 2, "unit": "MINUTE"}},
                ]}),
                Request {
                    domain: "edge_proxy_per_ip".into(),
                    descriptors: vec![over],
                    hits_addend: 0,
                },
            ));
        }
        let mut overs = 0;
        for (i, (body, request)) in cases.iter().enumerate() {
            if i == 6 {
                // Into the next second: the per-second windows start again, the minute's not.
                s.clock.advance(Duration::from_millis(800));
            }
            let now = s.clock.now();
            let expected = reference.should_rate_limit(now, request).unwrap();
            let r = s.post_json("/json", body).await;
            assert_eq!(r.json(), protojson(&expected), "case {i}");
            let want = match expected.overall_code {
                Code::Ok => StatusCode::OK,
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            };
            assert_eq!(r.status, want, "case {i}");
            overs += usize::from(want == StatusCode::TOO_MANY_REQUESTS);
        }
        assert!(overs > 0, "the sequence reaches a limit");
        s.stop().await;
    })
    .await;
}

/// Malformed JSON, an unknown field, an empty domain, no descriptor, negative hits and an
/// oversized body are refused with a reason, and nothing is counted.
#[tokio::test]
async fn bad_input_is_refused_without_counting() {
    bounded(async {
        let s = Server::start(EDGE).await;
        let big = format!(
            r#"{{"domain": "edge_proxy_per_ip", "descriptors": [], "x": "{}"}}"#,
            "a".repeat(MAX_BODY)
        );
        for (path, body, status, reason) in [
            ("/json", "{\"domain\": ", StatusCode::BAD_REQUEST, "malformed"),
            ("/json", "", StatusCode::BAD_REQUEST, "malformed"),
            (
                "/json",
                r#"{"domain": "edge_proxy_per_ip", "descriptor": []}"#,
                StatusCode::BAD_REQUEST,
                "unknown field",
            ),
            (
                "/json",
                r#"{"domain": "", "descriptors": [{"entries": [{"key": "remote_address", "value": "1"}]}]}"#,
                StatusCode::BAD_REQUEST,
                "domain must not be empty",
            ),
            (
                "/json",
                r#"{"domain": "edge_proxy_per_ip"}"#,
                StatusCode::BAD_REQUEST,
                "descriptor list must not be empty",
            ),
            (
                "/json",
                r#"{"domain": "edge_proxy_per_ip", "descriptors": [{"entries": [{"key": "remote_address", "value": "1"}], "is_negative_hits": true}]}"#,
                StatusCode::BAD_REQUEST,
                "negative hits",
            ),
            ("/json", big.as_str(), StatusCode::PAYLOAD_TOO_LARGE, "larger than"),
            ("/v1/check", big.as_str(), StatusCode::PAYLOAD_TOO_LARGE, "larger than"),
            ("/v1/check", "[]", StatusCode::BAD_REQUEST, "malformed"),
            (
                "/v1/check/edge_proxy_per_ip",
                "",
                StatusCode::BAD_REQUEST,
                "no descriptor entries",
            ),
            (
                "/v1/check/edge_proxy_per_ip?remote_address=1&hits_addend=-2",
                "",
                StatusCode::BAD_REQUEST,
                "hits_addend",
            ),
        ] {
            let r = s.call(Method::POST, path, body.to_owned()).await;
            assert_eq!(r.status, status, "{path} {body:.40}: {}", r.body);
            assert!(r.body.contains(reason), "{path}: {:?} lacks {reason:?}", r.body);
            assert!(r.header("content-type").starts_with("text/plain"));
        }
        assert_eq!(s.get("/json").await.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(s.get("/nope").await.status, StatusCode::NOT_FOUND);
        // Nothing reached a counter.
        assert!(s.engine.is_empty());
        for (_, _, counts) in s.engine.stats().snapshot() {
            assert_eq!(counts, Default::default());
        }
        let m = s.metrics().await;
        assert_eq!(m.sum("sluice_requests_total", &[("answer", "invalid")]), 11.0);
        assert_eq!(m.sum("sluice_requests_total", &[("answer", "ok")]), 0.0);
        assert_eq!(m.sum("sluice_decision_duration_seconds_count", &[]), 0.0);
        // Still serving, still counting from zero.
        let r = s.post_json("/json", &ip("10.0.0.1")).await;
        assert_eq!(r.json()["statuses"][0]["limitRemaining"], 9);
        s.stop().await;
    })
    .await;
}

/// The plain check: IETF headers on 200, `Retry-After` on 429, nothing for no limit.
#[tokio::test]
async fn plain_check_answers_with_rate_limit_headers() {
    bounded(async {
        let s = Server::start(EDGE).await;
        let path = "/v1/check/edge_proxy_per_ip?remote_address=10.0.0.7";
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit-limit"), "10");
        assert_eq!(r.header("ratelimit-remaining"), "9");
        // 750 ms to the end of the window, rounded up.
        assert_eq!(r.header("ratelimit-reset"), "1");
        assert_eq!(r.header("ratelimit-policy"), "10;w=1");
        assert_eq!(r.header("retry-after"), "");
        assert_eq!(r.json()["statuses"][0]["limitRemaining"], 9);
        // POST works too, and `hits_addend` takes several permits at once.
        let r = s
            .call(
                Method::POST,
                "/v1/check/edge_proxy_per_ip?remote_address=10.0.0.7&hits_addend=8",
                Bytes::new(),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit-remaining"), "1");
        let r = s.get(&format!("{path}&hits_addend=2")).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        // Over the limit nothing is left (envoyproxy/ratelimit says 0).
        assert_eq!(r.header("ratelimit-remaining"), "0");
        assert_eq!(r.header("retry-after"), "1");
        let r = s
            .get("/v1/check/edge_proxy_per_ip?remote_address=50.0.0.5")
            .await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.header("ratelimit-limit"), "0");
        assert_eq!(r.header("retry-after"), "1");
        // Shadow mode: over by the count, but 200 (and the headers say 0 left).
        for expect_left in ["1", "0", "0"] {
            let r = s.get("/v1/check/edge_proxy_per_ip?user=bob").await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(r.header("ratelimit-remaining"), expect_left);
            assert_eq!(r.header("ratelimit-policy"), "2;w=60");
        }
        // No limit: no headers.
        let r = s.get("/v1/check/edge_proxy_per_ip?internal=x").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit-limit"), "");
        // The JSON body form: the most constrained descriptor's headers.
        let r = s
            .post_json(
                "/v1/check",
                &json!({"domain": "edge_proxy_per_ip", "descriptors": [
                    {"entries": [{"key": "remote_address", "value": "10.0.0.8"}]},
                    {"entries": [{"key": "user", "value": "carol"}]},
                ]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit-limit"), "2");
        assert_eq!(r.header("ratelimit-remaining"), "1");
        assert_eq!(r.header("ratelimit-reset"), "60");
        s.stop().await;
    })
    .await;
}

/// `/v1/peek` answers what a check would, and changes nothing: neither the counters of the
/// limits nor the rule statistics.
#[tokio::test]
async fn peek_does_not_consume() {
    bounded(async {
        let s = Server::start(EDGE).await;
        let peek = "/v1/peek/edge_proxy_per_ip?remote_address=10.0.0.9";
        let check = "/v1/check/edge_proxy_per_ip?remote_address=10.0.0.9";
        for _ in 0..20 {
            let r = s.get(peek).await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(r.header("ratelimit-remaining"), "9");
        }
        assert!(s.engine.is_empty());
        for _ in 0..10 {
            assert_eq!(s.get(check).await.status, StatusCode::OK);
        }
        let before = s.engine.stats().snapshot();
        for _ in 0..5 {
            let r = s.get(peek).await;
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(r.header("retry-after"), "1");
        }
        let r = s
            .post_json(
                "/v1/peek",
                &json!({"domain": "edge_proxy_per_ip", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.9"}]}]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(s.engine.stats().snapshot(), before);
        s.clock.advance(Duration::from_secs(1));
        assert_eq!(s.get(peek).await.header("ratelimit-remaining"), "9");
        s.stop().await;
    })
    .await;
}

/// `/json` answers the protojson of upstream's response: `currentLimit.name` is the rule's
/// `name` (src/config/config_impl.go sets `Limit.Name`), absent for a rule without one.
#[tokio::test]
async fn json_names_the_rule() {
    bounded(async {
        let yaml = "domain: n\ndescriptors:\n  - key: a\n    rate_limit: { name: per_a, unit: second, requests_per_unit: 5 }\n  - key: b\n    rate_limit: { unit: second, requests_per_unit: 5 }\n";
        let s = Server::start(yaml).await;
        let body = json!({"domain": "n", "descriptors": [
            {"entries": [{"key": "a", "value": "1"}]},
            {"entries": [{"key": "b", "value": "1"}]},
        ]});
        let r = s.post_json("/json", &body).await.json();
        assert_eq!(r["statuses"][0]["currentLimit"]["name"], "per_a");
        assert!(r["statuses"][1]["currentLimit"].get("name").is_none(), "{r}");
        s.stop().await;
    })
    .await;
}

/// `/metrics` parses, counts every decision by rule and outcome, and its latency histogram
/// holds one observation per decided request of each API.
#[tokio::test]
async fn metrics_count_the_decisions() {
    bounded(async {
        let s = Server::start(EDGE).await;
        for _ in 0..12 {
            s.post_json("/json", &ip("10.0.0.1")).await;
        }
        for _ in 0..3 {
            s.get("/v1/check/edge_proxy_per_ip?user=dave").await;
            s.get("/v1/peek/edge_proxy_per_ip?user=dave").await;
        }
        s.post_json("/json", &json!({"domain": ""})).await;
        let m = s.metrics().await;
        let rule = |r: &str, code: &str| {
            m.get(
                "sluice_rule_decisions_total",
                &[("domain", "edge_proxy_per_ip"), ("rule", r), ("code", code)],
            )
        };
        assert_eq!(rule("remote_address", "ok"), Some(10.0));
        assert_eq!(rule("remote_address", "over_limit"), Some(2.0));
        // Shadowed: answered ok, the third counted in shadow_mode (peeks count nothing).
        assert_eq!(rule("user", "ok"), Some(3.0));
        let hits = |r: &str, outcome: &str| {
            m.get(
                "sluice_rule_hits_total",
                &[
                    ("domain", "edge_proxy_per_ip"),
                    ("rule", r),
                    ("outcome", outcome),
                ],
            )
        };
        assert_eq!(hits("user", "shadow_mode"), Some(1.0));
        let shadow = m.get(
            "sluice_rule_shadow_decisions_total",
            &[("domain", "edge_proxy_per_ip"), ("rule", "user")],
        );
        assert_eq!(shadow, Some(1.0), "one shadowed decision");
        assert_eq!(hits("user", "within_limit"), Some(2.0));
        assert_eq!(hits("remote_address", "over_limit"), Some(2.0));
        // The same under envoyproxy/ratelimit's own names (its statsd exporter mapping,
        // src/prometheusstats/default_mapper.yaml): 12 hits on 10 a second, the 9th and 10th
        // above 80 % (near_limit), 2 over.
        let upstream = |stat: &str, key1: &str| {
            m.get(
                &format!("ratelimit_service_rate_limit_{stat}"),
                &[("domain", "edge_proxy_per_ip"), ("key1", key1)],
            )
        };
        assert_eq!(upstream("total_hits", "remote_address"), Some(12.0));
        assert_eq!(upstream("within_limit", "remote_address"), Some(10.0));
        assert_eq!(upstream("near_limit", "remote_address"), Some(2.0));
        assert_eq!(upstream("over_limit", "remote_address"), Some(2.0));
        assert_eq!(upstream("shadow_mode", "user"), Some(1.0));
        let requests = |api: &str, answer: &str| {
            m.get("sluice_requests_total", &[("api", api), ("answer", answer)])
        };
        assert_eq!(requests("json", "ok"), Some(10.0));
        assert_eq!(requests("json", "over_limit"), Some(2.0));
        assert_eq!(requests("json", "invalid"), Some(1.0));
        assert_eq!(requests("check", "ok"), Some(3.0));
        assert_eq!(requests("peek", "ok"), Some(3.0));
        let count = |api: &str| m.get("sluice_decision_duration_seconds_count", &[("api", api)]);
        assert_eq!(count("json"), Some(12.0));
        assert_eq!(count("check"), Some(3.0));
        assert_eq!(count("peek"), Some(3.0));
        assert_eq!(count("grpc"), Some(0.0));
        let inf = m.get(
            "sluice_decision_duration_seconds_bucket",
            &[("api", "json"), ("le", "+Inf")],
        );
        assert_eq!(inf, Some(12.0));
        assert_eq!(m.get("sluice_engine_keys", &[]), Some(2.0));
        // A node alone.
        assert_eq!(
            m.get("sluice_cluster_lease", &[("state", "none")]),
            Some(1.0)
        );
        assert_eq!(
            m.get("sluice_cluster_lease", &[("state", "valid")]),
            Some(0.0)
        );
        assert_eq!(m.get("sluice_cluster_default_share", &[]), Some(1.0));
        s.stop().await;
    })
    .await;
}

/// A cluster's status, and how many keys it was last asked to list.
#[derive(Debug)]
struct FakeCluster(Mutex<ClusterStatus>, std::sync::atomic::AtomicUsize);

impl FakeCluster {
    fn new(s: ClusterStatus) -> Self {
        Self(
            Mutex::new(s),
            std::sync::atomic::AtomicUsize::new(usize::MAX - 1),
        )
    }

    fn listed(&self) -> usize {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl ClusterInfo for FakeCluster {
    fn status(&self, keys: usize) -> ClusterStatus {
        self.1.store(keys, std::sync::atomic::Ordering::Relaxed);
        self.0.lock().unwrap().clone()
    }
}

fn clustered() -> ClusterStatus {
    let mut s = ClusterStatus::single();
    s.node_id = 2;
    s.lifecycle = "active".into();
    s.lease = "valid".into();
    s.members = vec![
        MemberStatus {
            id: 1,
            addr: Some("127.0.0.1:7001".into()),
            host: None,
            resolve_error: None,
            weight: 0.5,
            link: "up".into(),
            incarnation: 1,
            voter: true,
            discovered: Some("peers".into()),
            wire_version: 13,
        },
        MemberStatus {
            id: 3,
            addr: Some("127.0.0.1:7003".into()),
            host: None,
            resolve_error: None,
            weight: 0.5,
            link: "down".into(),
            incarnation: 0,
            voter: false,
            discovered: Some("gossip:1".into()),
            wire_version: 12,
        },
    ];
    s.default_share = 1.0 / 3.0;
    s.keys = vec![KeyShareStatus {
        key: "00000000deadbeef".into(),
        domain: Some("api".into()),
        rule: Some("tenant".into()),
        share: 0.25,
        limit: 25,
        global_limit: 100,
        demand: 0.3,
    }];
    s.peer.messages_sent = 7;
    s.peer.bytes_sent = 700;
    s.peer.rejected_unauthenticated = 1;
    s.peer.rejected_membership = 2;
    s.peers_unresolved = 1;
    s.peer.unaddressed = 3;
    s.audit_rounds = 4;
    s.incarnation_conflicts = 2;
    s.node_id_redraws = 1;
    s.audit_minted_share = 0.125;
    s
}

/// Health, readiness (the flag, then the cluster's lease and lifecycle) and `/v1/cluster`.
#[tokio::test]
async fn health_readiness_and_cluster_status() {
    bounded(async {
        let s = Server::start(EDGE).await;
        assert_eq!(s.get("/healthz").await.status, StatusCode::OK);
        // envoyproxy/ratelimit's path (its src/server/server_impl.go serves /healthcheck).
        assert_eq!(s.get("/healthcheck").await.status, StatusCode::OK);
        assert_eq!(s.get("/readyz").await.status, StatusCode::OK);
        s.state.set_ready(false);
        let r = s.get("/readyz").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(s.get("/healthz").await.status, StatusCode::OK);
        let c = s.get("/v1/cluster").await.json();
        assert_eq!(c["lifecycle"], "single");
        assert_eq!(c["lease"], "none");
        s.stop().await;

        let fake = Arc::new(FakeCluster::new(clustered()));
        let s = Server::start_with(EDGE, Some(fake.clone())).await;
        assert_eq!(s.get("/readyz").await.status, StatusCode::OK);
        // A probe lists no key: it must not walk them under the driver's lock.
        assert_eq!(fake.listed(), 0);
        let c = s.get("/v1/cluster").await.json();
        assert_eq!(c, serde_json::to_value(clustered()).unwrap());
        assert_eq!(fake.listed(), sluice_server::status::LISTED_KEYS);
        s.get("/v1/cluster?keys=all").await;
        assert_eq!(fake.listed(), usize::MAX);
        s.get("/v1/cluster?keys=7").await;
        assert_eq!(fake.listed(), 7);
        let r = s.get("/v1/cluster?keys=many").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(r.body.contains("keys must be"), "{}", r.body);
        let m = s.metrics().await;
        assert_eq!(
            m.get("sluice_cluster_lease", &[("state", "valid")]),
            Some(1.0)
        );
        assert_eq!(
            m.get("sluice_cluster_lifecycle", &[("state", "active")]),
            Some(1.0)
        );
        assert_eq!(m.get("sluice_cluster_peers_unresolved", &[]), Some(1.0));
        assert_eq!(m.get("sluice_peer_unaddressed_total", &[]), Some(3.0));
        assert_eq!(
            m.get("sluice_cluster_link", &[("peer", "3"), ("state", "down")]),
            Some(1.0)
        );
        assert_eq!(
            m.get("sluice_cluster_link", &[("peer", "1"), ("state", "down")]),
            Some(0.0)
        );
        assert_eq!(
            m.get("sluice_cluster_peer_wire_version", &[("peer", "3")]),
            Some(12.0)
        );
        // This node's share per key, and per rule (named as the decision series name it).
        let labels = [
            ("key", "00000000deadbeef"),
            ("domain", "api"),
            ("rule", "tenant"),
        ];
        assert_eq!(m.get("sluice_cluster_share", &labels), Some(0.25));
        assert_eq!(
            m.sum(
                "sluice_cluster_share",
                &[("domain", "api"), ("rule", "tenant")]
            ),
            0.25
        );
        assert_eq!(m.get("sluice_cluster_limit", &labels), Some(25.0));
        assert_eq!(
            m.get("sluice_peer_messages_total", &[("direction", "sent")]),
            Some(7.0)
        );
        assert_eq!(
            m.get("sluice_peer_bytes_total", &[("direction", "sent")]),
            Some(700.0)
        );
        assert_eq!(
            m.get(
                "sluice_peer_rejected_total",
                &[("reason", "unauthenticated")]
            ),
            Some(1.0)
        );
        assert_eq!(
            m.get("sluice_peer_rejected_total", &[("reason", "membership")]),
            Some(2.0)
        );
        // The capacity audits this node ran as their root, and what they minted again.
        assert_eq!(m.get("sluice_cluster_audit_rounds_total", &[]), Some(4.0));
        assert_eq!(
            m.get("sluice_cluster_incarnation_conflicts_total", &[]),
            Some(2.0)
        );
        assert_eq!(
            m.get("sluice_cluster_node_id_redraws_total", &[]),
            Some(1.0)
        );
        assert_eq!(m.get("sluice_cluster_audit_minted_share", &[]), Some(0.125));
        fake.0.lock().unwrap().lease = "expired".into();
        let r = s.get("/readyz").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.body.contains("expired"), "{}", r.body);
        fake.0.lock().unwrap().lease = "expiring".into();
        assert_eq!(s.get("/readyz").await.status, StatusCode::OK);
        fake.0.lock().unwrap().lifecycle = "leaving".into();
        assert_eq!(
            s.get("/readyz").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        s.stop().await;
    })
    .await;
}

/// The gRPC shell records into the same metrics when given them.
#[tokio::test]
async fn grpc_decisions_show_in_the_same_metrics() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    bounded(async {
        let s = Server::start(EDGE).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let grpc = tokio::spawn(sluice_server::grpc::run_with(
            listener,
            Arc::clone(&s.engine),
            s.clock.clone(),
            Some(s.state.metrics()),
            async {
                let _ = stopped.await;
            },
        ));
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let request = |domain: &str| RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: "10.1.1.1".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        for _ in 0..11 {
            client
                .should_rate_limit(request("edge_proxy_per_ip"))
                .await
                .unwrap();
        }
        assert!(client.should_rate_limit(request("")).await.is_err());
        let m = s.metrics().await;
        let requests = |answer: &str| {
            m.get(
                "sluice_requests_total",
                &[("api", "grpc"), ("answer", answer)],
            )
        };
        assert_eq!(requests("ok"), Some(10.0));
        assert_eq!(requests("over_limit"), Some(1.0));
        assert_eq!(requests("invalid"), Some(1.0));
        assert_eq!(
            m.get("sluice_decision_duration_seconds_count", &[("api", "grpc")]),
            Some(11.0)
        );
        drop(client);
        stop.send(()).unwrap();
        grpc.await.unwrap().unwrap();
        s.stop().await;
    })
    .await;
}

/// A parsed OpenMetrics text exposition: samples by name and sorted labels.
struct Metrics {
    samples: BTreeMap<(String, Vec<(String, String)>), f64>,
}

impl Metrics {
    /// Parses `text`, failing the test on anything that is not a comment, a sample of a
    /// declared family, or the final `# EOF`.
    fn parse(text: &str) -> Self {
        assert!(text.ends_with("# EOF\n"), "no EOF marker");
        let mut families = Vec::new();
        let mut samples = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                families.push(name.to_owned());
                continue;
            }
            if line.starts_with("# ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), Vec::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').unwrap();
                    let mut labels: Vec<(String, String)> = body
                        .split("\",")
                        .map(|kv| {
                            let (k, v) = kv.split_once("=\"").unwrap();
                            (k.to_owned(), v.trim_end_matches('"').to_owned())
                        })
                        .collect();
                    labels.sort();
                    (name.to_owned(), labels)
                }
            };
            assert!(
                families.iter().any(|f| name.starts_with(f.as_str())),
                "sample {name} of no declared family"
            );
            assert!(
                samples.insert((name, labels), value).is_none(),
                "duplicate series {line}"
            );
        }
        Self { samples }
    }

    /// The sample of `name` with exactly these labels.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        self.samples.get(&(name.to_owned(), labels)).copied()
    }

    /// The sum of the samples of `name` that have these labels (and any others).
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}
