//! Leases from a quorum, votes, fences and dead floors, folds, starting again
//! (docs/PROTOCOL.md, "Leases and fences").

use super::*;

/// `lease·(1+ρ)²`: how long a member waits after it last heard an incarnation (or since its
/// own start) before it votes to fence it. With clock rates within `[1/(1+ρ), 1+ρ]`, the
/// lease an echo of that member gave ended before the vote in real time.
pub(super) fn silence(cfg: &Config) -> Nanos {
    let r = 1.0 + cfg.max_drift;
    (cfg.lease as f64 * r * r).ceil() as Nanos
}

/// How long a node that held a lease goes without one before it starts again as a new
/// incarnation (its old one may be fenced: it must never hold a lease again).
pub(super) fn orphan_after(cfg: &Config) -> Nanos {
    2 * cfg.lease
}

/// A restarted node's quarantine: `(lease + orphan_after)·(1+ρ)²` and a cycle. The votes
/// of the incarnation it follows died with it; by the end of this, every incarnation such
/// a vote fenced has lost its lease and, not renewed by a quorum, started again.
pub(super) fn quarantine(cfg: &Config) -> Nanos {
    let r = 1.0 + cfg.max_drift;
    ((cfg.lease + orphan_after(cfg)) as f64 * r * r).ceil() as Nanos + cfg.cycle
}

/// `count` members of `n`, the lowest among them or not, make a quorum: more than half, or
/// exactly half with the lowest id. Any two quorums share a member.
pub(crate) fn is_quorum(count: usize, has_lowest: bool, n: usize) -> bool {
    2 * count > n || (2 * count == n && has_lowest)
}

/// The largest `v` such that the members (sorted) whose `value` is at least `v` make a
/// quorum; `None` without members.
pub(super) fn quorum_level(members: &[NodeId], value: impl Fn(NodeId) -> u64) -> Option<u64> {
    let lowest = *members.first()?;
    // Asked on every message received (the lease): no allocation for up to 16 members.
    let mut vals = StackVec::<(u64, NodeId), 16>::new();
    vals.extend(members.iter().map(|&m| (value(m), m)));
    vals.sort_unstable_by(|a, b| b.cmp(a));
    let mut has_lowest = false;
    for (count, &(v, m)) in vals.iter().enumerate() {
        has_lowest |= m == lowest;
        // A prefix of the descending values is a subset of `{value ≥ v}`, and a superset
        // of a quorum is one.
        if is_quorum(count + 1, has_lowest, members.len()) {
            return Some(v);
        }
    }
    None
}

impl Node {
    /// Whether leases apply (see [`Leases`]).
    pub(super) fn leasing(&self) -> bool {
        self.cfg.leases == Leases::Quorum
    }

    /// Whether this node is a voting member (a joiner is not).
    pub(super) fn is_member(&self) -> bool {
        self.members.binary_search(&self.cfg.id).is_ok()
    }

    /// Whether this incarnation is in its quarantine at `now`.
    pub(super) fn quarantined(&self, now: Nanos) -> bool {
        now < self.quarantine_until
    }

    /// The lease from the latest echoes: the largest `t + lease` such that a quorum (us
    /// included) echoed one of our messages sent at `t` or later.
    pub(super) fn refresh_lease(&mut self, now: Nanos) {
        if !self.leasing() {
            self.lease_until = Nanos::MAX;
            self.leased_once = true;
            return;
        }
        let (me, lease, links) = (self.cfg.id, self.cfg.lease, &self.links);
        let end = quorum_level(&self.members, |m| {
            if m == me {
                Nanos::MAX
            } else {
                links
                    .get(&m)
                    .filter(|l| l.echoed > 0)
                    .map_or(0, |l| l.echoed.saturating_add(lease))
            }
        })
        .unwrap_or(0);
        // A node that is not a member holds nothing shared; its lease is the members'.
        self.lease_until = end;
        if end > now {
            self.leased_once = true;
        }
    }

