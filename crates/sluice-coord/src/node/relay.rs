//! The law's gifts and the relay (module docs, "Relay"; the law is seed 000 eq. 3): which
//! neighbours are usable, what each key asks of them and what the node gives.

use super::*;

impl Node {
    /// Neighbours the law and the relay may give to: active, of known incarnation, heard
    /// within two cycles; with their link weights.
    ///
    /// Sorted by node id (the order of `links`, so sums over it add in the same order as
    /// before); computed once per tick or message and passed down, since it only changes
    /// when a link's incarnation, lifecycle or last receipt does.
    pub(super) fn usable(&mut self, now: Nanos) -> Usable {
        if let Some(c) = &self.usable_cache
            && c.at <= now
            && now <= c.until
        {
            debug_assert_eq!(c.list, self.walk_usable(now).0, "stale usable cache");
            return c.list.clone();
        }
        let (list, until) = self.walk_usable(now);
        self.usable_cache = Some(UsableCache {
            at: now,
            until,
            list: list.clone(),
        });
        list
    }

    /// [`Node::usable`] from the links, and the last instant it holds if nothing changes.
    pub(super) fn walk_usable(&self, now: Nanos) -> (Usable, Nanos) {
        let up = 2 * self.cfg.cycle;
        let mut until = Nanos::MAX;
        let list: Vec<(NodeId, f64)> = self
            .links
            .iter()
            .filter(|(_, l)| Self::link_usable(l, now, up))
            .map(|(p, l)| {
                if let Some(t) = l.last_recv {
                    until = until.min(t.saturating_add(up));
                }
                (*p, l.weight)
            })
            .collect();
        (list.into(), until)
    }

    /// Whether the law and relay may give over `l` at `now`: a neighbour, of known
    /// incarnation, active, and Up (`link_state(p, now) == Some(LinkState::Up)`).
    pub(super) fn link_usable(l: &Link, now: Nanos, up: Nanos) -> bool {
        l.neighbour
            && l.inc != 0
            && l.heard_us()
            && l.lifecycle == Lifecycle::Active
            && l.last_recv.is_some_and(|t| now.saturating_sub(t) <= up)
    }

    /// Whether this node takes part in the relay now: configured, a measure whose unmet
    /// demand is `r − x` (not the M/M/1 response time, which wants `x > r`), active, and
    /// holding a valid lease.
    pub(super) fn relaying(&self, now: Nanos) -> bool {
        self.cfg.relay
            && !matches!(self.cfg.measure, Measure::MeanResponseTime { .. })
            && self.lifecycle == Lifecycle::Active
            && self.lease_state(now) != LeaseState::Expired
    }

    /// Longest relay path: a simple path in a graph of `n` nodes has `n − 1` hops, so a
    /// request that has travelled that far is stale (it went round a cycle) and is dropped.
    pub(super) fn max_hops(&self) -> u8 {
        u8::try_from(self.cfg.members.len().saturating_sub(1).clamp(1, 63)).unwrap_or(63)
    }

    /// The relay request of a key to a neighbour (module docs, "Relay") is the largest of our
    /// own unmet demand and the open requests of the other neighbours (split horizon: never
    /// back to where it came from), less our spare, split over the neighbours asked by link
    /// weight. It is worked out in two steps: [`Node::relay_plan`] once per key (here, for
    /// every key, in key order), then [`Node::relay_ask`] per neighbour; per-neighbour
    /// recomputation made each message O(degree²).
    ///
    /// The plans replace the contents of `out` (a reused buffer).
    pub(super) fn relay_plans(
        &self,
        usable: &[(NodeId, f64)],
        out: &mut StackVec<Option<RelayPlan>, 4>,
    ) {
        let (max_hops, reservation) = (self.max_hops(), self.reservation);
        out.clear();
        out.extend(
            self.keys
                .values()
                .map(|ks| Self::relay_plan(ks, usable, max_hops, reservation)),
        );
    }

    /// The part of a key's relay request that does not depend on the neighbour asked.
    pub(super) fn relay_plan(
        ks: &KeyState,
        usable: &[(NodeId, f64)],
        max_hops: u8,
        reservation: u64,
    ) -> Option<RelayPlan> {
        let own = ks.own() as f64;
        let demand = ks.demand.estimate();
        let mut best: (f64, u8, Option<NodeId>) = ((demand - own).max(0.0), 0, None);
        // Usable neighbours only, in id order (ties go to the lowest id, as they always did).
        for &(p, _) in usable {
            let Some(lk) = ks.links.get(&p) else { continue };
            let Some((_, h, _)) = lk.relay else { continue };
            let open = lk.relay_open();
            if h.saturating_add(1) < max_hops && open > best.0 {
                best = (open, h + 1, Some(p));
            }
        }
        let spare = (own - demand.max(reservation as f64)).max(0.0);
        let residual = best.0 - spare;
        if residual < 1.0 {
            return None;
        }
        let asked = usable.iter().filter(|(p, _)| Some(*p) != best.2);
        let spare: f64 = asked
            .clone()
            .filter(|(p, _)| Self::has_spare(ks, *p))
            .map(|(_, w)| *w)
            .sum();
        let spare_only = spare > 0.0;
        let total = if spare_only {
            spare
        } else {
            asked.map(|(_, w)| *w).sum()
        };
        Some(RelayPlan {
            residual,
            hops: best.1,
            from: best.2,
            total,
            spare_only,
        })
    }

