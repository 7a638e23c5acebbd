//! `Algorithm::charge`, for every algorithm behind `AnyAlgorithm`: where the limit holds the
//! permits, charging them is exactly admitting them; past it the state takes them up to its
//! saturation, and nothing panics.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_limits::{Algorithm, AlgorithmKind, AnyAlgorithm, AnyState, Limit, Nanos, Options};
use sluice_limits::{Decision, WarmUp};

fn kind() -> impl Strategy<Value = AlgorithmKind> {
    prop::sample::select(AlgorithmKind::ALL.to_vec())
}

fn warm_up() -> impl Strategy<Value = WarmUp> {
    (
        prop_oneof![Just(0u64), 1u64..5_000],
        prop_oneof![Just(1.0), Just(3.0), 1.0f64..20.0],
    )
        .prop_map(|(w, f)| WarmUp::new(w, f).unwrap())
}

fn algorithm(kind: AlgorithmKind, k: u32, warm_up: WarmUp) -> AnyAlgorithm {
    AnyAlgorithm::new(
        kind,
        Options {
            sub_windows: k,
            warm_up,
        },
    )
}

fn limit() -> impl Strategy<Value = Limit> {
    (1u64..10, 1u64..200, 1u64..12)
        .prop_map(|(n, t, b)| Limit::from_nanos(n, t).unwrap().with_burst(b).unwrap())
}

/// Steps: a time step (sometimes back), a cost, and whether it is charged rather than
/// checked (so states past the limit are reached too).
fn ops() -> impl Strategy<Value = Vec<(i64, u64, bool)>> {
    prop::collection::vec((-20i64..60, 0u64..14, prop::bool::weighted(0.2)), 0..80)
}

