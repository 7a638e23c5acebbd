//! The HTTP shell (axum): envoyproxy/ratelimit's `POST /json`, a plain check with the IETF
//! rate limit headers, a check that does not consume, Prometheus metrics, health, readiness
//! and the cluster's status.
//!
//! | endpoint | answer |
//! |---|---|
//! | `POST /json` | envoyproxy/ratelimit's JSON `RateLimitRequest` → JSON `RateLimitResponse`; 200 `OK`, 429 `OVER_LIMIT` |
//! | `GET\|POST /v1/check/{domain}?key=value&…` | one descriptor from the query (entries in order; `hits_addend=N` optional) → 200 / 429 with `RateLimit-*` headers, `Retry-After` on 429, the JSON `RateLimitResponse` as body |
//! | `POST /v1/check` | the same with `/json`'s body (any number of descriptors) |
//! | `GET\|POST /v1/peek/{domain}?…`, `POST /v1/peek` | as `/v1/check`, but nothing is counted: what a check would answer now |
//! | `GET /metrics` | OpenMetrics text ([`crate::metrics`]) |
//! | `GET /healthz`, `GET /healthcheck` | 200 while the server runs (`/healthcheck` is envoyproxy/ratelimit's path) |
//! | `GET /readyz` | 200 when ready (configuration loaded; in a cluster, a valid lease, out of a restart's quarantine, not leaving), else 503 with the reason |
//! | `GET /v1/cluster` | the [`ClusterStatus`] as JSON (a node alone: [`ClusterStatus::single`]); `?keys=N` or `?keys=all` lists that many keys, the busiest first (default 100) |
//! | `POST /v1/lease` | a capacity lease for client-side throttling ([`crate::lease`]): `{"domain", "descriptor": {"entries": [{"key", "value"}]}, "client_id", "wants"}` → `{"rate", "expires_in_ms", "refresh_in_ms", "limit", "share", "policy", "clients"}` |
//! | `DELETE /v1/lease` | gives a lease back (`{"domain", "descriptor", "client_id"}`): 204, or 404 if the client held none |
//!
//! A refused request (malformed JSON, empty domain, no descriptor, negative hits, an unknown
//! override unit) gets 400 with a one-line `text/plain` reason, a body over [`MAX_BODY`] gets
//! 413; neither reaches the engine, so nothing is counted.
//!
//! **`/json` and envoyproxy/ratelimit** (its `NewJsonHandler`): the request is the protojson
//! form of `RateLimitRequest` — field names as in the `.proto` (`hits_addend`) or in
//! lowerCamelCase (`hitsAddend`), integers as numbers or strings, enums by name or number,
//! `null` for an absent field, unknown fields refused — and the answer is the gRPC
//! service's whole answer ([`crate::grpc::service_answer`], with the same options: shadow
//! and quota mode, response headers, dynamic metadata) as protojson `RateLimitResponse`
//! (lowerCamelCase names, enums by name, zero values left out,
//! `durationUntilReset` as a protojson `Duration` string such as `"1s"`). Status codes are
//! its: 200 for `OK`, 429 for `OVER_LIMIT`, 400 for what it cannot decide.
//! `durationUntilReset` is whole seconds, rounded up, as upstream's (`"1s"` in a per-second
//! window); [`HttpState::with_subsecond_reset`] keeps the engine's precision (`"0.750s"`), as
//! the gRPC shell's option does. Where Sluice differs: an error's body says what is wrong (it writes `Bad Request`), only `POST` is
//! accepted (it answers any method), bodies are limited to [`MAX_BODY`] (413), and
//! `is_negative_hits` is refused (400) as on the gRPC side. The JSON is turned into the
//! protobuf request and then into the engine's request by the same code as gRPC
//! ([`crate::grpc::request_from_proto`]), so both APIs decide alike.
//!
//! **Headers of the plain check** (draft-ietf-httpapi-ratelimit-headers, the revision with
//! three fields): `RateLimit-Limit` (requests per unit), `RateLimit-Remaining`,
//! `RateLimit-Reset` (whole seconds, rounded up) and `RateLimit-Policy` (`N;w=SECONDS`) of
//! the descriptor closest to its limit — the one with the fewest permits left; when the
//! answer is 429, the refused descriptor with the longest wait — and `Retry-After` (seconds,
//! at least 1) on 429: the wait after which that descriptor would admit the same request —
//! the algorithm's own `retry_after` when the engine reports it, else the time until the
//! limit is back to its full allowance (the end of the window for the default fixed window;
//! an upper bound for the bucket algorithms). Without a limited descriptor (no rule,
//! `unlimited`) there are no `RateLimit-*` headers.
//!
//! **Leases** (`/v1/lease`, seed 000 §7): a client asks for a rate on one descriptor's rule
//! and gets a part of this node's capacity for it (max-min fair by default), valid for
//! `expires_in_ms` and to be refreshed after `refresh_in_ms`; `rate`, `limit` and `share`
//! are requests per second (`limit` and `share` are `null` for an `unlimited` rule). The
//! descriptor may also be given as `"descriptors": [one]` (the `/json` shape). 400 for a
//! malformed request, 404 when no rule governs the descriptor, 503 when the lease table is
//! full. The guarantee is [`crate::lease`]'s: the rates of unexpired grants never add up to
//! more than the node's capacity (within a lease duration of a decrease).
//!
//! Decision latency is measured around the engine call only and recorded with the answer
//! ([`Metrics::record`]); the idle-key sweep is the gRPC shell's ([`crate::grpc::run`]).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use serde::{Deserialize, Serialize};
use sluice_limits::{Clock, Nanos};
use tokio::net::TcpListener;

