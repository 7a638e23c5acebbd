//! `coordination: token-server`: one Sluice node hands out a rule's permits to the others
//! in leased batches (seed 002 §4.4(3), the token server, with the batching rule of seed 002
//! §4.4(5)), and when it dies the next server of a configured order takes over.
//!
//! # The pieces
//!
//! - [`TokenServer`], a pure state machine (time is an argument): per rule and descriptor a
//!   central state of the rule's `sluice-limits` algorithm; a grant of `n` permits is a
//!   decision of cost `n` on it, so every permit given out was admitted centrally. A grant is
//!   the requester's measured rate over a horizon (the requester says how many it wants), at
//!   most half of what is left (batches shrink as the quota runs out) and at most
//!   `max_batch`; it comes with a validity (`lease`, and for a fixed window never past the
//!   window's end).
//! - [`LeaseBook`], the pure client side: per key the permits of the current lease, the
//!   measured consumption rate and the size to ask for next.
//! - [`TokenClient`], the async client a node's engine calls ([`crate::Engine::attach_token_server`]):
//!   answers from its lease, asks the server when the lease runs out, and while the server
//!   does not answer within the timeout decides locally — from its lease alone while the
//!   lease lasts (its permits, at its rate), then with `1/N` of the limit on a state that
//!   already counts what the node took from leases (seed 002 §4.4(4)) — probing one request
//!   per 100 ms until a server grants again. What the share admits is owed: the key's next
//!   grant request carries it ([`GrantRequest::charge`]) and the server counts it before it
//!   grants, so a server that answers again does not grant the window a second time.
//! - [`TokenServerNode`], the async server: the `POST /v1/token` endpoint ([`router`]) and
//!   the watch over the servers ranked before it.
//!
//! # Takeover
//!
//! The servers are ordered (primary, then successors). A server is *active* while none of
//! the servers ranked before it answers its pings (one every `heartbeat`, each within the
//! timeout, three missed in a row: down); an inactive one answers `standby`. A server that
//! becomes active (the primary at its start, a successor when its predecessors are down)
//! serves only from `activation + heartbeat + timeout + lease`: by then every lease granted
//! by any other server has expired (a successor that sees a predecessor again stops granting
//! within one heartbeat and a timeout, and a lease lives at most `lease` after its request
//! was sent). It also counts, for each key it first meets, every permit the rule allowed at
//! that instant as already given out, since it cannot know what its predecessor granted:
//! the limit holds across a takeover, at the price of the rest of the window in progress
//! (fixed and sliding windows) or of one full burst (buckets). The order is static: two
//! servers that cannot see each other but are both seen by clients (a partition between the
//! servers only) would both serve.
//!
//! # Transport
//!
//! `POST /v1/token` on the server's own listener, the body a JSON message sealed exactly like
//! a peer datagram ([`crate::peer::seal`]: HMAC-SHA256 under the cluster's shared key, with
//! sender and recipient ids), and so is the answer: a node without the key can neither take
//! permits nor fake a grant.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_limits::{
    Algorithm, AlgorithmKind, AnyAlgorithm, AnyState, Decision, Limit, Nanos, Options,
};
use sluice_redis::{ConsumptionRate, Debt, Share, Source, take_what_fits};

use crate::peer::{PeerKey, open, seal};

/// The endpoint on a token server's listener.
pub const PATH: &str = "/v1/token";

/// Largest message accepted (a key is at most a few hundred bytes).
const MAX_MESSAGE: usize = 64 * 1024;

// ------------------------------------------------------------------------------------------
// Wire
// ------------------------------------------------------------------------------------------

/// A node asks for permits of one key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GrantRequest {
    /// The descriptor's key (domain and entries, as `coordination: redis` names it).
    pub key: String,
    /// The rule's algorithm, by name.
    pub algorithm: String,
    /// The rule's limit: count per period (ns), burst.
    pub count: u64,
    /// The period, ns.
    pub period: Nanos,
    /// The burst.
    pub burst: u64,
    /// How many permits the node would like (its rate over the horizon).
    pub want: u64,
    /// The request that needs them (the grant is at least this when it fits).
    pub cost: u64,
    /// Permits the node admitted on its own (its fallback share) since its last grant that
    /// still weigh (the current window, the last period, a bucket's drain): the server counts
    /// them before it grants. Absent (0) from nodes that predate it.
    #[serde(default)]
    pub charge: u64,
}

/// What a node sends a token server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    /// Permits, please.
    Grant(GrantRequest),
    /// Are you there (from a server ranked after this one)?
    Ping,
}

/// A token server's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// Permits granted (possibly 0).
    Grant {
        /// Permits given to the node.
        granted: u64,
        /// What the rule still allows after this grant.
        remaining: u64,
        /// The permits may be used for this long after the request was sent (ns).
        valid_for: Nanos,
        /// With nothing granted: when asking again may succeed (ns).
        retry_after: Option<Nanos>,
    },
    /// Active, but not serving yet: the other servers' leases may still run (ns to wait).
    Starting {
        /// Time until it serves.
        serving_in: Nanos,
    },
    /// A server ranked before this one is alive: ask the primary.
    Standby,
    /// Answer to a ping.
    Pong {
        /// Whether this server is active.
        active: bool,
    },
}

// ------------------------------------------------------------------------------------------
// Server core
// ------------------------------------------------------------------------------------------

/// How a token server sizes its grants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrantConfig {
    /// A grant may be used this long after its request was sent (default 100 ms); a fixed
    /// window's grant also ends with its window.
    pub lease: Nanos,
    /// Never more than this fraction of what is left (default 0.5): batches shrink as the
    /// quota runs out and the last permits are spread over the nodes (seed 002 §4.4(5)).
    pub share_of_remaining: f64,
    /// Never more than this many permits at once (default 1000).
    pub max_batch: u64,
    /// A server that starts serving counts every permit the rule allows at that instant as
    /// given out by its predecessor (default true: the limit holds across a takeover).
    pub assume_predecessor_spent: bool,
}

