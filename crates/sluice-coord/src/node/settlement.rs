//! Settlements (seed 003 §IV, best-friend handover): freezing a link with a dead incarnation,
//! answering for it, and a heir counting a dead ward's estate (docs/PROTOCOL.md, the settlement rules).

use super::*;

impl Node {
    /// Moves the counters with incarnation `inc` of `peer` to the frozen records.
    pub(super) fn freeze(&mut self, peer: NodeId, inc: u64) {
        self.census = None;
        let floor = self.dead_floor.entry(peer).or_insert(0);
        *floor = (*floor).max(inc);
        let Some(link) = self.links.get_mut(&peer) else {
            return;
        };
        if link.inc != inc {
            return;
        }
        link.unlink();
        self.usable_cache = None;
        // Folds pending with that incarnation go with our side of the link into the frozen
        // record below, for its heir.
        let mut pending = Vec::new();
        self.pending_folds.retain(|_, (f, v)| {
            let with = f.peer == peer && f.peer_incarnation == inc;
            if with {
                pending.push((f.key, f.seen, f.net, *v));
            }
            !with
        });
        let mut received = Vec::new();
        self.received_folds.retain(|&(p, k, seen), r| {
            let with = p == peer && r.inc == inc;
            if with {
                received.push((k, seen, r.net, r.version));
            }
            !with
        });
        self.confirm_after.retain(|c| c.0 != peer);
        let mut rec = BTreeMap::new();
        for (&key, ks) in &mut self.keys {
            if let Some(lk) = ks.links.remove(&peer) {
                // The final counters stay part of our own share: move them into the base.
                let net = i128::from(lk.seen) - i128::from(lk.given);
                ks.base = i64::try_from(i128::from(ks.base) + net).unwrap_or(i64::MAX);
                ks.seen_sum = ks.seen_sum.wrapping_sub(lk.seen);
                ks.given_sum = ks.given_sum.wrapping_sub(lk.given);
                rec.insert(key, (lk.given, lk.seen));
            }
        }
        self.ledger_version += 1;
        let version = self.ledger_version;
        self.frozen.insert(
            (peer, inc),
            Frozen {
                counters: rec,
                pending,
                received,
                version,
                by_inc: self.inc,
                used: self.last_tick,
            },
        );
    }

    /// Drops the records of links with dead incarnations that nobody asked about for
    /// [`Config::forget_after`] (see docs/PROTOCOL.md, "Forgetting old links"). A record
    /// is kept while anything of ours may still read it: a settlement of that incarnation
    /// under way or to come (a ward record), a late fold or a held answer naming it, and
    /// until our heir holds the ledger version that froze it.
    pub(super) fn forget_old_links(&mut self, now: Nanos) {
        let Some(after) = self.cfg.forget_after else {
            return;
        };
        if self.frozen.is_empty() {
            return;
        }
        let no_heir = self.heir.is_none();
        let stale: Vec<(NodeId, u64)> = self
            .frozen
            .iter()
            .filter(|&(&(d, i), r)| {
                now.saturating_sub(r.used) >= after
                    && (no_heir || r.version <= self.ledger_acked)
                    && !self.settling.contains_key(&(d, i))
                    && self.wards.get(&d).is_none_or(|w| w.inc != i)
                    && !self.ward_candidates.contains_key(&(d, i))
                    && !self.late_folds.contains_key(&(r.by_inc, d, i))
                    && !self.held.iter().any(|&(_, hd, hi)| (hd, hi) == (d, i))
            })
            .map(|(&k, _)| k)
            .collect();
        for k in stale {
            self.frozen.remove(&k);
            self.forgotten.insert(k);
        }
    }

