//! Receiving a message: leases' echoes, votes and dead floors, the audit, gifts and
//! retirements, and the news answered at once (seed 004).

use super::*;

impl Node {
    /// A message from `from`, received at `now` (this node's clock).
    pub fn handle_message(
        &mut self,
        now: Nanos,
        from: NodeId,
        mut msg: Message,
        draw: &mut dyn FnMut() -> f64,
    ) {
        self.handle_message_in(now, from, &mut msg, draw);
    }

    /// Messages received together (a driver's batch of datagrams queued at `now`): each is
    /// taken as [`Node::handle_message`] takes it, and the news is answered once for the
    /// batch. Answering per message walked every key per message (the relay's requests and
    /// gifts); per batch, a driver that falls behind does less work per message, not more.
    pub fn handle_messages(
        &mut self,
        now: Nanos,
        messages: impl IntoIterator<Item = (NodeId, Message)>,
        draw: &mut dyn FnMut() -> f64,
    ) {
        let mut news = StackVec::<NodeId, 16>::new();
        let mut heard = false;
        for (from, mut msg) in messages {
            if let Some(n) = self.take_message(now, from, &mut msg) {
                heard = true;
                if n {
                    news.push(from);
                }
            }
        }
        if heard {
            self.react(now, &news, draw);
        }
    }

    /// [`Node::handle_message`] on a borrowed message: a driver can decode every message
    /// into one buffer ([`crate::wire::decode_into`]) instead of allocating one per message.
    pub fn handle_message_in(
        &mut self,
        now: Nanos,
        from: NodeId,
        msg: &mut Message,
        draw: &mut dyn FnMut() -> f64,
    ) {
        if let Some(news) = self.take_message(now, from, msg) {
            let news: &[NodeId] = if news { &[from] } else { &[] };
            self.react(now, news, draw);
        }
    }

