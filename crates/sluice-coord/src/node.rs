//! One Sluice node as a sans-IO state machine. docs/PROTOCOL.md is the specification
//! (glossary, messages, invariants, the safety argument of each mechanism); this is a map.
//!
//! # The ledger (conservation that survives the network)
//!
//! For every key a node holds `own = base + Σ_j seen_{j→i} − Σ_j given_{i→j}`. `given_{i→j}`
//! is a monotone counter of all capacity `i` ever gave `j`, and every message carries it
//! whole: the receiver applies `counter − seen` when it is larger and ignores it otherwise,
//! so a message is idempotent, a lost one only delays, a stale one changes nothing. Hence
//! `Σ own ≤ Σ base` at every instant, whatever the network does (seed 003 §IV: "no local
//! limiter gains or loses extra capacity"), and the capacity of the cluster is `Σ base`.
//!
//! # Leases and fences (a quorum)
//!
//! A node enforces its share only while it holds a *lease*: a quorum of the members (more
//! than half; exactly half with the lowest id) echoed one of its messages within `lease` on
//! its own clock. A member that has not heard an incarnation for `lease·(1+ρ)²` *votes* to
//! fence it: a promise never to echo it again. A quorum of votes is a *fence*: the fenced
//! incarnation held no lease since before the last vote and never will again (any two
//! quorums share a member), so its capacity can be counted as gone. Every node that learns
//! a fence, or hears a later incarnation of a node, *folds* its link with the dead
//! incarnation into its base (`base += seen − given`, which leaves `own` unchanged) and
//! ignores it from then on. A restarted node comes back as a new incarnation holding only
//! its reservation, and echoes nobody for a quarantine (its lost votes must have done their
//! work first); a node without a lease for two leases starts again too.
//!
//! # The capacity audit (minting what the dead held)
//!
//! The lowest member that holds a lease reads a quorum of members at one instant (two
//! waves of the echo algorithm: gather, confirm unchanged) and mints `L − Σ` into its own
//! base, where `Σ` is the readers' bases plus, for each member not read, what it can hold
//! without a lease (its reservation, or its initial share if its first incarnation may still
//! run). The same mechanism gives a cluster its capacity after a restart of every node.
//!
//! # Idle keys, many keys, relay
//!
//! Keys with no demand level back to the static split, retire their counters and are
//! dropped (`idle`); a send carries only the entries the peer may lack, in one datagram
//! within a per-link byte budget (`delta`); a node holds state for at most
//! `Config::max_keys` keys (`cap`); spare capacity moves toward unmet demand over several
//! hops (`relay`). Each is conserved by the ledger alone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod audit;
mod cap;
mod config;
mod delta;
mod idle;
mod membership;
mod quorum;
mod receive;
mod relay;
mod send;
mod small_map;

pub use config::{Config, Fallback, LeaseState, Leases, LinkState};
pub use membership::{Changes, MAX_LINKS, Membership};

use small_map::{SmallMap, StackVec};

use crate::filter::DemandFilter;
use crate::law::{self, Measure, Peer};
use crate::pacing::{Strategy, TokenAccount};
use crate::stability::{self, ConfigError};
use crate::wire::{self, Key, KeyEntry, Lifecycle, Message, NodeId};

/// Nanoseconds on this node's own clock.
pub type Nanos = u64;

/// The usable neighbours with their link weights, sorted by node id (see `Node::usable`).
/// Shared: it is cached and handed out on every message, and a copy each time was an
/// allocation per message.
type Usable = Arc<[(NodeId, f64)]>;

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
    /// Total weight of the usable neighbours asked (all but `from`; only those whose share
    /// covers their demand, if any does: see `spare_only`).
    total: f64,
    /// Ask only the neighbours whose latest entry says their share covers their demand
    /// (`KeyEntry::saturated`): under max-min they hold the spare, and a request split over
    /// every neighbour got a fraction of it per round from them.
    spare_only: bool,
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
    /// Peer incarnation the link is with (0: none: never heard, or folded).
    inc: u64,
    last_recv: Option<Nanos>,
    /// Latest `sent_at` received from the peer's incarnation `inc` (peer clock), echoed back.
    echo: Nanos,
    /// Latest echo of our own `sent_at` from the peer to our current incarnation (our
    /// clock; 0: none): what our lease is made of.
    echoed: Nanos,
    /// `sent_at` of the message whose indicators we hold (stale ones are ignored).
    indicator_at: Nanos,
    lifecycle: Lifecycle,
    pacing: Option<TokenAccount>,
    /// A neighbour of the law (vs a member we only exchange leases and fences with).
    neighbour: bool,
    /// Messages from the peer sent (its clock) before this carry no counters or retirement
    /// proposals we apply: they may hold counters of a retired generation (see "Idle keys").
    floor: Nanos,
    /// For a link made at run time, our clock when it was made (or its peer incarnation
    /// changed): the peer's counters count, and we give to it, only once it echoes a message
    /// we sent since (`Link::heard_us`). 0 for a configured link.
    opened: Nanos,
    /// `sent_at` of our latest message to the peer: `sent_at` strictly increases per link,
    /// so "sent before" is well defined for the peer's floor.
    last_sent: Nanos,
    /// What we sent on the link and what the peer has of it; the link's byte budget
    /// (`delta`). Boxed: only sends read it.
    delta: Box<delta::LinkDelta>,
}

