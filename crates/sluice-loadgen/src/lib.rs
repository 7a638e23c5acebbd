//! The load generator behind `sluice bench`, and `sluice demo` ([`demo`]), which runs it
//! against five nodes; outside the daemon's library, which serves and never loads.
//!
//! The load generator (and the load of `sluice demo`): `ShouldRateLimit`
//! calls against one or more rate limit services, over gRPC (Envoy RLS v3 on Envoy's own
//! protobuf types, as HTTP/2 POSTs: `grpc_client`) or HTTP (`POST /json`, envoyproxy/ratelimit's JSON form of the request:
//! 200 is OK, 429 is OVER_LIMIT), for a fixed duration or number of requests, with latency
//! percentiles from an HDR histogram.
//!
//! ```no_run
//! use std::time::Duration;
//! use sluice_loadgen::{self as loadgen, LoadSpec, Stop, Target};
//!
//! # async fn example() -> Result<(), loadgen::LoadError> {
//! let target = Target::Grpc(vec!["127.0.0.1:8081".to_owned()]);
//! let mut spec = LoadSpec::new("example", vec![vec![("remote_address".into(), "10.0.0.{i}".into())]]);
//! spec.keys = 200; // `{i}` takes the values 0..200, round robin
//! spec.stop = Stop::Duration(Duration::from_secs(10));
//! let report = loadgen::run(&target, &spec, |p| eprintln!("{} sent", p.sent)).await?;
//! println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
//! # Ok(()) }
//! ```
//!
//! # What is measured
//!
//! - **Closed loop** (no `rate`): `concurrency` workers, each sends its next request as soon
//!   as the previous one is answered. This finds the throughput; its latencies are service
//!   times under `concurrency` requests in flight and suffer from *coordinated omission*
//!   (a stalled server also stops the clients that would have measured the stall).
//! - **Open loop** (`rate` R): request `n` is due at `start + n / R`, whatever happened
//!   before, and its latency is measured **from that intended time**, as wrk2 does: a stall
//!   shows up in the latency of every request that should have been sent during it. At most
//!   `concurrency` requests are in flight; if the service cannot keep up, requests fall
//!   behind schedule and their queueing shows in the latency. The schedule is kept with a
//!   `timerfd` per worker on Linux (microseconds; tokio's timer, elsewhere, rounds up to
//!   whole milliseconds and would add up to 1 ms to every latency from the intended time);
//!   [`Report::service_time_us`] is from the actual send.
//!
//! Latencies are those of answered calls (OK and OVER_LIMIT); errors (transport failures,
//! error statuses, timeouts) are counted by reason. Every request sent ends as exactly one
//! of OK, OVER_LIMIT or error: `ok + over_limit + errors == sent`.
//!
//! Request `n` (from 0) uses the key index `i = n mod keys` in its descriptor template and
//! goes to address `n mod addresses` (round robin). Connections are opened before the clock
//! starts, so an unreachable address is an error before any load, never a count of errors.
//!
//! The comparison of issue 4 — the same load against a Sluice cluster and against a node
//! that asks Redis on every request, the storage-based throttling of seed 002 §4.3 that
//! envoyproxy/ratelimit uses — is [`compare`] of two reports.
//!
//! This is a driver around the network, not a decision core: it reads the monotonic clock
//! (tokio's, so paused-time tests work) and needs a tokio runtime with the timer and I/O
//! drivers enabled.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry as PbEntry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub mod delay_proxy;
// Sub-millisecond waits (the open loop's schedule, the delay proxy).
pub mod demo;
mod timer;
// gRPC calls on the client's own HTTP/2 (a task per connection, one write per wakeup),
// each key's request encoded once.
mod grpc_client;
use grpc_client::{GrpcConn, GrpcTarget};
// `POST /json` over HTTP/1.1 keep-alive connections.
mod http_client;
use http_client::{HttpBase, HttpConn};

/// The placeholder replaced by the key index in descriptor keys and values.
pub const KEY_PLACEHOLDER: &str = "{i}";

/// At most this many distinct error reasons are kept; further ones are counted as "other".
const MAX_ERROR_REASONS: usize = 16;

