//! Sliding log (seed 002 §3.5): exact, at the price of memory proportional to the count.
//!
//! The log keeps the admitted requests of the last `period` as `(time, cumulative cost)`
//! pairs in a ring buffer, oldest first; requests admitted at the same instant share one
//! entry. Finding where the window starts is a binary search (seed 002 §3.5 "Complexity"),
//! and the cumulative costs make the sum over the window a subtraction.

use std::collections::VecDeque;

use crate::algorithm::Algorithm;
use crate::any::measured_from_caller;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::limit::Limit;

/// Sliding log.
///
/// **Guarantee (exact).** For every `s`, the admitted costs with times in the half-open
/// interval `[s, s + period)` add up to at most `limit.count()`. A request at `t` is refused
/// only if admitting it would break that, i.e. when the costs admitted in `(t − period, t]`
/// plus its own exceed `count`; so a demand of `D` permits arriving at once into an empty log
/// is served exactly `min(count, D)` (for unit costs, in arrival order).
///
/// **Memory.** At most one entry per distinct admission instant in the last `period`, so at
/// most `count` entries (16 bytes each) after an admission, whatever the traffic.
///
/// `limit.burst()` is not used. A request whose cost exceeds `count` is refused with
/// `retry_after: None`; otherwise `retry_after` is exactly the wait until enough entries
/// leave the window, and `reset_after` the wait until the newest entry does.
///
/// **Limit changes.** The log keeps its timestamps, so a new count or period applies to the
/// requests already logged: the guarantee holds for every interval starting at or after the
/// change. (Entries that were older than the period at the last admission are gone, so a
/// longer period does not see them — they lie before the change.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlidingLog;

/// Per-key state of a [`SlidingLog`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLogState {
    /// `(time, cumulative cost)` oldest first. Cumulative costs wrap (`u64`); differences are
    /// exact because the whole log never holds more than `u64::MAX` permits (an admission
    /// keeps what is live within `count`, a charge within `2·count` saturated, and the
    /// entries that left the window are dropped before a new one is logged). So a hot key
    /// never needs a rebase: the totals only ever enter as wrapping differences (compared
    /// relative to `base`), and wrapping is routine, not an edge case — at 10⁹ permits per
    /// second (a per-byte cost at 1 GB/s) they wrap every 585 years, at a count near
    /// `u64::MAX` within one period (`decisions_do_not_depend_on_where_the_totals_are`).
    entries: VecDeque<(Nanos, u64)>,
    /// Cumulative cost before the first entry.
    base: u64,
    /// Latest admission time seen.
    last: Nanos,
}

impl SlidingLogState {
    /// Number of entries held (memory is 16 bytes per entry).
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds no entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Cumulative cost relative to `base`: monotone along the log.
    fn rel(&self, cum: u64) -> u64 {
        cum.wrapping_sub(self.base)
    }

    /// Index of the first entry inside `(now − period, now]`.
    fn first_live(&self, period: Nanos, now: Nanos) -> usize {
        match now.checked_sub(period) {
            Some(cutoff) => self.entries.partition_point(|&(t, _)| t <= cutoff),
            None => 0,
        }
    }

    /// Cost logged from entry `i` on.
    fn sum_from(&self, i: usize) -> u64 {
        let Some(&(_, end)) = self.entries.back() else {
            return 0;
        };
        let before = if i == 0 {
            self.base
        } else {
            self.entries[i - 1].1
        };
        end.wrapping_sub(before)
    }
}

impl SlidingLog {
    /// A sliding log.
    #[must_use]
    pub fn new() -> Self {
        Self
    }

    fn decide(
        &self,
        state: &SlidingLogState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, usize, Nanos) {
        let early = state.last.saturating_sub(now);
        let now = now.max(state.last);
        let (n, period) = (limit.count(), limit.period());
        let late = |d| measured_from_caller(d, early);
        let live = state.first_live(period, now);
        let used = state.sum_from(live);
        let newest_out = |t: Nanos| t.saturating_add(period).saturating_sub(now);
        let reset = if used == 0 {
            0
        } else {
            state.entries.back().map_or(0, |&(t, _)| newest_out(t))
        };
        let remaining = n.saturating_sub(used);
        if cost == 0 {
            return (late(Decision::allow(n, remaining, reset)), live, now);
        }
        if cost > n {
            return (late(Decision::deny(n, remaining, reset, None)), live, now);
        }
        if cost <= remaining {
            return (
                late(Decision::allow(n, remaining - cost, newest_out(now))),
                live,
                now,
            );
        }
        // Entries up to index j must leave: the first j whose suffix after it fits.
        let end = state.entries.back().map_or(0, |&(_, c)| state.rel(c));
        let target = end - (n - cost);
        let j = state
            .entries
            .partition_point(|&(_, c)| state.rel(c) < target);
        let retry = state.entries.get(j).map(|&(t, _)| newest_out(t));
        (late(Decision::deny(n, remaining, reset, retry)), live, now)
    }
}

