//! The gRPC shell, end to end: a server on 127.0.0.1:0 in this process (`grpc::run_with_clock`,
//! the server `sluice serve` runs on the wall clock), called by Envoy's own generated RLS v3
//! client, answering as envoyproxy/ratelimit's README says it does — every one of its
//! documented examples — and refusing what is not a request it can decode.
//! Time is a `ManualClock` pinned to the start of a unix day, so window edges never move
//! under a test; every test is bounded by a timeout.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use sluice_limits::ManualClock;
use sluice_server::{Config, Engine};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Start of a unix day (so also of a second and a minute) plus 250 ms, in nanoseconds.
const T0: u64 = 1_700_006_400 * 1_000_000_000 + 250_000_000;
/// Every test finishes well within this, or fails.
const BOUND: Duration = Duration::from_secs(20);

/// envoyproxy/ratelimit README, "Example 1" (the table the engine test checks too).
const EXAMPLE_1: &str = support::EXAMPLES[0].yaml;

/// envoyproxy/ratelimit README, "Example 3".
const EXAMPLE_3: &str = support::EXAMPLES[2].yaml;

struct Server {
    engine: Arc<Engine>,
    client: RateLimitServiceClient<Channel>,
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), sluice_server::grpc::ServeError>>,
}

impl Server {
    async fn start(yaml: &str) -> Self {
        Self::start_at(yaml, Arc::new(ManualClock::new(T0))).await
    }

    /// A server deciding at the times of `clock` (the test moves it).
    async fn start_at(yaml: &str, clock: Arc<ManualClock>) -> Self {
        Self::start_with(yaml, clock, None).await
    }

    /// As [`Server::start_at`], on `workers` threads with a runtime each
    /// (`grpc::run_on_workers`, as `sluice serve` runs) if given.
    async fn start_with(
        yaml: &str,
        clock: Arc<ManualClock>,
        workers: Option<std::num::NonZeroUsize>,
    ) -> Self {
        let engine = Arc::new(Engine::new(Config::from_yaml("test.yaml", yaml).unwrap()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let done = match workers {
            None => tokio::spawn(sluice_server::grpc::run_with_clock(
                listener,
                Arc::clone(&engine),
                clock,
                stopped,
            )),
            Some(n) => tokio::spawn(sluice_server::grpc::run_on_workers(
                listener,
                n,
                Arc::clone(&engine),
                clock,
                None,
                sluice_server::grpc::GrpcOptions::default(),
                stopped,
            )),
        };
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        Self {
            engine,
            client,
            addr,
            stop,
            done,
        }
    }

    async fn ask(
        &mut self,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
    ) -> Result<RateLimitResponse, tonic::Status> {
        ask(&mut self.client, domain, descriptors).await
    }

    /// Graceful shutdown: the server returns Ok once told to stop.
    async fn stop(self) {
        drop(self.client);
        self.stop.send(()).unwrap();
        self.done.await.unwrap().unwrap();
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(request(domain, descriptors))
        .await
        .map(tonic::Response::into_inner)
}

/// A status with a limit of `n` per second, `remaining` left, and the window ending
/// 750 ms after `T0`: `1s` on the wire, whole seconds rounded up as envoyproxy/ratelimit.
fn per_second(code: Code, n: u32, remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: n,
            unit: Unit::Second.into(),
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        quota: None,
    }
}

fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok.into(),
        ..Default::default()
    }
}

async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(BOUND, test)
        .await
        .expect("test exceeded its time bound");
}

/// README Example 1: 500 per second for `database=users`; the 501st is OVER_LIMIT, and
/// `database=default` has its own counter.
#[tokio::test]
async fn example_1_ok_until_the_limit_then_over_limit() {
    bounded(async {
        let mut s = Server::start(EXAMPLE_1).await;
        for i in 1..=500u32 {
            let r = s
                .ask("mongo_cps", &[&[("database", "users")]])
                .await
                .unwrap();
            assert_eq!(r.overall_code, i32::from(Code::Ok), "request {i}");
            assert_eq!(r.statuses, [per_second(Code::Ok, 500, 500 - i)]);
        }
        let r = s
            .ask("mongo_cps", &[&[("database", "users")]])
            .await
            .unwrap();
        assert_eq!(r.overall_code, i32::from(Code::OverLimit));
        assert_eq!(r.statuses, [per_second(Code::OverLimit, 500, 0)]);
        let r = s
            .ask("mongo_cps", &[&[("database", "default")]])
            .await
            .unwrap();
        assert_eq!(r.overall_code, i32::from(Code::Ok));
        assert_eq!(r.statuses, [per_second(Code::Ok, 500, 499)]);
        s.stop().await;
    })
    .await;
}

