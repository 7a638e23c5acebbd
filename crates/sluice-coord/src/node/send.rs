//! What goes to a peer: the keys' entries it may lack (to neighbours, `delta`), the lease
//! echo, votes and dead floors, the audit, in one datagram within the link's budget.

use super::*;

impl Node {
    pub(super) fn send(&mut self, to: NodeId, now: Nanos) {
        let usable = self.usable(now);
        self.send_with(to, now, &usable, None);
    }

    /// [`Node::send`] with the usable neighbours already worked out (`Node::usable` at `now`;
    /// read when relaying and for quiet keys' level requests) and, if given, every key's
    /// [`RelayPlan`] (in key order, from [`Node::relay_plans`] on the current state).
    pub(super) fn send_with(
        &mut self,
        to: NodeId,
        now: Nanos,
        usable: &[(NodeId, f64)],
        plans: Option<&[Option<RelayPlan>]>,
    ) {
        let saturated_all =
            self.lifecycle != Lifecycle::Active || self.lease_state(now) == LeaseState::Expired;
        let relaying = self.relaying(now);
        let (max_hops, reservation) = (self.max_hops(), self.reservation);
        let leveling = self.cfg.idle_after.is_some()
            && self.lifecycle == Lifecycle::Active
            && self.lease_state(now) != LeaseState::Expired;
        let floor = self.level_floor();
        let echo = self.echo_for(to, now);
        let votes = self.votes_to_send();
        let dead_version = self.dead_version;
        // Max-min keys advertise an indicator that sets what they are given (see
        // `max_min_indicator`): the gain and weights the neighbours give with.
        let degree: f64 = usable.iter().map(|&(_, w)| w).sum();
        let base_gamma = self
            .cfg
            .gamma
            .min(stability::max_gain(&self.cfg.measure, degree));
        let cfg = &self.cfg;
        let Some(link) = self.links.get_mut(&to) else {
            return;
        };
        // Strictly increasing per link (see `Link::floor`); at most a few ns ahead of `now`.
        let sent_at = now.max(link.last_sent + 1);
        link.last_sent = sent_at;
        let sent = &mut link.delta;
        sent.sends = sent.sends.wrapping_add(1);
        let sends = sent.sends;
        let send_dead = sent.dead_sent != dead_version || sent.sends.is_multiple_of(16);
        sent.dead_sent = dead_version;
        let refresh = sent
            .sends
            .is_multiple_of(delta::REFRESH_EVERY)
            .then(|| link.delta.refresh_from());
        let acked = link.delta.acked();
        let to_inc = link.inc;
        let credit = link.delta.credit(now, cfg.link_budget, cfg.cycle);
        // Retirement lists are rebuilt at every send (and confirmations are sent again when
        // the peer asks again): a share of the datagram each, the rest next time.
        let list_room = (cfg.max_message_bytes / 4 / 30).max(1);
        let mut retire = Vec::new();
        let mut retired = Vec::new();
        let mut cands = Vec::with_capacity(if link.neighbour { self.keys.len() } else { 0 });
        let mut seq = self.change_seq;
        if link.neighbour {
            for (i, (&key, ks)) in self.keys.iter_mut().enumerate() {
                let (mut relay, mut relay_hops) = if relaying {
                    let plan = plans
                        .and_then(|v| v.get(i).copied())
                        .unwrap_or_else(|| Self::relay_plan(ks, usable, max_hops, reservation));
                    Self::relay_ask(plan, to, Self::has_spare(ks, to), usable)
                } else {
                    (0.0, 0)
                };
                // A real request first; a quiet key's level request only without one.
                if leveling && ks.quiet && relay == 0.0 {
                    (relay, relay_hops) = Self::level_ask(ks, to, usable, floor, max_hops);
                }
                let lk = ks.links.get(&to).copied();
                let l = lk.unwrap_or_default();
                if l.retiring().is_some() && retire.len() < list_room {
                    retire.push((key, l.given, l.seen));
                }
                if let Some(t) = l.tomb()
                    && retired.len() < list_room
                {
                    retired.push((key, t));
                }
                let own = ks.own();
                let demand = ks.demand.estimate();
                let measure = cfg.measure_of(key);
                let gamma = cfg.gain_of(key, base_gamma);
                let mut indicator = measure.indicator(demand, own as f64);
                if matches!(measure, Measure::MaxMin) {
                    indicator = max_min_indicator(ks, own, demand, gamma, usable);
                }
                let advert = delta::Advert {
                    indicator: indicator as f32,
                    saturated: saturated_all
                        || (measure.bounded_by_demand() && own as f64 >= demand),
                    idle: ks.quiet,
                };
                // News for the peer: capacity recorded for it that no message carried, or a
                // relay request it has not heard (a neighbour we hold nothing with for the
                // key hears requests with the key's changes and refreshes).
                let urgent = l.given != l.given_sent
                    || lk.is_some_and(|l| relay_changed(l.relay_sent, relay));
                if urgent || ks.advert.is_none_or(|a| a.moved(&advert, gamma * degree)) {
                    ks.advert = Some(advert);
                    ks.change(&mut seq);
                }
                cands.push(delta::Candidate {
                    entry: KeyEntry {
                        key,
                        given: l.given,
                        seen: l.seen,
                        indicator: advert.indicator,
                        saturated: advert.saturated,
                        relay: relay as f32,
                        relay_hops,
                        idle: ks.quiet,
                    },
                    changed: ks.changed,
                    urgent,
                    // A gift is due until the peer's `seen` says it arrived.
                    due: ks.changed > acked || l.given > l.acked,
                });
            }
        }
        self.change_seq = seq;
        let mut confirm: Vec<Key> = Vec::new();
        if let Some(mut c) = self.confirms.remove(&to) {
            while confirm.len() < list_room
                && let Some(k) = c.pop_first()
            {
                confirm.push(k);
            }
            if !c.is_empty() {
                self.confirms.insert(to, c);
            }
        }
        let mut message = Message {
            from_inc: self.inc,
            to_inc,
            sent_at,
            echo,
            lifecycle: self.lifecycle,
            members: self.members_digest,
            all_keys: false,
            rest: false,
            keys: Vec::new(),
            retire,
            retired,
            confirm,
            votes,
            dead: Vec::new(),
            audit: None,
        };
        if send_dead {
            message.dead = self.dead_list(now);
        }
        message.audit = self.audit_field(to, u64::from(sends));
        // One datagram at most, and no more than the link's budget: what is left out goes
        // next time (it is still due).
        let head = wire::encoded_len(&message) + delta::COUNT_SLACK;
        let room = credit.min(self.cfg.max_message_bytes).saturating_sub(head);
        let (keys, horizon, all, last) = delta::choose(cands, room, acked, seq, refresh);
        for e in &keys {
            if let Some(ks) = self.keys.get_mut(&e.key) {
                ks.sent = true;
                if let Some(lk) = ks.links.get_mut(&to) {
                    lk.relay_sent = e.relay;
                    lk.given_sent = lk.given;
                }
            }
        }
        message.all_keys = all && self.links.get(&to).is_some_and(|l| l.neighbour);
        message.keys = keys;
        let bytes = wire::encoded_len(&message);
        if let Some(link) = self.links.get_mut(&to) {
            link.delta.spend(bytes);
            link.delta.record(sent_at, to_inc, horizon);
            if let Some(k) = last {
                link.delta.refreshed_to(k);
            }
        }
        self.outbox.push(Outgoing { to, message });
    }
}