use crate::engine::{Code, Descriptor, DescriptorStatus, Engine, Request, RequestError, Response};
use crate::grpc::UnixClock;
use crate::lease::Leases;
use crate::metrics::{Answer, Api, CONTENT_TYPE as METRICS_CONTENT_TYPE, Metrics};
use crate::status::{ClusterInfo, ClusterStatus};

mod lease;
mod protojson;

pub use lease::{lease_json, lease_request_from_json};

pub use protojson::{
    go_float, proto_duration, proto_response_json, request_from_json, response_json,
};

/// envoyproxy/ratelimit's HTTP port, and so the default of `sluice serve --http-addr`.
pub const DEFAULT_PORT: u16 = 8080;

/// Largest request body accepted (413 above). A `RateLimitRequest` is a few hundred bytes;
/// 64 KiB leaves room for hundreds of descriptors while bounding what a client can make the
/// server buffer.
pub const MAX_BODY: usize = 64 * 1024;

/// The query parameter of `/v1/check/{domain}` that sets `hits_addend` rather than naming a
/// descriptor entry (a descriptor with an entry of this key needs the JSON form).
pub const HITS_PARAM: &str = "hits_addend";

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const NS_PER_S: u64 = 1_000_000_000;

/// What the HTTP handlers share: the engine, the cluster (if any), the metrics, the clock,
/// the readiness flag and the capacity leases. Cheap to clone (shared handles).
#[derive(Clone)]
pub struct HttpState {
    engine: Arc<Engine>,
    cluster: Option<Arc<dyn ClusterInfo>>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    ready: Arc<AtomicBool>,
    leases: Arc<Leases>,
    /// `/json` and the plain check give `durationUntilReset` to the nanosecond instead of in
    /// whole seconds (upstream's).
    subsecond_reset: bool,
    /// How `/json` answers: as the gRPC service does ([`crate::grpc::service_answer`]).
    service: crate::grpc::GrpcOptions,
}

impl fmt::Debug for HttpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpState")
            .field("engine", &self.engine)
            .field("cluster", &self.cluster)
            .field("ready", &self.ready.load(Ordering::Relaxed))
            .field("leases", &self.leases)
            .finish_non_exhaustive()
    }
}

