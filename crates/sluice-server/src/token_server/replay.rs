//! Replay protection for sealed messages (pure; time is an argument).
//!
//! Every sealed message carries its sender's sequence number: the sender's wall clock in ns
//! when it sent it, made strictly increasing ([`Sequence`]), so a restarted sender goes on
//! above its old numbers without remembering them. A receiver accepts a number once: it
//! refuses one it has seen, one more than `reorder` below the highest it has seen from that
//! sender (it no longer remembers those), and one further than `max_skew` from its own wall
//! clock (older than anything it can remember after its own restart). So within a
//! receiver's life a captured message is accepted at most once — its original — and after a
//! restart of the receiver at most once more, within `max_skew` of its capture.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_limits::Nanos;

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// This sender's number was seen already.
    #[error("sequence number already seen")]
    Replayed,
    /// Too far below the sender's newest number, or from the receiver's wall clock.
    #[error("sequence number outside the window")]
    Stale,
}

/// Per sender, the numbers seen lately.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    reorder: Nanos,
    max_skew: Nanos,
    senders: HashMap<u32, Seen>,
}

#[derive(Debug, Clone, Default)]
struct Seen {
    highest: u64,
    recent: BTreeSet<u64>,
}

impl Default for ReplayWindow {
    /// 1 s of reordering (a sender's concurrent requests), 10 s of clock offset.
    fn default() -> Self {
        Self::new(1_000_000_000, 10_000_000_000)
    }
}

impl ReplayWindow {
    /// Numbers up to `reorder` below a sender's newest are accepted once; none further than
    /// `max_skew` from the receiver's wall clock.
    #[must_use]
    pub fn new(reorder: Nanos, max_skew: Nanos) -> Self {
        Self {
            reorder,
            max_skew,
            senders: HashMap::new(),
        }
    }

    /// Accepts `seq` from `from` at the receiver's wall time `now`, or says why not.
    ///
    /// # Errors
    /// [`ReplayError`].
    pub fn admit(&mut self, from: u32, seq: u64, now: Nanos) -> Result<(), ReplayError> {
        if seq.abs_diff(now) > self.max_skew {
            return Err(ReplayError::Stale);
        }
        let seen = self.senders.entry(from).or_default();
        if seq.saturating_add(self.reorder) < seen.highest {
            return Err(ReplayError::Stale);
        }
        if !seen.recent.insert(seq) {
            return Err(ReplayError::Replayed);
        }
        if seq > seen.highest {
            seen.highest = seq;
            let floor = seq.saturating_sub(self.reorder);
            // Forget what the floor refuses anyway: memory stays one window per sender.
            seen.recent = seen.recent.split_off(&floor);
        }
        Ok(())
    }
}

/// A sender's sequence numbers: its wall clock in ns, strictly increasing.
#[derive(Debug, Default)]
pub struct Sequence(AtomicU64);

impl Sequence {
    /// Starts at 0 (the first number is the clock's).
    #[must_use]
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The next number at wall time `now`.
    pub fn next(&self, now: Nanos) -> u64 {
        let mut last = self.0.load(Ordering::Relaxed);
        loop {
            let n = now.max(last.saturating_add(1));
            match self
                .0
                .compare_exchange_weak(last, n, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return n,
                Err(l) => last = l,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn a_message_is_accepted_once_and_a_resent_one_is_refused() {
        let mut w = ReplayWindow::default();
        let now = 100 * S;
        assert_eq!(w.admit(1, now, now), Ok(()));
        assert_eq!(w.admit(1, now, now + 1), Err(ReplayError::Replayed));
        // Another sender's number is its own.
        assert_eq!(w.admit(2, now, now), Ok(()));
        // Reordered within the window: accepted once.
        assert_eq!(w.admit(1, now - S / 2, now), Ok(()));
        assert_eq!(w.admit(1, now - S / 2, now), Err(ReplayError::Replayed));
        // Below the window, or far from the clock: refused.
        assert_eq!(w.admit(1, now - 2 * S, now), Err(ReplayError::Stale));
        assert_eq!(w.admit(3, now - 11 * S, now), Err(ReplayError::Stale));
    }

    #[test]
    fn memory_stays_one_window_per_sender() {
        let mut w = ReplayWindow::default();
        let now = 100 * S;
        for i in 0..10_000u64 {
            w.admit(1, now + i * 1_000_000, now).unwrap();
        }
        let seen = &w.senders[&1];
        assert!(seen.recent.len() <= 1001, "{}", seen.recent.len());
    }

    #[test]
    fn sequence_numbers_increase_even_when_the_clock_does_not() {
        let s = Sequence::default();
        assert_eq!(s.next(10), 10);
        assert_eq!(s.next(10), 11);
        assert_eq!(s.next(5), 12);
        assert_eq!(s.next(100), 100);
    }
}
