//! Sliding window counter with `K` sub-windows (seed 002 §3.2; Sentinel's `LeapArray`).
//!
//! The window of length `period` is cut into `K` sub-windows of width `w = ⌈period/K⌉`,
//! aligned to time 0 of the caller's clock, each with a counter. A request in sub-window `b`
//! is admitted while the counters of sub-windows `b−K+1 ..= b` plus its cost stay within
//! `count`. State is `K` counters, whatever the traffic.

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::limit::Limit;

/// Sliding window counter with `K` sub-windows.
///
/// **Guarantee.** For every run of `K` consecutive sub-windows, the admitted costs add up to
/// at most `limit.count()` (`N`). Consequences, for the window length `T = period` and the
/// sub-window width `w = ⌈T/K⌉`:
/// - any interval of length at most `(K−1)·w` (`T·(K−1)/K` when `K` divides `T`) admits at
///   most `N`, since it meets at most `K` sub-windows;
/// - an interval of length `L` admits at most `N·⌈(⌈L/w⌉+1)/K⌉`; for `L = T` that is `2N`.
///
/// The `2N` of the fixed window (seed 002 §3.1) is therefore *not* removed, only spread: a
/// fixed window ([`K = 1`](SlidingWindow::new)) admits `2N` within 2 ns straddling a window
/// boundary, while here the two bursts of `N` must be more than `(K−1)·w` apart — seed 002
/// §3.2 ("Precision") gives the same example (200 in one minute for 100/min and K = 6).
/// A bound like `N·(1+1/K)` over every window of length `T` does **not** hold.
///
/// `limit.burst()` is not used. A request whose cost exceeds `count` is refused with
/// `retry_after: None`; otherwise `retry_after` is the wait until enough old sub-windows have
/// slid out, and `reset_after` the wait until every counted sub-window has.
///
/// **Limit changes.** A new `count` applies at once to the counters kept. A new period
/// changes the sub-window width; the counters kept cannot be re-cut, so all the permits of
/// the old window are counted as admitted in the new sub-window that holds the start of
/// the newest old one; runs of sub-windows after the change obey the guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    sub_windows: u32,
}

/// Per-key state of a [`SlidingWindow`]: `K` counters in a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Sub-window width the counters were recorded with.
    width: Nanos,
    /// Index (time / width) of the newest sub-window recorded.
    head: u64,
    /// `counts[i % K]` holds sub-window `i` for `head−K < i ≤ head`.
    counts: Box<[u64]>,
}

/// The window as seen at one instant: counters of sub-windows `head−K+1 ..= head`, read
/// from the state without copying it.
struct View<'a> {
    state: &'a SlidingWindowState,
    k: u64,
    width: Nanos,
    /// Whether the state was recorded with this width (and K): then its ring is read as is.
    same: bool,
    /// Newest recorded sub-window, under `width`.
    src_head: u64,
    /// If the width changed: the whole old ring, counted in sub-window `src_head`.
    moved: u64,
    /// The current sub-window (never before `src_head`).
    head: u64,
}

impl View<'_> {
    /// Permits recorded in sub-window `i` (under `width`).
    fn recorded(&self, i: u64) -> u64 {
        if i > self.src_head || i.saturating_add(self.k) <= self.src_head {
            0
        } else if self.same {
            self.state.counts[(i % self.k) as usize]
        } else if i == self.src_head {
            self.moved
        } else {
            0
        }
    }

    /// Permits in sub-window `head−K+1+slot`, `slot` in `0..K` (oldest first).
    fn slot(&self, slot: u64) -> u64 {
        self.head
            .checked_sub(self.k - 1 - slot)
            .map_or(0, |i| self.recorded(i))
    }

    fn sum(&self) -> u64 {
        (0..self.k).fold(0u64, |a, s| a.saturating_add(self.slot(s)))
    }
}

impl SlidingWindow {
    /// The largest number of sub-windows (each key's state is `K` counters).
    pub const MAX_SUB_WINDOWS: u32 = 1 << 16;

