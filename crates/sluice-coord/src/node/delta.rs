//! Delta messages and the per-link byte budget (docs/PROTOCOL.md, "Many keys").
//!
//! A send to a neighbour carries a key's entry only when the peer may lack its latest
//! version: the entry changed materially since the peer acknowledged it, a gift on it is not
//! acknowledged yet, or the rolling refresh comes to it. Entries still carry whole counters,
//! so a message stays idempotent and a lost one only delays; what changes is what absence
//! says: nothing, unless the message holds every key (`Message::all_keys`).
//!
//! Acknowledgements need no new field: every key change gets a number
//! (`Node::change_seq`), and every message records the *horizon* `h` under which it holds
//! every key whose change the peer had not acknowledged when it left. The peer echoes the
//! latest `sent_at` it received (the lease's echo); an echo of a message we recorded means
//! the peer holds every change numbered up to its horizon. A message the peer received but
//! did not read fully (another incarnation's, or older than its floor) is never the latest
//! it echoes, or is addressed to an incarnation that echoes nothing of ours.

use std::collections::VecDeque;

use super::*;

/// Every this many sends on a link, the rest of the budget goes to a rolling refresh of the
/// keys no change sends: nothing depends on one message, or on one acknowledgement.
pub(super) const REFRESH_EVERY: u32 = 8;

/// Our latest messages per link whose horizons are kept for the peer's echo (an echo of an
/// older one acknowledges nothing: what it held is sent again).
const KEPT: usize = 32;

/// Room for a message's key count varint growing from 1 byte to at most 5.
pub(super) const COUNT_SLACK: usize = 4;

/// What a key's entries say of the key itself, whatever the link: what a peer's law reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Advert {
    pub(super) indicator: f32,
    pub(super) saturated: bool,
    pub(super) idle: bool,
}

impl Advert {
    /// Whether `new` is news against `self`, what the peers were last told: a flag flipped,
    /// or the indicator moved enough to change a gift of the law by half a unit (`gain` is
    /// the key's gain times the weighted degree: a peer gives `γ·w·Δp`). A smaller drift is
    /// sent with the next change or refresh; the law is stable under such delays (seed 003
    /// Appendix, Thm 2: asynchronous, outdated indicators).
    pub(super) fn moved(&self, new: &Advert, gain: f64) -> bool {
        let (old, now) = (f64::from(self.indicator), f64::from(new.indicator));
        self.saturated != new.saturated
            || self.idle != new.idle
            || old.is_finite() != now.is_finite()
            || (now.is_finite() && gain * (now - old).abs() >= 0.5)
    }
}

/// Per link: what we sent, what the peer has acknowledged of our entries, the byte budget.
#[derive(Debug, Clone, Default)]
pub(super) struct LinkDelta {
    /// Messages sent on the link (dead floors also go with every 16th, in case of loss).
    pub(super) sends: u32,
    /// The version of our dead floors last sent on this link (see `Node::dead_version`).
    pub(super) dead_sent: u32,
    /// The peer holds every key's entry whose change is numbered at most this.
    acked: u64,
    /// `(sent_at, the peer incarnation addressed, horizon)` of our latest messages.
    sent: VecDeque<(Nanos, u64, u64)>,
    /// Bytes the link may still send now (`Config::link_budget` a cycle, at most one
    /// cycle's worth saved; below zero after a head larger than what was left).
    credit: i64,
    credit_at: Nanos,
    /// Where the rolling refresh goes on (the first key after the last one refreshed).
    refresh_from: Key,
}

impl LinkDelta {
    /// The peer is another incarnation (or none): it has none of our entries.
    pub(super) fn reset(&mut self) {
        self.acked = 0;
        self.sent.clear();
        self.refresh_from = 0;
    }

    pub(super) fn acked(&self) -> u64 {
        self.acked
    }

    /// The peer's incarnation `inc` echoed our message sent at `echo`.
    pub(super) fn echoed(&mut self, echo: Nanos, inc: u64) {
        while let Some(&(at, to, horizon)) = self.sent.front() {
            if at > echo {
                break;
            }
            self.sent.pop_front();
            if at == echo && (to == inc || to == 0) {
                self.acked = self.acked.max(horizon);
            }
        }
    }

    /// Records a message sent at `at` to incarnation `to` holding every change above what
    /// was acknowledged up to `horizon`.
    pub(super) fn record(&mut self, at: Nanos, to: u64, horizon: u64) {
        if self.sent.len() == KEPT {
            self.sent.pop_front();
        }
        self.sent.push_back((at, to, horizon));
    }

    /// The bytes a message may take at `now` (one cycle's `per_cycle` at most).
    pub(super) fn credit(&mut self, now: Nanos, per_cycle: usize, cycle: Nanos) -> usize {
        let per = i64::try_from(per_cycle).unwrap_or(i64::MAX);
        let dt = now.saturating_sub(self.credit_at);
        self.credit_at = self.credit_at.max(now);
        let earned = i128::from(per) * i128::from(dt) / i128::from(cycle.max(1));
        let credit = (i128::from(self.credit) + earned).min(i128::from(per));
        self.credit = i64::try_from(credit).unwrap_or(per);
        usize::try_from(self.credit).unwrap_or(0)
    }

    pub(super) fn spend(&mut self, bytes: usize) {
        self.credit = self
            .credit
            .saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub(super) fn refresh_from(&self) -> Key {
        self.refresh_from
    }

    pub(super) fn refreshed_to(&mut self, last: Key) {
        self.refresh_from = last.wrapping_add(1);
    }
}

/// One key's entry for a send, and why it goes.
pub(super) struct Candidate {
    pub(super) entry: KeyEntry,
    /// The key's change number.
    pub(super) changed: u64,
    /// Capacity we recorded for the peer that no message carried yet, or a relay request
    /// it has not heard: first in the budget.
    pub(super) urgent: bool,
    /// The peer may lack it (vs only a refresh would send it).
    pub(super) due: bool,
}

/// Chooses the entries of one message worth at most `room` bytes of entries: urgent ones,
/// then the peer's unacknowledged changes oldest first, then (on a refresh) the others from
/// `from` on, round the key space. Returns the entries in key order, the horizon (every due
/// change numbered above `acked` and at most it is in), whether every key is in, and the
/// last key refreshed.
pub(super) fn choose(
    mut cands: Vec<Candidate>,
    room: usize,
    acked: u64,
    seq: u64,
    refresh: Option<Key>,
) -> (Vec<KeyEntry>, u64, bool, Option<Key>) {
    let total = cands.len();
    let mut out = Vec::new();
    let mut left = room;
    let mut horizon = seq;
    let (mut due, rest): (Vec<_>, Vec<_>) = cands.drain(..).partition(|c| c.due);
    due.sort_unstable_by_key(|c| (!c.urgent, c.changed));
    for c in due {
        let len = wire::key_entry_len(&c.entry);
        if len <= left {
            left -= len;
            out.push(c.entry);
        } else if c.changed > acked {
            horizon = horizon.min(c.changed - 1);
        }
    }
    let mut last = None;
    if let Some(from) = refresh {
        // `rest` is in key order (the keys' map order): start at `from`, wrap round.
        let at = rest.partition_point(|c| c.entry.key < from);
        let (after, before) = rest.split_at(at);
        for c in after.iter().chain(before) {
            let len = wire::key_entry_len(&c.entry);
            if len > left {
                break;
            }
            left -= len;
            out.push(c.entry);
            last = Some(c.entry.key);
        }
    }
    let all = out.len() == total;
    out.sort_unstable_by_key(|e| e.key);
    (out, horizon, all, last)
}
