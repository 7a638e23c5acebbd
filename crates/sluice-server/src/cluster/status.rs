//! What `/v1/cluster` shows of the driver and its node.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use sluice_coord::node::{Fallback, LeaseState, LinkState};
use sluice_coord::wire::{Lifecycle, NodeId};

use super::{Cluster, SCALE, scaled};
use crate::peer::Transport;
use crate::status::{
    ClusterInfo, ClusterStatus, DeadFloor, KeyShareStatus, MemberStatus, MembershipStatus,
    PeerCounters,
};

fn lifecycle_name(l: Lifecycle) -> &'static str {
    match l {
        Lifecycle::Joining => "joining",
        Lifecycle::Active => "active",
        Lifecycle::Leaving => "leaving",
        Lifecycle::Left => "left",
    }
}

fn fallback_name(f: Fallback) -> String {
    match f {
        Fallback::None => "none".into(),
        Fallback::Reserved(x) => format!("reserved:{x}"),
        Fallback::LastShare => "last-share".into(),
    }
}

impl<T: Transport> ClusterInfo for Cluster<T> {
    fn status(&self) -> ClusterStatus {
        let d = self.node.lock();
        // What the engine enforces: the shares are computed `guard` ahead (see `collect`).
        let now = self.now().saturating_add(self.guard);
        let node = &d.node;
        let cfg = node.config();
        let m = node.membership();
        // Configured peers, nodes learned at run time, and nodes linked with.
        let mut ids: BTreeSet<NodeId> = self.peers.keys().copied().collect();
        ids.extend(self.addrs.all().into_iter().map(|(id, _)| id));
        ids.extend(m.live.iter().map(|&(p, _)| p));
        ids.extend(m.voters.iter().copied());
        ids.remove(&self.me);
        let members = ids
            .into_iter()
            .map(|id| {
                let a = self.addrs.view(id);
                MemberStatus {
                    id,
                    addr: a.current.map(|a| a.to_string()),
                    host: a.host,
                    resolve_error: a.error,
                    weight: self.peers.get(&id).map_or(cfg.join_weight, |p| p.weight),
                    link: match node.link_state(id, now) {
                        Some(LinkState::Up) => "up",
                        Some(LinkState::Suspect) => "suspect",
                        Some(LinkState::Down) | None => "down",
                    }
                    .into(),
                    incarnation: node.peer_incarnation(id),
                    voter: m.voters.binary_search(&id).is_ok(),
                    wire_version: self.versions.speak(id),
                    discovered: a.source,
                }
            })
            .collect();
        let keys = node
            .active_keys()
            .map(|k| {
                let units = node.enforced(k, now);
                let global = d.rules.get(&k).copied().unwrap_or(0);
                let (domain, rule) = self.shares.rule(k).unzip();
                KeyShareStatus {
                    key: format!("{k:016x}"),
                    domain,
                    rule,
                    share: units as f64 / SCALE as f64,
                    limit: scaled(global, units),
                    global_limit: global,
                    demand: node.demand(k) / SCALE as f64,
                }
            })
            .collect();
        let c = &self.counters;
        ClusterStatus {
            node_id: self.me,
            incarnation: node.incarnation(),
            lifecycle: lifecycle_name(node.lifecycle()).into(),
            lease: match node.lease_state(now) {
                LeaseState::Valid => "valid",
                LeaseState::Expiring => "expiring",
                LeaseState::Expired => "expired",
            }
            .into(),
            fallback: fallback_name(cfg.fallback),
            quarantine_ms: node.quarantine_until().saturating_sub(now) as f64 / 1e6,
            gamma: cfg.gamma,
            gamma_auto: d.gamma_auto,
            live_members: d.live.iter().copied().collect(),
            cycle_ms: cfg.cycle as f64 / 1e6,
            members,
            peers_unresolved: self.addrs.unresolved(),
            default_share: node.default_enforced(now) as f64 / SCALE as f64,
            keys,
            dead: node
                .dead_floors()
                .iter()
                .map(|(&node, &incarnation)| DeadFloor { node, incarnation })
                .collect(),
            pending_votes: node
                .pending_votes()
                .iter()
                .flat_map(|(&n, v)| v.iter().map(move |(&voter, &inc)| (voter, n, inc)))
                .collect(),
            audit_rounds: node.audit_stats().0,
            audit_minted_share: node.audit_stats().1 as f64 / SCALE as f64,
            cap: crate::status::KeyCap::of(node),
            peer: PeerCounters {
                messages_sent: c.messages_sent.load(Ordering::Relaxed),
                bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
                messages_received: c.messages_received.load(Ordering::Relaxed),
                bytes_received: c.bytes_received.load(Ordering::Relaxed),
                rejected_unauthenticated: c.rejected_unauthenticated.load(Ordering::Relaxed),
                rejected_malformed: c.rejected_malformed.load(Ordering::Relaxed),
                rejected_version: c.rejected_version.load(Ordering::Relaxed),
                unaddressed: c.unaddressed.load(Ordering::Relaxed),
                rejected_membership: c.rejected_membership.load(Ordering::Relaxed)
                    + node.refused_membership(),
                directories_sent: c.directories_sent.load(Ordering::Relaxed),
                directories_received: c.directories_received.load(Ordering::Relaxed),
            },
            membership: MembershipStatus {
                version: format!("{:016x}", m.version),
                voters: m.voters.clone(),
                joins: m.changes.joins,
                leaves: m.changes.leaves,
                fences: m.changes.fences,
                refused: m.changes.refused,
                candidates: self.candidates.list().len(),
                discovery_errors: self.candidates.errors(),
            },
        }
    }
}
