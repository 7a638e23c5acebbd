//! One Sluice node as a sans-IO state machine.
//!
//! # The ledger (conservation that survives the network)
//!
//! For every key a node holds `own = base + Σ_j seen_{j→i} − Σ_j given_{i→j}`:
//! * `given_{i→j}` is a monotone counter of all capacity `i` ever gave `j`; every message
//!   `i → j` carries it whole. The receiver applies `counter − seen` when the counter is
//!   larger and ignores it otherwise, so a message is idempotent, a lost one only delays,
//!   a duplicated or reordered stale one changes nothing.
//! * Capacity only moves as a gift decided by the giver from the law
//!   ([`crate::law::gift`]), clamped so the giver keeps at least its reservation.
//!
//! Hence `Σ own = L − Σ (given − seen)` (the capacity in flight) `≤ L` at every instant,
//! and `= L` once the latest counters got through (seed 003 §IV: "no local limiter gains or
//! loses extra capacity"). Updates are pairwise and asynchronous (seed 003 Appendix Thm 2):
//! no rounds, no clock synchronisation.
//!
//! # Holdings
//!
//! Keys appear at run time, so a node's initial share of a key it has never seen is implicit:
//! the 1/N rule (seed 003 Fig. 1 `InitializeCapacities`) over the initial members, the same
//! for every key. A node's *holdings* say which initial shares it holds (its own, those it
//! inherited); their sum is the `base` of every key it has no state for. Only keys with
//! activity have state and cost message bytes.
//!
//! # Leases, heirs and fallback (seed 003 §IV "best friend")
//!
//! Each node names an heir (its best friend). Every message to the heir carries the whole
//! ledger (holdings, bases, neighbours) and the sender's clock `sent_at`; the heir echoes
//! the latest `sent_at` it received. The holder's lease on its shared capacity ends at
//! `echo + lease` **on the holder's own clock**; the heir declares the holder dead only
//! `lease·(1+ρ)²` after it last *received* from it, on the heir's clock. With clock rates
//! within `[1/(1+ρ), 1+ρ]` of real time, the holder stops enforcing its shared capacity no
//! later than real time `send + lease·(1+ρ)`, and the heir starts no earlier than
//! `receive + lease·(1+ρ)`: the holder always stops first, no clock sync needed.
//!
//! The heir then *settles* the dead incarnation: it asks the dead node's neighbours for
//! their final counters with it (`F = given to it`, `S = received from it`) and they freeze
//! the link (later messages from that incarnation are ignored). The estate is
//! `base − reservation + Σ_j (F_j − S_j)`: exactly what the dead node held, plus what was in
//! flight to and from it. Gifts the dead node made after its last report are counted once,
//! by the survivors' `S` (pitfall (a)). A node that learns it was declared dead (a partition,
//! not a crash) or that restarts comes back as a new incarnation holding only its reservation
//! (pitfall (c)).
//!
//! Settlements across a multi-node cut (seed 003 §IV: "no local limiter gains or loses
//! extra capacity"). These rules keep chained settlements — a heir settling a ward while its
//! own heir settles it — from counting capacity twice or waiting for ever:
//! * a settlement acts on others (settle requests, succession notices) only once our heir
//!   holds a ledger recording it ([`Node`]'s `announced`); otherwise a heir that inherits
//!   from us with an older ledger would send the node we declared dead a succession notice,
//!   reviving it with a fresh lease and the power to settle wards we had moved to us;
//! * a verdict from our heir is obeyed even when that heir's incarnation is dead to us (its
//!   own heir asked us for our counters with it): it settled us before it died;
//! * a reincarnated node answers the settlement requests it held: its old estate is final,
//!   and each reply names the replier incarnation that froze the link
//!   ([`crate::wire::SettleReply::replier_incarnation`]), so a dead node that folded that
//!   link is not counted again. Each answer says whether the replier's side of the link is
//!   in its estate ([`crate::wire::SettleReply::in_estate`]: the verdict names the ledger
//!   version the heir settled with, [`crate::wire::Message::verdict_version`]); counters
//!   that are not are never counted for the dead node (only ignored where it folded the
//!   link itself);
//! * only the incarnation a dead node's ledger names for a link answers for it
//!   ([`crate::wire::Ledger::neighbours`], [`crate::wire::SettleReply::prior`]): a restarted
//!   neighbour cannot vouch for its previous incarnation's counters, so that estate waits
//!   (capacity lost, never counted twice); and the dead node is told it is dead as soon as
//!   its heir starts settling it, so it does not hold other heirs' answers meanwhile.
//! * a link between two dead nodes that each froze after the ledger its heir settles it
//!   with counts once: a reincarnated node offers its own side of the link to its heir as a
//!   *late fold* ([`crate::wire::LateFold`]); taken (from the lower id, or from the higher
//!   one when the lower one crashed) only while that heir waits for the peer and the peer
//!   cannot vouch for its side, it makes the peer's answer ignored there and the offering
//!   node's answer `in_estate` for the peer's heir (see `Node::offer_late_folds`). Links
//!   still live when a node reincarnates are kept for this;
//! * a settlement its settler's heir never acknowledged dies with the settler: nobody heard
//!   of it, so the ward is heard again (see `Node::drop_settlements`) — unless the ward is
//!   known dead (it restarted): then its ledger is handed to the heir that settled the
//!   settler, which settles it in its place ([`crate::wire::Handover`]);
//! * a ledger lists only its own incarnation's folded links: an earlier incarnation's went
//!   into that incarnation's estate;
//! * an estate a heir inherited after the ledger it is settled with goes to its settler
//!   ([`crate::wire::HandoverKind::Inherited`]), and so do the settlements its ledger lists
//!   under way ([`crate::wire::Ledger::settling`]): the settler counts them after the heir's
//!   own estate, less what that lacked (rules 10 and 11).
//!
//! # Idle keys (reclamation)
//!
//! With [`Config::idle_after`] set, a key whose demand estimate stays below one unit for
//! that long is *quiet*, and its state is reclaimed without breaking conservation. Its
//! *static split* here is the default base (our initial shares, never below the
//! reservation): what we hold for a key we have no state for.
//! 1. *Level.* Between two quiet ends the law stops. A quiet node below its split sends its
//!    quiet neighbours a *level request* ([`wire::LEVEL_REQUEST`] in the relay field) for
//!    what it lacks, and passes on another neighbour's (split horizon, at most `n − 1`
//!    hops), less what it holds above its split; a quiet node above its split gives that
//!    to open level requests, the nearest deficit first. Gifts on the gift counters, so
//!    conservation is untouched.
//! 2. *Retire the counters, folding their net.* A quiet link's acknowledged counters are
//!    proposed for retirement (`Message::retire`) by its net receiver, once back at its
//!    split (a balanced link at any time). The peer matches only if its counters are the
//!    mirror image (nothing in flight), folds the net it gave out of its base, zeroes them
//!    and acknowledges (`retired`) once its heir holds the lowered base; the proposer then
//!    folds the net into its base, zeroes and confirms (`confirm`) once its own heir holds
//!    that. The giver's fold is durable first, so no estate counts the net twice; each
//!    ledger lists what is pending ([`wire::PendingFold`],
//!    [`wire::Ledger::received_folds`], [`wire::SettleReply::pending`]) so that a crash in
//!    between loses nothing either. No gift crosses the link on that key meanwhile; counters
//!    of the retired generation may still be in flight, so each end ignores the other's
//!    entries until the confirmation (a tomb), and every message sent (on the sender's
//!    clock, strictly increasing per link) before the acknowledgement or confirmation (a
//!    per-link floor, one number, not one per key).
//! 3. *Drop.* A quiet key whose base is the default, whose links are all zero and settled,
//!    whose neighbours are all quiet and through which no level request passes, holds
//!    exactly what no state says: it is dropped and reported in [`Ready::reclaimed`]. A key
//!    that comes back starts from the static split. A neighbour's entry for a quiet key
//!    with zero counters and no request creates no state. A message holding all its
//!    sender's keys ([`wire::Message::all_keys`]) marks the keys it lacks as idle there,
//!    asking nothing: a neighbour that dropped a key sends nothing more about it.
//!
//! A quiet key with nothing on a link sends no entry to a neighbour where it is quiet too
//! (its absence from a message holding all keys says the same).
//!
//! Keys busy at a crash end off the static split at the heir and the dead node's
//! neighbours; levelling and folds bring them back, so they are reclaimed too.
//!
//! # Re-minting after a whole-cluster restart
//!
//! A restarted member holds only its reservation; its initial share comes back as an
//! inheritance. When every node restarts at once nobody is left to inherit from. A node that
//! holds its reservation and nothing else, never gave nor received, and keeps nothing that
//! could bring capacity back (no settlement, no ward holding more than its reservation, no
//! handover or late fold) is *pristine*, and says so with a *level* ([`wire::Census`]): 1 +
//! the least level its neighbours claim, so level `k` says every node within `k − 1` hops is
//! pristine. A member takes its own initial share back, once per incarnation, when its level
//! reaches the number of members or a neighbour claims it re-minted (docs/PROTOCOL.md,
//! "Re-minting after a whole-cluster restart"). Messages of an incarnation older than the
//! one a link is with are dropped, so no late message of a dead one can bring its capacity
//! back afterwards.
//!
//! # Big batches
//!
//! One send to a neighbour carries every active key; beyond
//! [`Config::max_message_bytes`] it is split into several messages (see `split`).
//!
//! # Relay (spare capacity toward unmet demand, over several hops)
//!
//! The law is a diffusion: with the stable gain (`γ·d ≤ ½`, seed 003 Thm 1) a node moves at
//! most half of an indicator gap per cycle, and only to its neighbours, so capacity idle far
//! from a hotspot needs of the order of `1/(γλ₂)` cycles to arrive (103 cycles on a ring of
//! 10). The relay moves *spare* capacity (`own − max(demand, reservation)`) to *unmet*
//! demand (`demand − own`) directly, along the graph:
//! * every message to a neighbour carries, per key, a *relay request*: the largest of the
//!   node's own unmet demand and the open requests it received from its other neighbours
//!   (split horizon: never back where it came from), less its own spare, split over the
//!   neighbours asked in proportion to the link weights, with the number of hops it has
//!   travelled. A request that would exceed `n − 1` hops went round a cycle and is dropped,
//!   which bounds how long a stale request can circulate;
//! * a node with spare capacity gives the open requests, largest first, from its spare only.
//!   What it gave since the request was made (it knows, from the request's `seen`) counts
//!   as answered, so an in-flight gift is not given twice;
//! * the gifts travel on the same monotone counters as the law's, so conservation is
//!   untouched: the relay only decides *how much* to give, never *how* it is counted;
//! * with a token account (seed 004), relay gifts and changed requests are news and go out
//!   at once (one token per message), so a hotspot's request floods the graph within the
//!   cycle and capacity crosses several hops per cycle. The law's own gifts stay once per
//!   cycle, as its stability bound assumes.
//!
//! Why it does not fight the law: it acts only while spare capacity and unmet demand
//! coexist — never at the law's equilibria (Cases I–III: all throttled, or none), where it is
//! idle — and it never takes a node below its own demand estimate, so it cannot create the
//! unmet demand it answers (no oscillation of its own). For Case I it moves capacity in the
//! direction of the law (`p = r − x` is positive at a needy node and negative at a spare
//! one). It is off for the M/M/1 response-time measure, which wants `x > r`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod audit;
mod census;
mod handover;
mod heir;
mod idle;
mod late_folds;
mod membership;
mod reincarnation;
mod relay;
mod send;
mod settlement;
mod small_map;