    /// Our earlier incarnations are dead (a node runs one at a time): say so, so that
    /// peers fold their links with them without waiting for a fence.
    pub(super) fn own_past_is_dead(&mut self, now: Nanos) {
        if self.inc > 1 {
            self.set_dead(self.cfg.id, self.inc - 1, now);
        }
    }

    /// At every tick: renew the lease, vote, commit fences, and start again if our lease has
    /// been out for [`orphan_after`].
    pub(super) fn fail_over(&mut self, now: Nanos) {
        self.refresh_lease(now);
        if !self.leasing() {
            return;
        }
        self.cast_votes(now);
        self.commit(now);
        self.forget_departed(now);
        // Not with `Fallback::LastShare`, which keeps enforcing the last share through a
        // cut by choice (no strict bound to keep): it starts again once told it was fenced.
        let orphan = self.leased_once
            && self.cfg.fallback != Fallback::LastShare
            && now >= self.lease_until.saturating_add(orphan_after(&self.cfg))
            && matches!(self.lifecycle, Lifecycle::Active | Lifecycle::Joining);
        if orphan {
            self.reincarnate(now);
        }
    }

    /// Votes to fence every incarnation we know of and have not heard for [`silence`] (nor
    /// since we started): a promise never to echo it again (see `Node::echo_for`). Only
    /// under a lease: a node cut off from a quorum could not make a fence with others on
    /// its side, and its promises would only keep the other side's leases from coming
    /// back after the cut heals.
    fn cast_votes(&mut self, now: Nanos) {
        let wait = silence(&self.cfg);
        if now < self.started.saturating_add(wait) || self.lease_state(now) == LeaseState::Expired {
            return;
        }
        let me = self.cfg.id;
        let mut targets: BTreeSet<NodeId> = self.members.iter().copied().collect();
        targets.extend(self.links.keys().copied());
        targets.extend(self.votes.keys().copied());
        targets.remove(&me);
        for p in targets {
            let floor = self.dead.get(&p).copied().unwrap_or(0);
            let link = self.links.get(&p);
            let link_inc = link.map_or(0, |l| l.inc);
            let voted = self.votes.get(&p);
            // The latest incarnation we know of: ours, another voter's, or the first one
            // of a member we never heard (it may run unheard).
            let known = voted
                .and_then(|v| v.values().max().copied())
                .unwrap_or(0)
                .max(link_inc)
                .max(u64::from(self.members.binary_search(&p).is_ok()));
            let mine = voted.and_then(|v| v.get(&me).copied()).unwrap_or(0);
            if known <= floor || known <= mine {
                continue;
            }
            let heard = link
                .filter(|l| l.inc == known)
                .and_then(|l| l.last_recv)
                .unwrap_or(0)
                .max(self.started);
            if now >= heard.saturating_add(wait) {
                self.votes.entry(p).or_default().insert(me, known);
            }
        }
    }

    /// Whether we echo the incarnation our link with `p` is with: not in quarantine, and not
    /// one we voted to fence.
    pub(super) fn echo_for(&self, p: NodeId, now: Nanos) -> Nanos {
        let Some(l) = self.links.get(&p) else {
            return 0;
        };
        let voted = self
            .votes
            .get(&p)
            .and_then(|v| v.get(&self.cfg.id))
            .is_some_and(|&v| v >= l.inc);
        // Only a member's echo makes a lease, so only a member's quarantine holds it back (a
        // joiner's echo tells a peer it heard it: `Link::heard_us`).
        let quarantined = self.quarantined(now) && self.is_member();
        if l.inc == 0 || voted || quarantined {
            0
        } else {
            l.echo
        }
    }

