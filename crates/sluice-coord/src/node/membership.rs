//! Leaving gracefully: hand every share above the reservation to the neighbours first.

use super::*;

impl Node {
    /// Starts a graceful leave: the node gives its shares to its neighbours (under its
    /// lease), then stops. Its reservation and what keys without state hold here come back
    /// through the audit, once its incarnation is dead (it says so when it has left).
    pub fn leave(&mut self, now: Nanos) {
        if matches!(self.lifecycle, Lifecycle::Active | Lifecycle::Joining) {
            self.lifecycle = Lifecycle::Leaving;
            self.leave_started = Some(now);
            self.audit.leave_wave();
        }
    }

    /// Leaving: every key's share above the reservation to the first usable neighbour
    /// (they pass it on by the law to where it is needed).
    pub(super) fn hand_over(&mut self, usable: &[(NodeId, f64)]) {
        let Some(&(to, _)) = usable.first() else {
            return;
        };
        let reservation = self.reservation;
        for ks in self.keys.values_mut() {
            let spare = ks.own().saturating_sub(reservation);
            let lk = ks.links.entry(to).or_default();
            // A retirement under way ends within a round trip; hand over after it.
            if spare > 0 && !lk.frozen() {
                lk.given += spare;
                ks.given_sum = ks.given_sum.wrapping_add(spare);
            }
        }
    }

    pub(super) fn maybe_left(&mut self, now: Nanos) {
        let Some(start) = self.leave_started else {
            return;
        };
        let reservation = self.reservation;
        // Every share handed over and acknowledged: nothing of ours is in flight.
        let handed = self
            .keys
            .values()
            .all(|k| k.own() <= reservation && k.links.values().all(|l| l.acked >= l.given));
        if handed || now >= start + 4 * self.cfg.lease {
            self.lifecycle = Lifecycle::Left;
            // Tell everyone at once: they fold our links and stop waiting for us.
            let peers: Vec<NodeId> = self.links.keys().copied().collect();
            for p in peers {
                self.send(p, now);
            }
        }
    }
}
