//! The cap on keys with state (`Config::max_keys`, docs/PROTOCOL.md "Many keys"): memory per
//! node is bounded, and conservation never depends on it.
//!
//! Why refusing is safe: a key without state holds exactly its static split here, the same
//! as every node assumes for it, and no peer gives to a node that never advertised the key
//! (the law gives only against a peer's indicator), so nothing is in flight to it. What is
//! never refused is state that holds capacity: an entry whose counters are not zero (a gift
//! to us, or an acknowledgement of ours), created over the cap. A level request is refused
//! passage at the cap: it waits, and with it only the reclaiming of that key elsewhere.

use super::*;

impl Node {
    /// Whether `key`, which has no state yet, is refused state because the cap is held
    /// (counted).
    pub(super) fn refuse_new(&mut self, key: Key) -> bool {
        let full = self.cfg.max_keys.is_some_and(|m| self.keys.len() >= m);
        let refuse = full && !self.keys.contains_key(&key);
        if refuse {
            self.refused += 1;
        }
        refuse
    }

    /// Records that `key`, which may have no state yet, gets state whatever the cap, because
    /// what arrived for it holds capacity: counted when that takes the node over the cap.
    pub(super) fn admit_over_cap(&mut self, key: Key) {
        if self.under_pressure() && !self.keys.contains_key(&key) {
            self.over_cap += 1;
        }
    }

    /// Whether the cap is held: idle keys are then made quiet at once instead of after
    /// `Config::idle_after`, so that they level back, retire and are dropped early.
    pub(super) fn under_pressure(&self) -> bool {
        self.cfg.max_keys.is_some_and(|m| self.keys.len() >= m)
    }

    /// Keys with state here (coordinated keys).
    #[must_use]
    pub fn coordinated_keys(&self) -> usize {
        self.keys.len()
    }

    /// How many times a key was refused state because [`Config::max_keys`] keys had state
    /// (a key asking every cycle counts every cycle). Such a key stays on the static split.
    #[must_use]
    pub fn refused_keys(&self) -> u64 {
        self.refused
    }

    /// Keys given state beyond [`Config::max_keys`] because an entry for them held capacity
    /// (never refused: it would be lost). Every key held beyond the cap was counted here.
    #[must_use]
    pub fn keys_over_cap(&self) -> u64 {
        self.over_cap
    }

    /// Keys made quiet early (to be retired and dropped) because [`Config::max_keys`] keys
    /// had state.
    #[must_use]
    pub fn evicted_keys(&self) -> u64 {
        self.evicted
    }
}