impl HttpState {
    /// A state deciding with `engine` on wall time, describing `cluster` (`None`: a node
    /// alone), with new [`Metrics`] of both. Ready from the start: an engine exists only
    /// with a configuration loaded ([`HttpState::set_ready`] turns it off, e.g. to drain).
    #[must_use]
    pub fn new(engine: Arc<Engine>, cluster: Option<Arc<dyn ClusterInfo>>) -> Self {
        let metrics = Arc::new(Metrics::new(Arc::clone(&engine), cluster.clone()));
        Self {
            engine,
            cluster,
            metrics,
            clock: Arc::new(UnixClock),
            ready: Arc::new(AtomicBool::new(true)),
            leases: Arc::new(Leases::default()),
            subsecond_reset: false,
            service: crate::grpc::GrpcOptions::default(),
        }
    }

    /// The same state answering `/json` with the service options of the gRPC API
    /// (envoyproxy/ratelimit's `SHADOW_MODE`, `QUOTA_MODE`, `RESPONSE_DYNAMIC_METADATA`,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`; its `/json` calls the same service as gRPC), and
    /// `durationUntilReset` as `options.subsecond_reset` says.
    #[must_use]
    pub fn with_service_options(mut self, options: crate::grpc::GrpcOptions) -> Self {
        self.subsecond_reset = options.subsecond_reset;
        self.service = options;
        self
    }

    /// The same state answering `durationUntilReset` to the nanosecond (`sluice serve
    /// --subsecond-reset`); by default it is whole seconds, rounded up, as envoyproxy/ratelimit
    /// answers.
    #[must_use]
    pub fn with_subsecond_reset(mut self, subsecond: bool) -> Self {
        self.subsecond_reset = subsecond;
        self.service.subsecond_reset = subsecond;
        self
    }

    /// The same state handing out capacity leases from `leases` (by default a table of its
    /// own with [`crate::lease::LeaseConfig::default`]); the daemon keeps a handle to call
    /// [`Leases::tick`].
    #[must_use]
    pub fn with_leases(mut self, leases: Arc<Leases>) -> Self {
        self.leases = leases;
        self
    }

    /// The capacity leases.
    #[must_use]
    pub fn leases(&self) -> &Arc<Leases> {
        &self.leases
    }

    /// The same state reading `clock` (nanoseconds since the unix epoch) instead of wall
    /// time: tests pass a [`sluice_limits::ManualClock`].
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The same state recording into `metrics` (e.g. shared with another server).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics, to hand to the gRPC shell ([`crate::grpc::run_with`]) so one `/metrics`
    /// shows both APIs.
    #[must_use]
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// The engine.
    #[must_use]
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Sets whether this node is ready (`/readyz`); every clone of this state sees it.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// `Ok` if ready, else why not.
    ///
    /// # Errors
    /// The reason, as `/readyz` reports it.
    pub fn readiness(&self) -> Result<(), String> {
        if !self.ready.load(Ordering::Acquire) {
            return Err("not ready: starting or shutting down".to_owned());
        }
        if let Some(cluster) = &self.cluster {
            // No key listed: a probe must not walk the keys under the driver's lock.
            let status = cluster.status(0);
            // `expiring` still enforces a share the cluster granted; `expired` enforces the
            // fallback, which keeps the limit but not the balance, so traffic should move.
            if !matches!(status.lease.as_str(), "valid" | "expiring") {
                return Err(format!("not ready: cluster lease is {}", status.lease));
            }
            if matches!(status.lifecycle.as_str(), "leaving" | "left") {
                return Err(format!("not ready: node is {}", status.lifecycle));
            }
            // A restarted node in quarantine echoes nobody's lease: with two of them at once
            // a small cluster could lose its quorum, so a rolling restart that waits for
            // readiness (Kubernetes does) restarts the next node only after this one.
            if status.quarantine_ms > 0.0 {
                return Err(format!(
                    "not ready: restarted, in quarantine for {:.0} ms more",
                    status.quarantine_ms
                ));
            }
        }
        Ok(())
    }

    fn cluster_status(&self, keys: usize) -> ClusterStatus {
        self.cluster
            .as_ref()
            .map_or_else(ClusterStatus::single, |c| c.status(keys))
    }

