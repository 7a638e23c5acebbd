//! envoyproxy/ratelimit's service answer, over gRPC and its HTTP `/json`, with the global
//! settings that shape it. The upstream code ported:
//! - src/service/ratelimit.go, `shouldRateLimitWorker`: global `SHADOW_MODE` turns only
//!   the overall code from OVER_LIMIT to OK (`if finalCode == OVER_LIMIT &&
//!   globalShadowMode`), after the statuses, the response headers (`minimumDescriptor`) and
//!   before the dynamic metadata, and counts it in `GlobalShadowMode`; a descriptor's own
//!   `limit` override is no exception. Its service test `TestServiceGlobalShadowMode`
//!   (test/service/ratelimit_test.go) expects the OVER_LIMIT status kept and
//!   `global_shadow_mode` at 1.
//! - src/stats/manager_impl.go, `NewServiceStats`: `global_shadow_mode` in the service
//!   scope (`ratelimit.service.global_shadow_mode`).
//! - src/server/server_impl.go, `NewJsonHandler`: `/json` calls the same
//!   `ShouldRateLimit` as gRPC and writes the whole `RateLimitResponse` with
//!   `protojson.Marshal`, 429 when its overall code is OVER_LIMIT.
#![allow(clippy::unwrap_used)]

mod conformance;

use std::sync::Arc;

use bytes::Bytes;
use conformance::{Server, T0, bounded, brief, over, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sluice_limits::ManualClock;
use sluice_server::grpc::{GrpcOptions, ResponseHeaders};
use sluice_server::http::{HttpState, go_float, proto_response_json};
use sluice_server::{Config, Engine};

/// Two rules with metadata; `two` is listed first in the requests, so it reaches 0 left
/// before `one` goes over: upstream's headers then describe `one` (the last descriptor over
/// its limit), not the first with the fewest left.
const SVC: &str = "
domain: svc
descriptors:
  - key: one
    rate_limit: { unit: minute, requests_per_unit: 1 }
    metadata: { pool: a }
  - key: two
    rate_limit: { unit: hour, requests_per_unit: 2 }
    metadata: { pool: b, ratio: 0.5, weight: 2 }
";

const PAIR: &[&[(&str, &str)]] = &[&[("two", "y")], &[("one", "x")]];

fn engine() -> Engine {
    Engine::new(Config::from_yaml("svc.yaml", SVC).unwrap())
}

fn options(shadow_mode: bool) -> GrpcOptions {
    GrpcOptions {
        shadow_mode,
        response_dynamic_metadata: true,
        response_headers: Some(ResponseHeaders::default()),
        ..GrpcOptions::default()
    }
}

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

/// src/service/ratelimit.go `shouldRateLimitWorker` (global shadow mode after the statuses
/// and `minimumDescriptor`), test/service/ratelimit_test.go `TestServiceGlobalShadowMode`.
#[tokio::test]
async fn global_shadow_mode_turns_only_the_overall_code_ok() {
    bounded(async {
        let mut s = Server::start_with(engine(), options(true)).await;
        s.ask("svc", PAIR, 1).await;
        let r = s.ask("svc", PAIR, 1).await;
        assert_eq!(r.overall_code, conformance::ok(), "shadowed");
        // The statuses stay as decided: `one` is over its limit.
        assert_eq!(brief(&r.statuses[0]), (conformance::ok(), Some(2), 0));
        assert_eq!(brief(&r.statuses[1]), (over(), Some(1), 0));
        // The headers describe the descriptor over its limit (the last one over), 60 s to
        // the end of the minute (T0 is 0.25 s into it).
        let want = [
            ("RateLimit-Limit", "1"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "60"),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(headers(&r), want);
        // A descriptor's own limit override is shadowed too (upstream has no exception).
        let mut overridden = request("svc", &[&[("three", "z")]], 1);
        overridden.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 0,
            unit: 2, // MINUTE
        });
        let r = s.call(overridden).await;
        assert_eq!(
            (r.overall_code, brief(&r.statuses[0])),
            (conformance::ok(), (over(), Some(0), 0))
        );
        s.stop().await;

        // Without shadow mode the same sequence is refused, with the same statuses.
        let mut s = Server::start_with(engine(), options(false)).await;
        s.ask("svc", PAIR, 1).await;
        let r = s.ask("svc", PAIR, 1).await;
        assert_eq!(r.overall_code, over());
        assert_eq!(brief(&r.statuses[1]), (over(), Some(1), 0));
        s.stop().await;
    })
    .await;
}

struct Http {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Http {
    async fn start(options: GrpcOptions) -> Self {
        let state = HttpState::new(Arc::new(engine()), None)
            .with_clock(Arc::new(ManualClock::new(T0)))
            .with_service_options(options);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(sluice_server::http::run(listener, state, async {
            let _ = stopped.await;
        }));
        Self { addr, stop }
    }

