//! Messages between nodes and their compact binary encoding.
//!
//! One [`Message`] per link and send carries every active key in one batch. Integers are
//! LEB128 varints, indicators `f32`. [`decode`] never panics: malformed input gives a
//! [`WireError`] (checked by a proptest on random bytes).

/// A node id.
pub type NodeId = u32;
/// A dynamic limit key (a hashed IP, a tenant id).
pub type Key = u64;

/// 2: settlement replies name the replier's incarnation. 3: ledger neighbours, verdict
/// versions, `in_estate`. 4: late folds and their acknowledgements. 5: ward handovers and
/// their acknowledgements (header flag bit 5; absent, they cost nothing). 6: the census of a
/// restarted cluster (header flag bit 6, idem). 7: the census claims a level (hops known
/// pristine) instead of a view digest, so it works on any connected graph. 8: level
/// requests, unbalanced folds. 9: a ward handover says what it hands over
/// ([`HandoverKind`]) and whether the ward was leaving; a ledger lists its settlements
/// under way ([`Ledger::settling`]). 10: a settlement reply says whether the replier
/// incarnation was the first of its node to link with the dead one ([`SettleReply::first`])
/// and whether its later incarnations exchanged nothing with it
/// ([`SettleReply::later_empty`]). 11: the capacity audit ([`Audit`]; header flag bit 6 now
/// says an extension byte follows the last list: its bit 0 a census claim, bit 1 an audit
/// field) and minted holdings ([`Part::Minted`]).
const VERSION: u8 = 11;

/// A node's lifecycle (membership, issue item 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// Started; has not heard from a neighbour yet.
    Joining,
    /// Taking part in the law.
    Active,
    /// Handing its capacity to its heir before leaving.
    Leaving,
    /// Gone; holds nothing.
    Left,
}

/// Which part of a node's initial share of every key a holding covers (see
/// [`crate::node`] "Holdings").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// The node's whole initial share (an original member's first incarnation).
    Full,
    /// Only its reservation (a restarted node; a node that joined later holds 0).
    ReserveOnly,
    /// The initial share minus the reservation (what an heir inherits).
    ShareOnly,
    /// Capacity a capacity audit found lost and minted again (see [`crate::node`], "The
    /// capacity audit"): this many units of every key. `Holding::node` is the minter.
    Minted(u64),
}

/// One entry of a holdings list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holding {
    /// Whose initial share.
    pub node: NodeId,
    /// Which part of it.
    pub part: Part,
}

/// The sender's whole ledger, sent to its heir (seed 003 §IV "inform node b_i of its rate").
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ledger {
    /// Monotone version (bumped when a base changes); the heir acknowledges it.
    pub version: u64,
    /// Default base of every key (initial shares held, own and inherited).
    pub holdings: Vec<Holding>,
    /// Keys whose base differs from the default (after inheriting), with the base.
    pub bases: Vec<(Key, i64)>,
    /// The sender's neighbours (whom the heir asks to settle), each with the incarnation its
    /// live link is with (0: none). Only that incarnation's answer covers the link: a later
    /// one cannot vouch for the counters of the one before (see [`SettleReply::prior`]).
    pub neighbours: Vec<(NodeId, u64)>,
    /// The sender's own wards (they need a new heir if the sender dies).
    pub wards: Vec<NodeId>,
    /// Incarnations the sender settled as heir (their estates are in its bases).
    pub settled: Vec<(NodeId, u64)>,
    /// Links `(peer, peer incarnation)` the sender froze and folded into its bases: its heir
    /// must not count them again from the peer's side.
    pub folded: Vec<(NodeId, u64)>,
    /// Retirements the sender matched as the net giver, folding the net out of its base,
    /// that the peer has not confirmed yet (see [`crate::node`] "Idle keys").
    pub pending_folds: Vec<PendingFold>,
    /// Retirements the sender folded as the net receiver, `(peer, peer incarnation, key,
    /// seen)`, listed until the peer no longer holds them pending: a heir settling the
    /// sender knows its base has the net, so a [`SettleReply::pending`] of the peer for
    /// that fold adds nothing.
    pub received_folds: Vec<(NodeId, u64, Key, u64)>,
    /// Settlements the sender has started and not finished, each with the dead ward's
    /// ledger (as the sender reads it: links whose late folds it took are folded into its
    /// bases). A heir settling the sender takes them over: the sender's bases do not hold
    /// their estates yet (settlement rule 11). Only in a ledger sent to the heir; a ledger
    /// listed here has none of its own (one level).
    pub settling: Vec<Settling>,
}

/// A settlement under way, in a [`Ledger`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Settling {
    /// The dead ward.
    pub ward: NodeId,
    /// Its dead incarnation.
    pub incarnation: u64,
    /// The ward was leaving (its estate includes its reservation).
    pub leaving: bool,
    /// The ward's ledger.
    pub ledger: Ledger,
    /// The sender's own answer for its link with the ward, when it is a neighbour of the
    /// ward: it froze the link when it started, so its side is in its own bases, and whoever
    /// takes the settlement over counts these counters as any neighbour's answer (nobody
    /// else can give them once the sender is dead).
    pub side: Option<SettleReply>,
}

/// A fold the sender made as a retirement's net giver and the peer may not have made yet: its
/// base is already lower by `net`, and the peer's counters still hold it until the peer folds
/// too. A heir settling the sender adds `net` back exactly when the peer's answer shows it did
/// not (its `seen` from the sender is still `seen`: after folding it starts again from zero,
/// and the sender gives nothing on that key and link until its heir holds a ledger without
/// this record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingFold {
    /// The peer.
    pub peer: NodeId,
    /// The peer's incarnation the link is with.
    pub peer_incarnation: u64,
    /// The key.
    pub key: Key,
    /// What the sender had given the peer when it folded (the peer's `seen` until it folds).
    pub seen: u64,
    /// The net the sender folded out of its base.
    pub net: u64,
}

/// Bit of [`KeyEntry::relay_hops`] marking a level request (see [`crate::node`] "Idle keys").
pub const LEVEL_REQUEST: u8 = 0x40;