    pub(super) fn answer_settle(&mut self, heir: NodeId, dead: NodeId, inc: u64) {
        if dead == self.cfg.id {
            return;
        }
        if self.links.get(&dead).is_some_and(|l| l.inc == inc) {
            self.freeze(dead, inc);
        }
        match self.frozen.get_mut(&(dead, inc)) {
            Some(r) => r.used = r.used.max(self.last_tick),
            // We dropped our side (`Config::forget_after`): no answer is the only true one.
            None if self.forgotten.contains(&(dead, inc)) => return,
            None => {}
        }
        let mut replier_incarnation = self.inc;
        let mut in_estate = true;
        // Only this incarnation's pending folds: an older one's are in its own estate's
        // reckoning (not adding them loses their nets at worst).
        let mut pending = Vec::new();
        // Our dead incarnation's side of a link it still had live with the dead one, when
        // no later incarnation of ours exchanged anything with it: that side is the whole
        // answer (a later link that carried nothing changes no estate). Of several, the
        // latest: the dead one froze the earlier links when it heard from a later one, and
        // if its heir's ledger names another, this answer does not cover it (it waits).
        let current = self.frozen.get(&(dead, inc));
        // Nothing since, not even a fold (a fold starts the counters again at zero).
        let later_empty = current.is_none_or(|r| r.pending.is_empty() && r.received.is_empty());
        if current.is_none_or(|r| {
            r.by_inc == self.inc && r.counters.values().all(|&(f, s)| f == 0 && s == 0)
        }) && let Some((_, r)) = self
            .final_sides
            .range((dead, inc, 0)..=(dead, inc, u64::MAX))
            .next_back()
        {
            let (entries, pending) = self.old_side(r);
            let reply = SettleReply {
                dead,
                incarnation: inc,
                replier_incarnation: r.by_inc,
                prior: self.priors.get(&r.by_inc).copied(),
                first: self.first_to_link(dead, inc, r.by_inc),
                later_empty,
                in_estate: self.in_old_estate(r, dead, inc),
                entries,
                pending,
            };
            self.push_reply(heir, reply);
            return;
        }
        let entries: Vec<(Key, u64, u64)> = match self.frozen.get(&(dead, inc)) {
            // Frozen by an earlier incarnation of ours, now dead and inherited: our side of
            // the link is in that estate only if the freeze is in the ledger version our heir
            // settled it with. If not (or unknown), say so: the asker must not count the
            // counters for the dead node unless the dead node folded the link itself, or the
            // link would count on both sides (a reincarnated node whose freeze never
            // reached its heir, and a dead peer whose heir counts the link from our answer).
            Some(r) if r.by_inc != self.inc => {
                replier_incarnation = r.by_inc;
                in_estate = self.in_old_estate(r, dead, inc);
                let side;
                (side, pending) = self.side(r);
                side
            }
            // Pitfall (a) for our own heir: the freeze changed our bases; answer only once
            // our heir holds a ledger with that change, or a crash (or our own settlement)
            // right now would let our heir use the old base while the dead node's heir uses
            // these counters. The request is held and answered as soon as the heir
            // acknowledges (when our heir is the dead node, its successor adopts us and
            // acknowledges). If our heir is settling us it never does: this settlement
            // waits (capacity lost, never counted twice).
            Some(r) if self.heir.is_some() && r.version > self.ledger_acked => {
                self.held.insert((heir, dead, inc));
                return;
            }
            Some(r) => {
                replier_incarnation = r.by_inc;
                let side;
                (side, pending) = self.side(r);
                side
            }
            // No record: this incarnation never exchanged capacity with that one. Said even
            // after a restart (we may have lost an earlier incarnation's record): the reply
            // names this incarnation, which covers the link only where the dead node folded
            // its link with our previous one (`SettleReply::prior`); otherwise it tells the
            // heir that the incarnation it waits for is gone (see `take_late_fold`).
            None => Vec::new(),
        };
        let prior = self.priors.get(&replier_incarnation).copied();
        let reply = SettleReply {
            dead,
            incarnation: inc,
            replier_incarnation,
            prior,
            first: self.first_to_link(dead, inc, replier_incarnation),
            later_empty: false,
            in_estate,
            entries,
            pending,
        };
        self.push_reply(heir, reply);
    }