/// README Example 3: 10 per second per address; the listed address is always blocked
/// (`requests_per_unit: 0`); two descriptors in one request are answered one by one and the
/// overall code is OVER_LIMIT if any is.
#[tokio::test]
async fn example_3_per_address_and_blocked_address() {
    bounded(async {
        let mut s = Server::start(EXAMPLE_3).await;
        let d = "edge_proxy_per_ip";
        for _ in 0..10 {
            let r = s
                .ask(d, &[&[("remote_address", "50.0.0.1")]])
                .await
                .unwrap();
            assert_eq!(r.overall_code, i32::from(Code::Ok));
        }
        let r = s
            .ask(d, &[&[("remote_address", "50.0.0.1")]])
            .await
            .unwrap();
        assert_eq!(r.overall_code, i32::from(Code::OverLimit));
        assert_eq!(r.statuses, [per_second(Code::OverLimit, 10, 0)]);

        let r = s
            .ask(
                d,
                &[
                    &[("remote_address", "50.0.0.2")],
                    &[("remote_address", "50.0.0.5")],
                ],
            )
            .await
            .unwrap();
        assert_eq!(r.overall_code, i32::from(Code::OverLimit));
        assert_eq!(
            r.statuses,
            [
                per_second(Code::Ok, 10, 9),
                per_second(Code::OverLimit, 0, 0)
            ]
        );
        s.stop().await;
    })
    .await;
}

/// An unknown domain is not an error in envoyproxy/ratelimit: every descriptor is OK with
/// no limit, and nothing is counted.
#[tokio::test]
async fn unknown_domain_answers_ok_without_limits() {
    bounded(async {
        let mut s = Server::start(EXAMPLE_3).await;
        let r = s
            .ask(
                "nobody",
                &[&[("remote_address", "50.0.0.5")], &[("a", "b")]],
            )
            .await
            .unwrap();
        assert_eq!(r.overall_code, i32::from(Code::Ok));
        assert_eq!(r.statuses, [no_limit(), no_limit()]);
        assert!(s.engine.is_empty());
        s.stop().await;
    })
    .await;
}

/// envoyproxy/ratelimit refuses an empty domain or descriptor list with an error (same
/// messages); the refusal counts nothing.
#[tokio::test]
async fn empty_domain_or_descriptors_is_an_error_and_changes_nothing() {
    bounded(async {
        let mut s = Server::start(EXAMPLE_3).await;
        let e = s
            .ask("", &[&[("remote_address", "50.0.0.1")]])
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.message(), "rate limit domain must not be empty");
        let e = s.ask("edge_proxy_per_ip", &[]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.message(), "rate limit descriptor list must not be empty");
        assert!(s.engine.is_empty());
        // The address still has its whole allowance.
        let r = s
            .ask("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]])
            .await
            .unwrap();
        assert_eq!(r.statuses, [per_second(Code::Ok, 10, 9)]);
        s.stop().await;
    })
    .await;
}