impl Link {
    /// Whether the peer heard this node on this link: a link made at run time carries
    /// counters only after the peer echoed one of our messages sent since it was made. A
    /// recorded datagram of a departed incarnation, replayed after its dead floor was
    /// forgotten, can open a link but never echo it, so its old gifts are never taken again.
    fn heard_us(&self) -> bool {
        self.opened == 0 || self.echoed >= self.opened
    }

    /// The link is with no incarnation any more (it died, or we did): what we knew of the
    /// last one goes (its clock, its floor).
    fn unlink(&mut self) {
        self.inc = 0;
        self.echo = 0;
        self.indicator_at = 0;
        self.floor = 0;
        self.delta.reset();
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
}

// The 1,000-node simulation is bound by cache misses on this state (docs/BENCHMARKS.md):
// growing either struct is a choice, not an accident (`Link::opened`: 8 bytes per link, for
// replays of departed joiners).
const _: () = assert!(size_of::<LinkKey>() <= 88 && size_of::<Link>() <= 192);

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
    /// Signed: a link's folded net (received − given) can be negative on its own.
    base: i64,
    demand: DemandFilter,
    links: SmallMap<NodeId, LinkKey>,
    /// `Σ seen` and `Σ given` over `links` (as `u64` sums, wrapping exactly as summing the
    /// links would), kept up to date wherever a link's counters change so that
    /// [`KeyState::own`] is O(1): it is read several times per message and tick.
    seen_sum: u64,
    given_sum: u64,
    enforced: Option<u64>,
    /// Since when the demand estimate has been below one unit.
    idle_since: Option<Nanos>,
    /// Idle for at least `Config::idle_after`.
    quiet: bool,
    /// The number of the key's entry in the order of changes (`Node::change_seq`): a link
    /// whose peer acknowledged less sends it (`delta`). A change takes a new number only if
    /// the entry went out since it took its last one (`KeyState::change`).
    changed: u64,
    /// An entry of the key went out (on any link) since it took its number.
    sent: bool,
    /// What the key's entries last said of it (`None`: nothing yet).
    advert: Option<delta::Advert>,
}

impl KeyState {
    /// Records a change of the key's entry. A key whose entry has not gone out since it was
    /// numbered keeps its number, and so its place in the links' order of changes: every
    /// link still lacks it (a message whose horizon covers a number holds that key), and a
    /// key that changes every cycle would otherwise always be the newest and wait behind
    /// every other change for as long as they exceed the budget.
    fn change(&mut self, seq: &mut u64) {
        if self.sent || self.changed == 0 {
            *seq += 1;
            self.changed = *seq;
            self.sent = false;
        }
    }

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

    /// Records that a link's counters, `seen` and `given`, were zeroed (a retirement, "Idle
    /// keys"; a fold).
    fn zeroed(&mut self, seen: u64, given: u64) {
        self.seen_sum = self.seen_sum.wrapping_sub(seen);
        self.given_sum = self.given_sum.wrapping_sub(given);
    }