/// Up to this many keys, each key's gRPC request is encoded once before the load (a few
/// megabytes at most); above, every call encodes its own.
const ENCODED_KEYS: u64 = 100_000;

/// Workers share this many pairs of latency histograms at most.
const HISTOGRAM_SHARDS: usize = 8;

/// Where the load goes. Several addresses are used round robin, request by request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Envoy RLS v3 gRPC services: `host:port` or `http://host:port` (no TLS).
    Grpc(Vec<String>),
    /// HTTP services taking `POST {base}/json`: base URLs `http://host:port[/prefix]`
    /// (`host:port` alone means `http://`; no TLS).
    Http(Vec<String>),
}

impl Target {
    /// `"grpc"` or `"http"`.
    #[must_use]
    pub fn protocol(&self) -> &'static str {
        match self {
            Self::Grpc(_) => "grpc",
            Self::Http(_) => "http",
        }
    }

    /// The addresses, as given.
    #[must_use]
    pub fn addresses(&self) -> &[String] {
        match self {
            Self::Grpc(a) | Self::Http(a) => a,
        }
    }
}

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Send for this long (requests in flight at the end still complete and count).
    Duration(Duration),
    /// Send exactly this many requests.
    Requests(u64),
}

/// What load to send. Build with [`LoadSpec::new`] and adjust the public fields.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadSpec {
    /// The rate limit domain of every request.
    pub domain: String,
    /// The descriptors of every request, each a list of `(key, value)` entries; `{i}` in a
    /// key or value is replaced by the key index `n mod keys` of request `n`.
    pub descriptors: Vec<Vec<(String, String)>>,
    /// How many distinct key indices `{i}` takes (≥ 1).
    pub keys: u64,
    /// Requests in flight at most (closed loop: exactly) (≥ 1).
    pub concurrency: usize,
    /// gRPC connections per address, shared by the workers (HTTP/2 multiplexes them);
    /// `None`: one per worker. HTTP/1.1 always uses one connection per worker and address.
    pub connections: Option<usize>,
    /// When to stop.
    pub stop: Stop,
    /// Open loop at this many requests per second; `None`: closed loop.
    pub rate: Option<f64>,
    /// A call (or a connection attempt) not answered within this is an error.
    pub timeout: Duration,
    /// How often the progress callback of [`run`] is called.
    pub progress_every: Duration,
}

impl LoadSpec {
    /// A closed-loop load of 10 s with 32 workers on one key.
    #[must_use]
    pub fn new(domain: impl Into<String>, descriptors: Vec<Vec<(String, String)>>) -> Self {
        Self {
            domain: domain.into(),
            descriptors,
            keys: 1,
            concurrency: 32,
            connections: None,
            stop: Stop::Duration(Duration::from_secs(10)),
            rate: None,
            timeout: Duration::from_secs(5),
            progress_every: Duration::from_secs(1),
        }
    }

    /// Closed or open loop.
    #[must_use]
    pub fn mode(&self) -> Mode {
        if self.rate.is_some() {
            Mode::OpenLoop
        } else {
            Mode::ClosedLoop
        }
    }

    fn validate(&self) -> Result<(), LoadError> {
        let bad = |s: &str| Err(LoadError::InvalidSpec(s.to_owned()));
        if self.domain.is_empty() {
            return bad("the domain must not be empty (the service refuses such requests)");
        }
        if self.descriptors.is_empty() {
            return bad("at least one descriptor is needed (the service refuses none)");
        }
        if self.descriptors.iter().any(Vec::is_empty) {
            return bad("every descriptor needs at least one key=value entry");
        }
        if self.descriptors.iter().flatten().any(|(k, _)| k.is_empty()) {
            return bad("descriptor keys must not be empty");
        }
        if self.keys == 0 {
            return bad("keys must be at least 1");
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1");
        }
        if self.connections == Some(0) {
            return bad("connections must be at least 1");
        }
        match self.stop {
            Stop::Duration(d) if d.is_zero() => return bad("the duration must be positive"),
            Stop::Requests(0) => return bad("the number of requests must be at least 1"),
            _ => {}
        }
        if let Some(r) = self.rate
            && !(r.is_finite() && r > 0.0)
        {
            return bad("the rate must be a positive number of requests per second");
        }
        if self.timeout.is_zero() {
            return bad("the timeout must be positive");
        }
        if self.progress_every.is_zero() {
            return bad("the progress interval must be positive");
        }
        Ok(())
    }
}