    /// `sub_windows` sub-windows per window, clamped to `1..=MAX_SUB_WINDOWS`. One
    /// sub-window is exactly an epoch-aligned fixed window.
    #[must_use]
    pub fn new(sub_windows: u32) -> Self {
        Self {
            sub_windows: sub_windows.clamp(1, Self::MAX_SUB_WINDOWS),
        }
    }

    /// The number of sub-windows `K`.
    #[must_use]
    pub fn sub_windows(&self) -> u32 {
        self.sub_windows
    }

    fn k(&self) -> u64 {
        u64::from(self.sub_windows)
    }

    /// The sub-window width for `limit`: `⌈period/K⌉`, at least 1 ns.
    #[must_use]
    pub fn width(&self, limit: &Limit) -> Nanos {
        limit.period().div_ceil(self.k()).max(1)
    }

    /// The counters that matter at `now`, re-cut to the limit's width if it changed.
    fn view<'a>(&self, state: &'a SlidingWindowState, limit: &Limit, now: Nanos) -> View<'a> {
        let k = self.k();
        let width = self.width(limit);
        let same = state.counts.len() as u64 == k && state.width == width;
        // The recorded sub-windows under `width`: the ring itself, or, if the width (period)
        // changed, everything the ring held, moved to the new sub-window that contains the
        // start of the newest recorded one.
        let (src_head, moved) = if same {
            (state.head, 0)
        } else {
            let kept = state.counts.iter().fold(0u64, |a, &c| a.saturating_add(c));
            (state.head.saturating_mul(state.width) / width, kept)
        };
        // Read as the latest sub-window seen if time went backwards.
        let head = (now / width).max(src_head);
        View {
            state,
            k,
            width,
            same,
            src_head,
            moved,
            head,
        }
    }

    /// The decision; `Some(sub-window)` if the request is admitted and consumes something.
    fn decide(
        &self,
        state: &SlidingWindowState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Option<u64>) {
        let n = limit.count();
        let view = self.view(state, limit, now);
        let k = view.k;
        let sum = view.sum();
        // Waits are measured from the caller's `now`, even if it is earlier than the latest
        // sub-window seen (which the view already reads it as).
        let start_of = |i: u64| i.saturating_mul(view.width).saturating_sub(now);
        // Time until every counted sub-window slid out: sub-window head−K+1+s leaves when
        // sub-window head+1+s begins; `extra` is counted in the current one.
        let reset = |extra: u64| match (0..k)
            .rev()
            .find(|&s| view.slot(s) > 0 || (extra > 0 && s == k - 1))
        {
            Some(s) => start_of(view.head.saturating_add(1 + s)),
            None => 0,
        };
        if cost == 0 {
            return (Decision::allow(n, n.saturating_sub(sum), reset(0)), None);
        }
        if cost > n {
            return (
                Decision::deny(n, n.saturating_sub(sum), reset(0), None),
                None,
            );
        }
        if let Some(after) = sum.checked_add(cost).filter(|&s| s <= n) {
            return (Decision::allow(n, n - after, reset(cost)), Some(view.head));
        }
        // Slide sub-windows out, oldest first, until the request fits.
        let mut left = sum;
        let mut retry = None;
        for s in 0..k {
            left -= view.slot(s);
            if left.saturating_add(cost) <= n {
                retry = Some(start_of(view.head.saturating_add(1 + s)));
                break;
            }
        }
        (
            Decision::deny(n, n.saturating_sub(sum), reset(0), retry),
            None,
        )
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;

    fn new_state(&self, limit: &Limit, _now: Nanos) -> Self::State {
        SlidingWindowState {
            width: self.width(limit),
            head: 0,
            counts: vec![0; self.sub_windows as usize].into_boxed_slice(),
        }
    }

    fn check(&self, state: &mut Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        let (decision, admitted) = self.decide(state, limit, now, cost);
        if let Some(head) = admitted {
            self.record(state, limit, now, head, cost);
        }
        decision
    }

    fn peek(&self, state: &Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        self.decide(state, limit, now, cost).0
    }

    fn is_idle(&self, state: &Self::State, limit: &Limit, now: Nanos) -> bool {
        self.view(state, limit, now).sum() == 0
    }

    /// Counts `min(n, count)` permits in the current sub-window (the latest seen if time
    /// went back), past the count if need be: the window holds at most `2·count`.
    fn charge(&self, state: &mut Self::State, limit: &Limit, now: Nanos, n: u64) {
        let count = limit.count();
        let view = self.view(state, limit, now);
        let (head, sum) = (view.head, view.sum());
        let add = n
            .min(count)
            .min(count.saturating_mul(2).saturating_sub(sum));
        if add > 0 {
            self.record(state, limit, now, head, add);
        }
    }
}