    /// Whether our incarnation `by` is the first of ours that linked with `dead`'s
    /// incarnation `inc`, knowing every incarnation of ours before it (see
    /// [`wire::SettleReply::first`]).
    pub(super) fn first_to_link(&self, dead: NodeId, inc: u64, by: u64) -> bool {
        let mut i = by;
        // Each step goes to a smaller incarnation, so this ends.
        loop {
            match self.priors.get(&i) {
                Some(0) => break,
                Some(&p) if p < i => i = p,
                _ => return false,
            }
        }
        self.first_linked.get(&(dead, inc)).is_none_or(|&f| f >= by)
    }

    /// Queues a settlement reply for `heir` (replacing an older one for the same
    /// incarnation); the dead incarnation is ignored from now on.
    pub(super) fn push_reply(&mut self, heir: NodeId, reply: SettleReply) {
        let floor = self.dead_floor.entry(reply.dead).or_insert(0);
        *floor = (*floor).max(reply.incarnation);
        let link = self.link_entry(heir, 0, false);
        let replies = &mut link.mail().replies;
        replies.retain(|r| !(r.dead == reply.dead && r.incarnation == reply.incarnation));
        replies.push(reply);
    }

    pub(super) fn take_reply(&mut self, from: NodeId, r: &SettleReply) {
        let Some(s) = self.settling.get_mut(&(r.dead, r.incarnation)) else {
            return;
        };
        // Only an answer that covers the link counts (see `covers`).
        let live = Self::named_link(&s.ward.ledger, from);
        let covers = Self::covers(&s.ward.ledger, from, r);
        // The dead node froze this very link itself and reported it folded into its base.
        let folded = s
            .ward
            .ledger
            .folded
            .contains(&(from, r.replier_incarnation));
        // Counters the replier's own estate does not account for can only be ignored (the
        // link is folded here); counting them would count the link on both sides: wait,
        // for the ward's own side as a late fold (`take_late_fold`) or for the replier's side
        // to join its estate.
        // So may a later incarnation's answer for a link whose own incarnation is dead and
        // never froze it (nobody can answer for that side any more), when the later
        // incarnation's own link with the dead one carried nothing: flows on it are in no
        // ledger, and taking the dead node's side without them counted them twice (a seeded
        // run, 5-node complete graph at 47 % loss: Σ enforced = L + 5,760). And only when
        // it directly follows the incarnation the ledger names: one in between may have
        // linked with the dead one and folded that link into its own estate (a 5-node
        // complete graph at 45 % loss: node 0's fourth incarnation did, its fifth answered
        // "nothing", and the dead node's side of that link was counted nowhere: L + 3,610).
        let next = live != 0 && r.replier_incarnation > live && r.prior == Some(live);
        let carried = r.entries.iter().any(|&(_, f, s)| f != 0 || s != 0);
        if !folded && s.waiting.contains(&from) {
            if covers && !r.in_estate {
                s.unvouched.insert(from, Unvouched::NotInEstate);
            } else if next && !carried {
                s.unvouched.insert(from, Unvouched::Superseded);
            } else if next {
                // Its link with the ward carried capacity: the ward's side of the named link
                // must come as a late fold (see `Node::take_relinked`), and the later link
                // must count too, or its flows would count on the replier's side only. If
                // the replier vouches for its side of the later link, that link counts from
                // its counters, `F − S`, as a live neighbour's does — what was in flight
                // either way included; the ward's own side of it would lose what the replier
                // had in flight to it (a complete graph of 5 at 46 % loss: 0.994 L).
                let later = r.replier_incarnation;
                // Once vouched for, it stays so (a replier that reincarnates later may stop
                // vouching; the mirror taken stands).
                let was = matches!(
                    s.unvouched.get(&from),
                    Some(Unvouched::Relinked { mirrored: true, .. })
                );
                let mirrored = r.in_estate || was;
                s.unvouched
                    .insert(from, Unvouched::Relinked { later, mirrored });
                if r.in_estate {
                    let mirror = r.entries.iter().map(|&(k, f, sv)| (k, sv, f)).collect();
                    s.relinked.insert((from, later), mirror);
                }
            }
        }
        if !covers || !(folded || r.in_estate) || !s.waiting.remove(&from) {
            return;
        }
        s.unvouched.remove(&from);
        for &(k, f, sv) in r.entries.iter().filter(|_| !folded) {
            *s.terms.entry(k).or_insert(0) += i128::from(f) - i128::from(sv);
        }
        if !folded {
            Self::fold_terms(
                &s.ward.ledger,
                from,
                r.replier_incarnation,
                &r.entries,
                &r.pending,
                &mut s.terms,
            );
        }
        if s.waiting.is_empty() {
            self.finish_settle(r.dead, r.incarnation);
        }
    }

