//! The `Algorithm` contract, for every algorithm behind `AnyAlgorithm`: `peek` never changes
//! state and answers as `check`; a refusal changes nothing; edge cases never panic.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_limits::{Algorithm, AlgorithmKind, AnyAlgorithm, Limit, Nanos, Options, WarmUp};

fn kind() -> impl Strategy<Value = AlgorithmKind> {
    prop::sample::select(AlgorithmKind::ALL.to_vec())
}

fn algorithm(kind: AlgorithmKind, k: u32) -> AnyAlgorithm {
    AnyAlgorithm::new(
        kind,
        Options {
            sub_windows: k,
            warm_up: WarmUp::guava(500),
        },
    )
}

fn limit() -> impl Strategy<Value = Limit> {
    (1u64..10, 1u64..200, 1u64..12)
        .prop_map(|(n, t, b)| Limit::from_nanos(n, t).unwrap().with_burst(b).unwrap())
}

/// Requests: time steps that sometimes go backwards, costs up to 12, occasional limit change.
fn ops() -> impl Strategy<Value = Vec<(i64, u64, bool)>> {
    prop::collection::vec((-20i64..60, 0u64..12, prop::bool::weighted(0.05)), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn peek_is_pure_and_refusals_change_nothing(
        kind in kind(), k in 1u32..6, l1 in limit(), l2 in limit(), ops in ops(),
    ) {
        let alg = algorithm(kind, k);
        let mut l = l1;
        let mut s = alg.new_state(&l, 0);
        let mut t: i64 = 0;
        for (dt, cost, change) in ops {
            if change { l = if l == l1 { l2 } else { l1 }; }
            t = (t + dt).max(0);
            let now = t as Nanos;
            let before = s.clone();
            let peeked = alg.peek(&s, &l, now, cost);
            prop_assert_eq!(&s, &before, "peek changed the state");
            let d = alg.check(&mut s, &l, now, cost);
            prop_assert_eq!(d, peeked, "peek and check disagree");
            if !d.allowed || cost == 0 {
                prop_assert_eq!(&s, &before, "a refusal or a cost of 0 changed the state");
            }
            prop_assert!(d.allowed || d.retry_after != Some(0));
            if d.allowed {
                prop_assert_eq!(d.retry_after, Some(0));
            }
            if cost == 0 {
                prop_assert!(d.allowed, "cost 0 is always allowed");
            }
            // A refusal with a wait is admitted after that wait if nothing else arrives; waits
            // are measured from the caller's `now`, even when it went backwards.
            if let (false, Some(w)) = (d.allowed, d.retry_after) {
                prop_assert!(alg.peek(&s, &l, now + w, cost).allowed, "retry_after {w} too short");
            }
            // An idle state decides as a fresh one.
            if alg.is_idle(&s, &l, now) {
                let fresh = alg.new_state(&l, now);
                prop_assert_eq!(alg.peek(&s, &l, now, cost), alg.peek(&fresh, &l, now, cost));
            }
        }
    }

    /// `retry_after` is the *earliest* wait for the window/log/leaky algorithms, which compute
    /// it exactly: one ns earlier the same request is still refused.
    #[test]
    fn retry_after_is_tight(kind in kind(), k in 1u32..6, l in limit(), ops in ops()) {
        let alg = algorithm(kind, k);
        if matches!(kind, AlgorithmKind::TokenBucket | AlgorithmKind::Gcra) {
            return Ok(()); // their own tests (buckets_*) cover them
        }
        let mut s = alg.new_state(&l, 0);
        let mut t: Nanos = 0;
        for (dt, cost, _) in ops {
            t += dt.max(0) as Nanos;
            let d = alg.check(&mut s, &l, t, cost);
            if let (false, Some(w)) = (d.allowed, d.retry_after) {
                prop_assert!(w > 0);
                prop_assert!(!alg.peek(&s, &l, t + w - 1, cost).allowed, "{kind}: could retry before {w}");
            }
        }
    }
}

#[test]
fn cost_beyond_the_limit_is_never_possible() {
    let l = Limit::from_nanos(5, 100).unwrap().with_burst(5).unwrap();
    for kind in AlgorithmKind::ALL {
        let alg = algorithm(kind, 4);
        let mut s = alg.new_state(&l, 0);
        let d = alg.check(&mut s, &l, 10, 6);
        assert_eq!((d.allowed, d.retry_after), (false, None), "{kind}");
        assert_eq!(s, alg.new_state(&l, 0), "{kind}");
        let d = alg.check(&mut s, &l, 10, u64::MAX);
        assert_eq!((d.allowed, d.retry_after), (false, None), "{kind}");
    }
}

#[test]
fn extreme_values_do_not_panic() {
    let limits = [
        Limit::from_nanos(u64::MAX, u64::MAX).unwrap(),
        Limit::from_nanos(u64::MAX, 1).unwrap(),
        Limit::from_nanos(1, u64::MAX).unwrap(),
        Limit::from_nanos(1, 1)
            .unwrap()
            .with_burst(u64::MAX)
            .unwrap(),
    ];
    for kind in AlgorithmKind::ALL {
        for k in [1, 7, u32::MAX >> 20] {
            let alg = algorithm(kind, k);
            for l in &limits {
                let mut s = alg.new_state(l, 0);
                for (now, cost) in [
                    (0, 1),
                    (u64::MAX, u64::MAX),
                    (u64::MAX, 1),
                    (3, 2),
                    (u64::MAX - 1, 0),
                ] {
                    let d = alg.check(&mut s, l, now, cost);
                    let _ = alg.peek(&s, l, now, cost);
                    let _ = alg.is_idle(&s, l, now);
                    assert!(d.remaining <= l.count().max(l.burst()), "{kind}");
                }
            }
        }
    }
}

#[test]
fn time_going_backwards_reads_as_the_latest_time() {
    let l = Limit::from_nanos(2, 100).unwrap();
    for kind in AlgorithmKind::ALL {
        let alg = algorithm(kind, 4);
        let mut s = alg.new_state(&l, 0);
        assert!(alg.check(&mut s, &l, 1_000, 1).allowed, "{kind}");
        // Deciding at an earlier time never admits more than deciding at the latest.
        let early = alg.peek(&s, &l, 10, 2);
        let late = alg.peek(&s, &l, 1_000, 2);
        assert!(!early.allowed || late.allowed, "{kind}");
    }
}