impl Default for GrantConfig {
    fn default() -> Self {
        Self {
            lease: 100_000_000,
            share_of_remaining: 0.5,
            max_batch: 1000,
            assume_predecessor_spent: true,
        }
    }
}

struct KeyState {
    state: AnyState,
    limit: Limit,
}

/// The central state of one active token server (see the module documentation).
///
/// Guarantee: a permit granted at `t` was admitted by the rule's algorithm at `t` on this
/// server's state, so for a fixed window the permits granted within one window never exceed
/// the limit (and a grant never outlives its window); with `assume_predecessor_spent`, the
/// window in progress when the server starts serving is counted as used, so the grants of
/// this server and of every earlier one together stay within the limit too.
pub struct TokenServer {
    config: GrantConfig,
    serving_from: Nanos,
    algorithms: Vec<AnyAlgorithm>,
    states: HashMap<(String, AlgorithmKind), KeyState>,
    granted: u64,
}

impl std::fmt::Debug for TokenServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenServer")
            .field("config", &self.config)
            .field("serving_from", &self.serving_from)
            .field("keys", &self.states.len())
            .field("granted", &self.granted)
            .finish()
    }
}

/// How many permits `alg` admits at `now` in one request.
fn available(alg: &AnyAlgorithm, state: &AnyState, limit: &Limit, now: Nanos) -> u64 {
    let d = alg.peek(state, limit, now, 1);
    if d.allowed {
        d.remaining.saturating_add(1)
    } else {
        0
    }
}

impl TokenServer {
    /// A server that serves from `serving_from` on (its clock).
    #[must_use]
    pub fn new(config: GrantConfig, serving_from: Nanos) -> Self {
        Self {
            config,
            serving_from,
            algorithms: AlgorithmKind::ALL
                .iter()
                .map(|&k| AnyAlgorithm::new(k, Options::default()))
                .collect(),
            states: HashMap::new(),
            granted: 0,
        }
    }

    /// When it starts serving.
    #[must_use]
    pub fn serving_from(&self) -> Nanos {
        self.serving_from
    }

    /// Permits granted so far.
    #[must_use]
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Answers a request for permits of `kind` under `limit` at `now`, after counting the
    /// `charge` permits the node admitted on its own as admitted now, whatever the limit
    /// says ([`Algorithm::charge`]: past the limit the state takes the excess, saturating,
    /// and keeps it off the grants while it still weighs).
    #[allow(clippy::too_many_arguments)]
    pub fn grant(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        want: u64,
        cost: u64,
        charge: u64,
        now: Nanos,
    ) -> Reply {
        if now < self.serving_from {
            return Reply::Starting {
                serving_in: self.serving_from - now,
            };
        }
        let index = kind.index();
        let Some(alg) = self.algorithms.get(index) else {
            return Reply::Standby;
        };
        let (start, precharge) = (self.serving_from, self.config.assume_predecessor_spent);
        let entry = self
            .states
            .entry((key.to_string(), kind))
            .or_insert_with(|| {
                let mut state = alg.new_state(limit, start);
                if precharge {
                    // What a predecessor may have given out before this server serves.
                    let all = available(alg, &state, limit, start);
                    if all > 0 {
                        alg.check(&mut state, limit, start, all);
                    }
                }
                KeyState {
                    state,
                    limit: *limit,
                }
            });
        entry.limit = *limit;
        if charge > 0 {
            // As the Redis scripts and the in-memory store charge: past the limit the state
            // takes the excess, so it keeps those permits off the grants while they weigh.
            alg.charge(&mut entry.state, limit, now, charge);
        }
        let left = available(alg, &entry.state, limit, now);
        let by_share = (left as f64 * self.config.share_of_remaining).floor() as u64;
        let size = want
            .min(self.config.max_batch)
            .min(by_share)
            .max(cost.max(1))
            .min(left);
        if size > 0 {
            let d = alg.check(&mut entry.state, limit, now, size);
            if d.allowed {
                self.granted = self.granted.saturating_add(size);
                let valid_for = match alg {
                    AnyAlgorithm::FixedWindow(_) => self.config.lease.min(d.reset_after),
                    _ => self.config.lease,
                };
                return Reply::Grant {
                    granted: size,
                    remaining: d.remaining,
                    valid_for,
                    retry_after: None,
                };
            }
        }
        let d = alg.peek(&entry.state, limit, now, cost.max(1));
        Reply::Grant {
            granted: 0,
            remaining: 0,
            valid_for: 0,
            retry_after: Some(
                d.retry_after
                    .unwrap_or(self.config.lease)
                    .clamp(1, self.config.lease),
            ),
        }
    }

    /// Forgets keys whose state is that of a key never seen; returns how many.
    pub fn retain_idle(&mut self, now: Nanos) -> usize {
        let before = self.states.len();
        let algorithms = &self.algorithms;
        self.states.retain(|(_, kind), s| {
            let index = kind.index();
            algorithms
                .get(index)
                .is_some_and(|a| !a.is_idle(&s.state, &s.limit, now))
        });
        before - self.states.len()
    }
}

// ------------------------------------------------------------------------------------------
// Client core
// ------------------------------------------------------------------------------------------

