//! Idle keys (module docs, "Idle keys"; docs/PROTOCOL.md): level back to the static split,
//! retire counters folding their net, drop what no state says.

use super::*;

impl Node {
    /// Marks keys idle for `Config::idle_after` as quiet ("Idle keys").
    pub(super) fn update_quiet(&mut self, now: Nanos) {
        let Some(after) = self.cfg.idle_after else {
            return;
        };
        // At the cap, an idle key is quiet at once (`cap`): it frees its room soonest.
        let pressed = self.under_pressure();
        for ks in self.keys.values_mut() {
            if ks.demand.estimate() < 1.0 {
                let since = *ks.idle_since.get_or_insert(now);
                let due = now >= since.saturating_add(after);
                if pressed && !due && !ks.quiet {
                    self.evicted += 1;
                }
                ks.quiet = due || pressed || ks.quiet;
            } else {
                ks.idle_since = None;
                ks.quiet = false;
            }
        }
    }

    /// What a quiet key holds when it is back at its static split: the default base (our
    /// initial shares, own and inherited), never below our reservation.
    pub(super) fn level_floor(&self) -> u64 {
        self.default_base.max(self.reservation)
    }

    /// A quiet key's level request to neighbour `to` ("Idle keys"): what we lack of our
    /// static split (`floor`), or the largest open level request of another quiet neighbour
    /// (split horizon: never back to the one asking; at most `max_hops`, as relay requests),
    /// less what we hold above our split. Whole, not split over the neighbours asked: a
    /// deficit of one unit split three ways would ask nobody for anything. What more than
    /// one neighbour gives is a surplus here, which goes on to the next request (the sum of
    /// every node's surplus less deficit is what is in flight). `(0, 0)`: nothing to ask.
    pub(super) fn level_ask(
        ks: &KeyState,
        to: NodeId,
        usable: &[(NodeId, f64)],
        floor: u64,
        max_hops: u8,
    ) -> (f64, u8) {
        // A neighbour we hold no link state with for the key has none either (messages hold
        // every key): idle there. Asking it is how a request crosses a node that has no
        // state for the key (a restarted one).
        let asked = ks.links.get(&to);
        if !asked.is_none_or(|lk| lk.peer_idle) || usable_weight(usable, to).is_none() {
            return (0.0, 0);
        }
        let own = ks.own();
        let mut best = (floor.saturating_sub(own) as f64, 0u8);
        for (p, lk) in &ks.links {
            if *p == to || !lk.peer_idle || usable_weight(usable, *p).is_none() {
                continue;
            }
            let Some((_, h, _)) = lk.relay else { continue };
            let open = lk.level_open();
            let hops = (h & !wire::LEVEL_REQUEST).saturating_add(1);
            if open > best.0 && hops < max_hops {
                best = (open, hops);
            }
        }
        let residual = best.0 - own.saturating_sub(floor) as f64;
        if residual < 1.0 {
            (0.0, 0)
        } else {
            (residual, best.1 | wire::LEVEL_REQUEST)
        }
    }

    /// Level gifts ("Idle keys"): what a quiet key holds above its static split goes to
    /// quiet neighbours' open level requests, the nearest deficit first (fewest hops, then
    /// largest). Nearest first is what ends the trip: the receiver passes it on only to a
    /// request nearer still. Largest first let two requests for the same deficit that
    /// reached each other round a ring bounce the surplus between their carriers for ever
    /// (found by `idle_keys_are_reclaimed_and_conserve`). Level gifts travel on the gift
    /// counters like every other gift, so conservation is untouched.
    pub(super) fn level_give(&mut self, usable: &[(NodeId, f64)]) {
        if self.cfg.idle_after.is_none() {
            return;
        }
        let floor = self.level_floor();
        let mut asks = StackVec::<(NodeId, u8, f64), 16>::new();
        for ks in self.keys.values_mut().filter(|k| k.quiet) {
            let spare = ks.own().saturating_sub(floor);
            if spare == 0 {
                continue;
            }
            asks.clear();
            asks.extend(
                ks.links
                    .iter()
                    .filter(|(p, lk)| {
                        usable_weight(usable, **p).is_some() && lk.peer_idle && !lk.frozen()
                    })
                    .map(|(p, lk)| {
                        let hops = lk.relay.map_or(0, |r| r.1 & !wire::LEVEL_REQUEST);
                        (*p, hops, lk.level_open())
                    })
                    .filter(|a| a.2 >= 1.0),
            );
            asks.sort_by(|a, b| a.1.cmp(&b.1).then(b.2.total_cmp(&a.2)));
            ks.give_in_order(asks.iter().map(|&(p, _, open)| (p, open)), spare, |_| {});
        }
    }

