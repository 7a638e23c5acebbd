//! A node's configuration and the states it reports.

use super::*;

/// What a node enforces when its lease on shared capacity has expired (it cannot reach its
/// a quorum). The guarantee of each mode:
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fallback {
    /// Enforce nothing (0) until a quorum echoes again. Strict: the sum of enforced limits never
    /// exceeds `L`. Availability: a partitioned node admits nothing.
    None,
    /// Keep a reservation of `fraction` of the node's initial share, never given away and
    /// never inherited (seed 002 §4.4(5), quota pre-allocation with fallback to standalone).
    /// Strict: the sum never exceeds `L`; a partitioned node still admits its reservation.
    Reserved(f64),
    /// Keep enforcing the last share. NOT strict: while a quorum has fenced the node and
    /// minted its share again, and the partitioned node still enforces it, the sum can
    /// exceed `L` (by at most the partitioned nodes' shares). For users who prefer
    /// availability.
    LastShare,
}

/// State of a link, from the time since we last heard from the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Heard within two cycles.
    Up,
    /// Heard within one lease.
    Suspect,
    /// Not heard for a lease (or never).
    Down,
}

/// State of the lease on this node's shared capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// More than a quarter of the lease left.
    Valid,
    /// In the last quarter: renew urgently (still enforced).
    Expiring,
    /// Ended: the node enforces its [`Fallback`].
    Expired,
}

/// Whether nodes hold leases (and so can lose them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Leases {
    /// Leases from a quorum of the members, fences, audits (module docs). Every node then
    /// hears every member each cycle (members that are not neighbours get a message with no
    /// keys), so the cost is `n²` small messages per cycle.
    #[default]
    Quorum,
    /// No failure handling: every node holds a lease for ever, talks to its neighbours only
    /// and runs no audit. For simulations of the law on large sparse graphs, and clusters that never fail;
    /// a crash then loses its node's capacity for good, and a partition is not strict.
    Off,
}

/// A node's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// This node.
    pub id: NodeId,
    /// Incarnation, at least 1; MUST grow across restarts (persist a counter, or use a boot
    /// timestamp). Incarnation 1 is a member's first start: it holds its initial share and
    /// needs no quarantine. Any later one holds only its reservation until the audit or the
    /// law gives it more.
    pub incarnation: u64,
    /// The members; they split the limit by the 1/N rule and make the quorums. A node not
    /// in the list joins with nothing.
    pub members: Vec<NodeId>,
    /// Neighbours in the communication graph of the law, with link weights `w_ij`.
    pub links: Vec<(NodeId, f64)>,
    /// Weight given to a neighbour that introduces itself at run time (a joiner).
    pub join_weight: f64,
    /// The gain `γ` (seed 000 eq. 3; `η` in seed 003).
    pub gamma: f64,
    /// The performance measure (of every key of class 0, see [`Config::class_measures`]).
    pub measure: Measure,
    /// Measures of the key classes 1–3: a key's top two bits ([`Config::CLASS_SHIFT`]) name
    /// its class, and class `c > 0` is divided by `class_measures[c − 1]` (`None`: by
    /// [`Config::measure`]). Every node reads the class from the key itself, so even one that
    /// never saw the key's demand divides it by the same measure as its peers (the law
    /// equalises one indicator across the nodes, seed 000 eq. 3). Each class gives with the
    /// gain scaled to its measure's slope, so every class keeps the stability bound the
    /// node's γ meets for `measure` (seed 000 App. eq. 42).
    pub class_measures: [Option<Measure>; 3],
    /// The global limit `L` of every key, in capacity units.
    pub limit: u64,
    /// The update cycle `Δ`.
    pub cycle: Nanos,
    /// The lease on shared capacity.
    pub lease: Nanos,
    /// Bound `ρ` on clock-rate drift (rates within `[1/(1+ρ), 1+ρ]`).
    pub max_drift: f64,
    /// Time constant `τ` of the demand filter.
    pub demand_tau: Nanos,
    /// Time constant of the demand filter for rises (`None`: `demand_tau`, seed 003 §III's
    /// symmetric filter). Shorter serves new demand within a cycle or two and still gives
    /// capacity back slowly (see [`crate::filter::DemandFilter::with_rise`]).
    pub demand_rise_tau: Option<Nanos>,
    /// What to enforce when the lease has expired.
    pub fallback: Fallback,
    /// Whether the node holds leases (see [`Leases`]).
    pub leases: Leases,
    /// Message pacing on neighbour links (seed 004); `None` sends every cycle and never
    /// reactively (a reactive send needs a token to bound bursts, seed 004 §3.4).
    pub pacing: Option<Strategy>,
    /// Relay spare capacity toward unmet demand, over several hops (see the module docs,
    /// "Relay"). On by default; off gives the plain law.
    pub relay: bool,
    /// Largest encoded message (bytes): a send is one message at most, and the keys that
    /// do not fit go next time (default 60,000: a UDP datagram holds 65,507 bytes, less the
    /// transport's frame).
    pub max_message_bytes: usize,
    /// Bytes a neighbour link may send per cycle (a budget saved for at most one cycle):
    /// a burst of changed keys goes out over several cycles instead of overflowing the
    /// receiver's socket buffer (see the module docs, "Many keys"). Default 60,000
    /// (one full datagram a cycle). A head (lease, votes, audit) goes even over budget.
    pub link_budget: usize,
    /// The most keys with state (coordinated keys) this node holds; `None`: no cap. At the
    /// cap a new key stays on the static split, and idle keys retire at once (see
    /// [`Node::refused_keys`], [`Node::evicted_keys`]).
    pub max_keys: Option<usize>,
    /// A key with no demand and an enforced share equal to its static split is *idle*; after
    /// `idle_after` idle it is reclaimed (see the module docs, "Idle keys"). `None` keeps
    /// every key for ever.
    pub idle_after: Option<Nanos>,
    /// How often the audit root starts a round when nothing calls for one sooner (a new
    /// fence, a round that failed or minted). `None` runs none: a dead node's capacity and a
    /// restarted node's share then never come back.
    pub audit_every: Option<Nanos>,
    /// How long a node keeps the dead floor of a departed joiner (not a member, no link
    /// left): it tells its peers for the first half, then forgets it, so that churn of
    /// joiners' ids leaves no growing state behind (docs/PROTOCOL.md, "Membership"). At
    /// least [`Config::least_forget_departed`].
    pub forget_departed: Nanos,
}