    /// Decides `request` now (consuming or not), timing the engine call and recording the
    /// answer.
    async fn decide(&self, api: Api, request: &Request) -> Result<Response, RequestError> {
        let now = self.clock.now();
        let start = Instant::now();
        let result = match api {
            Api::Peek => self.engine.check_only(now, request),
            // The async path: `coordination: redis` rules go to Redis (bounded by its timeout).
            _ => self.engine.should_rate_limit_async(now, request).await,
        };
        let took = start.elapsed();
        match &result {
            Ok(r) => self.metrics.record(api, r.overall_code.into(), Some(took)),
            Err(_) => self.metrics.record(api, Answer::Invalid, None),
        }
        result
    }

    fn refuse(&self, api: Api, refusal: Refusal) -> HttpResponse {
        self.metrics.record(api, Answer::Invalid, None);
        refusal.into_response()
    }
}

/// Every endpoint, over `state`.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/json", post(json))
        .route("/v1/check", post(check_body))
        .route("/v1/peek", post(peek_body))
        .route("/v1/check/{domain}", get(check_query).post(check_query))
        .route("/v1/peek/{domain}", get(peek_query).post(peek_query))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        // envoyproxy/ratelimit's path for the same.
        .route("/healthcheck", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/cluster", get(cluster))
        .route(
            "/v1/lease",
            post(lease::lease_acquire).delete(lease::lease_release),
        )
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Errors of [`run`].
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The HTTP server stopped on an I/O error.
    #[error("HTTP server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves [`router`] on `listener` until `shutdown` completes; then stops accepting, lets
/// requests in flight finish, and returns.
///
/// # Errors
/// [`ServeError`] if the server fails.
pub async fn run(
    listener: TcpListener,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    // Decisions are tiny answers: don't let Nagle hold them back.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Handlers

/// envoyproxy/ratelimit's `NewJsonHandler` (`src/server/server_impl.go`): the request goes
/// to the same service as gRPC's, and the whole `RateLimitResponse` it answers comes back
/// as protojson; 429 when its overall code is `OVER_LIMIT`, else 200.
async fn json(State(s): State<HttpState>, body: Result<Bytes, BytesRejection>) -> HttpResponse {
    let request = match body.map_err(Refusal::body).and_then(|b| parse_json(&b)) {
        Ok(r) => r,
        Err(refusal) => return s.refuse(Api::Json, refusal),
    };
    let now = s.clock.now();
    let start = Instant::now();
    let decided = s.engine.should_rate_limit_async(now, &request).await;
    let took = start.elapsed();
    let answer = match decided {
        Ok(r) => crate::grpc::service_answer(&request, r, &s.service),
        Err(e) => return s.refuse(Api::Json, Refusal::bad(e.to_string())),
    };
    s.metrics
        .record(Api::Json, answer.decided.into(), Some(took));
    if answer.shadowed {
        s.metrics.record_global_shadow_mode();
    }
    let over = answer.response.overall_code
        == i32::from(
            envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit,
        );
    let status = if over {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    (
        status,
        [(header::CONTENT_TYPE, JSON)],
        protojson::proto_response_json(&answer.response),
    )
        .into_response()
}

async fn check_body(s: State<HttpState>, body: Result<Bytes, BytesRejection>) -> HttpResponse {
    body_plain(s, Api::Check, body).await
}

async fn peek_body(s: State<HttpState>, body: Result<Bytes, BytesRejection>) -> HttpResponse {
    body_plain(s, Api::Peek, body).await
}

async fn body_plain(
    State(s): State<HttpState>,
    api: Api,
    body: Result<Bytes, BytesRejection>,
) -> HttpResponse {
    match body.map_err(Refusal::body).and_then(|b| parse_json(&b)) {
        Ok(request) => plain(&s, api, &request).await,
        Err(refusal) => s.refuse(api, refusal),
    }
}

type DomainPath = Result<Path<String>, PathRejection>;
type PairsQuery = Result<Query<Vec<(String, String)>>, QueryRejection>;

async fn check_query(s: State<HttpState>, domain: DomainPath, query: PairsQuery) -> HttpResponse {
    query_plain(s, Api::Check, domain, query).await
}

async fn peek_query(s: State<HttpState>, domain: DomainPath, query: PairsQuery) -> HttpResponse {
    query_plain(s, Api::Peek, domain, query).await
}

async fn query_plain(
    State(s): State<HttpState>,
    api: Api,
    domain: DomainPath,
    query: PairsQuery,
) -> HttpResponse {
    match request_from_query(domain, query) {
        Ok(request) => plain(&s, api, &request).await,
        Err(refusal) => s.refuse(api, refusal),
    }
}

/// The plain check's request: the domain from the path, one descriptor from the query.
fn request_from_query(domain: DomainPath, query: PairsQuery) -> Result<Request, Refusal> {
    let Path(domain) = domain.map_err(|e| Refusal::bad(e.body_text()))?;
    let Query(pairs) = query.map_err(|e| Refusal::bad(e.body_text()))?;
    let mut hits_addend = 1;
    let mut entries = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        if key == HITS_PARAM {
            hits_addend = value.parse().map_err(|_| {
                Refusal::bad(format!(
                    "{HITS_PARAM} must be a whole number below 2^32, not {value:?}"
                ))
            })?;
        } else {
            entries.push((key, value));
        }
    }
    if entries.is_empty() {
        return Err(Refusal::bad(
            "no descriptor entries: give them as query parameters, \
             /v1/check/DOMAIN?key=value&key2=value2",
        ));
    }
    Ok(Request {
        domain,
        descriptors: vec![Descriptor::new(entries)],
        hits_addend,
    })
}

/// Decides for the plain check and answers with the rate limit headers.
async fn plain(s: &HttpState, api: Api, request: &Request) -> HttpResponse {
    let response = match s.decide(api, request).await {
        Ok(r) => r,
        Err(e) => return Refusal::bad(e.to_string()).into_response(),
    };
    let mut answer = (
        status_of(&response),
        response_json(&response, s.subsecond_reset),
    )
        .into_response();
    let headers = answer.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    for (name, value) in rate_limit_headers(&response) {
        headers.insert(name, value);
    }
    answer
}

async fn metrics(State(s): State<HttpState>) -> HttpResponse {
    match s.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, TEXT)],
            "cannot encode metrics\n",
        )
            .into_response(),
    }
}