use small_map::{SmallMap, StackVec};

use crate::filter::DemandFilter;
use crate::law::{self, Measure, Peer};
use crate::pacing::{Strategy, TokenAccount};
use crate::stability::{self, ConfigError};
use crate::wire::{
    self, Census, Handover, HandoverAck, Holding, Key, KeyEntry, LateAck, LateFold, Ledger,
    Lifecycle, Message, NodeId, Part, SettleReply,
};

/// Nanoseconds on this node's own clock.
pub type Nanos = u64;

/// The usable neighbours with their link weights, sorted by node id (see `Node::usable`).
/// Shared: it is cached and handed out on every message, and a copy each time was an
/// allocation per message.
type Usable = Arc<[(NodeId, f64)]>;

/// Per key `(key, a, b)`: a link's counters (given, seen) or a fold's (seen, net).
type KeyTriples = Vec<(Key, u64, u64)>;

/// The weight of `p` in `usable`, if usable.
fn usable_weight(usable: &[(NodeId, f64)], p: NodeId) -> Option<f64> {
    usable
        .binary_search_by_key(&p, |&(q, _)| q)
        .ok()
        .map(|i| usable[i].1)
}

/// A key's relay request before it is split over the neighbours (module docs, "Relay"):
/// `None` when there is nothing to ask. The same for every neighbour asked, so it is worked
/// out once per key rather than once per neighbour.
#[derive(Debug, Clone, Copy)]
struct RelayPlan {
    /// What is still unmet after our spare.
    residual: f64,
    hops: u8,
    /// The neighbour whose request we pass on (split horizon: never asked back).
    from: Option<NodeId>,
    /// Total weight of the usable neighbours asked (all but `from`).
    total: f64,
}

/// What a node enforces when its lease on shared capacity has expired (it cannot reach its
/// heir). The guarantee of each mode:
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fallback {
    /// Enforce nothing (0) until the heir answers. Strict: the sum of enforced limits never
    /// exceeds `L`. Availability: a partitioned node admits nothing.
    None,
    /// Keep a reservation of `fraction` of the node's initial share, never given away and
    /// never inherited (seed 002 §4.4(5), quota pre-allocation with fallback to standalone).
    /// Strict: the sum never exceeds `L`; a partitioned node still admits its reservation.
    Reserved(f64),
    /// Keep enforcing the last share. NOT strict: while the heir has inherited the share
    /// and the partitioned node still enforces it, the sum can exceed `L` (by at most the
    /// partitioned nodes' shares). For users who prefer availability.
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

/// A node's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// This node.
    pub id: NodeId,
    /// Incarnation, at least 1. MUST increase across restarts (persist a counter, or use a
    /// boot timestamp); incarnation 1 of an initial member holds its full initial share,
    /// later ones only their reservation.
    pub incarnation: u64,
    /// The incarnation this one follows, when known exactly (a restart that persisted it):
    /// lets a heir take this node's settlement answers for a dead node whose last ledger had
    /// no live link with it (see [`crate::wire::SettleReply::prior`]). `None`: unknown (the
    /// answers then wait for the link the ledger names). Incarnation 1 follows none.
    pub previous_incarnation: Option<u64>,
    /// The initial members; they split the limit by the 1/N rule. A node not in the list
    /// joins with nothing.
    pub members: Vec<NodeId>,
    /// Neighbours in the communication graph, with link weights `w_ij`.
    pub links: Vec<(NodeId, f64)>,
    /// Weight given to a neighbour that introduces itself at run time (a joiner).
    pub join_weight: f64,
    /// The heir (best friend); `None` only for a single node.
    pub heir: Option<NodeId>,
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
    /// What to enforce when the lease has expired.
    pub fallback: Fallback,
    /// Message pacing on non-heir links (seed 004); `None` sends every cycle and never
    /// reactively (a reactive send needs a token to bound bursts, seed 004 §3.4).
    pub pacing: Option<Strategy>,
    /// Relay spare capacity toward unmet demand, over several hops (see the module docs,
    /// "Relay"). On by default; off gives the plain law.
    pub relay: bool,
    /// Largest encoded message (bytes). One send to a neighbour carries every active key;
    /// beyond this it is split into several messages (default 60,000: a UDP datagram holds
    /// 65,507 bytes, less the transport's frame).
    pub max_message_bytes: usize,
    /// A key with no demand and an enforced share equal to its static split is *idle*; after
    /// `idle_after` idle it is reclaimed (see the module docs, "Idle keys"). `None` keeps
    /// every key for ever.
    pub idle_after: Option<Nanos>,
    /// Our final counters with a dead peer incarnation are kept for whoever settles it; a
    /// node that outlives many restarts of its neighbours would keep one record per restart
    /// (with every key) for ever. With `forget_after` set, a record nobody asked for in that
    /// long is dropped, and a later request for it is never answered: that settlement then
    /// waits, so the capacity is lost rather than counted twice (see docs/PROTOCOL.md,
    /// "Forgetting old links"). `None` keeps every record.
    pub forget_after: Option<Nanos>,
    /// How often the lowest member starts a capacity audit, which mints again what no
    /// settlement will bring back (see docs/PROTOCOL.md, "The capacity audit"); a round
    /// that has not finished after half of this is abandoned. `None` runs none (the census
    /// of a whole-cluster restart then re-mints, see "Re-minting after a whole-cluster
    /// restart"; with audits on, the audit does that too, and the census is off).
    pub audit_every: Option<Nanos>,
}