impl Config {
    /// A configuration with common defaults: Case I, `γ` at seed 003 eq. 15's bound
    /// `1/(2 max d)`, cycle 100 ms, lease 10 cycles, `ρ = 10⁻³`, `τ` = 5 cycles, strict
    /// fallback `None`, quorum leases, a message every cycle, an audit every 10 s.
    #[must_use]
    pub fn new(id: NodeId, members: Vec<NodeId>, links: Vec<(NodeId, f64)>, limit: u64) -> Self {
        let degree: f64 = links.iter().map(|l| l.1).sum();
        Self {
            id,
            incarnation: 1,
            members,
            links,
            join_weight: 1.0,
            gamma: if degree > 0.0 {
                1.0 / (2.0 * degree)
            } else {
                0.5
            },
            measure: Measure::Throttled,
            class_measures: [None; 3],
            limit,
            cycle: 100_000_000,
            lease: 1_000_000_000,
            max_drift: 1e-3,
            demand_tau: 500_000_000,
            demand_rise_tau: None,
            fallback: Fallback::None,
            leases: Leases::Quorum,
            pacing: None,
            relay: true,
            max_message_bytes: 60_000,
            link_budget: 60_000,
            max_keys: None,
            idle_after: None,
            audit_every: Some(10_000_000_000),
            forget_departed: 600_000_000_000,
        }
    }

    /// The least `forget_departed` for `lease` and `cycle`: `6·lease + 64·cycle`. Half of it
    /// (the time a floor is told) outlasts what it takes a node still linked with the dead
    /// incarnation to hear of it (16 cycles) or to start again itself (two leases without
    /// one).
    #[must_use]
    pub fn least_forget_departed(lease: Nanos, cycle: Nanos) -> Nanos {
        lease
            .saturating_mul(6)
            .saturating_add(cycle.saturating_mul(64))
    }

    /// Where a key's class sits: `key >> CLASS_SHIFT` (its top two bits).
    pub const CLASS_SHIFT: u32 = 62;

