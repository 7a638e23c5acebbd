//! The capacity audit (docs/PROTOCOL.md, "The capacity audit"): what dead incarnations held,
//! and what a restarted cluster's members no longer hold, is counted as missing and minted
//! again by the root.
//!
//! Why a sum of bases is the whole limit: per key `own_i = base_i + Σ_j seen − Σ_j given`,
//! and on a link between two live incarnations the counters of both ends and what is in
//! flight cancel (`given_{i→j} = seen_{j←i} + in flight`). So when every live link is
//! between readers, what the readers hold or have in flight is `Σ base_i + Σ pending fold
//! nets`. The audit reads that sum at one instant (two waves: every reading unchanged from
//! the first wave to the second, and the first wave ends before the second starts), with
//! what each member not read can hold without a lease (docs/PROTOCOL.md says why that is
//! all it can hold), and mints `L − sum`.

use super::*;
use crate::wire::{Audit, AuditReport, Part, Wave};

/// A node's part in the audit.
#[derive(Debug, Clone, Default)]
pub(super) struct AuditState {
    /// The wave we are in.
    wave: Option<Wave>,
    /// Our parent in it (`None`: we are the root, or in no wave).
    parent: Option<NodeId>,
    /// Our live neighbours' incarnations when we joined.
    joined: Vec<(NodeId, u64)>,
    /// Per neighbour, what its latest message of our wave said (from the incarnation our link
    /// is with, addressed to ours).
    heard: SmallMap<NodeId, Heard>,
    /// Our subtree's report, once complete.
    report: Option<AuditReport>,
    /// What we read at a gather: compared at its confirm, and kept through the confirm only
    /// if it was ok and nothing moved.
    reading: Option<Reading>,
    /// The confirm wave's dead floors (the root's, passed on).
    fence: Vec<(NodeId, u64)>,
    /// We are the root (worked out at every tick: see `Node::is_root`).
    root: bool,
    /// The root: when its current round started, the next round, our dead floors' version
    /// then, the gather's report (kept for the mint), and whether the round is over.
    started: Nanos,
    next_round: u64,
    dead_seen: u32,
    /// The last round ended with a mint (or found nothing missing).
    confirmed_last: bool,
    gathered: Option<AuditReport>,
    over: bool,
    /// Units minted by this node (every key's default), and rounds it confirmed as root.
    minted: u64,
    confirmed: u64,
    /// Our index among the members, sorted (our bit in [`AuditReport::members`]).
    rank: Option<usize>,
}

/// A neighbour's latest word in our wave.
#[derive(Debug, Clone)]
struct Heard {
    /// The incarnation it came from (the one our link was with then).
    inc: u64,
    /// It took us as its parent.
    child: bool,
    /// It has us accounted for.
    acked_us: bool,
    /// Its latest message asked for our word (it carried an audit field, not yet done).
    solicits: bool,
    /// Its subtree's report (a child's).
    report: Option<AuditReport>,
    /// The parts of its report we hold, while some are missing.
    parts: Option<Parts>,
}

/// A child's report arriving in parts ([`wire::Part`]): every part carries the report's
/// fields but `devs`, which it holds one slice of, in order.
#[derive(Debug, Clone)]
struct Parts {
    /// The report without its `devs`.
    head: AuditReport,
    slices: Vec<Option<Vec<(Key, i64)>>>,
    missing: usize,
}

impl Parts {
    /// Adds `part` of `r`; the whole report once every part is in. A part of another report
    /// (another head or count: the child's report failed since) starts over.
    fn add(this: &mut Option<Self>, r: &AuditReport, part: Part) -> Option<AuditReport> {
        let head = without_devs(r);
        let count = part.count as usize;
        let p = match this {
            Some(p) if p.head == head && p.slices.len() == count => p,
            _ => this.insert(Self {
                head,
                slices: vec![None; count],
                missing: count,
            }),
        };
        let slot = p.slices.get_mut(part.index as usize)?;
        if slot.is_none() {
            *slot = Some(r.devs.clone());
            p.missing -= 1;
        }
        if p.missing > 0 {
            return None;
        }
        let p = this.take()?;
        let mut whole = p.head;
        whole.devs = p.slices.into_iter().flatten().flatten().collect();
        Some(whole)
    }
}

