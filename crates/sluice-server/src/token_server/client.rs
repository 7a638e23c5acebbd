//! The async client a node's engine calls: leases from the token servers, the local
//! fallback while none grants.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sluice_limits::{AlgorithmKind, Decision, Limit, Nanos};
use sluice_redis::{Share, Source};

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

/// A node's client of the token servers (see the module documentation). Never fails; no
/// decision waits longer than the timeout.
pub struct TokenClient {
    spec: ClientSpec,
    book: parking_lot::Mutex<LeaseBook>,
    pool: Pool,
    current: AtomicUsize,
    /// 0: central; else the fallback's start + 1.
    fallback_since: AtomicU64,
    changed_at: AtomicU64,
    next_probe: AtomicU64,
    probing: AtomicBool,
    transitions: AtomicU64,
    calls: AtomicU64,
    granted: AtomicU64,
    central: AtomicU64,
    local_decisions: AtomicU64,
}

impl std::fmt::Debug for TokenClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenClient")
            .field("servers", &self.spec.servers)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// A key's debt on its way to a server: still owed if the request ends (or is dropped)
/// without a grant.
struct Owed<'a> {
    book: &'a parking_lot::Mutex<LeaseBook>,
    key: &'a str,
    kind: AlgorithmKind,
    counted: bool,
}

impl Drop for Owed<'_> {
    fn drop(&mut self) {
        if !self.counted {
            self.book.lock().charged(self.key, self.kind, false);
        }
    }
}

/// Marks the end of a probe when dropped.
struct ProbeGuard<'a>(&'a AtomicBool);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl TokenClient {
    /// A client of `spec.servers` (does not connect yet).
    #[must_use]
    pub fn new(spec: ClientSpec) -> Self {
        let n = spec.servers.len();
        Self {
            book: parking_lot::Mutex::new(LeaseBook::new(spec.sizing).with_nodes(spec.nodes)),
            spec,
            pool: Pool::new(n),
            current: AtomicUsize::new(0),
            fallback_since: AtomicU64::new(0),
            changed_at: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            transitions: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            central: AtomicU64::new(0),
            local_decisions: AtomicU64::new(0),
        }
    }

    /// The current state and counters.
    #[must_use]
    pub fn status(&self) -> TokenStatus {
        let f = self.fallback_since.load(Ordering::Acquire);
        let (mode, since) = match f {
            0 => (
                TokenMode::Central,
                self.changed_at.load(Ordering::Acquire).checked_sub(1),
            ),
            s => (TokenMode::Fallback, Some(s - 1)),
        };
        let i = self.current.load(Ordering::Relaxed);
        TokenStatus {
            mode,
            since,
            transitions: self.transitions.load(Ordering::Relaxed),
            server: self.spec.servers.get(i).map_or(0, |s| s.id),
            nodes: self.spec.nodes,
            calls: self.calls.load(Ordering::Relaxed),
            granted: self.granted.load(Ordering::Relaxed),
            decisions_central: self.central.load(Ordering::Relaxed),
            decisions_local: self.local_decisions.load(Ordering::Relaxed),
        }
    }

