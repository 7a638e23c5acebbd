//! Late folds (docs/PROTOCOL.md, settlement rule 5): a dead incarnation's side of a link it never
//! froze, offered to the heir that settled it.

use super::*;

impl Node {
    /// Our dead incarnation `old` froze links after the ledger its heir settles it with (or
    /// we do not know which): those sides are in no estate. Where the other end is dead as
    /// well, each heir waits for the other's side to be in an estate (`in_estate`), which
    /// neither ever is: both estates would wait for ever (a 2|2 cut of a complete graph of 4
    /// lost half the limit this way). Offer our side to our heir instead: the estate of one
    /// end then holds that end's own side of the link, the other end's estate counts the
    /// first end's counters, and the link counts once (if both ends' own sides were taken,
    /// what was in flight between them would be lost; if both took the other's counters, it
    /// would count twice). The heir takes the lower id's offer; the higher id's only when the
    /// lower one crashed (its answer comes from a later incarnation that never linked with
    /// us), so it can offer nothing.
    pub(super) fn offer_late_folds(&mut self, old: u64) {
        let known = self.estate_versions.get(&old).copied();
        let sides = self
            .frozen
            .iter()
            .map(|(&(p, i), r)| (p, i, r))
            .chain(self.final_sides.iter().map(|(&(p, i, _), r)| (p, i, r)));
        for (peer, pinc, r) in sides {
            if r.by_inc == old && known.is_none_or(|v| r.version > v) {
                self.late_folds
                    .entry((old, peer, pinc))
                    .or_insert(LateFoldState::Offered);
            }
        }
    }

    /// A verdict on one of our *older* incarnations, from the node that settled it: we came
    /// back on our own before it arrived (orphaned: rule 7), so we never learnt who holds
    /// that estate and offered it none of that incarnation's late folds. Where its link with
    /// another dead incarnation crossed the cut, both estates then waited for ever (a 5-ring
    /// at 43 % loss, node 3 cut off for 10 cycles: 0.67 L,
    /// `a_late_verdict_on_an_orphaned_incarnation_lets_its_late_folds_go`). Only the heir is
    /// recorded, not the ledger version: the sides this incarnation already gave out were
    /// worked out without it, and must stay the same (see `old_side`). A verdict a dead
    /// heir's successor passes on (with its notice) does not come from the settler.
    ///
    /// From a settler other than the one we know, it says that one's settlement was taken
    /// over (rule 11: the settler died, and its heir settles us from its ledger): a late
    /// fold the dead settler took after that ledger died with it, so ours go to the new
    /// one again, undecided (a complete graph of 6 at 42 % loss waited for ever for a side
    /// already accepted: 0.88 L, `a_late_fold_goes_to_whoever_took_the_settlement_over`).
    /// Safe: the new settler takes a side only while it still waits for that peer, and
    /// refuses one its ledger already holds.
    pub(super) fn late_verdict(&mut self, from: NodeId, msg: &Message) {
        let d = msg.dead_verdict;
        if d == 0
            || d >= self.inc
            || msg.succession.is_some()
            || self.estate_heirs.get(&d) == Some(&from)
            || !self.priors.values().any(|&p| p == d)
        {
            return;
        }
        if self.estate_heirs.insert(d, from).is_some() {
            for (_, st) in self
                .late_folds
                .range_mut((d, 0, 0)..=(d, NodeId::MAX, u64::MAX))
            {
                *st = LateFoldState::Offered;
            }
        }
        self.offer_late_folds(d);
    }

    /// Our open late-fold offers to `to`, with their counters.
    pub(super) fn late_offers_to(&self, to: NodeId) -> Vec<LateFold> {
        self.late_folds
            .iter()
            .filter(|&(k, &st)| {
                st == LateFoldState::Offered && self.estate_heirs.get(&k.0) == Some(&to)
            })
            .filter_map(|(&(incarnation, peer, peer_incarnation), _)| {
                let r = self.side_of(incarnation, peer, peer_incarnation)?;
                Some(LateFold {
                    incarnation,
                    peer,
                    peer_incarnation,
                    entries: self.old_side(r).0,
                })
            })
            .collect()
    }

