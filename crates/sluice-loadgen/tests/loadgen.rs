//! The load generator end to end, on 127.0.0.1 only: against real in-process gRPC servers
//! (`sluice_server::grpc`, time pinned by a `ManualClock` so no window rolls during a test,
//! which makes the number of OVER_LIMIT answers exact), and against tiny hyper stubs of the
//! HTTP `POST /json` contract. Every test is bounded by a timeout.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use sluice_limits::ManualClock;
use sluice_loadgen::{self as loadgen, LoadError, LoadSpec, Mode, Progress, Report, Stop, Target};
use sluice_server::{Config, Engine};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Start of a unix day plus 250 ms, in nanoseconds: far from any window edge.
const T0: u64 = 1_700_006_400 * 1_000_000_000 + 250_000_000;
/// Every test finishes well within this, or fails.
const BOUND: Duration = Duration::from_secs(30);

/// `per_second` requests per second for each value of `user`.
fn config(per_second: u32) -> String {
    format!(
        "
domain: bench
descriptors:
  - key: user
    rate_limit: {{ unit: second, requests_per_unit: {per_second} }}
"
    )
}

struct GrpcServer {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), sluice_server::grpc::ServeError>>,
}

impl GrpcServer {
    async fn start(per_second: u32) -> Self {
        let engine = Arc::new(Engine::new(
            Config::from_yaml("bench.yaml", &config(per_second)).unwrap(),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(sluice_server::grpc::run_with_clock(
            listener,
            engine,
            ManualClock::new(T0),
            async {
                let _ = stopped.await;
            },
        ));
        Self { addr, stop, done }
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.done.await.unwrap().unwrap();
    }
}

fn spec(keys: u64, stop: Stop) -> LoadSpec {
    let mut s = LoadSpec::new("bench", vec![vec![("user".into(), "u{i}".into())]]);
    s.keys = keys;
    s.stop = stop;
    s.concurrency = 8;
    s.timeout = Duration::from_secs(5);
    s
}

async fn bounded<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, test)
        .await
        .expect("test exceeded its time bound")
}

/// What every report must satisfy: every request sent ends as exactly one outcome, every
/// answered call has a latency, and the percentiles are in order.
fn assert_consistent(r: &Report) {
    assert_eq!(r.ok + r.over_limit + r.errors, r.sent, "{r:?}");
    assert_eq!(r.errors, r.errors_by_reason.values().sum::<u64>(), "{r:?}");
    for l in [&r.latency_us, &r.service_time_us] {
        let answered = r.ok + r.over_limit;
        match l {
            None => assert_eq!(answered, 0),
            Some(l) => {
                assert_eq!(l.count, answered);
                assert!(0.0 < l.p50, "{l:?}");
                assert!(l.p50 <= l.p90 && l.p90 <= l.p99, "{l:?}");
                assert!(l.p99 <= l.p99_9 && l.p99_9 <= l.max, "{l:?}");
                assert!(l.mean <= l.max, "{l:?}");
            }
        }
    }
    assert!(r.elapsed_s > 0.0);
    assert!(r.throughput > 0.0);
}

/// 400 requests round robin over 4 keys with 50 allowed per key and per second (time is
/// pinned): each key gets 100, so exactly 200 OK and 200 OVER_LIMIT, whatever the order
/// in which the 8 workers' calls arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_counts_match_what_the_limit_implies() {
    bounded(async {
        let server = GrpcServer::start(50).await;
        let target = Target::Grpc(vec![server.addr.to_string()]);
        let r = loadgen::run(&target, &spec(4, Stop::Requests(400)), |_| {})
            .await
            .unwrap();
        assert_consistent(&r);
        assert_eq!((r.sent, r.ok, r.over_limit, r.errors), (400, 200, 200, 0));
        assert_eq!(r.mode, Mode::ClosedLoop);
        assert_eq!(r.protocol, "grpc");
        // Closed loop: the latency is the service time.
        assert_eq!(r.latency_us, r.service_time_us);
        // The JSON form round-trips (serde_json may parse a float one ulp off).
        let json = serde_json::to_string(&r).unwrap();
        let back = serde_json::from_str::<Report>(&json).unwrap();
        assert!(
            same_json(
                &serde_json::to_value(&back).unwrap(),
                &serde_json::to_value(&r).unwrap()
            ),
            "{back:?} != {r:?}"
        );
        server.stop().await;
    })
    .await;
}

