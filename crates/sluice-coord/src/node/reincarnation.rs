//! Reincarnation: a node declared dead while running comes back as a new incarnation, holding
//! only what no estate can count.

use super::*;

impl Node {
    /// Told by the heir that incarnation `dead` was declared dead and inherited: come back
    /// as a new incarnation holding only the reservation (pitfall (c)).
    pub(super) fn reincarnate(
        &mut self,
        now: Nanos,
        dead: u64,
        version: Option<u64>,
        settler: Option<NodeId>,
    ) {
        if let Some(v) = version.filter(|_| dead == self.inc) {
            self.estate_versions.insert(self.inc, v);
        }
        let old = self.inc;
        // Keep our side of every link still live: if the peer's incarnation dies too, its
        // heir needs it (see `answer_settle` and `offer_late_folds`). After anything the
        // estate's ledger can hold, so never in the estate unless taken as a late fold.
        let side_version = self.ledger_version + 1;
        for (&p, l) in self.links.iter().filter(|(_, l)| l.inc != 0) {
            let counters = self
                .keys
                .iter()
                .filter_map(|(&k, ks)| ks.links.get(&p).map(|lk| (k, (lk.given, lk.seen))))
                .collect();
            let pending = self
                .pending_folds
                .values()
                .filter(|(f, _)| f.peer == p && f.peer_incarnation == l.inc)
                .map(|(f, v)| (f.key, f.seen, f.net, *v))
                .collect();
            let received = self
                .received_folds
                .iter()
                .filter(|(key, r)| key.0 == p && r.inc == l.inc)
                .map(|(&(_, k, seen), r)| (k, seen, r.net, r.version))
                .collect();
            let side = Frozen {
                counters,
                version: side_version,
                by_inc: old,
                pending,
                received,
                // Final sides are never forgotten (only a reincarnation makes them).
                used: now,
            };
            self.final_sides.insert((p, l.inc, old), side);
        }
        if let Some(h) = settler.filter(|_| dead == old) {
            self.estate_heirs.insert(old, h);
            self.offer_late_folds(old);
        }
        self.inc = dead.max(self.inc) + 1;
        self.priors.insert(self.inc, old);
        let member = self.cfg.members.contains(&self.cfg.id);
        self.holdings = if member {
            vec![Holding {
                node: self.cfg.id,
                part: Part::ReserveOnly,
            }]
        } else {
            Vec::new()
        };
        self.default_base = self.holdings.iter().map(|&h| self.cfg.part(h)).sum();
        self.keys.clear();
        // Our dead incarnation's pending folds are in its ledger, for its heir.
        self.pending_folds.clear();
        self.received_folds.clear();
        self.confirm_after.clear();
        self.clearing.clear();
        // A census is per incarnation (see `Node::take_census`).
        self.reminted = None;
        self.census = None;
        self.census_heard.clear();
        // So is a reading for the audit (the fence stays: those estates stay fenced).
        self.audit.leave_wave();
        if self.estate_heirs.contains_key(&old) {
            for (&w, ward) in &self.wards {
                self.ward_candidates
                    .insert((w, ward.inc), (old, ward.ledger.clone()));
            }
        }
        self.wards.clear();
        self.successions.clear();
        // `settled` and `dead_floor` survive: those incarnations are dead and settled (the
        // estates died with our old incarnation), and must never be settled twice.
        self.drop_settlements(old, version.filter(|_| dead == old));
        self.lease_until = 0;
        self.lease_inc = 0;
        self.ledger_inc = 0;
        self.orphaned_at = None;
        self.amnesiac = true;
        self.ledger_version += 1;
        self.usable_cache = None;
        for l in self.links.values_mut() {
            l.unlink();
            l.verdict = 0;
            if let Some(m) = l.mail.as_mut() {
                m.replies.clear();
            }
        }
        // Answers held until our heir held our folded ledger can go now: the old
        // incarnation's estate is final (its heir settled it before telling us, with the
        // ledger version the verdict names), and a dead neighbour's heir waits for them
        // (otherwise the cut never settles: it waits for us, we wait for an acknowledgement
        // from a heir that is itself dead to us). Each answer matches that estate: the
        // counters if the freeze is in it, nothing if not (see `answer_settle`); the replies
        // name the incarnation that froze the link, so a dead node that folded the link is
        // not counted twice.
        self.ledger_acked = self.ledger_version;
        for (asker, dead, inc) in std::mem::take(&mut self.held) {
            self.answer_settle(asker, dead, inc);
        }
        let _ = now;
    }