impl Config {
    /// A configuration with common defaults: Case I, `γ` at seed 003 eq. 15's bound
    /// `1/(2 max d)`, cycle 100 ms, lease 10 cycles, `ρ = 10⁻³`, `τ` = 5 cycles, strict
    /// fallback `None`, a message every cycle.
    #[must_use]
    pub fn new(id: NodeId, members: Vec<NodeId>, links: Vec<(NodeId, f64)>, limit: u64) -> Self {
        let degree: f64 = links.iter().map(|l| l.1).sum();
        let heir = links.first().map(|l| l.0);
        Self {
            id,
            incarnation: 1,
            previous_incarnation: None,
            members,
            links,
            join_weight: 1.0,
            heir,
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
            fallback: Fallback::None,
            pacing: None,
            relay: true,
            max_message_bytes: 60_000,
            idle_after: None,
            forget_after: None,
            audit_every: Some(10_000_000_000),
        }
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

    /// Node `n`'s initial share of every key (1/N rule; the remainder goes to the lowest
    /// ids so the shares add up to `L` exactly).
    #[must_use]
    pub fn initial_share(&self, n: NodeId) -> u64 {
        let mut m: Vec<NodeId> = self.members.clone();
        m.sort_unstable();
        m.dedup();
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

    fn part(&self, h: Holding) -> u64 {
        let init = self.initial_share(h.node);
        let res = self.reservation(h.node);
        match h.part {
            Part::Full => init,
            Part::ReserveOnly => res,
            Part::ShareOnly => init - res,
            Part::Minted(x) => x,
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
        if !(self.join_weight.is_finite() && self.join_weight > 0.0) {
            return Err(ConfigError::Invalid("join_weight must be positive"));
        }
        if let Fallback::Reserved(f) = self.fallback
            && !(f.is_finite() && (0.0..=1.0).contains(&f))
        {
            return Err(ConfigError::Invalid("reserved fraction must be in [0, 1]"));
        }
        if self.links.iter().any(|l| l.0 == self.id) || self.heir == Some(self.id) {
            return Err(ConfigError::Invalid("a node cannot link to itself"));
        }
        if let Some(h) = self.heir
            && !self.links.iter().any(|l| l.0 == h)
        {
            return Err(ConfigError::Invalid("the heir must be a neighbour"));
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
        if let Some(s) = self.pacing {
            s.validated()
                .map_err(|_| ConfigError::Invalid("bad pacing strategy"))?;
        }
        Ok(())
    }
}

/// A message to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// Destination.
    pub to: NodeId,
    /// The message (encode with [`crate::wire::encode`]).
    pub message: Message,
}

/// What the node wants done since the last call to [`Node::ready`] (like raft-rs `Ready`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ready {
    /// Messages to send.
    pub messages: Vec<Outgoing>,
    /// Keys whose enforced limit changed, with the new limit (capacity units).
    pub limits: Vec<(Key, u64)>,
    /// Keys reclaimed since the last call (see the module docs, "Idle keys"): they hold no
    /// state any more and are enforced at [`Node::default_enforced`], the static split.
    pub reclaimed: Vec<Key>,
}

#[derive(Debug, Clone)]
struct Link {
    weight: f64,
    /// Peer incarnation (0: unknown).
    inc: u64,
    last_recv: Option<Nanos>,
    /// Latest `sent_at` received (peer clock), echoed back.
    echo: Nanos,
    /// `sent_at` of the message whose indicators we hold (stale ones are ignored).
    indicator_at: Nanos,
    lifecycle: Lifecycle,
    pacing: Option<TokenAccount>,
    /// Answers waiting to go to the peer; `None` while there are none (nearly always).
    mail: Option<Box<Mail>>,
    /// A dead verdict to tell this node.
    verdict: u64,
    /// A configured neighbour (vs a node we only settle with).
    neighbour: bool,
    /// The peer's latest message named us its heir (we answer every cycle).
    names_me_heir: bool,
    /// Messages from the peer sent (its clock) before this carry no counters or retirement
    /// proposals we apply: they may hold counters of a retired generation (see "Idle keys").
    floor: Nanos,
    /// `sent_at` of our latest message to the peer: `sent_at` strictly increases per link,
    /// so "sent before" is well defined for the peer's floor.
    last_sent: Nanos,
}

/// What a link's next message answers besides counters. Rare (settlements, retirements,
/// late folds, handovers), so a link keeps it boxed: a link stays small, and the first touch
/// of a cold link by a message reads fewer cache lines (the 1,000-node simulation is bound by
/// those misses; see docs/BENCHMARKS.md).
#[derive(Debug, Clone, Default)]
struct Mail {
    /// Settlement replies waiting to go to this node (it is an heir settling someone).
    replies: Vec<SettleReply>,
    /// Keys whose retirement we confirm in our next message (see "Idle keys").
    confirm: BTreeSet<Key>,
    /// Answers to the peer's late folds, for our next message to it.
    late_acks: Vec<LateAck>,
    /// Answers to the peer's ward handovers, for our next message to it.
    handover_acks: Vec<HandoverAck>,
}

impl Link {
    /// The link's mail, created on first use.
    fn mail(&mut self) -> &mut Mail {
        self.mail.get_or_insert_with(Box::default)
    }

    /// The link is with no incarnation any more (it died, or we did): what we knew of the
    /// last one goes (its clock, its floor, retirements it was to confirm).
    fn unlink(&mut self) {
        self.inc = 0;
        self.echo = 0;
        self.indicator_at = 0;
        self.floor = 0;
        if let Some(m) = self.mail.as_mut() {
            m.confirm.clear();
        }
    }

    /// Answers are waiting to go to the peer (they oblige a message).
    fn answers_waiting(&self) -> bool {
        self.mail.as_ref().is_some_and(|m| {
            !m.replies.is_empty() || !m.late_acks.is_empty() || !m.handover_acks.is_empty()
        })
    }
}

/// One key on one link. Every message reads all of a key's link-keys (the relay plan, the
/// gifts), so this stays small: 88 bytes (was 120), with the peer's numbers kept as the `f32`
/// the wire carries them in (widened on use, so nothing is rounded).
#[derive(Debug, Clone, Copy, Default)]
struct LinkKey {
    given: u64,
    seen: u64,
    acked: u64,
    /// The peer's latest indicator and whether it is saturated.
    peer: Option<(f32, bool)>,
    /// The peer's latest relay request to us: `(amount, hops, what it had received from us
    /// when it asked)`; what we gave since is already on its way.
    relay: Option<(f32, u8, u64)>,
    /// The relay request we last sent the peer (news is a material change of it).
    relay_sent: f32,
    /// `given` in the last message we sent the peer: a larger `given` is a gift that has
    /// not left yet.
    given_sent: u64,
    /// The peer's latest entry said the key is idle there.
    peer_idle: bool,
    /// Where retiring this link's counters stands (see "Idle keys").
    retirement: Retirement,
}

/// Retiring a link's balanced counters for one key (see "Idle keys"): at most one end
/// proposes at a time from a given link-key's point of view, so the two waiting states
/// exclude each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Retirement {
    /// Nothing under way: gifts may cross.
    #[default]
    None,
    /// We proposed retiring the counters (they are balanced and frozen) in messages sent at
    /// or after this time (our clock).
    Proposed(Nanos),
    /// We matched the peer's proposal sent at this time (its clock) and reset our counters;
    /// its entries for the key are ignored until it confirms.
    Tomb(Nanos),
    /// The peer confirmed a retirement whose net we had folded out of our base; we give
    /// nothing on this link-key until our heir holds this ledger version, the first without
    /// the pending fold (see [`wire::PendingFold`]).
    Cleared(u64),
}

// The 1,000-node simulation is bound by cache misses on this state (docs/BENCHMARKS.md):
// growing either struct is a choice, not an accident.
const _: () = assert!(size_of::<LinkKey>() <= 88 && size_of::<Link>() <= 184);

impl LinkKey {
    /// No gift may cross the link on this key while a retirement is under way.
    fn frozen(&self) -> bool {
        self.retirement != Retirement::None
    }

    /// When we proposed retiring, if we did and the round is open.
    fn retiring(&self) -> Option<Nanos> {
        match self.retirement {
            Retirement::Proposed(t) => Some(t),
            _ => None,
        }
    }

    /// The peer proposal we matched, if we are waiting for its confirmation.
    fn tomb(&self) -> Option<Nanos> {
        match self.retirement {
            Retirement::Tomb(t) => Some(t),
            _ => None,
        }
    }

    /// What is left of the peer's relay request: the request less what we gave it since it
    /// asked (in flight when it asked, or given after).
    fn relay_open(&self) -> f64 {
        self.open(false)
    }

    /// What is left of the peer's level request ("Idle keys"), counted as [`Self::relay_open`].
    fn level_open(&self) -> f64 {
        self.open(true)
    }

    fn open(&self, level: bool) -> f64 {
        self.relay
            .filter(|r| (r.1 & wire::LEVEL_REQUEST != 0) == level)
            .map_or(0.0, |(r, _, seen)| {
                (f64::from(r) - self.given.saturating_sub(seen) as f64).max(0.0)
            })
    }
}

/// Splits one send's key entries over as many messages as needed so that each encodes to at
/// most `cap` bytes (a UDP datagram holds 65,507). The first message carries everything
/// else (ledger, settlement traffic, verdict, succession); the others repeat only the
/// header (incarnations, clocks, lifecycle, acknowledgements), which is idempotent.
///
/// Why a split is safe: every entry carries its key's whole monotone counters and nothing
/// relates two keys (each key is its own ledger, conserved on its own), so a receiver that
/// gets some of the parts applies exactly the keys it got, a lost part is a lost message for
/// its keys only (it only delays), and parts may arrive in any order or twice (seed 003 §IV).
/// Retirement lists ("Idle keys") travel in the first part: they refer to counters, not to
/// the entries beside them. What is not split: a ledger or settlement replies larger than `cap` (their bases and
/// entries grow only with keys touched by an inheritance) still go out as one message.
///
/// The parts go straight to `out` (the outbox), addressed to `to`: one send is one message
/// nearly always, and a vector per send for it was a measurable share of a large run.
/// Whether a head of `head_len` bytes with `keys` goes as one message under `split` (a
/// message holding all the sender's keys).
fn fits_one(head_len: usize, keys: &[KeyEntry], cap: usize) -> bool {
    let entries: usize = keys.iter().map(wire::key_entry_len).sum();
    head_len + entries + COUNT_SLACK <= cap || keys.len() <= 1
}

/// Room for a message's key count varint growing from 1 byte to at most 5.
const COUNT_SLACK: usize = 4;

/// Leases a settlement waits for the lower end of a crossed link to hand over its side as
/// a late fold before it takes the higher end's (see `Node::take_late_fold`): a reincarnated
/// lower end offers as soon as it hears its verdict, well within this.
const LOWER_END_PATIENCE: u64 = 8;

fn split(mut head: Message, keys: Vec<KeyEntry>, cap: usize, to: NodeId, out: &mut Vec<Outgoing>) {
    let head_len = wire::encoded_len(&head);
    if fits_one(head_len, &keys, cap) {
        out.push(Outgoing {
            to,
            message: Message { keys, ..head },
        });
        return;
    }
    // No part holds every key: a key missing from one says nothing about the sender.
    head.all_keys = false;
    let rest = Message {
        dead_verdict: 0,
        ledger: None,
        keys: Vec::new(),
        settle_requests: Vec::new(),
        settle_replies: Vec::new(),
        succession: None,
        retire: Vec::new(),
        retired: Vec::new(),
        confirm: Vec::new(),
        late_folds: Vec::new(),
        late_acks: Vec::new(),
        handovers: Vec::new(),
        handover_acks: Vec::new(),
        audit: None,
        rest: true,
        ..head.clone()
    };
    let rest_len = wire::encoded_len(&rest);
    let mut cur = head;
    let mut budget = cap.saturating_sub(head_len + COUNT_SLACK);
    for e in keys {
        let len = wire::key_entry_len(&e);
        if !cur.keys.is_empty() && len > budget {
            out.push(Outgoing {
                to,
                message: std::mem::replace(&mut cur, rest.clone()),
            });
            budget = cap.saturating_sub(rest_len + COUNT_SLACK);
        }
        budget = budget.saturating_sub(len);
        cur.keys.push(e);
    }
    out.push(Outgoing { to, message: cur });
}

/// A change of a relay request worth a reactive message: it appears, vanishes, or moves
/// by more than a quarter.
fn relay_changed(old: f32, new: f64) -> bool {
    let old = f64::from(old);
    if (old >= 1.0) != (new >= 1.0) {
        return true;
    }
    new >= 1.0 && (new - old).abs() > 0.25 * old.max(new)
}

#[derive(Debug, Clone)]
struct KeyState {
    /// Signed: a link's frozen net (received − given) can be negative on its own.
    base: i64,
    demand: DemandFilter,
    links: SmallMap<NodeId, LinkKey>,
    /// `Σ seen` and `Σ given` over `links` (as `u64` sums, wrapping exactly as summing the
    /// links would), kept up to date wherever a link's counters change so that
    /// [`KeyState::own`] is O(1): it is read several times per message and tick, and summing
    /// every link each time dominated runs with many neighbours.
    seen_sum: u64,
    given_sum: u64,
    enforced: Option<u64>,
    /// Since when the demand estimate has been below one unit.
    idle_since: Option<Nanos>,
    /// Idle for at least `Config::idle_after`.
    quiet: bool,
}

impl KeyState {
    fn own(&self) -> u64 {
        debug_assert_eq!(
            (self.seen_sum, self.given_sum),
            self.full_sums(),
            "KeyState sums out of step"
        );
        let own = i128::from(self.base) + i128::from(self.seen_sum) - i128::from(self.given_sum);
        u64::try_from(own.max(0)).unwrap_or(u64::MAX)
    }