/// Many clients at once, each on its own connection, on one counter: exactly the limit is
/// admitted, never more, however the calls interleave (the window cannot roll: time is
/// pinned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_get_more_than_the_limit() {
    const CLIENTS: usize = 8;
    const EACH: usize = 25;
    bounded(async {
        let s = Server::start(EXAMPLE_1).await;
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let addr = s.addr;
                tokio::spawn(async move {
                    let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
                        .await
                        .unwrap();
                    let mut admitted = 0u32;
                    for _ in 0..EACH {
                        let r = ask(&mut c, "mongo_cps", &[&[("database", "users")]])
                            .await
                            .unwrap();
                        if r.overall_code == i32::from(Code::Ok) {
                            admitted += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += t.await.unwrap();
        }
        // 200 asked, 500 allowed: all admitted; then the same again past the limit.
        assert_eq!(admitted, 200);
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let mut c = s.client.clone();
                tokio::spawn(async move {
                    let mut admitted = 0u32;
                    for _ in 0..(2 * EACH) {
                        let r = ask(&mut c, "mongo_cps", &[&[("database", "users")]])
                            .await
                            .unwrap();
                        if r.overall_code == i32::from(Code::Ok) {
                            admitted += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        for t in tasks {
            admitted += t.await.unwrap();
        }
        // 600 asked in all against a limit of 500.
        assert_eq!(admitted, 500);
        s.stop().await;
    })
    .await;
}

/// Shutdown is graceful: the server returns Ok, and the port no longer answers.
#[tokio::test]
async fn shuts_down_cleanly_and_stops_listening() {
    bounded(async {
        let mut s = Server::start(EXAMPLE_3).await;
        s.ask("edge_proxy_per_ip", &[&[("remote_address", "1.2.3.4")]])
            .await
            .unwrap();
        let addr = s.addr;
        s.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    })
    .await;
}

/// On worker threads, connections spread over the workers share one engine (one limit),
/// the health service answers, an unknown method is UNIMPLEMENTED, and shutdown finishes
/// the calls and stops listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_share_the_limit_and_shut_down_cleanly() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    bounded(async {
        let clock = Arc::new(ManualClock::new(T0));
        let s = Server::start_with(EXAMPLE_3, clock, std::num::NonZeroUsize::new(2)).await;
        // Four connections, handed to the two workers in turn; 10 per second per address.
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(
                RateLimitServiceClient::connect(format!("http://{}", s.addr))
                    .await
                    .unwrap(),
            );
        }
        let mut ok = 0;
        for _ in 0..4 {
            for c in &mut clients {
                let r = ask(c, "edge_proxy_per_ip", &[&[("remote_address", "1.2.3.4")]])
                    .await
                    .unwrap();
                ok += usize::from(r.overall_code == i32::from(Code::Ok));
            }
        }
        assert_eq!(ok, 10, "one limit for every connection");
        let channel = Channel::from_shared(format!("http://{}", s.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel.clone());
        for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
            let r = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.status, i32::from(ServingStatus::Serving), "{service:?}");
        }
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let e = grpc
            .unary::<Vec<u8>, Vec<u8>, _>(
                tonic::Request::new(Vec::new()),
                http::uri::PathAndQuery::from_static("/no.such.Service/Call"),
                Raw,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
        drop((clients, health, grpc));
        let addr = s.addr;
        s.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    })
    .await;
}

/// The protobuf status a documented example's table wants at `now`.
fn wanted(want: support::Want, now: u64) -> DescriptorStatus {
    use sluice_server::Unit as U;
    match want {
        support::NoLimit => no_limit(),
        support::Unlimited => DescriptorStatus {
            code: Code::Ok.into(),
            limit_remaining: u32::MAX,
            ..Default::default()
        },
        support::Limit(code, rpu, unit, remaining) => {
            let left = unit.nanos() - now % unit.nanos();
            DescriptorStatus {
                code: proto_code(code).into(),
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: rpu,
                    unit: match unit {
                        U::Second => Unit::Second,
                        U::Minute => Unit::Minute,
                        U::Hour => Unit::Hour,
                        U::Day => Unit::Day,
                        U::Week => Unit::Week,
                        U::Month => Unit::Month,
                        U::Year => Unit::Year,
                    }
                    .into(),
                }),
                limit_remaining: remaining,
                // Whole seconds, rounded up (envoyproxy/ratelimit's `CalculateReset`).
                duration_until_reset: Some(PbDuration {
                    seconds: left.div_ceil(1_000_000_000) as i64,
                    nanos: 0,
                }),
                quota: None,
            }
        }
    }
}

fn proto_code(code: sluice_server::Code) -> Code {
    match code {
        sluice_server::Code::Ok => Code::Ok,
        sluice_server::Code::OverLimit => Code::OverLimit,
    }
}

/// envoyproxy/ratelimit's documented examples 1–9 (the tables `envoy_examples.rs` runs
/// against the engine) through Envoy's generated client and the gRPC server, answer for
/// answer, field for field.
#[tokio::test]
async fn every_documented_example_through_envoys_grpc_client() {
    every_documented_example(None).await;
}