    /// Votes and dead floors told by a peer: facts about the cluster, whoever tells them.
    pub(super) fn take_fences(
        &mut self,
        now: Nanos,
        votes: &[(NodeId, NodeId, u64)],
        dead: &[(NodeId, u64)],
    ) {
        if !self.leasing() || (votes.is_empty() && dead.is_empty()) {
            return;
        }
        for &(node, inc) in dead {
            if self.set_dead(node, inc, now) {
                self.changes.fences += 1;
            }
        }
        for &(voter, node, inc) in votes {
            if inc > self.dead.get(&node).copied().unwrap_or(0) {
                let v = self
                    .votes
                    .entry(node)
                    .or_default()
                    .entry(voter)
                    .or_insert(0);
                *v = (*v).max(inc);
            }
        }
        self.commit(now);
    }

    /// A quorum of votes against incarnations up to `v` of a node is a fence on them.
    fn commit(&mut self, now: Nanos) {
        let members = &self.members;
        let fenced: Vec<(NodeId, u64)> = self
            .votes
            .iter()
            .filter_map(|(&n, voters)| {
                let v = quorum_level(members, |m| voters.get(&m).copied().unwrap_or(0))?;
                (v > 0).then_some((n, v))
            })
            .collect();
        for (n, v) in fenced {
            if self.set_dead(n, v, now) {
                self.changes.fences += 1;
            }
        }
    }

    /// Incarnations up to `inc` of `node` are dead or fenced: our link with one of them is
    /// folded into our bases and never heard again; if that is us, we start again. Returns
    /// whether the floor moved.
    pub(super) fn set_dead(&mut self, node: NodeId, inc: u64, now: Nanos) -> bool {
        let floor = self.dead.entry(node).or_insert(0);
        if inc <= *floor {
            return false;
        }
        *floor = inc;
        self.dead_version = self.dead_version.wrapping_add(1);
        if node != self.cfg.id && self.members.binary_search(&node).is_err() {
            self.departed.insert(node, now);
        }
        if let Some(v) = self.votes.get_mut(&node) {
            v.retain(|_, x| *x > inc);
            if v.is_empty() {
                self.votes.remove(&node);
            }
        }
        if node == self.cfg.id {
            if inc >= self.inc {
                // A floor above our incarnation: an incarnation of our id above ours ran, so
                // A1 or A3 does not hold (two processes with one id, or ours went backwards:
                // a state file added after starts from the clock). Start again above it, or
                // every peer would ignore us for ever; counted for the operator. Above the
                // floor's next one too: a node tells its own floor as its incarnation − 1,
                // so that one may be live in another process, and two processes must never
                // share an incarnation (their counters would mix on every link).
                if inc > self.inc {
                    self.id_conflicts += 1;
                    self.inc = inc + 1;
                }
                self.reincarnate(now);
            }
            return true;
        }
        if self
            .links
            .get(&node)
            .is_some_and(|l| l.inc != 0 && l.inc <= inc)
        {
            for ks in self.keys.values_mut() {
                ks.fold(node);
            }
            self.base_version += 1;
            // A retirement's net we folded out for it went with it: if it had folded the net
            // in, it is in its bases; if not, in its counters. Either way it is gone.
            self.pending_folds.retain(|&(p, _), _| p != node);
            if let Some(l) = self.links.get_mut(&node) {
                l.unlink();
            }
            self.confirms.remove(&node);
            self.usable_cache = None;
            // A joiner that is gone leaves no link behind (memory follows the live
            // membership); its dead floor keeps its old incarnations out, and a later one
            // comes back as a joiner does.
            if self.members.binary_search(&node).is_err() {
                self.links.remove(&node);
            }
        }
        true
    }

    /// Starts again as the next incarnation holding only the reservation: what this one
    /// held is void (it may be fenced and minted again), and peers fold their links with it.
    /// The votes, dead floors and demand estimates stay: this is the same process.
    pub(super) fn reincarnate(&mut self, now: Nanos) {
        self.inc += 1;
        self.base_version += 1;
        self.started = now;
        self.default_base = self.reservation;
        self.lease_until = 0;
        self.leased_once = false;
        let base = i64::try_from(self.default_base).unwrap_or(i64::MAX);
        for ks in self.keys.values_mut() {
            ks.base = base;
            ks.links = SmallMap::new();
            ks.seen_sum = 0;
            ks.given_sum = 0;
            ks.enforced = None;
        }
        for l in self.links.values_mut() {
            // Echoes of our old incarnation's messages renew nothing now.
            l.echoed = 0;
        }
        self.pending_folds.clear();
        self.confirms.clear();
        self.audit.leave_wave();
        self.usable_cache = None;
        if self.lifecycle == Lifecycle::Joining && self.is_member() {
            self.lifecycle = Lifecycle::Active;
        }
        self.own_past_is_dead(now);
    }

