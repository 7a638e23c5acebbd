//! The async client a node's engine calls: the token servers as a [`Center`] (leases, and
//! the calls that take them), behind the fallback every center shares
//! ([`FallbackLimiter`]: the lease while it lasts, then the node's share, probes, and the
//! share's debt charged with the next grant request).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sluice_center::{
    Center, CenterError, FallbackConfig, FallbackLimiter, Mode, Share, Source, Transition,
};
use sluice_limits::{AlgorithmKind, AnyAlgorithm, Decision, Limit, Nanos, Options};

use super::book::{LeaseBook, Local, RequestSizing};
use super::transport::Pool;
use super::{GrantRequest, Message, Reply, ServerAddr};
use crate::peer::PeerKey;

/// Where a node's `coordination: token-server` rules are decided now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenMode {
    /// By a token server's leases.
    Central,
    /// Locally: the lease while it lasts, then `1/N` of the limit.
    Fallback,
}

/// The state of a node's token client, for `/metrics` and `/v1/cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TokenStatus {
    /// Central or fallback.
    pub mode: TokenMode,
    /// When the current mode began (ns since the unix epoch); `None` while central since
    /// the start.
    pub since: Option<Nanos>,
    /// Changes of mode so far.
    pub transitions: u64,
    /// The id of the token server this node asks now.
    pub server: u32,
    /// The fallback's share is `1/nodes` of each limit.
    pub nodes: u64,
    /// Calls to token servers (grants asked for).
    pub calls: u64,
    /// Permits granted to this node so far.
    pub granted: u64,
    /// Decisions made from leases.
    pub decisions_central: u64,
    /// Decisions made locally (fallback share).
    pub decisions_local: u64,
}

/// How a node reaches its token servers.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// The servers, primary first.
    pub servers: Vec<ServerAddr>,
    /// This node's id in sealed messages.
    pub node_id: u32,
    /// The shared key.
    pub key: PeerKey,
    /// Every call's deadline (default 50 ms): past it the node decides locally.
    pub timeout: Duration,
    /// Nodes sharing the rules: the fallback decides with `1/nodes` of each limit.
    pub nodes: u64,
    /// During a fallback, one request per this interval asks a server again (100 ms).
    pub probe_every: Duration,
    /// Request sizing.
    pub sizing: RequestSizing,
}

impl ClientSpec {
    /// Defaults: 50 ms timeout, 100 ms probes.
    #[must_use]
    pub fn new(servers: Vec<ServerAddr>, node_id: u32, key: PeerKey, nodes: u64) -> Self {
        Self {
            servers,
            node_id,
            key,
            timeout: Duration::from_millis(50),
            nodes: nodes.max(1),
            probe_every: Duration::from_millis(100),
            sizing: RequestSizing::default(),
        }
    }
}

/// Why no token server granted: it did not answer within the timeout, is standing by or
/// starting, refused the request, or answered out of turn. Every such answer sends the node
/// to its fallback.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotServed(String);

impl CenterError for NotServed {
    fn is_unavailable(&self) -> bool {
        true
    }
}

/// The token servers as a [`Center`]: the node's leases, and the calls that take them.
pub(crate) struct Servers {
    spec: ClientSpec,
    book: parking_lot::Mutex<LeaseBook>,
    pool: Pool,
    current: AtomicUsize,
    calls: AtomicU64,
    granted: AtomicU64,
}

impl std::fmt::Debug for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Servers")
            .field("servers", &self.spec.servers)
            .finish_non_exhaustive()
    }
}

impl Servers {
    fn new(spec: ClientSpec) -> Self {
        let n = spec.servers.len();
        Self {
            book: parking_lot::Mutex::new(LeaseBook::new(spec.sizing)),
            spec,
            pool: Pool::new(n),
            current: AtomicUsize::new(0),
            calls: AtomicU64::new(0),
            granted: AtomicU64::new(0),
        }
    }

