//! Fixed window counter (seed 002 §3.1, "simple window").
//!
//! One counter per window of length `period`; a request is admitted while the counter plus
//! its cost stays within `count`. Cheap (two words of state) but, as seed 002 §3.1
//! ("critical mutation") shows, it admits up to `2·count` in an interval much shorter than a
//! window when a burst at the end of one window meets a burst at the start of the next.

use crate::algorithm::Algorithm;
use crate::any::measured_from_caller;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::limit::Limit;

/// Where windows start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Alignment {
    /// Windows are `[k·period, (k+1)·period)` of the caller's clock, the same for every key
    /// (envoyproxy/ratelimit aligns its windows to the unix epoch the same way).
    #[default]
    Epoch,
    /// A window opens at the first request admitted after the previous window ended and
    /// lasts `period` (the `SimpleWindowThrottler` of seed 002 §3.1).
    FirstRequest,
}

/// Fixed window counter.
///
/// **Guarantee.** Within every window (as defined by [`Alignment`]) the costs of the
/// admitted requests add up to at most `limit.count()`. Nothing more: an interval of any
/// length straddling a window boundary may hold `2·count` (seed 002 §3.1).
///
/// `limit.burst()` is not used. A request whose cost exceeds `count` is refused with
/// `retry_after: None`. `reset_after` is the time to the end of the current window;
/// `retry_after` of a refusal is the time to the end of the current window.
///
/// **Limit changes.** The count admitted so far carries over to the window that contains
/// the current time under the new period if the old window began inside it (with
/// [`Alignment::Epoch`]) or has not ended under the new period (with
/// [`Alignment::FirstRequest`]); a smaller count then refuses until the window ends.
/// Windows that start after the change obey the new limit exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedWindow {
    alignment: Alignment,
}

/// Per-key state of a [`FixedWindow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedWindowState {
    /// Time of the first admission counted in `used` (meaningless while `used == 0`).
    start: Nanos,
    /// Latest admission time seen: earlier times are read as this one.
    last: Nanos,
    /// Permits admitted in the window that began at `start`.
    used: u64,
}

impl FixedWindowState {
    /// Permits counted in the window the state last admitted into.
    #[must_use]
    pub fn used(&self) -> u64 {
        self.used
    }
}

impl FixedWindow {
    /// A fixed window counter with the given alignment.
    #[must_use]
    pub fn new(alignment: Alignment) -> Self {
        Self { alignment }
    }

    /// Windows aligned to time 0 of the caller's clock.
    #[must_use]
    pub fn epoch() -> Self {
        Self::new(Alignment::Epoch)
    }

    /// Windows that open at the first admitted request.
    #[must_use]
    pub fn first_request() -> Self {
        Self::new(Alignment::FirstRequest)
    }

    /// The alignment of the windows.
    #[must_use]
    pub fn alignment(&self) -> Alignment {
        self.alignment
    }

    /// `(window end, permits already used in it)` for a request at `now` (already clamped).
    fn window(&self, state: &FixedWindowState, limit: &Limit, now: Nanos) -> (Nanos, u64) {
        let period = limit.period();
        match self.alignment {
            Alignment::Epoch => {
                let start = now - now % period;
                let end = start.saturating_add(period);
                if state.used > 0 && state.start >= start {
                    (end, state.used)
                } else {
                    (end, 0)
                }
            }
            Alignment::FirstRequest => {
                let end = state.start.saturating_add(period);
                if state.used > 0 && now < end {
                    (end, state.used)
                } else {
                    (now.saturating_add(period), 0)
                }
            }
        }
    }

    /// The decision, and the new state if the request is admitted and consumes something.
    fn decide(
        &self,
        state: &FixedWindowState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Option<FixedWindowState>) {
        let (d, next) = self.decide_at(state, limit, now.max(state.last), cost);
        (
            measured_from_caller(d, state.last.saturating_sub(now)),
            next,
        )
    }

