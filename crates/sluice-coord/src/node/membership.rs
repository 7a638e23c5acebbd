//! Leaving gracefully: hand every share to the heir first (issue item 6).

use super::*;

impl Node {
    /// Leaving: give every share, reservation included, to the heir.
    pub(super) fn hand_over(&mut self, now: Nanos) {
        let Some(heir) = self.heir else { return };
        if self.link_state(heir, now) == Some(LinkState::Down) {
            return;
        }
        if self.links.get(&heir).is_none_or(|l| l.inc == 0) {
            return;
        }
        for ks in self.keys.values_mut() {
            let own = ks.own();
            let lk = ks.links.entry(heir).or_default();
            // A retirement under way ends within a round trip; hand over after it.
            if own > 0 && !lk.frozen() {
                lk.given += own;
                ks.given_sum = ks.given_sum.wrapping_add(own);
            }
        }
    }

    pub(super) fn maybe_left(&mut self, now: Nanos) {
        let Some(start) = self.leave_started else {
            return;
        };
        let Some(heir) = self.heir else {
            self.lifecycle = Lifecycle::Left;
            return;
        };
        let handed = self
            .keys
            .values()
            .all(|k| k.own() == 0 && k.links.get(&heir).is_none_or(|l| l.acked >= l.given));
        // Every reachable neighbour has answered a message sent after we started leaving,
        // so it knows and gives us nothing more; unreachable ones are settled by the heir.
        let told = self
            .links
            .iter()
            .filter(|(_, l)| l.neighbour)
            .all(|(p, l)| l.echo >= start || self.link_state(*p, now) == Some(LinkState::Down));
        if (handed && told) || now >= start + 4 * self.cfg.lease {
            self.lifecycle = Lifecycle::Left;
        }
    }
}