    /// Folds the link with `p` into the base: `base += seen − given`, which leaves `own`
    /// as it is; what was in flight on the link is lost (never counted twice).
    fn fold(&mut self, p: NodeId) {
        if let Some(lk) = self.links.remove(&p) {
            self.zeroed(lk.seen, lk.given);
            let net = i128::from(lk.seen) - i128::from(lk.given);
            self.base = i64::try_from(i128::from(self.base) + net).unwrap_or(if net > 0 {
                i64::MAX
            } else {
                i64::MIN
            });
        }
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

/// What may be enforced of a share `own` under a lease in `state` (see [`Fallback`]).
fn cap_under(state: LeaseState, fallback: Fallback, reservation: u64, own: u64) -> u64 {
    match (state, fallback) {
        (LeaseState::Valid | LeaseState::Expiring, _) | (_, Fallback::LastShare) => own,
        (LeaseState::Expired, _) => own.min(reservation),
    }
}

/// One node. See the module documentation for the protocol.
#[derive(Debug, Clone)]
pub struct Node {
    cfg: Config,
    /// The members, sorted (the quorums are made of them).
    members: Vec<NodeId>,
    /// Their digest, in every message we send ([`Message::members`]).
    members_digest: u64,
    /// Messages ignored because their sender has other members.
    refused_membership: u64,
    inc: u64,
    lifecycle: Lifecycle,
    /// What a key without state holds here: the start holding (initial share or
    /// reservation) plus what audits minted here.
    default_base: u64,
    reservation: u64,
    links: SmallMap<NodeId, Link>,
    keys: BTreeMap<Key, KeyState>,
    /// When this incarnation started (our clock).
    started: Nanos,
    /// Until then we echo nobody and read for no audit (a restart's quarantine).
    quarantine_until: Nanos,
    /// The end of our lease as of the latest echo (our clock).
    lease_until: Nanos,
    /// This incarnation held a lease at some point.
    leased_once: bool,
    /// Votes to fence per node: per voter the highest incarnation it voted against.
    votes: BTreeMap<NodeId, BTreeMap<NodeId, u64>>,
    /// Dead floors: incarnations up to this one of the node are dead or fenced.
    dead: BTreeMap<NodeId, u64>,
    /// When the dead floor of a node that is neither a member nor us last moved here: it is
    /// told for `Config::forget_departed / 2`, and forgotten after `forget_departed` once
    /// no link with the node is left.
    departed: BTreeMap<NodeId, Nanos>,
    /// Bumped when `dead` changes: a link sends its floors when it has not sent this one.
    dead_version: u32,
    /// Bumped when a base changes (a fold, a retirement, a mint): an audit reading is the
    /// same only if this is.
    base_version: u64,
    /// Keys whose retirement we confirm in our next message to each peer ("Idle keys"):
    /// rare, so kept here rather than in every link.
    confirms: BTreeMap<NodeId, BTreeSet<Key>>,
    /// Retirement nets we folded out of our bases as the giver ("Idle keys"), by `(peer,
    /// key)`, until the peer confirms it folded them in: the audit counts them as ours
    /// meanwhile.
    pending_folds: BTreeMap<(NodeId, Key), u64>,
    leave_started: Option<Nanos>,
    outbox: Vec<Outgoing>,
    /// The latest tick's time (creation time before the first).
    last_tick: Nanos,
    /// Keys reclaimed since the last [`Node::ready`].
    reclaimed: Vec<Key>,
    /// [`Node::usable`] as last worked out, while it still holds (see [`UsableCache`]).
    usable_cache: Option<UsableCache>,
    /// Our part in the capacity audit (see `audit`).
    audit: audit::AuditState,
    /// Joins, leaves and fences seen (see [`Node::membership`]).
    changes: membership::Changes,
    /// Numbers the changes of keys' entries (`KeyState::changed`), increasing.
    change_seq: u64,
    /// Keys refused state because `Config::max_keys` were held (counted at every refusal).
    refused: u64,
    /// Keys made quiet early because `Config::max_keys` were held.
    evicted: u64,
    /// Keys given state over the cap because an entry for them held capacity (`cap`).
    over_cap: u64,
    /// Dead floors heard for our own id above our incarnation (`quorum`).
    id_conflicts: u64,
}

/// The usable neighbours worked out at `at`, valid for any `now` in `[at, until]` unless a
/// link changes first. Walking every link for it was a tenth of a 1,000-node run: it is
/// asked for on every message. Why it holds: time passing only takes links out (a link is
/// usable while `now − last_recv ≤ 2 cycles`, and `until` is when the first one listed
/// expires); everything else that can change the answer (a link's incarnation, lifecycle,
/// neighbour flag, weight or receipt, a new link, a fold or reincarnation) drops the cache
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
        let reservation = if member { cfg.reservation(cfg.id) } else { 0 };
        let fresh = cfg.incarnation == 1;
        let default_base = if fresh && member {
            cfg.initial_share(cfg.id)
        } else {
            reservation
        };
        let mut links = SmallMap::new();
        for &(peer, weight) in &cfg.links {
            links.insert(peer, Self::new_link(&cfg, weight, now, true));
        }
        if cfg.leases == Leases::Quorum {
            for m in cfg.sorted_members() {
                if m != cfg.id && !links.contains_key(&m) {
                    links.insert(m, Self::new_link(&cfg, 0.0, now, false));
                }
            }
        }
        let mut node = Self {
            members: cfg.sorted_members(),
            members_digest: wire::members_digest(&cfg.members),
            refused_membership: 0,
            inc: cfg.incarnation,
            lifecycle: if member {
                Lifecycle::Active
            } else {
                Lifecycle::Joining
            },
            default_base,
            reservation,
            links,
            keys: BTreeMap::new(),
            started: now,
            quarantine_until: if fresh {
                now
            } else {
                now + quorum::quarantine(&cfg)
            },
            lease_until: 0,
            leased_once: false,
            votes: BTreeMap::new(),
            dead: BTreeMap::new(),
            departed: BTreeMap::new(),
            dead_version: 0,
            base_version: 0,
            confirms: BTreeMap::new(),
            pending_folds: BTreeMap::new(),
            leave_started: None,
            outbox: Vec::new(),
            last_tick: now,
            reclaimed: Vec::new(),
            usable_cache: None,
            audit: audit::AuditState::new(&cfg),
            changes: membership::Changes::default(),
            change_seq: 0,
            refused: 0,
            evicted: 0,
            over_cap: 0,
            id_conflicts: 0,
            cfg,
        };
        node.own_past_is_dead(now);
        node.refresh_lease(now);
        Ok(node)
    }