    /// `(Σ seen, Σ given)` recomputed from the links (what the kept sums must equal).
    fn full_sums(&self) -> (u64, u64) {
        let seen = self
            .links
            .values()
            .fold(0u64, |a, l| a.wrapping_add(l.seen));
        let given = self
            .links
            .values()
            .fold(0u64, |a, l| a.wrapping_add(l.given));
        (seen, given)
    }

    /// Records that a link's counters, `seen` and `given`, were zeroed (a retirement, "Idle keys").
    fn zeroed(&mut self, seen: u64, given: u64) {
        self.seen_sum = self.seen_sum.wrapping_sub(seen);
        self.given_sum = self.given_sum.wrapping_sub(given);
    }

    /// Gives out of `spare` to `asks` in their order, each at most its whole units, until
    /// `spare` runs out (the law's, the relay's and the level gifts); `gave` hears each
    /// neighbour given to.
    fn give_in_order(
        &mut self,
        asks: impl IntoIterator<Item = (NodeId, f64)>,
        mut spare: u64,
        mut gave: impl FnMut(NodeId),
    ) {
        for (p, open) in asks {
            let amount = (open.floor() as u64).min(spare);
            if amount == 0 {
                break;
            }
            spare -= amount;
            if self.give_to(p, amount) {
                gave(p);
            }
        }
    }

    /// Records a gift of `amount` to `p` (the link's `given` grows).
    fn give_to(&mut self, p: NodeId, amount: u64) -> bool {
        match self.links.get_mut(&p) {
            Some(lk) => {
                lk.given += amount;
                self.given_sum = self.given_sum.wrapping_add(amount);
                true
            }
            None => false,
        }
    }
}

/// A fold we made as a retirement's net receiver ("Idle keys"), listed in our ledger until the
/// peer no longer holds it pending.
#[derive(Debug, Clone, Copy)]
struct Received {
    /// The peer's incarnation.
    inc: u64,
    /// The peer's clock on the acknowledgement we folded on.
    after: Nanos,
    /// The net we folded into our base.
    net: u64,
    /// Our ledger version with the fold.
    version: u64,
}

/// Final counters with a dead incarnation: per key `(F, S)`, and the ledger version that
/// records their effect on our bases.
#[derive(Debug, Clone, Default)]
struct Frozen {
    counters: BTreeMap<Key, (u64, u64)>,
    /// Folds we made as the net receiver on this link, `(key, seen, net, ledger version)`:
    /// where our dead incarnation's estate has a ledger from before one, our side is the
    /// counters from before it (see `Node::old_side`).
    received: Vec<(Key, u64, u64, u64)>,
    /// Our pending folds with the peer incarnation when we froze it (or reincarnated),
    /// `(key, seen, net, ledger version of the fold)` (see [`wire::PendingFold`]): the
    /// peer's heir adds them to its estate where it had not folded, and where our own side
    /// goes into our dead incarnation's estate (a late fold) with a ledger from before the
    /// fold, that side is the counters before it.
    pending: Vec<(Key, u64, u64, u64)>,
    version: u64,
    /// Our incarnation that froze the link (its counters are that incarnation's).
    by_inc: u64,
    /// When the record was last made or read for a settlement (our clock, as of the last
    /// tick): see [`Config::forget_after`].
    used: Nanos,
}

#[derive(Debug, Clone)]
struct Ward {
    inc: u64,
    last_recv: Nanos,
    ledger: Ledger,
    leaving: bool,
}

#[derive(Debug, Clone)]
struct Settlement {
    ward: Ward,
    /// Our ledger version that records the start (the ward gone from our wards). Nobody
    /// hears of the settlement — no request, no succession notice — before our heir holds
    /// it (see [`Node::announced`]).
    version: u64,
    waiting: BTreeSet<NodeId>,
    /// Neighbours (of the ward) that answered for their link but could not vouch for it: a
    /// reincarnated replier whose side is not in its own estate (`in_estate` false; us
    /// included). Only for these may the ward's own side come as a late fold.
    unvouched: BTreeMap<NodeId, Unvouched>,
    /// Per key `Σ (F − S)`.
    terms: BTreeMap<Key, i128>,
    /// The ward's dead floor before the settlement (restored if it dies unannounced with us).
    floor_before: u64,
    /// When it started (our clock): see `Node::take_late_fold`.
    started: Nanos,
    /// Late folds received for a `Relinked` peer `(peer, peer incarnation)`, held until the
    /// other one arrives.
    relinked: BTreeMap<(NodeId, u64), Side>,
    /// For an estate handed over as inherited after a ledger (rule 10): the incarnation
    /// whose ledger lacked it. It finishes only after that incarnation's settlement, and
    /// pays its debt first.
    origin: Option<(NodeId, u64)>,
    /// What late folds added to `terms`, per key: the ward's own sides of links its ledger
    /// now lists as folded. A ledger handed on (rules 9 and 10) holds them in its bases,
    /// as if the ward had folded those links itself (see `Node::handed_ledger`).
    late: BTreeMap<Key, i128>,
}

/// An estate we inherited, kept until our heir holds it (see `Node::inherited`).
#[derive(Debug, Clone)]
struct Inheritance {
    /// The ward, with its ledger as whoever settles it next must read it.
    ward: Ward,
    /// Our ledger version that recorded the settlement's start.
    start: u64,
    /// Our ledger version that first held the estate.
    finish: u64,
    /// The ward's dead floor and our `settled` entry for it before the settlement: restored
    /// if the settlement dies unannounced with us (rule 6).
    floor_before: u64,
    settled_before: Option<u64>,
}

/// A ward handover we offer (see [`wire::Handover`]).
#[derive(Debug, Clone)]
struct Handed {
    ledger: Ledger,
    kind: wire::HandoverKind,
    leaving: bool,
}

/// One side of a link, per key `(key, given, seen)` (as in a [`LateFold`]).
type Side = KeyTriples;

/// Why a neighbour's answer for its link with a ward could not be counted (see
/// `Node::take_late_fold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unvouched {
    /// The incarnation the ward's ledger names answered, reincarnated, and its side of the
    /// link is not in its own estate: it may still hand it over to its heir as a late fold.
    NotInEstate,
    /// A later incarnation answered, and its own link with the ward carried nothing: the
    /// incarnation the ledger names is gone (it crashed) and will never answer or offer.
    Superseded,
    /// The incarnation that directly follows the one the ledger names answered, and its own
    /// link with the ward (with this incarnation) carried capacity: the named one is gone and
    /// the later link's flows are in no ledger of the ward. The ward's side of the named link
    /// must come as a late fold; the later link counts from the answer if it vouched for it
    /// (`mirrored`: its mirror is in `relinked`, and the ward's own side of it is refused),
    /// else from the ward's own side too (see `Node::take_relinked`).
    Relinked { later: u64, mirrored: bool },
}

/// Where a late fold we offered stands (see `Node::offer_late_folds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LateFoldState {
    /// Sent with every message to the heir that settled our dead incarnation until it
    /// answers.
    Offered,
    /// The estate holds our side of the link: our answers for it say `in_estate`.
    Accepted,
    /// The estate is final without it (or counted the peer's side): our side stays out.
    Refused,
}

