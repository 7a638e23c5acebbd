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
//! On shutdown the node leaves gracefully (hands its shares to its peers) before returning,
//! so the survivors keep the whole limit.
//!
//! Two duties of the driver itself (not of the protocol):
//!
//! * **The lease ends on time.** The node's enforced limit drops to its fallback the instant
//!   its lease ends (the holder must stop before a quorum fences it and an audit mints its
//!   share again). A node only recomputes its limits when it is driven, so the driver arms a
//!   timer at the end of the lease instead of waiting for the next cycle, and applies the
//!   limits it would enforce [`EXPIRY_GUARD`] later, so a timer that fires late (timer
//!   granularity, a busy runtime) still stops in time; every decision also checks the lease
//!   against the clock.
//! * **`gamma: auto` follows membership.** γ* = 2/(λ₂+λₙ) (seed 000 Thm 2) depends on the
//!   graph; when a peer stops being heard for a lease (crash, partition, graceful leave) or
//!   is heard again, the driver recomputes γ* on the graph induced on the members it hears,
//!   capped by the stability bound of its degree to them (seed 003 eq. 15), logs it and
//!   reports it in `/v1/cluster` (`gamma_auto`).
//!
//! The socket is anything that implements [`Transport`]: the tokio UDP socket in production,
//! a simulated network in the partition tests. Peers given by host name are looked up in the
//! background and followed when their address changes ([`addrs`]).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sluice_coord::law::Measure;
use sluice_coord::node::{Config as NodeConfig, Fallback, LeaseState, Node};
use sluice_coord::testing::Rng;
use sluice_coord::wire::{self, Lifecycle, NodeId};
use tokio::net::UdpSocket;
use tokio::time::Instant;

mod addrs;
mod directory;
mod discovery;
mod gamma;
mod join;
mod namesake;
mod status;
mod version;

pub use addrs::{PeerAddr, RESOLVE_EVERY, Resolver, SystemResolver, parse_addr, parse_peers};
pub use discovery::{DiscoverySpec, parse_peers_file};
pub use namesake::draw_node_id;

use addrs::Addrs;
use gamma::{AutoGamma, auto_edges, gain};
use version::Versions;

use crate::engine::Engine;
use crate::peer::{self, MAX_DATAGRAM, PeerKey, Transport};
use crate::shares::{KeyRole, SCALE, Shares, key_role, scaled};

/// A peer of this node.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSpec {
    /// Its node id.
    pub id: NodeId,
    /// Where its peer transport listens: an IP literal, or a name looked up every
    /// [`ClusterSpec::resolve_every`].
    pub addr: PeerAddr,
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
    /// `node_id` was drawn at random (no `--node-id`), so no other process of this cluster
    /// ever ran under it: an incarnation of it above this one is another process that drew
    /// the same id, and this node gives the id up and joins again under a new one
    /// (docs/PROTOCOL.md, "Node ids").
    pub random_id: bool,
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
    /// This node's incarnation: 1 on a first start (with a state file), larger on every
    /// restart. Any other than 1 starts in quarantine (docs/PROTOCOL.md, "Restarts").
    pub incarnation: u64,
    /// A key with no demand for this long gives its capacity back and its state is dropped
    /// (`sluice_coord` "Idle keys"); it comes back from the static split.
    pub idle_after: Duration,
    /// How long a departed joiner's dead floor is kept (`sluice serve --forget-departed`;
    /// docs/PROTOCOL.md, "Membership"): at least `6·lease + 64·cycle`.
    pub forget_departed: Duration,
    /// Where the incarnation is kept across restarts (`sluice serve --state-file`). It is
    /// rewritten whenever this node starts again as a new incarnation while running (fenced,
    /// or long without a lease), so that the next start comes back above every incarnation
    /// it has used: a restart that reused one would be taken for a fenced one.
    pub state_file: Option<std::path::PathBuf>,
    /// The most keys with coordinated state (`sluice serve --max-cluster-keys`): at the
    /// cap a new heavy key stays on the static split (docs/PROTOCOL.md "Many keys").
    pub max_keys: usize,
    /// Peer bytes per cycle per link (`sluice serve --peer-budget`).
    pub link_budget: usize,
    /// Looks up the peers given by name.
    pub resolver: Arc<dyn Resolver>,
    /// How often the peers given by name are looked up again.
    pub resolve_every: Duration,
    /// The voting members (they make the quorums and split the limit at a first start).
    /// `None`: this node and every peer of `peers` (a cluster's founding members), or, with
    /// no peers, the voters of the first running cluster it hears (a joiner).
    pub members: Option<Vec<NodeId>>,
    /// Where to find nodes whose ids are not configured (docs/PROTOCOL.md, "Membership").
    pub discovery: DiscoverySpec,
    /// The highest wire version spoken and accepted (per link, the peer's if lower: see
    /// `version`); below `wire::VERSION` only to test upgrades (`--wire-version`).
    pub wire_version: u8,
}