/// Per-key state of the link, as the sender sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyEntry {
    /// The key.
    pub key: Key,
    /// Cumulative capacity the sender ever gave the receiver on this key (monotone).
    pub given: u64,
    /// Cumulative capacity the sender has received from the receiver (an acknowledgement).
    pub seen: u64,
    /// The sender's performance indicator `p`.
    pub indicator: f32,
    /// Case IV bound: the sender's share reached its demand.
    pub saturated: bool,
    /// Relay request: capacity the sender asks the receiver to send it now, in capacity
    /// units — its own unmet demand or a share of a request it relays (0: none). See
    /// [`crate::node`] "Relay".
    pub relay: f32,
    /// Hops from the node whose unmet demand the relay request carries (0: the sender's own),
    /// in the low six bits; bit 6 ([`LEVEL_REQUEST`]) marks a *level request* instead: the
    /// key is quiet at the sender, which asks for what it (or a quiet node behind it) lacks
    /// of its static split (see [`crate::node`] "Idle keys").
    pub relay_hops: u8,
    /// The key has been idle at the sender for `Config::idle_after` (see [`crate::node`]
    /// "Idle keys").
    pub idle: bool,
}

/// A neighbour's final counters with a dead incarnation, for its heir.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SettleReply {
    /// The dead node.
    pub dead: NodeId,
    /// Its dead incarnation.
    pub incarnation: u64,
    /// The replier's incarnation whose link with the dead one these counters are. Usually
    /// the sender's current one; an older one when the replier was itself declared dead and
    /// reincarnated after freezing the link. The heir needs it to tell whether the dead node
    /// already folded this very link into its base (`Ledger::folded`).
    pub replier_incarnation: u64,
    /// The incarnation the replier incarnation directly follows, when the replier knows it
    /// exactly (`Some(0)`: it is the first). For a neighbour the dead node had no live link
    /// with (as of its last ledger), the heir takes the answer only if the dead node folded
    /// its link with that previous incarnation (or there was none): then no incarnation in
    /// between can have exchanged capacity with it.
    pub prior: Option<u64>,
    /// No incarnation of the replier before `replier_incarnation` ever linked with the dead
    /// incarnation, and the replier knows every one of them (its chain of `prior`s reaches
    /// 0): for a neighbour the dead node had no live link with, nothing in between can
    /// have exchanged capacity with it either.
    pub first: bool,
    /// No incarnation of the replier after `replier_incarnation` exchanged anything with
    /// the dead incarnation: a later link the dead node's ledger names carried nothing.
    pub later_empty: bool,
    /// The replier's side of this link is in its own accounts: folded into a ledger its
    /// heir holds, or it is alive and keeps it. `false` from a reincarnated replier whose
    /// old incarnation froze the link after the ledger its heir settled it with (or that
    /// does not know which ledger that was): counting these counters for the dead node
    /// would count the link on both sides, so the heir uses them only where the dead node
    /// folded the link itself (and then ignores them), and otherwise waits.
    pub in_estate: bool,
    /// Per key: `(key, F = given to the dead, S = received from the dead)`.
    pub entries: Vec<(Key, u64, u64)>,
    /// The replier's pending folds with the dead incarnation, `(key, seen, net)` (see
    /// [`PendingFold`]): it folded `net` out of its base for the dead node, which held it in
    /// its counters until it folded too. The heir adds `net` to the estate unless the dead
    /// node's ledger lists that fold among its [`Ledger::received_folds`].
    pub pending: Vec<(Key, u64, u64)>,
}

/// From a reincarnated node to the heir that settled its dead incarnation: "that
/// incarnation froze its link with `peer`'s incarnation `peer_incarnation` after the ledger
/// you settled it with; here is its side of the link" (a *late fold*, see [`crate::node`],
/// "Settlements across a multi-node cut"). Offered until acknowledged.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LateFold {
    /// The sender's dead incarnation.
    pub incarnation: u64,
    /// The other end of the link.
    pub peer: NodeId,
    /// Its incarnation the link was with.
    pub peer_incarnation: u64,
    /// Per key: `(key, given to the peer, received from the peer)` when the link was frozen.
    pub entries: Vec<(Key, u64, u64)>,
}

/// A heir's answer to a [`LateFold`]: taken into the estate (`accepted`) or not (the estate
/// counted the peer's side of the link instead, or is already final).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LateAck {
    /// The receiver's dead incarnation the offer was about.
    pub incarnation: u64,
    /// The other end of the link.
    pub peer: NodeId,
    /// Its incarnation.
    pub peer_incarnation: u64,
    /// Whether the estate holds the offered side of the link.
    pub accepted: bool,
}

/// From a reincarnated node to the heir that settled its dead incarnation: "that
/// incarnation was settling its ward `ward`'s incarnation `ward_incarnation`, which is dead,
/// and the ledger you settled it with holds neither the settlement's estate nor the ward;
/// here is the ward's ledger" (a *ward handover*, see [`crate::node`], "Settlements across a
/// multi-node cut", rules 9 and 10). Nobody else holds that ledger: without it the ward's
/// estate is lost. Offered until acknowledged.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Handover {
    /// The sender's dead incarnation.
    pub incarnation: u64,
    /// The dead ward.
    pub ward: NodeId,
    /// Its dead incarnation.
    pub ward_incarnation: u64,
    /// The ward's latest ledger the sender's dead incarnation held.
    pub ledger: Ledger,
    /// What the sender's dead incarnation had done with the settlement.
    pub kind: HandoverKind,
    /// The ward was leaving (its estate includes its reservation).
    pub leaving: bool,
}

/// What a [`Handover`] hands over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandoverKind {
    /// A settlement the sender's dead incarnation had not finished: nothing of the estate
    /// is in its bases.
    #[default]
    Unfinished,
    /// A settlement it finished after the ledger version its heir settled it with: the
    /// estate went into its bases after that ledger, and what it gave away since may have
    /// come from it. The receiving heir counts this estate only once its own settlement of
    /// the sender's incarnation is in, less what that estate lacks (rule 10).
    Inherited,
}

/// A heir's answer to a [`Handover`]: the ward's settlement is its business now, or was
/// already (either way the sender stops offering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandoverAck {
    /// The receiver's dead incarnation the offer was about.
    pub incarnation: u64,
    /// The dead ward.
    pub ward: NodeId,
    /// Its dead incarnation.
    pub ward_incarnation: u64,
}