    pub(super) fn check_wards(&mut self, now: Nanos) {
        // A settler whose own lease is not valid may be the one cut off, and may be declared
        // dead itself: it waits. In particular mutual heirs (a two-node cluster) never settle
        // each other on silence alone: a partition and a crash look the same, and both
        // sides would inherit (strict modes choose safety; a restart of the peer, a newer
        // incarnation, settles at once).
        if self.lifecycle == Lifecycle::Leaving {
            return;
        }
        let valid = self.lease_state(now) == LeaseState::Valid;
        let rho = 1.0 + self.cfg.max_drift;
        let wait = (self.cfg.lease as f64 * rho * rho).ceil() as u64;
        let due: Vec<NodeId> = self
            .wards
            .iter()
            .filter(|(_, w)| valid && now > w.last_recv + wait)
            .map(|(&n, _)| n)
            .collect();
        for n in due {
            self.start_settle(n);
        }
    }

    /// Declares ward `n`'s incarnation dead and asks its neighbours for their counters.
    pub(super) fn start_settle(&mut self, n: NodeId) {
        let Some(ward) = self.wards.remove(&n) else {
            return;
        };
        self.settle(n, ward, None);
    }

    /// Declares `ward`, an incarnation of node `n` no longer in our wards, dead and asks its
    /// neighbours for their counters. `origin` names the incarnation whose ledger lacked this
    /// estate, for one handed over as inherited after it or taken over from a dead settler's
    /// ledger (rules 10 and 11).
    pub(super) fn settle(&mut self, n: NodeId, ward: Ward, origin: Option<(NodeId, u64)>) {
        let inc = ward.inc;
        // Our own side of the link with it is forgotten (`Config::forget_after`): the estate
        // cannot be counted exactly, so it is not counted (lost, never counted twice).
        if self.forgotten.contains(&(n, inc)) && !self.frozen.contains_key(&(n, inc)) {
            return;
        }
        // Our own heir (mutual heirs): its ledger says whether it had settled us. If not, it
        // never did (a settlement acts on others only once its heir, us, holds a ledger
        // recording it), so its next incarnation can be trusted with our lease (see
        // `Node::orphaned`).
        if Some(n) == self.heir
            && inc == self.lease_inc
            && !ward.ledger.settled.contains(&(self.cfg.id, self.inc))
        {
            self.lease_inc = 0;
            self.ledger_inc = 0;
            self.orphaned_at = None;
        }
        self.settled_with.insert((n, inc), ward.ledger.version);
        // The settlement is part of our ledger from now on (the ward is gone from our wards
        // and listed as settled: whoever inherits from us tells it, rather than reviving it
        // with a succession notice); see `announced`. A verdict before the estate is in is
        // safe: it only makes the ward drop what it holds.
        self.ledger_version += 1;
        let version = self.ledger_version;
        let floor_before = self.dead_floor.get(&n).copied().unwrap_or(0);
        if self.links.get(&n).is_some_and(|l| l.inc == inc) {
            self.freeze(n, inc);
        }
        let floor = self.dead_floor.entry(n).or_insert(0);
        *floor = (*floor).max(inc);
        let mut terms = BTreeMap::new();
        // Our own side of the link, as `take_reply` takes a neighbour's: only from the
        // incarnation the ward's ledger names, and only counters our own accounts hold.
        let me = self.cfg.id;
        let live = Self::named_link(&ward.ledger, me);
        let rec = self.frozen.get(&(n, inc));
        // Our side as a neighbour's answer gives it (`answer_settle`): an older
        // incarnation's as its estate counts it. The same answer goes with our ledger for
        // whoever takes this settlement over (rule 11).
        let mine = self.own_answer(n, inc);
        let by = mine.replier_incarnation;
        let folded = ward.ledger.folded.contains(&(me, by));
        let covers = Self::covers(&ward.ledger, me, &mine);
        let in_estate = mine.in_estate;
        if rec.is_some() && !folded {
            for &(k, f, s) in &mine.entries {
                terms.insert(k, i128::from(f) - i128::from(s));
            }
            Self::fold_terms(
                &ward.ledger,
                me,
                by,
                &mine.entries,
                &mine.pending,
                &mut terms,
            );
        }
        let mut waiting: BTreeSet<NodeId> = ward
            .ledger
            .neighbours
            .iter()
            .map(|&(j, _)| j)
            .filter(|&j| j != me && j != n)
            .collect();
        let is_neighbour = ward.ledger.neighbours.iter().any(|l| l.0 == me);
        let mut unvouched = BTreeMap::new();
        if is_neighbour && !(covers && (folded || in_estate)) {
            // We cannot vouch for our own side: nobody ever answers for us, so this estate
            // waits for the ward's own side as a late fold (see `take_late_fold`), or never
            // completes (capacity lost, never counted twice).
            waiting.insert(me);
            let carried_nothing =
                rec.is_none_or(|r| r.counters.values().all(|&(f, s)| f == 0 && s == 0));
            if covers {
                unvouched.insert(me, Unvouched::NotInEstate);
            } else if live != 0
                && by > live
                && self.priors.get(&by) == Some(&live)
                && carried_nothing
            {
                unvouched.insert(me, Unvouched::Superseded);
            }
        }
        for &j in waiting.iter().filter(|&&j| j != me) {
            self.link_entry(j, 0, false);
        }
        // Succession (seed 003 §IV applied to heirs): the dead node's wards get us as heir,
        // or a verdict if it had already settled them.
        for &(w, wi) in &ward.ledger.settled {
            let e = self.settled.entry(w).or_insert(0);
            *e = (*e).max(wi);
        }
        // Its neighbours too: one that named it heir after its last report is not in its
        // wards, and would wait for ever on a heir that is dead to it (a succession notice
        // only moves a node whose heir is the dead one). A neighbour it had settled gets the
        // verdict instead (it cannot hear it from the dead node any more).
        let targets: BTreeSet<NodeId> = ward
            .ledger
            .wards
            .iter()
            .copied()
            .filter(|&w| w != n)
            .collect();
        for w in targets {
            // We settle our own heir only when it restarted: keep it (its new incarnation).
            if w != me {
                // A verdict only reaches the incarnation it names (or an older one).
                if let Some(&(_, wi)) = ward.ledger.settled.iter().find(|s| s.0 == w) {
                    self.link_entry(w, 0, false).verdict = wi;
                }
                // A settlement taken over from a dead settler's ledger (rule 11) has an older
                // ledger than that settler's own: a ward both list had moved on to the settler
                // (its ledger lists only wards that adopted it), so that notice stands. The
                // other one named a heir the ward no longer has, and it ignored it: a 4-node
                // graph at 46 % loss then lost a ward's estate (`a_notice_names_the_heir_the_ward_last_adopted`).
                if origin.is_none() {
                    self.successions.insert(w, ((n, inc), version));
                } else {
                    self.successions.entry(w).or_insert(((n, inc), version));
                }
                self.link_entry(w, 0, false);
            }
        }
        self.settling.insert(
            (n, inc),
            Settlement {
                ward,
                version,
                waiting,
                unvouched,
                terms,
                floor_before,
                started: self.last_tick,
                relinked: BTreeMap::new(),
                origin,
                late: BTreeMap::new(),
            },
        );
        // Rule 11: the settlements the ward had under way when its ledger was sent are ours
        // now: its bases do not hold their estates. Each waits for this one and pays what
        // its estate lacks first (its ward may have given away capacity from one it
        // finished after that ledger), exactly as a handed-over inheritance (rule 10).
        let nested: Vec<wire::Settling> = self
            .settling
            .get(&(n, inc))
            .map(|s| s.ward.ledger.settling.clone())
            .unwrap_or_default();
        if self
            .settling
            .get(&(n, inc))
            .is_some_and(|s| s.waiting.is_empty())
        {
            self.finish_settle(n, inc);
        }
        if origin.is_none() && self.lifecycle != Lifecycle::Leaving {
            for st in nested {
                if self.knows_ward(st.ward, st.incarnation) {
                    continue;
                }
                let ward = Ward {
                    inc: st.incarnation,
                    last_recv: self.last_tick,
                    ledger: st.ledger,
                    leaving: st.leaving,
                };
                self.settle(st.ward, ward, Some((n, inc)));
                // The dead settler's own answer for its link with the ward.
                if let Some(side) = st
                    .side
                    .filter(|r| r.dead == st.ward && r.incarnation == st.incarnation)
                {
                    self.take_reply(n, &side);
                }
            }
        }
    }