/// How a node sizes its requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseConfig {
    /// A request covers this much of the node's consumption at its measured rate (default
    /// 20 ms): one server call per horizon under steady load.
    pub horizon: Nanos,
    /// Weight of the newest measurement in the rate estimate (default 0.5).
    pub smoothing: f64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            horizon: 20_000_000,
            smoothing: 0.5,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Lease {
    left: u64,
    expires: Nanos,
    rate: ConsumptionRate,
    refused_until: Nanos,
    /// The node's own share of the limit (`1/nodes`), on the rule's algorithm: charged with
    /// every permit admitted from leases (as far as it goes), and the fallback's limiter
    /// once the lease has expired — so a share used up from leases is not spent twice.
    share: Option<AnyState>,
    /// What the share admitted that no server has counted yet.
    debt: Debt,
    /// The debt a request carries to a server now (at most one at a time per key).
    charging: Option<Debt>,
}

/// What the lease says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Decided from the lease (admitted), or refused until the server's retry time.
    Decided(Decision),
    /// The lease cannot serve it: ask the server for this many permits.
    Ask(u64),
}

/// A node's leases, per key (the pure half of [`TokenClient`]).
#[derive(Debug, Default)]
pub struct LeaseBook {
    config: LeaseConfig,
    leases: HashMap<(String, AlgorithmKind), Lease>,
    /// The fallback's share is `1/nodes` (0 counts as 1).
    nodes: u64,
}

impl LeaseBook {
    /// No lease yet; the fallback's share is the whole limit ([`LeaseBook::with_nodes`]).
    #[must_use]
    pub fn new(config: LeaseConfig) -> Self {
        Self {
            config,
            leases: HashMap::new(),
            nodes: 1,
        }
    }

    /// The fallback's share is `1/nodes` of each limit.
    #[must_use]
    pub fn with_nodes(mut self, nodes: u64) -> Self {
        self.nodes = nodes.max(1);
        self
    }

    /// This node's share of `limit`.
    fn share_of(&self, limit: &Limit) -> Limit {
        Share::one_of(self.nodes).apply(limit)
    }

    /// Decides from the lease if it can.
    pub fn try_local(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Local {
        let horizon = self.config.horizon;
        let smoothing = self.config.smoothing;
        let share = self.share_of(limit);
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
        if now >= lease.expires {
            lease.left = 0;
        }
        if lease.left >= cost {
            return Local::Decided(take(lease, kind, limit, &share, now, cost));
        }
        if now < lease.refused_until {
            let wait = lease.refused_until - now;
            return Local::Decided(Decision::deny(limit.count(), lease.left, wait, Some(wait)));
        }
        let by_rate = lease.rate.batch(now, horizon, smoothing);
        let want = by_rate.max(cost - lease.left);
        lease.rate.asked(want);
        Local::Ask(want)
    }

    /// Decides during a fallback, without the server: while the key's lease is valid, from
    /// it only (its permits, then refusals until it expires: the lease's rate, never more);
    /// after that with the node's share, on a state that already counts what the node took
    /// from leases. Says which: [`Source::Central`] for the lease, [`Source::Local`].
    pub fn fallback(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Source) {
        let share = self.share_of(limit);
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
        if now < lease.expires {
            if lease.left >= cost {
                return (take(lease, kind, limit, &share, now, cost), Source::Central);
            }
            let wait = lease.expires - now;
            return (
                Decision::deny(limit.count(), lease.left, wait, Some(wait)),
                Source::Central,
            );
        }
        let alg = AnyAlgorithm::new(kind, Options::default());
        let state = lease
            .share
            .get_or_insert_with(|| alg.new_state(&share, now));
        let d = alg.check(state, &share, now, cost);
        if d.allowed {
            // No server knows of it: the next request for a grant carries it.
            lease.debt.record(&alg, limit, now, cost);
        }
        (d, Source::Local)
    }

    /// The permits a request for a grant of the key carries ([`GrantRequest::charge`]): what
    /// the share admitted that still weighs, taken out until [`LeaseBook::charged`] says how
    /// the request went. `None` while another request carries the key's debt: the caller
    /// decides locally ([`LeaseBook::fallback`]), so no grant is asked for before the server
    /// has counted the key's local permits.
    pub fn charge(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
    ) -> Option<u64> {
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
        if lease.charging.is_some() {
            return None;
        }
        let alg = AnyAlgorithm::new(kind, Options::default());
        let due = lease.debt.due(&alg, limit, now);
        if due == 0 {
            lease.debt = Debt::new();
        } else {
            lease.charging = Some(lease.debt.take());
        }
        Some(due)
    }

    /// Ends the charge taken by [`LeaseBook::charge`]: counted by a server (`counted`), or
    /// not known to be — then still owed (charging it again only over-counts).
    pub fn charged(&mut self, key: &str, kind: AlgorithmKind, counted: bool) {
        if let Some(lease) = self.leases.get_mut(&(key.to_string(), kind))
            && let Some(owed) = lease.charging.take()
            && !counted
        {
            lease.debt.restore(owed);
        }
    }

    /// Whether a request carries the key's debt to a server now.
    #[must_use]
    pub fn charging(&self, key: &str, kind: AlgorithmKind) -> bool {
        self.leases
            .get(&(key.to_string(), kind))
            .is_some_and(|l| l.charging.is_some())
    }

    /// What the key owes the servers at `now` (permits of its share no server counted yet).
    #[must_use]
    pub fn owed(&self, key: &str, kind: AlgorithmKind, limit: &Limit, now: Nanos) -> u64 {
        let alg = AnyAlgorithm::new(kind, Options::default());
        self.leases
            .get(&(key.to_string(), kind))
            .map_or(0, |l| l.debt.due(&alg, limit, now))
    }

    /// Whether the key holds an unexpired lease with permits left.
    #[must_use]
    pub fn holds(&self, key: &str, kind: AlgorithmKind, now: Nanos) -> bool {
        self.leases
            .get(&(key.to_string(), kind))
            .is_some_and(|l| now < l.expires && l.left > 0)
    }

    /// Applies a grant answered to a request sent at `sent` and decides the request of
    /// `cost` at `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        sent: Nanos,
        now: Nanos,
        cost: u64,
        granted: u64,
        valid_for: Nanos,
        retry_after: Option<Nanos>,
    ) -> Decision {
        let share = self.share_of(limit);
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
        if now >= lease.expires {
            lease.left = 0;
        }
        // From the send time: the server granted after it, so the lease ends no later
        // than `lease` after the grant whatever the two clocks say.
        let expires = sent.saturating_add(valid_for);
        if granted > 0 && expires > now {
            lease.expires = if lease.left > 0 {
                lease.expires.min(expires)
            } else {
                expires
            };
            lease.left += granted;
        }
        if lease.left >= cost {
            return take(lease, kind, limit, &share, now, cost);
        }
        let wait = retry_after.unwrap_or(1).max(1);
        if granted == 0 {
            lease.refused_until = now.saturating_add(wait);
        }
        Decision::deny(limit.count(), lease.left, wait, Some(wait))
    }