/// Shared gRPC connections (HTTP/2 streams) give the same exact counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_shared_connections_count_the_same() {
    bounded(async {
        let server = GrpcServer::start(30).await;
        let target = Target::Grpc(vec![format!("http://{}", server.addr)]);
        let mut s = spec(3, Stop::Requests(300));
        s.connections = Some(2);
        s.concurrency = 16;
        let r = loadgen::run(&target, &s, |_| {}).await.unwrap();
        assert_consistent(&r);
        assert_eq!(r.connections, 2);
        assert_eq!((r.sent, r.ok, r.over_limit, r.errors), (300, 90, 210, 0));
        server.stop().await;
    })
    .await;
}

/// Two addresses are used round robin: two independent nodes with 30 per key each, one
/// key, 100 requests: 50 to each, so 60 OK (one node alone would admit 30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_round_robin_over_addresses() {
    bounded(async {
        let (a, b) = (GrpcServer::start(30).await, GrpcServer::start(30).await);
        let target = Target::Grpc(vec![a.addr.to_string(), b.addr.to_string()]);
        let r = loadgen::run(&target, &spec(1, Stop::Requests(100)), |_| {})
            .await
            .unwrap();
        assert_consistent(&r);
        assert_eq!((r.sent, r.ok, r.over_limit, r.errors), (100, 60, 40, 0));
        a.stop().await;
        b.stop().await;
    })
    .await;
}

/// A duration-bound closed loop reports progress while it runs, and its counts add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_duration_with_progress() {
    bounded(async {
        let server = GrpcServer::start(1000).await;
        let target = Target::Grpc(vec![server.addr.to_string()]);
        let mut s = spec(10, Stop::Duration(Duration::from_millis(400)));
        s.progress_every = Duration::from_millis(100);
        let seen = Arc::new(Mutex::new(Vec::<Progress>::new()));
        let log = Arc::clone(&seen);
        let r = loadgen::run(&target, &s, move |p| log.lock().push(*p))
            .await
            .unwrap();
        assert_consistent(&r);
        assert!(r.sent > 0);
        assert_eq!(r.errors, 0);
        // 10 keys × 1000 per second, time pinned: admitted up to 10,000, then refused.
        assert_eq!(r.ok, r.sent.min(10_000));
        assert!(r.elapsed_s >= 0.4, "{}", r.elapsed_s);
        let seen = seen.lock().clone();
        // Due at 100, 200 and 300 ms; a starved runtime may skip some, never all.
        assert!(!seen.is_empty());
        for w in seen.windows(2) {
            assert!(w[0].elapsed < w[1].elapsed);
            assert!(w[0].sent <= w[1].sent);
        }
        for p in seen.iter() {
            assert!(p.ok + p.over_limit + p.errors <= p.sent, "{p:?}");
        }
        server.stop().await;
    })
    .await;
}

/// Open loop: request n is due at n / rate, so 40 requests at 200/s take at least 195 ms,
/// and the latency counted from the due time is never below the service time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_open_loop_keeps_the_schedule() {
    bounded(async {
        let server = GrpcServer::start(1000).await;
        let target = Target::Grpc(vec![server.addr.to_string()]);
        let mut s = spec(1, Stop::Requests(40));
        s.rate = Some(200.0);
        let r = loadgen::run(&target, &s, |_| {}).await.unwrap();
        assert_consistent(&r);
        assert_eq!(r.mode, Mode::OpenLoop);
        assert_eq!((r.sent, r.ok), (40, 40));
        assert!(r.elapsed_s >= 0.195, "{}", r.elapsed_s);
        let (l, st) = (r.latency_us.unwrap(), r.service_time_us.unwrap());
        assert!(l.p50 >= st.p50 && l.p99 >= st.p99 && l.max >= st.max);
        server.stop().await;
    })
    .await;
}

