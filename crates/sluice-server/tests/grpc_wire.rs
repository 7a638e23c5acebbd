//! The worker threads' gRPC connections (`grpc::run_on_workers`, as `sluice serve` runs:
//! plain `ShouldRateLimit` calls answered on h2 directly, or on Sluice's own HTTP/2 with
//! `Http2Stack::Own`) answer byte for byte as tonic's
//! server (`grpc::run_with_clock`): the same calls, sent as raw HTTP/2 streams to both,
//! get the same status, headers (but hyper's `date`), message bytes and trailers — plain
//! calls, over-limit answers, errors, and every case the direct path hands to tonic.

// Tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use sluice_limits::ManualClock;
use sluice_server::grpc::{GrpcOptions, Http2Stack, ResponseHeaders};
use sluice_server::{Config, Engine};
use tokio::sync::oneshot;

/// Start of a unix day plus 250 ms, in nanoseconds.
const T0: u64 = 1_700_006_400 * 1_000_000_000 + 250_000_000;
const BOUND: Duration = Duration::from_secs(30);
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

struct Server {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), sluice_server::grpc::ServeError>>,
}

async fn start_with(yaml: &str, workers: bool, options: GrpcOptions) -> Server {
    let engine = Arc::new(Engine::new(Config::from_yaml("test.yaml", yaml).unwrap()));
    let clock = Arc::new(ManualClock::new(T0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stopped.await;
    };
    let done = if workers {
        tokio::spawn(sluice_server::grpc::run_on_workers(
            listener,
            std::num::NonZeroUsize::MIN,
            engine,
            clock,
            None,
            options,
            stopped,
        ))
    } else {
        tokio::spawn(sluice_server::grpc::run_with_options(
            listener, engine, clock, None, options, stopped,
        ))
    };
    Server { addr, stop, done }
}

/// One call as the client sends it: path, extra headers, DATA frames, trailers.
#[derive(Clone)]
struct Call {
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    frames: Vec<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Call {
    fn of(body: Bytes) -> Self {
        Self {
            path: PATH,
            headers: Vec::new(),
            frames: vec![body],
            trailers: None,
        }
    }
}

/// What came back, `date` left out (hyper adds the time of day).
#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    trailers: Vec<(String, Vec<u8>)>,
}

fn listed(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = h
        .iter()
        .filter(|(k, _)| k.as_str() != "date")
        .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    v.sort();
    v
}

async fn exchange(addr: std::net::SocketAddr, call: Call) -> Answer {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = http::Request::post(format!("http://{addr}{}", call.path))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in &call.headers {
        request = request.header(*k, *v);
    }
    let (response, mut send) = client
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    // The server may answer (and close the stream) before the call's last frame; sending
    // stops there, and the answer is compared all the same.
    let n = call.frames.len();
    let mut open = true;
    for (i, f) in call.frames.into_iter().enumerate() {
        open = send
            .send_data(f, i + 1 == n && call.trailers.is_none())
            .is_ok();
        if !open {
            break;
        }
    }
    if let (true, Some(t)) = (open, call.trailers) {
        let _ = send.send_trailers(t);
    }
    let (head, mut body) = response.await.unwrap().into_parts();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    Answer {
        status: head.status.as_u16(),
        headers: listed(&head.headers),
        body: bytes,
        trailers: listed(&trailers),
    }
}

/// A length-delimited protobuf field (`tag` is the field number).
fn field(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![tag << 3 | 2];
    let mut len = value.len();
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(value);
    out
}

/// `message` in a gRPC frame (`flag` 1: said to be compressed).
fn framed(flag: u8, message: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(flag);
    b.put_u32(message.len() as u32);
    b.put_slice(message);
    b.freeze()
}

fn rate_limit_request(domain: &str, address: &str) -> Vec<u8> {
    let entry = [field(1, b"remote_address"), field(2, address.as_bytes())].concat();
    [field(1, domain.as_bytes()), field(2, &field(1, &entry))].concat()
}

/// The calls both servers get, in this order (their counters move alike).
fn calls() -> Vec<(&'static str, Call)> {
    let d = "edge_proxy_per_ip";
    let valid = rate_limit_request(d, "50.0.0.1");
    let plain = framed(0, &valid);
    let mut split = Call::of(plain.slice(..7));
    split.frames.push(plain.slice(7..));
    let mut trailers = HeaderMap::new();
    trailers.insert("x-extra", HeaderValue::from_static("1"));
    let mut with_trailers = Call::of(plain.clone());
    with_trailers.trailers = Some(trailers);
    let mut gzip = Call::of(plain.clone());
    gzip.headers.push(("grpc-encoding", "gzip"));
    let mut identity = Call::of(plain.clone());
    identity.headers.push(("grpc-encoding", "identity"));
    let mut timeout = Call::of(plain.clone());
    timeout.headers.push(("grpc-timeout", "20m"));
    let mut health = Call::of(framed(0, &[]));
    health.path = "/grpc.health.v1.Health/Check";
    let mut unknown = Call::of(plain.clone());
    unknown.path = "/envoy.service.ratelimit.v3.RateLimitService/Nope";
    let two = [plain.clone(), plain.clone()].concat();
    let big = framed(0, &vec![0u8; (4 << 20) + 1]);
    let mut out = vec![("plain", Call::of(plain.clone()))];
    // Up to the limit of 10 per second, and over it.
    for _ in 0..11 {
        out.push(("plain, counted", Call::of(plain.clone())));
    }
    out.extend([
        (
            "other address",
            Call::of(framed(0, &rate_limit_request(d, "50.0.0.2"))),
        ),
        (
            "unknown domain",
            Call::of(framed(0, &rate_limit_request("nope", "1"))),
        ),
        (
            "empty domain",
            Call::of(framed(0, &rate_limit_request("", "1"))),
        ),
        (
            "no descriptors",
            Call::of(framed(0, &field(1, d.as_bytes()))),
        ),
        ("not protobuf", Call::of(framed(0, &[0xff; 64]))),
        ("truncated frame", Call::of(plain.slice(..plain.len() - 2))),
        ("flag compressed", Call::of(framed(1, &valid))),
        ("two messages", Call::of(Bytes::from(two))),
        ("empty body", Call::of(Bytes::new())),
        ("split in two frames", split),
        ("request trailers", with_trailers),
        ("grpc-encoding gzip", gzip),
        ("grpc-encoding identity", identity),
        ("grpc-timeout", timeout),
        ("health check", health),
        ("unknown method", unknown),
        ("over 4 MiB", Call::of(big)),
    ]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_connections_answer_as_tonic_byte_for_byte() {
    same_answers(GrpcOptions::default()).await;
}

/// The same with the answering options: the reset to the nanosecond, shadow and quota mode
/// (answers the direct path encodes itself), and response headers (answers it encodes with
/// prost). (Not dynamic metadata: a `Struct`'s fields are a hash map, whose order differs
/// from one map to the next, tonic's answers included.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_connections_answer_as_tonic_byte_for_byte_with_options() {
    same_answers(GrpcOptions {
        subsecond_reset: true,
        shadow_mode: true,
        quota_mode: true,
        ..GrpcOptions::default()
    })
    .await;
    same_answers(GrpcOptions {
        shadow_mode: true,
        ..GrpcOptions::default()
    })
    .await;
    same_answers(GrpcOptions {
        response_headers: Some(ResponseHeaders::default()),
        ..GrpcOptions::default()
    })
    .await;
}

async fn same_answers(options: GrpcOptions) {
    tokio::time::timeout(BOUND, async {
        let yaml = support::EXAMPLES[2].yaml;
        let tonic = start_with(yaml, false, options.clone()).await;
        let h2 = GrpcOptions {
            http2: Http2Stack::H2,
            ..options.clone()
        };
        let direct = start_with(yaml, true, h2).await;
        let own = start_with(
            yaml,
            true,
            GrpcOptions {
                http2: Http2Stack::Own,
                ..options
            },
        )
        .await;
        for (what, call) in calls() {
            let a = exchange(tonic.addr, call.clone()).await;
            let b = exchange(direct.addr, call.clone()).await;
            assert_eq!(
                b, a,
                "{what}: the worker connection (h2) answered otherwise than tonic"
            );
            let c = exchange(own.addr, call).await;
            assert_eq!(
                c, a,
                "{what}: the worker connection (own HTTP/2) answered otherwise than tonic"
            );
        }
        for s in [tonic, direct, own] {
            s.stop.send(()).unwrap();
            s.done.await.unwrap().unwrap();
        }
    })
    .await
    .expect("within the bound");
}

/// Many calls in flight on one connection, across two connections: each answered once,
/// and the limit holds (10 per second per address, at one instant of the manual clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_calls_are_each_answered_once_within_the_limit() {
    for http2 in [Http2Stack::H2, Http2Stack::Own] {
        pipelined_calls(http2).await;
    }
}

async fn pipelined_calls(http2: Http2Stack) {
    tokio::time::timeout(BOUND, async {
        let options = GrpcOptions {
            http2,
            ..GrpcOptions::default()
        };
        let s = start_with(support::EXAMPLES[2].yaml, true, options).await;
        let plain = framed(0, &rate_limit_request("edge_proxy_per_ip", "50.0.0.9"));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..2 {
            let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
            let (client, connection) = h2::client::handshake(tcp).await.unwrap();
            tokio::spawn(async move {
                let _ = connection.await;
            });
            for _ in 0..100 {
                let (mut client, plain, addr) = (client.clone(), plain.clone(), s.addr);
                tasks.spawn(async move {
                    client = client.ready().await.unwrap();
                    let request = http::Request::post(format!("http://{addr}{PATH}"))
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let (response, mut send) = client.send_request(request, false).unwrap();
                    send.send_data(plain, true).unwrap();
                    let (_, mut body) = response.await.unwrap().into_parts();
                    let mut bytes = Vec::new();
                    while let Some(chunk) = body.data().await {
                        bytes.extend_from_slice(&chunk.unwrap());
                    }
                    let trailers = body.trailers().await.unwrap().unwrap();
                    assert_eq!(trailers["grpc-status"], "0");
                    // RateLimitResponse.overall_code (field 1): 1 OK, 2 OVER_LIMIT.
                    assert_eq!(bytes[5], 0x08, "{bytes:?}");
                    bytes[6]
                });
            }
        }
        let mut ok = 0;
        let mut over = 0;
        while let Some(code) = tasks.join_next().await {
            match code.unwrap() {
                1 => ok += 1,
                2 => over += 1,
                c => panic!("overall code {c}"),
            }
        }
        assert_eq!((ok, over), (10, 190));
        s.stop.send(()).unwrap();
        s.done.await.unwrap().unwrap();
    })
    .await
    .expect("within the bound");
}

/// A peer that sends calls and never reads their answers (on Sluice's own HTTP/2): once
/// what it leaves unread passes the connection's bound, the server reads no more of its
/// calls — its writes stall after a bounded amount, not after all it would send — and
/// another connection on the same worker thread is still answered. (The answers' DATA soon
/// waits for the window the peer never grants, its streams stay open, and further calls are
/// refused: RST_STREAM frames are then what piles up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_is_bounded_and_others_are_served() {
    use sluice_http2::frame;
    use tokio::io::AsyncWriteExt as _;

    tokio::time::timeout(BOUND, async {
        let options = GrpcOptions {
            http2: Http2Stack::Own,
            ..GrpcOptions::default()
        };
        let s = start_with(support::EXAMPLES[2].yaml, true, options).await;
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        sluice_http2::hpack::encode_literal(&mut block, 4, b"", PATH.as_bytes());
        sluice_http2::hpack::encode_literal(&mut block, 31, b"", b"application/grpc");
        let message = framed(0, &rate_limit_request("edge_proxy_per_ip", "50.0.0.7"));
        // Calls of 1,000 streams at a time, written until a write stalls for a second.
        let mut hog = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let mut preface = sluice_http2::server::PREFACE.to_vec();
        frame::put_settings(&mut preface, &[]);
        hog.write_all(&preface).await.unwrap();
        let (mut sent, mut next_id, mut stalled) = (0usize, 1u32, false);
        const MAX_SENT: usize = 256 << 20;
        while sent < MAX_SENT {
            let mut batch = Vec::with_capacity(1000 * 128);
            for _ in 0..1000 {
                frame::put_headers(&mut batch, next_id, &block, 16_384, false);
                frame::put_data(&mut batch, next_id, &message, 16_384);
                next_id += 2;
            }
            match tokio::time::timeout(Duration::from_secs(1), hog.write_all(&batch)).await {
                Ok(written) => written.unwrap(),
                Err(_) => {
                    stalled = true;
                    break;
                }
            }
            sent += batch.len();
        }
        assert!(
            stalled,
            "the server took {sent} bytes of calls whose answers were never read"
        );
        // The same worker still answers another connection.
        let answer = exchange(s.addr, Call::of(message.clone())).await;
        assert_eq!(answer.status, 200);
        assert_eq!(
            answer.trailers,
            vec![("grpc-status".to_owned(), b"0".to_vec())]
        );
        drop(hog);
        s.stop.send(()).unwrap();
        s.done.await.unwrap().unwrap();
    })
    .await
    .expect("within the bound");
}
