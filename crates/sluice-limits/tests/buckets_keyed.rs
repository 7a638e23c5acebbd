//! The keyed GCRA store: eviction never changes a decision, and the key cap bounds memory
//! while only ever refusing new keys (seed 002 §3.4's bucket, one per key).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use proptest::prelude::*;
use sluice_limits::{
    Algorithm, Gcra, GcraState, KeyedConfig, KeyedGcra, KeyedStore, Limit, TokenBucket,
    TokenBucketState,
};

fn limit(count: u64, period: u64, burst: u64) -> Limit {
    Limit::from_nanos(count, period)
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

fn arb_limit() -> impl Strategy<Value = Limit> {
    (1u64..=10, 1u64..=300, 1u64..=10).prop_map(|(c, p, b)| limit(c, p, b))
}

/// (gap, key, limit index, cost, sweep after this call?)
fn arb_calls() -> impl Strategy<Value = Vec<(u64, u64, usize, u64, bool)>> {
    prop::collection::vec(
        (
            0u64..80,
            0u64..24,
            0usize..3,
            0u64..=4,
            prop::bool::weighted(0.15),
        ),
        1..300,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Evicting idle keys (`retain_recent(now)`) at random moments gives exactly the
    /// decisions of a store that never evicts.
    #[test]
    fn eviction_never_changes_a_decision(limits in prop::collection::vec(arb_limit(), 3), calls in arb_calls()) {
        let keep: KeyedGcra<u64> = KeyedGcra::new();
        let evict: KeyedGcra<u64> = KeyedGcra::with_config(KeyedConfig { shards: 4, max_keys: None });
        let mut now = 0;
        for (gap, key, li, cost, sweep) in calls {
            now += gap;
            let l = &limits[li];
            prop_assert_eq!(evict.check(&key, l, now, cost), keep.check(&key, l, now, cost));
            if sweep {
                evict.retain_recent(now);
                // What is left is exactly the busy keys.
                prop_assert!(evict.len() <= keep.len());
            }
        }
    }

    /// The generic store under a cap that keeps evicting: while the cap evicts only idle keys
    /// (`forced` stays 0), every decision is exactly that of per-key states never evicted;
    /// and the store never holds more than the cap.
    #[test]
    fn the_cap_evicts_idle_keys_first_and_changes_no_decision_while_it_does(limits in prop::collection::vec(arb_limit(), 3), calls in arb_calls()) {
        let cap = 8;
        let store: KeyedStore<u64, TokenBucket> =
            KeyedStore::new(TokenBucket, 2).with_max_keys(Some(cap));
        let mut reference: HashMap<u64, TokenBucketState> = HashMap::new();
        let limit_of = |k: &u64| limits[(*k % 3) as usize];
        let mut now = 0;
        for (gap, key, _, cost, _) in calls {
            now += gap;
            let l = limit_of(&key);
            let state = reference.entry(key).or_insert_with(|| TokenBucket.new_state(&l, now));
            let want = TokenBucket.check(state, &l, now, cost);
            let got = store.check_view_judged(&key, &l, now, cost, &|k| Some(limit_of(k)));
            prop_assert!(store.len() <= cap);
            if store.evictions().forced > 0 {
                break;
            }
            prop_assert_eq!(got, want);
        }
    }

    /// The generic store, with the token bucket: sweeping idle keys at random moments gives
    /// exactly the decisions of per-key states never evicted.
    #[test]
    fn generic_store_eviction_never_changes_a_decision(limits in prop::collection::vec(arb_limit(), 3), calls in arb_calls()) {
        let store: KeyedStore<u64, TokenBucket> = KeyedStore::new(TokenBucket, 4);
        let mut reference: HashMap<u64, TokenBucketState> = HashMap::new();
        // Each key keeps one limit here, so the sweep can ask for it.
        let limit_of = |k: &u64| limits[(*k % 3) as usize];
        let mut now = 0;
        for (gap, key, _, cost, sweep) in calls {
            now += gap;
            let l = limit_of(&key);
            let state = reference.entry(key).or_insert_with(|| TokenBucket.new_state(&l, now));
            prop_assert_eq!(store.peek(&key, &l, now, cost), TokenBucket.peek(state, &l, now, cost));
            prop_assert_eq!(store.check(&key, &l, now, cost), TokenBucket.check(state, &l, now, cost));
            if sweep {
                store.retain_idle(now, limit_of);
            }
        }
    }

    /// With a cap of `max` keys, the store never holds more than `max`; its decisions are
    /// those of an unbounded GCRA except that a *new* key is refused when every stored key
    /// is busy — and only then.
    #[test]
    fn the_key_cap_bounds_memory_and_only_refuses_newcomers(
        limits in prop::collection::vec(arb_limit(), 3),
        calls in arb_calls(),
        max in 1usize..8,
    ) {
        let store: KeyedGcra<u64> = KeyedGcra::with_config(KeyedConfig { shards: 1, max_keys: Some(max) });
        let mut model: HashMap<u64, GcraState> = HashMap::new();
        let mut now = 0;
        for (gap, key, li, cost, _) in calls {
            now += gap;
            let l = &limits[li];
            let state = model.get(&key).copied().unwrap_or_default();
            let mut expected_state = state;
            let expected = Gcra.check(&mut expected_state, l, now, cost);
            let got = store.check(&key, l, now, cost);
            prop_assert!(store.len() <= max);
            if got == expected {
                model.insert(key, expected_state);
            } else {
                // A refusal for capacity: the key was not stored (idle or never seen), the
                // store is full, and every key it holds is busy.
                let busy = model.iter().filter(|(_, s)| s.tat() > now).count();
                prop_assert!(expected.allowed && !got.allowed);
                prop_assert!(state.tat() <= now, "a busy key was refused");
                prop_assert_eq!(store.len(), max);
                prop_assert!(busy >= max, "refused while only {} keys were busy", busy);
            }
        }
    }
}

#[test]
fn a_flood_of_new_keys_stays_within_the_cap() {
    // One million distinct keys, each taking one permit of a 1-per-second limit, on a store
    // capped at 10 000 keys: memory stays bounded, and once a key's bucket has refilled its
    // slot is reused.
    let l = limit(1, 1_000_000_000, 1);
    let store: KeyedGcra<u64> = KeyedGcra::with_config(KeyedConfig {
        shards: 16,
        max_keys: Some(10_000),
    });
    let mut admitted = 0u64;
    for k in 0..1_000_000u64 {
        // 1 ms per 1000 keys: 1 s of virtual time per million.
        let now = k * 1_000;
        if store.check(&k, &l, now, 1).allowed {
            admitted += 1;
        }
        assert!(store.len() <= 10_000);
    }
    // A key stays busy for 1 s and all the keys arrive within 1 s: the first 10 000 fill
    // the store, the others are refused, and no more memory is ever taken.
    assert_eq!(store.len(), 10_000);
    assert_eq!(admitted, 10_000);
    let bytes = store.table_bytes();
    // Now every key is idle: the next newcomers evict them.
    let later = 10_000_000_000;
    assert!(store.check(&u64::MAX, &l, later, 1).allowed);
    assert!(store.len() <= 10_000);
    assert!(store.table_bytes() <= bytes);
    let held = store.len();
    assert_eq!(store.retain_recent(later + 1_000_000_000), held);
    assert!(store.is_empty());
}

/// A flood of new keys at a capped store: it never holds more than its cap, a key in steady
/// use is never the one evicted (least recently used first), and what the cap had to evict
/// while busy is counted as forced.
#[test]
fn a_capped_store_keeps_its_busy_key_through_a_flood() {
    let cap = 1_000;
    let store: KeyedStore<u64, TokenBucket> =
        KeyedStore::new(TokenBucket, 4).with_max_keys(Some(cap));
    assert_eq!(store.max_keys(), Some(cap));
    // One permit per 2,000 ns, asked every 1,000 ns: every other ask is refused, unless
    // the key is forgotten (a fresh key is admitted at once).
    let busy = limit(1, 2_000, 1);
    let mut busy_admitted = 0;
    for i in 0..100_000u64 {
        let now = i * 10;
        // A flood key every 10 ns, each with a long limit: never idle within the run.
        store.check(&(1_000_000 + i), &limit(1, 1_000_000_000, 1), now, 1);
        if i % 100 == 0 {
            busy_admitted += u64::from(store.check(&7, &busy, now, 1).allowed);
        }
        assert!(store.len() <= cap, "{} keys held", store.len());
    }
    assert_eq!(
        busy_admitted, 500,
        "the busy key was evicted and began afresh"
    );
    let e = store.evictions();
    assert_eq!(e.idle, 0);
    assert!(e.forced >= 99_000 - cap as u64, "{e:?}");
    // An idle key goes before any used one: after its window every flood key is idle.
    let later = 10_000_000_000;
    let before = store.evictions();
    let long = limit(1, 1_000_000_000, 1);
    for j in 0..cap as u64 {
        store.check_view_judged(&(5_000_000 + j), &long, later, 1, &|_| Some(long));
        if store.evictions().idle > 0 {
            break;
        }
    }
    assert!(store.evictions().idle > 0);
    assert_eq!(store.evictions().forced, before.forced);
}