async fn healthz() -> HttpResponse {
    ([(header::CONTENT_TYPE, TEXT)], "ok\n").into_response()
}

async fn readyz(State(s): State<HttpState>) -> HttpResponse {
    match s.readiness() {
        Ok(()) => ([(header::CONTENT_TYPE, TEXT)], "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, TEXT)],
            format!("{why}\n"),
        )
            .into_response(),
    }
}

/// `GET /v1/cluster`: the cluster's state, and where this node's central rules are decided
/// now (`redis`, `token_server`: central or the local fallback, since when, how many
/// switches) when it has them, and its own token server's state (`token_server_node`).
#[derive(Serialize)]
struct ClusterView {
    #[serde(flatten)]
    cluster: ClusterStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    redis: Option<crate::central::CentralStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_server: Option<crate::token_server::TokenStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_server_node: Option<crate::token_server::ServerStatus>,
}

/// `GET /v1/cluster?keys=N`: how many keys to list (the busiest), or `all`.
#[derive(Debug, Deserialize)]
struct ClusterQuery {
    keys: Option<String>,
}

async fn cluster(
    State(s): State<HttpState>,
    axum::extract::Query(q): axum::extract::Query<ClusterQuery>,
) -> HttpResponse {
    let keys = match q.keys.as_deref() {
        None => crate::status::LISTED_KEYS,
        Some("all") => usize::MAX,
        Some(n) => match n.parse::<usize>() {
            Ok(n) => n,
            Err(_) => {
                return (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, TEXT)],
                    format!("keys must be a number of keys or `all`, not {n:?}\n"),
                )
                    .into_response();
            }
        },
    };
    let view = ClusterView {
        cluster: s.cluster_status(keys),
        redis: s.engine.central_status(),
        token_server: s.engine.token_status(),
        token_server_node: s.engine.token_server_node_status(),
    };
    match serde_json::to_vec(&view) {
        Ok(body) => ([(header::CONTENT_TYPE, JSON)], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, TEXT)],
            format!("cannot encode the cluster status: {e}\n"),
        )
            .into_response(),
    }
}

