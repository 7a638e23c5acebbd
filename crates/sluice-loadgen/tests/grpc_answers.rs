//! `sluice bench`'s own HTTP/2 client against a real HTTP/2 server (`h2`'s, on 127.0.0.1)
//! that answers by the request's descriptor value: OK, OVER_LIMIT, a trailers-only
//! InvalidArgument, or never (until the client resets the stream). The server allows 2
//! streams at once (SETTINGS_MAX_CONCURRENT_STREAMS) and counts what it sees: streams in
//! flight at most, and the reset codes of the streams it never answered. Every test is
//! bounded by a timeout.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use parking_lot::Mutex;
use prost::Message as _;
use sluice_loadgen::{self as loadgen, LoadSpec, Stop, Target};
use tokio::net::TcpListener;

/// Streams the server allows at once.
const MAX_STREAMS: u32 = 2;

#[derive(Default)]
struct Seen {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    calls: AtomicUsize,
    resets: Mutex<Vec<h2::Reason>>,
}

/// Serves HTTP/2 on a free port until the test ends.
async fn server() -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let seen = Arc::clone(&s);
            tokio::spawn(async move {
                let mut conn = h2::server::Builder::new()
                    .max_concurrent_streams(MAX_STREAMS)
                    .handshake::<_, Bytes>(socket)
                    .await
                    .unwrap();
                while let Some(Ok((request, respond))) = conn.accept().await {
                    tokio::spawn(answer(request, respond, Arc::clone(&seen)));
                }
            });
        }
    });
    (addr, seen)
}

/// The gRPC frame of `m`.
fn frame(m: &impl prost::Message) -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(&[0]);
    b.extend_from_slice(&u32::try_from(m.encoded_len()).unwrap().to_be_bytes());
    m.encode(&mut b).unwrap();
    b.freeze()
}

async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    seen: Arc<Seen>,
) {
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
    seen.calls.fetch_add(1, Ordering::SeqCst);
    assert_eq!(
        request.uri().path(),
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    assert_eq!(request.headers()["content-type"], "application/grpc");
    assert_eq!(request.headers()["te"], "trailers");
    let mut body = request.into_body();
    let mut bytes = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let req = RateLimitRequest::decode(&bytes[5..]).unwrap();
    let value = req.descriptors[0].entries[0].value.clone();
    // A little work, so that the streams overlap.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let ok = |code: Code| {
        let head = http::Response::builder()
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let msg = frame(&RateLimitResponse {
            overall_code: code.into(),
            ..Default::default()
        });
        (head, msg)
    };
    match value.as_str() {
        "v0" | "v1" | "v3" => {
            let code = if value == "v1" {
                Code::OverLimit
            } else {
                Code::Ok
            };
            let (head, msg) = ok(code);
            let mut send = respond.send_response(head, false).unwrap();
            send.send_data(msg, false).unwrap();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            send.send_trailers(trailers).unwrap();
        }
        "v2" => {
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "3")
                .header("grpc-message", "bad%20request")
                .body(())
                .unwrap();
            respond.send_response(head, true).unwrap();
        }
        _ => {
            // Never answered: wait for the client to give up.
            let reason = std::future::poll_fn(|cx| respond.poll_reset(cx)).await;
            if let Ok(r) = reason {
                seen.resets.lock().push(r);
            }
        }
    }
    seen.in_flight.fetch_sub(1, Ordering::SeqCst);
}

fn spec(value: &str, keys: u64, requests: u64) -> LoadSpec {
    let mut s = LoadSpec::new("bench", vec![vec![("user".into(), value.into())]]);
    s.keys = keys;
    s.stop = Stop::Requests(requests);
    s.concurrency = 8;
    s.connections = Some(1);
    s
}

async fn bounded<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), test)
        .await
        .expect("the test took longer than its bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_over_limit_and_errors_are_counted_within_max_concurrent_streams() {
    bounded(async {
        let (addr, seen) = server().await;
        // Keys v0..v3 in turn: OK, OVER_LIMIT, InvalidArgument, OK.
        let report = loadgen::run(
            &Target::Grpc(vec![addr.to_string()]),
            &spec("v{i}", 4, 400),
            |_| {},
        )
        .await
        .unwrap();
        assert_eq!(report.sent, 400);
        assert_eq!(report.ok, 200, "{report:?}");
        assert_eq!(report.over_limit, 100, "{report:?}");
        assert_eq!(report.errors, 100, "{report:?}");
        assert_eq!(
            report
                .errors_by_reason
                .get("gRPC InvalidArgument: bad request"),
            Some(&100),
            "{report:?}"
        );
        assert_eq!(report.latency_us.unwrap().count, 300);
        // 8 workers on one connection, never more than the server's 2 streams at once
        // (h2 would refuse a third: REFUSED_STREAM, counted as an error above).
        assert_eq!(seen.calls.load(Ordering::SeqCst), 400);
        assert_eq!(
            seen.max_in_flight.load(Ordering::SeqCst),
            MAX_STREAMS as usize
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_reset_their_streams() {
    bounded(async {
        let (addr, seen) = server().await;
        let mut s = spec("hang", 1, 4);
        s.concurrency = 2;
        s.timeout = Duration::from_millis(200);
        let report = loadgen::run(&Target::Grpc(vec![addr.to_string()]), &s, |_| {})
            .await
            .unwrap();
        assert_eq!(report.errors, 4, "{report:?}");
        assert_eq!(
            report.errors_by_reason.get("no answer within 200ms"),
            Some(&4),
            "{report:?}"
        );
        // Each stream given up was reset with CANCEL (and so freed the server's stream
        // slots: with 2 allowed, the 3rd and 4th calls could open).
        for _ in 0..100 {
            if seen.resets.lock().len() == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*seen.resets.lock(), vec![h2::Reason::CANCEL; 4]);
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_that_goes_away_fails_the_calls_cleanly() {
    bounded(async {
        // A server that takes the connection, answers the handshake, then says GOAWAY.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(socket).await.unwrap();
            if let Some(Ok((_request, _respond))) = conn.accept().await {
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                while conn.accept().await.is_some() {}
            }
        });
        let mut s = spec("v0", 1, 5);
        s.concurrency = 1;
        let report = loadgen::run(&Target::Grpc(vec![addr.to_string()]), &s, |_| {})
            .await
            .unwrap();
        assert_eq!(report.errors, 5, "{report:?}");
        assert!(
            report
                .errors_by_reason
                .keys()
                .all(|r| r.contains("GOAWAY ENHANCE_YOUR_CALM")),
            "{report:?}"
        );
    })
    .await;
}