/// Closed loop (throughput) or open loop (a fixed schedule, latency without coordinated
/// omission); see the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Each worker sends when its previous request is answered.
    ClosedLoop,
    /// Requests are due on a fixed schedule; latency counts from the due time.
    OpenLoop,
}

/// Counters so far, given to the progress callback of [`run`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Since the load started.
    pub elapsed: Duration,
    /// Requests sent so far (including those in flight).
    pub sent: u64,
    /// Answered OK.
    pub ok: u64,
    /// Answered OVER_LIMIT.
    pub over_limit: u64,
    /// Failed.
    pub errors: u64,
    /// Completed calls per second since the previous progress report.
    pub interval_throughput: f64,
}

/// Latency percentiles in microseconds (HDR histogram, 3 significant digits).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Calls measured.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// Largest.
    pub max: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        #[allow(clippy::cast_precision_loss)] // nanoseconds well below 2^53
        let us = |ns: u64| ns as f64 / 1_000.0;
        Some(Self {
            count: h.len(),
            mean: h.mean() / 1_000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p99_9: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        })
    }
}

/// The result of a run; serialises to JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `"grpc"` or `"http"`.
    pub protocol: String,
    /// The addresses, as given.
    pub addresses: Vec<String>,
    /// Closed or open loop.
    pub mode: Mode,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Connections per address.
    pub connections: usize,
    /// Open-loop schedule, requests per second.
    pub target_rate: Option<f64>,
    /// Distinct key indices.
    pub keys: u64,
    /// Seconds from the first send until every worker stopped (the last answer).
    pub elapsed_s: f64,
    /// Requests sent; `ok + over_limit + errors`.
    pub sent: u64,
    /// Answered OK.
    pub ok: u64,
    /// Answered OVER_LIMIT.
    pub over_limit: u64,
    /// Failed (see `errors_by_reason`).
    pub errors: u64,
    /// Completed calls per second over `elapsed_s`.
    pub throughput: f64,
    /// Latency of answered calls; in open loop from the time each was due.
    pub latency_us: Option<Latency>,
    /// Latency of answered calls from the actual send (the same as `latency_us` in closed
    /// loop).
    pub service_time_us: Option<Latency>,
    /// Errors counted by reason (at most 16 reasons, then `"other"`).
    pub errors_by_reason: BTreeMap<String, u64>,
}

/// One report against another: every ratio is `subject ÷ baseline`, so a throughput ratio
/// above 1 and latency ratios below 1 favour the subject. `None` where the baseline's
/// figure is zero or missing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Throughput.
    pub throughput: Option<f64>,
    /// Median latency.
    pub p50: Option<f64>,
    /// 90th percentile latency.
    pub p90: Option<f64>,
    /// 99th percentile latency.
    pub p99: Option<f64>,
    /// 99.9th percentile latency.
    pub p99_9: Option<f64>,
    /// Largest latency.
    pub max: Option<f64>,
}

