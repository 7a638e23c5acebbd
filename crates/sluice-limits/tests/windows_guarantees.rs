//! The guarantee each window / log / leaky / warm-up algorithm states in its doc comment,
//! checked on random traces (seed 002 §3.1–3.5).
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_limits::{
    Algorithm, DelayPolicy, FixedWindow, LeakyBucket, LeakyState, Limit, Nanos, Shaped, Shaper,
    SlidingLog, SlidingWindow, WarmUp,
};

/// A trace: non-decreasing times, small costs (0 included).
fn trace(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Vec<(Nanos, u64)>> {
    prop::collection::vec((0..=max_gap, 0..=max_cost), 1..160).prop_map(|v| {
        let mut t = 0;
        v.into_iter()
            .map(|(gap, cost)| {
                t += gap;
                (t, cost)
            })
            .collect()
    })
}

fn limit() -> impl Strategy<Value = Limit> {
    (1u64..8, 1u64..120, 1u64..10)
        .prop_map(|(n, t, b)| Limit::from_nanos(n, t).unwrap().with_burst(b).unwrap())
}

/// Limits over the whole range: small, large, and near `u64::MAX` counts, periods and bursts.
fn wide_limit() -> impl Strategy<Value = Limit> {
    let v = || prop_oneof![1u64..=16, 1u64..=1_000_000_000_000, 1u64..=u64::MAX];
    (v(), v(), v()).prop_map(|(n, t, b)| Limit::from_nanos(n, t).unwrap().with_burst(b).unwrap())
}

/// Runs `trace` through `alg`, switching from `l1` to `l2` at index `switch`; returns the
/// admitted `(time, cost)` at or after the switch, and the refused ones too.
#[allow(clippy::type_complexity)]
fn run<A: Algorithm>(
    alg: &A,
    trace: &[(Nanos, u64)],
    l1: &Limit,
    l2: &Limit,
    switch: usize,
) -> (Vec<(Nanos, u64)>, Vec<(Nanos, u64)>) {
    let mut s = alg.new_state(l1, 0);
    let (mut ok, mut no) = (Vec::new(), Vec::new());
    for (i, &(t, c)) in trace.iter().enumerate() {
        let l = if i < switch { l1 } else { l2 };
        let d = alg.check(&mut s, l, t, c);
        if i >= switch {
            if d.allowed {
                ok.push((t, c))
            } else {
                no.push((t, c))
            }
        }
    }
    (ok, no)
}

/// Largest total cost in any half-open interval `[s, s + len)`.
fn max_in_interval(admitted: &[(Nanos, u64)], len: Nanos) -> u64 {
    let mut best = 0;
    for (i, &(s, _)) in admitted.iter().enumerate() {
        let sum: u64 = admitted[i..]
            .iter()
            .take_while(|&&(t, _)| t < s + len)
            .map(|x| x.1)
            .sum();
        best = best.max(sum);
    }
    best
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// seed 002 §3.5: the sliding log admits at most N in every window of length T, also
    /// after a change of limit (for windows starting at the change), and refuses only what
    /// would break that (so it is exact, not merely safe).
    #[test]
    fn sliding_log_is_exact(tr in trace(30, 3), l1 in limit(), l2 in limit(), sw in 0usize..160) {
        let switch = sw.min(tr.len());
        let (ok, _) = run(&SlidingLog, &tr, &l1, &l2, switch);
        prop_assert!(max_in_interval(&ok, l2.period()) <= l2.count());
        // Maximality, on a run without a limit change.
        let (ok, no_all) = run(&SlidingLog, &tr, &l2, &l2, 0);
        for &(t, c) in &no_all {
            if c > l2.count() { continue; }
            let in_window: u64 = ok.iter()
                .filter(|&&(a, _)| a <= t && a + l2.period() > t).map(|x| x.1).sum();
            prop_assert!(in_window + c > l2.count(), "refused {c} at {t} with {in_window} logged");
        }
    }

    /// seed 002 §3.5 "Complexity": memory O(N) — after every admission the log holds at most
    /// N entries, whatever the trace.
    #[test]
    fn sliding_log_memory_is_at_most_n_entries(tr in trace(10, 3), l in limit()) {
        let mut s = SlidingLog.new_state(&l, 0);
        for &(t, c) in &tr {
            if SlidingLog.check(&mut s, &l, t, c).allowed {
                prop_assert!(s.len() as u64 <= l.count(), "{} entries for N = {}", s.len(), l.count());
            }
        }
    }

    /// seed 002 §3.5: D unit requests at once into an empty log: exactly min(N, D) pass.
    #[test]
    fn sliding_log_serves_min_of_n_and_demand(n in 1u64..50, d in 0u64..100, t in 0u64..1000) {
        let l = Limit::from_nanos(n, 1_000).unwrap();
        let mut s = SlidingLog.new_state(&l, 0);
        let passed = (0..d).filter(|_| SlidingLog.check(&mut s, &l, t, 1).allowed).count();
        prop_assert_eq!(passed as u64, n.min(d));
        prop_assert!(s.len() <= 1, "one instant, one entry");
    }

    /// seed 002 §3.1: the epoch-aligned fixed window admits at most N per aligned window, and
    /// never more than 2N in any interval of length T; with first-request alignment, 2N too.
    #[test]
    fn fixed_window_bounds(tr in trace(30, 3), l1 in limit(), l2 in limit(), sw in 0usize..160) {
        let switch = sw.min(tr.len());
        let (ok, _) = run(&FixedWindow::epoch(), &tr, &l1, &l2, switch);
        let (n, t) = (l2.count(), l2.period());
        // Aligned windows starting at or after the first request under l2.
        let from = tr.get(switch).map_or(u64::MAX, |x| x.0).div_ceil(t).saturating_mul(t);
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for &(a, c) in ok.iter().filter(|x| x.0 >= from) {
            *per_window.entry(a / t).or_default() += c;
        }
        prop_assert!(per_window.values().all(|&s| s <= n), "{per_window:?}");
        let (ok, _) = run(&FixedWindow::first_request(), &tr, &l2, &l2, 0);
        prop_assert!(max_in_interval(&ok, t) <= 2 * n);
    }

    /// seed 002 §3.2: the sliding window counter admits at most N in every K consecutive
    /// sub-windows, so at most N in any interval of length (K−1)·w, and at most
    /// N·⌈(⌈L/w⌉+1)/K⌉ in any interval of length L (2N for L = T); also after a limit
    /// change, for intervals starting at the change.
    #[test]
    fn sliding_window_bounds(
        tr in trace(20, 3), l1 in limit(), l2 in limit(), sw in 0usize..160,
        k in 1u32..8, len in 1u64..400,
    ) {
        let alg = SlidingWindow::new(k);
        let switch = sw.min(tr.len());
        let (ok, _) = run(&alg, &tr, &l1, &l2, switch);
        let (n, w, k) = (l2.count(), alg.width(&l2), u64::from(k));
        if k > 1 {
            prop_assert!(max_in_interval(&ok, (k - 1) * w) <= n);
        }
        let runs = (len.div_ceil(w) + 1).div_ceil(k);
        prop_assert!(max_in_interval(&ok, len) <= n * runs);
        prop_assert!(max_in_interval(&ok, l2.period()) <= 2 * n);
    }

    /// One sub-window is exactly the epoch-aligned fixed window, decision for decision.
    #[test]
    fn one_sub_window_is_the_fixed_window(tr in trace(30, 9), l in limit()) {
        let (fw, sw) = (FixedWindow::epoch(), SlidingWindow::new(1));
        let (mut a, mut b) = (fw.new_state(&l, 0), sw.new_state(&l, 0));
        for &(t, c) in &tr {
            prop_assert_eq!(fw.check(&mut a, &l, t, c), sw.check(&mut b, &l, t, c));
        }
    }

    /// seed 002 §3.3: the leaky bucket meter admits at most burst + (e−s)·N/T in [s, e],
    /// also after a limit change for intervals starting at the change.
    #[test]
    fn leaky_meter_bound(tr in trace(30, 3), l1 in limit(), l2 in limit(), sw in 0usize..160) {
        let switch = sw.min(tr.len());
        let (ok, _) = run(&LeakyBucket, &tr, &l1, &l2, switch);
        for (i, &(s, _)) in ok.iter().enumerate() {
            let mut sum = 0u128;
            for &(e, c) in &ok[i..] {
                sum += u128::from(c);
                let room = u128::from(l2.burst()) * u128::from(l2.period())
                    + u128::from(e - s) * u128::from(l2.count());
                prop_assert!(sum * u128::from(l2.period()) <= room);
            }
        }
    }

    /// A change of period (a reload changing the rate) keeps at most two bursts in the
    /// bucket, whatever the limits (up to `u64::MAX`) and the level taken over: right after
    /// it the bucket is empty within `⌈2·burst·T/N⌉`, the meter's bound holds from the
    /// change on, and nothing panics or overflows.
    #[test]
    fn leaky_period_change_keeps_at_most_two_bursts(
        l1 in wide_limit(), l2 in wide_limit(), gap in prop_oneof![Just(0u64), 0u64..=u64::MAX / 2],
        tr in trace(30, 3),
    ) {
        prop_assume!(l1.period() != l2.period());
        let a = LeakyBucket;
        let mut s = a.new_state(&l1, 0);
        // A full bucket, and a burst more charged on top (what a fallback's charge leaves).
        prop_assert!(a.check(&mut s, &l1, 0, l1.burst()).allowed);
        a.charge(&mut s, &l1, 0, l1.burst());
        let d = a.peek(&s, &l2, gap, 0);
        let two = (2 * u128::from(l2.burst()))
            .saturating_mul(u128::from(l2.period()))
            .div_ceil(u128::from(l2.count()));
        prop_assert!(u128::from(d.reset_after) <= two, "{} > {}", d.reset_after, two);
        // From the change on: at most burst + (e − s)·N/T in [s, e] (where the products
        // fit in 128 bits; a saturated room says nothing).
        let mut ok = Vec::new();
        for &(t, c) in &tr {
            let t = gap.saturating_add(t);
            if a.check(&mut s, &l2, t, c).allowed {
                ok.push((t, c));
            }
        }
        let (n, t) = (u128::from(l2.count()), u128::from(l2.period()));
        for (i, &(s, _)) in ok.iter().enumerate() {
            let mut sum = 0u128;
            for &(e, c) in &ok[i..] {
                sum += u128::from(c);
                let room = (u128::from(l2.burst()) * t).saturating_add(u128::from(e - s) * n);
                prop_assert!(sum.saturating_mul(t) <= room);
            }
        }
    }

    /// nginx `limit_req` semantics (seed 002 §3.3 as a shaper): with the default policy the
    /// release times are paced at the rate, with `delay=d` up to d permits of burst leave at
    /// once, and no request waits longer than the bucket takes to drain; after a limit
    /// change, the same for requests from the change on.
    #[test]
    fn leaky_shaper_paces_releases(
        tr in trace(30, 3), l1 in limit(), l2 in limit(), sw in 0usize..160, d in 0u64..4,
        policy in 0u8..3,
    ) {
        let policy = [DelayPolicy::Delay, DelayPolicy::DelayAfter(d), DelayPolicy::NoDelay][policy as usize];
        let sh = Shaper::new(policy);
        let switch = sw.min(tr.len());
        let mut s = LeakyState::default();
        let mut released: Vec<(Nanos, u64)> = Vec::new();
        for (i, &(t, c)) in tr.iter().enumerate() {
            let l = if i < switch { &l1 } else { &l2 };
            let wait = match sh.shape(&mut s, l, t, c) {
                Shaped::Now => 0,
                Shaped::Delay(w) => w,
                Shaped::Reject { .. } => continue,
            };
            // wait ≤ ⌈(burst − c)·T/N⌉
            prop_assert!(u128::from(wait) * u128::from(l.count())
                < u128::from(l.burst() - c) * u128::from(l.period()) + u128::from(l.count()));
            if i >= switch && c > 0 { released.push((t + wait, c)); }
        }
        let free = match policy {
            DelayPolicy::Delay => 0,
            DelayPolicy::DelayAfter(d) => d,
            DelayPolicy::NoDelay => return Ok(()),
        };
        let (n, t) = (u128::from(l2.count()), u128::from(l2.period()));
        for i in 0..released.len() {
            let mut cost = 0u128;
            for j in i + 1..released.len() {
                cost += u128::from(released[j - 1].1);
                // r_j − r_i > (C − d)·T/N − 1, in integers.
                let gap = i128::from(released[j].0) - i128::from(released[i].0);
                let lhs = (gap + 1) * i128::try_from(n).unwrap();
                let rhs = (i128::try_from(cost).unwrap() - i128::from(free)) * i128::try_from(t).unwrap();
                prop_assert!(lhs > rhs, "released {i}→{j}: gap {gap}, cost {cost}");
            }
        }
    }

    /// Guava `SmoothWarmingUp` (seed 002 §3.4): never faster than the stable rate, cold or
    /// warm: at most burst + (e−s)·N/T in [s, e].
    #[test]
    fn warm_up_never_exceeds_the_stable_rate(tr in trace(40, 3), l in limit(), w in 0u64..2_000) {
        let a = WarmUp::guava(w);
        let (ok, _) = run(&a, &tr, &l, &l, 0);
        for (i, &(s, _)) in ok.iter().enumerate() {
            let mut sum = 0u128;
            for &(e, c) in &ok[i..] {
                sum += u128::from(c);
                let room = u128::from(l.burst()) * u128::from(l.period())
                    + u128::from(e - s) * u128::from(l.count());
                prop_assert!(sum * u128::from(l.period()) <= room);
            }
        }
    }
}

/// seed 002 §3.1 "critical mutation": the fixed window admits 2N within 2 ns around a
/// boundary.
#[test]
fn fixed_window_shows_the_2n_boundary_burst() {
    let l = Limit::from_nanos(100, 60_000).unwrap();
    let fw = FixedWindow::epoch();
    let mut s = fw.new_state(&l, 0);
    let mut ok = Vec::new();
    for t in [59_999, 60_000] {
        for _ in 0..150 {
            if fw.check(&mut s, &l, t, 1).allowed {
                ok.push((t, 1));
            }
        }
    }
    assert_eq!(max_in_interval(&ok, 2), 200);
}

/// seed 002 §3.2 "Precision", its own numbers: 100/min, six 10 s sub-windows, 20 requests/s
/// from 0:05. The sliding window counter admits 200 in [0:05, 1:05) — the N·(1+1/K) one might
/// hope for does not hold — but never more than 100 in any 50 s ((K−1)·w), where the fixed
/// window admits 200 in 2 ns.
#[test]
fn sliding_window_spreads_but_keeps_the_2n() {
    let sec = 1_000_000_000u64;
    let l = Limit::new(100, std::time::Duration::from_secs(60)).unwrap();
    let alg = SlidingWindow::new(6);
    let mut s = alg.new_state(&l, 0);
    let ok: Vec<_> = (0..20 * 70)
        .map(|i| 5 * sec + i * sec / 20)
        .filter(|&t| alg.check(&mut s, &l, t, 1).allowed)
        .map(|t| (t, 1))
        .collect();
    let in_first_minute = ok
        .iter()
        .filter(|x| x.0 >= 5 * sec && x.0 < 65 * sec)
        .count();
    assert_eq!(in_first_minute, 200);
    assert_eq!(max_in_interval(&ok, 50 * sec), 100);
}