/// Everything one node tells a neighbour in one send.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Sender's incarnation (increases on restart and after being declared dead).
    pub from_inc: u64,
    /// The receiver's incarnation as the sender knows it (0: unknown).
    pub to_inc: u64,
    /// Sender's clock at send time (echoed back for leases; never compared across clocks).
    pub sent_at: u64,
    /// The latest `sent_at` the sender received from the receiver: the receiver's own clock.
    pub echo: u64,
    /// Sender's lifecycle.
    pub lifecycle: Lifecycle,
    /// The sender names the receiver its heir (and `ledger` is set, except in the later
    /// parts of a split message and while the sender is orphaned: rule 7).
    pub to_heir: bool,
    /// `keys` holds every key the sender has state for (a send that was not split): a key
    /// missing from it has no state at the sender, which is idle there (see [`crate::node`]
    /// "Idle keys": a neighbour that dropped a key sends no more entries saying it is idle).
    pub all_keys: bool,
    /// A later part of a split send: it repeats only the header, so the lists that go in the
    /// first part (ledger, settlement traffic, retirement lists) say nothing by their
    /// absence here (header flag bit 7).
    pub rest: bool,
    /// From an heir: "your incarnation N was declared dead and inherited" (0: none).
    pub dead_verdict: u64,
    /// With `dead_verdict`: the version of that incarnation's ledger the heir settles it
    /// with (`None`: unknown; on the wire 0, else version + 1). Links the dead incarnation
    /// froze after that version are not in its estate, so the reincarnated node answers
    /// settlements of them with [`SettleReply::in_estate`] false (see [`crate::node`],
    /// "Settlements across a multi-node cut").
    pub verdict_version: Option<u64>,
    /// Sender's ledger, for its heir.
    pub ledger: Option<Ledger>,
    /// All active keys.
    pub keys: Vec<KeyEntry>,
    /// Settlement requests `(dead node, incarnation)` from an heir.
    pub settle_requests: Vec<(NodeId, u64)>,
    /// Settlement replies to an heir.
    pub settle_replies: Vec<SettleReply>,
    /// "Your heir `(node, incarnation)` was declared dead; I, its heir, replace it."
    pub succession: Option<(NodeId, u64)>,
    /// From an heir: the version of the receiver's ledger it holds.
    pub ledger_ack: u64,
    /// Idle-key retirement proposals `(key, given, seen)`: the sender's counters on this link
    /// for the key, frozen, with `seen ≥ given` (the sender is the link's net receiver, or
    /// it is balanced). The peer matches only if its own are the mirror image, folds the
    /// net into its base and acknowledges once its heir holds that base (see
    /// [`crate::node`] "Idle keys").
    pub retire: Vec<(Key, u64, u64)>,
    /// Acknowledgements `(key, sent_at of the proposal matched)`: the sender reset its
    /// counters for the key to zero.
    pub retired: Vec<(Key, u64)>,
    /// Confirmations: the sender reset its counters for these keys after an
    /// acknowledgement (it sends none older than this message any more).
    pub confirm: Vec<Key>,
    /// Late folds offered to the heir that settled one of the sender's dead incarnations.
    pub late_folds: Vec<LateFold>,
    /// Answers to the receiver's late folds.
    pub late_acks: Vec<LateAck>,
    /// Ward handovers offered to the heir that settled one of the sender's dead incarnations.
    pub handovers: Vec<Handover>,
    /// Answers to the receiver's ward handovers.
    pub handover_acks: Vec<HandoverAck>,
    /// The sender's census claim, if it makes one (see [`Census`]).
    pub census: Option<Census>,
    /// The sender's part in a capacity audit, when the receiver still needs it (see
    /// [`Audit`]).
    pub audit: Option<Box<Audit>>,
}

/// A wave of a capacity audit (see [`crate::node`], "The capacity audit"). Waves are the
/// echo algorithm: a node joins the highest wave it hears of, from the neighbour it first
/// hears it from (its *parent*), and reports to that parent once every other neighbour is
/// in the wave too (those that took it as their parent with their own reports).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Audit {
    /// The wave: the root's incarnation, the round, the phase (ordered as a tuple).
    pub wave: Wave,
    /// The sender took the receiver as its parent in this wave.
    pub child: bool,
    /// The sender has the receiver accounted for in this wave (as a child with its report,
    /// or as a neighbour in the wave): the receiver need not tell it again.
    pub ack: bool,
    /// The sender needs nothing more from the receiver in this wave (it has it accounted and
    /// holds its `ack`): no answer is asked for.
    pub done: bool,
    /// To the parent: the sender's whole subtree, once complete.
    pub report: Option<AuditReport>,
    /// The sender's fence: incarnations `(node, v)` below `v` of `node` are dead and their
    /// estates are counted by no one any more (a confirmed wave carries the root's).
    pub fence: Vec<(NodeId, u64)>,
}

/// Which wave of the audit (see [`Audit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Wave {
    /// The root's incarnation (a restarted root starts above its old waves).
    pub root_inc: u64,
    /// The round, counted by that incarnation of the root.
    pub round: u64,
    /// `false`: gather (each node reads what it holds); `true`: confirm (each node installs
    /// the fence and says whether what it read is still what it holds).
    pub confirm: bool,
}

/// A subtree's report (see [`Audit`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditReport {
    /// Every node of the subtree could read (gather) or still holds what it read (confirm).
    pub ok: bool,
    /// Gather: a node of the subtree started a settlement lately; the root lets it finish
    /// rather than fence it (an audit is for capacity nobody will bring back).
    pub busy: bool,
    /// Gather: `Σ` default bases (what a key without state is worth at each node).
    pub defaults: u64,
    /// Gather: per key, `Σ (base + pending fold nets − default base)` over the nodes with
    /// state for it.
    pub devs: Vec<(Key, i64)>,
    /// Gather: the incarnation of every node of the subtree past its first.
    pub incs: Vec<(NodeId, u64)>,
    /// Gather: the members of the subtree, a bit each (bit `i` of byte `i / 8` for the
    /// `i`-th lowest member id).
    pub members: Vec<u8>,
    /// Gather: incarnations `(node, incarnation)` that left the cluster, and that neighbours
    /// of theirs in the subtree froze their links with.
    pub excluded: Vec<(NodeId, u64)>,
}

/// A claim about a restarted cluster (see [`crate::node`], "Re-minting after a whole-cluster
/// restart"). It speaks of the sender's incarnation (`Message::from_inc`) and of the
/// receiver's as the sender knows it (`Message::to_inc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    /// With `reminted` false: the sender is *pristine* (a restarted node that holds its
    /// reservation and nothing else, never gave nor received, and keeps nothing of any other
    /// incarnation), and so is every node within `level − 1` hops of it, each as its
    /// neighbours know it.
    pub level: u16,
    /// The sender took its initial share back (every node was pristine) and its links are
    /// with the incarnations they were with then; a member that has not yet may too.
    pub reminted: bool,
}

