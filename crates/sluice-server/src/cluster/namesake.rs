//! Two processes under one node id (docs/PROTOCOL.md, "Node ids"): how they find out, and
//! how a random id is given up.
//!
//! A node runs one incarnation at a time (assumption A1), so a peer that hears a later
//! incarnation of an id takes the earlier one for dead and folds its link. When two live
//! processes share the id (two nodes drew the same random id, or an operator gave one
//! `--node-id` twice), the earlier one is not dead: its peers now send to the later one's
//! address, and it hears nothing, so it never learns why its lease ran out.
//!
//! The peer that can see it tells it: a coordination message from an incarnation the peer
//! holds dead, sent from an address other than the one the peer sends that id's messages
//! to, is answered at that address with a *namesake notice* naming the incarnation the peer
//! holds live (at most one per id per cycle). It carries no capacity. A node told of a live
//! incarnation of its id above its own:
//! - gives the id up if it drew it at random (no other process of the cluster ever ran
//!   under it, so the namesake is another process), and joins again under a new random id;
//!   the one with the highest incarnation keeps the id, so a collision ends at the first
//!   notice;
//! - otherwise (a configured id) logs the conflict as an error and stays as it is: cut off,
//!   holding at most its reservation, as a partitioned node does, until the operator gives
//!   one of the two another id.
//!
//! A random-id node that hears a dead floor above its own incarnation (the namesake's peers
//! told it) gives the id up the same way.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use sluice_coord::node::Node;
use sluice_coord::wire::NodeId;

use super::directory::ANY;
use super::{Cluster, Driven};
use crate::peer::{self, Transport};

/// First payload byte of a namesake notice (a directory is `0xD1`; a coordination message
/// starts with its wire version, far below). A node of an earlier build counts one as a
/// message of an unknown version and drops it.
pub(crate) const NOTICE: u8 = 0xD2;

/// A notice's payload: the tag and the incarnation of the recipient's id the sender holds
/// live.
fn encode(live: u64) -> [u8; 9] {
    let mut out = [0; 9];
    out[0] = NOTICE;
    out[1..].copy_from_slice(&live.to_be_bytes());
    out
}

fn decode(payload: &[u8]) -> Option<u64> {
    match payload {
        [NOTICE, rest @ ..] => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

/// A node id drawn at random: in the upper half of the ids (configured ids are usually
/// small), never the "any node" id, and none that `taken` says is in use. `next` gives the
/// random bits (the caller's generator: randomness is an argument).
pub fn draw_node_id(mut next: impl FnMut() -> u32, taken: impl Fn(NodeId) -> bool) -> NodeId {
    loop {
        let id = next() | 0x8000_0000;
        if id != ANY && !taken(id) {
            return id;
        }
    }
}

impl<T: Transport> Cluster<T> {
    /// Notices for the coordination messages of `strays` (sender, its incarnation, where it
    /// sent from; each from an address other than the sender's known one) that came from
    /// incarnations we hold dead while we hold a later one live.
    pub(super) fn notices(
        &self,
        d: &mut Driven,
        strays: &[(NodeId, u64, SocketAddr)],
        now: u64,
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Vec::new();
        for &(from, inc, src) in strays {
            let floor = d.node.dead_floors().get(&from).copied().unwrap_or(0);
            let live = d.node.peer_incarnation(from);
            if inc > floor || live <= inc {
                continue;
            }
            let last = d.noticed.entry(from).or_insert(0);
            if *last != 0 && now.saturating_sub(*last) < d.node.config().cycle {
                continue;
            }
            if *last == 0 {
                // Once per id while we link with it (a configured id given twice stays so).
                tracing::warn!(
                    node = self.me(),
                    peer = from,
                    dead = inc,
                    live,
                    addr = %src,
                    "two processes run with one node id: telling the one whose incarnation \
                     is dead"
                );
            }
            *last = now;
            if let Ok(dg) = peer::seal(&self.key, self.me(), from, &encode(live)) {
                out.push((src, dg));
            }
        }
        // Bounded by the nodes we hold links with.
        d.noticed
            .retain(|&id, _| d.node.link_state(id, now).is_some());
        out
    }

    /// A namesake notice from `from`, addressed to `to`.
    pub(super) fn on_notice(&self, from: NodeId, to: NodeId, payload: &[u8]) {
        let Some(live) = decode(payload) else {
            self.counters
                .rejected_malformed
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut d = self.node.lock();
        if to != self.me() || live <= d.node.incarnation() {
            return;
        }
        d.notices += 1;
        let now = self.now();
        if !self.redraw(&mut d, now) && d.notices.is_power_of_two() {
            tracing::error!(
                node = self.me(),
                incarnation = d.node.incarnation(),
                peer = from,
                theirs = live,
                "another process runs with this --node-id (peer {from} hears it at incarnation \
                 {live}): this one is cut off; give each node its own id"
            );
        }
    }

    /// Gives up a random id another process also runs under, if this node's id is random
    /// and not a voter's: it starts again as a joiner under a new random id, among the same
    /// voters, holding nothing (its peers took the namesake for its restart and folded its
    /// links: what it held is counted dead). Returns whether it did.
    pub(super) fn redraw(&self, d: &mut Driven, now: u64) -> bool {
        let old = self.me();
        if !self.spec.random_id || d.node.config().members.binary_search(&old).is_ok() {
            return false;
        }
        let known: std::collections::BTreeSet<NodeId> = self
            .addrs
            .all()
            .into_iter()
            .map(|(id, _)| id)
            .chain(d.node.config().members.iter().copied())
            .chain(d.node.config().links.iter().map(|&(id, _)| id))
            .chain([old])
            .collect();
        let id = draw_node_id(
            || u32::try_from(d.rng.next_u64() >> 32).unwrap_or(0),
            |id| known.contains(&id),
        );
        let mut cfg = d.node.config().clone();
        cfg.id = id;
        cfg.incarnation = d.node.incarnation() + 1;
        let Ok(node) = Node::new(cfg, now) else {
            return false;
        };
        tracing::warn!(
            node = old,
            new_id = id,
            "another process runs under this random node id: gave it up, joining again under \
             a new one"
        );
        d.past_conflicts += d.node.id_conflicts();
        d.logged_conflicts = 0;
        d.redraws += 1;
        d.logged_incarnation = node.incarnation();
        d.node = node;
        d.live.clear();
        d.noticed.clear();
        self.me.store(id, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_decodes_to_what_it_encodes_and_nothing_else_decodes() {
        for live in [0, 1, u64::MAX, 1_795_931_726_967] {
            assert_eq!(decode(&encode(live)), Some(live));
        }
        let good = encode(7);
        assert_eq!(decode(&good[..8]), None, "short");
        assert_eq!(decode(&[&good[..], &[0]].concat()), None, "long");
        assert_eq!(
            decode(&[0xD1, 0, 0, 0, 0, 0, 0, 0, 7]),
            None,
            "a directory's tag"
        );
        assert_eq!(decode(&[]), None);
    }

    #[test]
    fn a_drawn_id_is_in_the_upper_half_never_any_and_never_taken() {
        // The generator's first draws: ANY, then a taken id, then a free one.
        let mut draws = [u32::MAX, 5, 6].into_iter();
        let id = draw_node_id(|| draws.next().unwrap_or(9), |id| id == 5 | 0x8000_0000);
        assert_eq!(id, 6 | 0x8000_0000);
    }
}
