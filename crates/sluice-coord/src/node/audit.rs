//! The capacity audit (docs/PROTOCOL.md, "The capacity audit"): capacity that no settlement
//! will ever bring back (the only record of an estate died with a second failure, or a
//! settlement waits for an answer nobody can give) is counted as missing and minted again,
//! once, by the root.
//!
//! Why a sum of bases is the whole limit: per key `own_i = base_i + Σ_j seen − Σ_j given`,
//! and on a link between two live incarnations the counters of both ends and what is in
//! flight cancel (`given_{i→j} = seen_{j←i} + in flight`). So when every link is between live
//! incarnations, what exists, in the nodes or in flight, is `Σ base_i + Σ pending fold nets`
//! plus whatever is in dead incarnations' estates. The audit reads that sum at one instant
//! (two waves: every node's reading stays unchanged from the first wave to the second, and
//! the first wave ends before the second starts), fences the estates of every incarnation
//! dead at that instant (a settlement of one finishes empty from then on) and mints
//! `L − sum`: the fenced estates and anything lost for good.

use super::*;
use crate::wire::{Audit, AuditReport, Wave};

/// A settlement younger than this many leases makes its node *busy*: the root waits for it
/// rather than fence its estate (a crash is settled by its heir, as seed 003 §IV says; the
/// audit is for what no heir will settle).
const BUSY_LEASES: u64 = 3;

/// A node's part in the audit.
#[derive(Debug, Clone, Default)]
pub(super) struct AuditState {
    /// The wave we are in.
    wave: Option<Wave>,
    /// Our parent in it (`None`: we are the root, or in no wave).
    parent: Option<NodeId>,
    /// Our neighbours' incarnations when we joined (0: not known yet).
    joined: Vec<(NodeId, u64)>,
    /// Per neighbour, what its latest message of our wave said (from the incarnation our link
    /// is with, addressed to ours).
    heard: SmallMap<NodeId, Heard>,
    /// Our subtree's report, once complete.
    report: Option<AuditReport>,
    /// What we read at a gather: compared at its confirm, and kept through the confirm only
    /// if it was ok and nothing moved.
    reading: Option<Reading>,
    /// Incarnations below `v` of node `n` are dead and their estates fenced.
    fence: BTreeMap<NodeId, u64>,
    /// The root: when its current round started, the next round, the gather's report (kept
    /// for the mint), and whether the round is over.
    started: Nanos,
    next_round: u64,
    /// The last round ended with a mint (or found nothing missing).
    confirmed_last: bool,
    gathered: Option<AuditReport>,
    over: bool,
    /// Units minted by this node (every key's default), and rounds it confirmed as root.
    minted: u64,
    confirmed: u64,
    /// Our index among the members, sorted (our bit in [`AuditReport::members`]), and
    /// whether we are the root: worked out once, asked for on every message and tick
    /// (scanning 1,000 members each time made a 1,000-node run 1.4 times slower).
    rank: Option<usize>,
    root: bool,
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
        let mut members = cfg.members.clone();
        members.sort_unstable();
        members.dedup();
        let rank = members.binary_search(&cfg.id).ok();
        Self {
            root: cfg.audit_every.is_some() && rank == Some(0),
            rank,
            ..Self::default()
        }
    }

    /// `(node, incarnation)` is an estate the audit fenced.
    pub(super) fn fenced(&self, node: NodeId, inc: u64) -> bool {
        self.fence.get(&node).is_some_and(|&v| inc < v)
    }

    /// We reincarnated: what we read is not what we hold. This wave fails (we report so to
    /// our parent); we take part again from the next one.
    pub(super) fn leave_wave(&mut self) {
        self.heard = SmallMap::new();
        self.reading = None;
        self.gathered = None;
        self.over = true;
        self.report = self.wave.map(|_| AuditReport::default());
    }

    fn install(&mut self, fence: &[(NodeId, u64)]) {
        for &(n, v) in fence {
            let e = self.fence.entry(n).or_insert(0);
            *e = (*e).max(v);
        }
    }
}

/// Adds `b` into `a` (reports of two disjoint subtrees).
fn merge(a: &mut AuditReport, b: &AuditReport) {
    a.ok &= b.ok;
    a.busy |= b.busy;
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
    a.excluded.extend_from_slice(&b.excluded);
    a.excluded.sort_unstable();
    a.excluded.dedup();
}

impl Node {
    /// Audits run (see [`Config::audit_every`]) and we are the root: the lowest member.
    fn audit_root(&self) -> bool {
        self.audit.root
    }