/// What a node read at a gather.
#[derive(Debug, Clone, PartialEq)]
struct Reading {
    wave: Wave,
    inc: u64,
    version: u64,
    links: Vec<(NodeId, u64)>,
    report: AuditReport,
}

impl AuditState {
    /// The state of a node with configuration `cfg`.
    pub(super) fn new(cfg: &Config) -> Self {
        let rank = cfg.sorted_members().binary_search(&cfg.id).ok();
        Self {
            rank,
            ..Self::default()
        }
    }

    /// We reincarnated or leave: what we read is not what we hold. This wave fails (we
    /// report so to our parent); we take part again from the next one.
    pub(super) fn leave_wave(&mut self) {
        self.heard = SmallMap::new();
        self.reading = None;
        self.gathered = None;
        self.over = true;
        self.report = self.wave.map(|_| AuditReport::default());
    }
}

/// `r` but for its `devs` (what every part of it carries).
fn without_devs(r: &AuditReport) -> AuditReport {
    AuditReport {
        ok: r.ok,
        defaults: r.defaults,
        devs: Vec::new(),
        incs: r.incs.clone(),
        members: r.members.clone(),
        dead: r.dead.clone(),
    }
}

/// Adds `b` into `a` (reports of two disjoint subtrees).
fn merge(a: &mut AuditReport, b: &AuditReport) {
    a.ok &= b.ok;
    a.defaults = a.defaults.saturating_add(b.defaults);
    if a.defaults == u64::MAX {
        a.ok = false;
    }
    let mut devs: BTreeMap<Key, i64> = a.devs.iter().copied().collect();
    for &(k, d) in &b.devs {
        let e = devs.entry(k).or_insert(0);
        // A sum out of range would count wrong: the round fails instead.
        match e.checked_add(d) {
            Some(v) => *e = v,
            None => a.ok = false,
        }
    }
    a.devs = devs.into_iter().filter(|&(_, d)| d != 0).collect();
    let mut incs: BTreeMap<NodeId, u64> = a.incs.iter().copied().collect();
    for &(n, v) in &b.incs {
        // Two readings of one node in one wave: not a tree any more.
        if incs.insert(n, v).is_some() {
            a.ok = false;
        }
    }
    a.incs = incs.into_iter().collect();
    if a.members.len() < b.members.len() {
        a.members.resize(b.members.len(), 0);
    }
    for (x, &y) in a.members.iter_mut().zip(&b.members) {
        // A member read twice: not a tree any more.
        if *x & y != 0 {
            a.ok = false;
        }
        *x |= y;
    }
    let mut dead: BTreeMap<NodeId, u64> = a.dead.iter().copied().collect();
    for &(n, v) in &b.dead {
        let e = dead.entry(n).or_insert(0);
        *e = (*e).max(v);
    }
    a.dead = dead.into_iter().collect();
}

impl Node {
    /// The root we follow: the lowest member heard within a lease (or us).
    fn expected_root(&self, now: Nanos) -> NodeId {
        let me = self.cfg.id;
        self.members
            .iter()
            .copied()
            .find(|&m| {
                m == me
                    || self
                        .links
                        .get(&m)
                        .and_then(|l| l.last_recv)
                        .is_some_and(|t| now.saturating_sub(t) <= self.cfg.lease)
            })
            .unwrap_or(me)
    }

    /// Whether we are the audit's root now: audits on, a member, active, leased, and the
    /// root we follow. A root in quarantine is fine: the quorum it needs is counted among
    /// the readers out of quarantine.
    fn is_root(&self, now: Nanos) -> bool {
        self.audit.rank.is_some()
            && self.cfg.audit_every.is_some()
            && self.lifecycle == Lifecycle::Active
            && self.lease_state(now) != LeaseState::Expired
            && self.expected_root(now) == self.cfg.id
    }

