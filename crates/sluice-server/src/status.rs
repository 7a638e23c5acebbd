//! What a node tells operators about its cluster (`GET /v1/cluster`, `/metrics`): members,
//! link states, this node's shares and lease, and the peer transport's counters.
//!
//! The cluster driver produces a [`ClusterStatus`] on demand through [`ClusterInfo`]; the
//! HTTP layer only serialises it, so a node without a cluster answers with
//! [`ClusterStatus::single`].

use serde::Serialize;

/// A snapshot of this node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterStatus {
    /// This node's id.
    pub node_id: u32,
    /// This node's incarnation (grows on every restart, and when it starts again after a
    /// fence or two leases without a lease).
    pub incarnation: u64,
    /// `joining`, `active`, `leaving`, `left`, or `single` (no cluster).
    pub lifecycle: String,
    /// Lease on the shared capacity: `valid`, `expiring`, `expired` (enforcing the fallback),
    /// or `none` (no cluster).
    pub lease: String,
    /// The fallback mode (`none`, `reserved:F`, `last-share`).
    pub fallback: String,
    /// Until then (milliseconds from now) this restarted node echoes nobody and does not
    /// count toward an audit's quorum (docs/PROTOCOL.md, "Restarts"); 0 once over.
    pub quarantine_ms: f64,
    /// The gain γ in use.
    pub gamma: f64,
    /// With `gamma: auto`: γ* (seed 000 Thm 2, capped by seed 003 eq. 15) for the members
    /// this node has heard from within a lease, recomputed when they change; `None` with a
    /// fixed gain. The node applies it when `sluice-coord` lets the gain change at run time;
    /// until then `gamma` stays the value computed at start.
    pub gamma_auto: Option<f64>,
    /// The members `gamma_auto` was computed for (this node included): every configured
    /// member at start, then those heard from within a lease.
    pub live_members: Vec<u32>,
    /// The update cycle, milliseconds.
    pub cycle_ms: f64,
    /// Every configured peer.
    pub members: Vec<MemberStatus>,
    /// Peers given by host name whose name has not resolved yet (nothing is sent to them).
    pub peers_unresolved: usize,
    /// Share of a key this node has no state for (fraction of the key's limit).
    pub default_share: f64,
    /// Shares of the keys with state: the busiest first (largest demand), at most as many as
    /// asked for (`GET /v1/cluster?keys=N`, default [`LISTED_KEYS`]; `keys=all`). How many
    /// keys have state is `coordinated_keys`.
    pub keys: Vec<KeyShareStatus>,
    /// Dead floors: per node, the highest incarnation known dead or fenced (it never holds
    /// a lease again; its capacity was minted again by an audit). A member's are kept; a
    /// departed joiner's for `--forget-departed`.
    pub dead: Vec<DeadFloor>,
    /// Votes to fence not yet made a fence by a quorum, `(voter, node, incarnation)`.
    pub pending_votes: Vec<(u32, u32, u64)>,
    /// Capacity audits this node confirmed as their root (the lowest member runs them:
    /// docs/PROTOCOL.md, "The capacity audit").
    pub audit_rounds: u64,
    /// What those audits found missing and minted again, as a fraction of every key's limit
    /// (summed over the rounds): capacity that failures had lost for good. Non-zero only at
    /// the root, and only after overlapping failures.
    pub audit_minted_share: f64,
    /// Dead floors for this node's own id above its incarnation that it heard (and started
    /// again above), and namesake notices (a peer hears a later incarnation of this id
    /// elsewhere): another process runs with this node's id, or its incarnation went
    /// backwards (a state file added after starts from the clock). Should stay 0.
    pub incarnation_conflicts: u64,
    /// Random node ids this process gave up because another process had drawn the same
    /// one (docs/PROTOCOL.md, "Node ids"); `node_id` is the current one. Should stay 0.
    pub node_id_redraws: u64,
    /// Keys with coordinated state and their cap (JSON: fields of this object).
    #[serde(flatten)]
    pub cap: KeyCap,
    /// Peer transport counters.
    pub peer: PeerCounters,
    /// Who the members are, as this node sees them (docs/PROTOCOL.md, "Membership").
    pub membership: MembershipStatus,
}

/// The membership as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct MembershipStatus {
    /// A digest of the voters, the live links' incarnations and the dead floors (16 hex
    /// digits): nodes that see the same membership show the same version.
    pub version: String,
    /// The voting members (they make the quorums).
    pub voters: Vec<u32>,
    /// Links made at run time (joiners, nodes found by discovery or another's directory).
    pub joins: u64,
    /// Incarnations that left gracefully.
    pub leaves: u64,
    /// Incarnations fenced.
    pub fences: u64,
    /// Joiners refused because the node has as many links as it keeps.
    pub refused: u64,
    /// Addresses discovery proposes now (`--peers HOST:PORT`, `--peers-dns`, `--peers-file`).
    pub candidates: usize,
    /// Why discovery could not look something up, while it cannot.
    pub discovery_errors: Vec<String>,
}

/// Keys with coordinated state here and the cap on them (`sluice serve --max-cluster-keys`,
/// docs/PROTOCOL.md "Many keys").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct KeyCap {
    /// Keys this node holds coordinated state for.
    pub coordinated_keys: usize,
    /// The most it holds (0: no cap).
    pub max_cluster_keys: usize,
    /// Times a key was refused coordination because the cap was held (it stayed on the
    /// static split).
    pub keys_refused: u64,
    /// Idle keys retired early because the cap was held.
    pub keys_evicted: u64,
    /// Keys given state beyond the cap because what arrived for them held capacity (every
    /// key held beyond `max_cluster_keys` is counted here).
    pub keys_over_cap: u64,
}