    /// Takes what `msg` says; `Some(news)` when the sender is a neighbour whose message
    /// counts (then the news is answered: [`Node::react`]), with whether it gave us more.
    fn take_message(&mut self, now: Nanos, from: NodeId, msg: &mut Message) -> Option<bool> {
        if self.lifecycle == Lifecycle::Left || from == self.cfg.id {
            return None;
        }
        // A sender with other voting members counts other quorums and initial shares: its
        // leases, votes and gifts mean nothing here (0: not stated, as no sender of a version
        // this build reads leaves it).
        if msg.members != 0 && msg.members != self.members_digest {
            self.refused_membership += 1;
            return None;
        }
        // Votes and dead floors are facts about the cluster, whoever tells them.
        self.take_fences(now, &msg.votes, &msg.dead);
        if self.lifecycle == Lifecycle::Left {
            return None;
        }
        if msg.from_inc <= self.dead.get(&from).copied().unwrap_or(0) {
            // A dead incarnation that does not know it yet (a healed cut): our next message
            // tells it, with our dead floors.
            if let Some(l) = self.links.get_mut(&from) {
                l.delta.dead_sent = self.dead_version.wrapping_sub(1);
            }
            return None;
        }
        let link_inc = self.links.get(&from).map(|l| l.inc);
        let known = self.links.contains_key(&from);
        if !known {
            // A joiner introduces itself, or a later incarnation of a joiner whose link went
            // with its fence comes back: it heard this incarnation of ours, so we linked with
            // it before. Either way the link counts nothing until the sender echoes it
            // (`Link::heard_us`): a replayed datagram opens no capacity.
            let rejoin = msg.to_inc == self.inc;
            if !rejoin && (msg.lifecycle != Lifecycle::Joining || msg.to_inc != 0) {
                return None;
            }
            // Its link takes whatever weight it is given: the law gives with γ capped by the
            // stability bound of the live degree at every tick (seed 003 Thm 1), so a new
            // neighbour cannot make it unstable.
            if self.links.len() >= membership::MAX_LINKS {
                self.changes.refused += 1;
                return None;
            }
            let w = self.cfg.join_weight;
            self.link_entry(from, now, true).weight = w;
            self.changes.joins += 1;
            self.usable_cache = None;
        }
        // A later incarnation of the sender: the one our link is with is dead (a node runs
        // one incarnation at a time), so its side of the link is folded now.
        if let Some(old) = link_inc.filter(|&i| i != 0 && msg.from_inc > i) {
            self.set_dead(from, old, now);
        }
        let (me_inc, up) = (self.inc, 2 * self.cfg.cycle);
        let (fresh, usable_now) = {
            let link = self.link_entry(from, now, false);
            if link.inc != msg.from_inc {
                // Another incarnation (another clock, fresh counters): no floor yet, and
                // none of our entries.
                link.floor = 0;
                link.echo = 0;
                link.indicator_at = 0;
                link.delta.reset();
                // A run-time link with another incarnation is made again.
                if link.opened != 0 && link.inc != 0 {
                    link.opened = now.max(1);
                }
            }
            link.inc = msg.from_inc;
            link.last_recv = Some(link.last_recv.map_or(now, |t| t.max(now)));
            link.echo = link.echo.max(msg.sent_at);
            let fresh = msg.sent_at >= link.indicator_at;
            if fresh {
                link.lifecycle = msg.lifecycle;
                link.indicator_at = msg.sent_at;
            }
            if msg.to_inc == me_inc && msg.echo != 0 {
                link.echoed = link.echoed.max(msg.echo);
                link.delta.echoed(msg.echo, msg.from_inc);
            }
            (fresh, Self::link_usable(link, now, up))
        };
        // The cached usable list stays right if the sender is in it exactly when it is usable
        // now (its entry is `(from, weight)` whatever else changed); a later receipt only
        // keeps it usable longer, and `until` stays the earlier bound.
        if let Some(c) = &self.usable_cache {
            let listed = c.list.binary_search_by_key(&from, |&(q, _)| q).is_ok();
            if listed != usable_now || now < c.at {
                self.usable_cache = None;
            }
        }
        self.refresh_lease(now);
        if msg.lifecycle == Lifecycle::Left {
            // It handed everything over and will never enforce again: dead by its own word.
            if self.set_dead(from, msg.from_inc, now) {
                self.changes.leaves += 1;
            }
            return None;
        }
        self.take_audit(from, (msg.from_inc, msg.to_inc), msg.audit.as_deref(), now);
        if self.lifecycle == Lifecycle::Joining && msg.lifecycle == Lifecycle::Active {
            self.lifecycle = Lifecycle::Active;
        }
        // Counters addressed to an older incarnation of us belong to it (it is dead); and
        // gifts are taken only under a lease (docs/PROTOCOL.md, "Leases": what a node holds
        // beyond its start was given while a quorum heard it).
        let neighbour = self
            .links
            .get(&from)
            .is_some_and(|l| l.neighbour && l.heard_us());
        if !neighbour || !(msg.to_inc == self.inc || msg.to_inc == 0) {
            return None;
        }
        let leased = self.lease_state(now) != LeaseState::Expired;
        let mut news = false;
        let stale = self.retirements(from, msg);
        let mut seq = self.change_seq;
        for e in msg.keys.iter().filter(|_| !stale) {
            let new = !self.keys.contains_key(&e.key);
            let counters = e.given != 0 || e.seen != 0;
            let request = e.relay.is_finite() && e.relay >= 1.0;
            // A quiet key the sender holds nothing of on this link costs us no state; nor,
            // at the cap, does a key whose entry holds no capacity (`cap`).
            if new && !counters && ((e.idle && !request) || self.refuse_new(e.key)) {
                continue;
            }
            if new && counters {
                self.admit_over_cap(e.key);
            }
            let idle_after = self.cfg.idle_after;
            let ks = self.key_mut(e.key);
            // State created by a neighbour where the key is idle (a level request, "Idle
            // keys"): we have no demand for it either, so it is quiet from the start.
            if new
                && e.idle
                && let Some(after) = idle_after
            {
                ks.idle_since = Some(now.saturating_sub(after));
                ks.quiet = true;
            }
            let lk = ks.links.entry(from).or_default();
            if fresh {
                lk.peer_idle = e.idle;
            }
            if lk.tomb().is_some() {
                // Counters of the retired generation may still be in this message.
                continue;
            }
            // Our `seen` is the sender's acknowledgement: a change of our entry.
            let seen_moved = e.given > lk.seen && leased;
            if seen_moved {
                ks.seen_sum = ks.seen_sum.wrapping_add(e.given - lk.seen);
                lk.seen = e.given;
                news = true;
                // A gift of the retiring generation: the peer's `given` was never our `c`
                // since we proposed, and never will be, so it cannot match: end the round.
                if lk.retiring().is_some() {
                    lk.retirement = Retirement::None;
                }
            }
            if e.seen <= lk.given {
                lk.acked = lk.acked.max(e.seen);
            }
            if fresh {
                lk.peer = Some((e.indicator, e.saturated));
                let relay = (e.relay.is_finite() && e.relay >= 1.0).then_some((
                    e.relay,
                    e.relay_hops,
                    e.seen,
                ));
                lk.relay = relay;
            }
            if seen_moved {
                ks.change(&mut seq);
            }
        }
        self.change_seq = seq;
        if !stale {
            self.match_retirements(from, msg);
        }
        // A key the neighbour sent no entry for in a message that holds all its keys has no
        // state there: idle on its side ("Idle keys"). A neighbour that dropped the key
        // sends nothing more about it, so without this our side would wait for ever.
        if fresh && msg.all_keys && !stale && self.cfg.idle_after.is_some() {
            for (k, ks) in &mut self.keys {
                if let Some(lk) = ks.links.get_mut(&from)
                    && msg.keys.binary_search_by_key(k, |e| e.key).is_err()
                {
                    // An entry is left out only without a request in it.
                    lk.peer_idle = true;
                    lk.relay = None;
                }
            }
        }
        Some(news)
    }