    /// What we hold, read for a gather: our default base, per key our base and pending fold
    /// nets over it, our live links, our dead floors.
    fn audit_reading(&self, wave: Wave, now: Nanos) -> Reading {
        let mut ok = self.lifecycle == Lifecycle::Active;
        let default = i128::from(self.default_base);
        let mut devs: BTreeMap<Key, i128> = BTreeMap::new();
        for (&k, ks) in &self.keys {
            devs.insert(k, i128::from(ks.base) - default);
            // Counters only cancel on live links with neighbours (each heard in the wave).
            ok &= ks
                .links
                .iter()
                .all(|(p, _)| self.links.get(p).is_some_and(|l| l.neighbour && l.inc != 0));
        }
        for (&(_, k), &net) in &self.pending_folds {
            *devs.entry(k).or_insert(0) += i128::from(net);
        }
        // A member in quarantine is read but does not count toward the quorum: it cannot
        // vouch for the leases its earlier incarnation echoed (docs/PROTOCOL.md).
        let mut members = Vec::new();
        if let Some(i) = self.audit.rank.filter(|_| !self.quarantined(now)) {
            members.resize(i / 8 + 1, 0);
            members[i / 8] |= 1 << (i % 8);
        }
        let devs: Vec<(Key, i64)> = devs
            .into_iter()
            .filter(|&(_, d)| d != 0)
            .map(|(k, d)| {
                let v = i64::try_from(d);
                ok &= v.is_ok();
                (k, v.unwrap_or(0))
            })
            .collect();
        Reading {
            wave,
            inc: self.inc,
            version: self.base_version,
            links: self.neighbour_incs(),
            report: AuditReport {
                ok,
                defaults: self.default_base,
                devs,
                incs: vec![(self.cfg.id, self.inc)],
                members,
                dead: self.dead_list(now),
            },
        }
    }

    /// Every peer our link is live with (a neighbour of the law, or a member we exchange
    /// leases with), and its incarnation: the wave crosses every such link, since a member
    /// whose lease a reader echoes must be read too (docs/PROTOCOL.md).
    fn neighbour_incs(&self) -> Vec<(NodeId, u64)> {
        self.links
            .iter()
            .filter(|(_, l)| l.inc != 0)
            .map(|(&p, l)| (p, l.inc))
            .collect()
    }

    /// A neighbour's incarnation we knew when we joined the wave has ended since (our link
    /// is with a later one, or with none): whatever subtree it reported for may be missing
    /// from the wave, which fails here.
    fn neighbour_changed(&self) -> bool {
        self.audit
            .joined
            .iter()
            .any(|&(p, was)| self.links.get(&p).is_none_or(|l| l.inc != was))
    }

    /// Joins `wave`, from `parent` (`None`: we start it as the root).
    fn audit_join(&mut self, wave: Wave, parent: Option<NodeId>, now: Nanos) {
        let joined = self.neighbour_incs();
        let a = &mut self.audit;
        a.wave = Some(wave);
        a.parent = parent;
        a.joined = joined;
        a.heard = SmallMap::new();
        a.report = None;
        if wave.confirm {
            // The fence was installed before we compare (`take_audit`, `audit_root_step`).
            let now_reading = self.audit_reading(
                Wave {
                    confirm: false,
                    ..wave
                },
                now,
            );
            // The same round's gather (the readings' waves are equal), read ok, and nothing
            // moved since.
            let same = self
                .audit
                .reading
                .as_ref()
                .is_some_and(|r| r.report.ok && *r == now_reading);
            if !same {
                self.audit.reading = None;
            }
        } else {
            self.audit.reading = None;
        }
        self.audit_complete(now);
    }