impl Default for Message {
    /// An empty message (no keys, nothing to settle) from and to unknown incarnations: a
    /// buffer for [`decode_into`].
    fn default() -> Self {
        Self {
            from_inc: 0,
            to_inc: 0,
            sent_at: 0,
            echo: 0,
            lifecycle: Lifecycle::Joining,
            to_heir: false,
            all_keys: false,
            rest: false,
            dead_verdict: 0,
            verdict_version: None,
            ledger: None,
            keys: Vec::new(),
            settle_requests: Vec::new(),
            settle_replies: Vec::new(),
            succession: None,
            ledger_ack: 0,
            retire: Vec::new(),
            retired: Vec::new(),
            confirm: Vec::new(),
            late_folds: Vec::new(),
            late_acks: Vec::new(),
            handovers: Vec::new(),
            handover_acks: Vec::new(),
            census: None,
            audit: None,
        }
    }
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input ended inside a field.
    #[error("message truncated at byte {0}")]
    Truncated(usize),
    /// Unknown protocol version.
    #[error("unsupported message version {0}")]
    Version(u8),
    /// A varint longer than 10 bytes or above the field's range.
    #[error("integer out of range at byte {0}")]
    Overflow(usize),
    /// An enum tag out of range.
    #[error("invalid tag {tag} at byte {at}")]
    Tag {
        /// The tag.
        tag: u8,
        /// Where.
        at: usize,
    },
    /// A count larger than the remaining input could hold.
    #[error("count {0} larger than the message")]
    Count(u64),
    /// A non-finite indicator, or a relay request that is not positive and finite.
    #[error("indicator or relay request is not finite (or not positive) at byte {0}")]
    NonFinite(usize),
    /// Bytes left after the message.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

/// Encodes a message.
#[must_use]
pub fn encode(m: &Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + m.keys.len() * 12);
    write(m, &mut out);
    out
}

/// Appends the encoding of `m` to `out` (what [`encode`] returns), so a sender can put
/// many messages into one buffer instead of allocating one per message.
pub fn encode_into(m: &Message, out: &mut Vec<u8>) {
    out.reserve(32 + m.keys.len() * 12);
    write(m, out);
}

/// Where [`write`] puts bytes: a buffer, or a counter. One writer for both keeps
/// [`encoded_len`] exact by construction, without building the bytes.
trait Sink {
    fn push(&mut self, b: u8);
    fn extend_from_slice(&mut self, b: &[u8]);
}

impl Sink for Vec<u8> {
    fn push(&mut self, b: u8) {
        Vec::push(self, b);
    }

    fn extend_from_slice(&mut self, b: &[u8]) {
        Vec::extend_from_slice(self, b);
    }
}

/// Counts the bytes written.
struct Count(usize);

impl Sink for Count {
    fn push(&mut self, _: u8) {
        self.0 += 1;
    }

