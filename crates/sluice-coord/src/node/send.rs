//! What goes to a peer: the ledger for the heir, every active key's counters, settlement
//! traffic, split to fit a datagram.

use super::*;

impl Node {
    pub(super) fn ledger(&self) -> Ledger {
        Ledger {
            version: self.ledger_version,
            holdings: self.holdings.clone(),
            bases: self
                .keys
                .iter()
                .filter(|(_, k)| i128::from(k.base) != i128::from(self.default_base))
                .map(|(&key, k)| (key, k.base))
                .collect(),
            neighbours: self
                .links
                .iter()
                .filter(|(_, l)| l.neighbour)
                .map(|(p, l)| (*p, l.inc))
                .collect(),
            wards: self.wards.keys().copied().collect(),
            settled: self.settled.iter().map(|(&n, &i)| (n, i)).collect(),
            // Only this incarnation's folds are in these bases. A link an earlier
            // incarnation of ours froze went into that incarnation's estate, and the same
            // peer incarnation may have linked with us again since (a ward whose settlement
            // died unannounced, rule 6): listing it made our heir skip that peer's answer
            // for the live link and count our side of it twice (L + 1.6 %, 5-ring).
            folded: self
                .frozen
                .iter()
                .filter(|(_, r)| r.by_inc == self.inc)
                .map(|(&link, _)| link)
                .collect(),
            pending_folds: self.pending_folds.values().map(|f| f.0).collect(),
            received_folds: self
                .received_folds
                .iter()
                .map(|(&(p, k, seen), r)| (p, r.inc, k, seen))
                .collect(),
            // Rule 11: whoever settles us takes these over. Not those that pay an origin's
            // debt (rule 10): their debt would not go with them.
            settling: self
                .settling
                .iter()
                .filter(|(_, s)| s.origin.is_none())
                .map(|(&(ward, incarnation), s)| {
                    let mut ledger = self.handed_ledger(s);
                    ledger.settling.clear();
                    let me = self.cfg.id;
                    let side = ledger
                        .neighbours
                        .iter()
                        .any(|l| l.0 == me)
                        .then(|| self.own_answer(ward, incarnation));
                    wire::Settling {
                        ward,
                        incarnation,
                        leaving: s.ward.leaving,
                        ledger,
                        side,
                    }
                })
                .collect(),
        }
    }

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
        // Orphaned (rule 7), we still name our heir but send it no ledger: the incarnation
        // that granted our lease, if it runs after all, keeps its record of us (a ward
        // candidate once it learns it is dead), instead of dropping it as for a ward that
        // named another heir; no other incarnation adopts us without a ledger.
        let to_heir = Some(to) == self.heir && self.lifecycle != Lifecycle::Left;
        let ledger = (to_heir && !self.orphaned(now)).then(|| self.ledger());
        if ledger.is_some() && self.lease_inc == 0 {
            self.ledger_inc = self.links.get(&to).map_or(0, |l| l.inc);
        }
        let requests: Vec<(NodeId, u64)> = self
            .settling
            .iter()
            .filter(|(_, s)| self.announced(s.version) && s.waiting.contains(&to))
            .map(|(&(n, inc), _)| (n, inc))
            .collect();
        let saturated_all =
            self.lifecycle != Lifecycle::Active || self.lease_state(now) == LeaseState::Expired;
        let ledger_ack = self.wards.get(&to).map_or(0, |w| w.ledger.version);
        let succession = self
            .successions
            .get(&to)
            .copied()
            .filter(|s| self.announced(s.1));
        let relaying = self.relaying(now);
        let (max_hops, reservation) = (self.max_hops(), self.reservation);
        let leveling = self.cfg.idle_after.is_some()
            && self.lifecycle == Lifecycle::Active
            && self.lease_state(now) != LeaseState::Expired;
        let floor = self.level_floor();
        // A matched retirement that folded a net out of our base is acknowledged only once
        // our heir holds that base ("Idle keys": the net giver's fold is durable first).
        let (no_heir, acked) = (self.heir.is_none(), self.ledger_acked);
        let pending_folds = &self.pending_folds;
        let fold_announced = |k: Key| {
            pending_folds
                .get(&(to, k))
                .is_none_or(|f| no_heir || acked >= f.1)
        };
        // Max-min keys advertise an indicator that caps what they can be given (see
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
        let mut retire = Vec::new();
        let mut retired = Vec::new();
        let mut omitted = Vec::new();
        let mut keys: Vec<KeyEntry> = if link.neighbour {
            self.keys
                .iter_mut()
                .enumerate()
                .filter_map(|(i, (&key, ks))| {
                    let (mut relay, mut relay_hops) = if relaying {
                        let plan = plans
                            .and_then(|v| v.get(i).copied())
                            .unwrap_or_else(|| Self::relay_plan(ks, usable, max_hops, reservation));
                        Self::relay_ask(plan, to, usable)
                    } else {
                        (0.0, 0)
                    };
                    // A real request first; a quiet key's level request only without one.
                    if leveling && ks.quiet && relay == 0.0 {
                        (relay, relay_hops) = Self::level_ask(ks, to, usable, floor, max_hops);
                    }
                    let relay = relay as f32;
                    let lk = ks.links.get(&to).copied().unwrap_or_default();
                    if lk.retiring().is_some() {
                        retire.push((key, lk.given, lk.seen));
                    }
                    if let Some(t) = lk.tomb()
                        && fold_announced(key)
                    {
                        retired.push((key, t));
                    }
                    if (relay != lk.relay_sent || lk.given != lk.given_sent)
                        && let Some(l) = ks.links.get_mut(&to)
                    {
                        l.relay_sent = relay;
                        l.given_sent = l.given;
                    }
                    let own = ks.own();
                    let demand = ks.demand.estimate();
                    let measure = cfg.measure_of(key);
                    let mut indicator = measure.indicator(demand, own as f64);
                    if matches!(measure, Measure::MaxMin) {
                        let gamma = cfg.gain_of(key, base_gamma);
                        indicator = max_min_indicator(ks, own, demand, gamma * degree);
                    }
                    let entry = KeyEntry {
                        key,
                        given: lk.given,
                        seen: lk.seen,
                        indicator: indicator as f32,
                        saturated: saturated_all
                            || (measure.bounded_by_demand() && own as f64 >= demand),
                        relay,
                        relay_hops,
                        idle: ks.quiet,
                    };
                    // A quiet key with nothing on this link, to a neighbour quiet too: the
                    // entry says only "idle, nothing", which is what its absence from a
                    // message holding all our keys says (`Message::all_keys`; the law does not
                    // run between quiet ends). Kept aside, and sent only if the message must
                    // be split (then absence says nothing). Quiet keys still levelling or
                    // folding elsewhere then cost no entry bytes on this link.
                    if ks.quiet
                        && lk.peer_idle
                        && lk.given == 0
                        && lk.seen == 0
                        && !lk.frozen()
                        && relay == 0.0
                        && lk.relay_sent == 0.0
                    {
                        omitted.push(entry);
                        return None;
                    }
                    Some(entry)
                })
                .collect()
        } else {
            Vec::new()
        };
        let dead_verdict = std::mem::take(&mut link.verdict);
        let mail = link.mail.take().map(|m| *m).unwrap_or_default();
        let message = Message {
            from_inc: self.inc,
            to_inc: link.inc,
            sent_at,
            echo: link.echo,
            lifecycle: self.lifecycle,
            to_heir,
            all_keys: link.neighbour,
            rest: false,
            dead_verdict,
            verdict_version: self.settled_with.get(&(to, dead_verdict)).copied(),
            ledger,
            keys: Vec::new(),
            settle_requests: requests,
            settle_replies: mail.replies,
            succession: succession.map(|s| s.0),
            ledger_ack,
            retire,
            retired,
            confirm: mail.confirm.into_iter().collect(),
            late_folds: Vec::new(),
            late_acks: mail.late_acks,
            handovers: Vec::new(),
            handover_acks: mail.handover_acks,
            census: self.census,
            audit: self.audit_field(to),
        };
        let mut message = message;
        if !self.late_folds.is_empty() {
            message.late_folds = self.late_offers_to(to);
        }
        if !self.handovers.is_empty() {
            message.handovers = self
                .handovers_to(to)
                .map(|(&(incarnation, ward, ward_incarnation), h)| Handover {
                    incarnation,
                    ward,
                    ward_incarnation,
                    ledger: h.ledger.clone(),
                    kind: h.kind,
                    leaving: h.leaving,
                })
                .collect();
        }
        let cap = self.cfg.max_message_bytes;
        if !omitted.is_empty() && !fits_one(wire::encoded_len(&message), &keys, cap) {
            keys.append(&mut omitted);
            keys.sort_unstable_by_key(|e| e.key);
        }
        split(
            message,
            keys,
            self.cfg.max_message_bytes,
            to,
            &mut self.outbox,
        );
    }
}

/// The max-min indicator a node advertises for `ks`: `−x`, lowered so that the law's gifts
/// to it add up to at most its unmet demand `r − x`. A giver `i` gives `γ·w_i·(p − p_i)`;
/// with `p ≤ min_i p_i + (r − x)/(γ·Σw)` that is at most `(w_i/Σw)·(r − x)` from each, so a
/// node just short of its demand is not handed a share far above it, which it would then
/// pass on again through the relay (a dithering that cost 4–6 % of the admissions at a
/// demand near the water level).
fn max_min_indicator(ks: &KeyState, own: u64, demand: f64, gain_degree: f64) -> f64 {
    let x = own as f64;
    let unmet = demand - x;
    let lowest = ks
        .links
        .values()
        .filter_map(|lk| lk.peer.map(|(p, _)| f64::from(p)))
        .fold(f64::INFINITY, f64::min);
    if unmet <= 0.0 || !lowest.is_finite() || gain_degree <= 0.0 {
        return -x;
    }
    (-x).min(lowest + unmet / gain_degree)
}
