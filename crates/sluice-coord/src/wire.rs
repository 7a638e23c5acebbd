//! Messages between nodes and their compact binary encoding (docs/PROTOCOL.md, "Messages").
//!
//! One [`Message`] per link and send carries every active key in one batch. Integers are
//! LEB128 varints, indicators `f32`, the members digest 8 little-endian bytes. A build reads
//! and writes its [`VERSION`] and the one before ([`MIN_VERSION`]). [`decode`] never
//! panics: malformed input gives a [`WireError`] (checked by a proptest on random bytes).

/// A node id.
pub type NodeId = u32;
/// A dynamic limit key (a hashed IP, a tenant id).
pub type Key = u64;

/// The encoding's version, its first byte, as this build writes it by default. 14: a gather
/// report split into parts ([`Audit::part`]). 13: the sender's members digest
/// ([`Message::members`]). Earlier versions are in git history.
pub const VERSION: u8 = 14;

/// The oldest version this build still reads and writes (the previous one: a node of
/// version N answers a node of N−1 in its version, so a rolling upgrade never partitions a
/// cluster; docs/PROTOCOL.md, "Versions").
pub const MIN_VERSION: u8 = 13;

/// A digest of a set of voting members ([`Message::members`]): FNV-1a 64 over the sorted,
/// deduplicated ids, each as 4 little-endian bytes; never 0 (which says "not stated"), a 0
/// becomes 1. Stable across builds: every node must compute the same value.
#[must_use]
pub fn members_digest(members: &[NodeId]) -> u64 {
    let mut ids = members.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h.max(1)
}

/// A node's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// Started; has not heard from an active neighbour yet.
    Joining,
    /// Taking part in the law.
    Active,
    /// Handing its capacity to its neighbours before leaving.
    Leaving,
    /// Gone; holds nothing.
    Left,
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

/// Everything one node tells a neighbour in one send.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Sender's incarnation (grows on every restart and reincarnation).
    pub from_inc: u64,
    /// The receiver's incarnation as the sender knows it (0: unknown).
    pub to_inc: u64,
    /// Sender's clock at send time, strictly increasing per link (echoed back for leases;
    /// never compared across clocks).
    pub sent_at: u64,
    /// The latest `sent_at` the sender received from the receiver's incarnation `to_inc`:
    /// the receiver's own clock. 0: no echo (the sender is in quarantine, or promised never
    /// to echo that incarnation: it voted to fence it).
    pub echo: u64,
    /// Sender's lifecycle.
    pub lifecycle: Lifecycle,
    /// The digest of the sender's voting members ([`members_digest`]); 0: not stated (a
    /// sender of an earlier version). A receiver with other members ignores the message: it
    /// would count other quorums and initial shares. Since version 13.
    pub members: u64,
    /// `keys` holds every key the sender has state for: a key missing from it has no state
    /// at the sender, which is idle there (see [`crate::node`] "Idle keys"). False for a
    /// message that carries only changed keys (deltas, "Many keys").
    pub all_keys: bool,
    /// The lists that go with every full send (retirement lists, votes, dead floors, audit)
    /// are left out: they say nothing by their absence. Senders of this version always send
    /// them (a send is one datagram); kept so that earlier encodings decode the same.
    pub rest: bool,
    /// The keys this message carries (all, or the changed ones: see `all_keys`).
    pub keys: Vec<KeyEntry>,
    /// Idle-key retirement proposals `(key, given, seen)`: the sender's counters on this link
    /// for the key, frozen, with `seen ≥ given` (the sender is the link's net receiver, or
    /// it is balanced). See [`crate::node`] "Idle keys".
    pub retire: Vec<(Key, u64, u64)>,
    /// Acknowledgements `(key, sent_at of the proposal matched)`: the sender reset its
    /// counters for the key to zero.
    pub retired: Vec<(Key, u64)>,
    /// Confirmations: the sender reset its counters for these keys after an
    /// acknowledgement (it sends none older than this message any more).
    pub confirm: Vec<Key>,
    /// Votes to fence `(voter, node, incarnation)` the sender knows of and that no dead
    /// floor covers yet: `voter` promised never to echo `node`'s incarnations up to
    /// `incarnation` again. A quorum of voters makes a fence.
    pub votes: Vec<(NodeId, NodeId, u64)>,
    /// The sender's dead floors `(node, incarnation)`: `node`'s incarnations up to this one
    /// are dead or fenced and will never hold a lease again (sent when they changed, and
    /// now and then).
    pub dead: Vec<(NodeId, u64)>,
    /// The sender's part in a capacity audit, when the receiver still needs it (see
    /// [`Audit`]).
    pub audit: Option<Box<Audit>>,
}

