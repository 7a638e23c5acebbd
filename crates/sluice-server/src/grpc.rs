//! The gRPC shell: Envoy RLS v3 (`envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`) over an [`Engine`], on the protobuf types Envoy itself is built from.
//!
//! The shell only translates: the protobuf request becomes a [`Request`], the clock is read
//! once, the engine decides, and its [`Response`] goes back field for field. Every rate
//! limiting rule lives in the engine.
//!
//! [`run`] serves until a shutdown future completes (the caller owns the listener, so tests
//! bind `127.0.0.1:0`), and sweeps idle keys out of the engine while it serves. Beside the
//! rate limit service it serves gRPC health checking (`grpc.health.v1.Health`), as
//! envoyproxy/ratelimit does: `SERVING` for the server (`""`) and for the rate limit
//! service by name, `NOT_SERVING` once shutting down.
//!
//! As envoyproxy/ratelimit, `duration_until_reset` is given in whole seconds, rounded up
//! (exactly `1s` in a per-second window); [`GrpcOptions::subsecond_reset`] keeps the
//! engine's nanoseconds instead.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use envoy_types::pb::google::protobuf::{self as pb_struct, Duration as PbDuration};
use rls::rate_limit_response::{self as pb_response, rate_limit::Unit as PbUnit};
use rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use sluice_limits::{Clock, Nanos};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::config::{Metadata, RateLimit, Unit};
use crate::engine::{
    Code, Descriptor, DescriptorStatus, Engine, Entry, Request, Response, overall_code,
};
use crate::metrics::{Answer, Api, Metrics};

// The service on worker threads with a current-thread runtime each (`sluice serve`).
mod workers;
pub use workers::run_on_workers;
// One connection on h2 directly: plain `ShouldRateLimit` calls answered in its task.
mod connection;
// The same on Sluice's own HTTP/2 (`Http2Stack::Own`).
mod own_http2;
// A plain call's request and answer on the wire, without prost's message types.
mod wire;

/// How often [`run`] forgets idle keys ([`Engine::retain_idle`]): often enough to bound
/// memory under churning keys, rarely enough to cost nothing measurable.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Wall time as nanoseconds since the unix epoch: the engine aligns its windows to it, as
/// envoyproxy/ratelimit does. (Not monotone if the system clock is stepped back; the
/// algorithms then see no time pass.)
#[derive(Debug, Clone, Copy, Default)]
pub struct UnixClock;

impl Clock for UnixClock {
    fn now(&self) -> Nanos {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, sluice_limits::clock::nanos)
    }
}

/// How the gRPC shell answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcOptions {
    /// envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED`: headers for Envoy to add to
    /// the client's response (`response_headers_to_add`), describing the descriptor with
    /// the fewest permits left; `None`: none (the default, as upstream's).
    pub response_headers: Option<ResponseHeaders>,
    /// `duration_until_reset` to the nanosecond (Sluice's opt-in), instead of whole seconds
    /// rounded up as envoyproxy/ratelimit gives it (the default).
    pub subsecond_reset: bool,
    /// envoyproxy/ratelimit's global `SHADOW_MODE`: an overall `OVER_LIMIT` is answered `OK`
    /// (the descriptor statuses, headers and metadata stay as decided; counted in
    /// `ratelimit_service_global_shadow_mode`). See [`service_answer`].
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's global `QUOTA_MODE`: every descriptor but an `unlimited` one
    /// counts as a quota-mode descriptor ([`crate::engine::overall_code`]).
    pub quota_mode: bool,
    /// envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`: responses carry
    /// [`dynamic_metadata`]; off by default, as upstream's.
    pub response_dynamic_metadata: bool,
    /// Whose HTTP/2 the worker threads' connections speak ([`run_on_workers`]); the
    /// answers are the same.
    pub http2: Http2Stack,
}

/// The HTTP/2 under [`run_on_workers`]' gRPC connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Http2Stack {
    /// The `h2` crate (tonic's), with plain calls answered in the connection's task.
    H2,
    /// Sluice's own ([`sluice_http2::server::Connection`]): the same answers for about
    /// half the CPU per call (docs/BENCHMARKS.md).
    #[default]
    Own,
}

/// The names of the rate limit headers sent to Envoy (envoyproxy/ratelimit's
/// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHeaders {
    /// The limit's `requests_per_unit`.
    pub limit: String,
    /// The permits left.
    pub remaining: String,
    /// Whole seconds until the limit resets.
    pub reset: String,
}