/// One node. See the module documentation for the protocol.
#[derive(Debug, Clone)]
pub struct Node {
    cfg: Config,
    inc: u64,
    lifecycle: Lifecycle,
    holdings: Vec<Holding>,
    default_base: u64,
    reservation: u64,
    links: SmallMap<NodeId, Link>,
    keys: BTreeMap<Key, KeyState>,
    lease_until: Nanos,
    /// The incarnation of our heir that granted the lease (0: none yet).
    lease_inc: u64,
    /// The incarnation of our heir we last sent our ledger to (0: none): one that may hold a
    /// ward record of us even if it never renewed our lease (see `Node::lease_heir_gone`).
    ledger_inc: u64,
    /// When we learned, with the lease out, that the incarnation that granted it died (see
    /// `Node::orphaned`).
    orphaned_at: Option<Nanos>,
    wards: BTreeMap<NodeId, Ward>,
    settling: BTreeMap<(NodeId, u64), Settlement>,
    /// Highest incarnation of each node this node settled as heir.
    settled: BTreeMap<NodeId, u64>,
    /// The ledger version each incarnation we settled was settled with (told with the
    /// verdict: see [`wire::Message::verdict_version`]).
    settled_with: BTreeMap<(NodeId, u64), u64>,
    /// Our own dead incarnations and the ledger version their heir settled them with: a link
    /// such an incarnation froze is in its estate only if the freeze is in that version.
    estate_versions: BTreeMap<u64, u64>,
    /// Final counters with dead incarnations, kept for their heir: per key `(F, S)`.
    frozen: BTreeMap<(NodeId, u64), Frozen>,
    /// Records of `frozen` dropped after [`Config::forget_after`]: requests for them are
    /// not answered (an empty answer would say the link carried nothing).
    forgotten: BTreeSet<(NodeId, u64)>,
    /// The sides of the links our dead incarnations still had live when told they were
    /// dead (never frozen, so in no estate): per `(peer, peer incarnation, our dead
    /// incarnation)`.
    final_sides: BTreeMap<(NodeId, u64, u64), Frozen>,
    /// The heir that settled each of our dead incarnations (it sent us the verdict).
    estate_heirs: BTreeMap<u64, NodeId>,
    /// Our late folds `(our dead incarnation, peer, peer incarnation)` and where they stand.
    late_folds: BTreeMap<(u64, NodeId, u64), LateFoldState>,
    /// Late folds we took into estates we settled `(ward, incarnation, peer, peer
    /// incarnation)`: acknowledged again if asked again after the estate is final.
    late_taken: BTreeSet<(NodeId, u64, NodeId, u64)>,
    /// Ward handovers `(our dead incarnation, ward, ward incarnation)` offered to the heir
    /// that settled that incarnation, with the ward's ledger, until acknowledged (see
    /// `Node::drop_settlements`).
    handovers: BTreeMap<(u64, NodeId, u64), Handed>,
    /// Estates we inherited, by `(ward, incarnation)`, until our heir holds the ledger
    /// version that first held each: if we are declared dead with an older ledger, the
    /// estate is in no estate of ours (rule 10, see `Node::drop_settlements`).
    inherited: BTreeMap<(NodeId, u64), Inheritance>,
    /// Per settled incarnation, what its estate lacked per key (the negative part clamped
    /// to zero when it was counted): an estate handed over as inherited after its ledger
    /// pays this first (rule 10).
    debts: BTreeMap<(NodeId, u64), BTreeMap<Key, i128>>,
    /// Ledgers of wards `(ward, ward incarnation)` our dead incarnation held and did not know
    /// dead, with that incarnation: handed over (`handovers`) once we learn the ward's
    /// incarnation is dead (we hear a later one), dropped if we adopt it ourselves.
    ward_candidates: BTreeMap<(NodeId, u64), (u64, Ledger)>,
    /// Every ward incarnation any incarnation of ours held a ward record of (kept across
    /// reincarnations): a handover of one of them is declined, since its later heirs (our
    /// successors) may hold a fresher ledger of it (see `Node::take_handover`).
    adopted: BTreeSet<(NodeId, u64)>,
    /// Version of our ledger (bumped when a base changes) and the latest our heir holds.
    ledger_version: u64,
    ledger_acked: u64,
    /// Those folds until the peer confirms it folded too, by `(peer, key)`, with the ledger
    /// version that recorded each (its acknowledgement waits for our heir to hold it); in
    /// our ledger.
    pending_folds: BTreeMap<(NodeId, Key), (wire::PendingFold, u64)>,
    /// Folds we made as a retirement's net receiver, by `(peer, key, seen)`, with the peer
    /// incarnation and the time (its clock) of the message whose acknowledgement we folded
    /// on; in our ledger until a later whole message of the peer no longer acknowledges it
    /// (its pending fold is gone). See [`wire::Ledger::received_folds`].
    received_folds: BTreeMap<(NodeId, Key, u64), Received>,
    /// Confirmations `(peer, key, ledger version)` held until our heir holds the version
    /// with our fold: the peer drops its pending fold on our confirmation.
    confirm_after: Vec<(NodeId, Key, u64)>,
    /// Link-keys whose pending fold was confirmed, `(peer, key, ledger version without it)`:
    /// no gift on them until our heir holds that version (see [`wire::PendingFold`]).
    clearing: Vec<(NodeId, Key, u64)>,
    /// Settlement requests `(asker, dead, incarnation)` held until our heir has our ledger.
    held: BTreeSet<(NodeId, NodeId, u64)>,
    /// Messages from incarnations at or below this are ignored.
    dead_floor: BTreeMap<NodeId, u64>,
    leave_started: Option<Nanos>,
    /// Pending succession notices: ward → the dead heir `(node, incarnation)` we replace.
    /// With the ledger version recording the settlement that produced them.
    successions: BTreeMap<NodeId, ((NodeId, u64), u64)>,
    /// This incarnation may have forgotten counters of an earlier one (restart,
    /// reincarnation): it cannot vouch for links it has no record of.
    amnesiac: bool,
    /// The incarnation each of ours follows, where known exactly (0: none before it): see
    /// [`wire::SettleReply::prior`].
    priors: BTreeMap<u64, u64>,
    /// The first incarnation of ours that heard from each peer incarnation `(peer, its
    /// incarnation)`, kept across reincarnations: no capacity flows on a link before that
    /// (see [`wire::SettleReply::first`]).
    first_linked: BTreeMap<(NodeId, u64), u64>,
    /// The current heir (the configured one until it leaves).
    heir: Option<NodeId>,
    outbox: Vec<Outgoing>,
    /// The latest tick's time (creation time before the first): the clock of the events
    /// that have no `now` of their own (see `Frozen::used`).
    last_tick: Nanos,
    /// Keys reclaimed since the last [`Node::ready`].
    reclaimed: Vec<Key>,
    /// [`Node::usable`] as last worked out, while it still holds (see [`UsableCache`]).
    usable_cache: Option<UsableCache>,
    /// What our messages claim (see `census`). Worked out at every tick (a claim sent after
    /// a gift came in is still safe: see `Node::take_census`); cleared when a link changes
    /// incarnation or is frozen.
    census: Option<Census>,
    /// Each neighbour's latest claim, while it makes one: the incarnation that made it,
    /// whether it was addressed to ours, the claim.
    census_heard: BTreeMap<NodeId, (u64, bool, Census)>,
    /// This incarnation took its initial share back, with its links at these incarnations
    /// (their digest, `Node::view_digest`).
    reminted: Option<u64>,
    /// Our part in the capacity audit (see `audit`).
    audit: audit::AuditState,
}

/// The usable neighbours worked out at `at`, valid for any `now` in `[at, until]` unless a
/// link changes first. Walking every link for it was a tenth of a 1,000-node run: it is
/// asked for on every message. Why it holds: time passing only takes links out (a link is
/// usable while `now − last_recv ≤ 2 cycles`, and `until` is when the first one listed
/// expires); everything else that can change the answer (a link's incarnation, lifecycle,
/// neighbour flag, weight or receipt, a new link, a freeze or reincarnation) drops the cache
/// or is checked against it where it happens. Debug builds compare every hit with the walk.
#[derive(Debug, Clone)]
struct UsableCache {
    at: Nanos,
    until: Nanos,
    list: Usable,
}

