//! Idle keys (module docs, "Idle keys"; docs/PROTOCOL.md): give back, retire balanced counters,
//! drop what no state says.

use super::*;

impl Node {
    /// Marks keys idle for `Config::idle_after` as quiet ("Idle keys").
    pub(super) fn update_quiet(&mut self, now: Nanos) {
        let Some(after) = self.cfg.idle_after else {
            return;
        };
        for ks in self.keys.values_mut() {
            if ks.demand.estimate() < 1.0 {
                let since = *ks.idle_since.get_or_insert(now);
                ks.quiet = now >= since.saturating_add(after);
            } else {
                ks.idle_since = None;
                ks.quiet = false;
            }
        }
    }

    /// Quiet keys return to each quiet neighbour what they received from it beyond what
    /// they gave it, so every link's counters balance (`given = seen`) and every node goes
    /// back to its base: the static split, where the key's capacity started.
    pub(super) fn give_back(&mut self, usable: &[(NodeId, f64)]) {
        if self.cfg.idle_after.is_none() {
            return;
        }
        let reservation = self.reservation;
        for ks in self.keys.values_mut().filter(|k| k.quiet) {
            let mut budget = ks.own().saturating_sub(reservation);
            for (p, lk) in &mut ks.links {
                if budget == 0 {
                    break;
                }
                if usable_weight(usable, *p).is_some()
                    && lk.peer_idle
                    && !lk.frozen()
                    && lk.seen > lk.given
                {
                    let amount = (lk.seen - lk.given).min(budget);
                    lk.given += amount;
                    ks.given_sum = ks.given_sum.wrapping_add(amount);
                    budget -= amount;
                }
            }
        }
    }

    /// Proposes retiring the counters of balanced links of quiet keys ("Idle keys").
    pub(super) fn propose_retirements(&mut self) {
        if self.cfg.idle_after.is_none() {
            return;
        }
        let next: BTreeMap<NodeId, Nanos> = self
            .links
            .iter()
            .filter(|(_, l)| l.neighbour && l.inc != 0)
            .map(|(&p, l)| (p, l.last_sent + 1))
            .collect();
        for ks in self.keys.values_mut().filter(|k| k.quiet) {
            for (p, lk) in &mut ks.links {
                if let Some(&at) = next.get(p)
                    && !lk.frozen()
                    && lk.peer_idle
                    && lk.given > 0
                    && lk.given == lk.seen
                    && lk.acked == lk.given
                {
                    lk.retirement = Retirement::Proposed(at);
                }
            }
        }
    }

    /// Drops quiet keys whose state says exactly what no state says: base = the default,
    /// every link's counters zero, nothing under way, every neighbour quiet too.
    pub(super) fn reclaim(&mut self) {
        if self.cfg.idle_after.is_none() {
            return;
        }
        let default = i64::try_from(self.default_base).unwrap_or(i64::MAX);
        let reclaimed = &mut self.reclaimed;
        self.keys.retain(|&k, ks| {
            let idle = ks.quiet
                && ks.base == default
                && ks
                    .links
                    .values()
                    .all(|lk| lk.given == 0 && lk.seen == 0 && !lk.frozen() && lk.peer_idle);
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
                    if lk.given != lk.seen {
                        // Cannot happen (see above); never confirm what we did not reset.
                        continue;
                    }
                    zeroed = Some(lk.given);
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
            if let Some(c) = zeroed
                && let Some(ks) = self.keys.get_mut(&k)
            {
                ks.zeroed(c);
            }
            confirm.push(k);
        }
        if let Some(l) = self.links.get_mut(&from) {
            l.floor = floor;
            if !confirm.is_empty() {
                l.mail().confirm.extend(confirm);
            }
        }
        stale
    }

    /// Retirement proposals from `from`: match those whose counters are exactly ours.
    pub(super) fn match_retirements(&mut self, from: NodeId, msg: &Message) {
        for &(k, c) in &msg.retire {
            if let Some(ks) = self.keys.get_mut(&k)
                && let Some(lk) = ks.links.get_mut(&from)
                && lk.tomb().is_none()
                && c > 0
                && lk.given == c
                && lk.seen == c
            {
                // Both ends hold `given = seen = c`: nothing in flight either way, and the
                // net of the link is zero, so zeroing the counters changes no share, no
                // base and no settlement estimate. Our own proposal, if any, ends here.
                *lk = LinkKey {
                    peer: lk.peer,
                    peer_idle: lk.peer_idle,
                    retirement: Retirement::Tomb(msg.sent_at),
                    ..LinkKey::default()
                };
                ks.zeroed(c);
            }
        }
    }
}