impl Default for ResponseHeaders {
    /// Upstream's defaults: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

/// The headers of `names` for envoyproxy/ratelimit's `minimumDescriptor`
/// (`shouldRateLimitWorker` in its `src/service/ratelimit.go`): the status with a limit and
/// the fewest permits left (the first of equals), unless a descriptor not in quota mode is
/// over its limit, when it is the last such descriptor. None when no status has a limit.
/// `global_quota_mode` is upstream's `QUOTA_MODE`.
fn response_headers(
    response: &Response,
    names: &ResponseHeaders,
    global_quota_mode: bool,
) -> Vec<HeaderValue> {
    let mut minimum: Option<&DescriptorStatus> = None;
    let mut min_remaining = u32::MAX;
    for s in &response.statuses {
        if s.current_limit.is_some() && s.limit_remaining < min_remaining {
            minimum = Some(s);
            min_remaining = s.limit_remaining;
        }
        if s.is_unlimited() {
            continue;
        }
        if s.code == Code::OverLimit && !(global_quota_mode || s.quota_mode) {
            minimum = Some(s);
            min_remaining = 0;
        }
    }
    let Some((s, limit)) = minimum.and_then(|s| Some((s, s.current_limit?))) else {
        return Vec::new();
    };
    let reset = s.duration_until_reset.unwrap_or(0).div_ceil(1_000_000_000);
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    };
    vec![
        header(&names.limit, limit.requests_per_unit.to_string()),
        header(&names.remaining, s.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}

/// What the rate limit service answers for a request the engine decided, as
/// envoyproxy/ratelimit's `shouldRateLimitWorker` builds it after its cache's `DoLimit`;
/// gRPC and `/json` both answer this.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceAnswer {
    /// The response, as sent over gRPC (and, as protojson, by `/json`).
    pub response: rls::RateLimitResponse,
    /// The overall code decided, before global shadow mode.
    pub decided: Code,
    /// Global shadow mode turned an `OVER_LIMIT` into `OK` (upstream's `global_shadow_mode`
    /// statistic counts these).
    pub shadowed: bool,
}

/// The service's answer to `request`, decided by the engine as `decided`, with `options`
/// (envoyproxy/ratelimit's `shouldRateLimitWorker`):
/// - the statuses are the engine's, untouched;
/// - the overall code is recomputed for `QUOTA_MODE` ([`overall_code`]);
/// - `response_headers_to_add` (`LIMIT_RESPONSE_HEADERS_ENABLED`) describe
///   `minimumDescriptor`, chosen before shadow mode;
/// - global `SHADOW_MODE` then turns an overall `OVER_LIMIT` into `OK`, and only that: the
///   statuses still say `OVER_LIMIT` where the descriptor is over its limit, whatever
///   limit (a descriptor's own `limit` override included);
/// - `dynamic_metadata` (`RESPONSE_DYNAMIC_METADATA`) last.
#[must_use]
pub fn service_answer(
    request: &Request,
    decided: Response,
    options: &GrpcOptions,
) -> ServiceAnswer {
    let mut response = decided;
    let (decided, shadowed) = settle(&mut response, options);
    let mut proto = response_to_proto_with(&response, options);
    if shadowed {
        proto.overall_code = pb_response::Code::Ok.into();
    }
    if options.response_dynamic_metadata {
        proto.dynamic_metadata = Some(dynamic_metadata(request, &response));
    }
    ServiceAnswer {
        response: proto,
        decided,
        shadowed,
    }
}

/// The overall code of `response` recomputed for `QUOTA_MODE` (into `response`), and
/// whether `SHADOW_MODE` answers it `OK` ([`service_answer`]).
fn settle(response: &mut Response, options: &GrpcOptions) -> (Code, bool) {
    if options.quota_mode {
        response.overall_code = overall_code(&response.statuses, true);
    }
    let decided = response.overall_code;
    (decided, options.shadow_mode && decided == Code::OverLimit)
}

/// The `RateLimitService` implementation: an [`Engine`], the clock it is read against and,
/// optionally, the [`Metrics`] its answers and decision times are recorded into.
#[derive(Debug)]
pub struct RateLimitGrpc<C = UnixClock> {
    engine: Arc<Engine>,
    clock: C,
    metrics: Option<Arc<Metrics>>,
    options: GrpcOptions,
}

impl<C: Clock> RateLimitGrpc<C> {
    /// A service deciding with `engine` at the times `clock` gives.
    pub fn new(engine: Arc<Engine>, clock: C) -> Self {
        Self {
            engine,
            clock,
            metrics: None,
            options: GrpcOptions::default(),
        }
    }