    /// A dead incarnation's side of a link, `(key, given, seen)`, as its estate counts it.
    /// A fold it made as the net giver after the ledger its heir settled it with (or we do
    /// not know which) is undone: that estate has its base from before the fold, so its side
    /// of the link is the counters from before it too (exact with the earlier ledger; with a
    /// later one the net is lost, never counted twice — the peer cannot have folded unless
    /// the heir held the fold). The same counters answer the peer's heir, so that the link
    /// counts once whichever end's estate takes which side. Found by
    /// `conservation_under_group_partitions`: a 5-ring, {3, 4} cut off just after 3 folded a
    /// net of 583,806 for 4 — taken from after the fold with the ledger from before it, Σ
    /// enforced reached 1.52 L; then, undone in the late fold but not in the answer to 4's
    /// heir, 4's estate lost it. The folds that stand (in that estate's ledger) come back as
    /// the answer's pending folds, as a live node's do ([`wire::SettleReply::pending`]);
    /// without them, a 6-node run with a 3-node cut lost the net of a fold the receiver had
    /// made after the ledger its own heir settled it with.
    /// Our side of a link as a record has it, `(entries (key, given, seen), pending folds
    /// (key, seen, net))`: this incarnation's as it stands (its folds pending), a dead one's
    /// as its estate counts it ([`Node::old_side`]).
    pub(super) fn side(&self, r: &Frozen) -> (KeyTriples, KeyTriples) {
        if r.by_inc == self.inc {
            (
                r.counters.iter().map(|(&k, &(f, s))| (k, f, s)).collect(),
                r.pending.iter().map(|&(k, s, n, _)| (k, s, n)).collect(),
            )
        } else {
            self.old_side(r)
        }
    }

    pub(super) fn old_side(&self, r: &Frozen) -> (KeyTriples, KeyTriples) {
        let known = self.estate_versions.get(&r.by_inc).copied();
        let mut counters = r.counters.clone();
        let mut pending = Vec::new();
        // Undoing adds the counters from before the fold to those since (a new generation
        // starts at zero), as if the link had never been folded.
        let mut undo = |k: Key, given: u64, seen: u64| {
            let c = counters.entry(k).or_insert((0, 0));
            *c = (c.0.saturating_add(given), c.1.saturating_add(seen));
        };
        for &(k, seen, net, v) in &r.pending {
            if known.is_none_or(|known| known < v) {
                undo(k, seen, seen - net);
            } else {
                pending.push((k, seen, net));
            }
        }
        // A fold we made as the net receiver that the ledger our estate was counted with
        // does not hold: undone the same way. Only when that version is known: with a
        // ledger that holds it, the counters from before the fold would count the net
        // twice; from after it they lose it at worst. Found by
        // `conservation_under_group_partitions` (a complete graph of 6 at 22 % loss, both
        // ends of a fold of 50,574 settled at once, the receiver with a ledger from before
        // its fold: Σ = 0.949 L).
        for &(k, seen, net, v) in &r.received {
            if known.is_some_and(|known| known < v) {
                undo(k, seen - net, seen);
            }
        }
        let entries = counters.iter().map(|(&k, &(g, s))| (k, g, s)).collect();
        (entries, pending)
    }

    /// The side of our incarnation `by`'s link with `peer`'s incarnation `inc`, if we have it.
    pub(super) fn side_of(&self, by: u64, peer: NodeId, inc: u64) -> Option<&Frozen> {
        self.frozen
            .get(&(peer, inc))
            .filter(|r| r.by_inc == by)
            .or_else(|| self.final_sides.get(&(peer, inc, by)))
    }

    /// Whether the side of our link with `dead`'s incarnation `inc` that our dead
    /// incarnation `r.by_inc` froze is in that incarnation's estate: in the ledger version
    /// its heir settled it with, or taken as a late fold.
    pub(super) fn in_old_estate(&self, r: &Frozen, dead: NodeId, inc: u64) -> bool {
        self.estate_versions
            .get(&r.by_inc)
            .is_some_and(|&v| r.version <= v)
            || self.late_folds.get(&(r.by_inc, dead, inc)) == Some(&LateFoldState::Accepted)
    }