    /// Proposes retiring the counters of quiet keys' links ("Idle keys"): balanced ones, and
    /// those we are the net receiver of once we are back at our static split (the peer, the
    /// net giver, folds first).
    pub(super) fn propose_retirements(&mut self) {
        if self.cfg.idle_after.is_none() {
            return;
        }
        let floor = self.level_floor();
        let next: BTreeMap<NodeId, Nanos> = self
            .links
            .iter()
            .filter(|(_, l)| l.neighbour && l.inc != 0)
            .map(|(&p, l)| (p, l.last_sent + 1))
            .collect();
        for ks in self.keys.values_mut().filter(|k| k.quiet) {
            let level = ks.own() == floor;
            for (p, lk) in &mut ks.links {
                if let Some(&at) = next.get(p)
                    && !lk.frozen()
                    && lk.peer_idle
                    && lk.seen > 0
                    && (lk.given == lk.seen || (level && lk.seen > lk.given))
                    && lk.acked == lk.given
                {
                    lk.retirement = Retirement::Proposed(at);
                }
            }
        }
    }

    /// Drops quiet keys whose state says exactly what no state says: base = the default,
    /// every link's counters zero, nothing under way, every neighbour quiet too, and every
    /// usable neighbour has the key's latest entry (which says it is idle here: dropped
    /// before, the neighbour would wait for that news for ever, as a message need not hold
    /// every key).
    pub(super) fn reclaim(&mut self, usable: &[(NodeId, f64)]) {
        if self.cfg.idle_after.is_none() {
            return;
        }
        let default = i64::try_from(self.default_base).unwrap_or(i64::MAX);
        let mut told = StackVec::<u64, 16>::new();
        told.extend(
            usable
                .iter()
                .filter_map(|(p, _)| self.links.get(p).map(|l| l.delta.acked())),
        );
        let told = told.iter().copied().min().unwrap_or(u64::MAX);
        let reclaimed = &mut self.reclaimed;
        self.keys.retain(|&k, ks| {
            let idle = ks.quiet
                && ks.changed <= told
                && ks.base == default
                && ks.links.values().all(|lk| {
                    lk.given == 0
                            && lk.seen == 0
                            && !lk.frozen()
                            && lk.peer_idle
                            // A level request crosses us (we pass it on).
                            && lk.level_open() < 1.0
                });
            if idle {
                reclaimed.push(k);
            }
            !idle
        });
    }