impl ClusterSpec {
    /// The least `forget_departed` this spec's lease and cycle allow
    /// (`sluice_coord::node::Config::least_forget_departed`).
    #[must_use]
    pub fn least_forget_departed(&self) -> Duration {
        Duration::from_nanos(NodeConfig::least_forget_departed(
            nanos(self.lease),
            nanos(self.cycle),
        ))
    }

    /// A spec with the defaults: `gamma: auto`, cycle 100 ms, lease 1 s, strict fallback.
    #[must_use]
    pub fn new(node_id: NodeId, peers: Vec<PeerSpec>, key: PeerKey) -> Self {
        Self {
            node_id,
            random_id: false,
            peers,
            topology: None,
            key,
            gamma: Gamma::Auto,
            cycle: Duration::from_millis(100),
            lease: Duration::from_secs(1),
            fallback: Fallback::None,
            incarnation: 1,
            idle_after: Duration::from_secs(30),
            forget_departed: Duration::from_secs(600),
            state_file: None,
            max_keys: 10_000,
            link_budget: 60_000,
            resolver: Arc::new(SystemResolver),
            resolve_every: RESOLVE_EVERY,
            members: None,
            discovery: DiscoverySpec::default(),
            wire_version: wire::VERSION,
        }
    }

    /// The voting members this spec starts with (see [`ClusterSpec::members`]), sorted.
    fn voters(&self) -> Vec<NodeId> {
        let mut m = match &self.members {
            Some(m) => m.clone(),
            None if self.peers.is_empty() => Vec::new(),
            None => {
                let mut m: Vec<NodeId> = self.peers.iter().map(|p| p.id).collect();
                m.push(self.node_id);
                m
            }
        };
        m.sort_unstable();
        m.dedup();
        m
    }
}