impl KeyCap {
    /// What `node` says of its keys.
    #[must_use]
    pub fn of(node: &sluice_coord::node::Node) -> Self {
        Self {
            coordinated_keys: node.coordinated_keys(),
            max_cluster_keys: node.config().max_keys.unwrap_or(0),
            keys_refused: node.refused_keys(),
            keys_evicted: node.evicted_keys(),
            keys_over_cap: node.keys_over_cap(),
        }
    }
}

impl ClusterStatus {
    /// A node alone: every cluster rule applies its whole limit.
    #[must_use]
    pub fn single() -> Self {
        Self {
            node_id: 0,
            incarnation: 0,
            lifecycle: "single".into(),
            lease: "none".into(),
            fallback: "none".into(),
            quarantine_ms: 0.0,
            gamma: 0.0,
            gamma_auto: None,
            live_members: Vec::new(),
            cycle_ms: 0.0,
            members: Vec::new(),
            peers_unresolved: 0,
            default_share: 1.0,
            keys: Vec::new(),
            dead: Vec::new(),
            pending_votes: Vec::new(),
            audit_rounds: 0,
            audit_minted_share: 0.0,
            incarnation_conflicts: 0,
            node_id_redraws: 0,
            cap: KeyCap::default(),
            peer: PeerCounters::default(),
            membership: MembershipStatus::default(),
        }
    }
}

/// One peer as this node sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberStatus {
    /// Its id.
    pub id: u32,
    /// The peer address messages go to; `None` while its name has not resolved yet.
    pub addr: Option<String>,
    /// `HOST:PORT` as configured, when given by name (looked up again every few seconds);
    /// `None` for an IP literal.
    pub host: Option<String>,
    /// Why the last lookup of `host` failed, while it keeps failing (`addr` is then the last
    /// address found, if any).
    pub resolve_error: Option<String>,
    /// Link weight `w_ij`.
    pub weight: f64,
    /// `up` (heard within two cycles), `suspect` (within a lease), `down`.
    pub link: String,
    /// The incarnation our link is with (0: none: never heard, or dead).
    pub incarnation: u64,
    /// A voting member.
    pub voter: bool,
    /// Where this node learned of it: `peers` (configured), `dns:NAME`, `file:PATH`,
    /// `gossip:ID` (another node's directory), `contact` (it wrote to us first).
    pub discovered: Option<String>,
    /// The wire version this node speaks to it: the version of the latest message heard
    /// from it, at most ours; ours before it is heard (docs/PROTOCOL.md, "Versions").
    pub wire_version: u8,
}

/// Incarnations up to `incarnation` of `node` are dead or fenced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadFloor {
    /// The node.
    pub node: u32,
    /// Its highest dead incarnation.
    pub incarnation: u64,
}

/// This node's share of one cluster key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyShareStatus {
    /// The cluster key (16 hex digits; a hash of the domain and descriptor).
    pub key: String,
    /// The domain of the rule the key falls under; `None` while this node has only heard
    /// of the key from its peers (it has not decided one of its requests yet).
    pub domain: Option<String>,
    /// That rule's descriptor path, as `/metrics` names rules (`key_value.key2`).
    pub rule: Option<String>,
    /// Fraction of the key's global limit this node enforces.
    pub share: f64,
    /// Requests per unit this node enforces.
    pub limit: u64,
    /// The rule's global requests per unit.
    pub global_limit: u64,
    /// Smoothed demand, as a fraction of the key's limit (seed 003 §III filter).
    pub demand: f64,
}

/// Peer transport counters since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PeerCounters {
    /// Messages sent.
    pub messages_sent: u64,
    /// Bytes sent (datagrams, headers and MACs included).
    pub bytes_sent: u64,
    /// Messages received and applied.
    pub messages_received: u64,
    /// Bytes received (accepted datagrams).
    pub bytes_received: u64,
    /// Datagrams rejected: bad MAC, unknown sender, or addressed to another node. Never
    /// applied.
    pub rejected_unauthenticated: u64,
    /// Datagrams rejected: authentic but undecodable.
    pub rejected_malformed: u64,
    /// Datagrams rejected: authentic, from a peer speaking a wire version this node does not
    /// read (a peer's first messages before the link settles on the version both speak, or
    /// a peer more than one version apart: docs/PROTOCOL.md, "Versions").
    pub rejected_version: u64,
    /// Datagrams ignored: authentic, from a key holder started with other voting members
    /// (its directories, and its messages, which state the voters from wire version 13): it
    /// would count other quorums and shares (docs/PROTOCOL.md, "Membership").
    pub rejected_membership: u64,
    /// Messages not sent: the peer's name had not resolved yet.
    pub unaddressed: u64,
    /// Messages not sent: too large for one datagram (the node sizes its messages to fit,
    /// so this stays 0; like a lost message, one only delays).
    pub oversized: u64,
    /// Directories sent (to known nodes and discovered addresses).
    pub directories_sent: u64,
    /// Directories received.
    pub directories_received: u64,
}

/// Keys `/v1/cluster` and `/metrics` list by default (the busiest). A node may hold state
/// for a hundred thousand keys: listing every one costs a walk of them all under the
/// driver's lock at every probe and scrape, which stalled the cluster's messages, and
/// gives Prometheus a series per key.
pub const LISTED_KEYS: usize = 100;

/// Something that can describe the cluster (the cluster driver).
pub trait ClusterInfo: Send + Sync + std::fmt::Debug {
    /// The current snapshot, listing at most `keys` keys (the busiest; `usize::MAX`: all of
    /// them, 0: none, which costs nothing per key).
    fn status(&self, keys: usize) -> ClusterStatus;
}