    /// The same service, answering with `options`.
    #[must_use]
    pub fn with_options(mut self, options: GrpcOptions) -> Self {
        self.options = options;
        self
    }

    /// The same service, recording every answer (`api="grpc"`) into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn record(&self, answer: Answer, took: Option<Duration>) {
        if let Some(m) = &self.metrics {
            m.record(Api::Grpc, answer, took);
        }
    }
}

impl<C: Clock> RateLimitGrpc<C> {
    /// Whether every call is decided without waiting: no Redis and no token-server center
    /// attached.
    pub(crate) fn decides_locally(&self) -> bool {
        self.engine.redis().is_none() && self.engine.token_server().is_none()
    }

    /// Answers `proto` when [`RateLimitGrpc::decides_locally`]: what
    /// [`RateLimitService::should_rate_limit`] answers, without its future.
    pub(crate) fn decide_local(
        &self,
        proto: rls::RateLimitRequest,
    ) -> Result<rls::RateLimitResponse, tonic::Status> {
        let request =
            request_from_proto(proto).inspect_err(|_| self.record(Answer::Invalid, None))?;
        let (decided, took) = self.decide_now(&request);
        self.answer(&request, decided, took)
    }

    /// [`RateLimitGrpc::decide_local`]'s answer to `request` (the engine's request for the
    /// protobuf one) as its gRPC frame: the bytes prost would encode, and the same metrics.
    pub(crate) fn decide_local_framed(&self, request: &Request) -> Result<Vec<u8>, tonic::Status> {
        let (decided, took) = self.decide_now(request);
        if self.options.response_headers.is_some() || self.options.response_dynamic_metadata {
            return self
                .answer(request, decided, took)
                .map(|m| wire::framed_message(&m));
        }
        let mut response = decided.map_err(|e| self.invalid(&e))?;
        let (decided, shadowed) = settle(&mut response, &self.options);
        self.recorded(decided, shadowed, took);
        let shown = if shadowed { Code::Ok } else { decided };
        Ok(wire::framed_response(
            shown,
            &response.statuses,
            self.options.subsecond_reset,
        ))
    }

    /// [`RateLimitGrpc::decide_local_framed`] for the protobuf `RateLimitRequest` in
    /// `message` (read by [`wire::plain_request`] when it has Envoy's usual shape, else by
    /// prost); `None` when it does not decode: tonic answers that.
    pub(crate) fn decide_message_framed(
        &self,
        message: &[u8],
    ) -> Option<Result<Vec<u8>, tonic::Status>> {
        if let Some(request) = wire::plain_request(message) {
            return Some(self.decide_local_framed(&request));
        }
        let proto = <rls::RateLimitRequest as prost::Message>::decode(message).ok()?;
        Some(self.decide_proto_framed(proto))
    }

    /// [`RateLimitGrpc::decide_local_framed`] for a protobuf request.
    pub(crate) fn decide_proto_framed(
        &self,
        proto: rls::RateLimitRequest,
    ) -> Result<Vec<u8>, tonic::Status> {
        let request =
            request_from_proto(proto).inspect_err(|_| self.record(Answer::Invalid, None))?;
        self.decide_local_framed(&request)
    }

    /// The engine's decision on `request` now, and how long it took.
    fn decide_now(
        &self,
        request: &Request,
    ) -> (Result<Response, crate::engine::RequestError>, Duration) {
        let now = self.clock.now();
        let start = Instant::now();
        let decided = self.engine.should_rate_limit(now, request);
        (decided, start.elapsed())
    }

    /// The status of a request the engine refused, recorded as invalid.
    fn invalid(&self, e: &crate::engine::RequestError) -> tonic::Status {
        self.record(Answer::Invalid, None);
        tonic::Status::invalid_argument(e.to_string())
    }

    /// Records an answer decided `decided` in `took`, `shadowed` by global shadow mode.
    fn recorded(&self, decided: Code, shadowed: bool, took: Duration) {
        self.record(decided.into(), Some(took));
        if shadowed && let Some(m) = &self.metrics {
            m.record_global_shadow_mode();
        }
    }

