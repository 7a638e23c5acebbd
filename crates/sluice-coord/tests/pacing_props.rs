//! Token accounts (seed 004 Alg. 4, eq. 1–5, §3.4): the burst bound under any call pattern,
//! agreement with the paper's algorithm when called on time, and the shape requirements of
//! the proactive and reactive functions (§3.1).
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_coord::pacing::{PacingError, Strategy as Pacing, TokenAccount};

fn any_pacing() -> impl Strategy<Value = Pacing> {
    prop_oneof![
        Just(Pacing::Proactive),
        (0u32..6).prop_map(Pacing::simple),
        (1u32..6, 0u32..8).prop_map(|(a, c)| Pacing::generalized(a, c).unwrap()),
        (1u32..6, 0u32..6).prop_map(|(a, extra)| Pacing::randomized(a, a + extra).unwrap()),
    ]
}

/// One caller action: wait `gap` ns, then tick (0), news (1), non-useful news (2), tick
/// then news (3), or news with at most one message wanted (4).
#[derive(Debug, Clone, Copy)]
struct Call {
    gap: u64,
    kind: u8,
    draw: f64,
}

fn calls(delta: u64) -> impl Strategy<Value = Vec<Call>> {
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0..delta,
        2 => 0..3 * delta,
        1 => 0..12 * delta,
    ];
    prop::collection::vec(
        (gap, 0u8..5, 0.0f64..1.0).prop_map(|(gap, kind, draw)| Call { gap, kind, draw }),
        1..120,
    )
}

/// Checks the burst bound on every window, exactly: for the messages `i ≤ j` (times sorted),
/// the half-open window `[τ_i, τ_j + 1)` is the shortest holding them, with length
/// `t = τ_j − τ_i + 1` ns, and must hold at most `⌈t/Δ⌉ + C`; equivalently every closed
/// window of length `t` at most `⌊t/Δ⌋ + C + 1`. Whole-period windows `t = mΔ` give the
/// paper's form `⌊t/Δ⌋ + C` (§3.4). Every window's count is at most that of the shortest
/// window containing the same messages, so this covers all windows.
fn assert_burst_bound(times: &[u64], delta: u64, c: u32) -> Result<(), TestCaseError> {
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = (j - i + 1) as u64;
            let t = times[j] - times[i] + 1;
            let bound = t.div_ceil(delta) + u64::from(c);
            prop_assert!(
                count <= bound,
                "{count} messages in [{}, {}] (Δ = {delta}, C = {c})",
                times[i],
                times[j]
            );
            // The paper's form, for the shortest whole-period half-open window around them.
            let m = t.div_ceil(delta);
            prop_assert!(count <= m + u64::from(c));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Seed 004 §3.4: at most ⌈t/Δ⌉ + C messages in any window of length t, whatever the
    /// strategy and however late, early or often the caller calls; the balance stays in
    /// [0, C]; no overspending; and every elapsed period is accounted for exactly once.
    #[test]
    fn burst_bound_holds_for_any_call_pattern(
        (delta, strategy, calls) in (prop_oneof![Just(1u64), 2u64..20, Just(1_000u64)], any_pacing())
            .prop_flat_map(|(d, s)| (Just(d), Just(s), calls(d))),
        t0 in 0u64..1_000_000,
    ) {
        let c = strategy.capacity();
        let mut acc = TokenAccount::new(strategy, delta, t0).unwrap();
        let mut now = t0;
        let mut sent = Vec::new();
        for call in calls {
            now += call.gap;
            if matches!(call.kind, 0 | 3) && acc.on_tick(now, call.draw) {
                sent.push(now);
            }
            if call.kind != 0 {
                let before = acc.tokens();
                let n = if call.kind == 4 {
                    let n = acc.on_news_at_most(now, call.draw, 1);
                    prop_assert!(n <= 1);
                    n
                } else {
                    acc.on_message(now, call.kind != 2, call.draw)
                };
                prop_assert!(n <= before, "spent {n} of {before} tokens");
                prop_assert_eq!(acc.tokens(), before - n);
                sent.extend(std::iter::repeat_n(now, n as usize));
            }
            prop_assert!(acc.tokens() <= c);
        }
        let st = acc.stats();
        let periods = (acc.next_tick() - t0) / delta - 1;
        prop_assert_eq!(st.proactive_sent + st.tokens_saved + st.tokens_lost, periods);
        prop_assert_eq!(st.proactive_sent + st.reactive_sent, sent.len() as u64);
        assert_burst_bound(&sent, delta, c)?;
    }
}

/// Alg. 4 exactly as printed, with eq. 1–5 written out independently of the crate.
struct Reference {
    strategy: Pacing,
    a: u32,
}