    fn new_link(cfg: &Config, weight: f64, now: Nanos, neighbour: bool) -> Link {
        let pacing = if neighbour {
            cfg.pacing
                .and_then(|s| TokenAccount::new(s, cfg.cycle, now).ok())
        } else {
            None
        };
        Link {
            weight,
            inc: 0,
            last_recv: None,
            echo: 0,
            echoed: 0,
            indicator_at: 0,
            lifecycle: Lifecycle::Joining,
            pacing,
            neighbour,
            floor: 0,
            opened: 0,
            last_sent: 0,
            delta: Box::default(),
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
        if now >= self.lease_until {
            LeaseState::Expired
        } else if now.saturating_add(self.cfg.lease / 4) >= self.lease_until {
            LeaseState::Expiring
        } else {
            LeaseState::Valid
        }
    }

    /// The end of the lease on shared capacity (this node's clock): the first instant
    /// [`Node::lease_state`] reads `Expired`, unless an echo renews it first; in the past
    /// once expired. `None` when no lease applies ([`Leases::Off`]). Drivers arm a timer at
    /// it.
    #[must_use]
    pub fn lease_until(&self) -> Option<Nanos> {
        (self.cfg.leases == Leases::Quorum).then_some(self.lease_until)
    }

    /// Until when this incarnation is in quarantine (see the module docs): it echoes nobody
    /// before then. In the past once over.
    #[must_use]
    pub fn quarantine_until(&self) -> Nanos {
        self.quarantine_until
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

    /// The state of the link to `peer` at `now` (`None` if neither a neighbour nor a
    /// member).
    #[must_use]
    pub fn link_state(&self, peer: NodeId, now: Nanos) -> Option<LinkState> {
        let l = self.links.get(&peer)?;
        Some(match l.last_recv {
            Some(t) if now.saturating_sub(t) <= 2 * self.cfg.cycle => LinkState::Up,
            Some(t) if now.saturating_sub(t) <= self.cfg.lease => LinkState::Suspect,
            _ => LinkState::Down,
        })
    }

    /// The incarnation of `peer` our link is with (0: none).
    #[must_use]
    pub fn peer_incarnation(&self, peer: NodeId) -> u64 {
        self.links.get(&peer).map_or(0, |l| l.inc)
    }

    /// Messages ignored because their sender stated other voting members
    /// ([`Message::members`]): a node started with another member list.
    #[must_use]
    pub fn refused_membership(&self) -> u64 {
        self.refused_membership
    }

    /// The share held for `key` (what the ledger says; enforced or not).
    #[must_use]
    pub fn own(&self, key: Key) -> u64 {
        match self.lifecycle {
            Lifecycle::Left => 0,
            _ => self.keys.get(&key).map_or(self.default_base, KeyState::own),
        }
    }

    /// The limit enforced for `key` at `now` (see [`Fallback`]): the lease is read against
    /// `now` at every call, not only at ticks.
    #[must_use]
    pub fn enforced(&self, key: Key, now: Nanos) -> u64 {
        if self.lifecycle == Lifecycle::Left {
            return 0;
        }
        self.cap(self.own(key), now)
    }

    /// The limit enforced for keys this node has no state for.
    #[must_use]
    pub fn default_enforced(&self, now: Nanos) -> u64 {
        match self.lifecycle {
            Lifecycle::Left => 0,
            _ => self.cap(self.default_base, now),
        }
    }

    /// What may be enforced of a share `own` at `now`.
    fn cap(&self, own: u64, now: Nanos) -> u64 {
        cap_under(
            self.lease_state(now),
            self.cfg.fallback,
            self.reservation,
            own,
        )
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

    /// Retirement folds we made as the net giver that the peer has not confirmed yet ("Idle
    /// keys"): each ends with the peer's confirmation.
    #[must_use]
    pub fn fold_records(&self) -> usize {
        self.pending_folds.len()
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
        let rise = self.cfg.demand_rise_tau.unwrap_or(tau);
        self.keys.entry(key).or_insert_with(|| KeyState {
            base,
            demand: DemandFilter::with_rise(tau, rise),
            links: SmallMap::new(),
            seen_sum: 0,
            given_sum: 0,
            enforced: None,
            idle_since: None,
            quiet: false,
            changed: 0,
            sent: false,
            advert: None,
        })
    }

    /// The demand (rate, capacity units) measured for `key` over the interval ending `now`.
    /// Report every key of [`Node::active_keys`] each cycle, zero included: the estimate only
    /// moves when observed. With [`Config::idle_after`] set, a zero for a key without state
    /// creates none; with [`Config::max_keys`] held, no new key gets state (it stays on the
    /// static split, see [`Node::refused_keys`]).
    pub fn set_demand(&mut self, now: Nanos, key: Key, rate: f64) {
        // No demand for a key without state is what no state already says: keep it that way
        // (a reclaimed key must not come back because the driver reports zeros).
        if self.cfg.idle_after.is_some() && rate < 1.0 && !self.keys.contains_key(&key) {
            return;
        }
        if self.refuse_new(key) {
            return;
        }
        self.key_mut(key).demand.observe_rate(now, rate);
    }

    /// `count` arrivals for `key` since the previous observation.
    pub fn observe_arrivals(&mut self, now: Nanos, key: Key, count: u64) {
        if self.cfg.idle_after.is_some() && count == 0 && !self.keys.contains_key(&key) {
            return;
        }
        if self.refuse_new(key) {
            return;
        }
        let period = self.cfg.cycle;
        self.key_mut(key)
            .demand
            .observe_arrivals(now, count, period);
    }

    /// Drains what to do: messages to send and changed enforced limits.
    pub fn ready(&mut self, now: Nanos) -> Ready {
        let mut limits = Vec::new();
        // `enforced` for every key in one pass (the lease read once, no lookup per key): the
        // driver calls this after every message.
        let left = self.lifecycle == Lifecycle::Left;
        let (state, fallback, reservation) =
            (self.lease_state(now), self.cfg.fallback, self.reservation);
        for (&k, ks) in &mut self.keys {
            let e = if left {
                0
            } else {
                cap_under(state, fallback, reservation, ks.own())
            };
            if ks.enforced != Some(e) {
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

    /// One cycle: votes and fences, the audit, gifts by the law, messages. `draw` returns
    /// uniform random numbers in `[0, 1)` (used by randomized pacing).
    pub fn tick(&mut self, now: Nanos, draw: &mut dyn FnMut() -> f64) {
        self.last_tick = self.last_tick.max(now);
        if self.lifecycle == Lifecycle::Left {
            return;
        }
        self.fail_over(now);
        self.audit_tick(now);
        self.update_quiet(now);
        // Nothing below changes which neighbours are usable (gifts and sends touch counters,
        // not a link's incarnation, lifecycle or last receipt): work it out once.
        let usable = self.usable(now);
        let leased = self.lease_state(now) != LeaseState::Expired;
        match self.lifecycle {
            Lifecycle::Active if leased => {
                self.give(now, &usable);
                self.level_give(&usable);
                self.propose_retirements();
                self.reclaim(&usable);
            }
            Lifecycle::Leaving if leased => self.hand_over(&usable),
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
        let mut peers = StackVec::<NodeId, 16>::new();
        peers.extend(self.links.keys().copied());
        for &p in peers.iter() {
            let Some(link) = self.links.get_mut(&p) else {
                continue;
            };
            let must = self.confirms.contains_key(&p) || link.delta.dead_sent != self.dead_version;
            let mut paced = match (&mut link.pacing, link.neighbour) {
                (Some(acc), true) => acc.on_tick(now, draw()),
                // Leases and fences need every member every cycle.
                _ => true,
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
        let link = self.links.entry(peer).or_insert_with(|| Link {
            opened: now.max(1),
            ..Self::new_link(cfg, cfg.join_weight, now, neighbour)
        });
        if neighbour && !link.neighbour {
            link.neighbour = true;
            link.pacing = cfg
                .pacing
                .and_then(|s| TokenAccount::new(s, cfg.cycle, now).ok());
        }
        link
    }
}