    /// The answer to `request`, decided in `took`, recorded into the metrics.
    fn answer(
        &self,
        request: &Request,
        decided: Result<Response, crate::engine::RequestError>,
        took: Duration,
    ) -> Result<rls::RateLimitResponse, tonic::Status> {
        let answer = match decided {
            Ok(r) => service_answer(request, r, &self.options),
            Err(e) => return Err(self.invalid(&e)),
        };
        self.recorded(answer.decided, answer.shadowed, took);
        Ok(answer.response)
    }
}

#[tonic::async_trait]
impl<C: Clock + 'static> RateLimitService for RateLimitGrpc<C> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<rls::RateLimitRequest>,
    ) -> Result<tonic::Response<rls::RateLimitResponse>, tonic::Status> {
        // envoyproxy/ratelimit answers an empty domain or descriptor list with an error, not
        // with a response (its `checkServiceErr`, same messages); Envoy's filter then applies
        // its `failure_mode_deny`. Its error reaches the wire as UNKNOWN (a plain Go error);
        // Envoy treats every error status alike, so we say what it is: INVALID_ARGUMENT.
        // Only the engine call is timed: the decision latency, not the transport's.
        if self.decides_locally() {
            // What the async path does without a center, without its future: that future
            // (Redis and token-server calls) is kilobytes, and every layer of tonic's
            // handler moved it, the largest cost per call after HTTP/2 itself.
            return self
                .decide_local(request.into_inner())
                .map(tonic::Response::new);
        }
        let request = request_from_proto(request.into_inner())
            .inspect_err(|_| self.record(Answer::Invalid, None))?;
        let now = self.clock.now();
        let start = Instant::now();
        // Boxed, so this handler's own future stays small (moved by each layer).
        let decided = Box::pin(self.engine.should_rate_limit_async(now, &request)).await;
        self.answer(&request, decided, start.elapsed())
            .map(tonic::Response::new)
    }
}

/// Errors of [`run`] and [`run_on_workers`].
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The gRPC server stopped on an error.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A worker thread of [`run_on_workers`] could not start, or stopped abnormally.
    #[error("gRPC worker thread: {0}")]
    Worker(std::io::Error),
}

/// Serves Envoy RLS v3 on `listener` with `engine`, on wall time, until `shutdown`
/// completes; then stops accepting, lets calls in flight finish, and returns.
///
/// # Errors
/// [`ServeError`] if the server fails.
pub async fn run(
    listener: TcpListener,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run_with(listener, engine, UnixClock, None, shutdown).await
}

/// [`run`] on the time of `clock` (tests pass a [`sluice_limits::ManualClock`]).
///
/// # Errors
/// [`ServeError`] if the server fails.
pub async fn run_with_clock<C: Clock + 'static>(
    listener: TcpListener,
    engine: Arc<Engine>,
    clock: C,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run_with(listener, engine, clock, None, shutdown).await
}

/// [`run`] on the time of `clock`, recording answers and decision times into `metrics` if
/// given (the HTTP shell's, [`crate::http::HttpState::metrics`], so one `/metrics` shows
/// both APIs).
///
/// # Errors
/// [`ServeError`] if the server fails.
pub async fn run_with<C: Clock + 'static>(
    listener: TcpListener,
    engine: Arc<Engine>,
    clock: C,
    metrics: Option<Arc<Metrics>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run_with_options(
        listener,
        engine,
        clock,
        metrics,
        GrpcOptions::default(),
        shutdown,
    )
    .await
}

/// [`run_with`], answering with `options`.
///
/// # Errors
/// [`ServeError`] if the server fails.
pub async fn run_with_options<C: Clock + 'static>(
    listener: TcpListener,
    engine: Arc<Engine>,
    clock: C,
    metrics: Option<Arc<Metrics>>,
    options: GrpcOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let clock = Arc::new(clock);
    let sweeper = tokio::spawn(sweep(Arc::clone(&engine), Arc::clone(&clock)));
    let mut service = RateLimitGrpc::new(engine, clock).with_options(options);
    if let Some(metrics) = metrics {
        service = service.with_metrics(metrics);
    }
    let service = RateLimitServiceServer::new(service);
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RateLimitGrpc<Arc<C>>>>()
        .await;
    // Decisions are tiny messages: don't let Nagle hold them back.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let served = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, async {
            shutdown.await;
            // Load balancers polling health stop sending before the calls in flight end.
            health
                .set_not_serving::<RateLimitServiceServer<RateLimitGrpc<Arc<C>>>>()
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
        })
        .await;
    sweeper.abort();
    Ok(served?)
}