    fn extend_from_slice(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
}

fn write<S: Sink>(m: &Message, out: &mut S) {
    // Ward handovers are rare: their two lists are written only when flagged (bit 5), so
    // the usual message pays nothing for them.
    let handovers = !(m.handovers.is_empty() && m.handover_acks.is_empty());
    out.push(VERSION);
    for v in [
        m.from_inc,
        m.to_inc,
        m.sent_at,
        m.echo,
        m.dead_verdict,
        m.verdict_version.map_or(0, |v| v.saturating_add(1)),
        m.ledger_ack,
    ] {
        put(out, v);
    }
    let life = match m.lifecycle {
        Lifecycle::Joining => 0,
        Lifecycle::Active => 1,
        Lifecycle::Leaving => 2,
        Lifecycle::Left => 3,
    };
    out.push(
        life | (u8::from(m.to_heir) << 2)
            | (u8::from(m.ledger.is_some()) << 3)
            | (u8::from(m.all_keys) << 4)
            | (u8::from(handovers) << 5)
            | (u8::from(m.census.is_some() || m.audit.is_some()) << 6)
            | (u8::from(m.rest) << 7),
    );
    if let Some(l) = &m.ledger {
        put_ledger(out, l);
    }
    put(out, m.keys.len() as u64);
    for e in &m.keys {
        put(out, e.key);
        put(out, e.given);
        put(out, e.seen);
        out.extend_from_slice(&e.indicator.to_le_bytes());
        // Flags: bit 0 saturated, bit 2 idle, bit 1 a relay request follows (absent when 0, so an
        // entry without one costs no extra byte).
        let relay = e.relay.is_finite() && e.relay > 0.0;
        out.push(u8::from(e.saturated) | (u8::from(relay) << 1) | (u8::from(e.idle) << 2));
        if relay {
            out.extend_from_slice(&e.relay.to_le_bytes());
            out.push(e.relay_hops);
        }
    }
    put(out, m.settle_requests.len() as u64);
    for &(n, inc) in &m.settle_requests {
        put(out, u64::from(n));
        put(out, inc);
    }
    put(out, m.settle_replies.len() as u64);
    for r in &m.settle_replies {
        put_reply(out, r);
    }
    match m.succession {
        None => out.push(0),
        Some((n, inc)) => {
            out.push(1);
            put(out, u64::from(n));
            put(out, inc);
        }
    }
    put_triples(out, &m.retire);
    put(out, m.retired.len() as u64);
    for &(k, v) in &m.retired {
        put(out, k);
        put(out, v);
    }
    put(out, m.confirm.len() as u64);
    for &k in &m.confirm {
        put(out, k);
    }
    put(out, m.late_folds.len() as u64);
    for f in &m.late_folds {
        put(out, f.incarnation);
        put(out, u64::from(f.peer));
        put(out, f.peer_incarnation);
        put_triples(out, &f.entries);
    }
    put(out, m.late_acks.len() as u64);
    for a in &m.late_acks {
        put(out, a.incarnation);
        put(out, u64::from(a.peer));
        put(out, a.peer_incarnation);
        out.push(u8::from(a.accepted));
    }
    if handovers {
        put(out, m.handovers.len() as u64);
        for h in &m.handovers {
            put(out, h.incarnation);
            put(out, u64::from(h.ward));
            put(out, h.ward_incarnation);
            put_ledger(out, &h.ledger);
            let kind = match h.kind {
                HandoverKind::Unfinished => 0u8,
                HandoverKind::Inherited => 1,
            };
            out.push(kind | (u8::from(h.leaving) << 1));
        }
        put(out, m.handover_acks.len() as u64);
        for a in &m.handover_acks {
            put(out, a.incarnation);
            put(out, u64::from(a.ward));
            put(out, a.ward_incarnation);
        }
    }
    if m.census.is_some() || m.audit.is_some() {
        out.push(
            u8::from(m.census.is_some())
                | (u8::from(m.audit.is_some()) << 1)
                | (u8::from(m.census.is_some_and(|c| c.reminted)) << 2),
        );
        if let Some(c) = m.census {
            put(out, u64::from(c.level));
        }
        if let Some(a) = &m.audit {
            put_audit(out, a);
        }
    }
}

fn put_audit<S: Sink>(out: &mut S, a: &Audit) {
    put(out, a.wave.root_inc);
    put(out, a.wave.round);
    let ok = a.report.as_ref().is_some_and(|r| r.ok);
    out.push(
        u8::from(a.wave.confirm)
            | (u8::from(a.child) << 1)
            | (u8::from(a.ack) << 2)
            | (u8::from(a.report.is_some()) << 3)
            | (u8::from(ok) << 4)
            | (u8::from(a.report.as_ref().is_some_and(|r| r.busy)) << 5)
            | (u8::from(a.done) << 6),
    );
    put(out, a.fence.len() as u64);
    for &(n, v) in &a.fence {
        put(out, u64::from(n));
        put(out, v);
    }
    // A confirming report is its `ok` bit alone.
    if let Some(r) = a.report.as_ref().filter(|_| !a.wave.confirm) {
        put(out, r.defaults);
        put(out, r.devs.len() as u64);
        for &(k, d) in &r.devs {
            put(out, k);
            put(out, ((d << 1) ^ (d >> 63)) as u64);
        }
        put(out, r.incs.len() as u64);
        for &(n, v) in &r.incs {
            put(out, u64::from(n));
            put(out, v);
        }
        put(out, r.members.len() as u64);
        for &b in &r.members {
            out.push(b);
        }
        put(out, r.excluded.len() as u64);
        for &(n, v) in &r.excluded {
            put(out, u64::from(n));
            put(out, v);
        }
    }
}

/// A ledger, as in a message's header and in a [`Handover`].
fn put_reply<S: Sink>(out: &mut S, r: &SettleReply) {
    put(out, u64::from(r.dead));
    put(out, r.incarnation);
    put(out, r.replier_incarnation);
    let pending = !r.pending.is_empty();
    out.push(
        u8::from(r.prior.is_some())
            | (u8::from(r.in_estate) << 1)
            | (u8::from(pending) << 2)
            | (u8::from(r.first) << 3)
            | (u8::from(r.later_empty) << 4),
    );
    if let Some(p) = r.prior {
        put(out, p);
    }
    put_triples(out, &r.entries);
    if pending {
        put_triples(out, &r.pending);
    }
}

fn read_reply(r: &mut Reader<'_>) -> Result<SettleReply, WireError> {
    let dead = r.id()?;
    let incarnation = r.var()?;
    let replier_incarnation = r.var()?;
    let at = r.at;
    let flags = r.byte()?;
    if flags > 31 {
        return Err(WireError::Tag { tag: flags, at });
    }
    let in_estate = flags & 2 == 2;
    let first = flags & 8 == 8;
    let later_empty = flags & 16 == 16;
    let prior = if flags & 1 == 1 { Some(r.var()?) } else { None };
    let entries = r.triples()?;
    let pending = if flags & 4 == 4 {
        r.triples()?
    } else {
        Vec::new()
    };
    Ok(SettleReply {
        dead,
        incarnation,
        replier_incarnation,
        prior,
        first,
        later_empty,
        in_estate,
        entries,
        pending,
    })
}

fn put_ledger<S: Sink>(out: &mut S, l: &Ledger) {
    put_ledger_at(out, l, false);
}

/// A ledger; `nested` (one listed in another's `settling`) writes no settlements of its own.
fn put_ledger_at<S: Sink>(out: &mut S, l: &Ledger, nested: bool) {
    put(out, l.version);
    put(out, l.holdings.len() as u64);
    for h in &l.holdings {
        put(out, u64::from(h.node));
        match h.part {
            Part::Full => out.push(0),
            Part::ReserveOnly => out.push(1),
            Part::ShareOnly => out.push(2),
            Part::Minted(x) => {
                out.push(3);
                put(out, x);
            }
        }
    }
    put(out, l.bases.len() as u64);
    for &(k, b) in &l.bases {
        put(out, k);
        // Zigzag: small magnitudes of either sign stay short.
        put(out, ((b << 1) ^ (b >> 63)) as u64);
    }
    put(out, l.wards.len() as u64);
    for &n in &l.wards {
        put(out, u64::from(n));
    }
    for list in [&l.neighbours, &l.settled, &l.folded] {
        put(out, list.len() as u64);
        for &(n, inc) in list {
            put(out, u64::from(n));
            put(out, inc);
        }
    }
    put(out, l.pending_folds.len() as u64);
    for f in &l.pending_folds {
        put(out, u64::from(f.peer));
        put(out, f.peer_incarnation);
        put(out, f.key);
        put(out, f.seen);
        put(out, f.net);
    }
    put(out, l.received_folds.len() as u64);
    for &(n, inc, k, seen) in &l.received_folds {
        put(out, u64::from(n));
        put(out, inc);
        put(out, k);
        put(out, seen);
    }
    if nested {
        put(out, 0);
        return;
    }
    put(out, l.settling.len() as u64);
    for st in &l.settling {
        put(out, u64::from(st.ward));
        put(out, st.incarnation);
        out.push(u8::from(st.leaving) | (u8::from(st.side.is_some()) << 1));
        put_ledger_at(out, &st.ledger, true);
        if let Some(side) = &st.side {
            put_reply(out, side);
        }
    }
}

/// Decodes a message; never panics.
///
/// # Errors
/// A [`WireError`] saying what is wrong and where.
pub fn decode(bytes: &[u8]) -> Result<Message, WireError> {
    let mut m = Message::default();
    decode_into(bytes, &mut m)?;
    Ok(m)
}

/// [`decode`] into `out`, reusing its key list's buffer: a receiver that decodes every
/// message into one [`Message`] allocates nothing for the usual message. On error `out`
/// holds an unspecified (valid) message. Never panics.
///
/// # Errors
/// A [`WireError`] saying what is wrong and where.
pub fn decode_into(bytes: &[u8], out: &mut Message) -> Result<(), WireError> {
    let mut r = Reader { b: bytes, at: 0 };
    let v = r.byte()?;
    if v != VERSION {
        return Err(WireError::Version(v));
    }
    let from_inc = r.var()?;
    let to_inc = r.var()?;
    let sent_at = r.var()?;
    let echo = r.var()?;
    let dead_verdict = r.var()?;
    let verdict_version = r.var()?.checked_sub(1);
    let ledger_ack = r.var()?;
    let flags = r.byte()?;
    let rest = flags >> 7 != 0;
    let lifecycle = match flags & 3 {
        0 => Lifecycle::Joining,
        1 => Lifecycle::Active,
        2 => Lifecycle::Leaving,
        _ => Lifecycle::Left,
    };
    let to_heir = flags & 4 != 0;
    let all_keys = flags & 16 != 0;
    let ledger = if flags & 8 != 0 {
        Some(read_ledger(&mut r)?)
    } else {
        None
    };
    let n = r.count(8)?;
    let mut keys = std::mem::take(&mut out.keys);
    keys.clear();
    keys.reserve(n);
    for _ in 0..n {
        let key = r.var()?;
        let given = r.var()?;
        let seen = r.var()?;
        let at = r.at;
        let bits = r.take4()?;
        let indicator = f32::from_le_bytes(bits);
        if !indicator.is_finite() {
            return Err(WireError::NonFinite(at));
        }
        let at = r.at;
        let flags = r.byte()?;
        if flags > 7 {
            return Err(WireError::Tag { tag: flags, at });
        }
        let (relay, relay_hops) = if flags & 2 != 0 {
            let at = r.at;
            let relay = f32::from_le_bytes(r.take4()?);
            if !(relay.is_finite() && relay > 0.0) {
                return Err(WireError::NonFinite(at));
            }
            (relay, r.byte()?)
        } else {
            (0.0, 0)
        };
        keys.push(KeyEntry {
            key,
            given,
            seen,
            indicator,
            saturated: flags & 1 != 0,
            idle: flags & 4 != 0,
            relay,
            relay_hops,
        });
    }
    let n = r.count(2)?;
    let mut settle_requests = Vec::with_capacity(n);
    for _ in 0..n {
        settle_requests.push((r.id()?, r.var()?));
    }
    let n = r.count(5)?;
    let mut settle_replies = Vec::with_capacity(n);
    for _ in 0..n {
        settle_replies.push(read_reply(&mut r)?);
    }
    let at = r.at;
    let succession = match r.byte()? {
        0 => None,
        1 => Some((r.id()?, r.var()?)),
        tag => return Err(WireError::Tag { tag, at }),
    };
    let retire = r.triples()?;
    let n = r.count(2)?;
    let mut retired = Vec::with_capacity(n);
    for _ in 0..n {
        retired.push((r.var()?, r.var()?));
    }
    let n = r.count(1)?;
    let mut confirm = Vec::with_capacity(n);
    for _ in 0..n {
        confirm.push(r.var()?);
    }
    let n = r.count(4)?;
    let mut late_folds = Vec::with_capacity(n);
    for _ in 0..n {
        let incarnation = r.var()?;
        let peer = r.id()?;
        let peer_incarnation = r.var()?;
        let entries = r.triples()?;
        late_folds.push(LateFold {
            incarnation,
            peer,
            peer_incarnation,
            entries,
        });
    }
    let n = r.count(4)?;
    let mut late_acks = Vec::with_capacity(n);
    for _ in 0..n {
        let incarnation = r.var()?;
        let peer = r.id()?;
        let peer_incarnation = r.var()?;
        let at = r.at;
        let accepted = match r.byte()? {
            0 => false,
            1 => true,
            tag => return Err(WireError::Tag { tag, at }),
        };
        late_acks.push(LateAck {
            incarnation,
            peer,
            peer_incarnation,
            accepted,
        });
    }
    let mut handovers = Vec::new();
    let mut handover_acks = Vec::new();
    if flags & 32 != 0 {
        let n = r.count(7)?;
        handovers.reserve(n);
        for _ in 0..n {
            let incarnation = r.var()?;
            let ward = r.id()?;
            let ward_incarnation = r.var()?;
            let ledger = read_ledger(&mut r)?;
            let at = r.at;
            let flags = r.byte()?;
            let kind = match flags & 1 {
                0 => HandoverKind::Unfinished,
                _ => HandoverKind::Inherited,
            };
            if flags & !3 != 0 {
                return Err(WireError::Tag { tag: flags, at });
            }
            handovers.push(Handover {
                incarnation,
                ward,
                ward_incarnation,
                ledger,
                kind,
                leaving: flags & 2 != 0,
            });
        }
        let n = r.count(3)?;
        handover_acks.reserve(n);
        for _ in 0..n {
            handover_acks.push(HandoverAck {
                incarnation: r.var()?,
                ward: r.id()?,
                ward_incarnation: r.var()?,
            });
        }
    }
    let (census, audit) = if flags & 64 != 0 {
        let at = r.at;
        let ext = r.byte()?;
        // Nothing set, or `reminted` without a census: not what any encoder writes.
        if ext & !7 != 0 || ext & 3 == 0 || ext & 5 == 4 {
            return Err(WireError::Tag { tag: ext, at });
        }
        let census = if ext & 1 != 0 {
            let at = r.at;
            let level = u16::try_from(r.var()?).map_err(|_| WireError::Overflow(at))?;
            Some(Census {
                level,
                reminted: ext & 4 != 0,
            })
        } else {
            None
        };
        let audit = if ext & 2 != 0 {
            Some(Box::new(read_audit(&mut r)?))
        } else {
            None
        };
        (census, audit)
    } else {
        (None, None)
    };
    if r.at != bytes.len() {
        return Err(WireError::Trailing(bytes.len() - r.at));
    }
    *out = Message {
        from_inc,
        to_inc,
        sent_at,
        echo,
        lifecycle,
        to_heir,
        all_keys,
        rest,
        dead_verdict,
        verdict_version,
        ledger,
        keys,
        settle_requests,
        settle_replies,
        succession,
        ledger_ack,
        retire,
        retired,
        confirm,
        late_folds,
        late_acks,
        handovers,
        handover_acks,
        census,
        audit,
    };
    Ok(())
}

fn read_audit(r: &mut Reader<'_>) -> Result<Audit, WireError> {
    let root_inc = r.var()?;
    let round = r.var()?;
    let at = r.at;
    let flags = r.byte()?;
    // `ok` or `busy` without a report: not what any encoder writes.
    if flags & !127 != 0 || (flags & 8 == 0 && flags & 48 != 0) {
        return Err(WireError::Tag { tag: flags, at });
    }
    let confirm = flags & 1 != 0;
    let n = r.count(2)?;
    let mut fence = Vec::with_capacity(n);
    for _ in 0..n {
        fence.push((r.id()?, r.var()?));
    }
    let report = if flags & 8 == 0 {
        None
    } else if confirm {
        Some(AuditReport {
            ok: flags & 16 != 0,
            busy: flags & 32 != 0,
            ..AuditReport::default()
        })
    } else {
        let defaults = r.var()?;
        let n = r.count(2)?;
        let mut devs = Vec::with_capacity(n);
        for _ in 0..n {
            let k = r.var()?;
            let z = r.var()?;
            devs.push((k, ((z >> 1) as i64) ^ -((z & 1) as i64)));
        }
        let n = r.count(2)?;
        let mut incs = Vec::with_capacity(n);
        for _ in 0..n {
            incs.push((r.id()?, r.var()?));
        }
        let n = r.count(1)?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(r.byte()?);
        }
        let n = r.count(2)?;
        let mut excluded = Vec::with_capacity(n);
        for _ in 0..n {
            excluded.push((r.id()?, r.var()?));
        }
        Some(AuditReport {
            ok: flags & 16 != 0,
            busy: flags & 32 != 0,
            defaults,
            devs,
            incs,
            members,
            excluded,
        })
    };
    Ok(Audit {
        wave: Wave {
            root_inc,
            round,
            confirm,
        },
        child: flags & 2 != 0,
        ack: flags & 4 != 0,
        done: flags & 64 != 0,
        report,
        fence,
    })
}

