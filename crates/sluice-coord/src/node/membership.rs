//! Leaving gracefully: hand every share above the reservation to the neighbours first.

use super::*;

impl Node {
    /// Starts a graceful leave: the node gives its shares to its neighbours (under its
    /// lease), then stops. Its reservation and what keys without state hold here come back
    /// through the audit, once its incarnation is dead (it says so when it has left).
    pub fn leave(&mut self, now: Nanos) {
        if matches!(self.lifecycle, Lifecycle::Active | Lifecycle::Joining) {
            self.lifecycle = Lifecycle::Leaving;
            self.leave_started = Some(now);
            self.audit.leave_wave();
        }
    }

    /// Leaving: every key's share above the reservation to the first usable neighbour
    /// (they pass it on by the law to where it is needed).
    pub(super) fn hand_over(&mut self, usable: &[(NodeId, f64)]) {
        let Some(&(to, _)) = usable.first() else {
            return;
        };
        let reservation = self.reservation;
        for ks in self.keys.values_mut() {
            let spare = ks.own().saturating_sub(reservation);
            let lk = ks.links.entry(to).or_default();
            // A retirement under way ends within a round trip; hand over after it.
            if spare > 0 && !lk.frozen() {
                lk.given += spare;
                ks.given_sum = ks.given_sum.wrapping_add(spare);
            }
        }
    }

    pub(super) fn maybe_left(&mut self, now: Nanos) {
        let Some(start) = self.leave_started else {
            return;
        };
        let reservation = self.reservation;
        // Every share handed over and acknowledged: nothing of ours is in flight.
        let handed = self
            .keys
            .values()
            .all(|k| k.own() <= reservation && k.links.values().all(|l| l.acked >= l.given));
        if handed || now >= start + 4 * self.cfg.lease {
            self.lifecycle = Lifecycle::Left;
            // Tell everyone at once: they fold our links and stop waiting for us.
            let peers: Vec<NodeId> = self.links.keys().copied().collect();
            for p in peers {
                self.send(p, now);
            }
        }
    }
}

/// Most links a node keeps (members, neighbours and joiners): what a node accepts from
/// joiners is bounded, whatever introduces itself.
pub const MAX_LINKS: usize = 1024;

/// Membership changes a node has seen, for operators (`/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    /// Links made at run time: a joiner that introduced itself, or a peer the driver added.
    pub joins: u64,
    /// Incarnations that said they left (a graceful leave).
    pub leaves: u64,
    /// Incarnations fenced by a quorum of votes (made here or learned).
    pub fences: u64,
    /// Joiners refused because the node already has [`MAX_LINKS`] links.
    pub refused: u64,
}

/// What a node knows of its cluster's membership (see [`Node::membership`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The voting members (they make the quorums), sorted.
    pub voters: Vec<NodeId>,
    /// Every node this one has a live link with, and itself, with their incarnations,
    /// sorted by id.
    pub live: Vec<(NodeId, u64)>,
    /// A digest of `voters`, `live` and the dead floors of the members and this node: two
    /// nodes with the same view show the same version.
    pub version: u64,
    /// The counts of changes seen.
    pub changes: Changes,
}

/// FNV-1a over 64-bit words: a stable digest (the same on every build and platform).
pub(crate) fn digest(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl Node {
    /// Adds `peer` as a neighbour of the law with link weight `weight`, at run time: a node
    /// a discovery mechanism found (a seed, a DNS record, another node's directory). What
    /// holds capacity is decided by the messages, as for a configured link: the node sends
    /// to it from now on and takes it in when it answers. Nothing happens if the link exists
    /// or the node already has [`MAX_LINKS`] links (counted as refused). Returns whether the
    /// link is new.
    pub fn add_peer(&mut self, peer: NodeId, weight: f64, now: Nanos) -> bool {
        if peer == self.cfg.id || self.links.contains_key(&peer) {
            return false;
        }
        if self.links.len() >= MAX_LINKS || !(weight.is_finite() && weight > 0.0) {
            self.changes.refused += 1;
            return false;
        }
        self.link_entry(peer, now, true).weight = weight;
        self.changes.joins += 1;
        true
    }

    /// The membership as this node sees it: the voters, the live links, a version.
    #[must_use]
    pub fn membership(&self) -> Membership {
        let mut live: Vec<(NodeId, u64)> = self
            .links
            .iter()
            .filter(|(_, l)| l.inc != 0)
            .map(|(&p, l)| (p, l.inc))
            .collect();
        live.push((self.cfg.id, self.inc));
        live.sort_unstable();
        let version = digest(
            self.members
                .iter()
                .map(|&m| u64::from(m))
                .chain([u64::MAX])
                .chain(live.iter().flat_map(|&(p, i)| [u64::from(p), i]))
                .chain([u64::MAX])
                // Departed joiners' floors are forgotten at slightly different times on
                // different nodes; their links, gone everywhere, already changed `live`.
                .chain(
                    self.dead
                        .iter()
                        .filter(|(p, _)| !self.departed.contains_key(p))
                        .flat_map(|(&p, &i)| [u64::from(p), i]),
                ),
        );
        Membership {
            voters: self.members.clone(),
            live,
            version,
            changes: self.changes,
        }
    }
}
