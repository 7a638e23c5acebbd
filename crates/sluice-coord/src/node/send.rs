//! What goes to a peer: every active key's counters (to neighbours), the lease echo, votes
//! and dead floors, the audit, split to fit a datagram.

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
        link.sends = link.sends.wrapping_add(1);
        let send_dead = link.dead_sent != dead_version || link.sends.is_multiple_of(16);
        link.dead_sent = dead_version;
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
                    if let Some(t) = lk.tomb() {
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
                    // be split (then absence says nothing).
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
        let confirm: Vec<Key> = self
            .confirms
            .remove(&to)
            .map(|c| c.into_iter().collect())
            .unwrap_or_default();
        let message = Message {
            from_inc: self.inc,
            to_inc: link.inc,
            sent_at,
            echo,
            lifecycle: self.lifecycle,
            members: self.members_digest,
            all_keys: link.neighbour,
            rest: false,
            keys: Vec::new(),
            retire,
            retired,
            confirm,
            votes,
            dead: Vec::new(),
            audit: None,
        };
        let mut message = message;
        if send_dead {
            message.dead = self.dead_list();
        }
        message.audit = self.audit_field(to);
        let cap = self.cfg.max_message_bytes;
        if !omitted.is_empty() && !fits_one(wire::encoded_len(&message), &keys, cap) {
            keys.append(&mut omitted);
            keys.sort_unstable_by_key(|e| e.key);
        }
        split(message, keys, cap, to, &mut self.outbox);
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