/// A ledger written by `put_ledger`.
fn read_ledger(r: &mut Reader<'_>) -> Result<Ledger, WireError> {
    read_ledger_at(r, false)
}

/// A ledger; `nested` (one listed in another's `settling`) may list no settlements.
fn read_ledger_at(r: &mut Reader<'_>, nested: bool) -> Result<Ledger, WireError> {
    let version = r.var()?;
    let n = r.count(2)?;
    let mut holdings = Vec::with_capacity(n);
    for _ in 0..n {
        let node = r.id()?;
        let at = r.at;
        let part = match r.byte()? {
            0 => Part::Full,
            1 => Part::ReserveOnly,
            2 => Part::ShareOnly,
            3 => Part::Minted(r.var()?),
            tag => return Err(WireError::Tag { tag, at }),
        };
        holdings.push(Holding { node, part });
    }
    let n = r.count(2)?;
    let mut bases = Vec::with_capacity(n);
    for _ in 0..n {
        let k = r.var()?;
        let z = r.var()?;
        bases.push((k, ((z >> 1) as i64) ^ -((z & 1) as i64)));
    }
    let n = r.count(1)?;
    let mut wards = Vec::with_capacity(n);
    for _ in 0..n {
        wards.push(r.id()?);
    }
    let n = r.count(2)?;
    let mut neighbours = Vec::with_capacity(n);
    for _ in 0..n {
        neighbours.push((r.id()?, r.var()?));
    }
    let n = r.count(2)?;
    let mut settled = Vec::with_capacity(n);
    for _ in 0..n {
        settled.push((r.id()?, r.var()?));
    }
    let n = r.count(2)?;
    let mut folded = Vec::with_capacity(n);
    for _ in 0..n {
        folded.push((r.id()?, r.var()?));
    }
    let n = r.count(5)?;
    let mut pending_folds = Vec::with_capacity(n);
    for _ in 0..n {
        pending_folds.push(PendingFold {
            peer: r.id()?,
            peer_incarnation: r.var()?,
            key: r.var()?,
            seen: r.var()?,
            net: r.var()?,
        });
    }
    let n = r.count(4)?;
    let mut received_folds = Vec::with_capacity(n);
    for _ in 0..n {
        received_folds.push((r.id()?, r.var()?, r.var()?, r.var()?));
    }
    let at = r.at;
    // An entry is at least 13 bytes (a nested ledger at least 10).
    let n = r.count(13)?;
    if nested && n > 0 {
        return Err(WireError::Overflow(at));
    }
    let mut settling = Vec::with_capacity(n);
    for _ in 0..n {
        let ward = r.id()?;
        let incarnation = r.var()?;
        let at = r.at;
        let flags = r.byte()?;
        if flags > 3 {
            return Err(WireError::Tag { tag: flags, at });
        }
        let ledger = read_ledger_at(r, true)?;
        let side = if flags & 2 == 2 {
            Some(read_reply(r)?)
        } else {
            None
        };
        settling.push(Settling {
            ward,
            incarnation,
            leaving: flags & 1 == 1,
            ledger,
            side,
        });
    }
    Ok(Ledger {
        version,
        holdings,
        bases,
        neighbours,
        wards,
        settled,
        folded,
        pending_folds,
        received_folds,
        settling,
    })
}