    /// The limit this node applies on its own in fallback: `1/nodes` of `limit`.
    #[must_use]
    pub fn fallback_limit(&self, limit: &Limit) -> Limit {
        Share::one_of(self.spec.nodes).apply(limit)
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
        let want = match self.book.lock().try_local(key, kind, limit, now, cost) {
            Local::Decided(d) => {
                self.central.fetch_add(1, Ordering::Relaxed);
                return (d, Source::Central);
            }
            Local::Ask(want) => want,
        };
        let mut since = self.fallback_since.load(Ordering::Acquire);
        let _guard = if since != 0 {
            let probe = now >= self.next_probe.load(Ordering::Acquire)
                && !self.probing.swap(true, Ordering::AcqRel);
            if probe {
                self.next_probe.store(
                    now.saturating_add(nanos(self.spec.probe_every)),
                    Ordering::Release,
                );
                Some(ProbeGuard(&self.probing))
            } else if let Some(out) = self.local_in_fallback(kind, key, limit, now, cost) {
                return out;
            } else {
                // A server granted again meanwhile.
                since = 0;
                None
            }
        } else {
            None
        };
        // What the key's share admitted goes with the request, so the server counts it
        // before it grants; while another request carries it, decide locally.
        let Some(charge) = self.book.lock().charge(key, kind, limit, now) else {
            return self.local(kind, key, limit, now, cost);
        };
        let mut owed = (charge > 0).then(|| Owed {
            book: &self.book,
            key,
            kind,
            counted: false,
        });
        let n = self.spec.servers.len().max(1);
        let i = self.current.load(Ordering::Acquire) % n;
        let Some(server) = self.spec.servers.get(i) else {
            return self.local(kind, key, limit, now, cost);
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
        // The decision is made when the answer (or the timeout) is here, not when the
        // request was sent: a grant that arrives after its validity must not admit, and a
        // permit counted by the server in one window must not be attributed to the last.
        let now_sent = now;
        let now = now.saturating_add(nanos(started.elapsed()));
        match reply {
            Ok(Reply::Grant {
                granted,
                valid_for,
                retry_after,
                ..
            }) => {
                self.granted.fetch_add(granted, Ordering::Relaxed);
                self.central.fetch_add(1, Ordering::Relaxed);
                // Under the book's lock: a local decision either comes before the switch (and
                // is owed) or sees it.
                let mut book = self.book.lock();
                if since != 0
                    && let Ok(s) = self.fallback_since.compare_exchange(
                        since,
                        0,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                {
                    self.changed(now);
                    tracing::info!(
                        server = server.id,
                        fallback_ms = now.saturating_sub(s - 1) / 1_000_000,
                        "token server answers again: coordination: token-server rules are decided by its leases"
                    );
                }
                if let Some(o) = owed.as_mut() {
                    // The server counted the charge with this grant.
                    o.counted = true;
                    book.charged(key, kind, true);
                }
                let d = book.apply(
                    key,
                    kind,
                    limit,
                    now_sent,
                    now,
                    cost,
                    granted,
                    valid_for,
                    retry_after,
                );
                (d, Source::Central)
            }
            other => {
                // Not counted, as far as this node knows: still owed.
                drop(owed);
                let cause = match other {
                    Ok(Reply::Starting { serving_in }) => {
                        format!(
                            "server {} starts serving in {} ms",
                            server.id,
                            serving_in / 1_000_000
                        )
                    }
                    Ok(Reply::Standby { holder }) => {
                        // Ask the holder it names, else the next server.
                        let to = holder
                            .and_then(|h| self.spec.servers.iter().position(|s| s.id == h))
                            .filter(|&h| h != i)
                            .unwrap_or((i + 1) % n);
                        let _ = self.current.compare_exchange(
                            i,
                            to,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                        format!("server {} is standing by", server.id)
                    }
                    Ok(Reply::Refused { reason }) => {
                        format!("server {} refused the request: {reason:?}", server.id)
                    }
                    Ok(Reply::Vote { .. } | Reply::Grant { .. }) => {
                        format!("server {} answered out of turn", server.id)
                    }
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
                if since == 0 {
                    self.next_probe.store(
                        now.saturating_add(nanos(self.spec.probe_every)),
                        Ordering::Release,
                    );
                    if self
                        .fallback_since
                        .compare_exchange(
                            0,
                            now.saturating_add(1),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        self.changed(now);
                        tracing::warn!(
                            %cause,
                            nodes = self.spec.nodes,
                            "token server does not serve: deciding coordination: token-server rules locally (the lease while it lasts, then 1/{} of each limit)",
                            self.spec.nodes
                        );
                    }
                }
                self.local(kind, key, limit, now, cost)
            }
        }
    }

    /// In fallback, without a server ([`LeaseBook::fallback`]); `None` if a server granted
    /// again meanwhile and no request carries the key's debt: the caller asks a server.
    fn local_in_fallback(
        &self,
        kind: AlgorithmKind,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Option<(Decision, Source)> {
        let mut book = self.book.lock();
        if self.fallback_since.load(Ordering::Acquire) == 0 && !book.charging(key, kind) {
            return None;
        }
        let (d, source) = book.fallback(key, kind, limit, now, cost);
        drop(book);
        match source {
            Source::Central => self.central.fetch_add(1, Ordering::Relaxed),
            Source::Local => self.local_decisions.fetch_add(1, Ordering::Relaxed),
        };
        Some((d, source))
    }

    fn changed(&self, now: Nanos) {
        self.transitions.fetch_add(1, Ordering::Relaxed);
        self.changed_at
            .store(now.saturating_add(1), Ordering::Release);
    }

    /// Fallback: the lease while it is valid, then the node's share ([`LeaseBook::fallback`]).
    fn local(
        &self,
        kind: AlgorithmKind,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Source) {
        let (d, source) = self.book.lock().fallback(key, kind, limit, now, cost);
        match source {
            Source::Central => self.central.fetch_add(1, Ordering::Relaxed),
            Source::Local => self.local_decisions.fetch_add(1, Ordering::Relaxed),
        };
        (d, source)
    }

    /// Permits this node holds in unexpired leases at `now`.
    #[must_use]
    pub fn held(&self, now: Nanos) -> u64 {
        self.book.lock().held(now)
    }
}

fn nanos(d: Duration) -> Nanos {
    sluice_limits::clock::nanos(d)
}