    /// The incarnation of `peer` the dead node's ledger names a live link with (0: none).
    pub(super) fn named_link(ledger: &Ledger, peer: NodeId) -> u64 {
        ledger
            .neighbours
            .iter()
            .find(|l| l.0 == peer)
            .map_or(0, |l| l.1)
    }

    /// Whether `peer`'s answer `r` is the one that can answer for the dead node's link with
    /// it, as the dead node's `ledger` has that link (rule 4). Only the incarnation the live
    /// link was with; with no live link, only one that directly follows an incarnation the
    /// dead node folded, a first one, or the first of the peer's incarnations to link with
    /// the dead one: nothing in between can have linked with it since. A later incarnation's
    /// answer leaves the earlier link's counters out: if that incarnation had folded them
    /// into its base (its heir counts them), the dead node's estate must count their other
    /// side, which only it knew; counting nothing there counts the link's net twice. So
    /// wait: an estate never completed is capacity lost, never counted twice (seed 003 §IV).
    ///
    /// And an answer from an incarnation before the one the ledger names, whose later
    /// incarnations exchanged nothing with the dead node, when the dead node folded that
    /// earlier link: it is in the bases, and the named link carried nothing. Waiting for the
    /// named incarnation's own answer instead waited for ever (a complete graph of 6 without
    /// loss, a cut then a crash: 0.77 L).
    pub(super) fn covers(ledger: &Ledger, peer: NodeId, r: &SettleReply) -> bool {
        let live = Self::named_link(ledger, peer);
        let by = r.replier_incarnation;
        if live != 0 {
            by == live || (r.later_empty && by < live && ledger.folded.contains(&(peer, by)))
        } else {
            r.first
                || match r.prior {
                    Some(0) => true,
                    Some(p) => ledger.folded.contains(&(peer, p)),
                    None => false,
                }
        }
    }