    /// Confirmations and acknowledgements of retirements in a message from `from` ("Idle
    /// keys"); returns whether the message is older than the link's floor (its counters and
    /// proposals are then ignored).
    pub(super) fn retirements(&mut self, from: NodeId, msg: &Message) -> bool {
        let mut floor = self.links.get(&from).map_or(0, |l| l.floor);
        let stale = msg.sent_at < floor;
        let mut confirm = Vec::new();
        // The peer reset after acknowledging our proposal: its entries are fresh from here.
        for k in &msg.confirm {
            if let Some(lk) = self.keys.get_mut(k).and_then(|ks| ks.links.get_mut(&from))
                && lk.tomb().is_some_and(|t| msg.sent_at > t)
            {
                lk.retirement = Retirement::None;
                // It folded the net in: ours is no longer pending.
                self.pending_folds.remove(&(from, *k));
                floor = floor.max(msg.sent_at);
            }
        }
        // The peer matched our proposal and reset: reset ours (they are `c, c` — we gave
        // nothing since proposing, and it gave nothing since matching) and confirm.
        for &(k, at) in &msg.retired {
            let lk = self.keys.get_mut(&k).and_then(|ks| ks.links.get_mut(&from));
            let mut zeroed = None;
            match lk {
                Some(lk) if lk.retiring().is_some_and(|t0| at >= t0) => {
                    if lk.given > lk.seen {
                        // Cannot happen (we propose only as the net receiver); never confirm
                        // what we did not reset.
                        continue;
                    }
                    zeroed = Some((lk.seen, lk.given));
                    *lk = LinkKey {
                        peer: lk.peer,
                        peer_idle: lk.peer_idle,
                        ..LinkKey::default()
                    };
                    // Older messages of the peer may carry the retired counters.
                    floor = floor.max(msg.sent_at);
                }
                // An acknowledgement of a round we already finished (we reset then, by its
                // acknowledgement or by matching the peer's own proposal): our
                // confirmation was lost, send it again.
                _ => {}
            }
            if let Some((seen, given)) = zeroed
                && let Some(ks) = self.keys.get_mut(&k)
            {
                // The peer, the net giver, folded the net out of its base: it is ours now,
                // in our base. Until our confirmation reaches it, the audit counts it at
                // the peer too (counted twice, never missing).
                let net = seen - given;
                ks.zeroed(seen, given);
                ks.base = ks
                    .base
                    .saturating_add(i64::try_from(net).unwrap_or(i64::MAX));
                if net > 0 {
                    self.base_version += 1;
                }
            }
            confirm.push(k);
        }
        if let Some(l) = self.links.get_mut(&from) {
            l.floor = floor;
        }
        if !confirm.is_empty() {
            self.confirms.entry(from).or_default().extend(confirm);
        }
        stale
    }

    /// Retirement proposals from `from`: match those whose counters are exactly ours, seen
    /// from the other end.
    ///
    /// The proposer holds `(given g, seen s)` with `s ≥ g`; we hold `given = s`, `seen = g`:
    /// nothing in flight either way, and we gave the link's net `n = s − g`. We fold it out
    /// of our base (our share does not change), zero the counters and acknowledge; the
    /// proposer folds it into its base when the acknowledgement arrives. Meanwhile the net
    /// is in neither base: the audit counts our pending fold as ours (`pending_folds`) until
    /// the proposer confirms, so it is never missing from a reading (at worst counted twice,
    /// which only mints less). If either end dies meanwhile, the net is in its void
    /// holdings or in the survivor's counters, which the survivor folds. A balanced link
    /// (`n = 0`) changes no base.
    pub(super) fn match_retirements(&mut self, from: NodeId, msg: &Message) {
        let active = self.lifecycle == Lifecycle::Active;
        for &(k, g, s) in &msg.retire {
            if let Some(ks) = self.keys.get_mut(&k)
                && let Some(lk) = ks.links.get_mut(&from)
                && matches!(lk.retirement, Retirement::None | Retirement::Proposed(_))
                && s > 0
                && s >= g
                && lk.given == s
                && lk.seen == g
                // A leaving node hands everything over; it folds nothing.
                && (s == g || active)
            {
                let net = s - g;
                // Our own proposal, if any (only for a balanced link), ends here.
                *lk = LinkKey {
                    peer: lk.peer,
                    peer_idle: lk.peer_idle,
                    retirement: Retirement::Tomb(msg.sent_at),
                    ..LinkKey::default()
                };
                ks.zeroed(g, s);
                if net > 0 {
                    ks.base = ks
                        .base
                        .saturating_sub(i64::try_from(net).unwrap_or(i64::MAX));
                    self.pending_folds.insert((from, k), net);
                    self.base_version += 1;
                }
            }
        }
    }
}