/// A wave of a capacity audit (see [`crate::node`], "The capacity audit"). Waves are the
/// echo algorithm: a node joins the highest wave it hears of, from the neighbour it first
/// hears it from (its *parent*), and reports to that parent once every other live
/// neighbour is in the wave too (those that took it as their parent with their own reports).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Audit {
    /// The wave: the root, its incarnation, the round, the phase (ordered as a tuple).
    pub wave: Wave,
    /// The sender took the receiver as its parent in this wave.
    pub child: bool,
    /// The sender has the receiver accounted for in this wave (as a child with its report,
    /// or as a neighbour in the wave): the receiver need not tell it again.
    pub ack: bool,
    /// The sender needs nothing more from the receiver in this wave (it has it accounted and
    /// holds its `ack`): no answer is asked for.
    pub done: bool,
    /// To the parent: the sender's whole subtree, once complete (with `part`: one part of it).
    pub report: Option<AuditReport>,
    /// A gather report too large for one datagram goes in parts: this message's `report`
    /// holds part `index` of `count` of the report's `devs` (cut by [`split_devs`]) and all of
    /// its other fields. The parent has the report once it holds every part. Since version 14.
    pub part: Option<Part>,
    /// A confirm wave's dead floors `(node, incarnation)`: every reader installs them
    /// before it reads again.
    pub fence: Vec<(NodeId, u64)>,
}

/// Which part of a gather report a message holds (see [`Audit::part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Part {
    /// This part, `0..count`.
    pub index: u32,
    /// The report's parts, at least 2 and at most [`MAX_PARTS`].
    pub count: u32,
}

/// The most parts a gather report is split into (what a receiver keeps room for).
pub const MAX_PARTS: u32 = 1 << 16;