    /// Asks the current server for `want` permits of `key` (after it counts `charge`) and
    /// decides the request of `cost` from what it grants.
    #[allow(clippy::too_many_arguments)]
    async fn ask(
        &self,
        kind: AlgorithmKind,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        want: u64,
        charge: u64,
    ) -> Result<Decision, NotServed> {
        let n = self.spec.servers.len().max(1);
        let i = self.current.load(Ordering::Acquire) % n;
        let Some(server) = self.spec.servers.get(i) else {
            return Err(NotServed("no token server listed".into()));
        };
        let message = Message::Grant(GrantRequest {
            key: key.to_string(),
            algorithm: kind.name().to_string(),
            count: limit.count(),
            period: limit.period(),
            burst: limit.burst(),
            want,
            cost,
            charge,
        });
        self.calls.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let reply = self
            .pool
            .call_within(
                self.spec.timeout,
                i,
                server,
                &self.spec.key,
                self.spec.node_id,
                &message,
            )
            .await;
        // The lease is applied when the answer is here, not when the request was sent: a
        // grant that arrives after its validity must not admit.
        let now_sent = now;
        let now = now.saturating_add(nanos(started.elapsed()));
        let cause = match reply {
            Ok(Reply::Grant {
                granted,
                valid_for,
                retry_after,
                ..
            }) => {
                self.granted.fetch_add(granted, Ordering::Relaxed);
                return Ok(self.book.lock().apply(
                    key,
                    kind,
                    limit,
                    now_sent,
                    now,
                    cost,
                    granted,
                    valid_for,
                    retry_after,
                ));
            }
            Ok(Reply::Starting { serving_in }) => format!(
                "server {} starts serving in {} ms",
                server.id,
                serving_in / 1_000_000
            ),
            Ok(Reply::Standby { holder }) => {
                // Ask the holder it names, else the next server.
                let to = holder
                    .and_then(|h| self.spec.servers.iter().position(|s| s.id == h))
                    .filter(|&h| h != i)
                    .unwrap_or((i + 1) % n);
                let _ = self
                    .current
                    .compare_exchange(i, to, Ordering::AcqRel, Ordering::Acquire);
                format!("server {} is standing by", server.id)
            }
            Ok(Reply::Refused { reason }) => {
                format!("server {} refused the request: {reason:?}", server.id)
            }
            Ok(Reply::Vote { .. }) => format!("server {} answered out of turn", server.id),
            Err(e) => {
                // Not answering: try the next one (in order, then around).
                let _ = self.current.compare_exchange(
                    i,
                    (i + 1) % n,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                format!("server {}: {e}", server.id)
            }
        };
        Err(NotServed(cause))
    }
}

impl Center for Servers {
    type Error = NotServed;

    /// From the lease (or a server's recent refusal) when it can, else a grant request.
    async fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, NotServed> {
        let kind = alg.kind();
        let local = self.book.lock().try_local(key, kind, limit, now, cost);
        match local {
            Local::Decided(d) => Ok(d),
            Local::Ask(want) => self.ask(kind, key, limit, now, cost, want, 0).await,
        }
    }

