//! What a node admitted on its own while its central store did not answer, kept until the
//! store has counted it.

use std::collections::VecDeque;

use sluice_limits::{AlgorithmKind, Alignment, AnyAlgorithm, Limit, Nanos};

/// Permits a node admitted on its own (a fallback's share) that its central store has not
/// counted yet, by when they were admitted: what still weighs in the algorithm's decisions
/// ([`Debt::due`]) is charged to the store before the node's next central decision of the
/// key, so the store's count holds the node's local permits too.
///
/// Every estimate errs on the side of counting more: a permit is due while any admission
/// of its entry (admissions less than a sixteenth of the horizon apart share one) may still
/// weigh, and the store counts it as admitted when the charge arrives, not earlier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Debt {
    /// (first admission, last admission, permits), oldest first.
    entries: VecDeque<(Nanos, Nanos, u64)>,
}

impl Debt {
    /// Nothing owed.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `n` permits admitted locally at `now` for a key of `alg` under `limit`.
    pub fn record(&mut self, alg: &AnyAlgorithm, limit: &Limit, now: Nanos, n: u64) {
        if n == 0 {
            return;
        }
        self.forget(weighs_since(alg, limit, now));
        let span = horizon(alg, limit) / 16;
        match self.entries.back_mut() {
            Some((first, last, m)) if now.saturating_sub(*first) <= span => {
                *last = (*last).max(now);
                *m = m.saturating_add(n);
            }
            _ => self.entries.push_back((now, now, n)),
        }
    }

    /// The permits that still weigh in `alg`'s decisions at `now`: those of the current
    /// window (fixed window), of the last period (sliding window and log), of the time a
    /// full bucket takes to drain (buckets, GCRA), or of the warm-up's reach
    /// ([`sluice_limits::WarmUp::reach`]) and warm-up period. At most [`charge_cap`]: a share
    /// admits no more than that of what still weighs.
    #[must_use]
    pub fn due(&self, alg: &AnyAlgorithm, limit: &Limit, now: Nanos) -> u64 {
        let since = weighs_since(alg, limit, now);
        let due = self
            .entries
            .iter()
            .filter(|e| e.1 >= since)
            .fold(0u64, |a, e| a.saturating_add(e.2));
        due.min(charge_cap(alg.kind(), limit))
    }

    /// Whether nothing is owed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Moves everything out: a charge on its way to the store.
    pub fn take(&mut self) -> Self {
        std::mem::take(self)
    }

    /// Puts back a charge that did not go through (it may have been counted: counting it
    /// again only over-counts), before what was recorded since.
    pub fn restore(&mut self, mut older: Self) {
        older.entries.append(&mut self.entries);
        *self = older;
    }

    /// Forgets entries that no longer weigh.
    fn forget(&mut self, since: Nanos) {
        while self.entries.front().is_some_and(|e| e.1 < since) {
            self.entries.pop_front();
        }
    }
}

/// The most a charge counts for `kind` under `limit`: the count for the windows, the burst
/// for the others — what a share can have admitted of what still weighs. Below 2^53: a
/// center may keep counts as doubles (Redis' Lua numbers).
#[must_use]
pub fn charge_cap(kind: AlgorithmKind, limit: &Limit) -> u64 {
    const EXACT: u64 = (1 << 53) - 1;
    match kind {
        AlgorithmKind::FixedWindow
        | AlgorithmKind::FixedWindowFirst
        | AlgorithmKind::SlidingWindow
        | AlgorithmKind::SlidingLog => limit.count(),
        _ => limit.burst(),
    }
    .min(EXACT)
}

/// How long an admission weighs in `alg`'s decisions under `limit`, at most.
fn horizon(alg: &AnyAlgorithm, limit: &Limit) -> Nanos {
    let period = limit.period();
    // A full bucket drains (or refills) in burst × emission interval.
    let bucket = period.max(
        limit
            .burst()
            .saturating_mul(period.div_ceil(limit.count().max(1))),
    );
    match alg {
        AnyAlgorithm::FixedWindow(_) | AnyAlgorithm::SlidingLog(_) => period,
        AnyAlgorithm::SlidingWindow(s) => {
            // One sub-window more than it counts: the store may cut them in other units.
            let k = u64::from(s.sub_windows().max(1));
            period.div_ceil(k).max(1).saturating_mul(k + 1)
        }
        AnyAlgorithm::LeakyBucket(_) | AnyAlgorithm::TokenBucket(_) | AnyAlgorithm::Gcra(_) => {
            bucket
        }
        // An admission puts the next free instant at most its reach ahead (with the real
        // cold factor: a cold key is that much slower), and the stored permits it took come
        // back within the warm-up period once the key is free.
        AnyAlgorithm::WarmUp(w) => w.reach(limit).saturating_add(w.warmup()),
    }
}