    /// A late fold from `from` (see [`Node::offer_late_folds`]): taken into the estate of
    /// its dead incarnation if we are still settling it, its ledger lists the link live and
    /// the peer answered for the link without vouching for it. Answered `accepted` or not
    /// once that is decided; while the peer has not answered, not at all (it is offered
    /// again).
    pub(super) fn take_late_fold(&mut self, now: Nanos, from: NodeId, f: &LateFold) {
        let patience = LOWER_END_PATIENCE.saturating_mul(self.cfg.lease);
        let id = (from, f.incarnation, f.peer, f.peer_incarnation);
        let relinked = self.settling.get(&(from, f.incarnation)).and_then(|s| {
            match s.unvouched.get(&f.peer) {
                Some(&Unvouched::Relinked { later, mirrored }) => Some((later, mirrored)),
                _ => None,
            }
        });
        let accepted = if self.late_taken.contains(&id) {
            Some(true)
        } else if let Some((later, mirrored)) = relinked {
            self.take_relinked(from, f, later, mirrored)
        } else if let Some(s) = self.settling.get_mut(&(from, f.incarnation)) {
            let link = (f.peer, f.peer_incarnation);
            let live = s.ward.ledger.neighbours.contains(&link);
            let named = s.ward.ledger.neighbours.iter().find(|l| l.0 == f.peer);
            if !live
                && named.is_some_and(|l| l.1 < f.peer_incarnation)
                && s.waiting.contains(&f.peer)
                && !s.unvouched.contains_key(&f.peer)
            {
                // A later link with the peer than the ledger names, before the peer answered:
                // if its answer comes from that later incarnation and the later link carried
                // capacity, both sides are needed (`take_relinked`). Refusing it now made the
                // estate wait for ever for a side already refused (a complete graph of 5 at
                // 46 % loss, a crash and a false suspicion: 0.74 L).
                None
            } else if !live || s.ward.ledger.folded.contains(&link) || !s.waiting.contains(&f.peer)
            {
                // Not this estate's link, or the peer's side is counted already.
                Some(false)
            } else if s.unvouched.get(&f.peer) == Some(&Unvouched::NotInEstate)
                && from > f.peer
                && now <= s.started.saturating_add(patience)
            {
                // The peer, the lower id, hands over its side instead (see
                // `offer_late_folds`): taking ours too would lose what was in flight. Not
                // refused, though: a lower end that never offers (it came back orphaned,
                // and nobody settles it) left this estate waiting for ever (a 6-ring at 6 %
                // loss, a node cut off, then its heir crashed: 0.77 L). After `patience`
                // ours is taken: if the lower end's side is taken as well, what was in
                // flight between them is lost, never counted twice (each estate holds its
                // own side; only both holding the other's counters would count it twice, and
                // the peer's answers vouch for its side only once its own late fold is in).
                None
            } else if s.unvouched.remove(&f.peer).is_some() {
                // The ward's own side, as if its ledger had folded the link: the peer's
                // answer is ignored from now on (it counts in the peer's estate instead).
                for &(k, given, seen) in &f.entries {
                    let v = i128::from(seen) - i128::from(given);
                    *s.terms.entry(k).or_insert(0) += v;
                    *s.late.entry(k).or_insert(0) += v;
                }
                s.ward.ledger.folded.push(link);
                s.waiting.remove(&f.peer);
                self.late_taken.insert(id);
                Some(true)
            } else {
                None
            }
        } else {
            // Final without it (or not ours to settle).
            Some(false)
        };
        if let Some(accepted) = accepted {
            let ack = LateAck {
                incarnation: f.incarnation,
                peer: f.peer,
                peer_incarnation: f.peer_incarnation,
                accepted,
            };
            let link = self.link_entry(from, 0, false);
            let acks = &mut link.mail().late_acks;
            if !acks.contains(&ack) {
                acks.push(ack);
            }
        }
        if accepted == Some(true)
            && self
                .settling
                .get(&(from, f.incarnation))
                .is_some_and(|s| s.waiting.is_empty())
        {
            self.finish_settle(from, f.incarnation);
        }
    }

    /// A late fold of `from`'s dead incarnation for a link with `f.peer`, whose answer came
    /// from incarnation `later`, the direct successor of the one the ward's ledger names,
    /// and whose own link with the ward carried capacity (`Unvouched::Relinked`). The named
    /// incarnation crashed (a reincarnated one answers for its own links): nobody will offer
    /// its side. The ward's side of the named link is taken as if the ward had folded it
    /// (the peer's estate counts the ward's counters for it once this is accepted:
    /// `in_estate`). The later link counts from the later incarnation's answer if that
    /// vouched for it (`mirrored`, see `take_reply`; its mirror is then in `relinked`), and
    /// otherwise from the ward's own side of it too, whose other side the later incarnation
    /// holds itself (what was in flight on it is then lost). Each link then counts once; a 4-node graph with almost no loss
    /// lost 35 % of the limit waiting for a side that could never come.
    pub(super) fn take_relinked(
        &mut self,
        from: NodeId,
        f: &LateFold,
        later: u64,
        mirrored: bool,
    ) -> Option<bool> {
        let s = self.settling.get_mut(&(from, f.incarnation))?;
        let named = Self::named_link(&s.ward.ledger, f.peer);
        if !s.waiting.contains(&f.peer)
            || (f.peer_incarnation != named && f.peer_incarnation != later)
            || (f.peer_incarnation == later && mirrored)
        {
            // Not a link this wait is for; or the later link, which counts from the
            // replier's answer: the ward's side of it is then in no estate, and its answers
            // for it must not say so (the replier's heir would count the mirror of the
            // ward's side too, and what was in flight twice).
            return Some(false);
        }
        s.relinked
            .insert((f.peer, f.peer_incarnation), f.entries.clone());
        let (Some(a), Some(b)) = (
            s.relinked.get(&(f.peer, named)),
            s.relinked.get(&(f.peer, later)),
        ) else {
            return None;
        };
        for &(k, given, seen) in a.iter().chain(b) {
            let v = i128::from(seen) - i128::from(given);
            *s.terms.entry(k).or_insert(0) += v;
            *s.late.entry(k).or_insert(0) += v;
        }
        s.ward.ledger.folded.push((f.peer, named));
        s.ward.ledger.folded.push((f.peer, later));
        s.waiting.remove(&f.peer);
        s.unvouched.remove(&f.peer);
        for inc in [named, later] {
            if inc == named || !mirrored {
                self.late_taken.insert((from, f.incarnation, f.peer, inc));
            }
        }
        Some(true)
    }
}