    /// Whether `p`'s latest entry for the key says its share covers its demand.
    pub(super) fn has_spare(ks: &KeyState, p: NodeId) -> bool {
        ks.links
            .get(&p)
            .and_then(|l| l.peer)
            .is_some_and(|(_, saturated)| saturated)
    }

    /// A key's relay request to neighbour `to` from its [`RelayPlan`]: split by link weight.
    pub(super) fn relay_ask(
        plan: Option<RelayPlan>,
        to: NodeId,
        to_has_spare: bool,
        usable: &[(NodeId, f64)],
    ) -> (f64, u8) {
        let Some(plan) = plan else { return (0.0, 0) };
        if Some(to) == plan.from || (plan.spare_only && !to_has_spare) {
            return (0.0, 0);
        }
        let w = usable_weight(usable, to).unwrap_or(0.0);
        if plan.total > 0.0 && w > 0.0 {
            (plan.residual * w / plan.total, plan.hops)
        } else {
            (0.0, 0)
        }
    }

    /// Relay gifts: spare capacity (above demand and reservation) to the neighbours' open
    /// requests, largest first. Appends the neighbours given to to `gave` (unsorted, maybe
    /// repeated) when asked.
    pub(super) fn relay_give(
        &mut self,
        now: Nanos,
        usable: &[(NodeId, f64)],
        mut gave: Option<&mut StackVec<NodeId, 16>>,
    ) {
        if !self.relaying(now) {
            return;
        }
        let reservation = self.reservation;
        let mut asks = StackVec::<(NodeId, f64), 16>::new();
        for ks in self.keys.values_mut() {
            let own = ks.own();
            let floor = ks.demand.estimate().max(reservation as f64);
            let spare = (own as f64 - floor).max(0.0).floor() as u64;
            if spare == 0 {
                continue;
            }
            asks.clear();
            asks.extend(
                ks.links
                    .iter()
                    .filter(|(p, lk)| usable_weight(usable, **p).is_some() && !lk.frozen())
                    .map(|(p, lk)| (*p, lk.relay_open()))
                    .filter(|a| a.1 >= 1.0),
            );
            asks.sort_by(|a, b| b.1.total_cmp(&a.1));
            ks.give_in_order(asks.iter().copied(), spare, |p| {
                if let Some(g) = gave.as_deref_mut() {
                    g.push(p);
                }
            });
        }
    }

    /// The law: gifts to worse-off neighbours (seed 000 eq. 3 / seed 003 Fig. 1 as gifts),
    /// then the relay's gifts from what is still spare.
    pub(super) fn give(&mut self, now: Nanos, usable: &[(NodeId, f64)]) {
        self.law_give(usable);
        self.relay_give(now, usable, None);
    }

    pub(super) fn law_give(&mut self, usable: &[(NodeId, f64)]) {
        let base = self.cfg.measure;
        let reservation = self.reservation;
        // γ within the stability bound of the neighbours given to now (seed 003 Thm 1): a
        // gain raised by `set_gamma` for fewer live neighbours must not give to more. The
        // slack keeps a configured γ at the bound exactly as it is.
        let bound = stability::max_gain(&base, usable.iter().map(|&(_, w)| w).sum());
        let base_gamma = if self.cfg.gamma > bound * (1.0 + 1e-9) {
            bound
        } else {
            self.cfg.gamma
        };
        let mut wants = StackVec::<(NodeId, f64), 16>::new();
        for (&key, ks) in &mut self.keys {
            let measure = self.cfg.measure_of(key);
            let gamma = self.cfg.gain_of(key, base_gamma);
            let own = ks.own();
            let p_own = measure.indicator(ks.demand.estimate(), own as f64);
            let budget = own.saturating_sub(reservation);
            wants.clear();
            wants.extend(ks.links.iter().filter_map(|(p, lk)| {
                let w = usable_weight(usable, *p)?;
                // Two quiet ends only return what they owe each other ("Idle keys").
                if lk.frozen() || (ks.quiet && lk.peer_idle) {
                    return None;
                }
                let (ind, sat) = lk.peer?;
                let ind = f64::from(ind);
                let g = law::gift(
                    &measure,
                    gamma,
                    w,
                    p_own,
                    Peer {
                        indicator: ind,
                        saturated: sat,
                    },
                );
                (g >= 1.0).then_some((*p, g))
            }));
            wants.sort_by(|a, b| b.1.total_cmp(&a.1));
            ks.give_in_order(wants.iter().copied(), budget, |_| {});
        }
    }
}