/// The earliest admission that still weighs in `alg`'s decisions at `now`.
fn weighs_since(alg: &AnyAlgorithm, limit: &Limit, now: Nanos) -> Nanos {
    match alg {
        AnyAlgorithm::FixedWindow(f) if f.alignment() == Alignment::Epoch => {
            now - now % limit.period().max(1)
        }
        _ => now.saturating_add(1).saturating_sub(horizon(alg, limit)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_limits::{AlgorithmKind, Options};

    const S: Nanos = 1_000_000_000;

    #[test]
    fn what_weighs_is_the_window_the_period_or_a_bucket_drain() {
        let l = Limit::from_nanos(100, S).unwrap();
        let fw = AnyAlgorithm::new(AlgorithmKind::FixedWindow, Options::default());
        let mut d = Debt::new();
        d.record(&fw, &l, 10 * S + S / 2, 30);
        d.record(&fw, &l, 10 * S + S / 2 + 1, 5);
        assert_eq!(d.due(&fw, &l, 10 * S + 900_000_000), 35);
        // The next window owes nothing, and the entry is forgotten on the next record.
        assert_eq!(d.due(&fw, &l, 11 * S), 0);
        d.record(&fw, &l, 11 * S, 1);
        assert_eq!(d.entries.len(), 1);
        // Never more than the count.
        d.record(&fw, &l, 11 * S + 1, 500);
        assert_eq!(d.due(&fw, &l, 11 * S + 2), 100);

        let log = AnyAlgorithm::new(AlgorithmKind::SlidingLog, Options::default());
        let mut d = Debt::new();
        d.record(&log, &l, 10 * S, 7);
        d.record(&log, &l, 10 * S + S / 2, 3);
        assert_eq!(d.due(&log, &l, 11 * S - 1), 10);
        assert_eq!(d.due(&log, &l, 11 * S), 3, "the first left the last period");
        assert_eq!(d.due(&log, &l, 12 * S), 0);

        // A token bucket of 10/s with a burst of 50 takes 5 s to refill.
        let tb = AnyAlgorithm::new(AlgorithmKind::TokenBucket, Options::default());
        let l = Limit::from_nanos(10, S).unwrap().with_burst(50).unwrap();
        let mut d = Debt::new();
        d.record(&tb, &l, 10 * S, 50);
        assert_eq!(d.due(&tb, &l, 14 * S), 50);
        assert_eq!(d.due(&tb, &l, 15 * S), 0);
    }

    #[test]
    fn a_warm_up_debt_weighs_as_long_as_its_cold_factor_makes_it() {
        use sluice_limits::{Algorithm, WarmUp};
        // 1/s, a cold key 20 times slower: charges (other nodes' debts) pay forward up to
        // two bursts at the cold interval, 40 s, whatever the warm-up period.
        let l = Limit::from_nanos(1, S).unwrap();
        let warm = WarmUp::new(S, 20.0).unwrap();
        assert_eq!(warm.reach(&l), 2 * (20 * S + 1));
        let alg = AnyAlgorithm::WarmUp(warm);
        let t = 10 * S;
        let mut others = alg.new_state(&l, 0);
        for _ in 0..30 {
            alg.charge(&mut others, &l, t, 1);
        }
        // The node's permit admitted at `t`, had it been counted then.
        let mut with_ours = others.clone();
        alg.charge(&mut with_ours, &l, t, 1);
        let free_at = t + alg.peek(&others, &l, t, 1).retry_after.unwrap();
        assert!(alg.peek(&others, &l, free_at, 1).allowed);
        assert!(
            !alg.peek(&with_ours, &l, free_at, 1).allowed,
            "it still weighs"
        );
        // Far past four bucket drains and the warm-up period (the horizon of a cold factor
        // of 3), and it is still owed.
        assert!(free_at - t > 4 * S + warm.warmup());
        let mut d = Debt::new();
        d.record(&alg, &l, t, 1);
        assert_eq!(d.due(&alg, &l, free_at), 1);
        // Once reach and warm-up period are past, it no longer weighs.
        assert_eq!(d.due(&alg, &l, t + warm.reach(&l) + warm.warmup()), 0);
    }

    #[test]
    fn a_charge_that_did_not_go_through_comes_back_first() {
        let l = Limit::from_nanos(100, S).unwrap();
        let log = AnyAlgorithm::new(AlgorithmKind::SlidingLog, Options::default());
        let mut d = Debt::new();
        d.record(&log, &l, S, 4);
        let sent = d.take();
        assert!(d.is_empty());
        d.record(&log, &l, 2 * S - 10, 2);
        d.restore(sent);
        assert_eq!(d.due(&log, &l, 2 * S - 5), 6);
        assert_eq!(d.due(&log, &l, 2 * S), 2, "oldest first, forgotten first");
    }
}
