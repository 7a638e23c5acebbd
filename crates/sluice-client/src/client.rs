//! The lease refresher (tokio, HTTP/1.1) around a [`LocalLimiter`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_limits::{Clock, Nanos, SystemClock};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::limiter::LocalLimiter;

const NS_PER_MS: u64 = 1_000_000;
const LEASE_PATH: &str = "/v1/lease";

/// What a [`LeaseClient`] asks for, where, and how it behaves without a lease.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    server: String,
    domain: String,
    entries: Vec<(String, String)>,
    client_id: String,
    wants: f64,
    fallback_rate: f64,
    burst: Duration,
    timeout: Duration,
    min_backoff: Duration,
    max_backoff: Duration,
}

impl LeaseConfig {
    /// `wants` requests per second of the resource `domain` + `entries` from the node at
    /// `server` (`http://host:port`), as `client_id` (unique among the node's clients of
    /// the resource; asking again with the same id refreshes rather than adds a client).
    ///
    /// Defaults: fallback rate 0 (nothing admitted without a valid lease), bursts of 100 ms
    /// of the rate (at least one request), 2 s per HTTP call, backoff from 100 ms to 5 s.
    pub fn new<K: Into<String>, V: Into<String>>(
        server: impl Into<String>,
        domain: impl Into<String>,
        entries: impl IntoIterator<Item = (K, V)>,
        client_id: impl Into<String>,
        wants: f64,
    ) -> Self {
        Self {
            server: server.into(),
            domain: domain.into(),
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            client_id: client_id.into(),
            wants,
            fallback_rate: 0.0,
            burst: Duration::from_millis(100),
            timeout: Duration::from_secs(2),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }

    /// The rate (per second) admitted while no valid lease is held: before the first grant
    /// and after a grant expires without a refresh. Choose it so that all clients together
    /// stay within the limit (e.g. the limit divided by the number of clients).
    #[must_use]
    pub fn fallback_rate(mut self, rate: f64) -> Self {
        self.fallback_rate = rate;
        self
    }

    /// The local bucket: how much of the rate may be taken at once (at least one request).
    #[must_use]
    pub fn burst(mut self, burst: Duration) -> Self {
        self.burst = burst;
        self
    }

    /// The longest an HTTP call to the node may take (connection included).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Retry delays after a failed call: from `min`, doubling, up to `max`.
    #[must_use]
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }
}

/// Why the client cannot start, or a call to the node failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The server address is not `http://host:port`.
    #[error("server must be http://host[:port], not {0:?}")]
    BadServer(String),
    /// A configuration value is out of range.
    #[error("bad lease configuration: {0}")]
    BadConfig(String),
    /// The node could not be reached or the call failed.
    #[error("lease call failed: {0}")]
    Transport(String),
    /// The node refused the request (its status and reason).
    #[error("node answered {status}: {reason}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The node's one-line reason.
        reason: String,
    },
    /// The node's answer is not a lease.
    #[error("malformed lease answer: {0}")]
    Malformed(String),
    /// No lease arrived in time ([`LeaseClient::wait_for_lease`]).
    #[error("no lease within {0:?}")]
    NoLeaseYet(Duration),
}

/// The last lease received.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// Granted rate, requests per second.
    pub rate: f64,
    /// When it stops being valid, on the client's clock ([`LeaseClient::now`]).
    pub expires_at: Nanos,
    /// The rule's limit, per second (`None`: unlimited).
    pub limit: Option<f64>,
    /// The node's capacity for the resource, per second (`None`: unlimited).
    pub share: Option<f64>,
    /// Clients holding a lease on the resource at the node.
    pub clients: u64,
    /// The node's division rule (`max-min` or `proportional`).
    pub policy: String,
}

#[derive(Serialize)]
struct WireRequest<'a> {
    domain: &'a str,
    descriptor: WireDescriptor<'a>,
    client_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    wants: Option<f64>,
}

#[derive(Serialize)]
struct WireDescriptor<'a> {
    entries: Vec<WireEntry<'a>>,
}

#[derive(Serialize)]
struct WireEntry<'a> {
    key: &'a str,
    value: &'a str,
}

#[derive(Deserialize)]
struct WireGrant {
    rate: f64,
    expires_in_ms: u64,
    refresh_in_ms: u64,
    limit: Option<f64>,
    share: Option<f64>,
    #[serde(default)]
    policy: String,
    #[serde(default)]
    clients: u64,
}