    /// Our answer for our own link with `n`'s dead incarnation `inc`, as a settlement we run
    /// counts it (see `settle`): whoever takes the settlement over from our ledger (rule 11)
    /// counts it as a neighbour's answer, since nobody can give it once we are dead.
    pub(super) fn own_answer(&self, n: NodeId, inc: u64) -> SettleReply {
        let rec = self.frozen.get(&(n, inc));
        let by = rec.map_or(self.inc, |r| r.by_inc);
        let (entries, pending) = rec.map(|r| self.side(r)).unwrap_or_default();
        SettleReply {
            dead: n,
            incarnation: inc,
            replier_incarnation: by,
            prior: self.priors.get(&by).copied(),
            first: self.first_to_link(n, inc, by),
            later_empty: false,
            in_estate: rec.is_none_or(|r| r.by_inc == self.inc || self.in_old_estate(r, n, inc)),
            entries,
            pending,
        }
    }

    /// The ledger of a settlement's ward as whoever settles it next must read it: the
    /// links whose late folds we took are listed as folded, so their sides go into the
    /// bases, as if the ward had folded them itself. Handing on the ledger with the links
    /// marked folded but without their sides lost them (or, for a side that gave more than
    /// it received, counted capacity twice): a rule-10 handover in a complete graph of 5 at
    /// 49 % loss counted 788 units fewer than the first settlement.
    pub(super) fn handed_ledger(&self, s: &Settlement) -> Ledger {
        let mut ledger = s.ward.ledger.clone();
        if s.late.is_empty() {
            return ledger;
        }
        let default: u64 = ledger.holdings.iter().map(|&h| self.cfg.part(h)).sum();
        let mut bases: BTreeMap<Key, i128> = ledger
            .bases
            .iter()
            .map(|&(k, b)| (k, i128::from(b)))
            .collect();
        for (&k, &v) in &s.late {
            *bases.entry(k).or_insert_with(|| i128::from(default)) += v;
        }
        ledger.bases = bases
            .into_iter()
            .map(|(k, b)| {
                (
                    k,
                    i64::try_from(b).unwrap_or(if b < 0 { i64::MIN } else { i64::MAX }),
                )
            })
            .collect();
        ledger
    }

