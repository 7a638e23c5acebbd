//! Property tests of the token bucket and GCRA guarantees (seed 002 §3.4), on random traces.
//!
//! Rounding convention: all arithmetic is on integers. "At most `B + rate·L`" is checked as
//! `admitted ≤ B + ⌊L·count / period⌋` (the rate bound, rounded down: permits are whole) and,
//! for GCRA, the tighter `admitted ≤ B + ⌊L / T⌋` with `T = ⌈period / count⌉`. Intervals are
//! closed, `[t1, t2]` with `L = t2 − t1`; every pair of request times of a trace is checked,
//! which covers every interval (the count in an interval only changes at request times).
//! "Demand under the rate" means: every request of `n` permits is followed by a gap of at
//! least `n·T` ns before the next one.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use proptest::prelude::*;
use sluice_limits::{
    Algorithm, AtomicGcra, Decision, Gcra, GcraLimit, KeyedGcra, Limit, Nanos, TokenBucket,
};

fn limit(count: u64, period: u64, burst: u64) -> Limit {
    Limit::from_nanos(count, period)
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

fn arb_limit() -> impl Strategy<Value = Limit> {
    (1u64..=20, 1u64..=400, 1u64..=20).prop_map(|(c, p, b)| limit(c, p, b))
}

/// (gap before the request, cost) pairs; times are the running sums of the gaps.
fn arb_trace(max_gap: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (0..=max_gap, prop_oneof![4 => Just(1u64), 1 => 0u64..=25]),
        1..150,
    )
}

fn times(trace: &[(u64, u64)]) -> Vec<Nanos> {
    trace
        .iter()
        .scan(0u64, |t, &(gap, _)| {
            *t += gap;
            Some(*t)
        })
        .collect()
}

/// Largest excess of admitted permits over `bound(L)` over all closed intervals whose ends
/// are request times; `events` are (time, admitted cost), in any order.
fn check_bound(events: &[(Nanos, u64)], bound: impl Fn(Nanos) -> u64) -> Result<(), String> {
    let mut by_time: Vec<(Nanos, u64)> = Vec::new();
    let mut sorted = events.to_vec();
    sorted.sort_unstable();
    for (t, c) in sorted {
        match by_time.last_mut() {
            Some((lt, lc)) if *lt == t => *lc += c,
            _ => by_time.push((t, c)),
        }
    }
    for a in 0..by_time.len() {
        let mut sum = 0;
        for b in a..by_time.len() {
            sum += by_time[b].1;
            let len = by_time[b].0 - by_time[a].0;
            if sum > bound(len) {
                return Err(format!(
                    "{sum} admitted in [{}, {}], bound {}",
                    by_time[a].0,
                    by_time[b].0,
                    bound(len)
                ));
            }
        }
    }
    Ok(())
}

fn rate_bound(l: Limit) -> impl Fn(Nanos) -> u64 {
    move |len| {
        let r = u128::from(len) * u128::from(l.count()) / u128::from(l.period());
        l.burst() + u64::try_from(r).unwrap()
    }
}

fn gcra_bound(l: Limit) -> impl Fn(Nanos) -> u64 {
    move |len| l.burst() + len / l.emission_interval()
}

/// Runs `alg` over the trace, checking on every call that `peek` answers as `check` and
/// changes nothing, and that a denial leaves the state unchanged. Returns the decisions.
fn run<A>(
    alg: &A,
    limits: &[Limit],
    at: &[Nanos],
    costs: &[u64],
) -> Result<Vec<Decision>, TestCaseError>
where
    A: Algorithm,
    A::State: Clone + PartialEq + std::fmt::Debug,
{
    let mut state = alg.new_state(&limits[0], at[0]);
    let mut out = Vec::with_capacity(at.len());
    for i in 0..at.len() {
        let before = state.clone();
        let peeked = alg.peek(&state, &limits[i], at[i], costs[i]);
        prop_assert_eq!(&state, &before, "peek changed the state");
        let d = alg.check(&mut state, &limits[i], at[i], costs[i]);
        prop_assert_eq!(peeked, d, "peek and check disagree at call {}", i);
        if !d.allowed {
            prop_assert_eq!(&state, &before, "a denial changed the state at call {}", i);
        }
        if costs[i] > limits[i].burst() {
            prop_assert!(!d.allowed && d.retry_after.is_none());
        }
        out.push(d);
    }
    Ok(out)
}