/// The ratios of `subject` to `baseline` (issue 4's side-by-side comparison: a Sluice
/// cluster against a node asking Redis on every request, seed 002 §4.3).
#[must_use]
pub fn compare(subject: &Report, baseline: &Report) -> Comparison {
    fn ratio(a: f64, b: f64) -> Option<f64> {
        (b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
    }
    let lat = |f: fn(&Latency) -> f64| match (&subject.latency_us, &baseline.latency_us) {
        (Some(s), Some(b)) => ratio(f(s), f(b)),
        _ => None,
    };
    Comparison {
        throughput: ratio(subject.throughput, baseline.throughput),
        p50: lat(|l| l.p50),
        p90: lat(|l| l.p90),
        p99: lat(|l| l.p99),
        p99_9: lat(|l| l.p99_9),
        max: lat(|l| l.max),
    }
}

/// Why a run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The load specification cannot be sent.
    #[error("invalid load: {0}")]
    InvalidSpec(String),
    /// No addresses, or one that is not a usable address.
    #[error("bad address {address:?}: {reason}")]
    BadAddress {
        /// As given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An address did not accept a connection within the timeout.
    #[error("cannot connect to {address}: {reason}")]
    Unreachable {
        /// As given.
        address: String,
        /// The connection error.
        reason: String,
    },
    /// A worker task stopped abnormally (a bug).
    #[error("a load worker failed: {0}")]
    Worker(String),
}

/// Sends the load of `spec` to `target` and reports; calls `progress` every
/// `spec.progress_every` while it runs. Must run inside a tokio runtime (timer and I/O
/// enabled); the workers are spawned on it, so a multi-threaded runtime uses every thread.
///
/// # Errors
/// [`LoadError`] for an invalid spec or address, or an address that cannot be reached
/// before the load starts. Failures during the load are counted in the report instead.
pub async fn run<F: FnMut(&Progress) + Send>(
    target: &Target,
    spec: &LoadSpec,
    mut progress: F,
) -> Result<Report, LoadError> {
    spec.validate()?;
    let addresses = target.addresses();
    if addresses.is_empty() {
        return Err(LoadError::BadAddress {
            address: String::new(),
            reason: "no address given".to_owned(),
        });
    }
    let requests = Arc::new(Requests::new(spec));
    let (conns, connections) = connect_all(target, spec).await?;

    let shared = Arc::new(Shared {
        next: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        over_limit: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        reasons: Mutex::new(BTreeMap::new()),
    });
    let start = Instant::now();
    let plan = Plan {
        stop: spec.stop,
        rate: spec.rate,
        timeout: spec.timeout,
        start,
    };
    let empty = new_histogram()?;
    // Histograms shared by a few workers each: one pair per worker (256 by default, each
    // growing to hundreds of kilobytes) cost the generator more CPU in page faults than
    // its calls.
    let shards: Vec<_> = (0..conns.len().min(HISTOGRAM_SHARDS))
        .map(|_| {
            Arc::new(Mutex::new(Latencies {
                latency: empty.clone(),
                service: empty.clone(),
            }))
        })
        .collect();
    let mut workers = JoinSet::new();
    for (w, conn) in conns.into_iter().enumerate() {
        workers.spawn(worker(
            conn,
            Arc::clone(&requests),
            Arc::clone(&shared),
            plan,
            Arc::clone(&shards[w % shards.len()]),
        ));
    }

    let mut hist = empty.clone();
    let mut service = empty;
    let mut ticker = tokio::time::interval_at(start + spec.progress_every, spec.progress_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut last_tick, mut last_done) = (start, 0u64);
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                None => break,
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(LoadError::Worker(e.to_string())),
            },
            now = ticker.tick() => {
                let p = shared.progress(now - start);
                let done = p.ok + p.over_limit + p.errors;
                let dt = (now - last_tick).as_secs_f64();
                #[allow(clippy::cast_precision_loss)] // counts far below 2^53
                let interval_throughput = if dt > 0.0 { (done - last_done) as f64 / dt } else { 0.0 };
                (last_tick, last_done) = (now, done);
                progress(&Progress { interval_throughput, ..p });
            }
        }
    }

    for shard in &shards {
        let done = shard.lock();
        // Both are auto-resizing, so adding cannot run out of range.
        hist.add(&done.latency)
            .map_err(|e| LoadError::Worker(e.to_string()))?;
        service
            .add(&done.service)
            .map_err(|e| LoadError::Worker(e.to_string()))?;
    }
    // Until the last worker stopped: in a duration-bound run, at least the duration.
    let p = shared.progress(start.elapsed());
    let elapsed_s = p.elapsed.as_secs_f64();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^53
    let throughput = if elapsed_s > 0.0 {
        (p.ok + p.over_limit + p.errors) as f64 / elapsed_s
    } else {
        0.0
    };
    Ok(Report {
        protocol: target.protocol().to_owned(),
        addresses: addresses.to_vec(),
        mode: spec.mode(),
        concurrency: spec.concurrency,
        connections,
        target_rate: spec.rate,
        keys: spec.keys,
        elapsed_s,
        sent: p.sent,
        ok: p.ok,
        over_limit: p.over_limit,
        errors: p.errors,
        throughput,
        latency_us: Latency::of(&hist),
        service_time_us: Latency::of(&service),
        errors_by_reason: shared.reasons.lock().clone(),
    })
}