/// Writes `incarnation` to `path` atomically (a temporary file renamed over it), as
/// `sluice serve --state-file` reads it at start.
///
/// # Errors
/// The I/O error if the file cannot be written.
pub fn persist_incarnation(path: &std::path::Path, incarnation: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{incarnation}\n"))?;
    std::fs::rename(&tmp, path)
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

/// Max-min fairness gives a node whose demand is below the water level exactly its demand,
/// and the capacity nobody needs stays where it is: a node at its share refuses whatever its
/// demand estimate lags or its arrivals bunch, though the cluster has capacity to spare. So a
/// max-min key's demand counts this much more (docs/PROTOCOL.md, "Demand"): below
/// `L/(1 + h)` in all every node holds its demand and this margin; above, the water level is
/// that of the inflated demands, at most this fraction under the exact one.
pub const MAX_MIN_HEADROOM: f64 = 0.05;

/// How much earlier than its lease's end a node stops enforcing shared capacity, at most
/// (an eighth of the lease if that is shorter). Covers a timer that fires late: tokio's
/// timers have millisecond granularity, and a busy runtime polls the driver late.
pub const EXPIRY_GUARD: Duration = Duration::from_millis(5);

/// Most datagrams the driver takes in one batch (see `Cluster::on_datagrams`): enough to
/// drain a cycle's messages from dozens of peers, few enough that a tick is never long
/// delayed by one batch.
const BATCH: usize = 64;

/// A running node's cluster state, shared by the driver task and the status readers.
///
/// `T` is the datagram socket ([`Transport`]): the tokio UDP socket unless a test says
/// otherwise.
#[derive(Debug)]
pub struct Cluster<T: Transport = UdpSocket> {
    node: Mutex<Driven>,
    shares: Arc<Shares>,
    socket: T,
    peers: BTreeMap<NodeId, PeerSpec>,
    /// Where messages to each peer go now (names re-resolved in the background).
    addrs: Arc<Addrs>,
    resolver: Arc<dyn Resolver>,
    resolve_every: Duration,
    key: PeerKey,
    /// This node's id: `spec.node_id` unless a random one was taken by another process and
    /// drawn again (see `redraw`).
    me: AtomicU32,
    start: Instant,
    counters: Counters,
    cycle: Duration,
    /// Nanoseconds added to `now` when computing what to enforce ([`EXPIRY_GUARD`]).
    guard: u64,
    /// `Some` for `gamma: auto`: what γ* is computed from.
    auto: Option<AutoGamma>,
    /// What the node is built from, to build it again when a joiner adopts the voters of
    /// the cluster it joins (see `join`).
    spec: ClusterSpec,
    /// Addresses discovery proposes (see `discovery`).
    candidates: Arc<discovery::Candidates>,
    prefer_v4: bool,
    /// The wire version spoken on each link.
    versions: Versions,
}

#[derive(Debug)]
struct Driven {
    node: Node,
    rng: Rng,
    last_tick: u64,
    /// Rule limits of the keys seen here (for the status page).
    rules: BTreeMap<u64, u64>,
    /// The members heard within a lease (this node included) when γ* was last computed.
    live: BTreeSet<NodeId>,
    /// γ* for `live` (`gamma: auto` only).
    gamma_auto: Option<f64>,
    /// When the lease ends, if it is running (this node's clock, guard included).
    expiry: Option<u64>,
    /// The incarnation last written to the state file.
    persisted: u64,
    /// The incarnation last logged (a start-again is logged once).
    logged_incarnation: u64,
    /// Id conflicts last logged (`Node::id_conflicts`).
    logged_conflicts: u64,
    /// Id conflicts counted by the nodes this process gave up with their random ids.
    past_conflicts: u64,
    /// Random ids given up because another process drew them (see `namesake`).
    redraws: u64,
    /// Namesake notices heard: another process runs under this node's id (see `namesake`).
    notices: u64,
    /// When a namesake notice last went to each peer id.
    noticed: BTreeMap<NodeId, u64>,
    /// Some incarnation of this process held a lease (a joiner adopts voters only before).
    ever_leased: bool,
    /// Ticks so far (the directory goes every [`join::DIRECTORY_EVERY`]).
    ticks: u64,
    /// Peers whose voters differ from ours, already warned about.
    warned: BTreeSet<NodeId>,
    /// Hits of keys first hit less than a cycle ago, and whether one was refused (measured
    /// at the next tick, from the first hit).
    young: std::collections::HashMap<u64, (u64, bool)>,
}

#[derive(Debug, Default)]
struct Counters {
    messages_sent: AtomicU64,
    bytes_sent: AtomicU64,
    messages_received: AtomicU64,
    bytes_received: AtomicU64,
    rejected_unauthenticated: AtomicU64,
    rejected_malformed: AtomicU64,
    rejected_version: AtomicU64,
    unaddressed: AtomicU64,
    oversized: AtomicU64,
    rejected_membership: AtomicU64,
    directories_sent: AtomicU64,
    directories_received: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<T: Transport> Cluster<T> {
    /// Starts this node's part of the cluster: binds nothing (the caller passes `socket`),
    /// builds the node, and attaches the shares to `engine` so its cluster rules apply this
    /// node's share from now on.
    ///
    /// # Errors
    /// [`ClusterError`] for an inconsistent spec or a gain the stability bound refuses.
    pub fn new(spec: &ClusterSpec, socket: T, engine: &Engine) -> Result<Arc<Self>, ClusterError> {
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
        if spec.resolve_every.is_zero() {
            return Err(ClusterError::Invalid(
                "the peer lookup interval must be positive".into(),
            ));
        }
        if spec.peers.is_empty() && spec.discovery.is_empty() {
            return Err(ClusterError::Invalid(
                "a cluster needs peers: configured ones, seeds, a DNS name or a peers file".into(),
            ));
        }
        if spec.members.as_ref().is_some_and(Vec::is_empty) {
            return Err(ClusterError::Invalid("the member list is empty".into()));
        }
        if spec.cycle.is_zero() || spec.lease < spec.cycle * 4 {
            return Err(ClusterError::Invalid(format!(
                "the lease ({:?}) must be at least four cycles ({:?})",
                spec.lease, spec.cycle
            )));
        }
        let versions = Versions::new(spec.wire_version)?;
        let members = spec.voters();
        let links: Vec<(NodeId, f64)> = spec.peers.iter().map(|p| (p.id, p.weight)).collect();
        let cfg = node_config(spec, spec.node_id, members.clone(), links, spec.incarnation)?;
        let start = Instant::now();
        let node = Node::new(cfg, 1)?;
        let guard = nanos(EXPIRY_GUARD.min(spec.lease / 8));
        let shares = Arc::new(Shares::new(node.default_enforced(1 + guard)));
        // Every decision checks the lease against the clock (not only the timer at its end):
        // past it, a key's limit is at most the fallback's reservation.
        if spec.fallback != Fallback::LastShare {
            let cfg = node.config();
            shares.gate_lease(start, cfg.reservation(cfg.id));
        }
        if !engine.attach_cluster(shares.clone()) {
            return Err(ClusterError::Invalid(
                "the engine already belongs to a cluster".into(),
            ));
        }
        let auto = matches!(spec.gamma, Gamma::Auto).then(|| AutoGamma {
            edges: auto_edges(spec),
            measure: node.config().measure,
        });
        let gamma_auto = auto.as_ref().map(|_| node.config().gamma);
        let prefer_v4 = socket.local_addr().map_or(true, |a| a.is_ipv4());
        let addrs = Arc::new(Addrs::new(peers.values(), prefer_v4));
        Ok(Arc::new(Self {
            node: Mutex::new(Driven {
                node,
                rng: Rng::new(u64::from(spec.node_id) ^ (spec.incarnation << 32)),
                last_tick: 1,
                rules: BTreeMap::new(),
                live: members.iter().copied().collect(),
                gamma_auto,
                expiry: None,
                persisted: spec.incarnation,
                logged_incarnation: spec.incarnation.max(1),
                logged_conflicts: 0,
                past_conflicts: 0,
                redraws: 0,
                notices: 0,
                noticed: BTreeMap::new(),
                ever_leased: false,
                ticks: 0,
                warned: BTreeSet::new(),
                young: std::collections::HashMap::new(),
            }),
            shares,
            socket,
            peers,
            addrs,
            resolver: spec.resolver.clone(),
            resolve_every: spec.resolve_every,
            key: spec.key.clone(),
            me: AtomicU32::new(spec.node_id),
            start,
            counters: Counters::default(),
            cycle: spec.cycle,
            guard,
            auto,
            spec: spec.clone(),
            candidates: Arc::new(discovery::Candidates::default()),
            prefer_v4,
            versions,
        }))
    }

    /// This node's id now.
    fn me(&self) -> NodeId {
        self.me.load(Ordering::Relaxed)
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
    /// As [`Transport::local_addr`].
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The instant (on the runtime's clock) of this node's time `t`.
    fn instant(&self, t: u64) -> Instant {
        self.start + Duration::from_nanos(t.saturating_sub(1))
    }

    /// Where the lease-end timer should fire: the end of the lease less the guard, or far
    /// away when no lease is running.
    fn expiry_instant(&self) -> Option<Instant> {
        let at = self.node.lock().expiry?;
        Some(self.instant(at.saturating_sub(self.guard)))
    }

    /// Drives the node until `shutdown` completes, then leaves gracefully: hands every
    /// share above its reservation to a peer and waits (at most two leases) until they
    /// are acknowledged.
    ///
    /// # Errors
    /// Never in practice: socket errors on send or receive are counted and survived.
    pub async fn run(
        self: Arc<Self>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ClusterError> {
        // Lookups block: they run beside the driver, never in its loop; aborted on return.
        let _lookups = (!self.addrs.names().is_empty()).then(|| {
            AbortOnDrop(tokio::spawn(addrs::follow(
                self.addrs.clone(),
                self.resolver.clone(),
                self.resolve_every,
            )))
        });
        let _discovery = (!self.spec.discovery.is_empty()).then(|| {
            AbortOnDrop(tokio::spawn(discovery::follow(
                self.spec.discovery.clone(),
                self.resolver.clone(),
                self.candidates.clone(),
                self.prefer_v4,
                self.resolve_every,
            )))
        });
        let mut tick = tokio::time::interval(self.cycle);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let expiry = tokio::time::sleep_until(self.start);
        tokio::pin!(shutdown, expiry);
        let mut armed = None;
        loop {
            armed = self.rearm(expiry.as_mut(), armed);
            // Biased: a fixed order, so a run is reproducible under a simulated clock (the
            // partition tests), and a flood of datagrams cannot delay a tick.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = tick.tick() => self.on_tick().await,
                () = &mut expiry, if armed.is_some() => {
                    armed = None;
                    self.on_expiry().await;
                }
                r = self.socket.recv_from(&mut buf) => {
                    if let Ok((n, src)) = r {
                        self.on_datagrams(&mut buf, n, src).await;
                    }
                }
            }
        }
        self.leave(&mut tick, &mut buf, expiry, armed).await;
        Ok(())
    }

    /// Points the lease-end timer at the current lease's end; returns where it points.
    fn rearm(
        &self,
        timer: std::pin::Pin<&mut tokio::time::Sleep>,
        armed: Option<Instant>,
    ) -> Option<Instant> {
        let want = self.expiry_instant();
        if let Some(at) = want
            && want != armed
        {
            timer.reset(at);
        }
        want
    }

    /// The lease ended (or is about to, within the guard): apply the fallback now.
    async fn on_expiry(&self) {
        let out = {
            let mut d = self.node.lock();
            let now = self.now();
            self.collect(&mut d, now)
        };
        // Usually nothing: `tick` and `handle_message` sent theirs already.
        self.send(out).await;
    }

    async fn leave(
        &self,
        tick: &mut tokio::time::Interval,
        buf: &mut [u8],
        mut expiry: std::pin::Pin<&mut tokio::time::Sleep>,
        mut armed: Option<Instant>,
    ) {
        let lease = {
            let mut d = self.node.lock();
            let now = self.now();
            d.node.leave(now);
            d.node.config().lease
        };
        let deadline = Instant::now() + Duration::from_nanos(lease.saturating_mul(2));
        loop {
            if self.node.lock().node.lifecycle() == Lifecycle::Left {
                return;
            }
            armed = self.rearm(expiry.as_mut(), armed);
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(deadline) => return,
                _ = tick.tick() => self.on_tick().await,
                () = &mut expiry, if armed.is_some() => {
                    armed = None;
                    self.on_expiry().await;
                }
                r = self.socket.recv_from(buf) => {
                    if let Ok((n, src)) = r {
                        self.on_datagrams(buf, n, src).await;
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
            // A rate measured over a sliver of time is noise: the first tick comes right at
            // start, and one hit over a microsecond reads as a hundred thousand limits, which
            // the demand filter then takes many time constants to forget. Such hits stay
            // for the next tick.
            let measure = dt >= nanos(self.cycle) / 2;
            if measure {
                d.last_tick = now;
            }
            let drained = if measure {
                self.shares.drain()
            } else {
                Vec::new()
            };
            let split = d.node.default_enforced(now) as f64;
            let seen = self.shares.clock();
            let cycle = nanos(self.cycle);
            for mut h in drained {
                // A key first hit less than a cycle ago: its hits are too few and too recent
                // to measure (over the whole cycle, a joiner's first demand read a fraction
                // of what it is, and the filter took several time constants to catch up).
                // They wait for the next tick, then count from the first hit.
                let age = seen.saturating_sub(h.first_hit);
                if h.first_hit != 0 && age < cycle && h.hits > 0 {
                    let y = d.young.entry(h.key).or_insert((0, false));
                    y.0 += h.hits;
                    y.1 |= h.refused;
                    continue;
                }
                if let Some((hits, refused)) = d.young.remove(&h.key) {
                    h.hits += hits;
                    h.refused |= refused;
                }
                let span = if h.first_hit != 0 && age < 2 * cycle {
                    age
                } else {
                    dt
                };
                // Hits per rule period, in capacity units (the rule's limit is SCALE).
                let mut rate = if h.count == 0 {
                    0.0
                } else {
                    h.hits as f64 * h.period as f64 / span as f64 * SCALE as f64 / h.count as f64
                };
                if d.node.config().measure_of(h.key) == Measure::MaxMin {
                    rate *= 1.0 + MAX_MIN_HEADROOM;
                }
                match key_role(d.node.has_state(h.key), h.hits, h.refused, rate, split) {
                    KeyRole::Coordinated => {
                        if h.count > 0 {
                            d.rules.insert(h.key, h.count);
                        }
                        d.node.set_demand(now, h.key, rate);
                    }
                    KeyRole::Light => {}
                    KeyRole::Gone => {
                        self.shares.remove(h.key);
                        d.rules.remove(&h.key);
                    }
                }
            }
            self.follow_membership(&mut d, now);
            let Driven { node, rng, .. } = &mut *d;
            node.tick(now, &mut || rng.next_f64());
            let mut out = self.collect(&mut d, now);
            // Rises held back by the engine's window come into force here, once a cycle: a
            // walk of every key per datagram cost more than the messages themselves.
            self.shares.refresh(now.saturating_add(self.guard));
            d.ticks += 1;
            // Every cycle until a first lease (a joiner finding its cluster), then every
            // [`join::DIRECTORY_EVERY`].
            if d.ticks % join::DIRECTORY_EVERY == 1 || !d.ever_leased {
                out.extend(self.directories(&mut d, now));
            }
            out
        };
        self.send(out).await;
    }

    /// A datagram (`buf[..n]` from `src`) and every one queued behind it, up to
    /// [`BATCH`]: each message is handled, then the limits are applied and the answers
    /// framed once for the batch. A driver that falls behind (a busy machine, many keys)
    /// takes larger batches, so the work per datagram falls as the queue grows instead of
    /// the queue growing without bound (leases lapsed that way).
    async fn on_datagrams(&self, buf: &mut [u8], n: usize, src: SocketAddr) {
        let mut messages = Vec::new();
        let mut strays = Vec::new();
        let mut out = Vec::new();
        self.accept(&buf[..n], src, &mut messages, &mut strays, &mut out);
        for _ in 1..BATCH {
            match self.socket.try_recv_from(buf) {
                Ok((n, src)) => self.accept(&buf[..n], src, &mut messages, &mut strays, &mut out),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {}
            }
        }
        if !messages.is_empty() {
            let mut d = self.node.lock();
            let now = self.now();
            let Driven { node, rng, .. } = &mut *d;
            node.handle_messages(now, messages, &mut || rng.next_f64());
            if !strays.is_empty() {
                out.extend(self.notices(&mut d, &strays, now));
            }
            out.extend(self.collect(&mut d, now));
        }
        self.send(out).await;
    }

    /// Opens one datagram: a coordination message joins `messages` (and `strays` too, with
    /// its sender's incarnation, when it came from elsewhere than where we send to its
    /// sender: see `namesake`); a directory is answered into `out`; a namesake notice is
    /// taken; anything else is counted and dropped.
    fn accept(
        &self,
        datagram: &[u8],
        src: SocketAddr,
        messages: &mut Vec<(NodeId, wire::Message)>,
        strays: &mut Vec<(NodeId, u64, SocketAddr)>,
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        let Ok((from, to, payload)) =
            peer::open_any(&self.key, self.me(), directory::ANY, datagram)
        else {
            self.counters
                .rejected_unauthenticated
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        if payload.first() == Some(&directory::TAG) {
            out.extend(self.on_directory(from, to, payload, src));
            return;
        }
        if payload.first() == Some(&namesake::NOTICE) {
            self.on_notice(from, to, payload);
            return;
        }
        if to != self.me() || from == self.me() {
            // A coordination message names its recipient.
            self.counters
                .rejected_unauthenticated
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let msg = match self.versions.decode(from, payload) {
            Ok(msg) => msg,
            // Counted apart: an authentic peer on another wire version is a rolling upgrade
            // in progress (or a forgotten node), not an attack or a bug; see docs/PROTOCOL.md.
            Err(wire::WireError::Version(_)) => {
                self.counters
                    .rejected_version
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(_) => {
                self.counters
                    .rejected_malformed
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // A key holder we neither configured nor learned of from a directory: only a joiner
        // introducing itself is taken (where it sends from is where it listens: one
        // socket); the node decides whether to link.
        let introduces = msg.lifecycle == Lifecycle::Joining && msg.to_inc == 0;
        let known = self.peers.contains_key(&from) || self.addrs.get(from).is_some();
        if !(known || introduces && self.learn(from, src, "contact")) {
            self.counters
                .rejected_unauthenticated
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.counters
            .messages_received
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_received
            .fetch_add(datagram.len() as u64, Ordering::Relaxed);
        if self.addrs.get(from) != Some(src) {
            strays.push((from, msg.from_inc, src));
        }
        messages.push((from, msg));
    }

    /// Applies the node's new limits to the shares, notes when its lease ends, and frames
    /// its messages.
    ///
    /// The limits applied are those of `now + guard`: enforcement only ever drops with time
    /// (at the lease's end), so looking ahead only stops earlier, never later.
    fn collect(&self, d: &mut Driven, now: u64) -> Vec<(SocketAddr, Vec<u8>)> {
        // A dead floor above our incarnation: with a random id, another process has it.
        if d.node.id_conflicts() > d.logged_conflicts && self.spec.random_id {
            self.redraw(d, now);
        }
        let node = &mut d.node;
        let ahead = now.saturating_add(self.guard);
        let ready = node.ready(ahead);
        self.shares.set_default(node.default_enforced(ahead));
        for (key, units) in ready.limits {
            self.shares.set(key, units, ahead);
        }
        // Reclaimed by the node (idle, back at its static split): the engine's next hit on it
        // starts again from the default share.
        for key in ready.reclaimed {
            self.shares.remove(key);
            d.rules.remove(&key);
        }
        d.expiry = lease_end(node, ahead);
        // `lease_until` is in the past once expired: the gate then caps at once.
        self.shares
            .set_lease_until(node.lease_until().map(|end| end.saturating_sub(self.guard)));
        let inc = node.incarnation();
        if node.id_conflicts() > d.logged_conflicts {
            tracing::error!(
                node = self.me(),
                incarnation = inc,
                "a peer knows an incarnation of this node's id above this one: another process \
                 runs with this --node-id, or the incarnation went backwards (a --state-file \
                 added after starts without one, or a low --incarnation); started again above it"
            );
            d.logged_conflicts = node.id_conflicts();
        }
        if inc > d.logged_incarnation {
            // Fenced while cut off, or two leases without a lease: the node starts again
            // holding its reservation (docs/PROTOCOL.md, "Starting again").
            tracing::warn!(
                node = self.me(),
                incarnation = inc,
                previous = d.logged_incarnation,
                "started again as a new incarnation: fenced by a quorum, or long without a lease"
            );
            d.logged_incarnation = inc;
        }
        if inc > d.persisted
            && let Some(path) = &self.spec.state_file
        {
            // A blocking write under the lock: it happens once per reincarnation (rare), and
            // the new incarnation must be on disk before its messages leave.
            match persist_incarnation(path, inc) {
                Ok(()) => d.persisted = inc,
                Err(e) => tracing::warn!(
                    path = %path.display(),
                    incarnation = inc,
                    error = %e,
                    "cannot record the new incarnation: restart with a larger --incarnation"
                ),
            }
        }
        if node.lease_state(now) != LeaseState::Expired {
            d.ever_leased = true;
        }
        let mut out = Vec::with_capacity(ready.messages.len());
        for m in ready.messages {
            // A peer whose name has not resolved yet: like a lost message, it only delays.
            let Some(addr) = self.addrs.get(m.to) else {
                self.counters.unaddressed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            // A message too large for one datagram is dropped: like a lost one it only
            // delays (the next one carries the same counters). See docs/PROTOCOL.md.
            let payload = self.versions.encode(m.to, &m.message);
            match peer::seal(&self.key, self.me(), m.to, &payload) {
                Ok(d) => out.push((addr, d)),
                Err(e) => {
                    self.counters.oversized.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(to = m.to, error = %e, "peer message not sent");
                }
            }
        }
        out
    }

    async fn send(&self, out: Vec<(SocketAddr, Vec<u8>)>) {
        if out.is_empty() {
            return;
        }
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

/// Aborts a background task when dropped (the driver's return, or its future dropped).
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// When the lease that is running at `now` ends (the first instant it reads expired),
/// `None` if none is running (already expired, or no lease applies: nothing to expire).
fn lease_end(node: &Node, now: u64) -> Option<u64> {
    node.lease_until().filter(|&end| end > now)
}

/// The node's configuration from `spec`, with this id, these voters, links and incarnation.
fn node_config(
    spec: &ClusterSpec,
    id: NodeId,
    members: Vec<NodeId>,
    links: Vec<(NodeId, f64)>,
    incarnation: u64,
) -> Result<NodeConfig, ClusterError> {
    let mut cfg = NodeConfig::new(id, members, links, SCALE);
    cfg.incarnation = incarnation.max(1);
    // A key's measure is its rule's `fairness`, read from the key's class
    // (`Fairness::key`): Case I for class 0, max-min and Case II for the others.
    cfg.measure = Measure::Throttled;
    cfg.class_measures = crate::config::Fairness::class_measures(SCALE);
    cfg.gamma = gain(spec, &cfg.measure)?;
    cfg.cycle = nanos(spec.cycle);
    cfg.lease = nanos(spec.lease);
    cfg.demand_tau = nanos(spec.cycle) * 5;
    // New demand (a joiner's first clients, traffic moved from a node that left) is served
    // within a cycle or two; capacity is given back over five (docs/PROTOCOL.md, "Demand").
    cfg.demand_rise_tau = Some(nanos(spec.cycle));
    cfg.fallback = spec.fallback;
    // Keys with no demand for this long give their capacity back and are forgotten
    // (docs/PROTOCOL.md "Idle keys"); memory follows the active keys.
    cfg.idle_after = Some(nanos(spec.idle_after));
    // A capacity audit every ten leases, and at once after a fence (docs/PROTOCOL.md "The
    // capacity audit"); a round costs a few bytes per link.
    cfg.audit_every = Some(nanos(spec.lease) * 10);
    cfg.forget_departed = nanos(spec.forget_departed);
    // One message must fit one datagram with its frame.
    cfg.max_message_bytes = peer::MAX_DATAGRAM - peer::HEADER - peer::TAG;
    // Memory and peer bytes are bounded (docs/PROTOCOL.md "Many keys").
    cfg.max_keys = Some(spec.max_keys);
    cfg.link_budget = spec.link_budget;
    Ok(cfg)
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

#[cfg(test)]
mod tests;