fn admitted(at: &[Nanos], costs: &[u64], ds: &[Decision]) -> Vec<(Nanos, u64)> {
    (0..at.len())
        .filter(|&i| ds[i].allowed)
        .map(|i| (at[i], costs[i]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Seed 002 §3.4: a token bucket never admits more than burst + rate·L in any interval
    /// of length L; GCRA no more than burst + ⌊L/T⌋.
    #[test]
    fn bound_holds_on_every_interval(l in arb_limit(), trace in arb_trace(60)) {
        let at = times(&trace);
        let costs: Vec<u64> = trace.iter().map(|&(_, c)| c).collect();
        let limits = vec![l; at.len()];
        let tb = run(&TokenBucket, &limits, &at, &costs)?;
        check_bound(&admitted(&at, &costs, &tb), rate_bound(l)).map_err(TestCaseError::fail)?;
        let g = run(&Gcra, &limits, &at, &costs)?;
        check_bound(&admitted(&at, &costs, &g), gcra_bound(l)).map_err(TestCaseError::fail)?;
        check_bound(&admitted(&at, &costs, &g), rate_bound(l)).map_err(TestCaseError::fail)?;
    }

    /// The bound is tight enough to matter: a saturating trace gets exactly burst at once.
    /// And demand under the rate (each request of n followed by a gap ≥ n·T) is never denied.
    #[test]
    fn demand_under_the_rate_is_always_admitted(
        l in arb_limit(),
        reqs in prop::collection::vec((1u64..=20, 0u64..=50), 1..100),
        start in 0u64..1_000,
    ) {
        let t = l.emission_interval();
        let mut at = Vec::new();
        let mut costs = Vec::new();
        let mut now = start;
        for (cost, extra) in reqs {
            let cost = cost.min(l.burst());
            at.push(now);
            costs.push(cost);
            now += cost * t + extra;
        }
        let limits = vec![l; at.len()];
        for ds in [run(&TokenBucket, &limits, &at, &costs)?, run(&Gcra, &limits, &at, &costs)?] {
            prop_assert!(ds.iter().all(|d| d.allowed));
        }
    }

    /// After a change of limit at t0, the bound of the new limit holds for every interval
    /// starting at or after t0 (the calls before t0 used the old limit).
    #[test]
    fn bound_holds_after_a_limit_change(
        l1 in arb_limit(),
        l2 in arb_limit(),
        trace in arb_trace(60),
        split in 0usize..150,
        pause in 0u64..100,
    ) {
        let mut at = times(&trace);
        let costs: Vec<u64> = trace.iter().map(|&(_, c)| c).collect();
        let k = split.min(at.len());
        // The change happens `pause` after the last old call, before the first new call.
        for t in &mut at[k..] {
            *t += pause;
        }
        let limits: Vec<Limit> = (0..at.len()).map(|i| if i < k { l1 } else { l2 }).collect();
        // Intervals starting at or after the change contain only calls made under l2.
        let after = |ds: &[Decision]| -> Vec<(Nanos, u64)> {
            (k..at.len()).filter(|&i| ds[i].allowed).map(|i| (at[i], costs[i])).collect()
        };
        let tb = run(&TokenBucket, &limits, &at, &costs)?;
        check_bound(&after(&tb), rate_bound(l2)).map_err(TestCaseError::fail)?;
        let g = run(&Gcra, &limits, &at, &costs)?;
        check_bound(&after(&g), gcra_bound(l2)).map_err(TestCaseError::fail)?;
    }

    /// Time going backwards never panics. GCRA decides at the time given, and its bound holds
    /// on the times given, whatever their order; the token bucket treats an earlier time as
    /// its last update, and its bound holds on those effective times.
    #[test]
    fn time_going_backwards(l in arb_limit(), trace in prop::collection::vec((0u64..2_000, 1u64..=5), 1..150)) {
        let at: Vec<Nanos> = trace.iter().map(|&(t, _)| t).collect();
        let costs: Vec<u64> = trace.iter().map(|&(_, c)| c).collect();
        let limits = vec![l; at.len()];
        let g = run(&Gcra, &limits, &at, &costs)?;
        check_bound(&admitted(&at, &costs, &g), gcra_bound(l)).map_err(TestCaseError::fail)?;

        let mut s = TokenBucket.new_state(&l, 0);
        let mut events = Vec::new();
        for i in 0..at.len() {
            let effective = at[i].max(s.last());
            if TokenBucket.check(&mut s, &l, at[i], costs[i]).allowed {
                events.push((effective, costs[i]));
            }
        }
        check_bound(&events, rate_bound(l)).map_err(TestCaseError::fail)?;
    }

    /// GCRA is the token bucket kept as one number: under a fixed limit with an exact
    /// emission interval they decide identically, on every call.
    #[test]
    fn token_bucket_and_gcra_agree(
        (count, t, burst) in (1u64..=20, 1u64..=30, 1u64..=20),
        trace in arb_trace(60),
    ) {
        let l = limit(count, count * t, burst);
        let at = times(&trace);
        let costs: Vec<u64> = trace.iter().map(|&(_, c)| c).collect();
        let limits = vec![l; at.len()];
        let tb = run(&TokenBucket, &limits, &at, &costs)?;
        let g = run(&Gcra, &limits, &at, &costs)?;
        for i in 0..at.len() {
            prop_assert_eq!(tb[i].allowed, g[i].allowed, "call {}", i);
            prop_assert_eq!(tb[i].remaining, g[i].remaining, "call {}", i);
            prop_assert_eq!(tb[i].retry_after, g[i].retry_after, "call {}", i);
            prop_assert_eq!(tb[i].reset_after, g[i].reset_after, "call {}", i);
        }
    }

    /// The atomic single-key form and the keyed store decide exactly as `Gcra`, call by call,
    /// on several keys with limits changing from call to call (the state survives changes).
    #[test]
    fn atomic_and_keyed_decide_as_gcra(
        limits in prop::collection::vec(arb_limit(), 1..4),
        calls in prop::collection::vec((0u64..40, 0usize..6, 0usize..4, prop_oneof![4 => Just(1u64), 1 => 0u64..=25]), 1..200),
    ) {
        let keyed: KeyedGcra<usize> = KeyedGcra::new();
        let mut plain: HashMap<usize, sluice_limits::GcraState> = HashMap::new();
        let atomic: Vec<AtomicGcra> = (0..6).map(|_| AtomicGcra::new()).collect();
        let mut now = 0;
        for (gap, key, li, cost) in calls {
            now += gap;
            let l = limits[li % limits.len()];
            let state = plain.entry(key).or_insert_with(|| Gcra.new_state(&l, now));
            prop_assert_eq!(keyed.peek(&key, &l, now, cost), Gcra.peek(state, &l, now, cost));
            let expected = Gcra.check(state, &l, now, cost);
            prop_assert_eq!(atomic[key].check(&l, now, cost), expected);
            // The keyed store gets the limit prepared once, the atomic one per call.
            prop_assert_eq!(keyed.check(&key, &GcraLimit::new(&l), now, cost), expected);
            prop_assert_eq!(atomic[key].state(), *state);
            prop_assert_eq!(keyed.state(&key), *state);
        }
    }
}

#[test]
fn a_saturating_burst_gets_exactly_the_bound() {
    // Seed 002 §3.4's example: 60 per 60 s, all arriving at once after a long idle time.
    let l = limit(60, 60_000_000_000, 60);
    for alg_is_gcra in [false, true] {
        let at: Vec<Nanos> = vec![1_000_000_000_000; 100];
        let costs = vec![1; 100];
        let ds = if alg_is_gcra {
            run(&Gcra, &vec![l; 100], &at, &costs).unwrap()
        } else {
            run(&TokenBucket, &vec![l; 100], &at, &costs).unwrap()
        };
        assert_eq!(ds.iter().filter(|d| d.allowed).count(), 60);
        assert_eq!(ds[60].retry_after, Some(1_000_000_000));
    }
}

proptest! {
    /// Extreme values (periods of centuries, counts and bursts near `u64::MAX`, huge costs and
    /// gaps) never panic, and the bound still holds (checked in `u128`).
    #[test]
    fn extreme_values_never_panic(
        (count, period, burst) in (1u64..=u64::MAX, 1u64..=u64::MAX, 1u64..=u64::MAX),
        calls in prop::collection::vec((0u64..=u64::MAX / 64, 0u64..=u64::MAX), 1..40),
    ) {
        let l = limit(count, period, burst);
        let mut now = 0u64;
        let mut at = Vec::new();
        let mut costs = Vec::new();
        for (gap, cost) in calls {
            now = now.saturating_add(gap);
            at.push(now);
            costs.push(cost % burst.saturating_add(2));
        }
        let limits = vec![l; at.len()];
        let wide = |len: Nanos| -> u128 {
            u128::from(l.burst()) + u128::from(len) * u128::from(l.count()) / u128::from(l.period())
        };
        for ds in [run(&TokenBucket, &limits, &at, &costs)?, run(&Gcra, &limits, &at, &costs)?] {
            let events = admitted(&at, &costs, &ds);
            for a in 0..events.len() {
                let mut sum = 0u128;
                for b in a..events.len() {
                    sum += u128::from(events[b].1);
                    prop_assert!(sum <= wide(events[b].0 - events[a].0));
                }
            }
        }
    }
}

/// Checks, after one call that returned `d` at `now`, that the decision's numbers are exact
/// for the state `s` left behind.
fn numbers_are_exact<A: Algorithm>(
    alg: &A,
    s: &A::State,
    l: &Limit,
    now: Nanos,
    cost: u64,
    d: Decision,
) -> Result<(), TestCaseError> {
    // retry_after: the earliest wait after which the same request is admitted.
    if let (false, Some(w)) = (d.allowed, d.retry_after) {
        prop_assert!(w > 0);
        prop_assert!(
            alg.peek(s, l, now + w, cost).allowed,
            "retry_after {} too short",
            w
        );
        prop_assert!(
            !alg.peek(s, l, now + w - 1, cost).allowed,
            "retry_after {} too long",
            w
        );
    }
    // remaining: exactly that many permits could be taken right now.
    if d.remaining > 0 {
        prop_assert!(
            alg.peek(s, l, now, d.remaining).allowed,
            "remaining {} too high",
            d.remaining
        );
    }
    if d.remaining < l.burst() {
        prop_assert!(
            !alg.peek(s, l, now, d.remaining + 1).allowed,
            "remaining {} too low",
            d.remaining
        );
    }
    // reset_after: the earliest wait after which the whole burst is available again.
    let r = d.reset_after;
    prop_assert!(
        alg.peek(s, l, now + r, l.burst()).allowed,
        "reset_after {} too short",
        r
    );
    if r > 0 {
        prop_assert!(
            !alg.peek(s, l, now + r - 1, l.burst()).allowed,
            "reset_after {} too long",
            r
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The numbers a server turns into `RateLimit-Remaining`, `RateLimit-Reset` and
    /// `Retry-After` are exact, not estimates: one nanosecond (or one permit) less and the
    /// answer changes. Forward time; the limit may change from call to call.
    #[test]
    fn remaining_reset_and_retry_are_exact(
        limits in prop::collection::vec(arb_limit(), 1..3),
        calls in prop::collection::vec((0u64..60, 0usize..3, prop_oneof![4 => Just(1u64), 1 => 0u64..=25]), 1..120),
    ) {
        let mut tb = TokenBucket.new_state(&limits[0], 0);
        let mut g = Gcra.new_state(&limits[0], 0);
        let mut now = 0;
        for (gap, li, cost) in calls {
            now += gap;
            let l = limits[li % limits.len()];
            let d = TokenBucket.check(&mut tb, &l, now, cost);
            numbers_are_exact(&TokenBucket, &tb, &l, now, cost, d)?;
            let d = Gcra.check(&mut g, &l, now, cost);
            numbers_are_exact(&Gcra, &g, &l, now, cost, d)?;
        }
    }
}
