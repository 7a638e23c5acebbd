//! Joining a running cluster (docs/PROTOCOL.md, "Membership"): the driver's side.
//!
//! Every [`DIRECTORY_EVERY`] cycles (every cycle until it first holds a lease) a node sends
//! its directory (its voters, whether it holds a lease, the nodes it has a live link with
//! and where they are) to every node it knows and to every address discovery proposes that
//! no known node is at. A directory from a key
//! holder with the same voters introduces its sender and the nodes it lists: the node links
//! with them (`Node::add_peer`) and they with it, and from then on the coordination
//! messages decide what each holds, as for configured peers. A directory with other voters
//! is refused (counted, logged once): a node counting other quorums and initial shares
//! must never link. Only a node whose voters were not given (`--members`) and that never
//! held a lease takes the voters of a leased sender instead: it held nothing, so it starts
//! again as a new incarnation among them (a joiner, holding nothing).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use sluice_coord::node::{MAX_LINKS, Node};
use sluice_coord::wire::NodeId;

use super::directory::{self, ANY, Directory};
use super::{Cluster, Driven, node_config, persist_incarnation};
use crate::peer::{self, Transport};

/// Cycles between two rounds of directories (a second at the default cycle): how fast a
/// joiner is learned by the nodes its seed did not tell, and how fast a moved node is
/// followed.
pub(super) const DIRECTORY_EVERY: u64 = 10;

impl<T: Transport> Cluster<T> {
    /// Records where `id` is (learned at run time); `false` when the table is full.
    pub(super) fn learn(&self, id: NodeId, addr: SocketAddr, how: &str) -> bool {
        if id == self.me() || id == ANY {
            return false;
        }
        self.addrs.learn(id, addr, how, MAX_LINKS);
        self.addrs.get(id).is_some()
    }

    /// Our directory (what we tell every node and candidate).
    fn directory(&self, d: &Driven, now: u64) -> Directory {
        let node = &d.node;
        let m = node.membership();
        let known = m
            .live
            .iter()
            .filter(|&&(p, _)| p != self.me())
            .filter_map(|&(p, _)| Some((p, self.addrs.get(p)?)))
            .take(directory::MAX_LISTED)
            .collect();
        Directory {
            leased: node.lease_state(now) != sluice_coord::node::LeaseState::Expired,
            voters: m.voters,
            known,
        }
    }

    /// A round of directories: to every node with an address, and to every candidate
    /// address no known node is at. Learned nodes whose link is gone (fenced, left) are
    /// forgotten first.
    pub(super) fn directories(&self, d: &mut Driven, now: u64) -> Vec<(SocketAddr, Vec<u8>)> {
        let entries = self.addrs.all();
        for &(id, _) in &entries {
            if d.node.link_state(id, now).is_none() {
                self.addrs.forget(id);
                self.versions.forget(id);
            }
        }
        let payload = self.directory(d, now).encode();
        let mut out = Vec::new();
        let mut at_known = std::collections::BTreeSet::new();
        for (id, addr) in self.addrs.all() {
            let Some(addr) = addr else { continue };
            at_known.insert(addr);
            if let Ok(dg) = peer::seal(&self.key, self.me(), id, &payload) {
                out.push((addr, dg));
            }
        }
        let local = self.socket.local_addr().ok();
        for (addr, _) in self.candidates.list() {
            if at_known.contains(&addr) || Some(addr) == local {
                continue;
            }
            if let Ok(dg) = peer::seal(&self.key, self.me(), ANY, &payload) {
                out.push((addr, dg));
            }
        }
        self.counters
            .directories_sent
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// A directory from `from` (addressed to `to`), sent from `src`.
    pub(super) fn on_directory(
        &self,
        from: NodeId,
        to: NodeId,
        payload: &[u8],
        src: SocketAddr,
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        let Ok(dir) = Directory::decode(payload) else {
            self.counters
                .rejected_malformed
                .fetch_add(1, Ordering::Relaxed);
            return Vec::new();
        };
        if from == self.me() || from == ANY {
            // Discovery found our own address (a DNS name lists every pod, us included).
            return Vec::new();
        }
        self.counters
            .directories_received
            .fetch_add(1, Ordering::Relaxed);
        let mut d = self.node.lock();
        let now = self.now();
        let mut out = Vec::new();
        if dir.voters != d.node.membership().voters && !self.adopt(&mut d, &dir, from, now) {
            self.counters
                .rejected_membership
                .fetch_add(1, Ordering::Relaxed);
            if d.warned.insert(from) {
                tracing::warn!(
                    node = self.me(),
                    peer = from,
                    addr = %src,
                    theirs = ?dir.voters,
                    ours = ?d.node.membership().voters,
                    "a key holder counts other voting members: not linked (give every node \
                     the same --members, or none to a joiner)"
                );
            }
            // Still tell it ours: a joiner that may adopt them needs to hear them.
            if to == ANY {
                out.extend(self.reply(&d, from, src, now));
            }
            return out;
        }
        let how = self
            .candidates
            .source(src)
            .unwrap_or_else(|| "contact".to_owned());
        let weight = d.node.config().join_weight;
        let mut linked = Vec::new();
        if self.learn(from, src, &how) && d.node.add_peer(from, weight, now) {
            linked.push(from);
        }
        for &(id, addr) in &dir.known {
            if id != self.me()
                && id != ANY
                && self.learn(id, addr, &format!("gossip:{from}"))
                && d.node.add_peer(id, weight, now)
            {
                linked.push(id);
            }
        }
        let new = !linked.is_empty();
        if new {
            tracing::info!(
                node = self.me(),
                from,
                ?linked,
                "linked with nodes found at run time"
            );
        }
        // It does not know our id (or has just learned of us): answer at once.
        if to == ANY || new {
            out.extend(self.reply(&d, from, src, now));
        }
        out.extend(self.collect(&mut d, now));
        out
    }

    fn reply(
        &self,
        d: &Driven,
        to: NodeId,
        addr: SocketAddr,
        now: u64,
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        let payload = self.directory(d, now).encode();
        peer::seal(&self.key, self.me(), to, &payload)
            .map(|dg| vec![(addr, dg)])
            .unwrap_or_default()
    }

    /// Takes the voters of a leased sender, if this node may (see the module docs): it
    /// starts again as a new incarnation, a joiner among them. Returns whether it did.
    fn adopt(&self, d: &mut Driven, dir: &Directory, from: NodeId, now: u64) -> bool {
        if self.spec.members.is_some()
            || d.ever_leased
            || !dir.leased
            || dir.voters.is_empty()
            || dir.voters.binary_search(&self.me()).is_ok()
        {
            return false;
        }
        let inc = d.node.incarnation() + 1;
        let weight = d.node.config().join_weight;
        let mut links: Vec<(NodeId, f64)> = self.peers.values().map(|p| (p.id, p.weight)).collect();
        links.retain(|&(p, _)| p != from);
        links.push((from, weight));
        let Ok(cfg) = node_config(&self.spec, self.me(), dir.voters.clone(), links, inc) else {
            return false;
        };
        let Ok(node) = Node::new(cfg, now) else {
            return false;
        };
        tracing::info!(
            node = self.me(),
            voters = ?dir.voters,
            from,
            incarnation = inc,
            "joining a running cluster: took the voters of a leased node"
        );
        d.node = node;
        d.live.clear();
        if let Some(path) = &self.spec.state_file
            && persist_incarnation(path, inc).is_ok()
        {
            d.persisted = inc;
        }
        d.logged_incarnation = inc;
        true
    }
}