    /// The votes to tell a peer: every one no dead floor covers yet.
    pub(super) fn votes_to_send(&self) -> Vec<(NodeId, NodeId, u64)> {
        self.votes
            .iter()
            .flat_map(|(&n, v)| v.iter().map(move |(&voter, &inc)| (voter, n, inc)))
            .collect()
    }

    /// The dead floors we tell (in messages and audit readings): the members', our own id's,
    /// and a departed joiner's for `forget_departed / 2` after it moved here, so that every
    /// node that learned it keeps it past the time anyone tells it (docs/PROTOCOL.md,
    /// "Forgetting the departed").
    pub(super) fn dead_list(&self, now: Nanos) -> Vec<(NodeId, u64)> {
        let told = self.cfg.forget_departed / 2;
        self.dead
            .iter()
            .filter(|&(n, _)| {
                self.departed
                    .get(n)
                    .is_none_or(|&t| now.saturating_sub(t) < told)
            })
            .map(|(&n, &v)| (n, v))
            .collect()
    }

    /// Forgets the dead floors of departed joiners after `Config::forget_departed` once no
    /// link with them is left: every node linked with a dead incarnation has folded it or
    /// started again by then, and a datagram of it replayed later opens no capacity (a link
    /// made at run time counts nothing before the peer echoes it, `Link::heard_us`). So
    /// churn of joiners' ids leaves no growing state behind.
    fn forget_departed(&mut self, now: Nanos) {
        // A link made at run time that has heard nothing from its peer for two leases (a
        // node listed in a directory that died before we heard it, or just after we fenced
        // it) holds nothing on either side: it counts and gives only once heard
        // (`Link::heard_us`). It goes, so that memory follows the live membership and the
        // id's floor can be forgotten. A directory that lists the node again makes it again.
        let quiet = 2 * self.cfg.lease;
        let unheard: Vec<NodeId> = self
            .links
            .iter()
            .filter(|&(p, l)| {
                l.opened != 0
                    && l.inc == 0
                    && now.saturating_sub(l.opened) >= quiet
                    && self.members.binary_search(p).is_err()
            })
            .map(|(&p, _)| p)
            .collect();
        for p in unheard {
            for ks in self.keys.values_mut() {
                ks.fold(p);
            }
            self.links.remove(&p);
            self.confirms.remove(&p);
            self.pending_folds.retain(|&(q, _), _| q != p);
            self.usable_cache = None;
        }
        let after = self.cfg.forget_departed;
        let (links, dead) = (&self.links, &mut self.dead);
        self.departed.retain(|n, &mut t| {
            let keep = now.saturating_sub(t) < after || links.contains_key(n);
            if !keep {
                dead.remove(n);
            }
            keep
        });
    }

    /// Dead floors for our own id above our incarnation we heard (and started again above):
    /// another process runs with our id, or our incarnation went backwards (docs/PROTOCOL.md,
    /// "Assumptions").
    #[must_use]
    pub fn id_conflicts(&self) -> u64 {
        self.id_conflicts
    }

    /// The dead floors (incarnations up to the value of the node are dead or fenced).
    #[must_use]
    pub fn dead_floors(&self) -> &BTreeMap<NodeId, u64> {
        &self.dead
    }

    /// Votes to fence that no dead floor covers yet, per node: per voter the incarnation.
    #[must_use]
    pub fn pending_votes(&self) -> &BTreeMap<NodeId, BTreeMap<NodeId, u64>> {
        &self.votes
    }
}