fn new_histogram() -> Result<Histogram<u64>, LoadError> {
    // Nanoseconds, 3 significant digits, growing to whatever is recorded.
    Histogram::new(3).map_err(|e| LoadError::Worker(e.to_string()))
}

/// Counters shared by the workers and the progress reports.
#[derive(Debug)]
struct Shared {
    /// The index of the next request to claim.
    next: AtomicU64,
    sent: AtomicU64,
    ok: AtomicU64,
    over_limit: AtomicU64,
    errors: AtomicU64,
    reasons: Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    fn progress(&self, elapsed: Duration) -> Progress {
        // Read the outcomes before `sent`, so that a snapshot never shows more outcomes
        // than requests sent.
        let ok = self.ok.load(Ordering::Acquire);
        let over_limit = self.over_limit.load(Ordering::Acquire);
        let errors = self.errors.load(Ordering::Acquire);
        Progress {
            elapsed,
            sent: self.sent.load(Ordering::Acquire),
            ok,
            over_limit,
            errors,
            interval_throughput: 0.0,
        }
    }

    fn error(&self, reason: String) {
        self.errors.fetch_add(1, Ordering::AcqRel);
        let mut reasons = self.reasons.lock();
        let key = if reasons.len() < MAX_ERROR_REASONS || reasons.contains_key(&reason) {
            reason
        } else {
            "other".to_owned()
        };
        *reasons.entry(key).or_insert(0) += 1;
    }
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    stop: Stop,
    rate: Option<f64>,
    timeout: Duration,
    start: Instant,
}

impl Plan {
    /// When request `n` is due: now in closed loop, on the schedule in open loop; `None`
    /// once the load is over.
    fn due(&self, n: u64) -> Option<Option<Instant>> {
        match self.stop {
            Stop::Requests(total) if n >= total => return None,
            Stop::Duration(d) if self.rate.is_none() && self.start.elapsed() >= d => return None,
            _ => {}
        }
        let Some(rate) = self.rate else {
            return Some(None);
        };
        #[allow(clippy::cast_precision_loss)] // request indices far below 2^53
        let offset = Duration::try_from_secs_f64(n as f64 / rate).ok()?;
        match self.stop {
            Stop::Duration(d) if offset >= d => None,
            _ => Some(Some(self.start + offset)),
        }
    }
}

/// Latencies from the due time and from the send, of the workers sharing them.
struct Latencies {
    latency: Histogram<u64>,
    service: Histogram<u64>,
}

enum Outcome {
    Ok,
    OverLimit,
    Error(String),
}

async fn worker(
    mut conn: Conn,
    requests: Arc<Requests>,
    shared: Arc<Shared>,
    plan: Plan,
    latencies: Arc<Mutex<Latencies>>,
) {
    let mut body = String::new();
    // The open loop keeps its schedule to the microsecond; without a timer, to tokio's
    // millisecond.
    let mut timer = plan.rate.and_then(|_| timer::Timer::new().ok());
    loop {
        let n = shared.next.fetch_add(1, Ordering::Relaxed);
        let Some(due) = plan.due(n) else { break };
        if let Some(due) = due {
            let precise = match &mut timer {
                Some(t) => t.sleep_until(due).await.is_ok(),
                None => false,
            };
            if !precise {
                tokio::time::sleep_until(due).await;
            }
        }
        let sent_at = Instant::now();
        shared.sent.fetch_add(1, Ordering::AcqRel);
        let outcome =
            match tokio::time::timeout(plan.timeout, conn.call(&requests, n, &mut body)).await {
                Ok(o) => o,
                Err(_) => {
                    conn.after_timeout(n);
                    Outcome::Error(format!("no answer within {:?}", plan.timeout))
                }
            };
        let end = Instant::now();
        match outcome {
            Outcome::Ok => shared.ok.fetch_add(1, Ordering::AcqRel),
            Outcome::OverLimit => shared.over_limit.fetch_add(1, Ordering::AcqRel),
            Outcome::Error(reason) => {
                shared.error(reason);
                continue;
            }
        };
        let from_due = end - due.unwrap_or(sent_at);
        let mut l = latencies.lock();
        record(&mut l.latency, from_due);
        record(&mut l.service, end - sent_at);
    }
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    // Auto-resizing: fails only past i64::MAX / 2 ns (centuries); clamp then.
    if h.record(ns).is_err() {
        h.saturating_record(ns);
    }
}

