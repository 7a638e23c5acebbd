//! The cluster driver: the thin async shell around one `sluice-coord` [`Node`].
//!
//! Every cycle it turns the hits the engine counted ([`Shares::drain`]) into demand in
//! capacity units, ticks the node, sends its messages as authenticated datagrams
//! ([`crate::peer`]) and hands the node's enforced limits back to the engine
//! ([`Shares::set`]). Datagrams from peers are verified, decoded and applied as they arrive,
//! and the node's replies go out at once (seed 004: reactive on news). The node is the same
//! state machine `sluice sim cluster` drives; this file only does I/O and time.
//!
//! One `Node` divides every `coordination: cluster` key: its global limit `L` is
//! [`crate::shares::SCALE`] capacity units, whatever the rule's rate.
//!
//! On shutdown the node leaves gracefully (hands its capacity to its heir) before
//! returning, so the survivors keep the whole limit.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_coord::law::Measure;
use sluice_coord::node::{Config as NodeConfig, Fallback, LeaseState, LinkState, Node};
use sluice_coord::stability::max_gain;
use sluice_coord::testing::Rng;
use sluice_coord::wire::{self, Lifecycle, NodeId};
use sluice_graph::{Topology, auto_gamma};
use tokio::net::UdpSocket;

use crate::engine::Engine;
use crate::peer::{self, MAX_DATAGRAM, PeerKey};
use crate::shares::{SCALE, Shares, scaled};
use crate::status::{ClusterInfo, ClusterStatus, KeyShareStatus, MemberStatus, PeerCounters};

/// A peer of this node.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSpec {
    /// Its node id.
    pub id: NodeId,
    /// Where its peer transport listens.
    pub addr: SocketAddr,
    /// Link weight `w_ij` (seed 000 eq. 3).
    pub weight: f64,
}

/// How the gain is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gamma {
    /// The fastest uniform gain `γ* = 2/(λ2 + λn)` of the topology (seed 000 Thm 2), capped
    /// by the stability bound (seed 003 eq. 15).
    Auto,
    /// As given; refused if it breaks the stability bound.
    Fixed(f64),
}

/// Everything a node needs to join its cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// This node.
    pub node_id: NodeId,
    /// Its neighbours (without itself).
    pub peers: Vec<PeerSpec>,
    /// The communication graph over every member, for `gamma: auto`; `None`: every member
    /// links every other (each node lists all the others as its peers).
    pub topology: Option<Vec<(NodeId, NodeId, f64)>>,
    /// The key every member shares.
    pub key: PeerKey,
    /// The gain.
    pub gamma: Gamma,
    /// The update cycle.
    pub cycle: Duration,
    /// The lease on shared capacity.
    pub lease: Duration,
    /// What to enforce when the lease has expired.
    pub fallback: Fallback,
    /// This node's incarnation: 1 on a first start, larger on every restart.
    pub incarnation: u64,
}

impl ClusterSpec {
    /// A spec with the defaults: `gamma: auto`, cycle 100 ms, lease 1 s, strict fallback.
    #[must_use]
    pub fn new(node_id: NodeId, peers: Vec<PeerSpec>, key: PeerKey) -> Self {
        Self {
            node_id,
            peers,
            topology: None,
            key,
            gamma: Gamma::Auto,
            cycle: Duration::from_millis(100),
            lease: Duration::from_secs(1),
            fallback: Fallback::None,
            incarnation: 1,
        }
    }
}