    /// Every live link's peer is in our wave: our subtree's report is ready. A gather reads
    /// what we hold here, after every neighbour joined and before we report.
    fn audit_complete(&mut self, now: Nanos) {
        let Some(wave) = self.audit.wave else { return };
        if self.audit.report.is_some() {
            return;
        }
        if self.neighbour_changed() {
            self.audit.report = Some(AuditReport::default());
            return;
        }
        let mut children = Vec::new();
        for (&p, l) in self.links.iter().filter(|(_, l)| l.inc != 0) {
            if self.audit.parent == Some(p) {
                continue;
            }
            match self.audit.heard.get(&p).filter(|h| h.inc == l.inc) {
                Some(h) if h.child => match &h.report {
                    Some(r) => children.push(r.clone()),
                    None => return,
                },
                Some(_) => {}
                // Not heard in this wave yet: wait for it (or for its fence).
                None => return,
            }
        }
        let mut report = if wave.confirm {
            AuditReport {
                ok: self.audit.reading.is_some(),
                ..AuditReport::default()
            }
        } else {
            let reading = self.audit_reading(wave, now);
            let report = reading.report.clone();
            self.audit.reading = Some(reading);
            report
        };
        for r in &children {
            merge(&mut report, r);
        }
        self.audit.report = Some(report);
    }

    /// A neighbour's message (`from_inc`, addressed to `to_inc`). Only one from the
    /// incarnation our link is with, addressed to ours, counts: each end of every link then
    /// sees the other's live incarnation.
    pub(super) fn take_audit(
        &mut self,
        from: NodeId,
        (from_inc, to_inc): (u64, u64),
        field: Option<&Audit>,
        now: Nanos,
    ) {
        if self.cfg.audit_every.is_none() || !self.leasing() {
            return;
        }
        let valid = to_inc == self.inc && self.links.get(&from).is_some_and(|l| l.inc == from_inc);
        if !valid {
            return;
        }
        let Some(f) = field else {
            if let Some(h) = self.audit.heard.get_mut(&from) {
                h.solicits = false;
            }
            return;
        };
        // Only the root we follow; its later waves replace earlier ones.
        if f.wave.root != self.expected_root(now) {
            return;
        }
        let higher = self
            .audit
            .wave
            .is_none_or(|w| w.root != f.wave.root || f.wave > w);
        if higher {
            // A root runs its own rounds and is read by no other: two roots that each read
            // the other cannot both mint on one instant (docs/PROTOCOL.md).
            if self.audit.root {
                return;
            }
            // The confirm wave's floors first: what we compare must be what is left after.
            for &(n, v) in &f.fence {
                self.set_dead(n, v, now);
            }
            if self.audit.rank.is_none() && self.links.get(&from).is_none_or(|l| l.inc != from_inc)
            {
                return;
            }
            self.audit.fence = f.fence.clone();
            self.audit_join(f.wave, Some(from), now);
        }
        if self.audit.wave != Some(f.wave) {
            return;
        }
        // A reordered older message of this wave does not take a report back.
        let (mut report, mut parts) = self
            .audit
            .heard
            .remove(&from)
            .filter(|h| h.inc == from_inc)
            .map_or((None, None), |h| (h.report, h.parts));
        match (&f.report, f.part) {
            // A report we hold whole is not taken apart again by a part resent meanwhile.
            (Some(r), Some(part)) if report.is_none() => report = Parts::add(&mut parts, r, part),
            (Some(_), Some(_)) => {}
            (Some(r), None) => (report, parts) = (Some(r.clone()), None),
            (None, _) => {}
        }
        self.audit.heard.insert(
            from,
            Heard {
                inc: from_inc,
                child: f.child,
                acked_us: f.ack,
                solicits: !f.done,
                report,
                parts,
            },
        );
        self.audit_complete(now);
        if self.audit.root {
            self.audit_root_step(now);
        }
    }