    /// What folds under way between a dead node and `peer`'s incarnation `inc` add to the
    /// dead node's estate, given the peer's answer (`entries` `(key, F, S)`, `pending` its
    /// pending folds `(key, seen, net)`; see [`wire::PendingFold`]):
    /// * the dead node's own pending folds that the peer had not made when it froze the link
    ///   (its `seen` is still the fold's: after folding it starts again from zero; a key the
    ///   peer has no counters for, it folded or never held): the net goes back;
    /// * the peer's pending folds that the dead node's ledger does not list as received (it
    ///   had not folded them, or its heir holds a ledger from before it did, so its base
    ///   lacks their nets and its counters, lost with it, carry them nowhere else): the net
    ///   goes in.
    pub(super) fn fold_terms(
        ledger: &Ledger,
        peer: NodeId,
        inc: u64,
        entries: &[(Key, u64, u64)],
        pending: &[(Key, u64, u64)],
        terms: &mut BTreeMap<Key, i128>,
    ) {
        for f in &ledger.pending_folds {
            let seen = entries.iter().find(|e| e.0 == f.key).map(|e| e.2);
            if f.peer == peer && f.peer_incarnation == inc && f.seen > 0 && seen == Some(f.seen) {
                *terms.entry(f.key).or_insert(0) += i128::from(f.net);
            }
        }
        for &(k, seen, net) in pending {
            if !ledger.received_folds.contains(&(peer, inc, k, seen)) {
                *terms.entry(k).or_insert(0) += i128::from(net);
            }
        }
    }