    fn held(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Option<Decision> {
        self.book.lock().held(key, alg.kind(), limit, now, cost)
    }

    /// A grant request whatever the lease holds, carrying the share's debt
    /// ([`GrantRequest::charge`]): the server counts it before it grants.
    async fn probe(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        charge: u64,
    ) -> Result<Decision, NotServed> {
        let kind = alg.kind();
        let want = self.book.lock().want(key, kind, now, cost);
        self.ask(kind, key, limit, now, cost, want, charge).await
    }
}

/// A node's client of the token servers (see the module documentation). Never fails; no
/// decision waits longer than the timeout.
pub struct TokenClient {
    limiter: FallbackLimiter<Servers>,
    /// The algorithms as the engine configures them (default options), by kind.
    algorithms: Vec<AnyAlgorithm>,
    nodes: u64,
}

impl std::fmt::Debug for TokenClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenClient")
            .field("servers", &self.limiter.central().spec.servers)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl TokenClient {
    /// A client of `spec.servers` (does not connect yet).
    #[must_use]
    pub fn new(spec: ClientSpec) -> Self {
        let nodes = spec.nodes.max(1);
        let fallback = FallbackConfig {
            share: Share::one_of(nodes),
            probe_every: nanos(spec.probe_every),
        };
        Self {
            limiter: FallbackLimiter::new(Servers::new(spec), fallback),
            algorithms: AlgorithmKind::ALL
                .iter()
                .map(|&k| AnyAlgorithm::new(k, Options::default()))
                .collect(),
            nodes,
        }
    }

    /// The current state and counters.
    #[must_use]
    pub fn status(&self) -> TokenStatus {
        let stats = self.limiter.stats();
        let servers = self.limiter.central();
        let i = servers.current.load(Ordering::Relaxed);
        TokenStatus {
            mode: match stats.mode {
                Mode::Central => TokenMode::Central,
                Mode::Fallback { .. } => TokenMode::Fallback,
            },
            since: stats.since,
            transitions: stats.transitions,
            server: servers.spec.servers.get(i).map_or(0, |s| s.id),
            nodes: self.nodes,
            calls: servers.calls.load(Ordering::Relaxed),
            granted: servers.granted.load(Ordering::Relaxed),
            decisions_central: stats.decisions_central,
            decisions_local: stats.decisions_local,
        }
    }

    /// The limit this node applies on its own in fallback: `1/nodes` of `limit`.
    #[must_use]
    pub fn fallback_limit(&self, limit: &Limit) -> Limit {
        self.limiter.config().share.apply(limit)
    }

    /// Decides `cost` permits of `key` under `limit` at `now` (the node's clock, ns since
    /// the unix epoch). Never fails; never waits longer than the timeout.
    pub async fn decide(
        &self,
        kind: AlgorithmKind,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        self.check(kind, key, limit, now, cost).await.0
    }

    /// [`TokenClient::decide`], saying who decided: [`Source::Central`] for a lease (or a
    /// server's refusal), [`Source::Local`] for the fallback share.
    pub async fn check(
        &self,
        kind: AlgorithmKind,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Source) {
        let Some(alg) = self.algorithms.get(kind.index()) else {
            return (
                Decision::deny(limit.count(), 0, limit.period(), None),
                Source::Local,
            );
        };
        let out = self.limiter.check(alg, key, limit, now, cost).await;
        // Only the call that changed the mode carries the transition: one line per change.
        match out.transition {
            Some(Transition::ToFallback { cause }) => tracing::warn!(
                %cause,
                nodes = self.nodes,
                "token server does not serve: deciding coordination: token-server rules locally (the lease while it lasts, then 1/{} of each limit)",
                self.nodes
            ),
            Some(Transition::ToCentral { fallback_since }) => tracing::info!(
                server = self.status().server,
                fallback_ms = now.saturating_sub(fallback_since) / 1_000_000,
                "token server answers again: coordination: token-server rules are decided by its leases"
            ),
            None => {}
        }
        (out.decision, out.source)
    }

    /// Permits this node holds in unexpired leases at `now`.
    #[must_use]
    pub fn held(&self, now: Nanos) -> u64 {
        self.limiter.central().book.lock().held_permits(now)
    }

    /// What `key`'s fallback share owes the servers at `now` (permits no server counted
    /// yet).
    #[must_use]
    pub fn owed(&self, kind: AlgorithmKind, key: &str, limit: &Limit, now: Nanos) -> u64 {
        self.algorithms
            .get(kind.index())
            .map_or(0, |alg| self.limiter.owed(alg, key, limit, now))
    }
}

fn nanos(d: Duration) -> Nanos {
    sluice_limits::clock::nanos(d)
}