    /// Our field for a message to `to`, if it still needs one: our `turn`-th send on the
    /// link picks which part of a report too large for one datagram goes (every part in
    /// turn, until the parent has them all).
    pub(super) fn audit_field(&self, to: NodeId, turn: u64) -> Option<Box<Audit>> {
        let wave = self.audit.wave?;
        let link = self.links.get(&to).filter(|l| l.inc != 0)?;
        let h = self.audit.heard.get(&to).filter(|h| h.inc == link.inc);
        // Our parent is the incarnation we joined from: a later one is not.
        let parent = self.audit.parent == Some(to)
            && self
                .audit
                .joined
                .iter()
                .any(|&(p, inc)| p == to && inc == link.inc);
        // We have it accounted: a child with its report, or any neighbour in the wave.
        let accounted = h.is_some_and(|h| !h.child || h.report.is_some());
        let acked = h.is_some_and(|h| h.acked_us);
        // Our parent needs our report; everyone needs to hear we are in the wave.
        let owed = parent && self.audit.report.is_some() && !acked;
        if accounted && acked && !owed && !h.is_some_and(|h| h.solicits) {
            return None;
        }
        let mut report = self.audit.report.as_ref().filter(|_| parent);
        let mut part = None;
        let cut;
        if let Some(r) = report.filter(|_| !wave.confirm) {
            // Half a datagram: the other half is for the keys.
            let ranges = wire::split_devs(&r.devs, self.cfg.max_message_bytes / 2);
            if ranges.len() > 1 {
                let index = (turn % ranges.len() as u64) as usize;
                cut = AuditReport {
                    devs: r.devs[ranges[index].clone()].to_vec(),
                    ..without_devs(r)
                };
                report = Some(&cut);
                part = Some(Part {
                    index: index as u32,
                    count: ranges.len() as u32,
                });
            }
        }
        Some(Box::new(Audit {
            wave,
            child: parent,
            ack: accounted,
            done: accounted && acked && !owed,
            report: report.cloned(),
            part,
            // The fence goes with the confirm wave, where a node installs it on joining.
            fence: if wave.confirm {
                self.audit.fence.clone()
            } else {
                Vec::new()
            },
        }))
    }

    /// At every tick: the root starts rounds, moves them on, and mints.
    pub(super) fn audit_tick(&mut self, now: Nanos) {
        // Without leases nothing fails, so nothing goes missing (and a node that hears only
        // its neighbours cannot tell the lowest member).
        let Some(every) = self.cfg.audit_every.filter(|_| self.leasing()) else {
            return;
        };
        let root = self.is_root(now);
        if root != self.audit.root {
            self.audit.root = root;
            // A round of ours is not finished by a node that is no longer the root, and a
            // new root starts its own.
            self.audit.over = true;
            self.audit.wave = None;
        }
        // A peer may have been folded since: the wave no longer waits for it.
        self.audit_complete(now);
        if !root {
            return;
        }
        let timeout = every / 2;
        let stale = self
            .audit
            .wave
            .is_none_or(|w| w.root != self.cfg.id || w.root_inc != self.inc);
        let fresh_deaths = self.audit.dead_seen != self.dead_version;
        // A round that failed is tried again sooner than one that counted; a new dead floor
        // (a fence, a restart) calls for one at once.
        let due = match (self.audit.over, self.audit.confirmed_last) {
            _ if fresh_deaths => now >= self.audit.started + self.cfg.cycle,
            (true, true) => now >= self.audit.started + every,
            (true, false) => now >= self.audit.started + self.cfg.lease / 2,
            (false, _) => now >= self.audit.started + timeout,
        };
        if stale || due {
            self.audit.started = now;
            self.audit.dead_seen = self.dead_version;
            self.audit.over = false;
            self.audit.confirmed_last = false;
            self.audit.gathered = None;
            self.audit.fence = Vec::new();
            let round = self.audit.next_round;
            self.audit.next_round += 1;
            self.audit_join(
                Wave {
                    root: self.cfg.id,
                    root_inc: self.inc,
                    round,
                    confirm: false,
                },
                None,
                now,
            );
        }
        self.audit_root_step(now);
    }