/// The state after `ops` from a new key, and the time of the last step.
fn run(alg: &AnyAlgorithm, l: &Limit, ops: &[(i64, u64, bool)]) -> (AnyState, Nanos) {
    let mut now: Nanos = 1_000;
    let mut s = alg.new_state(l, now);
    for &(dt, cost, charge) in ops {
        now = now.saturating_add_signed(dt);
        if charge {
            alg.charge(&mut s, l, now, cost);
        } else {
            alg.check(&mut s, l, now, cost);
        }
    }
    (s, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// A charge the limit would admit is the admission: the same state as a check of the
    /// same cost at the same instant, and (but for the warm-up, one request per free
    /// instant) as that many admitted one-permit checks.
    #[test]
    fn a_charge_that_fits_is_the_admission(
        kind in kind(), k in 1u32..6, w in warm_up(), l in limit(), ops in ops(),
        dt in -30i64..80, n in 0u64..14,
    ) {
        let alg = algorithm(kind, k, w);
        let (s, now) = run(&alg, &l, &ops);
        let now = now.saturating_add_signed(dt);
        let mut charged = s.clone();
        alg.charge(&mut charged, &l, now, n);
        if n == 0 {
            prop_assert_eq!(&charged, &s, "a charge of nothing changes nothing");
        }
        if alg.peek(&s, &l, now, n).allowed {
            let mut checked = s.clone();
            alg.check(&mut checked, &l, now, n);
            prop_assert_eq!(&charged, &checked, "cost {} at {}", n, now);
        }
        let mut ones = s.clone();
        let all = (0..n).all(|_| alg.check(&mut ones, &l, now, 1).allowed);
        if all && kind != AlgorithmKind::WarmUp {
            prop_assert_eq!(&charged, &ones, "{} one-permit checks at {}", n, now);
        }
    }

    /// Past the limit a charge still counts: right after it, a request the limit holds is
    /// refused whenever the charge took more than what was left, and the state never
    /// admits more afterwards than before the charge.
    #[test]
    fn a_charge_never_gives_permits_back(
        kind in kind(), k in 1u32..6, w in warm_up(), l in limit(), ops in ops(),
        dt in 0i64..80, n in 0u64..40, later in 0u64..400,
    ) {
        let alg = algorithm(kind, k, w);
        let (s, now) = run(&alg, &l, &ops);
        let now = now.saturating_add_signed(dt);
        let mut charged = s.clone();
        alg.charge(&mut charged, &l, now, n);
        // A charge of at least what was left takes it all: the next request is refused.
        let b0 = alg.peek(&s, &l, now, 1);
        let left = if b0.allowed { b0.remaining.saturating_add(1) } else { 0 };
        if n > 0 && n >= left && kind != AlgorithmKind::WarmUp {
            let a0 = alg.peek(&charged, &l, now, 1);
            prop_assert!(!a0.allowed, "{} charged with {} left: {:?}", n, left, a0);
        }
        let before: Decision = alg.peek(&s, &l, now + later, 1);
        let after = alg.peek(&charged, &l, now + later, 1);
        prop_assert!(!after.allowed || before.allowed, "{:?} then {:?}", before, after);
        prop_assert!(after.remaining <= before.remaining, "{:?} then {:?}", before, after);
    }

    /// Extreme limits, times and counts: never a panic, and the state still decides.
    #[test]
    fn charges_never_panic(
        kind in kind(), k in 1u32..6,
        count in prop_oneof![1u64..4, Just(u64::MAX)],
        period in prop_oneof![1u64..4, Just(u64::MAX)],
        burst in prop_oneof![1u64..4, Just(u64::MAX)],
        times in prop::collection::vec(prop_oneof![0u64..10, Just(u64::MAX - 1), Just(u64::MAX)], 1..6),
        n in prop_oneof![0u64..4, Just(u64::MAX)],
        warm in prop_oneof![Just(0u64), Just(u64::MAX)],
        factor in prop_oneof![Just(1.0), Just(1e300)],
    ) {
        let alg = algorithm(kind, k, WarmUp::new(warm, factor).unwrap());
        let l = Limit::from_nanos(count, period).unwrap().with_burst(burst).unwrap();
        let mut s = alg.new_state(&l, times[0]);
        for &t in &times {
            alg.charge(&mut s, &l, t, n);
            alg.check(&mut s, &l, t, 1);
            alg.charge(&mut s, &l, t, n);
            let _ = alg.peek(&s, &l, t, n);
        }
    }
}

/// Each algorithm's saturation, at one instant on a new key (10 per 1000 ns, burst 10): one
/// limit's worth per call; then the windows hold twice the count (free when the window has
/// passed), the leaky bucket twice the burst and GCRA a TAT two bursts ahead (free 1100 ns
/// on), the token bucket an empty bucket as of two full refills ahead and the warm-up a next
/// free instant `2·(1000 + 1)` ahead (both reached by a third charge).
#[test]
fn each_algorithm_saturates_where_its_doc_says() {
    let l = Limit::from_nanos(10, 1000).unwrap();
    for kind in AlgorithmKind::ALL {
        let alg = algorithm(kind, 10, WarmUp::new(0, 1.0).unwrap());
        let mut once = alg.new_state(&l, 0);
        alg.charge(&mut once, &l, 0, 25);
        let mut ten = alg.new_state(&l, 0);
        alg.charge(&mut ten, &l, 0, 10);
        assert_eq!(once, ten, "{kind}: at most one limit's worth per call");
        let (charges, free_at) = match kind {
            AlgorithmKind::FixedWindow
            | AlgorithmKind::FixedWindowFirst
            | AlgorithmKind::SlidingWindow
            | AlgorithmKind::SlidingLog => (2, 1000),
            AlgorithmKind::LeakyBucket | AlgorithmKind::Gcra => (2, 1100),
            AlgorithmKind::TokenBucket => (3, 2100),
            AlgorithmKind::WarmUp => (3, 2002),
        };
        let mut s = alg.new_state(&l, 0);
        for _ in 0..charges - 1 {
            alg.charge(&mut s, &l, 0, 10);
        }
        let short = s.clone();
        alg.charge(&mut s, &l, 0, 10);
        assert_ne!(s, short, "{kind}: not saturated before {charges} charges");
        let saturated = s.clone();
        alg.charge(&mut s, &l, 0, 10);
        assert_eq!(s, saturated, "{kind}: saturated after {charges} charges");
        assert!(!alg.peek(&s, &l, free_at - 1, 1).allowed, "{kind}");
        assert!(alg.peek(&s, &l, free_at, 1).allowed, "{kind}");
    }
}

/// `KeyedStore::check_counting_refused_view`, as envoyproxy/ratelimit's fixed window counts:
/// every hit counts, refused ones included, so after 8 of 10 a refused 5 leaves the window
/// over the limit and a request of 1 is refused too; a key first seen on a refusal is
/// stored; the next window starts afresh. The plain check leaves refused permits alone.
#[test]
fn a_counting_store_counts_refused_hits() {
    use sluice_limits::{FixedWindow, KeyedStore};
    let l = Limit::from_nanos(10, 1_000).unwrap();
    let store = KeyedStore::new(FixedWindow::epoch(), 4);
    let key = "k".to_owned();
    assert!(store.check_counting_refused_view(&key, &l, 0, 8).allowed);
    assert!(!store.check_counting_refused_view(&key, &l, 1, 5).allowed);
    assert!(!store.check_counting_refused_view(&key, &l, 2, 1).allowed);
    assert!(
        store
            .check_counting_refused_view(&key, &l, 1_000, 1)
            .allowed
    );
    // A key seen first on a refusal (cost above the limit) is stored, and over.
    let big = "big".to_owned();
    assert!(!store.check_counting_refused_view(&big, &l, 0, 30).allowed);
    assert_eq!(store.len(), 2);
    assert!(!store.check_counting_refused_view(&big, &l, 1, 1).allowed);

    let plain = KeyedStore::new(FixedWindow::epoch(), 4);
    assert!(plain.check(&key, &l, 0, 8).allowed);
    assert!(!plain.check(&key, &l, 1, 5).allowed);
    assert!(plain.check(&key, &l, 2, 1).allowed);
}