impl Reference {
    fn proactive(&self) -> f64 {
        let a = f64::from(self.a);
        match self.strategy {
            Pacing::Proactive => 1.0,
            Pacing::Simple { c } | Pacing::Generalized { c, .. } => {
                if self.a >= c {
                    1.0
                } else {
                    0.0
                }
            }
            Pacing::Randomized { a: big_a, c } => {
                let (big_a, c) = (f64::from(big_a), f64::from(c));
                if a < big_a - 1.0 {
                    0.0
                } else if a <= c {
                    (a - big_a + 1.0) / (c - big_a + 1.0)
                } else {
                    1.0
                }
            }
        }
    }

    fn reactive(&self, useful: bool) -> f64 {
        let a = f64::from(self.a);
        match self.strategy {
            Pacing::Proactive => 0.0,
            Pacing::Simple { .. } => {
                if self.a > 0 {
                    1.0
                } else {
                    0.0
                }
            }
            Pacing::Generalized { a: big_a, .. } => {
                let big_a = f64::from(big_a);
                if useful {
                    ((big_a - 1.0 + a) / big_a).floor()
                } else {
                    ((big_a - 1.0 + a) / (2.0 * big_a)).floor()
                }
            }
            Pacing::Randomized { a: big_a, .. } => {
                if useful {
                    a / f64::from(big_a)
                } else {
                    0.0
                }
            }
        }
    }

    /// Lines 3–10, one period.
    fn tick(&mut self, draw: f64) -> bool {
        if draw < self.proactive() {
            true
        } else {
            self.a += 1;
            false
        }
    }