    /// All counters are in: inherit the estate (seed 003 §IV `C_b ← C_b + C_i`, exactly).
    ///
    /// Rule 10: an estate handed over as inherited after its origin's ledger waits for the
    /// origin's own settlement, then pays what that estate lacked (its `debts`) first. The
    /// origin may have given away capacity that came from this estate; its counted estate
    /// was then negative and clamped to zero, and counting this one whole would count those
    /// gifts twice (once in the neighbours' shares, once here).
    pub(super) fn finish_settle(&mut self, n: NodeId, inc: u64) {
        let Some(s) = self.settling.remove(&(n, inc)) else {
            return;
        };
        if let Some(o) = s.origin
            && self.settling.contains_key(&o)
        {
            self.settling.insert((n, inc), s);
            return;
        }
        // An estate the audit fenced was counted as missing and minted again: it finishes
        // empty (see docs/PROTOCOL.md, "The capacity audit").
        if self.audit.fenced(n, inc) {
            self.ledger_version += 1;
            let e = self.settled.entry(n).or_insert(0);
            *e = (*e).max(inc);
            self.finish_dependents(n, inc);
            return;
        }
        let reserve = if s.ward.leaving {
            0
        } else {
            self.cfg.reservation(n)
        };
        let ward_default: u64 = s
            .ward
            .ledger
            .holdings
            .iter()
            .map(|&h| self.cfg.part(h))
            .sum();
        let bases: BTreeMap<Key, i64> = s.ward.ledger.bases.iter().copied().collect();
        let mut touched: BTreeSet<Key> = self.keys.keys().copied().collect();
        touched.extend(bases.keys().copied());
        touched.extend(s.terms.keys().copied());
        let mut owed = s.origin.and_then(|o| self.debts.remove(&o));
        let mut lacked = BTreeMap::new();
        if let Some(d) = &owed {
            touched.extend(d.keys().copied());
        }
        for k in touched {
            let base = bases
                .get(&k)
                .map_or(i128::from(ward_default), |&b| i128::from(b));
            let term = s.terms.get(&k).copied().unwrap_or(0);
            let debt = owed.as_mut().and_then(|d| d.remove(&k)).unwrap_or(0);
            let raw = base - i128::from(reserve) + term + debt;
            if raw < 0 {
                lacked.insert(k, raw);
            }
            let estate = raw.max(0);
            let ks = self.key_mut(k);
            ks.base = i64::try_from(i128::from(ks.base) + estate).unwrap_or(i64::MAX);
        }
        // What this estate lacked (after paying the origin's debt) is owed by the origin, if
        // any (a later handover of it pays it), or is this estate's own debt.
        if !lacked.is_empty() {
            self.debts.insert(s.origin.unwrap_or((n, inc)), lacked);
        }
        // Keys nobody has state for: take over the dead node's initial shares.
        for &h in &s.ward.ledger.holdings {
            let h = match (h.part, s.ward.leaving) {
                (_, true) => Some(h),
                (Part::Full, false) if h.node == n => Some(Holding {
                    node: n,
                    part: Part::ShareOnly,
                }),
                (Part::ReserveOnly, false) if h.node == n => None,
                _ => Some(h),
            };
            if let Some(h) = h {
                self.holdings.push(h);
            }
        }
        self.default_base = self.holdings.iter().map(|&h| self.cfg.part(h)).sum();
        self.ledger_version += 1;
        let settled_before = self.settled.get(&n).copied();
        let e = self.settled.entry(n).or_insert(0);
        *e = (*e).max(inc);
        // Until our heir holds this version, a settlement of us would not count it (rule 10).
        // An estate that paid an origin's debt is not handed on: its debt would not go with it.
        if s.origin.is_none() {
            let ward = Ward {
                ledger: self.handed_ledger(&s),
                ..s.ward
            };
            let record = Inheritance {
                ward,
                start: s.version,
                finish: self.ledger_version,
                floor_before: s.floor_before,
                settled_before,
            };
            self.inherited.insert((n, inc), record);
        }
        self.finish_dependents(n, inc);
    }

    /// Estates handed over as inherited after `(n, inc)`'s ledger waited for its settlement.
    fn finish_dependents(&mut self, n: NodeId, inc: u64) {
        let after: Vec<(NodeId, u64)> = self
            .settling
            .iter()
            .filter(|(_, d)| d.origin == Some((n, inc)) && d.waiting.is_empty())
            .map(|(&k, _)| k)
            .collect();
        for (w, wi) in after {
            self.finish_settle(w, wi);
        }
    }
}