/// Why a cluster cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The specification is inconsistent.
    #[error("cluster configuration: {0}")]
    Invalid(String),
    /// The node refused its configuration (e.g. a gain above the stability bound).
    #[error("cluster configuration: {0}")]
    Node(#[from] sluice_coord::stability::ConfigError),
    /// The topology has no spectrum to speak of (e.g. disconnected).
    #[error("cluster topology: {0}")]
    Graph(#[from] sluice_graph::GraphError),
    /// The peer socket failed.
    #[error("peer socket: {0}")]
    Io(#[from] std::io::Error),
}

/// A running node's cluster state, shared by the driver task and the status readers.
#[derive(Debug)]
pub struct Cluster {
    node: Mutex<Driven>,
    shares: Arc<Shares>,
    socket: UdpSocket,
    peers: BTreeMap<NodeId, PeerSpec>,
    key: PeerKey,
    me: NodeId,
    start: Instant,
    counters: Counters,
    cycle: Duration,
}

#[derive(Debug)]
struct Driven {
    node: Node,
    rng: Rng,
    last_tick: u64,
    /// Rule limits of the keys seen here (for the status page).
    rules: BTreeMap<u64, u64>,
}

#[derive(Debug, Default)]
struct Counters {
    messages_sent: AtomicU64,
    bytes_sent: AtomicU64,
    messages_received: AtomicU64,
    bytes_received: AtomicU64,
    rejected_unauthenticated: AtomicU64,
    rejected_malformed: AtomicU64,
}

/// The gain for `spec`: see [`Gamma`].
fn gain(spec: &ClusterSpec, measure: &Measure) -> Result<f64, ClusterError> {
    let degree: f64 = spec.peers.iter().map(|p| p.weight).sum();
    let stable = max_gain(measure, degree);
    match spec.gamma {
        Gamma::Fixed(g) => Ok(g),
        Gamma::Auto if spec.peers.is_empty() => Ok(stable),
        Gamma::Auto => {
            let mut ids: Vec<NodeId> = spec.peers.iter().map(|p| p.id).collect();
            ids.push(spec.node_id);
            ids.sort_unstable();
            let index = |id: NodeId| ids.binary_search(&id).unwrap_or(0);
            let edges: Vec<(usize, usize, f64)> = match &spec.topology {
                Some(t) => t.iter().map(|&(a, b, w)| (index(a), index(b), w)).collect(),
                None => {
                    let mut e = Vec::new();
                    for a in 0..ids.len() {
                        for b in a + 1..ids.len() {
                            e.push((a, b, 1.0));
                        }
                    }
                    e
                }
            };
            let topo = Topology::from_edges(ids.len(), edges)?;
            Ok((auto_gamma(&topo)? * measure.min_slope()).min(stable))
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Cluster {
    /// Starts this node's part of the cluster: binds nothing (the caller passes `socket`),
    /// builds the node, and attaches the shares to `engine` so its cluster rules apply this
    /// node's share from now on.
    ///
    /// # Errors
    /// [`ClusterError`] for an inconsistent spec or a gain the stability bound refuses.
    pub fn new(
        spec: &ClusterSpec,
        socket: UdpSocket,
        engine: &Engine,
    ) -> Result<Arc<Self>, ClusterError> {
        if spec.peers.iter().any(|p| p.id == spec.node_id) {
            return Err(ClusterError::Invalid(format!(
                "node {} lists itself as a peer",
                spec.node_id
            )));
        }
        let mut peers = BTreeMap::new();
        for p in &spec.peers {
            if peers.insert(p.id, p.clone()).is_some() {
                return Err(ClusterError::Invalid(format!("peer {} listed twice", p.id)));
            }
            if !(p.weight.is_finite() && p.weight > 0.0) {
                return Err(ClusterError::Invalid(format!(
                    "peer {}: weight must be positive (got {})",
                    p.id, p.weight
                )));
            }
        }
        if spec.cycle.is_zero() || spec.lease < spec.cycle * 4 {
            return Err(ClusterError::Invalid(format!(
                "the lease ({:?}) must be at least four cycles ({:?})",
                spec.lease, spec.cycle
            )));
        }
        let mut members: Vec<NodeId> = peers.keys().copied().collect();
        members.push(spec.node_id);
        members.sort_unstable();
        let links: Vec<(NodeId, f64)> = spec.peers.iter().map(|p| (p.id, p.weight)).collect();
        let mut cfg = NodeConfig::new(spec.node_id, members.clone(), links, SCALE);
        cfg.incarnation = spec.incarnation.max(1);
        // Best friend: the next member after us, so heirs spread around the cluster.
        cfg.heir = members
            .iter()
            .copied()
            .find(|&m| m > spec.node_id && peers.contains_key(&m))
            .or_else(|| members.iter().copied().find(|m| peers.contains_key(m)));
        cfg.measure = Measure::Throttled;
        cfg.gamma = gain(spec, &cfg.measure)?;
        cfg.cycle = nanos(spec.cycle);
        cfg.lease = nanos(spec.lease);
        cfg.demand_tau = nanos(spec.cycle) * 5;
        cfg.fallback = spec.fallback;
        let start = Instant::now();
        let node = Node::new(cfg, 1)?;
        let shares = Arc::new(Shares::new(node.default_enforced(1)));
        if !engine.attach_cluster(shares.clone()) {
            return Err(ClusterError::Invalid(
                "the engine already belongs to a cluster".into(),
            ));
        }
        Ok(Arc::new(Self {
            node: Mutex::new(Driven {
                node,
                rng: Rng::new(u64::from(spec.node_id) ^ (spec.incarnation << 32)),
                last_tick: 1,
                rules: BTreeMap::new(),
            }),
            shares,
            socket,
            peers,
            key: spec.key.clone(),
            me: spec.node_id,
            start,
            counters: Counters::default(),
            cycle: spec.cycle,
        }))
    }

    /// The node's clock: nanoseconds since start (never 0).
    fn now(&self) -> u64 {
        nanos(self.start.elapsed()) + 1
    }

    /// The shares the engine reads.
    #[must_use]
    pub fn shares(&self) -> &Arc<Shares> {
        &self.shares
    }

    /// The address the peer socket is bound to.
    ///
    /// # Errors
    /// As [`UdpSocket::local_addr`].
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Drives the node until `shutdown` completes, then leaves gracefully: hands every
    /// share to the heir and waits (at most two leases) until it has taken them.
    ///
    /// # Errors
    /// Never in practice: socket errors on send or receive are counted and survived.
    pub async fn run(
        self: Arc<Self>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ClusterError> {
        let mut tick = tokio::time::interval(self.cycle);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buf = vec![0u8; MAX_DATAGRAM];
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = tick.tick() => self.on_tick().await,
                r = self.socket.recv_from(&mut buf) => {
                    if let Ok((n, _)) = r {
                        self.on_datagram(&buf[..n]).await;
                    }
                }
            }
        }
        self.leave(&mut tick, &mut buf).await;
        Ok(())
    }

    async fn leave(&self, tick: &mut tokio::time::Interval, buf: &mut [u8]) {
        let lease = {
            let mut d = self.node.lock();
            let now = self.now();
            d.node.leave(now);
            d.node.config().lease
        };
        let deadline = tokio::time::Instant::now() + Duration::from_nanos(lease.saturating_mul(2));
        loop {
            if self.node.lock().node.lifecycle() == Lifecycle::Left {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                _ = tick.tick() => self.on_tick().await,
                r = self.socket.recv_from(buf) => {
                    if let Ok((n, _)) = r {
                        self.on_datagram(&buf[..n]).await;
                    }
                }
            }
        }
    }

    async fn on_tick(&self) {
        let out = {
            let mut d = self.node.lock();
            let now = self.now();
            let dt = now.saturating_sub(d.last_tick).max(1);
            d.last_tick = now;
            for h in self.shares.drain() {
                if h.count > 0 {
                    d.rules.insert(h.key, h.count);
                }
                // Hits per rule period, in capacity units (the rule's limit is SCALE).
                let rate = if h.count == 0 {
                    0.0
                } else {
                    h.hits as f64 * h.period as f64 / dt as f64 * SCALE as f64 / h.count as f64
                };
                d.node.set_demand(now, h.key, rate);
            }
            let Driven { node, rng, .. } = &mut *d;
            node.tick(now, &mut || rng.next_f64());
            self.collect(node, now)
        };
        self.send(out).await;
    }

    async fn on_datagram(&self, datagram: &[u8]) {
        let (from, payload) = match peer::open(&self.key, self.me, datagram) {
            Ok(v) => v,
            Err(_) => {
                self.counters
                    .rejected_unauthenticated
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        if !self.peers.contains_key(&from) {
            // Holds the key but is not configured here: not applied either.
            self.counters
                .rejected_unauthenticated
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Ok(msg) = wire::decode(payload) else {
            self.counters
                .rejected_malformed
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.counters
            .messages_received
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_received
            .fetch_add(datagram.len() as u64, Ordering::Relaxed);
        let out = {
            let mut d = self.node.lock();
            let now = self.now();
            let Driven { node, rng, .. } = &mut *d;
            node.handle_message(now, from, msg, &mut || rng.next_f64());
            self.collect(node, now)
        };
        self.send(out).await;
    }

    /// Applies the node's new limits to the shares and frames its messages.
    fn collect(&self, node: &mut Node, now: u64) -> Vec<(SocketAddr, Vec<u8>)> {
        let ready = node.ready(now);
        self.shares.set_default(node.default_enforced(now));
        for (key, units) in ready.limits {
            self.shares.set(key, units);
        }
        let mut out = Vec::with_capacity(ready.messages.len());
        for m in ready.messages {
            let Some(p) = self.peers.get(&m.to) else {
                continue;
            };
            // A message too large for one datagram is dropped: like a lost one it only
            // delays (the next one carries the same counters). See docs/PROTOCOL.md.
            if let Ok(d) = peer::seal(&self.key, self.me, m.to, &wire::encode(&m.message)) {
                out.push((p.addr, d));
            }
        }
        out
    }

    async fn send(&self, out: Vec<(SocketAddr, Vec<u8>)>) {
        for (addr, d) in out {
            if self.socket.send_to(&d, addr).await.is_ok() {
                self.counters.messages_sent.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_sent
                    .fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
    }
}

fn lifecycle_name(l: Lifecycle) -> &'static str {
    match l {
        Lifecycle::Joining => "joining",
        Lifecycle::Active => "active",
        Lifecycle::Leaving => "leaving",
        Lifecycle::Left => "left",
    }
}

fn fallback_name(f: Fallback) -> String {
    match f {
        Fallback::None => "none".into(),
        Fallback::Reserved(x) => format!("reserved:{x}"),
        Fallback::LastShare => "last-share".into(),
    }
}

impl ClusterInfo for Cluster {
    fn status(&self) -> ClusterStatus {
        let d = self.node.lock();
        let now = self.now();
        let node = &d.node;
        let cfg = node.config();
        let heir = node.heir();
        let members = self
            .peers
            .values()
            .map(|p| MemberStatus {
                id: p.id,
                addr: p.addr.to_string(),
                weight: p.weight,
                link: match node.link_state(p.id, now) {
                    Some(LinkState::Up) => "up",
                    Some(LinkState::Suspect) => "suspect",
                    Some(LinkState::Down) | None => "down",
                }
                .into(),
                heir: heir == Some(p.id),
            })
            .collect();
        let keys = node
            .active_keys()
            .map(|k| {
                let units = node.enforced(k, now);
                let global = d.rules.get(&k).copied().unwrap_or(0);
                KeyShareStatus {
                    key: format!("{k:016x}"),
                    share: units as f64 / SCALE as f64,
                    limit: scaled(global, units),
                    global_limit: global,
                    demand: node.demand(k) / SCALE as f64,
                }
            })
            .collect();
        let c = &self.counters;
        ClusterStatus {
            node_id: self.me,
            incarnation: node.incarnation(),
            lifecycle: lifecycle_name(node.lifecycle()).into(),
            lease: match node.lease_state(now) {
                LeaseState::Valid => "valid",
                LeaseState::Expiring => "expiring",
                LeaseState::Expired => "expired",
            }
            .into(),
            fallback: fallback_name(cfg.fallback),
            heir,
            gamma: cfg.gamma,
            cycle_ms: cfg.cycle as f64 / 1e6,
            members,
            default_share: node.default_enforced(now) as f64 / SCALE as f64,
            keys,
            peer: PeerCounters {
                messages_sent: c.messages_sent.load(Ordering::Relaxed),
                bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
                messages_received: c.messages_received.load(Ordering::Relaxed),
                bytes_received: c.bytes_received.load(Ordering::Relaxed),
                rejected_unauthenticated: c.rejected_unauthenticated.load(Ordering::Relaxed),
                rejected_malformed: c.rejected_malformed.load(Ordering::Relaxed),
            },
        }
    }
}

/// Parses `ID=HOST:PORT[,ID=HOST:PORT…]` (`--peers`), weight 1 each; `ID=HOST:PORT@W` sets a
/// weight.
///
/// # Errors
/// [`ClusterError::Invalid`] naming the bad entry.
pub fn parse_peers(text: &str) -> Result<Vec<PeerSpec>, ClusterError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |why: &str| {
            ClusterError::Invalid(format!(
                "--peers entry `{item}`: {why} (expected ID=HOST:PORT[@WEIGHT])"
            ))
        };
        let (id, rest) = item.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| bad("the id must be an integer"))?;
        let (addr, weight) = match rest.rsplit_once('@') {
            Some((a, w)) => (a, w.parse::<f64>().map_err(|_| bad("bad weight"))?),
            None => (rest, 1.0),
        };
        let addr = std::net::ToSocketAddrs::to_socket_addrs(addr.trim())
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| bad("cannot resolve the address"))?;
        out.push(PeerSpec { id, addr, weight });
    }
    Ok(out)
}

/// Parses a fallback mode: `none`, `reserved:F` (0 < F ≤ 1), `last-share`.
///
/// # Errors
/// [`ClusterError::Invalid`].
pub fn parse_fallback(text: &str) -> Result<Fallback, ClusterError> {
    match text {
        "none" => Ok(Fallback::None),
        "last-share" => Ok(Fallback::LastShare),
        _ => text
            .strip_prefix("reserved:")
            .and_then(|f| f.parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .map(Fallback::Reserved)
            .ok_or_else(|| {
                ClusterError::Invalid(format!(
                    "fallback `{text}`: expected none, reserved:F (0 < F <= 1) or last-share"
                ))
            }),
    }
}