    /// The settlements our dead incarnation had not finished die with it; its heir settled
    /// it with the ledger version `estate` (if known). One that ledger records (the ward
    /// gone from its wards; or, not knowing the version, one our heir acknowledged) may have
    /// been acted on: its ward is told it is dead from now on (capacity lost, never counted
    /// twice). One it does not record was never heard of by anyone (requests and verdicts
    /// wait for the acknowledgement) and our heir revives the ward with a succession notice:
    /// the ward is alive, so it must be heard again. Keeping it dead to us left a node
    /// whose heir we were without a lease for good (a 4-ring at 21 % loss, node 1 cut off
    /// for 10 cycles: node 0 enforced nothing for ever).
    ///
    /// Rule 9: a ward we know is dead for certain (we heard from a later incarnation: it
    /// restarted) is not revived; our heir's successor notice reaches only its later
    /// incarnation, and nobody else holds the dead one's ledger, so its estate would be lost
    /// with us (a 4-ring without loss lost a quarter of the limit: node 1 cut off while its
    /// ward node 0 restarted). Its ledger is handed to the heir that settled us, which
    /// settles the ward in our place (`Node::take_handover`).
    ///
    /// Rule 10: an estate our dead incarnation inherited after that ledger version is in no
    /// estate of ours. If the ledger records the settlement (the ward gone from its wards,
    /// not yet listed as settled), or the ward is known dead, nobody else can settle it: it
    /// is handed to the same heir, which counts it once its settlement of us is in, less
    /// what that lacked ([`wire::HandoverKind::Inherited`]). Before, it was lost: a
    /// complete graph of 5 at 46.5 % loss, false suspicions only, ended at 0.8 L. If the
    /// ledger still lists the ward as ours, the settlement died unannounced with us (rule
    /// 6: a settlement with no neighbour to ask finishes at once, before anyone hears of
    /// it): our heir revives the ward, which still holds its capacity, so it must be heard
    /// again — a 5-node graph at 27 % loss whose leaf was settled by its cut-off heir
    /// ignored the revived leaf's gifts for ever (0.85 L).
    pub(super) fn drop_settlements(&mut self, old: u64, estate: Option<u64>) {
        let heir_known = self.estate_heirs.contains_key(&old);
        for ((n, inc), r) in std::mem::take(&mut self.inherited) {
            let Some(v) = estate.filter(|&v| heir_known && r.finish > v) else {
                continue;
            };
            if r.start <= v || self.links.get(&n).is_some_and(|l| l.inc > inc) {
                let handed = Handed {
                    ledger: r.ward.ledger,
                    kind: wire::HandoverKind::Inherited,
                    leaving: r.ward.leaving,
                };
                self.handovers.insert((old, n, inc), handed);
            } else {
                if self.dead_floor.get(&n) == Some(&inc) {
                    self.dead_floor.insert(n, r.floor_before);
                }
                if self.settled.get(&n) == Some(&inc) {
                    match r.settled_before {
                        Some(b) => self.settled.insert(n, b),
                        None => self.settled.remove(&n),
                    };
                }
            }
        }
        for ((n, inc), s) in std::mem::take(&mut self.settling) {
            let recorded = estate.map_or_else(|| self.announced(s.version), |v| s.version <= v);
            if recorded {
                let e = self.settled.entry(n).or_insert(0);
                *e = (*e).max(inc);
            } else if heir_known
                && s.origin.is_none()
                && self.links.get(&n).is_some_and(|l| l.inc > inc)
            {
                let handed = Handed {
                    ledger: self.handed_ledger(&s),
                    kind: wire::HandoverKind::Unfinished,
                    leaving: s.ward.leaving,
                };
                self.handovers.insert((old, n, inc), handed);
            } else {
                if heir_known && s.origin.is_none() {
                    let ledger = self.handed_ledger(&s);
                    self.ward_candidates.insert((n, inc), (old, ledger));
                }
                if self.dead_floor.get(&n) == Some(&inc) {
                    self.dead_floor.insert(n, s.floor_before);
                }
            }
        }
    }
}