/// Bytes a varint takes.
fn varint_len(v: u64) -> usize {
    (64 - v.leading_zeros() as usize).div_ceil(7).max(1)
}

/// Bytes `e` takes in an encoded message's key list (exactly what [`encode`] writes).
#[must_use]
pub fn key_entry_len(e: &KeyEntry) -> usize {
    let relay = e.relay.is_finite() && e.relay > 0.0;
    varint_len(e.key) + varint_len(e.given) + varint_len(e.seen) + 4 + 1 + if relay { 5 } else { 0 }
}

/// Bytes [`encode`] writes for `m` (counted, not built: senders ask it for every message).
#[must_use]
pub fn encoded_len(m: &Message) -> usize {
    let mut c = Count(0);
    write(m, &mut c);
    c.0
}

/// A counted list of varint triples (see `Reader::triples`).
fn put_triples<S: Sink>(out: &mut S, list: &[(Key, u64, u64)]) {
    put(out, list.len() as u64);
    for &(k, a, b) in list {
        put(out, k);
        put(out, a);
        put(out, b);
    }
}

fn put<S: Sink>(out: &mut S, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, WireError> {
        let v = *self.b.get(self.at).ok_or(WireError::Truncated(self.at))?;
        self.at += 1;
        Ok(v)
    }

    fn take4(&mut self) -> Result<[u8; 4], WireError> {
        let s = self
            .b
            .get(self.at..self.at + 4)
            .ok_or(WireError::Truncated(self.at))?;
        self.at += 4;
        let mut a = [0u8; 4];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn var(&mut self) -> Result<u64, WireError> {
        let start = self.at;
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let part = u64::from(b & 0x7f);
            if shift == 63 && part > 1 {
                return Err(WireError::Overflow(start));
            }
            v |= part << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::Overflow(start))
    }

    fn id(&mut self) -> Result<NodeId, WireError> {
        let at = self.at;
        NodeId::try_from(self.var()?).map_err(|_| WireError::Overflow(at))
    }

    /// A count of items of at least `min_bytes` each: refused if it cannot fit, so a
    /// forged count never makes us allocate much.
    /// A counted list of `(key, a, b)` varint triples (settlement replies, late folds).
    fn triples(&mut self) -> Result<Vec<(Key, u64, u64)>, WireError> {
        let m = self.count(3)?;
        let mut v = Vec::with_capacity(m);
        for _ in 0..m {
            v.push((self.var()?, self.var()?, self.var()?));
        }
        Ok(v)
    }

    fn count(&mut self, min_bytes: usize) -> Result<usize, WireError> {
        let n = self.var()?;
        let left = (self.b.len() - self.at) as u64;
        if n.saturating_mul(min_bytes as u64) > left {
            return Err(WireError::Count(n));
        }
        usize::try_from(n).map_err(|_| WireError::Count(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: Key, relay: f32) -> KeyEntry {
        KeyEntry {
            key,
            given: key * 1000 + 7,
            seen: key * 3,
            indicator: -1.5,
            saturated: key.is_multiple_of(2),
            relay,
            relay_hops: if relay > 0.0 { 3 } else { 0 },
            idle: key.is_multiple_of(3),
        }
    }

    fn message(keys: u64, ledger: bool) -> Message {
        Message {
            from_inc: 2,
            to_inc: 1,
            sent_at: 1_000_000 + keys,
            echo: 999,
            lifecycle: Lifecycle::Active,
            to_heir: ledger,
            ledger: ledger.then(|| Ledger {
                version: 4,
                holdings: vec![Holding {
                    node: 3,
                    part: Part::Full,
                }],
                bases: vec![(9, -12)],
                neighbours: vec![(1, 3), (2, 0), (5, 1)],
                wards: vec![5],
                settled: vec![(6, 1)],
                folded: vec![(6, 1)],
                pending_folds: vec![PendingFold {
                    peer: 1,
                    peer_incarnation: 3,
                    key: 9,
                    seen: 40,
                    net: 12,
                }],
                received_folds: vec![(2, 1, 8, 30)],
                settling: vec![Settling {
                    ward: 4,
                    incarnation: 2,
                    leaving: false,
                    ledger: Ledger {
                        version: 3,
                        bases: vec![(9, 40)],
                        neighbours: vec![(1, 3)],
                        ..Ledger::default()
                    },
                    side: Some(SettleReply {
                        dead: 4,
                        incarnation: 2,
                        replier_incarnation: 1,
                        prior: Some(0),
                        first: false,
                        later_empty: true,
                        in_estate: true,
                        entries: vec![(9, 5, 2)],
                        pending: vec![(9, 3, 1)],
                    }),
                }],
            }),
            keys: (1..=keys)
                .map(|k| entry(k, (k % 2) as f32 * 40.0))
                .collect(),
            settle_requests: vec![(6, 1)],
            settle_replies: vec![SettleReply {
                dead: 6,
                incarnation: 1,
                replier_incarnation: 2,
                prior: Some(1),
                first: true,
                later_empty: false,
                in_estate: false,
                entries: vec![(1, 10, 20)],
                pending: vec![(1, 40, 12)],
            }],
            succession: Some((6, 1)),
            verdict_version: Some(2),
            ledger_ack: 3,
            retire: vec![(1, 5, 9)],
            retired: vec![(2, 77)],
            confirm: vec![3],
            late_folds: vec![LateFold {
                incarnation: 1,
                peer: 4,
                peer_incarnation: 2,
                entries: vec![(1, 30, 7)],
            }],
            late_acks: vec![LateAck {
                incarnation: 3,
                peer: 5,
                peer_incarnation: 1,
                accepted: true,
            }],
            handovers: vec![Handover {
                incarnation: 2,
                ward: 7,
                ward_incarnation: 1,
                ledger: Ledger {
                    version: 9,
                    bases: vec![(1, 250)],
                    neighbours: vec![(2, 1)],
                    ..Ledger::default()
                },
                kind: HandoverKind::Inherited,
                leaving: true,
            }],
            handover_acks: vec![HandoverAck {
                incarnation: 1,
                ward: 8,
                ward_incarnation: 3,
            }],
            census: Some(Census {
                level: 300,
                reminted: true,
            }),
            ..Message::default()
        }
    }

    /// Decoding into a reused buffer gives exactly what a fresh decode gives, whatever the
    /// buffer held before (more keys, fewer, a ledger or none, a failed decode).
    #[test]
    fn decode_into_a_reused_buffer_is_decode() {
        let mut buf = Message::default();
        for m in [
            message(5, true),
            message(1, false),
            message(0, true),
            message(40, false),
            message(2, false),
        ] {
            let bytes = encode(&m);
            assert_eq!(encoded_len(&m), bytes.len());
            // Appending to a buffer that already holds a message appends exactly these bytes.
            let mut two = vec![0xAA];
            encode_into(&m, &mut two);
            assert_eq!(&two[1..], &bytes[..]);
            decode_into(&bytes, &mut buf).unwrap();
            assert_eq!(buf, m);
            assert_eq!(decode(&bytes).unwrap(), m);
            // A failed decode leaves a valid buffer that the next one overwrites whole.
            assert!(decode_into(&bytes[..bytes.len() - 1], &mut buf).is_err());
        }
        let m = message(3, true);
        decode_into(&encode(&m), &mut buf).unwrap();
        assert_eq!(buf, m);
    }
}