async fn not_found() -> HttpResponse {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, TEXT)],
        "no such endpoint: POST /json, /v1/check/{domain}?key=value, /v1/peek/{domain}?key=value, \
         /metrics, /healthz, /healthcheck, /readyz, /v1/cluster, /v1/lease\n",
    )
        .into_response()
}

/// A request refused before the engine: status and a one-line reason.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn bad(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    fn body(e: BytesRejection) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!("request body larger than {MAX_BODY} bytes"),
            }
        } else {
            Self {
                status: e.status(),
                message: e.body_text(),
            }
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> HttpResponse {
        let mut message = self.message;
        message.push('\n');
        (self.status, [(header::CONTENT_TYPE, TEXT)], message).into_response()
    }
}

fn status_of(response: &Response) -> StatusCode {
    match response.overall_code {
        Code::Ok => StatusCode::OK,
        Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
    }
}

// ---------------------------------------------------------------------------------------
// The rate limit headers

/// `RateLimit-Limit`, `-Remaining`, `-Reset`, `-Policy` and, when over the limit,
/// `Retry-After`, for `response` (see the module documentation for which descriptor).
#[must_use]
pub fn rate_limit_headers(response: &Response) -> Vec<(HeaderName, HeaderValue)> {
    let limited = response
        .statuses
        .iter()
        .filter_map(|s| Some((s, s.current_limit?)));
    let chosen = match response.overall_code {
        Code::OverLimit => limited
            .filter(|(s, _)| s.code == Code::OverLimit)
            .max_by_key(|(s, _)| retry_wait(s).unwrap_or(0)),
        Code::Ok => limited.min_by_key(|(s, _)| {
            (
                s.limit_remaining,
                std::cmp::Reverse(s.duration_until_reset.unwrap_or(0)),
            )
        }),
    };
    let Some((status, limit)) = chosen else {
        return Vec::new();
    };
    let reset = status.duration_until_reset.unwrap_or(0).div_ceil(NS_PER_S);
    let mut headers = vec![
        (
            HeaderName::from_static("ratelimit-limit"),
            HeaderValue::from(limit.requests_per_unit),
        ),
        (
            HeaderName::from_static("ratelimit-remaining"),
            HeaderValue::from(status.limit_remaining),
        ),
        (
            HeaderName::from_static("ratelimit-reset"),
            HeaderValue::from(reset),
        ),
    ];
    if let Ok(policy) = HeaderValue::try_from(format!(
        "{};w={}",
        limit.requests_per_unit,
        limit.unit.seconds()
    )) {
        headers.push((HeaderName::from_static("ratelimit-policy"), policy));
    }
    if response.overall_code == Code::OverLimit {
        let retry = retry_wait(status).unwrap_or(0).div_ceil(NS_PER_S);
        // At least a second: a client told to retry after 0 would spin.
        headers.push((header::RETRY_AFTER, HeaderValue::from(retry.max(1))));
    }
    headers
}

/// How long the client of a refused descriptor should wait before retrying, ns: what
/// `Retry-After` says (rounded up to whole seconds). The algorithm's own wait when it has
/// one (exact for every algorithm: a bucket admits again after one emission interval, long
/// before it is full), else the time until the limit is back to its full allowance (a
/// request that can never be admitted, a block rule).
fn retry_wait(status: &DescriptorStatus) -> Option<Nanos> {
    status.retry_after.or(status.duration_until_reset)
}

