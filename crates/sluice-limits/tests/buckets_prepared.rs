//! A limit prepared once decides exactly as the limit read at every call.
//!
//! `TokenBucketLimit` (reciprocals instead of divisions, a precomputed fill time) and
//! `GcraLimit` are speed-ups only: on random traces — times going backwards, costs 0 and above
//! the burst, limits changing from call to call, extreme values — every decision and every
//! new state must equal the plain [`Algorithm`] check's (seed 002 §3.4: the token bucket and
//! GCRA guarantees are stated, and tested in `buckets_props.rs`, for the plain check).
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_limits::token_bucket::TokenBucketLimit;
use sluice_limits::{Algorithm, AtomicGcra, Gcra, GcraLimit, Limit, TokenBucket};

fn limit(count: u64, period: u64, burst: u64) -> Limit {
    Limit::from_nanos(count, period)
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// Small limits (many refills, partial credits) and extreme ones (overflowing products).
fn arb_limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        3 => (1u64..=20, 1u64..=400, 1u64..=20).prop_map(|(c, p, b)| limit(c, p, b)),
        1 => (1u64..=u64::MAX, 1u64..=u64::MAX, 1u64..=u64::MAX)
            .prop_map(|(c, p, b)| limit(c, p, b)),
        1 => (prop_oneof![Just(1u64), Just(u64::MAX), 1u64..=1_000_000_000],
              prop_oneof![Just(1u64), Just(u64::MAX), 1u64..=1_000_000_000_000],
              prop_oneof![Just(1u64), Just(u64::MAX), 1u64..=100_000])
            .prop_map(|(c, p, b)| limit(c, p, b)),
    ]
}

/// (time step, cost, index of the limit) per call; steps may go backwards.
fn arb_calls() -> impl Strategy<Value = Vec<(i64, u64, usize)>> {
    prop::collection::vec(
        (
            prop_oneof![6 => 0i64..50, 1 => -50i64..0, 1 => Just(i64::MAX), 1 => any::<i64>()],
            prop_oneof![4 => Just(1u64), 2 => 0u64..=25, 1 => any::<u64>()],
            0usize..3,
        ),
        1..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `TokenBucket::check_prepared` = `TokenBucket::check`, decision and state, call by call.
    #[test]
    fn prepared_token_bucket_decides_as_the_plain_one(
        limits in prop::collection::vec(arb_limit(), 1..4),
        start in any::<u64>(),
        calls in arb_calls(),
    ) {
        let prepared: Vec<TokenBucketLimit> = limits.iter().map(TokenBucketLimit::new).collect();
        let mut plain = TokenBucket.new_state(&limits[0], start);
        let mut fast = plain;
        let mut now = start;
        for (i, (step, cost, li)) in calls.into_iter().enumerate() {
            now = now.saturating_add_signed(step);
            let li = li % limits.len();
            let (l, p) = (&limits[li], &prepared[li]);
            prop_assert_eq!(
                TokenBucket.peek_prepared(&fast, p, now, cost),
                TokenBucket.peek(&plain, l, now, cost),
                "peek, call {}", i
            );
            let expected = TokenBucket.check(&mut plain, l, now, cost);
            prop_assert_eq!(TokenBucket.check_prepared(&mut fast, p, now, cost), expected, "call {}", i);
            prop_assert_eq!(fast, plain, "state after call {}", i);
        }
    }

    /// `AtomicGcra` with a `GcraLimit` prepared once (`check_prepared`, and `check` given the
    /// prepared limit) = `Gcra` through `Algorithm`.
    #[test]
    fn prepared_gcra_decides_as_the_plain_one(
        limits in prop::collection::vec(arb_limit(), 1..4),
        start in any::<u64>(),
        calls in arb_calls(),
    ) {
        let prepared: Vec<GcraLimit> = limits.iter().map(GcraLimit::new).collect();
        let mut plain = Gcra.new_state(&limits[0], start);
        let atomic = AtomicGcra::new();
        let mut now = start;
        for (i, (step, cost, li)) in calls.into_iter().enumerate() {
            now = now.saturating_add_signed(step);
            let li = li % limits.len();
            let (l, p) = (&limits[li], &prepared[li]);
            prop_assert_eq!(atomic.peek(p, now, cost), Gcra.peek(&plain, l, now, cost), "peek, call {}", i);
            let expected = Gcra.check(&mut plain, l, now, cost);
            // Alternate the two entry points; both must decide as the plain check.
            let got = if i % 2 == 0 { atomic.check_prepared(p, now, cost) } else { atomic.check(p, now, cost) };
            prop_assert_eq!(got, expected, "call {}", i);
            prop_assert_eq!(atomic.state(), plain, "state after call {}", i);
        }
    }
}

/// The fast paths at their edges: a bucket exactly one fill time after being emptied, one
/// ns before, and one token short with and without credit.
#[test]
fn fast_paths_at_their_edges() {
    // 3 per 10 ns, burst 4: an empty bucket is full after ⌈40 / 3⌉ = 14 ns.
    let l = limit(3, 10, 4);
    let p = TokenBucketLimit::new(&l);
    for wait in [0, 1, 3, 4, 13, 14, 15, 100] {
        let mut plain = TokenBucket.new_state(&l, 0);
        assert!(TokenBucket.check(&mut plain, &l, 0, 4).allowed);
        let mut fast = plain;
        for t in [wait, wait, wait + 1] {
            let d = TokenBucket.check(&mut plain, &l, t, 1);
            assert_eq!(
                TokenBucket.check_prepared(&mut fast, &p, t, 1),
                d,
                "wait {wait}"
            );
            assert_eq!(fast, plain);
        }
    }
    // Full at 14 ns exactly, not at 13.
    let mut s = TokenBucket.new_state(&l, 0);
    assert!(TokenBucket.check_prepared(&mut s, &p, 0, 4).allowed);
    assert_eq!(TokenBucket.peek_prepared(&s, &p, 13, 0).remaining, 3);
    assert_eq!(TokenBucket.peek_prepared(&s, &p, 14, 0).remaining, 4);
    // One permit from a full bucket: the time of one token, ⌈10 / 3⌉ = 4 ns, to be full.
    let mut s = TokenBucket.new_state(&l, 0);
    assert_eq!(TokenBucket.check_prepared(&mut s, &p, 0, 1).reset_after, 4);
}