/// The requests, prepared once: request `n` is rendered from these with `n mod keys`.
#[derive(Debug)]
struct Requests {
    keys: u64,
    domain: String,
    /// Per descriptor, per entry: key and value templates.
    descriptors: Vec<Vec<(Template, Template)>>,
    /// The JSON body up to the descriptors (not a template).
    json_head: String,
    /// The rest of the JSON body as a template: `{i}` needs no JSON escaping and JSON
    /// escapes contain no braces, so every placeholder of a key or value survives
    /// serialisation unchanged and none appears elsewhere.
    json_tail: Template,
    /// The gRPC frame of key index `i`, for `i` below its length: one for every key when
    /// they are at most [`ENCODED_KEYS`], one for all when no descriptor is templated.
    grpc_frames: Vec<Bytes>,
}

impl Requests {
    fn new(spec: &LoadSpec) -> Self {
        // The domain is not a template: it goes into the fixed head, so that a `{i}` in it
        // stays as it is (as in the gRPC request).
        let json_head = format!(
            "{{\"domain\":{},\"descriptors\":",
            serde_json::Value::from(spec.domain.as_str())
        );
        let descriptors = serde_json::Value::Array(
            spec.descriptors
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "entries": d.iter()
                            .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                            .collect::<Vec<_>>(),
                    })
                })
                .collect(),
        );
        let mut requests = Self {
            keys: spec.keys,
            domain: spec.domain.clone(),
            descriptors: spec
                .descriptors
                .iter()
                .map(|d| {
                    d.iter()
                        .map(|(k, v)| (Template::new(k), Template::new(v)))
                        .collect()
                })
                .collect(),
            json_head,
            json_tail: Template::new(&format!("{descriptors}}}")),
            grpc_frames: Vec::new(),
        };
        let templated = requests
            .descriptors
            .iter()
            .flatten()
            .any(|(k, v)| k.parts.len() > 1 || v.parts.len() > 1);
        let encoded = match (templated, spec.keys) {
            (false, _) => 1,
            (true, keys) if keys <= ENCODED_KEYS => keys,
            (true, _) => 0,
        };
        requests.grpc_frames = (0..encoded)
            .map(|i| grpc_client::frame(&requests.grpc(i)))
            .collect();
        requests
    }

    /// The gRPC frame of request `n`.
    fn grpc_frame(&self, n: u64) -> Bytes {
        let stored = self.grpc_frames.len() as u64;
        if stored > 0 {
            let i = usize::try_from(n % self.keys % stored).unwrap_or(0);
            if let Some(f) = self.grpc_frames.get(i) {
                return f.clone();
            }
        }
        grpc_client::frame(&self.grpc(n))
    }

    fn grpc(&self, n: u64) -> RateLimitRequest {
        let i = n % self.keys;
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self
                .descriptors
                .iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .iter()
                        .map(|(k, v)| PbEntry {
                            key: k.render(i),
                            value: v.render(i),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    fn json(&self, n: u64, out: &mut String) {
        out.clear();
        out.push_str(&self.json_head);
        self.json_tail.render_into(n % self.keys, out);
    }
}

/// A string with `{i}` placeholders, split at them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template {
    parts: Vec<String>,
}

impl Template {
    fn new(s: &str) -> Self {
        Self {
            parts: s.split(KEY_PLACEHOLDER).map(str::to_owned).collect(),
        }
    }

    fn render(&self, i: u64) -> String {
        match self.parts.as_slice() {
            [only] => only.clone(),
            _ => {
                let mut s = String::new();
                self.render_into(i, &mut s);
                s
            }
        }
    }

    fn render_into(&self, i: u64, out: &mut String) {
        for (k, part) in self.parts.iter().enumerate() {
            if k > 0 {
                // Writing to a String cannot fail.
                let _ = write!(out, "{i}");
            }
            out.push_str(part);
        }
    }
}

/// One worker's connections: one per address, used round robin by request index.
enum Conn {
    Grpc(Vec<GrpcConn>),
    Http(Vec<HttpConn>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Grpc(c) => write!(f, "Grpc({} clients)", c.len()),
            Self::Http(c) => write!(f, "Http({} connections)", c.len()),
        }
    }
}