/// Cuts a gather report's `devs` into consecutive parts of at most `max_bytes` encoded bytes
/// each (one entry alone may be larger): the ranges of [`Audit::part`]. One range for a
/// report that fits; never more than [`MAX_PARTS`] (the last ones then grow).
#[must_use]
pub fn split_devs(devs: &[(Key, i64)], max_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut parts = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, &(k, d)) in devs.iter().enumerate() {
        let len = varint_len(k) + varint_len(zigzag(d));
        if bytes + len > max_bytes && i > start && parts.len() + 1 < MAX_PARTS as usize {
            parts.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    parts.push(start..devs.len());
    parts
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

/// Which wave of the audit (see [`Audit`]). Waves of one root are ordered; a node follows
/// one root at a time (the lowest member it hears).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Wave {
    /// The root.
    pub root: NodeId,
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
    /// Gather: `Σ` default bases (what a key without state is worth at each node).
    pub defaults: u64,
    /// Gather: per key, `Σ (base + pending fold nets − default base)` over the nodes with
    /// state for it.
    pub devs: Vec<(Key, i64)>,
    /// Gather: the incarnation of every node of the subtree.
    pub incs: Vec<(NodeId, u64)>,
    /// Gather: the members of the subtree out of quarantine, a bit each (bit `i` of byte
    /// `i / 8` for the `i`-th lowest member id): they make the quorum.
    pub members: Vec<u8>,
    /// Gather: the subtree's dead floors (per node the highest).
    pub dead: Vec<(NodeId, u64)>,
}

impl Default for Message {
    /// An empty message (no keys) from and to unknown incarnations: a buffer for
    /// [`decode_into`].
    fn default() -> Self {
        Self {
            from_inc: 0,
            to_inc: 0,
            sent_at: 0,
            echo: 0,
            lifecycle: Lifecycle::Joining,
            members: 0,
            all_keys: false,
            rest: false,
            keys: Vec::new(),
            retire: Vec::new(),
            retired: Vec::new(),
            confirm: Vec::new(),
            votes: Vec::new(),
            dead: Vec::new(),
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

/// Encodes a message in [`VERSION`].
#[must_use]
pub fn encode(m: &Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + m.keys.len() * 12);
    write(m, VERSION, &mut out);
    out
}

/// Appends the encoding of `m` to `out` (what [`encode`] returns), so a sender can put
/// many messages into one buffer instead of allocating one per message.
pub fn encode_into(m: &Message, out: &mut Vec<u8>) {
    out.reserve(32 + m.keys.len() * 12);
    write(m, VERSION, out);
}

/// Encodes a message in `version` (one of [`MIN_VERSION`]`..=`[`VERSION`]): what a peer
/// of that version reads. Fields the version does not have are left out; a part of a
/// gather report, which version 13 cannot say, goes as a report that failed (its round
/// fails, as it would have without parts: the whole report would not fit in a datagram).
///
/// # Errors
/// [`WireError::Version`] for a version this build does not write.
pub fn encode_as(m: &Message, version: u8) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(32 + m.keys.len() * 12);
    encode_into_as(m, version, &mut out)?;
    Ok(out)
}

/// [`encode_as`] appended to `out` (as [`encode_into`]).
///
/// # Errors
/// [`WireError::Version`] for a version this build does not write (`out` is unchanged).
pub fn encode_into_as(m: &Message, version: u8, out: &mut Vec<u8>) -> Result<(), WireError> {
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(WireError::Version(version));
    }
    out.reserve(32 + m.keys.len() * 12);
    write(m, version, out);
    Ok(())
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

fn write<S: Sink>(m: &Message, version: u8, out: &mut S) {
    out.push(version);
    for v in [m.from_inc, m.to_inc, m.sent_at, m.echo] {
        put(out, v);
    }
    let life = match m.lifecycle {
        Lifecycle::Joining => 0,
        Lifecycle::Active => 1,
        Lifecycle::Leaving => 2,
        Lifecycle::Left => 3,
    };
    // The rare lists are written only when flagged, so the usual message pays nothing.
    let retirements = !(m.retire.is_empty() && m.retired.is_empty() && m.confirm.is_empty());
    let fences = !(m.votes.is_empty() && m.dead.is_empty());
    // Version 13 added the members digest behind the last free flag bit.
    let members = m.members != 0;
    out.push(
        life | (u8::from(m.all_keys) << 2)
            | (u8::from(m.rest) << 3)
            | (u8::from(retirements) << 4)
            | (u8::from(fences) << 5)
            | (u8::from(m.audit.is_some()) << 6)
            | (u8::from(members) << 7),
    );
    if members {
        out.extend_from_slice(&m.members.to_le_bytes());
    }
    put(out, m.keys.len() as u64);
    for e in &m.keys {
        put(out, e.key);
        put(out, e.given);
        put(out, e.seen);
        out.extend_from_slice(&e.indicator.to_le_bytes());
        // Flags: bit 0 saturated, bit 2 idle, bit 1 a relay request follows (absent when 0,
        // so an entry without one costs no extra byte).
        let relay = e.relay.is_finite() && e.relay > 0.0;
        out.push(u8::from(e.saturated) | (u8::from(relay) << 1) | (u8::from(e.idle) << 2));
        if relay {
            out.extend_from_slice(&e.relay.to_le_bytes());
            out.push(e.relay_hops);
        }
    }
    if retirements {
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
    }
    if fences {
        put(out, m.votes.len() as u64);
        for &(voter, node, inc) in &m.votes {
            put(out, u64::from(voter));
            put(out, u64::from(node));
            put(out, inc);
        }
        put_pairs(out, &m.dead);
    }
    if let Some(a) = &m.audit {
        put_audit(out, a, version);
    }
}

fn put_pairs<S: Sink>(out: &mut S, list: &[(NodeId, u64)]) {
    put(out, list.len() as u64);
    for &(n, v) in list {
        put(out, u64::from(n));
        put(out, v);
    }
}

fn put_audit<S: Sink>(out: &mut S, a: &Audit, version: u8) {
    put(out, u64::from(a.wave.root));
    put(out, a.wave.root_inc);
    put(out, a.wave.round);
    let failed = AuditReport::default();
    let (report, part) = match (a.report.as_ref(), a.part) {
        (Some(_), Some(_)) if version < 14 => (Some(&failed), None),
        (r, p) => (r, p.filter(|_| r.is_some() && !a.wave.confirm)),
    };
    let ok = report.is_some_and(|r| r.ok);
    out.push(
        u8::from(a.wave.confirm)
            | (u8::from(a.child) << 1)
            | (u8::from(a.ack) << 2)
            | (u8::from(report.is_some()) << 3)
            | (u8::from(ok) << 4)
            | (u8::from(a.done) << 5)
            | (u8::from(part.is_some()) << 6),
    );
    if let Some(p) = part {
        put(out, u64::from(p.index));
        put(out, u64::from(p.count));
    }
    put_pairs(out, &a.fence);
    // A confirming report is its `ok` bit alone.
    if let Some(r) = report.filter(|_| !a.wave.confirm) {
        put(out, r.defaults);
        put(out, r.devs.len() as u64);
        for &(k, d) in &r.devs {
            put(out, k);
            put(out, zigzag(d));
        }
        put_pairs(out, &r.incs);
        put(out, r.members.len() as u64);
        for &b in &r.members {
            out.push(b);
        }
        put_pairs(out, &r.dead);
    }
}

/// Decodes a message of any version this build reads ([`MIN_VERSION`]`..=`[`VERSION`]).
///
/// # Errors
/// A [`WireError`] saying what is wrong and where.
pub fn decode(bytes: &[u8]) -> Result<Message, WireError> {
    decode_versioned(bytes).map(|(m, _)| m)
}

/// [`decode`], and the version the message was written in (what its sender speaks).
///
/// # Errors
/// A [`WireError`] saying what is wrong and where.
pub fn decode_versioned(bytes: &[u8]) -> Result<(Message, u8), WireError> {
    let mut m = Message::default();
    let v = decode_into_versioned(bytes, &mut m)?;
    Ok((m, v))
}

/// [`decode`] into `out`, reusing its key list's buffer: a receiver that decodes every
/// message into one [`Message`] allocates nothing for the usual message. On error `out`
/// holds an unspecified (valid) message. Never panics.
///
/// # Errors
/// A [`WireError`] saying what is wrong and where.
pub fn decode_into(bytes: &[u8], out: &mut Message) -> Result<(), WireError> {
    decode_into_versioned(bytes, out).map(|_| ())
}

/// [`decode_into`], returning the version the message was written in.
///
/// # Errors
/// A [`WireError`] saying what is wrong and where.
pub fn decode_into_versioned(bytes: &[u8], out: &mut Message) -> Result<u8, WireError> {
    let mut r = Reader { b: bytes, at: 0 };
    let v = r.byte()?;
    if !(MIN_VERSION..=VERSION).contains(&v) {
        return Err(WireError::Version(v));
    }
    let from_inc = r.var()?;
    let to_inc = r.var()?;
    let sent_at = r.var()?;
    let echo = r.var()?;
    let flags = r.byte()?;
    let members = if flags & 0x80 != 0 {
        let at = r.at;
        let lo = u64::from(u32::from_le_bytes(r.take4()?));
        let hi = u64::from(u32::from_le_bytes(r.take4()?));
        // A stated digest is never 0: not what any encoder writes.
        let d = lo | (hi << 32);
        if d == 0 {
            return Err(WireError::Tag { tag: 0, at });
        }
        d
    } else {
        0
    };
    let lifecycle = match flags & 3 {
        0 => Lifecycle::Joining,
        1 => Lifecycle::Active,
        2 => Lifecycle::Leaving,
        _ => Lifecycle::Left,
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
        let indicator = f32::from_le_bytes(r.take4()?);
        if !indicator.is_finite() {
            return Err(WireError::NonFinite(at));
        }
        let at = r.at;
        let bits = r.byte()?;
        if bits > 7 {
            return Err(WireError::Tag { tag: bits, at });
        }
        let (relay, relay_hops) = if bits & 2 != 0 {
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
            saturated: bits & 1 != 0,
            idle: bits & 4 != 0,
            relay,
            relay_hops,
        });
    }
    let (mut retire, mut retired, mut confirm) = (Vec::new(), Vec::new(), Vec::new());
    if flags & 16 != 0 {
        retire = r.triples()?;
        let n = r.count(2)?;
        retired.reserve(n);
        for _ in 0..n {
            retired.push((r.var()?, r.var()?));
        }
        let n = r.count(1)?;
        confirm.reserve(n);
        for _ in 0..n {
            confirm.push(r.var()?);
        }
    }
    let (mut votes, mut dead) = (Vec::new(), Vec::new());
    if flags & 32 != 0 {
        let n = r.count(3)?;
        votes.reserve(n);
        for _ in 0..n {
            votes.push((r.id()?, r.id()?, r.var()?));
        }
        dead = r.pairs()?;
    }
    let audit = if flags & 64 != 0 {
        Some(Box::new(read_audit(&mut r, v)?))
    } else {
        None
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
        members,
        all_keys: flags & 4 != 0,
        rest: flags & 8 != 0,
        keys,
        retire,
        retired,
        confirm,
        votes,
        dead,
        audit,
    };
    Ok(v)
}

fn read_audit(r: &mut Reader<'_>, version: u8) -> Result<Audit, WireError> {
    let root = r.id()?;
    let root_inc = r.var()?;
    let round = r.var()?;
    let at = r.at;
    let flags = r.byte()?;
    let confirm = flags & 1 != 0;
    // `ok` without a report, a part of none or of a confirm: not what any encoder writes.
    let part = flags & 64 != 0;
    if flags & 128 != 0
        || (flags & 8 == 0 && flags & 16 != 0)
        || (part && (version < 14 || flags & 8 == 0 || confirm))
    {
        return Err(WireError::Tag { tag: flags, at });
    }
    let part = if part {
        let (index, count) = (r.var()?, r.var()?);
        if count < 2 || count > u64::from(MAX_PARTS) || index >= count {
            return Err(WireError::Count(count.max(index)));
        }
        Some(Part {
            index: index as u32,
            count: count as u32,
        })
    } else {
        None
    };
    let fence = r.pairs()?;
    let report = if flags & 8 == 0 {
        None
    } else if confirm {
        Some(AuditReport {
            ok: flags & 16 != 0,
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
        let incs = r.pairs()?;
        let n = r.count(1)?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(r.byte()?);
        }
        let dead = r.pairs()?;
        Some(AuditReport {
            ok: flags & 16 != 0,
            defaults,
            devs,
            incs,
            members,
            dead,
        })
    };
    Ok(Audit {
        wave: Wave {
            root,
            root_inc,
            round,
            confirm,
        },
        child: flags & 2 != 0,
        ack: flags & 4 != 0,
        done: flags & 32 != 0,
        report,
        part,
        fence,
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
/// No earlier version writes more.
#[must_use]
pub fn encoded_len(m: &Message) -> usize {
    let mut c = Count(0);
    write(m, VERSION, &mut c);
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

    /// A counted list of `(key, a, b)` varint triples (retirement proposals).
    fn triples(&mut self) -> Result<Vec<(Key, u64, u64)>, WireError> {
        let m = self.count(3)?;
        let mut v = Vec::with_capacity(m);
        for _ in 0..m {
            v.push((self.var()?, self.var()?, self.var()?));
        }
        Ok(v)
    }

    /// A counted list of `(node, value)` varint pairs.
    fn pairs(&mut self) -> Result<Vec<(NodeId, u64)>, WireError> {
        let m = self.count(2)?;
        let mut v = Vec::with_capacity(m);
        for _ in 0..m {
            v.push((self.id()?, self.var()?));
        }
        Ok(v)
    }

    /// A count of items of at least `min_bytes` each: refused if it cannot fit, so a
    /// forged count never makes us allocate much.
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
mod tests;