/// What the refresher and the handle share.
#[derive(Debug)]
struct Shared {
    config: LeaseConfig,
    authority: String,
    limiter: LocalLimiter,
    clock: SystemClock,
    wants: Mutex<f64>,
    wake: Notify,
    lease: watch::Sender<Option<Lease>>,
    last_error: Mutex<Option<ClientError>>,
}

/// Keeps a capacity lease fresh in the background and throttles locally against it.
///
/// Dropping the client stops the refresher (the lease then lapses at its expiry);
/// [`LeaseClient::close`] also hands it back to the node at once.
#[derive(Debug)]
pub struct LeaseClient {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for LeaseClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeaseClient {
    /// Starts the refresher on the current tokio runtime; the first lease is asked for at
    /// once. Until it arrives the fallback rate applies ([`LeaseClient::wait_for_lease`]
    /// waits for it).
    ///
    /// # Errors
    /// [`ClientError::BadServer`] or [`ClientError::BadConfig`].
    ///
    /// # Panics
    /// Outside a tokio runtime (as `tokio::spawn`).
    pub fn start(config: LeaseConfig) -> Result<Self, ClientError> {
        let authority = authority_of(&config.server)?;
        if !config.wants.is_finite() || config.wants < 0.0 {
            return Err(ClientError::BadConfig(format!(
                "wants must be a finite rate ≥ 0, not {}",
                config.wants
            )));
        }
        if config.client_id.is_empty() || config.entries.is_empty() || config.domain.is_empty() {
            return Err(ClientError::BadConfig(
                "domain, descriptor entries and client_id must not be empty".to_owned(),
            ));
        }
        let (lease, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            limiter: LocalLimiter::new(config.fallback_rate, config.burst),
            wants: Mutex::new(config.wants),
            authority,
            config,
            clock: SystemClock::new(),
            wake: Notify::new(),
            lease,
            last_error: Mutex::new(None),
        });
        let task = tokio::spawn(refresh_loop(Arc::clone(&shared)));
        Ok(Self { shared, task })
    }

    /// Takes `n` permits now if the lease (or, without a valid one, the fallback rate)
    /// admits them. A local check: no I/O, no allocation, one atomic compare-and-swap.
    #[inline]
    pub fn try_acquire(&self, n: u64) -> bool {
        self.shared.limiter.try_acquire(self.shared.clock.now(), n)
    }

    /// The rate in force now, per second (the lease's, or the fallback).
    #[must_use]
    pub fn rate(&self) -> f64 {
        self.shared.limiter.rate(self.shared.clock.now())
    }

    /// Whether a lease is valid now.
    #[must_use]
    pub fn has_lease(&self) -> bool {
        self.shared.limiter.has_grant(self.shared.clock.now())
    }

    /// The last lease received (valid or not).
    #[must_use]
    pub fn lease(&self) -> Option<Lease> {
        self.shared.lease.borrow().clone()
    }

    /// The error of the last call to the node, if it failed.
    #[must_use]
    pub fn last_error(&self) -> Option<ClientError> {
        self.shared.last_error.lock().clone()
    }

    /// The client's clock (nanoseconds since the client started), which
    /// [`Lease::expires_at`] is read against.
    #[must_use]
    pub fn now(&self) -> Nanos {
        self.shared.clock.now()
    }

    /// Asks for another rate: the lease is refreshed at once with it.
    pub fn set_wants(&self, wants: f64) {
        if wants.is_finite() && wants >= 0.0 {
            *self.shared.wants.lock() = wants;
            self.shared.wake.notify_one();
        }
    }