    /// The root's wave is complete: confirm a gather, or mint after a confirm.
    fn audit_root_step(&mut self, now: Nanos) {
        let (Some(wave), Some(report)) = (self.audit.wave, self.audit.report.clone()) else {
            return;
        };
        if self.audit.over {
            return;
        }
        if !report.ok {
            // Somebody could not read, or something moved: try again.
            self.audit.over = true;
            return;
        }
        if !wave.confirm {
            // A quorum of members read out of quarantine: any lease held meanwhile was heard
            // by one of them.
            let n = self.members.len();
            let read = (0..n)
                .filter(|&i| {
                    report
                        .members
                        .get(i / 8)
                        .is_some_and(|b| b & (1 << (i % 8)) != 0)
                })
                .count();
            let lowest = report.members.first().is_some_and(|b| b & 1 != 0);
            if !quorum::is_quorum(read, lowest, n) {
                self.audit.over = true;
                return;
            }
            // The fence: every reader's dead floors, and every incarnation older than one
            // that read.
            let mut fence: BTreeMap<NodeId, u64> = report.dead.iter().copied().collect();
            for &(m, inc) in &report.incs {
                let e = fence.entry(m).or_insert(0);
                *e = (*e).max(inc.saturating_sub(1));
            }
            let fence: Vec<(NodeId, u64)> = fence.into_iter().filter(|&(_, v)| v > 0).collect();
            for &(m, v) in &fence {
                self.set_dead(m, v, now);
            }
            if !self.audit.root || self.audit.wave != Some(wave) {
                return;
            }
            self.audit.fence = fence;
            self.audit.gathered = Some(report);
            self.audit_join(
                Wave {
                    confirm: true,
                    ..wave
                },
                None,
                now,
            );
            // A single node is complete at once.
            if self.audit.report.is_some() {
                self.audit_root_step(now);
            }
            return;
        }
        self.audit.over = true;
        // Minting is holding more: only under a lease (docs/PROTOCOL.md).
        if let Some(g) = self.audit.gathered.take()
            && self.lease_state(now) != LeaseState::Expired
        {
            self.audit.confirmed += 1;
            self.audit.confirmed_last = true;
            self.audit_mint(&g);
        }
    }

    /// What a member that was not read can hold: its first incarnation's initial share while
    /// that one may run (no dead floor covers it), else its reservation.
    fn unread_holds(&self, m: NodeId) -> u64 {
        if self.dead.get(&m).copied().unwrap_or(0) >= 1 {
            self.cfg.reservation(m)
        } else {
            self.cfg.initial_share(m)
        }
    }

    /// Mints `L −` what the gather counted, per key, into our own base.
    fn audit_mint(&mut self, g: &AuditReport) {
        let limit = i128::from(self.cfg.limit);
        let unread: u64 = self
            .members
            .iter()
            .filter(|&&m| g.incs.binary_search_by_key(&m, |r| r.0).is_err())
            .map(|&m| self.unread_holds(m))
            .sum();
        let total = i128::from(g.defaults) + i128::from(unread);
        let add_default = u64::try_from((limit - total).max(0)).unwrap_or(0);
        let devs: BTreeMap<Key, i64> = g.devs.iter().copied().collect();
        let add = |k: &Key| -> i128 {
            let dev = devs.get(k).copied().map_or(0, i128::from);
            (limit - total - dev).max(0)
        };
        let old_default = i128::from(self.default_base);
        let mut changed = add_default > 0;
        for (k, ks) in &mut self.keys {
            let a = add(k);
            changed |= a > 0;
            ks.base = i64::try_from(i128::from(ks.base) + a).unwrap_or(i64::MAX);
        }
        for k in devs.keys() {
            let a = add(k);
            if !self.keys.contains_key(k) && a != i128::from(add_default) {
                changed |= a > 0;
                let base = i64::try_from(old_default + a).unwrap_or(i64::MAX);
                self.admit_over_cap(*k);
                self.key_mut(*k).base = base;
            }
        }
        self.default_base += add_default;
        self.audit.minted += add_default;
        if changed {
            self.base_version += 1;
        }
    }

    /// Rounds confirmed as the root, and units of every key's default it minted.
    #[must_use]
    pub fn audit_stats(&self) -> (u64, u64) {
        (self.audit.confirmed, self.audit.minted)
    }
}