    /// As `decide`, at a time no earlier than the latest seen.
    fn decide_at(
        &self,
        state: &FixedWindowState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Option<FixedWindowState>) {
        let n = limit.count();
        let (end, used) = self.window(state, limit, now);
        let fresh = used == 0;
        let reset = if fresh { 0 } else { end - now };
        if cost == 0 {
            return (Decision::allow(n, n.saturating_sub(used), reset), None);
        }
        if cost > n {
            return (Decision::deny(n, n.saturating_sub(used), reset, None), None);
        }
        match used.checked_add(cost).filter(|&u| u <= n) {
            Some(after) => {
                let start = if fresh { now } else { state.start };
                let next = FixedWindowState {
                    start,
                    last: now,
                    used: after,
                };
                (Decision::allow(n, n - after, end - now), Some(next))
            }
            None => (
                Decision::deny(n, n.saturating_sub(used), reset, Some(end - now)),
                None,
            ),
        }
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    fn new_state(&self, _limit: &Limit, _now: Nanos) -> Self::State {
        FixedWindowState::default()
    }

    fn check(&self, state: &mut Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        let (decision, next) = self.decide(state, limit, now, cost);
        if let Some(next) = next {
            *state = next;
        }
        decision
    }

    fn peek(&self, state: &Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        self.decide(state, limit, now, cost).0
    }

    fn is_idle(&self, state: &Self::State, limit: &Limit, now: Nanos) -> bool {
        self.window(state, limit, now.max(state.last)).1 == 0
    }

    /// Counts `min(n, count)` permits in the window of `now` (read as the latest time
    /// seen), past the count if need be: the window holds at most `2·count`.
    fn charge(&self, state: &mut Self::State, limit: &Limit, now: Nanos, n: u64) {
        let count = limit.count();
        let n = n.min(count);
        if n == 0 {
            return;
        }
        let now = now.max(state.last);
        let (_, used) = self.window(state, limit, now);
        *state = FixedWindowState {
            start: if used == 0 { now } else { state.start },
            last: now,
            used: used.saturating_add(n).min(count.saturating_mul(2)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(n: u64, t: Nanos) -> Limit {
        Limit::from_nanos(n, t).unwrap()
    }

    #[test]
    fn epoch_windows_reset_on_boundaries() {
        let a = FixedWindow::epoch();
        let l = lim(3, 100);
        let mut s = a.new_state(&l, 0);
        assert!(a.check(&mut s, &l, 95, 3).allowed);
        let d = a.check(&mut s, &l, 99, 1);
        assert_eq!((d.allowed, d.retry_after), (false, Some(1)));
        // seed 002 §3.1: a new window admits a full count right after the boundary.
        assert!(a.check(&mut s, &l, 100, 3).allowed);
    }

    #[test]
    fn first_request_windows_open_at_first_admission() {
        let a = FixedWindow::first_request();
        let l = lim(2, 100);
        let mut s = a.new_state(&l, 0);
        assert!(a.check(&mut s, &l, 50, 2).allowed);
        let d = a.check(&mut s, &l, 120, 1);
        assert_eq!(
            (d.allowed, d.retry_after, d.reset_after),
            (false, Some(30), 30)
        );
        assert!(a.check(&mut s, &l, 150, 1).allowed);
        assert_eq!(a.peek(&s, &l, 150, 0).reset_after, 100);
    }

    #[test]
    fn edge_cases() {
        let a = FixedWindow::epoch();
        let l = lim(5, 10);
        let mut s = a.new_state(&l, 0);
        let d = a.check(&mut s, &l, 1, 6);
        assert_eq!((d.allowed, d.retry_after), (false, None));
        assert!(a.check(&mut s, &l, 3, 0).allowed);
        assert_eq!(s, FixedWindowState::default());
        assert!(a.check(&mut s, &l, u64::MAX, 5).allowed);
        // Earlier time: read as the latest seen, so still the full window.
        assert!(!a.check(&mut s, &l, 0, 1).allowed);
        assert!(a.is_idle(&a.new_state(&l, 0), &l, 7));
    }
}