impl SlidingWindow {
    /// Counts `cost` in sub-window `head` (the view's current one), sliding the ring to it.
    fn record(
        &self,
        state: &mut SlidingWindowState,
        limit: &Limit,
        now: Nanos,
        head: u64,
        cost: u64,
    ) {
        let k = self.k();
        let width = self.width(limit);
        if state.counts.len() as u64 == k && state.width == width {
            // Slide the ring in place: clear the sub-windows between the old head and the new.
            let stale = (head - state.head).min(k);
            for i in 0..stale {
                state.counts[((head - i) % k) as usize] = 0;
            }
        } else {
            let view = self.view(state, limit, now);
            let counts: Vec<u64> = (0..k).map(|s| view.slot(s)).collect();
            let mut ring = vec![0; k as usize].into_boxed_slice();
            for (s, c) in counts.into_iter().enumerate() {
                // Slot of sub-window head−K+1+s, computed without underflow.
                ring[((head % k + 1 + s as u64) % k) as usize] = c;
            }
            state.counts = ring;
            state.width = width;
        }
        state.head = head;
        let slot = &mut state.counts[(head % k) as usize];
        *slot = slot.saturating_add(cost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slides_one_sub_window_at_a_time() {
        let a = SlidingWindow::new(4);
        let l = Limit::from_nanos(4, 100).unwrap(); // width 25
        let mut s = a.new_state(&l, 0);
        assert!(a.check(&mut s, &l, 10, 2).allowed); // sub-window 0
        assert!(a.check(&mut s, &l, 30, 2).allowed); // sub-window 1
        let d = a.check(&mut s, &l, 60, 1);
        // Sub-window 0 leaves when sub-window 4 begins (t = 100).
        assert_eq!(
            (d.allowed, d.retry_after, d.reset_after),
            (false, Some(40), 65)
        );
        assert!(!a.check(&mut s, &l, 99, 1).allowed);
        assert!(a.check(&mut s, &l, 100, 2).allowed);
        assert!(!a.check(&mut s, &l, 124, 1).allowed);
        assert!(a.check(&mut s, &l, 125, 2).allowed);
    }

    #[test]
    fn period_change_keeps_counted_permits() {
        let a = SlidingWindow::new(4);
        let l = Limit::from_nanos(4, 100).unwrap();
        let mut s = a.new_state(&l, 0);
        assert!(a.check(&mut s, &l, 10, 4).allowed);
        let l2 = Limit::from_nanos(4, 40).unwrap();
        // The 4 permits move to the new sub-window [0, 10) and stay for a new window (40).
        assert!(!a.check(&mut s, &l2, 20, 1).allowed);
        assert_eq!(a.peek(&s, &l2, 39, 1).retry_after, Some(1));
        assert!(a.check(&mut s, &l2, 40, 4).allowed);
        assert!(!a.check(&mut s, &l2, 79, 1).allowed);
        assert!(a.check(&mut s, &l2, 80, 4).allowed);
    }

    #[test]
    fn huge_times_do_not_overflow() {
        let a = SlidingWindow::new(3);
        let l = Limit::from_nanos(2, 10).unwrap();
        let mut s = a.new_state(&l, 0);
        assert!(a.check(&mut s, &l, u64::MAX - 1, 2).allowed);
        let d = a.check(&mut s, &l, u64::MAX, 1);
        assert!(!d.allowed);
        assert!(a.check(&mut s, &l, 5, 0).allowed);
        let d = a.check(&mut s, &l, 5, 3);
        assert_eq!(d.retry_after, None);
    }
}