/// The max-min indicator a node advertises for `ks`: `−x`, lowered to the level `P` at
/// which the law's gifts to it add up to its unmet demand `r − x`: a neighbour `j` gives
/// `γ·w_j·(P − p_j)` when `P > p_j`, so `P` solves `γ·Σ_j w_j·(P − p_j)⁺ = r − x` (water-filling
/// over the neighbours' advertised indicators). A node short of its demand is then handed
/// what it lacks in one round, not a share far above it (which it would pass on again through
/// the relay: a dithering that cost 4–6 % of the admissions at a demand near the water
/// level), nor a fraction of it each cycle (a bound on each giver alone took a joiner 7
/// cycles to reach its demand when its neighbours' shares differed).
fn max_min_indicator(
    ks: &KeyState,
    own: u64,
    demand: f64,
    gamma: f64,
    usable: &[(NodeId, f64)],
) -> f64 {
    let x = own as f64;
    let unmet = demand - x;
    if unmet <= 0.0 || gamma <= 0.0 {
        return -x;
    }
    let mut givers = StackVec::<(f64, f64), 16>::new();
    givers.extend(ks.links.iter().filter_map(|(p, lk)| {
        let w = usable_weight(usable, *p)?;
        let (ind, _) = lk.peer?;
        (w > 0.0).then_some((f64::from(ind), w))
    }));
    givers.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Raise the level over the lowest indicators first: with the `k` lowest giving, the
    // level is `(unmet/γ + Σ w·p) / Σ w`; it holds if it stays below the next indicator.
    let (mut wsum, mut wp) = (0.0, 0.0);
    let mut level = f64::INFINITY;
    for (k, &(p, w)) in givers.iter().enumerate() {
        wsum += w;
        wp += w * p;
        let l = (unmet / gamma + wp) / wsum;
        if givers.get(k + 1).is_none_or(|&(next, _)| l <= next) {
            level = l;
            break;
        }
    }
    (-x).min(level)
}