    /// Lines 11–14: randRound(reactive(a, u)) = ⌊r⌋ + Bernoulli(r − ⌊r⌋).
    fn on_message(&mut self, useful: bool, draw: f64) -> u32 {
        let r = self.reactive(useful);
        let x = r.floor() as u32 + u32::from(draw < r - r.floor());
        self.a -= x;
        x
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Called at every period boundary (and as often as it likes in between), the account is
    /// seed 004 Alg. 4 exactly: same proactive decisions, same reactive counts, same balance,
    /// and the burst guard never intervenes.
    #[test]
    fn on_time_caller_gets_algorithm_4_exactly(
        strategy in any_pacing(),
        delta in 1u64..1_000,
        t0 in 0u64..1_000,
        periods in prop::collection::vec(
            (0.0f64..1.0, prop::collection::vec((0.0f64..1.0, any::<bool>(), 0.0f64..1.0, any::<bool>()), 0..4)),
            1..60,
        ),
    ) {
        let mut acc = TokenAccount::new(strategy, delta, t0).unwrap();
        let mut reference = Reference { strategy, a: 0 };
        for (k, (tick_draw, news)) in periods.into_iter().enumerate() {
            let boundary = t0 + (k as u64 + 1) * delta;
            prop_assert_eq!(acc.on_tick(boundary, tick_draw), reference.tick(tick_draw));
            prop_assert_eq!(acc.tokens(), reference.a);
            let mut offsets: Vec<_> = news;
            offsets.sort_by(|x, y| x.0.total_cmp(&y.0));
            for (frac, useful, draw, poll) in offsets {
                // Strictly inside the period, so the next boundary is not reached yet.
                let now = boundary + ((frac * delta as f64) as u64).min(delta - 1);
                if poll {
                    prop_assert!(!acc.on_tick(now, draw), "no period ends at {}", now);
                }
                prop_assert_eq!(acc.on_message(now, useful, draw), reference.on_message(useful, draw));
                prop_assert_eq!(acc.tokens(), reference.a);
            }
        }
        prop_assert_eq!(acc.stats().guard_vetoes, 0);
    }

    /// Seed 004 §3.1: PROACTIVE is non-decreasing in a and 1 from a = C on (so C is the
    /// token capacity of §3.4); REACTIVE is non-decreasing in a and u and never exceeds a.
    #[test]
    fn proactive_and_reactive_functions_have_the_required_shape(strategy in any_pacing()) {
        let c = strategy.capacity();
        for a in 0..=c + 3 {
            let p = strategy.proactive_probability(a);
            prop_assert!((0.0..=1.0).contains(&p));
            prop_assert!(p <= strategy.proactive_probability(a + 1));
            if a >= c {
                prop_assert_eq!(p, 1.0);
            } else {
                prop_assert!(p < 1.0);
            }
            for u in [false, true] {
                let r = strategy.reactive_mean(a, u);
                prop_assert!(r <= f64::from(a));
                prop_assert!(r <= strategy.reactive_mean(a + 1, u));
            }
            prop_assert!(strategy.reactive_mean(a, false) <= strategy.reactive_mean(a, true));
        }
    }
}

/// The paper's equations at a few points (seed 004 eq. 3–5).
#[test]
fn equations_at_known_points() {
    let g = Pacing::generalized(3, 10).unwrap();
    // ⌊(A − 1 + a)/A⌋ and ⌊(A − 1 + a)/(2A)⌋ with A = 3.
    assert_eq!(g.reactive_mean(0, true), 0.0);
    assert_eq!(g.reactive_mean(1, true), 1.0);
    assert_eq!(g.reactive_mean(3, true), 1.0);
    assert_eq!(g.reactive_mean(4, true), 2.0);
    assert_eq!(g.reactive_mean(3, false), 0.0);
    assert_eq!(g.reactive_mean(4, false), 1.0);
    assert_eq!(g.reactive_mean(10, false), 2.0);
    let r = Pacing::randomized(5, 10).unwrap();
    assert_eq!(r.proactive_probability(3), 0.0);
    assert_eq!(r.proactive_probability(4), 0.0);
    assert_eq!(r.proactive_probability(7), 0.5);
    assert_eq!(r.proactive_probability(10), 1.0);
    assert_eq!(r.reactive_mean(7, true), 1.4);
    assert_eq!(r.reactive_mean(7, false), 0.0);
    // Simple with C = 0 is the proactive baseline (§3.3.1).
    assert_eq!(Pacing::simple(0).proactive_probability(0), 1.0);
}

#[test]
fn impossible_parameters_are_typed_errors() {
    assert_eq!(Pacing::generalized(0, 5), Err(PacingError::ZeroA { a: 0 }));
    assert_eq!(Pacing::randomized(0, 5), Err(PacingError::ZeroA { a: 0 }));
    assert_eq!(
        Pacing::randomized(6, 5),
        Err(PacingError::RandomizedAAboveC { a: 6, c: 5 })
    );
    assert!(Pacing::randomized(5, 5).is_ok());
    assert_eq!(
        TokenAccount::new(Pacing::Proactive, 0, 0).unwrap_err(),
        PacingError::ZeroPeriod
    );
    // A hand-built invalid variant is caught by the constructor too.
    assert!(TokenAccount::new(Pacing::Randomized { a: 3, c: 1 }, 10, 0).is_err());
}

/// The bound ⌈t/Δ⌉ + C is attained, so the paper's ⌊t/Δ⌋ + C only holds for windows that
/// are whole periods: a full account sends its proactive message and then C reactive ones
/// in the same instant.
#[test]
fn burst_bound_is_tight() {
    let mut acc = TokenAccount::new(Pacing::simple(3), 100, 0).unwrap();
    for k in 1..=3 {
        assert!(!acc.on_tick(k * 100, 0.5));
    }
    assert_eq!(acc.tokens(), 3);
    assert!(
        acc.on_tick(400, 0.5),
        "a full simple account sends proactively"
    );
    let reactive: u32 = (0..5).map(|_| acc.on_news(400, 0.5)).sum();
    assert_eq!(
        reactive, 3,
        "simple: one message per news while tokens last"
    );
    // 4 messages in [400, 401): ⌈1/100⌉ + 3 = 4, one more than ⌊1/100⌋ + 3.
    assert_eq!(1 + reactive, 4);
}

/// Reactive messages go out at the moment of the news, not at the next period boundary,
/// whenever the account holds tokens (seed 004 §3: the speed of the reactive world).
#[test]
fn reactive_sends_are_immediate_when_tokens_are_available() {
    for strategy in [
        Pacing::simple(4),
        Pacing::generalized(2, 4).unwrap(),
        Pacing::randomized(4, 4).unwrap(),
    ] {
        let mut acc = TokenAccount::new(strategy, 1_000, 0).unwrap();
        for k in 1..=4 {
            acc.on_tick(k * 1_000, 0.99);
        }
        assert_eq!(acc.tokens(), 4, "{strategy:?}");
        // Mid-period, with the worst draw: at least one message at once (a ≥ A).
        assert!(acc.on_news(4_321, 0.999) >= 1, "{strategy:?}");
    }
    // The baseline never reacts.
    let mut acc = TokenAccount::new(Pacing::Proactive, 1_000, 0).unwrap();
    acc.on_tick(1_000, 0.0);
    assert_eq!(acc.on_news(1_500, 0.0), 0);
}

/// A late caller cannot make periods bunch up: a period decided late at 199 and the next one
/// on time at 200 would put two proactive messages 1 ns apart (bound: 1); the guard keeps
/// one, and the lost period is counted.
#[test]
fn late_caller_is_held_to_the_bound() {
    let mut acc = TokenAccount::new(Pacing::Proactive, 100, 0).unwrap();
    assert!(acc.on_tick(199, 0.0));
    assert!(!acc.on_tick(200, 0.0));
    assert_eq!(acc.stats().guard_vetoes, 1);
    assert_eq!(acc.stats().tokens_lost, 1);
    assert!(acc.on_tick(300, 0.0));
    // Three periods skipped by a very late caller save their tokens (up to C) and the
    // current one follows Alg. 4.
    let mut acc = TokenAccount::new(Pacing::simple(2), 100, 0).unwrap();
    assert!(
        acc.on_tick(450, 0.0),
        "periods 100..300 fill C = 2, then 400 is full: send"
    );
    assert_eq!(acc.tokens(), 2);
    assert_eq!(acc.stats().tokens_lost, 1);
    // Time going backwards is read as the latest time seen.
    assert!(!acc.on_tick(10, 0.0));
    assert_eq!(acc.next_tick(), 500);
}