    /// Waits until a lease newer than the current one arrives.
    ///
    /// # Errors
    /// [`ClientError::NoLeaseYet`] after `timeout`.
    pub async fn next_lease(&self, timeout: Duration) -> Result<Lease, ClientError> {
        let mut rx = self.shared.lease.subscribe();
        rx.borrow_and_update();
        let wait = async {
            loop {
                if rx.changed().await.is_err() {
                    return None;
                }
                if let Some(l) = rx.borrow_and_update().clone() {
                    return Some(l);
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Some(l)) => Ok(l),
            _ => Err(ClientError::NoLeaseYet(timeout)),
        }
    }

    /// Waits until a valid lease is held (at once if one is).
    ///
    /// # Errors
    /// [`ClientError::NoLeaseYet`] after `timeout`.
    pub async fn wait_for_lease(&self, timeout: Duration) -> Result<Lease, ClientError> {
        if self.has_lease()
            && let Some(l) = self.lease()
        {
            return Ok(l);
        }
        self.next_lease(timeout).await
    }

    /// Stops refreshing and gives the lease back to the node (best effort, bounded by the
    /// call timeout); the fallback rate applies from now on.
    pub async fn close(self) {
        self.task.abort();
        self.shared.limiter.revoke();
        let body = wire_body(&self.shared, None);
        let _ = tokio::time::timeout(
            self.shared.config.timeout,
            call(&self.shared.authority, Method::DELETE, body),
        )
        .await;
    }
}

fn wire_body(shared: &Shared, wants: Option<f64>) -> Bytes {
    let c = &shared.config;
    let request = WireRequest {
        domain: &c.domain,
        descriptor: WireDescriptor {
            entries: c
                .entries
                .iter()
                .map(|(k, v)| WireEntry { key: k, value: v })
                .collect(),
        },
        client_id: &c.client_id,
        wants,
    };
    // Strings and a number: serialising cannot fail.
    Bytes::from(serde_json::to_vec(&request).unwrap_or_default())
}

/// `host:port` of an `http://` address (port 80 when absent).
fn authority_of(server: &str) -> Result<String, ClientError> {
    let bad = || ClientError::BadServer(server.to_owned());
    let uri: Uri = server.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("http") {
        return Err(bad());
    }
    let host = uri.host().ok_or_else(bad)?;
    Ok(format!("{host}:{}", uri.port_u16().unwrap_or(80)))
}

async fn refresh_loop(shared: Arc<Shared>) {
    let c = &shared.config;
    let mut backoff = c.min_backoff;
    loop {
        // Expiry is counted from before the request leaves, so the client never holds a
        // grant past the node's own expiry, however long the answer takes.
        let sent = shared.clock.now();
        let wants = *shared.wants.lock();
        let body = wire_body(&shared, Some(wants));
        let outcome = match tokio::time::timeout(
            c.timeout,
            call(&shared.authority, Method::POST, body),
        )
        .await
        {
            Ok(Ok(bytes)) => serde_json::from_slice::<WireGrant>(&bytes)
                .map_err(|e| ClientError::Malformed(e.to_string())),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ClientError::Transport(format!(
                "no answer within {:?}",
                c.timeout
            ))),
        };
        let pause = match outcome {
            Ok(g) => {
                let expires_at = sent.saturating_add(g.expires_in_ms.saturating_mul(NS_PER_MS));
                shared.limiter.set_grant(g.rate, expires_at);
                *shared.last_error.lock() = None;
                shared.lease.send_replace(Some(Lease {
                    rate: g.rate,
                    expires_at,
                    limit: g.limit,
                    share: g.share,
                    clients: g.clients,
                    policy: g.policy,
                }));
                backoff = c.min_backoff;
                // As the node says, but never at or past the expiry (a node answering
                // nonsense must not make the lease lapse).
                let refresh = g.refresh_in_ms.min(g.expires_in_ms.saturating_mul(2) / 3);
                Duration::from_millis(refresh.max(1))
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "lease refresh failed");
                *shared.last_error.lock() = Some(e);
                let pause = backoff;
                backoff = (backoff * 2).min(c.max_backoff);
                pause
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shared.wake.notified() => {}
        }
    }
}

/// One HTTP/1.1 call on a new connection (a lease call comes once per refresh interval, so
/// a kept-alive connection would save little). The body of a 200, else the refusal.
async fn call(authority: &str, method: Method, body: Bytes) -> Result<Bytes, ClientError> {
    let transport = |e: &dyn std::fmt::Display| ClientError::Transport(e.to_string());
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| transport(&e))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| transport(&e))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = http::Request::builder()
        .method(method)
        .uri(LEASE_PATH)
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| transport(&e))?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| transport(&e))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(&e))?
            .to_bytes();
        if status == StatusCode::OK || status == StatusCode::NO_CONTENT {
            Ok(bytes)
        } else {
            Err(ClientError::Refused {
                status: status.as_u16(),
                reason: String::from_utf8_lossy(&bytes).trim().to_owned(),
            })
        }
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn server_addresses() {
        assert_eq!(
            authority_of("http://127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080"
        );
        assert_eq!(authority_of("http://localhost").unwrap(), "localhost:80");
        assert!(authority_of("https://x:1").is_err());
        assert!(authority_of("127.0.0.1:8080").is_err());
    }
}