    /// Permits held in unexpired leases at `now`, over all keys.
    #[must_use]
    pub fn held(&self, now: Nanos) -> u64 {
        self.leases
            .values()
            .filter(|l| now < l.expires)
            .map(|l| l.left)
            .sum()
    }

    /// Forgets leases idle since before `now - keep`.
    pub fn retain(&mut self, now: Nanos, keep: Nanos) {
        self.leases.retain(|_, l| {
            now < l.expires.saturating_add(keep)
                || now < l.rate.since().saturating_add(keep)
                || !l.debt.is_empty()
                || l.charging.is_some()
        });
    }
}

/// Gives `cost` permits out of the lease, and charges them to the node's share (what fits).
fn take(
    lease: &mut Lease,
    kind: AlgorithmKind,
    limit: &Limit,
    share: &Limit,
    now: Nanos,
    cost: u64,
) -> Decision {
    lease.left -= cost;
    lease.rate.used(cost);
    let alg = AnyAlgorithm::new(kind, Options::default());
    let state = lease.share.get_or_insert_with(|| alg.new_state(share, now));
    // More than the share from leases: the share is used up, no more (by design it counts
    // only what fits, not past the limit as a charge would: it limits this node's fallback,
    // and a lease's permits were already counted centrally).
    take_what_fits(&alg, state, share, now, cost);
    Decision::allow(limit.count(), lease.left, lease.expires.saturating_sub(now))
}

// ------------------------------------------------------------------------------------------
// Addresses
// ------------------------------------------------------------------------------------------

/// One token server of the ordered list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddr {
    /// Its id (the recipient of sealed messages).
    pub id: u32,
    /// `HOST:PORT` of its token listener.
    pub authority: String,
}

/// Why a token server list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// An entry is not `ID=HOST:PORT`.
    #[error("token server {0:?}: expected ID=HOST:PORT (e.g. 0=10.0.0.1:8083)")]
    Entry(String),
    /// Two entries with one id.
    #[error("token server id {0} is listed twice")]
    Duplicate(u32),
    /// No entry.
    #[error("no token server given")]
    Empty,
    /// This node's id is not in the list.
    #[error("token server id {0} is not in the list")]
    NotListed(u32),
}

/// Parses `ID=HOST:PORT,…` (an optional `http://` is accepted): primary first.
///
/// # Errors
/// [`TokenError`].
pub fn parse_servers(list: &str) -> Result<Vec<ServerAddr>, TokenError> {
    let mut out: Vec<ServerAddr> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| TokenError::Entry(item.to_string()))?;
        let id: u32 = id
            .trim()
            .parse()
            .map_err(|_| TokenError::Entry(item.to_string()))?;
        let addr = addr.trim();
        let addr = addr
            .strip_prefix("http://")
            .unwrap_or(addr)
            .trim_end_matches('/');
        if addr.is_empty() || !addr.contains(':') {
            return Err(TokenError::Entry(item.to_string()));
        }
        if out.iter().any(|s| s.id == id) {
            return Err(TokenError::Duplicate(id));
        }
        out.push(ServerAddr {
            id,
            authority: addr.to_string(),
        });
    }
    if out.is_empty() {
        return Err(TokenError::Empty);
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// Transport
// ------------------------------------------------------------------------------------------

/// Why a call did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No answer within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Connecting, sending or reading failed.
    #[error("{0}")]
    Io(String),
    /// The answer was not a sealed reply from that server.
    #[error("bad answer: {0}")]
    Bad(String),
}