    /// Seed 004: news is answered at once where tokens allow. A reply to the sender, a
    /// relay gift to whoever asked (so capacity crosses several hops within one cycle), and
    /// a changed relay request to the neighbours it concerns. Only relay gifts are made
    /// here: the law's gifts stay once per cycle, as its stability bound assumes.
    fn react(&mut self, now: Nanos, news: &[NodeId], draw: &mut dyn FnMut() -> f64) {
        // (A sorted, deduplicated vector: a set in id order without a node per entry.)
        let mut notify = StackVec::<NodeId, 16>::new();
        notify.extend(news.iter().copied());
        // The usable neighbours, once for the whole message (the sends below change none).
        let mut plans = StackVec::<Option<RelayPlan>, 4>::new();
        let mut relay = None;
        if self.links.values().any(|l| l.pacing.is_some()) && self.relaying(now) {
            let u = self.usable(now);
            self.relay_give(now, &u, Some(&mut notify));
            self.relay_plans(&u, &mut plans);
            for (ks, &plan) in self.keys.values().zip(&plans) {
                for &(q, _) in u.iter() {
                    let sent = ks.links.get(&q).map_or(0.0, |l| l.relay_sent);
                    let (r, _) = Self::relay_ask(plan, q, Self::has_spare(ks, q), &u);
                    // A quiet key's level request (sent where no relay request is) is no
                    // news: it goes at the next tick.
                    if relay_changed(sent, r) && !(ks.quiet && r == 0.0) {
                        notify.push(q);
                    }
                }
            }
            relay = Some(u);
        }
        notify.sort_unstable();
        notify.dedup();
        for &q in notify.iter() {
            if let Some(acc) = self.links.get_mut(&q).and_then(|l| l.pacing.as_mut())
                // One message carries every changed key, so spend at most one token per
                // news; the rest stay for the next (seed 004 Alg. 4 counts messages).
                && acc.on_news_at_most(now, draw(), 1) > 0
            {
                match &relay {
                    Some(u) => self.send_with(q, now, u, Some(&plans)),
                    None => self.send(q, now),
                }
            }
        }
    }
}