    /// `key` moved to measure class `class` (0–3): its top two bits replaced.
    #[must_use]
    pub fn key_in_class(key: Key, class: u8) -> Key {
        (key & !(3 << Self::CLASS_SHIFT)) | (u64::from(class & 3) << Self::CLASS_SHIFT)
    }

    /// The measure `key` is divided by (see [`Config::class_measures`]).
    #[must_use]
    pub fn measure_of(&self, key: Key) -> Measure {
        match (key >> Self::CLASS_SHIFT) as usize {
            0 => self.measure,
            c => self.class_measures[c - 1].unwrap_or(self.measure),
        }
    }

    /// The gain for `key` when the node gives with `gamma` under [`Config::measure`]: scaled
    /// by the slope of the key's measure, so that it meets the same stability bound.
    #[must_use]
    pub fn gain_of(&self, key: Key, gamma: f64) -> f64 {
        gamma * self.measure_of(key).min_slope() / self.measure.min_slope()
    }

    /// The members, sorted, without duplicates.
    #[must_use]
    pub fn sorted_members(&self) -> Vec<NodeId> {
        let mut m = self.members.clone();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// Node `n`'s initial share of every key (1/N rule; the remainder goes to the lowest
    /// ids so the shares add up to `L` exactly).
    #[must_use]
    pub fn initial_share(&self, n: NodeId) -> u64 {
        let m = self.sorted_members();
        let Some(rank) = m.iter().position(|&x| x == n) else {
            return 0;
        };
        let size = m.len() as u64;
        self.limit / size + u64::from((rank as u64) < self.limit % size)
    }

    /// Node `n`'s reservation (non-zero only with [`Fallback::Reserved`]).
    #[must_use]
    pub fn reservation(&self, n: NodeId) -> u64 {
        match self.fallback {
            Fallback::Reserved(f) => (self.initial_share(n) as f64 * f.clamp(0.0, 1.0)) as u64,
            _ => 0,
        }
    }

    /// Checks the configuration (seed 003 Thm 1 at this node, sane times and parameters).
    ///
    /// # Errors
    /// The [`ConfigError`] saying what is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        stability::check_node(self.id, self.gamma, &self.measure, &self.links)?;
        if self.incarnation == 0 {
            return Err(ConfigError::Invalid("incarnation must be at least 1"));
        }
        if self.cycle == 0 || self.lease < 2 * self.cycle {
            return Err(ConfigError::Invalid(
                "cycle must be > 0 and lease at least 2 cycles",
            ));
        }
        if !(self.max_drift.is_finite() && (0.0..0.5).contains(&self.max_drift)) {
            return Err(ConfigError::Invalid("max_drift must be in [0, 0.5)"));
        }
        if self.forget_departed < Self::least_forget_departed(self.lease, self.cycle) {
            return Err(ConfigError::Invalid(
                "forget_departed must be at least 6 leases and 64 cycles",
            ));
        }
        if !(self.join_weight.is_finite() && self.join_weight > 0.0) {
            return Err(ConfigError::Invalid("join_weight must be positive"));
        }
        if let Fallback::Reserved(f) = self.fallback
            && !(f.is_finite() && (0.0..=1.0).contains(&f))
        {
            return Err(ConfigError::Invalid("reserved fraction must be in [0, 1]"));
        }
        if self.links.iter().any(|l| l.0 == self.id) {
            return Err(ConfigError::Invalid("a node cannot link to itself"));
        }
        for m in self.class_measures.iter().flatten() {
            // The relay's gifts assume a measure of unmet demand (see "Relay"); the M/M/1
            // measure wants `x > r` and is the node's own choice only.
            if !m.is_valid() || matches!(m, Measure::MeanResponseTime { .. }) {
                return Err(ConfigError::Invalid(
                    "a class measure must be valid and not the response-time measure",
                ));
            }
        }
        if self.link_budget < 1_000 {
            return Err(ConfigError::Invalid(
                "link_budget must be at least 1,000 bytes a cycle",
            ));
        }
        if self.max_keys == Some(0) {
            return Err(ConfigError::Invalid("max_keys must be at least 1"));
        }
        if let Some(s) = self.pacing {
            s.validated()
                .map_err(|_| ConfigError::Invalid("bad pacing strategy"))?;
        }
        Ok(())
    }
}