/// Keep-alive connections to the token servers, one pool per server.
#[derive(Debug)]
struct Pool {
    conns: Vec<parking_lot::Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl Pool {
    fn new(n: usize) -> Self {
        Self {
            conns: (0..n)
                .map(|_| parking_lot::Mutex::new(Vec::new()))
                .collect(),
        }
    }

    async fn connect(authority: &str) -> Result<SendRequest<Full<Bytes>>, CallError> {
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| CallError::Io(format!("connect {authority}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| CallError::Io(e.to_string()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// One sealed message to `server` (index `i`) and its sealed answer.
    async fn call(
        &self,
        i: usize,
        server: &ServerAddr,
        key: &PeerKey,
        me: u32,
        message: &Message,
    ) -> Result<Reply, CallError> {
        let payload = serde_json::to_vec(message).map_err(|e| CallError::Bad(e.to_string()))?;
        let body = seal(key, me, server.id, &payload).map_err(|e| CallError::Bad(e.to_string()))?;
        let pooled = self.conns.get(i).and_then(|m| m.lock().pop());
        let mut sender = match pooled {
            Some(s) => s,
            None => Self::connect(&server.authority).await?,
        };
        sender
            .ready()
            .await
            .map_err(|e| CallError::Io(e.to_string()))?;
        let request = http::Request::post(PATH)
            .header(http::header::HOST, server.authority.as_str())
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CallError::Bad(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| CallError::Io(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| CallError::Io(e.to_string()))?
            .to_bytes();
        // Only a connection whose answer was read whole can carry the next call.
        if let Some(m) = self.conns.get(i) {
            m.lock().push(sender);
        }
        if status != http::StatusCode::OK {
            return Err(CallError::Bad(format!("HTTP {status}")));
        }
        let (from, payload) = open(key, me, &bytes).map_err(|e| CallError::Bad(e.to_string()))?;
        if from != server.id {
            return Err(CallError::Bad(format!(
                "answered by {from}, not {}",
                server.id
            )));
        }
        serde_json::from_slice(payload).map_err(|e| CallError::Bad(e.to_string()))
    }

    /// [`Pool::call`] within `timeout`.
    async fn call_within(
        &self,
        timeout: Duration,
        i: usize,
        server: &ServerAddr,
        key: &PeerKey,
        me: u32,
        message: &Message,
    ) -> Result<Reply, CallError> {
        tokio::time::timeout(timeout, self.call(i, server, key, me, message))
            .await
            .unwrap_or(Err(CallError::Timeout(timeout)))
    }
}

fn wall_now() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, sluice_limits::clock::nanos)
}

// ------------------------------------------------------------------------------------------
// Client shell
// ------------------------------------------------------------------------------------------

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
    pub lease: LeaseConfig,
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
            lease: LeaseConfig::default(),
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
            book: parking_lot::Mutex::new(LeaseBook::new(spec.lease).with_nodes(spec.nodes)),
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
                    Ok(Reply::Standby) => {
                        // A server ranked before it is alive: start again from the primary.
                        let _ = self.current.compare_exchange(
                            i,
                            0,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                        format!("server {} is standing by", server.id)
                    }
                    Ok(Reply::Pong { .. } | Reply::Grant { .. }) => {
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

// ------------------------------------------------------------------------------------------
// Server shell
// ------------------------------------------------------------------------------------------

/// How a node serves tokens.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The ordered servers (this one among them).
    pub servers: Vec<ServerAddr>,
    /// This server's id.
    pub id: u32,
    /// The shared key.
    pub key: PeerKey,
    /// Grant sizing and lease.
    pub grants: GrantConfig,
    /// Deadline of a ping (the clients' timeout, default 50 ms).
    pub timeout: Duration,
    /// How often a successor pings the servers ranked before it (default 100 ms).
    pub heartbeat: Duration,
    /// Missed rounds of pings after which they are down (default 3).
    pub misses: u32,
}

impl ServerSpec {
    /// Defaults for server `id` of `servers`.
    #[must_use]
    pub fn new(servers: Vec<ServerAddr>, id: u32, key: PeerKey) -> Self {
        Self {
            servers,
            id,
            key,
            grants: GrantConfig::default(),
            timeout: Duration::from_millis(50),
            heartbeat: Duration::from_millis(100),
            misses: 3,
        }
    }

    /// How long an activated server waits before it serves: every other server's leases
    /// have expired by then.
    #[must_use]
    pub fn takeover_delay(&self) -> Nanos {
        nanos(self.heartbeat)
            .saturating_add(nanos(self.timeout))
            .saturating_add(self.grants.lease)
    }
}

/// The state of a token server, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    /// This server's id.
    pub id: u32,
    /// Whether it is active (no server ranked before it answers).
    pub active: bool,
    /// When it serves (or served) from, if active.
    pub serving_from: Option<Nanos>,
    /// Times it became active.
    pub activations: u64,
    /// Permits granted by its current activation.
    pub granted: u64,
    /// Requests refused as unauthenticated or malformed.
    pub rejected: u64,
}

/// A running token server: the `POST /v1/token` handler's state and the watch over its
/// predecessors.
pub struct TokenServerNode {
    spec: ServerSpec,
    rank: usize,
    core: parking_lot::Mutex<Option<TokenServer>>,
    pool: Pool,
    activations: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for TokenServerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenServerNode")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl TokenServerNode {
    /// Server `spec.id`: the primary is active from now (serving after the takeover delay),
    /// a successor stands by until its predecessors are down.
    ///
    /// # Errors
    /// [`TokenError::NotListed`] when `spec.id` is not among `spec.servers`.
    pub fn new(spec: ServerSpec) -> Result<Arc<Self>, TokenError> {
        let rank = spec
            .servers
            .iter()
            .position(|s| s.id == spec.id)
            .ok_or(TokenError::NotListed(spec.id))?;
        let node = Arc::new(Self {
            rank,
            core: parking_lot::Mutex::new(None),
            pool: Pool::new(rank),
            activations: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            spec,
        });
        if rank == 0 {
            node.activate(wall_now());
        }
        Ok(node)
    }

    fn activate(&self, now: Nanos) {
        let from = now.saturating_add(self.spec.takeover_delay());
        *self.core.lock() = Some(TokenServer::new(self.spec.grants, from));
        self.activations.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            id = self.spec.id,
            rank = self.rank,
            serving_in_ms = self.spec.takeover_delay() / 1_000_000,
            "token server active: serving once every earlier lease has expired"
        );
    }

    /// Its state now.
    #[must_use]
    pub fn status(&self) -> ServerStatus {
        let core = self.core.lock();
        ServerStatus {
            id: self.spec.id,
            active: core.is_some(),
            serving_from: core.as_ref().map(TokenServer::serving_from),
            activations: self.activations.load(Ordering::Relaxed),
            granted: core.as_ref().map_or(0, TokenServer::granted),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }

    /// Answers one sealed body (the handler, without HTTP).
    fn answer(&self, body: &[u8], now: Nanos) -> Option<Vec<u8>> {
        let Ok((from, payload)) = open(&self.spec.key, self.spec.id, body) else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let Ok(message) = serde_json::from_slice::<Message>(payload) else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let reply = {
            let mut core = self.core.lock();
            match (message, core.as_mut()) {
                (Message::Ping, c) => Reply::Pong {
                    active: c.is_some(),
                },
                (Message::Grant(_), None) => Reply::Standby,
                (Message::Grant(g), Some(server)) => {
                    let limit = g.algorithm.parse::<AlgorithmKind>().ok().zip(
                        Limit::from_nanos(g.count, g.period)
                            .and_then(|l| l.with_burst(g.burst.max(1)))
                            .ok(),
                    );
                    match limit {
                        Some((kind, limit)) => {
                            server.grant(&g.key, kind, &limit, g.want, g.cost, g.charge, now)
                        }
                        None => {
                            self.rejected.fetch_add(1, Ordering::Relaxed);
                            return None;
                        }
                    }
                }
            }
        };
        let payload = serde_json::to_vec(&reply).ok()?;
        seal(&self.spec.key, self.spec.id, from, &payload).ok()
    }

    /// Pings the servers ranked before this one every heartbeat; activates this one when
    /// none answered for `misses` rounds, stands it by when one answers. Returns when
    /// `done` completes.
    pub async fn watch(self: Arc<Self>, done: impl std::future::Future<Output = ()>) {
        if self.rank == 0 {
            return;
        }
        tokio::pin!(done);
        let mut tick = tokio::time::interval(self.spec.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut missed = 0u32;
        let mut last_prune = wall_now();
        loop {
            tokio::select! {
                () = &mut done => return,
                _ = tick.tick() => {}
            }
            let mut alive = false;
            for (i, s) in self.spec.servers.iter().take(self.rank).enumerate() {
                let r = self
                    .pool
                    .call_within(
                        self.spec.timeout,
                        i,
                        s,
                        &self.spec.key,
                        self.spec.id,
                        &Message::Ping,
                    )
                    .await;
                if matches!(r, Ok(Reply::Pong { .. })) {
                    alive = true;
                    break;
                }
            }
            let now = wall_now();
            let active = self.core.lock().is_some();
            if alive {
                missed = 0;
                if active {
                    *self.core.lock() = None;
                    tracing::warn!(
                        id = self.spec.id,
                        "a token server ranked before this one answers again: standing by"
                    );
                }
            } else {
                missed = missed.saturating_add(1);
                if !active && missed >= self.spec.misses {
                    self.activate(now);
                }
            }
            if now.saturating_sub(last_prune) >= 10_000_000_000 {
                last_prune = now;
                if let Some(c) = self.core.lock().as_mut() {
                    c.retain_idle(now);
                }
            }
        }
    }
}

async fn handle(State(node): State<Arc<TokenServerNode>>, body: Bytes) -> axum::response::Response {
    if body.len() > MAX_MESSAGE {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    }
    match node.answer(&body, wall_now()) {
        Some(reply) => (
            [(http::header::CONTENT_TYPE, "application/octet-stream")],
            reply,
        )
            .into_response(),
        None => StatusCode::FORBIDDEN.into_response(),
    }
}

/// The `POST /v1/token` endpoint over `node`.
pub fn router(node: Arc<TokenServerNode>) -> Router {
    Router::new().route(PATH, post(handle)).with_state(node)
}

/// Serves `node` on `listener` and watches its predecessors until `done` completes.
///
/// # Errors
/// The listener's error.
pub async fn run(
    listener: tokio::net::TcpListener,
    node: Arc<TokenServerNode>,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop, rx) = tokio::sync::watch::channel(false);
    let watcher = {
        let node = node.clone();
        let mut rx = rx.clone();
        tokio::spawn(async move {
            node.watch(async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await;
        })
    };
    drop(rx);
    let served = axum::serve(listener, router(node))
        .with_graceful_shutdown(done)
        .await;
    let _ = stop.send(true);
    let _ = watcher.await;
    served
}

/// Binds `addr` for a token server.
///
/// # Errors
/// The bind error.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;

    fn fw(n: u64) -> Limit {
        Limit::from_nanos(n, S).unwrap()
    }

    #[test]
    fn grants_shrink_with_what_is_left_and_never_pass_the_window() {
        let cfg = GrantConfig {
            assume_predecessor_spent: false,
            ..GrantConfig::default()
        };
        let mut s = TokenServer::new(cfg, 0);
        let l = fw(100);
        let mut sizes = Vec::new();
        let t = 10 * S;
        loop {
            match s.grant("k", AlgorithmKind::FixedWindow, &l, 1000, 1, 0, t) {
                Reply::Grant { granted: 0, .. } => break,
                Reply::Grant {
                    granted, valid_for, ..
                } => {
                    assert!(valid_for <= cfg.lease);
                    sizes.push(granted);
                }
                r => panic!("{r:?}"),
            }
        }
        assert_eq!(sizes.iter().sum::<u64>(), 100);
        // Half of what is left each time: 50, 25, 12, ...
        assert_eq!(&sizes[..3], &[50, 25, 12]);
        // The next window is fresh.
        assert!(matches!(
            s.grant("k", AlgorithmKind::FixedWindow, &l, 10, 1, 0, t + S),
            Reply::Grant { granted: 10, .. }
        ));
    }

    #[test]
    fn a_server_does_not_serve_before_its_start_and_counts_the_window_in_progress_as_used() {
        let start = 10 * S + S / 2;
        let mut s = TokenServer::new(GrantConfig::default(), start);
        let l = fw(100);
        assert_eq!(
            s.grant("k", AlgorithmKind::FixedWindow, &l, 5, 1, 0, start - 1),
            Reply::Starting { serving_in: 1 }
        );
        assert!(matches!(
            s.grant("k", AlgorithmKind::FixedWindow, &l, 5, 1, 0, start),
            Reply::Grant {
                granted: 0,
                retry_after: Some(_),
                ..
            }
        ));
        assert!(matches!(
            s.grant("k", AlgorithmKind::FixedWindow, &l, 5, 1, 0, 11 * S),
            Reply::Grant { granted: 5, .. }
        ));
    }

    #[test]
    fn a_grant_that_arrives_after_its_validity_admits_nothing() {
        // Sent at S, valid 10 ms from the send (the window's end), answered 12 ms later:
        // the server counted those permits in a window that is over.
        let mut b = LeaseBook::new(LeaseConfig::default());
        let (l, k) = (fw(1000), AlgorithmKind::FixedWindow);
        let d = b.apply("k", k, &l, S, S + 12_000_000, 1, 4, 10_000_000, None);
        assert!(!d.allowed, "{d:?}");
        assert_eq!(b.held(S + 12_000_000), 0);
        // In time, the same grant admits.
        let d = b.apply("k", k, &l, S, S + 9_000_000, 1, 4, 10_000_000, None);
        assert!(d.allowed, "{d:?}");
        assert_eq!(b.held(S + 9_000_000), 3);
    }

    #[test]
    fn the_lease_book_asks_by_rate_and_serves_from_the_lease() {
        let mut b = LeaseBook::new(LeaseConfig::default());
        let l = fw(1000);
        let k = AlgorithmKind::FixedWindow;
        assert_eq!(b.try_local("k", k, &l, S, 1), Local::Ask(1));
        let d = b.apply("k", k, &l, S, S, 1, 4, 100_000_000, None);
        assert!(d.allowed);
        for _ in 0..3 {
            assert!(matches!(b.try_local("k", k, &l, S + 1, 1), Local::Decided(d) if d.allowed));
        }
        // Slow start: twice the last request.
        assert_eq!(b.try_local("k", k, &l, S + 2, 1), Local::Ask(2));
        // An expired lease serves nothing.
        b.apply("k", k, &l, S + 2, S + 2, 1, 0, 0, Some(5));
        assert!(matches!(b.try_local("k", k, &l, S + 3, 1), Local::Decided(d) if !d.allowed));
        // In fallback the lease (valid until S + 100 ms, used up) refuses until it ends.
        let (d, source) = b.fallback("k", k, &l, S + 10, 1);
        assert!(!d.allowed && source == Source::Central, "{d:?}");
        assert_eq!(d.retry_after, Some(100_000_000 - 10));
    }

    #[test]
    fn a_fallback_keeps_to_the_lease_then_to_a_share_that_counts_the_leases() {
        // Two nodes: the share is 50 of 100 per window.
        let mut b = LeaseBook::new(LeaseConfig::default()).with_nodes(2);
        let (l, k) = (fw(100), AlgorithmKind::FixedWindow);
        let lease = 100_000_000;
        let t = 10 * S;
        // 30 of a 40-permit lease used centrally.
        assert!(b.apply("k", k, &l, t, t, 1, 40, lease, None).allowed);
        for _ in 0..29 {
            assert!(matches!(b.try_local("k", k, &l, t + 1, 1), Local::Decided(d) if d.allowed));
        }
        // The server is gone. While the lease is valid: its 10 permits, then refusals until
        // it ends — not the share on top.
        let mid = t + lease / 2;
        for _ in 0..10 {
            assert_eq!(b.fallback("k", k, &l, mid, 1).1, Source::Central);
        }
        let (d, source) = b.fallback("k", k, &l, mid, 1);
        assert!(!d.allowed && source == Source::Central, "{d:?}");
        assert_eq!(d.retry_after, Some(lease / 2));
        // After it: the share, less the 40 taken from leases in this window.
        let after = t + 2 * lease;
        let local = (0..100)
            .filter(|_| {
                let (d, source) = b.fallback("k", k, &l, after, 1);
                assert_eq!(source, Source::Local);
                d.allowed
            })
            .count();
        assert_eq!(local, 10, "40 from leases + 10 = the share of 50");
        // The next window: the whole share.
        let next = (0..100)
            .filter(|_| b.fallback("k", k, &l, t + S, 1).0.allowed)
            .count();
        assert_eq!(next, 50);

        // A node that took more than its share from leases admits nothing more locally in
        // that window: max(leases, share), never their sum.
        assert!(b.apply("big", k, &l, t, t, 1, 80, lease, None).allowed);
        for _ in 0..79 {
            assert!(matches!(b.try_local("big", k, &l, t + 1, 1), Local::Decided(d) if d.allowed));
        }
        assert!(!b.fallback("big", k, &l, after, 1).0.allowed);
        assert!(b.fallback("big", k, &l, t + S, 1).0.allowed);
    }

    #[test]
    fn a_charge_is_counted_before_the_grant_and_what_the_state_cannot_hold_is_kept_off() {
        let cfg = GrantConfig {
            assume_predecessor_spent: false,
            ..GrantConfig::default()
        };
        let mut s = TokenServer::new(cfg, 0);
        let t = 10 * S;
        let window = AlgorithmKind::FixedWindow;
        let drain = |s: &mut TokenServer, kind, l: &Limit, now, charge| {
            let mut total = 0;
            let mut charge = charge;
            while let Reply::Grant { granted, .. } = s.grant("k", kind, l, 1000, 1, charge, now) {
                if granted == 0 {
                    break;
                }
                total += granted;
                charge = 0;
            }
            total
        };
        // 30 admitted locally by a node: the window grants the other 70.
        assert_eq!(drain(&mut s, window, &fw(100), t, 30), 70);
        // A sliding log: 80 granted, then a node charges 50 — the log takes all 50, 30 past
        // the count, which keeps them off the grants while they weigh (a period).
        let log = AlgorithmKind::SlidingLog;
        let l = fw(100);
        assert!(matches!(
            s.grant("k", log, &l, 80, 80, 0, t),
            Reply::Grant { granted: 80, .. }
        ));
        assert_eq!(drain(&mut s, log, &l, t + S / 2, 50), 0);
        // At t + S the first 80 leave; the 50 charged still weigh: 50 left, not 80.
        assert_eq!(drain(&mut s, log, &l, t + S, 0), 50);
    }

    #[test]
    fn the_share_owes_its_admissions_until_a_grant_counts_them() {
        let mut b = LeaseBook::new(LeaseConfig::default()).with_nodes(2);
        let (l, k) = (fw(100), AlgorithmKind::FixedWindow);
        let t = 10 * S;
        // No lease: the share decides, and owes what it admits.
        let local = (0..60)
            .filter(|_| b.fallback("k", k, &l, t, 1).0.allowed)
            .count();
        assert_eq!(local, 50);
        assert_eq!(b.owed("k", k, &l, t + 1), 50);
        // One request carries it; another meanwhile is told to decide locally.
        assert_eq!(b.charge("k", k, &l, t + 1), Some(50));
        assert!(b.charging("k", k));
        assert_eq!(b.charge("k", k, &l, t + 1), None);
        // Not counted (no grant): owed again, with nothing lost.
        b.charged("k", k, false);
        assert!(!b.charging("k", k));
        assert_eq!(b.owed("k", k, &l, t + 2), 50);
        // Counted: nothing owed.
        assert_eq!(b.charge("k", k, &l, t + 2), Some(50));
        b.charged("k", k, true);
        assert_eq!(b.owed("k", k, &l, t + 3), 0);
        assert_eq!(b.charge("k", k, &l, t + 3), Some(0));
        // The next window owes nothing for the last one.
        b.fallback("k", k, &l, t + S / 2, 1);
        assert_eq!(b.owed("k", k, &l, t + S), 0);
    }

    #[test]
    fn server_lists_parse_in_order() {
        let s = parse_servers("0=127.0.0.1:1, 2=http://h:2/").unwrap();
        assert_eq!(
            s[1],
            ServerAddr {
                id: 2,
                authority: "h:2".into()
            }
        );
        assert_eq!(parse_servers("0=a:1,0=b:2"), Err(TokenError::Duplicate(0)));
        assert!(parse_servers("x").is_err());
        assert_eq!(parse_servers(""), Err(TokenError::Empty));
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Node `n` asks for `want` at `dt` ns after the last op.
        Ask { node: usize, want: u64, dt: Nanos },
        /// The active server dies; the next one activates `dt` later.
        Takeover { dt: Nanos },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0usize..3, 1u64..60, 0u64..80_000_000)
                .prop_map(|(node, want, dt)| Op::Ask { node, want, dt }),
            1 => (0u64..300_000_000).prop_map(|dt| Op::Takeover { dt }),
        ]
    }

    proptest! {
        /// Three nodes drain leases from a chain of servers with takeovers: in every fixed
        /// window the permits the nodes admit (each from its unexpired leases, whichever
        /// server granted them) never exceed the limit.
        #[test]
        fn admitted_per_window_never_exceeds_the_limit_across_takeovers(
            ops in proptest::collection::vec(op(), 1..200),
            limit in 1u64..200,
        ) {
            let algorithm = AlgorithmKind::FixedWindow;
            let l = fw(limit);
            let spec = ServerSpec::new(
                vec![ServerAddr { id: 0, authority: "a:1".into() }],
                0,
                PeerKey::from_text("0123456789abcdef0123456789abcdef").unwrap(),
            );
            let delay = spec.takeover_delay();
            let mut now: Nanos = 5 * S;
            let mut server = Some(TokenServer::new(spec.grants, now));
            let mut books: Vec<LeaseBook> = (0..3).map(|_| LeaseBook::new(LeaseConfig::default())).collect();
            let mut admitted: HashMap<Nanos, u64> = HashMap::new();
            for o in ops {
                match o {
                    Op::Ask { node, want, dt } => {
                        now += dt;
                        let b = &mut books[node];
                        // Use the lease as far as it goes, then ask.
                        let mut n = 0;
                        while n < want {
                            match b.try_local("k", algorithm, &l, now, 1) {
                                Local::Decided(d) if d.allowed => {
                                    *admitted.entry(now / S).or_default() += 1;
                                    n += 1;
                                }
                                Local::Decided(_) => break,
                                Local::Ask(w) => {
                                    let Some(s) = server.as_mut() else { break };
                                    match s.grant("k", algorithm, &l, w, 1, 0, now) {
                                        Reply::Grant { granted, valid_for, retry_after, .. } => {
                                            let d = b.apply("k", algorithm, &l, now, now, 1, granted, valid_for, retry_after);
                                            if !d.allowed { break; }
                                            *admitted.entry(now / S).or_default() += 1;
                                            n += 1;
                                        }
                                        _ => break,
                                    }
                                }
                            }
                        }
                    }
                    Op::Takeover { dt } => {
                        // The server dies now; its successor notices `dt` later and serves
                        // after the takeover delay. Leases granted before keep running.
                        now += dt;
                        server = Some(TokenServer::new(spec.grants, now + delay));
                    }
                }
            }
            for (w, n) in admitted {
                prop_assert!(n <= limit, "window {w}: {n} admitted > {limit}");
            }
        }
    }
}