    async fn call(&self, method: http::Method, path: &str, body: String) -> (u16, String) {
        let stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn json(&self) -> (u16, String) {
        let body = json!({"domain": "svc", "hits_addend": 1, "descriptors": [
            {"entries": [{"key": "two", "value": "y"}]},
            {"entries": [{"key": "one", "value": "x"}]},
        ]});
        self.call(http::Method::POST, "/json", body.to_string())
            .await
    }
}

/// src/server/server_impl.go `NewJsonHandler`: the whole `RateLimitResponse` as protojson
/// (statuses as decided, `responseHeadersToAdd`, `dynamicMetadata` with its numbers as Go
/// writes a float64), the HTTP status from the overall code after shadow mode; and the
/// same answer as gRPC's for the same sequence.
#[tokio::test]
async fn json_answers_the_whole_response_grpc_answers() {
    bounded(async {
        let h = Http::start(options(true)).await;
        h.json().await;
        let (status, body) = h.json().await;
        assert_eq!(status, 200, "shadowed: OK, so 200: {body}");
        let want = json!({
            "overallCode": "OK",
            "statuses": [
                {"code": "OK", "currentLimit": {"requestsPerUnit": 2, "unit": "HOUR"},
                 "durationUntilReset": "3600s"},
                {"code": "OVER_LIMIT", "currentLimit": {"requestsPerUnit": 1, "unit": "MINUTE"},
                 "durationUntilReset": "60s"},
            ],
            "responseHeadersToAdd": [
                {"key": "RateLimit-Limit", "value": "1"},
                {"key": "RateLimit-Remaining", "value": "0"},
                {"key": "RateLimit-Reset", "value": "60"},
            ],
            "dynamicMetadata": {
                "descriptors": [{"entries": ["two=y"]}, {"entries": ["one=x"]}],
                "domain": "svc",
                "hitsAddend": 1,
                "metadata": {"pool": "b", "ratio": 0.5, "weight": 2},
            },
        });
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            want,
            "{body}"
        );
        // Go writes a whole float64 without a fraction, and Struct keys sorted.
        assert!(body.contains(r#""hitsAddend":1,"#), "{body}");
        assert!(
            body.contains(r#"{"pool":"b","ratio":0.5,"weight":2}"#),
            "{body}"
        );

        // gRPC answers the same for the same sequence.
        let mut g = Server::start_with(engine(), options(true)).await;
        g.ask("svc", PAIR, 1).await;
        let r = g.ask("svc", PAIR, 1).await;
        assert_eq!(proto_response_json(&r), body);
        g.stop().await;

        // upstream's global_shadow_mode statistic counted the shadowed request.
        let (_, metrics) = h.call(http::Method::GET, "/metrics", String::new()).await;
        assert!(
            metrics.contains("\nratelimit_service_global_shadow_mode 1\n"),
            "{metrics}"
        );
        assert!(
            metrics
                .contains("ratelimit_service_rate_limit_over_limit{domain=\"svc\",key1=\"one\"} 1"),
            "{metrics}"
        );
        h.stop.send(()).unwrap();

        // Without shadow mode: 429, OVER_LIMIT, nothing counted as shadowed.
        let h = Http::start(options(false)).await;
        h.json().await;
        let (status, body) = h.json().await;
        assert_eq!(status, 429, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["overallCode"], "OVER_LIMIT");
        let (_, metrics) = h.call(http::Method::GET, "/metrics", String::new()).await;
        assert!(
            metrics.contains("\nratelimit_service_global_shadow_mode 0\n"),
            "{metrics}"
        );
        h.stop.send(()).unwrap();

        // Off by default: no headers, no metadata.
        let h = Http::start(GrpcOptions::default()).await;
        let (_, body) = h.json().await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v.get("responseHeadersToAdd").is_none() && v.get("dynamicMetadata").is_none());
        h.stop.send(()).unwrap();
    })
    .await;
}

/// Go's protojson writes a `google.protobuf.Value` number as encoding/json writes a
/// float64 (internal/encoding/json `appendFloat`): shortest form, an exponent only below
/// 1e-6 or from 1e21, a negative exponent without leading zero.
#[test]
fn numbers_are_written_as_go_writes_them() {
    for (n, want) in [
        (1.0, "1"),
        (0.5, "0.5"),
        (-2.0, "-2"),
        (123_456_789.0, "123456789"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e-7, "1.5e-7"),
        (0.000_001, "0.000001"),
        (0.0, "0"),
    ] {
        assert_eq!(go_float(n), want, "{n}");
    }
}