    /// What we hold, read for a gather: our default base, per key our base and pending fold
    /// nets over it, our links, the neighbours whose incarnation we froze our link with.
    fn audit_reading(&self, wave: Wave, now: Nanos) -> Reading {
        let mut ok = matches!(self.lifecycle, Lifecycle::Active | Lifecycle::Joining);
        let default = i128::from(self.default_base);
        let mut devs: BTreeMap<Key, i128> = BTreeMap::new();
        for (&k, ks) in &self.keys {
            devs.insert(k, i128::from(ks.base) - default);
            // Counters only cancel on links with neighbours (whose every link we check).
            ok &= ks
                .links
                .iter()
                .all(|(p, _)| self.links.get(p).is_some_and(|l| l.neighbour && l.inc != 0));
        }
        for (f, _) in self.pending_folds.values() {
            *devs.entry(f.key).or_insert(0) += i128::from(f.net);
        }
        let links = self.neighbour_incs();
        let excluded = self
            .links
            .iter()
            .filter(|(_, l)| l.neighbour)
            .filter_map(|(&p, l)| Some((p, self.left_neighbour(p, l)?)))
            .collect();
        let mut members = Vec::new();
        if let Some(i) = self.audit.rank {
            members.resize(i / 8 + 1, 0);
            members[i / 8] |= 1 << (i % 8);
        }
        let busy_after = now.saturating_sub(BUSY_LEASES * self.cfg.lease);
        let busy = self.settling.values().any(|s| s.started > busy_after);
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
            version: self.ledger_version,
            links,
            report: AuditReport {
                ok,
                busy,
                defaults: self.default_base,
                devs,
                incs: if self.inc > 1 {
                    vec![(self.cfg.id, self.inc)]
                } else {
                    Vec::new()
                },
                members,
                excluded,
            },
        }
    }

    /// The incarnation of neighbour `p` that left the cluster, if we froze our link with it
    /// (its heir settled it). Only a node that left may be missing from a wave: one we froze
    /// for any other reason may be alive as a later incarnation we have not heard of (we may
    /// be the one cut off), holding capacity the wave would not count.
    fn left_neighbour(&self, p: NodeId, l: &Link) -> Option<u64> {
        let d = *self.dead_floor.get(&p)?;
        let frozen = self.frozen.contains_key(&(p, d)) || self.forgotten.contains(&(p, d));
        (l.inc == 0 && frozen && matches!(l.lifecycle, Lifecycle::Leaving | Lifecycle::Left))
            .then_some(d)
    }

    /// Every neighbour with the incarnation our link is with (0: none known).
    fn neighbour_incs(&self) -> Vec<(NodeId, u64)> {
        self.links
            .iter()
            .filter(|(_, l)| l.neighbour)
            .map(|(&p, l)| (p, l.inc))
            .collect()
    }

    /// A neighbour's incarnation we knew when we joined the wave has ended since (our link
    /// is with a later one, or with none). Whatever subtree it reported for, or would have,
    /// may be missing from the wave (its later incarnation can join the wave under another
    /// parent and look like a neighbour already counted): the wave fails here. Found by the
    /// counting sweep (`SWEEP_SEED=12`, overlapping failures): the root's only neighbour
    /// crashed before passing on its subtree's confirm, its restarted incarnation joined the
    /// confirm wave under another node, and the root minted on its own word, without the
    /// cut-off node's failed confirm: Σ enforced 1.022 L.
    fn neighbour_changed(&self) -> bool {
        self.audit
            .joined
            .iter()
            .any(|&(p, was)| was != 0 && self.links.get(&p).is_none_or(|l| l.inc != was))
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
            // Fenced before we compare (`take_audit` installed the parent's fence): from here
            // on no estate of an incarnation dead at the reading can reach a base of ours.
            let now_reading = self.audit_reading(
                Wave {
                    confirm: false,
                    ..wave
                },
                now,
            );
            // The same round's gather (the readings' waves are equal), read ok, and nothing
            // moved since.
            let same = self.audit.reading.as_ref().is_some_and(|r| {
                r.report.ok
                    // `busy` only ever clears as time passes (a settlement started since
                    // changed the version).
                    && *r == Reading {
                        report: AuditReport {
                            busy: r.report.busy,
                            ..now_reading.report.clone()
                        },
                        ..now_reading.clone()
                    }
            });
            if !same {
                self.audit.reading = None;
            }
        } else {
            self.audit.reading = None;
        }
        self.audit_complete(now);
    }

    /// Every neighbour is in our wave (or left the cluster): our subtree's report is ready.
    /// A gather reads what we hold here, after every neighbour joined and before we report:
    /// the sooner before the confirm, the less likely it changed meanwhile.
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
        for (&p, l) in self.links.iter().filter(|(_, l)| l.neighbour) {
            if self.audit.parent == Some(p) || self.left_neighbour(p, l).is_some() {
                continue;
            }
            match self
                .audit
                .heard
                .get(&p)
                .filter(|h| h.inc == l.inc && l.inc != 0)
            {
                Some(h) if h.child => match &h.report {
                    Some(r) => children.push(r.clone()),
                    None => return,
                },
                Some(_) => {}
                // Not heard in this wave yet: wait for it.
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
        if self.cfg.audit_every.is_none() {
            return;
        }
        let valid = to_inc == self.inc
            && self
                .links
                .get(&from)
                .is_some_and(|l| l.neighbour && l.inc == from_inc);
        if !valid {
            return;
        }
        let Some(f) = field else {
            if let Some(h) = self.audit.heard.get_mut(&from) {
                h.solicits = false;
            }
            return;
        };
        self.audit.install(&f.fence);
        let higher = self.audit.wave.is_none_or(|w| f.wave > w);
        if higher {
            // The root starts its own waves; a wave of another incarnation of it is dead.
            if self.audit_root() {
                return;
            }
            self.audit_join(f.wave, Some(from), now);
        }
        if self.audit.wave != Some(f.wave) {
            return;
        }
        // A reordered older message of this wave does not take a report back.
        let report = f.report.clone().or_else(|| {
            self.audit
                .heard
                .get(&from)
                .filter(|h| h.inc == from_inc)
                .and_then(|h| h.report.clone())
        });
        self.audit.heard.insert(
            from,
            Heard {
                inc: from_inc,
                child: f.child,
                acked_us: f.ack,
                solicits: !f.done,
                report,
            },
        );
        self.audit_complete(now);
        if self.audit_root() {
            self.audit_root_step(now);
        }
    }

    /// Our field for a message to `to`, if it still needs one.
    pub(super) fn audit_field(&self, to: NodeId) -> Option<Box<Audit>> {
        let wave = self.audit.wave?;
        let link = self.links.get(&to).filter(|l| l.neighbour && l.inc != 0)?;
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
        Some(Box::new(Audit {
            wave,
            child: parent,
            ack: accounted,
            done: accounted && acked && !owed,
            report: if parent {
                self.audit.report.clone()
            } else {
                None
            },
            // The fence goes with the confirm wave, where a node installs it on joining.
            fence: if wave.confirm {
                self.audit.fence.iter().map(|(&n, &v)| (n, v)).collect()
            } else {
                Vec::new()
            },
        }))
    }

    /// At every tick: the root starts rounds, moves them on, and mints.
    pub(super) fn audit_tick(&mut self, now: Nanos) {
        let Some(every) = self.cfg.audit_every else {
            return;
        };
        if !self.audit_root() || self.lifecycle != Lifecycle::Active {
            // A neighbour may have left since.
            self.audit_complete(now);
            return;
        }
        let timeout = every / 2;
        let stale = self.audit.wave.is_none_or(|w| w.root_inc != self.inc);
        // A round that failed (a node's holdings moved between the waves, a settlement was
        // under way) is tried again sooner than one that counted.
        let due = match (self.audit.over, self.audit.confirmed_last) {
            (true, true) => now >= self.audit.started + every,
            (true, false) => now >= self.audit.started + every / 5,
            (false, _) => now >= self.audit.started + timeout,
        };
        // Every neighbour's incarnation known: a wave can complete.
        let known = self.links.values().all(|l| !l.neighbour || l.inc != 0);
        if (stale || due) && known {
            self.audit.started = now;
            self.audit.over = false;
            self.audit.confirmed_last = false;
            self.audit.gathered = None;
            let round = self.audit.next_round;
            self.audit.next_round += 1;
            self.audit_join(
                Wave {
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
        if !report.ok || (!wave.confirm && report.busy) {
            // Somebody could not read, or a settlement is under way: try again next round.
            self.audit.over = true;
            return;
        }
        if !wave.confirm {
            // Every member read, or left.
            let mut members = self.cfg.members.clone();
            members.sort_unstable();
            members.dedup();
            let all = members.iter().enumerate().all(|(i, &m)| {
                report
                    .members
                    .get(i / 8)
                    .is_some_and(|b| b & (1 << (i % 8)) != 0)
                    || report.excluded.iter().any(|e| e.0 == m)
            });
            if !all {
                self.audit.over = true;
                return;
            }
            // The fence: every incarnation older than one that read, and every one that left,
            // is dead.
            let mut fence: Vec<(NodeId, u64)> = report.incs.clone();
            fence.extend(report.excluded.iter().map(|&(n, d)| (n, d + 1)));
            self.audit.install(&fence);
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
        if let Some(g) = self.audit.gathered.take() {
            self.audit.confirmed += 1;
            self.audit.confirmed_last = true;
            self.audit_mint(&g);
        }
    }

    /// Mints `L −` what the gather counted, per key, into our own base.
    fn audit_mint(&mut self, g: &AuditReport) {
        let limit = i128::from(self.cfg.limit);
        // Only nodes that left are absent from a round, and they handed everything over,
        // reservation included: nothing is held outside the readings.
        let total = i128::from(g.defaults);
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
                self.key_mut(*k).base = base;
            }
        }
        if add_default > 0 {
            self.holdings.push(Holding {
                node: self.cfg.id,
                part: Part::Minted(add_default),
            });
            self.default_base += add_default;
            self.audit.minted += add_default;
        }
        if changed {
            self.ledger_version += 1;
        }
    }

    /// Rounds confirmed as the root, and units of every key's default it minted.
    #[must_use]
    pub fn audit_stats(&self) -> (u64, u64) {
        (self.audit.confirmed, self.audit.minted)
    }
}