fn parse_json(body: &[u8]) -> Result<Request, Refusal> {
    request_from_json(body).map_err(Refusal::bad)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    // `..base()` below: the statuses are written field by field, and fields the engine may
    // add (with `None` for "not reported") take the base's value.
    #![allow(clippy::needless_update)]

    use super::*;
    use crate::config::{Config, RateLimit, Unit};
    use crate::engine::Entry;
    use proptest::prelude::*;

    /// A status with nothing reported (the engine's answer for an unknown domain).
    fn base() -> DescriptorStatus {
        Engine::new(Config::default())
            .check_only(0, &Request::new("none", [Descriptor::new([("k", "v")])]))
            .unwrap()
            .statuses[0]
            .clone()
    }

    #[test]
    fn durations_are_written_as_protojson_does() {
        assert_eq!(proto_duration(0), "0s");
        assert_eq!(proto_duration(NS_PER_S), "1s");
        assert_eq!(proto_duration(750_000_000), "0.750s");
        assert_eq!(proto_duration(1_500_000), "0.001500s");
        assert_eq!(proto_duration(86_400 * NS_PER_S + 1), "86400.000000001s");
    }

    #[test]
    fn both_field_spellings_and_both_integer_forms_are_read() {
        let a = request_from_json(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],
                "hits_addend":"3","limit":{"requests_per_unit":5,"unit":"MINUTE"}}],"hitsAddend":2}"#,
        )
        .unwrap();
        let b = request_from_json(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],
                "hitsAddend":3,"limit":{"requestsPerUnit":"5","unit":2}}],"hits_addend":2.0}"#,
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.hits_addend, 2);
        assert_eq!(a.descriptors[0].hits_addend, Some(3));
        assert_eq!(
            a.descriptors[0].limit,
            Some(RateLimit {
                requests_per_unit: 5,
                unit: Unit::Minute
            })
        );
        assert_eq!(
            a.descriptors[0].entries,
            vec![Entry {
                key: "k".into(),
                value: "v".into()
            }]
        );
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        for (body, needle) in [
            (&br#"{"domain": "d", "descriptors": [}"#[..], "malformed"),
            (br#"{"domain": "d", "descriptor": []}"#, "unknown field"),
            (br#"{"domain": 5}"#, "malformed"),
            (br#"{"domain":"d","hits_addend":-1}"#, "negative"),
            (
                br#"{"domain":"d","hits_addend":4294967296}"#,
                "out of range",
            ),
            (
                br#"{"domain":"d","hits_addend":1,"hitsAddend":1}"#,
                "duplicate",
            ),
            (
                br#"{"domain":"d","descriptors":[{"entries":[],"is_negative_hits":true}]}"#,
                "negative hits",
            ),
            (
                br#"{"domain":"d","descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#,
                "unknown unit",
            ),
            (
                br#"{"domain":"d","descriptors":[{"limit":{"unit":0}}]}"#,
                "unknown unit",
            ),
        ] {
            let e = request_from_json(body).unwrap_err();
            assert!(e.contains(needle), "{e:?} should mention {needle:?}");
        }
    }

    #[test]
    fn zero_values_are_left_out_like_protojson() {
        let r = Response {
            overall_code: Code::OverLimit,
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit,
                    current_limit: Some(RateLimit {
                        requests_per_unit: 0,
                        unit: Unit::Second,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(250_000_000),
                    ..base()
                },
                DescriptorStatus {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: 0,
                    duration_until_reset: None,
                    ..base()
                },
            ],
        };
        assert_eq!(
            response_json(&r, true),
            r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"unit":"SECOND"},"durationUntilReset":"0.250s"},{"code":"OK"}]}"#
        );
        // Upstream's whole seconds, rounded up (its `duration_until_reset` is the unit's
        // length minus the whole seconds since the window began).
        assert_eq!(
            response_json(&r, false),
            r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"unit":"SECOND"},"durationUntilReset":"1s"},{"code":"OK"}]}"#
        );
    }

    fn status(code: Code, per_unit: u32, remaining: u32, reset_ms: u64) -> DescriptorStatus {
        DescriptorStatus {
            code,
            current_limit: Some(RateLimit {
                requests_per_unit: per_unit,
                unit: Unit::Minute,
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(reset_ms * 1_000_000),
            ..base()
        }
    }

    fn header_map(r: &Response) -> Vec<(String, String)> {
        rate_limit_headers(r)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn headers_describe_the_descriptor_closest_to_its_limit() {
        let ok = Response {
            overall_code: Code::Ok,
            statuses: vec![
                status(Code::Ok, 100, 40, 30_000),
                status(Code::Ok, 10, 3, 1_200),
                no_limit(),
            ],
        };
        assert_eq!(
            header_map(&ok),
            [
                ("ratelimit-limit", "10"),
                ("ratelimit-remaining", "3"),
                ("ratelimit-reset", "2"),
                ("ratelimit-policy", "10;w=60"),
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
        let over = Response {
            overall_code: Code::OverLimit,
            statuses: vec![
                status(Code::OverLimit, 100, 0, 30_000),
                status(Code::Ok, 10, 0, 1_200),
                status(Code::OverLimit, 5, 0, 59_001),
            ],
        };
        let h = header_map(&over);
        assert!(h.contains(&("ratelimit-limit".into(), "5".into())));
        assert!(h.contains(&("retry-after".into(), "60".into())));
        let none = Response {
            overall_code: Code::Ok,
            statuses: vec![no_limit()],
        };
        assert!(header_map(&none).is_empty());
    }

    #[test]
    fn retry_after_is_the_algorithms_wait_not_the_reset() {
        let config = Config::from_yaml(
            "t.yaml",
            "
domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 60, algorithm: gcra }
",
        )
        .unwrap();
        let engine = Engine::new(config);
        let req = Request::new("d", [Descriptor::new([("k", "v")])]);
        for _ in 0..60 {
            assert_eq!(
                engine.should_rate_limit(0, &req).unwrap().overall_code,
                Code::Ok
            );
        }
        let refused = engine.should_rate_limit(0, &req).unwrap();
        // One permit per second comes back: retry in 1 s, though the bucket is full in 60 s.
        assert_eq!(refused.statuses[0].retry_after, Some(1_000_000_000));
        let h = header_map(&refused);
        assert!(h.contains(&("retry-after".into(), "1".into())), "{h:?}");
        assert!(
            h.contains(&("ratelimit-reset".into(), "60".into())),
            "{h:?}"
        );
    }

    fn no_limit() -> DescriptorStatus {
        DescriptorStatus {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: None,
            ..base()
        }
    }

    proptest! {
        /// Whatever the bytes, parsing answers (Ok or a reason) and never panics.
        #[test]
        fn parsing_never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = request_from_json(&body);
        }

        /// A request written in protojson (either spelling) reads back as itself.
        #[test]
        fn requests_round_trip(
            domain in "[a-z_]{1,8}",
            descriptors in proptest::collection::vec(
                (proptest::collection::vec(("[a-z_\"\\\\]{1,6}", "[ -~]{0,6}"), 0..4),
                 proptest::option::of(0u64..1_000_000)),
                1..4),
            hits in 0u32..1000,
            camel in any::<bool>(),
        ) {
            let (hits_name, dhits_name) = if camel { ("hitsAddend", "hitsAddend") } else { ("hits_addend", "hits_addend") };
            let mut json = serde_json::json!({
                "domain": domain,
                "descriptors": descriptors.iter().map(|(entries, h)| {
                    let mut d = serde_json::json!({
                        "entries": entries.iter().map(|(k, v)| serde_json::json!({"key": k, "value": v})).collect::<Vec<_>>(),
                    });
                    if let Some(h) = h {
                        d[dhits_name] = serde_json::json!(h.to_string());
                    }
                    d
                }).collect::<Vec<_>>(),
            });
            json[hits_name] = serde_json::json!(hits);
            let parsed = request_from_json(json.to_string().as_bytes()).unwrap();
            let expected = Request {
                domain: domain.clone(),
                hits_addend: hits,
                descriptors: descriptors.iter().map(|(entries, h)| Descriptor {
                    entries: entries.iter().map(|(k, v)| Entry { key: k.clone(), value: v.clone() }).collect(),
                    hits_addend: *h,
                    limit: None,
                }).collect(),
            };
            prop_assert_eq!(parsed, expected);
        }
    }
}