/// Drops the `live` entries that left the window and logs `cost` at `now`.
fn log(state: &mut SlidingLogState, live: usize, now: Nanos, cost: u64) {
    if live > 0 {
        state.base = state.entries[live - 1].1;
        state.entries.drain(..live);
    }
    match state.entries.back_mut() {
        Some((t, c)) if *t == now => *c = c.wrapping_add(cost),
        back => {
            let cum = back.map_or(state.base, |&mut (_, c)| c).wrapping_add(cost);
            state.entries.push_back((now, cum));
        }
    }
    state.last = now;
    // Give memory back after a limit shrank or traffic calmed down.
    if state.entries.capacity() > 64 && state.entries.len() < state.entries.capacity() / 4 {
        state.entries.shrink_to(state.entries.len() * 2);
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    fn new_state(&self, _limit: &Limit, _now: Nanos) -> Self::State {
        SlidingLogState::default()
    }

    fn check(&self, state: &mut Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        let (decision, live, now) = self.decide(state, limit, now, cost);
        if decision.allowed && cost > 0 {
            log(state, live, now, cost);
        }
        decision
    }

    /// Logs `min(n, count)` permits at `now` (read as the latest time seen), past the count
    /// if need be: the window holds at most `2·count`.
    fn charge(&self, state: &mut Self::State, limit: &Limit, now: Nanos, n: u64) {
        let count = limit.count();
        let now = now.max(state.last);
        let live = state.first_live(limit.period(), now);
        let used = state.sum_from(live);
        let add = n
            .min(count)
            .min(count.saturating_mul(2).saturating_sub(used));
        if add > 0 {
            log(state, live, now, add);
        }
    }

    fn peek(&self, state: &Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        self.decide(state, limit, now, cost).0
    }

    fn is_idle(&self, state: &Self::State, limit: &Limit, now: Nanos) -> bool {
        let now = now.max(state.last);
        state.sum_from(state.first_live(limit.period(), now)) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_retry_after() {
        let a = SlidingLog;
        let l = Limit::from_nanos(3, 100).unwrap();
        let mut s = a.new_state(&l, 0);
        assert!(a.check(&mut s, &l, 10, 1).allowed);
        assert!(a.check(&mut s, &l, 20, 1).allowed);
        assert!(a.check(&mut s, &l, 30, 1).allowed);
        let d = a.check(&mut s, &l, 40, 2);
        // Needs the entries of 10 and 20 gone: at 120.
        assert_eq!(
            (d.allowed, d.retry_after, d.reset_after),
            (false, Some(80), 90)
        );
        assert!(!a.check(&mut s, &l, 119, 2).allowed);
        assert!(a.check(&mut s, &l, 120, 2).allowed);
        assert_eq!(s.len(), 2);
    }

    /// `s` with every cumulative cost moved by `k`, wrapping: what a rebase would change.
    fn shifted(s: &SlidingLogState, k: u64) -> SlidingLogState {
        SlidingLogState {
            entries: s
                .entries
                .iter()
                .map(|&(t, c)| (t, c.wrapping_add(k)))
                .collect(),
            base: s.base.wrapping_add(k),
            last: s.last,
        }
    }

    fn count() -> impl proptest::strategy::Strategy<Value = u64> {
        proptest::prop_oneof![1u64..10, (u64::MAX / 2)..=u64::MAX]
    }

    proptest::proptest! {
        /// Where the cumulative costs sit does not matter: a log whose totals start anywhere
        /// (just below the wrap included) decides exactly as the same log rebased to 0, and
        /// stays that log moved by the same amount, over random traces with time going back,
        /// a change of limit, charges, and costs that wrap the totals within a window.
        #[test]
        fn decisions_do_not_depend_on_where_the_totals_are(
            k in proptest::prop_oneof![proptest::num::u64::ANY, (u64::MAX - 64)..=u64::MAX],
            (n1, n2) in (count(), count()),
            (t1, t2) in (1u64..100, 1u64..100),
            steps in proptest::collection::vec(
                (
                    -20i64..40,
                    proptest::prop_oneof![4 => 0u64..6, 1 => (u64::MAX / 4)..=(u64::MAX / 2)],
                    proptest::bool::weighted(0.05),
                    proptest::bool::weighted(0.15),
                ),
                1..150,
            ),
        ) {
            let a = SlidingLog;
            let (l1, l2) = (Limit::from_nanos(n1, t1).unwrap(), Limit::from_nanos(n2, t2).unwrap());
            let mut l = l1;
            let mut at_zero = SlidingLogState::default();
            let mut moved = shifted(&at_zero, k);
            let mut now = 1_000u64;
            for (dt, cost, switch, charge) in steps {
                now = now.saturating_add_signed(dt);
                if switch {
                    l = l2;
                }
                if charge {
                    a.charge(&mut at_zero, &l, now, cost);
                    a.charge(&mut moved, &l, now, cost);
                } else {
                    proptest::prop_assert_eq!(
                        a.check(&mut at_zero, &l, now, cost),
                        a.check(&mut moved, &l, now, cost)
                    );
                }
                proptest::prop_assert_eq!(a.peek(&at_zero, &l, now, 1), a.peek(&moved, &l, now, 1));
                proptest::prop_assert_eq!(&shifted(&at_zero, k), &moved);
            }
        }
    }

    #[test]
    fn same_instant_shares_an_entry_and_wraps_safely() {
        let a = SlidingLog;
        let l = Limit::from_nanos(u64::MAX, 10).unwrap();
        let mut s = a.new_state(&l, 0);
        for t in 0..5 {
            assert!(a.check(&mut s, &l, t * 10, u64::MAX / 2).allowed);
            assert!(a.check(&mut s, &l, t * 10, u64::MAX / 2).allowed);
            assert!(!a.check(&mut s, &l, t * 10, 2).allowed);
            assert_eq!(s.len(), 1);
        }
    }
}