impl Node {
    /// A node starting at `now` (its own clock).
    ///
    /// # Errors
    /// [`ConfigError`] if the configuration is refused (see [`Config::validate`]).
    pub fn new(cfg: Config, now: Nanos) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let member = cfg.members.contains(&cfg.id);
        let holdings = match (member, cfg.incarnation) {
            (true, 1) => vec![Holding {
                node: cfg.id,
                part: Part::Full,
            }],
            (true, _) => vec![Holding {
                node: cfg.id,
                part: Part::ReserveOnly,
            }],
            (false, _) => Vec::new(),
        };
        let default_base = holdings.iter().map(|&h| cfg.part(h)).sum();
        let reservation = if member { cfg.reservation(cfg.id) } else { 0 };
        let mut links = SmallMap::new();
        for &(peer, weight) in &cfg.links {
            links.insert(peer, Self::new_link(&cfg, weight, now, true));
        }
        // The first incarnation of an initial member holds its initial share on a lease
        // from start: its heir cannot have declared it dead before hearing from it.
        let lease_until = if cfg.incarnation == 1 && member {
            now + cfg.lease
        } else {
            0
        };
        Ok(Self {
            inc: cfg.incarnation,
            lifecycle: if member {
                Lifecycle::Active
            } else {
                Lifecycle::Joining
            },
            holdings,
            default_base,
            reservation,
            links,
            keys: BTreeMap::new(),
            lease_until,
            lease_inc: 0,
            ledger_inc: 0,
            orphaned_at: None,
            wards: BTreeMap::new(),
            settling: BTreeMap::new(),
            settled: BTreeMap::new(),
            settled_with: BTreeMap::new(),
            estate_versions: BTreeMap::new(),
            frozen: BTreeMap::new(),
            forgotten: BTreeSet::new(),
            census: None,
            census_heard: BTreeMap::new(),
            reminted: None,
            audit: audit::AuditState::new(&cfg),
            final_sides: BTreeMap::new(),
            estate_heirs: BTreeMap::new(),
            late_folds: BTreeMap::new(),
            late_taken: BTreeSet::new(),
            handovers: BTreeMap::new(),
            inherited: BTreeMap::new(),
            debts: BTreeMap::new(),
            ward_candidates: BTreeMap::new(),
            adopted: BTreeSet::new(),
            dead_floor: BTreeMap::new(),
            leave_started: None,
            heir: cfg.heir,
            amnesiac: cfg.incarnation > 1,
            first_linked: BTreeMap::new(),
            priors: if cfg.incarnation <= 1 {
                BTreeMap::from([(cfg.incarnation, 0)])
            } else {
                cfg.previous_incarnation
                    .filter(|&p| p < cfg.incarnation)
                    .map(|p| BTreeMap::from([(cfg.incarnation, p)]))
                    .unwrap_or_default()
            },
            ledger_version: 0,
            pending_folds: BTreeMap::new(),
            received_folds: BTreeMap::new(),
            confirm_after: Vec::new(),
            clearing: Vec::new(),
            ledger_acked: 0,
            held: BTreeSet::new(),
            successions: BTreeMap::new(),
            outbox: Vec::new(),
            last_tick: now,
            reclaimed: Vec::new(),
            usable_cache: None,
            cfg,
        })
    }

    fn new_link(cfg: &Config, weight: f64, now: Nanos, neighbour: bool) -> Link {
        let pacing = cfg
            .pacing
            .and_then(|s| TokenAccount::new(s, cfg.cycle, now).ok());
        Link {
            weight,
            inc: 0,
            last_recv: None,
            echo: 0,
            indicator_at: 0,
            lifecycle: Lifecycle::Joining,
            pacing,
            mail: None,
            verdict: 0,
            neighbour,
            names_me_heir: false,
            floor: 0,
            last_sent: 0,
        }
    }

    /// This node's id.
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// The current incarnation.
    #[must_use]
    pub fn incarnation(&self) -> u64 {
        self.inc
    }

    /// The lifecycle state.
    #[must_use]
    pub fn lifecycle(&self) -> Lifecycle {
        self.lifecycle
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The lease state at `now`.
    #[must_use]
    pub fn lease_state(&self, now: Nanos) -> LeaseState {
        if self.heir.is_none() {
            LeaseState::Valid
        } else if now >= self.lease_until {
            LeaseState::Expired
        } else if now + self.cfg.lease / 4 >= self.lease_until {
            LeaseState::Expiring
        } else {
            LeaseState::Valid
        }
    }

    /// The end of the lease on shared capacity (this node's clock): the first instant
    /// [`Node::lease_state`] reads `Expired`, unless a message renews it first; in the past
    /// once expired. `None` when no lease applies (no heir). Drivers arm a timer at it.
    #[must_use]
    pub fn lease_until(&self) -> Option<Nanos> {
        self.heir.map(|_| self.lease_until)
    }

    /// Sets the gain γ at run time (a daemon's `gamma: auto`, recomputed when membership
    /// changes). Checked like [`Config::validate`] (seed 003 Thm 1, seed 000 Lemma 2), but
    /// against the weighted degree of the neighbours the law can give to at `now`, not every
    /// configured link: a dead neighbour takes no gifts, so a larger γ is stable on the
    /// smaller live degree. The law also clamps γ to the bound of the live degree at every
    /// tick, so a neighbour coming back between two calls cannot make it unstable.
    ///
    /// # Errors
    /// [`ConfigError::BadGain`] or [`ConfigError::Unstable`]; γ is then unchanged.
    pub fn set_gamma(&mut self, gamma: f64, now: Nanos) -> Result<(), ConfigError> {
        let live = self.usable(now);
        stability::check_node(self.cfg.id, gamma, &self.cfg.measure, &live)?;
        self.cfg.gamma = gamma;
        Ok(())
    }

    /// The state of the link to `peer` at `now` (`None` if not a neighbour).
    #[must_use]
    pub fn link_state(&self, peer: NodeId, now: Nanos) -> Option<LinkState> {
        let l = self.links.get(&peer).filter(|l| l.neighbour)?;
        Some(match l.last_recv {
            Some(t) if now.saturating_sub(t) <= 2 * self.cfg.cycle => LinkState::Up,
            Some(t) if now.saturating_sub(t) <= self.cfg.lease => LinkState::Suspect,
            _ => LinkState::Down,
        })
    }

    /// The share held for `key` (what the ledger says; enforced or not).
    #[must_use]
    pub fn own(&self, key: Key) -> u64 {
        match self.lifecycle {
            Lifecycle::Left => 0,
            _ => self.keys.get(&key).map_or(self.default_base, KeyState::own),
        }
    }

    /// The limit enforced for `key` at `now` (see [`Fallback`]).
    #[must_use]
    pub fn enforced(&self, key: Key, now: Nanos) -> u64 {
        let own = self.own(key);
        if self.lifecycle == Lifecycle::Left {
            return 0;
        }
        match (self.lease_state(now), self.cfg.fallback) {
            (LeaseState::Valid | LeaseState::Expiring, _) | (_, Fallback::LastShare) => own,
            (LeaseState::Expired, _) => own.min(self.reservation),
        }
    }

    /// The performance indicator `p` for `key`.
    #[must_use]
    pub fn indicator(&self, key: Key) -> f64 {
        let demand = self.keys.get(&key).map_or(0.0, |k| k.demand.estimate());
        self.cfg
            .measure_of(key)
            .indicator(demand, self.own(key) as f64)
    }

    /// `(given to peer, received from peer)` on `key` for the current link incarnations.
    #[must_use]
    pub fn link_counters(&self, key: Key, peer: NodeId) -> (u64, u64) {
        self.keys
            .get(&key)
            .and_then(|k| k.links.get(&peer))
            .map_or((0, 0), |l| (l.given, l.seen))
    }

    /// The demand estimate for `key`.
    #[must_use]
    pub fn demand(&self, key: Key) -> f64 {
        self.keys.get(&key).map_or(0.0, |k| k.demand.estimate())
    }

    /// Records this node keeps of its links with dead peer incarnations (one per dead
    /// incarnation it had a link with, each with every key of that link), for whoever settles
    /// them: see [`Config::forget_after`].
    #[must_use]
    pub fn dead_link_records(&self) -> usize {
        self.frozen.len()
    }

    /// Retirement folds under way here ("Idle keys"): those we made as the net giver that the
    /// peer has not confirmed, and those we made as the net receiver that the peer may still
    /// hold pending. Each is a line in our ledger; all end once the keys are reclaimed.
    #[must_use]
    pub fn fold_records(&self) -> usize {
        self.pending_folds.len() + self.received_folds.len()
    }

    /// Keys with state here.
    pub fn active_keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.keys.keys().copied()
    }

    /// Whether this node has state for `key` (its demand or a peer's message created it, and
    /// it was not reclaimed since).
    #[must_use]
    pub fn has_state(&self, key: Key) -> bool {
        self.keys.contains_key(&key)
    }

    /// Bytes of state per active key (key state plus its per-link entries).
    #[must_use]
    pub fn state_bytes_per_key(&self) -> usize {
        let n = self.keys.len().max(1);
        let links: usize = self.keys.values().map(|k| k.links.len()).sum();
        (self.keys.len() * (size_of::<Key>() + size_of::<KeyState>())
            + links * (size_of::<NodeId>() + size_of::<LinkKey>()))
            / n
    }

    fn key_mut(&mut self, key: Key) -> &mut KeyState {
        let base = i64::try_from(self.default_base).unwrap_or(i64::MAX);
        let tau = self.cfg.demand_tau;
        self.keys.entry(key).or_insert_with(|| KeyState {
            base,
            demand: DemandFilter::new(tau),
            links: SmallMap::new(),
            seen_sum: 0,
            given_sum: 0,
            enforced: None,
            idle_since: None,
            quiet: false,
        })
    }

    /// The demand (rate, capacity units) measured for `key` over the interval ending `now`.
    /// Report every key of [`Node::active_keys`] each cycle, zero included: the estimate only
    /// moves when observed. With [`Config::idle_after`] set, a zero for a key without state
    /// creates none.
    pub fn set_demand(&mut self, now: Nanos, key: Key, rate: f64) {
        // No demand for a key without state is what no state already says: keep it that way
        // (a reclaimed key must not come back because the driver reports zeros).
        if self.cfg.idle_after.is_some() && rate < 1.0 && !self.keys.contains_key(&key) {
            return;
        }
        self.key_mut(key).demand.observe_rate(now, rate);
    }

    /// `count` arrivals for `key` since the previous observation.
    pub fn observe_arrivals(&mut self, now: Nanos, key: Key, count: u64) {
        if self.cfg.idle_after.is_some() && count == 0 && !self.keys.contains_key(&key) {
            return;
        }
        let period = self.cfg.cycle;
        self.key_mut(key)
            .demand
            .observe_arrivals(now, count, period);
    }

    /// Starts a graceful leave: the node hands every share to its heir, then stops.
    pub fn leave(&mut self, now: Nanos) {
        if matches!(self.lifecycle, Lifecycle::Active | Lifecycle::Joining) {
            self.lifecycle = Lifecycle::Leaving;
            self.leave_started = Some(now);
            // A leaving node settles nobody: its wards pick another heir. That includes the
            // wards of our dead incarnations still named after our node: one that moves to
            // another heir now holds its latest ledger there, so ours must never be handed
            // over (see `Node::take_handover`).
            self.wards.clear();
            self.ward_candidates.clear();
        }
    }

    /// Drains what to do: messages to send and changed enforced limits.
    pub fn ready(&mut self, now: Nanos) -> Ready {
        let mut limits = Vec::new();
        let mut keys = StackVec::<Key, 8>::new();
        keys.extend(self.keys.keys().copied());
        for &k in keys.iter() {
            let e = self.enforced(k, now);
            if let Some(ks) = self.keys.get_mut(&k)
                && ks.enforced != Some(e)
            {
                ks.enforced = Some(e);
                limits.push((k, e));
            }
        }
        Ready {
            messages: std::mem::take(&mut self.outbox),
            limits,
            reclaimed: std::mem::take(&mut self.reclaimed),
        }
    }

    /// One cycle: settle dead wards, give capacity by the law, send messages. `draw` returns
    /// uniform random numbers in `[0, 1)` (used by randomized pacing).
    pub fn tick(&mut self, now: Nanos, draw: &mut dyn FnMut() -> f64) {
        self.last_tick = self.last_tick.max(now);
        if self.lifecycle == Lifecycle::Left {
            return;
        }
        // Orphaned for two leases with no word from the dead heir's successor, or a lease
        // out for long while our heir is up: start again (see `Node::orphaned`,
        // `Node::lease_stalled`).
        let orphan_done = self.orphaned(now)
            && self
                .orphaned_at
                .is_some_and(|at| now > at + 2 * self.cfg.lease);
        if orphan_done || self.lease_stalled(now) {
            self.reincarnate(now, self.inc, None, None);
        }
        self.check_wards(now);
        self.forget_old_links(now);
        self.take_census(now);
        self.audit_tick(now);
        self.replace_leaving_heir(now);
        self.restore_heir(now);
        self.update_quiet(now);
        // Nothing below changes which neighbours are usable (gifts and sends touch counters,
        // not a link's incarnation, lifecycle or last receipt): work it out once.
        let usable = self.usable(now);
        match self.lifecycle {
            Lifecycle::Active if self.lease_state(now) != LeaseState::Expired => {
                self.give(now, &usable);
                self.end_clearings();
                self.level_give(&usable);
                self.propose_retirements();
                self.reclaim();
            }
            Lifecycle::Leaving => self.hand_over(now),
            _ => {}
        }
        // The relay requests' per-key part, once for every send below (sends change no
        // input of it: they record what was sent, not what was given or asked).
        let mut plan_buf = StackVec::<Option<RelayPlan>, 4>::new();
        let relaying = self.relaying(now);
        if relaying {
            self.relay_plans(&usable, &mut plan_buf);
        }
        let plans = relaying.then_some(&plan_buf[..]);
        let (no_heir, acked) = (self.heir.is_none(), self.ledger_acked);
        let announced = |v: u64| no_heir || acked >= v;
        let mut peers = StackVec::<NodeId, 16>::new();
        peers.extend(self.links.keys().copied());
        for &p in peers.iter() {
            let Some(link) = self.links.get_mut(&p) else {
                continue;
            };
            let must = Some(p) == self.heir
                || self.wards.contains_key(&p)
                || link.names_me_heir
                || link.answers_waiting()
                // Field by field (`link` is borrowed): `Node::handovers_to`.
                || self
                    .handovers
                    .keys()
                    .any(|k| self.estate_heirs.get(&k.0) == Some(&p))
                || self.late_folds.iter().any(|(k, &st)| {
                    st == LateFoldState::Offered && self.estate_heirs.get(&k.0) == Some(&p)
                })
                || link.verdict != 0
                || self.successions.get(&p).is_some_and(|s| announced(s.1))
                || self
                    .settling
                    .values()
                    .any(|s| announced(s.version) && s.waiting.contains(&p));
            let mut paced = match (&mut link.pacing, link.neighbour) {
                (Some(acc), true) => acc.on_tick(now, draw()),
                (None, true) => true,
                (_, false) => false,
            };
            // A gift made this tick is news for its receiver: capacity recorded in a counter
            // that does not travel is capacity nobody enforces. Send it with a token if the
            // account just saved one rather than wait for the next proactive message.
            if !must
                && !paced
                && self
                    .keys
                    .values()
                    .any(|k| k.links.get(&p).is_some_and(|lk| lk.given > lk.given_sent))
                && let Some(acc) = self.links.get_mut(&p).and_then(|l| l.pacing.as_mut())
            {
                paced = acc.on_news_at_most(now, draw(), 1) > 0;
            }
            if must || paced {
                self.send_with(p, now, &usable, plans);
            }
        }
        if self.lifecycle == Lifecycle::Leaving {
            self.maybe_left(now);
        }
    }

    /// The heir currently named.
    #[must_use]
    pub fn heir(&self) -> Option<NodeId> {
        self.heir
    }

    /// The limit enforced for keys this node has no state for.
    #[must_use]
    pub fn default_enforced(&self, now: Nanos) -> u64 {
        match self.lifecycle {
            Lifecycle::Left => 0,
            _ => match (self.lease_state(now), self.cfg.fallback) {
                (LeaseState::Valid | LeaseState::Expiring, _) | (_, Fallback::LastShare) => {
                    self.default_base
                }
                (LeaseState::Expired, _) => self.default_base.min(self.reservation),
            },
        }
    }

    /// A message from `from`, received at `now` (this node's clock).
    pub fn handle_message(
        &mut self,
        now: Nanos,
        from: NodeId,
        mut msg: Message,
        draw: &mut dyn FnMut() -> f64,
    ) {
        self.handle_message_in(now, from, &mut msg, draw);
    }

    /// [`Node::handle_message`] on a borrowed message, which it may take parts of (the
    /// ledger): a driver can decode every message into one buffer
    /// ([`crate::wire::decode_into`]) instead of allocating one per message.
    pub fn handle_message_in(
        &mut self,
        now: Nanos,
        from: NodeId,
        msg: &mut Message,
        draw: &mut dyn FnMut() -> f64,
    ) {
        if self.lifecycle == Lifecycle::Left || from == self.cfg.id {
            return;
        }
        if !self.ward_candidates.is_empty() {
            self.ward_died(from, msg.from_inc);
        }
        // Settlement traffic is answered whoever sends it.
        for &(dead, inc) in &msg.settle_requests {
            self.answer_settle(from, dead, inc);
        }
        self.heir_death_noted(now);
        for r in &msg.settle_replies {
            self.take_reply(from, r);
        }
        for f in &msg.late_folds {
            self.take_late_fold(now, from, f);
        }
        for h in &msg.handovers {
            self.take_handover(now, from, h);
        }
        for a in &msg.handover_acks {
            if self.estate_heirs.get(&a.incarnation) == Some(&from) {
                self.handovers
                    .remove(&(a.incarnation, a.ward, a.ward_incarnation));
            }
        }
        for a in &msg.late_acks {
            if self.estate_heirs.get(&a.incarnation) == Some(&from)
                && let Some(st) =
                    self.late_folds
                        .get_mut(&(a.incarnation, a.peer, a.peer_incarnation))
                && *st == LateFoldState::Offered
            {
                *st = if a.accepted {
                    LateFoldState::Accepted
                } else {
                    LateFoldState::Refused
                };
            }
        }
        // Our heir's verdict on us stands even when that heir's incarnation is dead to us (its
        // own heir is settling it and asked us for our counters with it): it settled us
        // before it died, and whoever inherits its estate may hold ours. Ignoring the
        // verdict would leave us holding a share that is also counted there (see
        // docs/PROTOCOL.md, "Settlements across a multi-node cut"). Reincarnating only
        // drops capacity, so obeying an authentic verdict is always safe.
        if Some(from) == self.heir && msg.dead_verdict >= self.inc {
            self.reincarnate(now, msg.dead_verdict, msg.verdict_version, Some(from));
            return;
        }
        self.late_verdict(from, msg);
        // The same verdict from our dead heir's successor (it read it in the dead heir's
        // ledger): the succession it comes with must not revive a settled incarnation.
        if msg.succession.is_some_and(|(h, _)| Some(h) == self.heir) && msg.dead_verdict >= self.inc
        {
            self.reincarnate(now, msg.dead_verdict, msg.verdict_version, None);
            return;
        }
        if msg.from_inc <= self.dead_floor.get(&from).copied().unwrap_or(0) {
            // A dead incarnation: tell it, if we are the heir that settled it or is settling
            // it. Telling it before its estate is in is safe (it only drops what it holds),
            // and needed: an estate may wait for ever (see `take_reply`), and the dead node
            // must not hold settlement answers other heirs wait for meanwhile. But only once
            // our heir holds the settlement (`announced`): if we die before that, our heir
            // inherits a ledger that still lists the ward and revives it with its share
            // (a succession notice) instead of losing it with us.
            // A finished settlement too, but only once our heir holds its start (rule 3): a
            // settlement with few neighbours to ask can finish first, and if we then crash
            // the estate is only in our unrecorded state; our heir revives the ward with a
            // notice, which a ward told it is dead would ignore (a random graph of 6 at 49 %
            // loss, one crash: 0.67 L).
            let finished = self.settled.get(&from).is_some_and(|&s| s >= msg.from_inc)
                && self
                    .inherited
                    .get(&(from, msg.from_inc))
                    .is_none_or(|r| self.announced(r.start));
            if finished
                || self.settling.iter().any(|(&(n, i), st)| {
                    n == from && i >= msg.from_inc && self.announced(st.version)
                })
            {
                // Sent with the next tick, not now: two nodes that each think the other dead
                // must not ping-pong verdicts.
                let link = self.link_entry(from, now, false);
                link.verdict = link.verdict.max(msg.from_inc);
            }
            return;
        }
        // An incarnation older than the one our link is with is dead (incarnations only grow,
        // and a node runs one at a time). Without this, a late message of one we never linked
        // with took the link back to it: the newer incarnation's counters would then be
        // frozen as its, and its ledger adopted as a ward's (see `Node::take_census`).
        let link_inc = self.links.get(&from).map(|l| l.inc);
        if link_inc.is_some_and(|i| i > msg.from_inc) {
            return;
        }
        let known = self.links.get(&from).is_some_and(|l| l.neighbour);
        if !known && msg.lifecycle == Lifecycle::Joining && msg.to_inc == 0 {
            // A joiner introduces itself: accept the link if the stability bound still holds.
            let mut links: Vec<(NodeId, f64)> = self
                .links
                .iter()
                .filter(|(_, l)| l.neighbour)
                .map(|(p, l)| (*p, l.weight))
                .collect();
            links.push((from, self.cfg.join_weight));
            if stability::check_node(self.cfg.id, self.cfg.gamma, &self.cfg.measure, &links).is_ok()
            {
                let w = self.cfg.join_weight;
                self.link_entry(from, now, true).weight = w;
                self.usable_cache = None;
            }
        }
        if !self.links.contains_key(&from) && !msg.to_heir && msg.succession.is_none() {
            return;
        }
        // A newer incarnation: the old one is dead; freeze its counters for its heir.
        let seen_inc = self.links.get(&from).map_or(0, |l| l.inc);
        if seen_inc != 0 && msg.from_inc > seen_inc {
            self.freeze(from, seen_inc);
            if self.wards.get(&from).is_some_and(|w| w.inc == seen_inc) {
                self.start_settle(from);
            }
            self.heir_death_noted(now);
        }
        let up = 2 * self.cfg.cycle;
        if link_inc != Some(msg.from_inc) {
            // Our view changes (see `Node::take_census`).
            self.census = None;
            // Only here, not per message: the first message of an incarnation always
            // changes the incarnation our link is with.
            self.first_linked
                .entry((from, msg.from_inc))
                .or_insert(self.inc);
        }
        let (fresh, usable_now) = {
            let link = self.link_entry(from, now, false);
            if link.inc != msg.from_inc {
                // Another incarnation (another clock, fresh counters): no floor yet.
                link.floor = 0;
            }
            link.inc = msg.from_inc;
            link.last_recv = Some(link.last_recv.map_or(now, |t| t.max(now)));
            link.echo = link.echo.max(msg.sent_at);
            let fresh = msg.sent_at >= link.indicator_at;
            if fresh {
                link.lifecycle = msg.lifecycle;
                link.indicator_at = msg.sent_at;
            }
            (fresh, Self::link_usable(link, now, up))
        };
        // The cached usable list stays right if the sender is in it exactly when it is usable
        // now (its entry is `(from, weight)` whatever else changed); a later receipt only
        // keeps it usable longer, and `until` stays the earlier bound.
        if let Some(c) = &self.usable_cache {
            let listed = c.list.binary_search_by_key(&from, |&(q, _)| q).is_ok();
            if listed != usable_now || now < c.at {
                self.usable_cache = None;
            }
        }
        // An older incarnation of the sender we settle, and still wait on: tell its successor
        // who holds that estate (it may have come back without hearing it, see
        // `Node::late_verdict`), so it offers us that incarnation's late folds.
        let waited = self
            .settling
            .iter()
            .filter(|&(&(n, i), s)| {
                n == from && i < msg.from_inc && !s.waiting.is_empty() && self.announced(s.version)
            })
            .map(|(&(_, i), _)| i)
            .max();
        if let Some(d) = waited {
            let link = self.link_entry(from, now, false);
            link.verdict = link.verdict.max(d);
        }
        let is_heir = Some(from) == self.heir;
        if is_heir && msg.dead_verdict >= self.inc {
            self.reincarnate(now, msg.dead_verdict, msg.verdict_version, Some(from));
            return;
        }
        if is_heir && msg.echo != 0 && msg.to_inc == self.inc {
            // Not from another incarnation of our heir while our lease is out (see
            // `Node::orphaned`; the link already names the sender's incarnation).
            if !self.orphaned(now) {
                self.lease_inc = msg.from_inc;
                self.orphaned_at = None;
                self.lease_until = self.lease_until.max(msg.echo + self.cfg.lease);
            }
            if msg.ledger_ack > self.ledger_acked {
                self.ledger_acked = msg.ledger_ack;
                let acked = self.ledger_acked;
                self.inherited.retain(|_, i| i.finish > acked);
                for (asker, dead, inc) in std::mem::take(&mut self.held) {
                    self.answer_settle(asker, dead, inc);
                    if self
                        .links
                        .get(&asker)
                        .is_some_and(|l| l.mail.as_ref().is_some_and(|m| !m.replies.is_empty()))
                    {
                        self.send(asker, now);
                    }
                }
            }
        }
        // The latest incarnation of our heir we know of: a frozen link forgets its
        // incarnation, the dead floor does not. A notice about an older one is stale (a
        // succession from the first of two crashes of our heir, still resent by its
        // successor, made node 3 of a 5-ring take a fresh lease after the second
        // incarnation had settled it: Σ enforced = L + 9.3 %).
        let known = |h: NodeId| {
            self.links
                .get(&h)
                .map_or(0, |l| l.inc)
                .max(self.dead_floor.get(&h).copied().unwrap_or(0))
        };
        if let Some((dead_heir, inc)) = msg.succession
            && self.heir == Some(dead_heir)
            && (known(dead_heir) <= inc || (self.orphaned(now) && inc == self.lease_inc))
        {
            // Our heir was declared dead by its own heir, which takes its place. Nobody holds
            // a ward record of us now, so a fresh lease is safe (see the module docs).
            self.heir = Some(from);
            self.lease_until = self.lease_until.max(now + self.cfg.lease);
            self.lease_inc = msg.from_inc;
            self.orphaned_at = None;
            // Introduce ourselves (and our ledger) to the new heir at once.
            self.send(from, now);
        }
        if fresh && let Some(l) = self.links.get_mut(&from) {
            l.names_me_heir = msg.to_heir;
        }
        // The sender's census claim (see `Node::take_census`); costs nothing while nobody
        // makes one.
        if fresh && (msg.census.is_some() || !self.census_heard.is_empty()) {
            match msg.census {
                Some(c) => {
                    let to_me = msg.to_inc == self.inc;
                    self.census_heard.insert(from, (msg.from_inc, to_me, c));
                }
                None => {
                    self.census_heard.remove(&from);
                }
            }
        }
        self.take_audit(from, (msg.from_inc, msg.to_inc), msg.audit.as_deref(), now);
        // A ward record needs a message addressed to this very incarnation: a restarted heir
        // must not adopt (and later settle) a ward that named its previous incarnation.
        if fresh && self.lifecycle != Lifecycle::Leaving {
            match msg.ledger.take() {
                Some(ledger)
                    if msg.to_heir
                        && (msg.to_inc == self.inc || (msg.to_inc == 0 && !self.amnesiac)) =>
                {
                    let w = Ward {
                        inc: msg.from_inc,
                        last_recv: now,
                        ledger,
                        leaving: matches!(msg.lifecycle, Lifecycle::Leaving | Lifecycle::Left),
                    };
                    let newer = self
                        .wards
                        .get(&from)
                        .is_none_or(|old| old.ledger.version < w.ledger.version);
                    self.ward_candidates.remove(&(from, msg.from_inc));
                    self.adopted.insert((from, msg.from_inc));
                    self.wards.insert(from, w);
                    self.successions.remove(&from);
                    if newer {
                        // Acknowledge at once: the ward may hold settlement replies for it.
                        self.send(from, now);
                    }
                }
                // A later part of a split message (the ledger travels in the first): the ward
                // still names us; it is alive.
                None if msg.to_heir => {
                    if let Some(w) = self.wards.get_mut(&from)
                        && w.inc == msg.from_inc
                    {
                        w.last_recv = w.last_recv.max(now);
                    }
                }
                // It named another heir: not ours to settle any more.
                _ => {
                    self.wards.remove(&from);
                }
            }
        }
        if self.lifecycle == Lifecycle::Joining && msg.lifecycle == Lifecycle::Active {
            self.lifecycle = Lifecycle::Active;
        }
        // Counters addressed to an older incarnation of us belong to its settlement.
        let neighbour = self.links.get(&from).is_some_and(|l| l.neighbour);
        if !neighbour || !(msg.to_inc == self.inc || msg.to_inc == 0) {
            return;
        }
        let mut news = false;
        let stale = self.retirements(from, msg);
        for e in msg.keys.iter().filter(|_| !stale) {
            // A quiet key the sender holds nothing of on this link costs us no state.
            if e.idle
                && e.given == 0
                && e.seen == 0
                && !(e.relay.is_finite() && e.relay >= 1.0)
                && !self.keys.contains_key(&e.key)
            {
                continue;
            }
            let new = !self.keys.contains_key(&e.key);
            let idle_after = self.cfg.idle_after;
            let ks = self.key_mut(e.key);
            // State created by a neighbour where the key is idle (a level request, "Idle
            // keys"): we have no demand for it either, so it is quiet from the start. Not
            // quiet, it would take part in no levelling for `idle_after`, and be dropped
            // again as soon as it is: a level request crossing it would never get through.
            if new
                && e.idle
                && let Some(after) = idle_after
            {
                ks.idle_since = Some(now.saturating_sub(after));
                ks.quiet = true;
            }
            let lk = ks.links.entry(from).or_default();
            if fresh {
                lk.peer_idle = e.idle;
            }
            if lk.tomb().is_some() {
                // Counters of the retired generation may still be in this message.
                continue;
            }
            if e.given > lk.seen {
                ks.seen_sum = ks.seen_sum.wrapping_add(e.given - lk.seen);
                lk.seen = e.given;
                news = true;
                // A gift of the retiring generation: the peer's `given` was never our `c`
                // since we proposed, and never will be, so it cannot match (and a peer that
                // matched gives nothing more in that generation): end the round.
                if lk.retiring().is_some() {
                    lk.retirement = Retirement::None;
                }
            }
            if e.seen <= lk.given {
                lk.acked = lk.acked.max(e.seen);
            }
            if fresh {
                lk.peer = Some((e.indicator, e.saturated));
                let relay = (e.relay.is_finite() && e.relay >= 1.0).then_some((
                    e.relay,
                    e.relay_hops,
                    e.seen,
                ));
                lk.relay = relay;
            }
        }
        if !stale {
            self.match_retirements(from, msg);
        }
        // A key the neighbour sent no entry for in a message that holds all its keys has no
        // state there: idle on its side ("Idle keys"). A neighbour that dropped the key
        // sends nothing more about it, so without this our side would wait for ever for an
        // entry saying it is idle (found by `idle_keys_are_reclaimed_and_conserve`).
        // (Only reclamation reads `peer_idle`: without it, skip the walk over our keys.)
        if fresh && msg.all_keys && !stale && self.cfg.idle_after.is_some() {
            for (k, ks) in &mut self.keys {
                if let Some(lk) = ks.links.get_mut(&from)
                    && msg.keys.binary_search_by_key(k, |e| e.key).is_err()
                {
                    // An entry is left out only without a request in it.
                    lk.peer_idle = true;
                    lk.relay = None;
                }
            }
        }
        // Seed 004: news is answered at once where tokens allow. A reply to the sender, a
        // relay gift to whoever asked (so capacity crosses several hops within one cycle),
        // and a changed relay request to the neighbours it concerns. Only relay gifts are
        // made here: the law's gifts stay once per cycle, as its stability bound assumes.
        // (A sorted, deduplicated vector: a set in id order without a node per entry.)
        let mut notify = StackVec::<NodeId, 16>::new();
        if news {
            notify.push(from);
        }
        // The usable neighbours, once for the whole message (the sends below change none).
        let mut plans = StackVec::<Option<RelayPlan>, 4>::new();
        let mut relay = None;
        if self.links.values().any(|l| l.pacing.is_some()) && self.relaying(now) {
            let u = self.usable(now);
            self.relay_give(now, &u, Some(&mut notify));
            self.relay_plans(&u, &mut plans);
            for (ks, &plan) in self.keys.values().zip(&plans) {
                for &(q, _) in u.iter() {
                    let sent = ks.links.get(&q).map_or(0.0, |l| l.relay_sent);
                    let (r, _) = Self::relay_ask(plan, q, &u);
                    // A quiet key's level request (sent where no relay request is) is no
                    // news: it goes at the next tick.
                    if relay_changed(sent, r) && !(ks.quiet && r == 0.0) {
                        notify.push(q);
                    }
                }
            }
            relay = Some(u);
        }
        notify.sort_unstable();
        notify.dedup();
        for &q in notify.iter() {
            if let Some(acc) = self.links.get_mut(&q).and_then(|l| l.pacing.as_mut())
                // One message carries every key, so spend at most one token per news; the
                // rest stay for the next (seed 004 Alg. 4 counts messages, not replies).
                && acc.on_news_at_most(now, draw(), 1) > 0
            {
                match &relay {
                    Some(u) => self.send_with(q, now, u, Some(&plans)),
                    None => self.send(q, now),
                }
            }
        }
    }

    fn link_entry(&mut self, peer: NodeId, now: Nanos, neighbour: bool) -> &mut Link {
        // A new link, or one becoming a neighbour, may change what is usable.
        if self
            .links
            .get(&peer)
            .is_none_or(|l| neighbour && !l.neighbour)
        {
            self.usable_cache = None;
        }
        let cfg = &self.cfg;
        let link = self
            .links
            .entry(peer)
            .or_insert_with(|| Self::new_link(cfg, cfg.join_weight, now, neighbour));
        link.neighbour |= neighbour;
        link
    }
}
