//! When a node sweeps its per-key records (batches, leases, fallback shares) of idle keys.

use sluice_limits::Nanos;

/// How often, on the node's clock, per-key records are swept: often enough that idle keys
/// do not pile up, rarely enough that a sweep's walk over every key costs nothing per
/// request.
pub const PRUNE_EVERY: Nanos = 10_000_000_000;

/// At most one sweep per [`PRUNE_EVERY`] of the node's clock.
#[derive(Debug, Default)]
pub struct Sweep {
    next: Nanos,
}

impl Sweep {
    /// Whether a sweep is due at `now`; if so, the next one is [`PRUNE_EVERY`] later.
    pub fn due(&mut self, now: Nanos) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now.saturating_add(PRUNE_EVERY);
        true
    }
}