async fn sweep<C: Clock>(engine: Arc<Engine>, clock: Arc<C>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        engine.retain_idle(clock.now());
    }
}

/// The engine's request for a protobuf `RateLimitRequest`.
///
/// # Errors
/// INVALID_ARGUMENT for what the engine cannot express: a `limit` override with an unknown
/// unit (envoyproxy/ratelimit cannot divide time by it either), and `is_negative_hits`
/// (giving permits back), which Sluice does not support — refused rather than counted as a
/// hit, which would do the opposite of what was asked.
pub fn request_from_proto(request: rls::RateLimitRequest) -> Result<Request, tonic::Status> {
    Ok(Request {
        domain: request.domain,
        descriptors: request
            .descriptors
            .into_iter()
            .map(descriptor_from_proto)
            .collect::<Result<_, _>>()?,
        hits_addend: request.hits_addend,
    })
}

fn descriptor_from_proto(d: RateLimitDescriptor) -> Result<Descriptor, tonic::Status> {
    if d.is_negative_hits {
        return Err(tonic::Status::invalid_argument(
            "negative hits (is_negative_hits) are not supported",
        ));
    }
    let limit = match d.limit {
        None => None,
        Some(o) => Some(RateLimit {
            requests_per_unit: o.requests_per_unit,
            unit: unit_from_proto(o.unit).ok_or_else(|| {
                tonic::Status::invalid_argument(format!(
                    "descriptor limit override has an unknown unit ({})",
                    o.unit
                ))
            })?,
        }),
    };
    Ok(Descriptor {
        entries: d
            .entries
            .into_iter()
            .map(|e| Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        hits_addend: d.hits_addend.map(|v| v.value),
        limit,
    })
}

/// `envoy.type.v3.RateLimitUnit` (the override's) numbers its units as the response's
/// `RateLimit.Unit`, which also has WEEK; envoyproxy/ratelimit casts one to the other.
fn unit_from_proto(unit: i32) -> Option<Unit> {
    match PbUnit::try_from(unit).ok()? {
        PbUnit::Unknown => None,
        PbUnit::Second => Some(Unit::Second),
        PbUnit::Minute => Some(Unit::Minute),
        PbUnit::Hour => Some(Unit::Hour),
        PbUnit::Day => Some(Unit::Day),
        PbUnit::Week => Some(Unit::Week),
        PbUnit::Month => Some(Unit::Month),
        PbUnit::Year => Some(Unit::Year),
    }
}

fn unit_to_proto(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn code_to_proto(code: Code) -> pb_response::Code {
    match code {
        Code::Ok => pb_response::Code::Ok,
        Code::OverLimit => pb_response::Code::OverLimit,
    }
}

fn duration_to_proto(d: Nanos, subsecond: bool) -> PbDuration {
    const NS: u64 = 1_000_000_000;
    if !subsecond {
        // envoyproxy/ratelimit: the unit's length minus the whole seconds since the window
        // began, i.e. the time left rounded up to a whole second.
        return PbDuration {
            seconds: i64::try_from(d.div_ceil(NS)).unwrap_or(i64::MAX),
            nanos: 0,
        };
    }
    PbDuration {
        seconds: i64::try_from(d / NS).unwrap_or(i64::MAX),
        // Below 10^9, so it fits.
        nanos: i32::try_from(d % NS).unwrap_or(0),
    }
}

/// The protobuf `RateLimitResponse` for the engine's answer, as envoyproxy/ratelimit gives
/// it (`duration_until_reset` in whole seconds).
#[must_use]
pub fn response_to_proto(response: &Response) -> rls::RateLimitResponse {
    response_to_proto_with(response, &GrpcOptions::default())
}

/// The protobuf `RateLimitResponse` for the engine's answer, with `options`.
#[must_use]
pub fn response_to_proto_with(
    response: &Response,
    options: &GrpcOptions,
) -> rls::RateLimitResponse {
    rls::RateLimitResponse {
        overall_code: code_to_proto(response.overall_code).into(),
        statuses: response
            .statuses
            .iter()
            .map(|s| status_to_proto(s, options))
            .collect(),
        dynamic_metadata: None,
        response_headers_to_add: options
            .response_headers
            .as_ref()
            .map(|names| response_headers(response, names, options.quota_mode))
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// envoyproxy/ratelimit's `dynamic_metadata` (`ratelimitToMetadata` in its
/// `src/service/ratelimit.go`), sent when `RESPONSE_DYNAMIC_METADATA` is on:
/// - `domain`: the request's domain;
/// - `descriptors`: one struct per request descriptor, `entries` (`"key=value"` strings),
///   `limit` when it carries a `limit` override (upstream prints the Go protobuf message as
///   text, a format its library calls unstable; here `requests_per_unit:N unit:UNIT`) and
///   `hitsAddend` when it carries its own;
/// - `hitsAddend`: the request's, when not 0;
/// - `metadata`: the configured `metadata` of the descriptors answered `OK` (not those over
///   their limit, nor `unlimited` ones), merged in request order (`mergeMetadata`): a key
///   already present keeps its value, unless both values are mappings, which are merged
///   the same way, key by key.
#[must_use]
pub fn dynamic_metadata(request: &Request, response: &Response) -> pb_struct::Struct {
    let mut out = Metadata::new();
    out.insert("domain".into(), request.domain.clone().into());
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut m = Metadata::new();
            let entries = d
                .entries
                .iter()
                .map(|e| serde_json::Value::String(format!("{}={}", e.key, e.value)))
                .collect();
            m.insert("entries".into(), serde_json::Value::Array(entries));
            if let Some(l) = &d.limit {
                let unit = unit_to_proto(l.unit).as_str_name();
                let text = format!("requests_per_unit:{} unit:{unit}", l.requests_per_unit);
                m.insert("limit".into(), text.into());
            }
            if let Some(h) = d.hits_addend {
                m.insert("hitsAddend".into(), h.into());
            }
            serde_json::Value::Object(m)
        })
        .collect();
    out.insert("descriptors".into(), serde_json::Value::Array(descriptors));
    if request.hits_addend != 0 {
        out.insert("hitsAddend".into(), request.hits_addend.into());
    }
    let mut passed = Metadata::new();
    for s in &response.statuses {
        if let Some(m) = &s.metadata
            && s.code == Code::Ok
            && !s.is_unlimited()
        {
            merge_metadata(&mut passed, m);
        }
    }
    if !passed.is_empty() {
        out.insert("metadata".into(), serde_json::Value::Object(passed));
    }
    json_struct(&out)
}

/// Upstream's `mergeMetadata`: the keys of `src` that `dest` lacks are added; where both
/// have a mapping under a key, the two are merged the same way; any other value in `dest`
/// stays. (Upstream adds `src`'s mapping by reference and may then merge into the loaded
/// configuration itself, so a later request can see metadata an earlier one merged in;
/// Sluice merges into a copy: each answer depends on its own request only.)
pub fn merge_metadata(dest: &mut Metadata, src: &Metadata) {
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (None, _) => {
                dest.insert(k.clone(), v.clone());
            }
            (Some(serde_json::Value::Object(d)), serde_json::Value::Object(s)) => {
                merge_metadata(d, s);
            }
            (Some(_), _) => {}
        }
    }
}

/// A JSON object as a `google.protobuf.Struct`.
fn json_struct(map: &Metadata) -> pb_struct::Struct {
    pb_struct::Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_value(v)))
            .collect(),
    }
}

fn json_value(v: &serde_json::Value) -> pb_struct::Value {
    use pb_struct::value::Kind;
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(pb_struct::ListValue {
            values: items.iter().map(json_value).collect(),
        }),
        J::Object(m) => Kind::StructValue(json_struct(m)),
    };
    pb_struct::Value { kind: Some(kind) }
}

fn status_to_proto(s: &DescriptorStatus, options: &GrpcOptions) -> pb_response::DescriptorStatus {
    pb_response::DescriptorStatus {
        code: code_to_proto(s.code).into(),
        current_limit: s.current_limit.map(|l| pb_response::RateLimit {
            name: s.limit_name.as_deref().unwrap_or_default().to_owned(),
            requests_per_unit: l.requests_per_unit,
            unit: unit_to_proto(l.unit).into(),
        }),
        limit_remaining: s.limit_remaining,
        duration_until_reset: s
            .duration_until_reset
            .map(|d| duration_to_proto(d, options.subsecond_reset)),
        quota: None,
    }
}