impl Conn {
    async fn call(&mut self, requests: &Requests, n: u64, body: &mut String) -> Outcome {
        match self {
            Self::Grpc(conns) => {
                let Some(conn) = pick(conns, n) else {
                    return Outcome::Error("no connection".to_owned());
                };
                conn.call(requests.grpc_frame(n)).await
            }
            Self::Http(conns) => {
                let Some(conn) = pick(conns, n) else {
                    return Outcome::Error("no connection".to_owned());
                };
                requests.json(n, body);
                conn.call(Bytes::copy_from_slice(body.as_bytes())).await
            }
        }
    }

    /// A call of request `n` timed out: an HTTP/1.1 connection may still deliver its late
    /// answer as the answer to the next request, so drop it (HTTP/2 matches answers to
    /// streams: the dropped call has reset its stream).
    fn after_timeout(&mut self, n: u64) {
        if let Self::Http(conns) = self
            && let Some(c) = pick(conns, n)
        {
            c.sender = None;
        }
    }
}

fn pick<T>(v: &mut [T], n: u64) -> Option<&mut T> {
    let len = u64::try_from(v.len()).ok()?;
    if len == 0 {
        return None;
    }
    // The remainder is below `len`, which came from a usize.
    let k = usize::try_from(n % len).ok()?;
    v.get_mut(k)
}

/// Opens every connection before the load starts. Returns one [`Conn`] per worker and the
/// number of connections per address.
async fn connect_all(target: &Target, spec: &LoadSpec) -> Result<(Vec<Conn>, usize), LoadError> {
    match target {
        Target::Grpc(addresses) => {
            let targets = addresses
                .iter()
                .map(|a| GrpcTarget::parse(a).map(|t| (a, t)))
                .collect::<Result<Vec<_>, _>>()?;
            let connections = spec
                .connections
                .unwrap_or(spec.concurrency)
                .min(spec.concurrency);
            let mut sets = Vec::with_capacity(connections);
            for _ in 0..connections {
                let mut set = Vec::with_capacity(targets.len());
                for (address, target) in &targets {
                    let conn = target.connect(spec.timeout).await.map_err(|reason| {
                        LoadError::Unreachable {
                            address: (*address).clone(),
                            reason,
                        }
                    })?;
                    set.push(conn);
                }
                sets.push(set);
            }
            let conns = (0..spec.concurrency)
                .map(|w| Conn::Grpc(sets[w % connections].clone()))
                .collect();
            Ok((conns, connections))
        }
        Target::Http(addresses) => {
            let bases = addresses
                .iter()
                .map(|a| HttpBase::parse(a).map(|b| (a, b)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut conns = Vec::with_capacity(spec.concurrency);
            for _ in 0..spec.concurrency {
                let mut set = Vec::with_capacity(bases.len());
                for (address, base) in &bases {
                    let mut c = HttpConn {
                        base: Arc::clone(base),
                        sender: None,
                        timeout: spec.timeout,
                    };
                    c.connect().await.map_err(|reason| LoadError::Unreachable {
                        address: (*address).clone(),
                        reason,
                    })?;
                    set.push(c);
                }
                conns.push(Conn::Http(set));
            }
            Ok((conns, spec.concurrency))
        }
    }
}

/// An error with its sources (transport errors say little at the top level:
/// "transport error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

#[cfg(test)]
mod tests;