/// The same on two worker threads with a runtime each, as `sluice serve` serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_example_on_worker_threads() {
    every_documented_example(std::num::NonZeroUsize::new(2)).await;
}

async fn every_documented_example(workers: Option<std::num::NonZeroUsize>) {
    tokio::time::timeout(Duration::from_secs(60), async {
        for ex in support::EXAMPLES {
            let clock = Arc::new(ManualClock::new(support::T0));
            let mut s = Server::start_with(ex.yaml, Arc::clone(&clock), workers).await;
            for (n, step) in ex.steps.iter().enumerate() {
                let now = support::T0 + step.at;
                clock.set(now);
                let mut last = None;
                for _ in 0..step.times {
                    last = Some(s.ask(ex.domain, step.send).await.unwrap());
                }
                let mut r = last.unwrap();
                // The tables give no rule names; upstream_grpc.rs checks that they are sent.
                for s in &mut r.statuses {
                    if let Some(l) = &mut s.current_limit {
                        l.name.clear();
                    }
                }
                assert_eq!(
                    r.overall_code,
                    i32::from(proto_code(step.overall)),
                    "{}, step {n}: {r:?}",
                    ex.name
                );
                let want: Vec<_> = step.last.iter().map(|w| wanted(*w, now)).collect();
                assert_eq!(r.statuses, want, "{}, step {n}", ex.name);
            }
            s.stop().await;
        }
    })
    .await
    .expect("test exceeded its time bound");
}

/// Bytes as they are, in and out: the gRPC framing without protobuf, to send what Envoy's
/// client never would.
#[derive(Debug, Clone, Copy)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf as _;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// `body` as the message of a `ShouldRateLimit` call.
async fn raw_call(addr: std::net::SocketAddr, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(body), path, Raw)
        .await
        .map(tonic::Response::into_inner)
}

/// A length-delimited protobuf field (`tag` is the field number; wire type 2).
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

/// A request larger than the server decodes (tonic's default, 4 MiB) and bodies that are
/// not a `RateLimitRequest` get an error status; the server keeps serving, and none of them
/// counted: the next check sees the count the accepted requests alone leave.
#[tokio::test]
async fn oversized_and_malformed_requests_are_refused_and_change_nothing() {
    bounded(async {
        let mut s = Server::start(EXAMPLE_3).await;
        let d = "edge_proxy_per_ip";
        let ip: &[&[(&str, &str)]] = &[&[("remote_address", "50.0.0.1")]];
        let r = s.ask(d, ip).await.unwrap();
        assert_eq!(r.statuses, [per_second(Code::Ok, 10, 9)]);

        // 200,000 descriptors of the counted address (about 6 MB): decoded, they would take
        // its whole allowance.
        let mut big = request(d, ip);
        big.descriptors = vec![big.descriptors[0].clone(); 200_000];
        let e = s.client.should_rate_limit(big).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
        assert!(e.message().contains("too large"), "{e:?}");

        // The same request as the client above, encoded by hand: accepted on this path.
        let entry = [field(1, b"remote_address"), field(2, b"50.0.0.1")].concat();
        let descriptor = field(1, &entry);
        let valid = [field(1, d.as_bytes()), field(2, &descriptor)].concat();
        raw_call(s.addr, valid.clone()).await.unwrap();
        // Truncated (its last descriptor cut short), garbage, and a field of an undefined
        // wire type: each refused, none decoded in part.
        for body in [
            valid[..valid.len() - 3].to_vec(),
            vec![0xff; 64],
            vec![0x0f, 0x01],
        ] {
            let e = raw_call(s.addr, body.clone()).await.unwrap_err();
            assert_ne!(e.code(), tonic::Code::Ok, "{body:?}");
            assert!(
                e.message().contains("decode"),
                "{body:?} refused with {e:?}"
            );
        }

        // Still serving, and only the two accepted requests counted.
        let r = s.ask(d, ip).await.unwrap();
        assert_eq!(r.statuses, [per_second(Code::Ok, 10, 7)]);
        assert_eq!(s.engine.len(), 1);
        s.stop().await;
    })
    .await;
}