/// The HTTP stub: envoyproxy/ratelimit's `POST /json` contract with `limit` requests per
/// `user` value, forever (200 until then, 429 after); a malformed request gets 400, a
/// `user` of `fail` gets 500 and `hang` never gets an answer.
async fn http_stub(limit: u64) -> (SocketAddr, Arc<Mutex<HashMap<String, u64>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
    let seen = Arc::clone(&counts);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counts = Arc::clone(&counts);
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let counts = Arc::clone(&counts);
                async move {
                    let well_formed = req.method() == hyper::Method::POST
                        && req.uri().path() == "/json"
                        && req.headers().get(hyper::header::CONTENT_TYPE).is_some();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let user = serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .filter(|v| v["domain"] == "bench")
                        .and_then(|v| {
                            let e = &v["descriptors"][0]["entries"][0];
                            (e["key"] == "user").then(|| e["value"].as_str().map(str::to_owned))
                        })
                        .flatten();
                    let status = match user.as_deref() {
                        _ if !well_formed => 400,
                        None => 400,
                        Some("fail") => 500,
                        Some("hang") => {
                            std::future::pending::<()>().await;
                            500
                        }
                        Some(u) => {
                            let mut c = counts.lock();
                            let n = c.entry(u.to_owned()).or_insert(0);
                            *n += 1;
                            if *n <= limit { 200 } else { 429 }
                        }
                    };
                    Ok::<_, Infallible>(
                        hyper::Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from_static(b"{}")))
                            .unwrap(),
                    )
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// Over HTTP the counts are as exact: 5 keys × 60 requests, 25 allowed per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_counts_match_what_the_limit_implies() {
    bounded(async {
        let (addr, counts) = http_stub(25).await;
        let target = Target::Http(vec![format!("http://{addr}")]);
        let r = loadgen::run(&target, &spec(5, Stop::Requests(300)), |_| {})
            .await
            .unwrap();
        assert_consistent(&r);
        assert_eq!((r.sent, r.ok, r.over_limit, r.errors), (300, 125, 175, 0));
        assert_eq!(r.protocol, "http");
        let counts = counts.lock();
        assert_eq!(counts.len(), 5);
        assert!(counts.values().all(|&n| n == 60), "{counts:?}");
    })
    .await;
}

/// Error answers and unanswered calls are errors, counted by reason; a connection whose
/// call timed out is replaced, so the run still ends on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_errors_and_timeouts_are_counted() {
    bounded(async {
        let (addr, _) = http_stub(1000).await;
        let target = Target::Http(vec![addr.to_string()]);
        let mut s = LoadSpec::new("bench", vec![vec![("user".into(), "fail".into())]]);
        s.stop = Stop::Requests(20);
        s.concurrency = 2;
        let r = loadgen::run(&target, &s, |_| {}).await.unwrap();
        assert_consistent(&r);
        assert_eq!((r.sent, r.errors), (20, 20));
        assert_eq!(
            r.errors_by_reason.get("HTTP 500 Internal Server Error"),
            Some(&20)
        );

        s.descriptors = vec![vec![("user".into(), "hang".into())]];
        s.stop = Stop::Requests(4);
        s.timeout = Duration::from_millis(100);
        let r = loadgen::run(&target, &s, |_| {}).await.unwrap();
        assert_consistent(&r);
        assert_eq!((r.sent, r.errors), (4, 4));
        assert_eq!(r.errors_by_reason.len(), 1, "{:?}", r.errors_by_reason);
        assert!(r.latency_us.is_none());
    })
    .await;
}

/// An address nobody listens on is an error before any load; so is a malformed one.
#[tokio::test]
async fn unreachable_and_bad_addresses_are_errors() {
    bounded(async {
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let s = spec(1, Stop::Requests(1));
        for target in [
            Target::Grpc(vec![closed.to_string()]),
            Target::Http(vec![format!("http://{closed}")]),
        ] {
            let e = loadgen::run(&target, &s, |_| {}).await.unwrap_err();
            assert!(matches!(e, LoadError::Unreachable { .. }), "{e}");
            assert!(e.to_string().contains(&closed.to_string()), "{e}");
        }
        for target in [
            Target::Grpc(vec!["127.0.0.1".into()]),
            Target::Grpc(vec!["https://127.0.0.1:1".into()]),
            Target::Http(vec!["https://127.0.0.1:1".into()]),
            Target::Http(vec![]),
        ] {
            let e = loadgen::run(&target, &s, |_| {}).await.unwrap_err();
            assert!(matches!(e, LoadError::BadAddress { .. }), "{e}");
        }
    })
    .await;
}

/// Equal JSON values, numbers within a relative 1e-12.
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
            _ => x == y,
        },
        (V::Array(x), V::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (V::Object(x), V::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}
