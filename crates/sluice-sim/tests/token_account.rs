//! Seed 004 §4 at small size: token accounts (driving `sluice_coord::pacing::TokenAccount`)
//! against the purely proactive baseline at equal message count.
#![allow(clippy::unwrap_used)]

mod support;

use sluice_coord::pacing::Strategy;
use sluice_sim::token_account::{self, App, Config, Outcome, compare, run_batch, write_results};

const NODES: usize = 400;
const PERIODS: u64 = 60;

fn runs(app: App, strategies: &[Strategy], seed: u64) -> Vec<Outcome> {
    let configs: Vec<Config> = strategies
        .iter()
        .map(|&s| Config::new(app, s, NODES, PERIODS, seed))
        .collect();
    let mut out = run_batch(&configs, 2, &|_, _| {}, &|_, _, _| {}).unwrap();
    compare(&mut out);
    out
}

fn tokens() -> Vec<Strategy> {
    vec![
        Strategy::Proactive,
        Strategy::simple(10),
        Strategy::generalized(5, 10).unwrap(),
        Strategy::randomized(5, 10).unwrap(),
    ]
}

/// Every strategy gets one token per node per period and never overspends (seed 004 §3,
/// Alg. 4), so the comparison is at equal message count: at most 1 message per node per
/// period, and at least 1 − (C + 1)/periods (a balance of at most C is left at the end).
fn assert_equal_budget(o: &Outcome) {
    let c = f64::from(o.c.unwrap_or(0));
    let floor = 1.0 - (c + 1.0) / PERIODS as f64;
    assert!(
        o.messages_per_node_period <= 1.0 && o.messages_per_node_period >= floor,
        "{}: {} messages per node per period",
        o.strategy,
        o.messages_per_node_period
    );
}

/// Seed 004 §4.2 / §6: in push gossip the token accounts cut the lag behind the freshest
/// update to about a third of the proactive lag; simple helps, generalized and randomized
/// help more ("GENERALIZED and RANDOMIZED outperform it robustly").
#[test]
fn push_gossip_token_accounts_beat_proactive_at_equal_messages() {
    let out = runs(App::PushGossip, &tokens(), 3);
    for o in &out {
        assert_equal_budget(o);
    }
    let lag = |k: &str| out.iter().find(|o| o.kind == k).unwrap().metric;
    let proactive = lag("proactive");
    for k in ["generalized", "randomized"] {
        assert!(
            lag(k) * 2.0 < proactive,
            "{k}: lag {} s vs proactive {proactive} s",
            lag(k)
        );
    }
    assert!(lag("simple") < proactive, "simple: {}", lag("simple"));
}

/// Seed 004 §4.2: gossip learning gains an order of magnitude — the token accounts let
/// models walk almost like a hot potato, the proactive ones wait about a period per hop.
#[test]
fn gossip_learning_token_accounts_are_much_faster() {
    let out = runs(
        App::GossipLearning,
        &[Strategy::Proactive, Strategy::randomized(5, 10).unwrap()],
        5,
    );
    for o in &out {
        assert_equal_budget(o);
    }
    let randomized = &out[1];
    assert!(
        randomized.speedup.unwrap() >= 5.0,
        "speed-up {:?} (metric {} vs {})",
        randomized.speedup,
        randomized.metric,
        out[0].metric
    );
}

/// Seed 004 §4.2, Fig. 2 (bottom row): chaotic power iteration (Alg. 3) converges under
/// every pacing, and at equal message count "we can also improve chaotic iteration
/// significantly with most parameter combinations". The gain is small against run-to-run
/// noise (docs/REPRODUCTION.md), so, as the paper does, this averages runs: 12 seeds at
/// N = 500 over the paper's 1,000 periods. The assertions hold on each of eight disjoint
/// groups of 12 seeds tried (1–96); that A = C = 10 is the single best setting does not (it
/// is in some groups and not in others), so it is not asserted.
#[test]
fn power_iteration_converges_and_most_token_accounts_beat_proactive() {
    const N: usize = 500;
    const P: u64 = 1000;
    let strategies = [
        Strategy::Proactive,
        Strategy::simple(10),
        Strategy::generalized(10, 10).unwrap(),
        Strategy::generalized(10, 20).unwrap(),
        Strategy::randomized(5, 10).unwrap(),
        Strategy::randomized(10, 20).unwrap(),
    ];
    let seeds = 1..=12u64;
    let configs: Vec<Config> = seeds
        .clone()
        .flat_map(|seed| {
            strategies
                .iter()
                .map(move |&s| Config::new(App::PowerIteration, s, N, P, seed))
        })
        .collect();
    let out = run_batch(&configs, 2, &|_, _| {}, &|_, _, _| {}).unwrap();
    let runs = seeds.count() as f64;
    // Per strategy: mean angle curve over the seeds, and mean log(final / proactive final).
    let mut curves: Vec<Vec<f64>> = vec![Vec::new(); strategies.len()];
    let mut log_ratio = vec![0.0; strategies.len()];
    for per_seed in out.chunks(strategies.len()) {
        let proactive = per_seed[0].metric;
        for (i, o) in per_seed.iter().enumerate() {
            // Alg. 3 converges whatever the pacing: from ≈ 0.25 rad after 2.5 periods to a
            // few hundredths, at most one message per node per period.
            let first = o.series[0].1;
            assert!(
                o.metric < first / 4.0 && o.metric < 0.1,
                "seed {} {}: angle {first} -> {}",
                o.seed,
                o.strategy,
                o.metric
            );
            let c = f64::from(o.c.unwrap_or(0));
            assert!(
                o.messages_per_node_period <= 1.0
                    && o.messages_per_node_period >= 1.0 - (c + 1.0) / P as f64,
                "{}: {} messages per node per period",
                o.strategy,
                o.messages_per_node_period
            );
            log_ratio[i] += (o.metric / proactive).ln() / runs;
            curves[i].resize(o.series.len(), 0.0);
            for (m, p) in curves[i].iter_mut().zip(&o.series) {
                *m += p.1 / runs;
            }
        }
    }
    // The averaged token-account runs end closer to the eigenvector than the averaged
    // proactive one ...
    let pooled = (log_ratio[1..].iter().sum::<f64>() / (strategies.len() - 1) as f64).exp();
    assert!(
        pooled < 1.0,
        "final angle, token accounts / proactive: {pooled}"
    );
    // ... and most settings reach proactive's final (mean) angle before the end.
    let target = curves[0].last().copied().unwrap();
    let sooner: Vec<bool> = curves[1..]
        .iter()
        .map(|c| c[..c.len() - 1].iter().any(|&v| v <= target))
        .collect();
    assert!(
        sooner.iter().filter(|&&b| b).count() * 2 > sooner.len(),
        "settings reaching proactive's final angle {target} early: {sooner:?}; ratios {:?}",
        log_ratio.iter().map(|l| l.exp()).collect::<Vec<_>>()
    );
}

/// Seed 004 §4.3 eq. 10: the randomized account's average balance solves
/// `u·a/A + (a − A + 1)/(C − A + 1) = 1`; with the measured fraction u of useful messages
/// within 10%, and within 20% of the paper's closed form `A·C/(C + 1)` (u = 1; gossip
/// learning has u ≈ 0.8–0.9, and fewer reactive sends leave a few more tokens).
#[test]
fn randomized_token_count_matches_mean_field() {
    let out = runs(
        App::GossipLearning,
        &[
            Strategy::randomized(5, 10).unwrap(),
            Strategy::randomized(10, 20).unwrap(),
        ],
        7,
    );
    for o in &out {
        let predicted = o.predicted_tokens_measured_u.unwrap();
        assert!(
            (o.mean_tokens - predicted).abs() <= 0.1 * predicted,
            "{}: measured {} tokens, mean-field {predicted} (u = {})",
            o.strategy,
            o.mean_tokens,
            o.useful_fraction
        );
        let closed_form = o.predicted_tokens.unwrap();
        assert!(
            (o.mean_tokens - closed_form).abs() <= 0.2 * closed_form,
            "{}: measured {} tokens, A·C/(C+1) = {closed_form}",
            o.strategy,
            o.mean_tokens
        );
    }
}

/// The message queue holds only messages in flight, and the burst bound of seed 004 §3.4
/// bounds those: a message is in flight for one transfer time `Δ/100 < Δ`, and a node sends
/// at most `⌈t/Δ⌉ + C = 1 + C` messages in any window that short, so at most `N·(C + 1)`
/// are ever in flight. The simulation's memory therefore does not grow with the run length.
#[test]
fn memory_is_bounded_by_the_burst_bound() {
    for app in [App::PushGossip, App::GossipLearning] {
        for s in tokens() {
            let short =
                token_account::run(&Config::new(app, s, NODES, 20, 9), &mut |_, _| {}).unwrap();
            let long =
                token_account::run(&Config::new(app, s, NODES, 120, 9), &mut |_, _| {}).unwrap();
            let c = u64::from(s.capacity());
            for o in [&short, &long] {
                assert!(
                    o.peak_in_flight <= NODES as u64 * (c + 1),
                    "{} {}: {} messages in flight",
                    app.name(),
                    o.strategy,
                    o.peak_in_flight
                );
                // Every node ends `periods − 1` periods (its first starts at a phase in
                // [0, Δ)); every message sent is delivered unless still in flight at the end.
                let ticks = NODES as u64 * (o.periods - 1);
                let sent =
                    (o.messages_per_node_period * (NODES as u64 * o.periods) as f64).round() as u64;
                assert!(
                    o.events >= ticks + sent - o.peak_in_flight
                        && o.events <= ticks + sent + 10 * o.periods,
                    "{} {}: {} events, {ticks} period ends, {sent} messages",
                    app.name(),
                    o.strategy,
                    o.events
                );
            }
            assert!(
                long.state_bytes <= 2 * short.state_bytes,
                "{} {}: {} bytes after 120 periods, {} after 20",
                app.name(),
                long.strategy,
                long.state_bytes,
                short.state_bytes
            );
        }
    }
}

/// Same seed ⇒ byte-identical CSV and SVG output, whatever the number of threads.
#[test]
fn same_seed_gives_identical_files() {
    let strategies = token_account::strategies(&[(2, 4)], &[]);
    let configs: Vec<Config> = App::ALL
        .iter()
        .flat_map(|&app| {
            strategies
                .iter()
                .map(move |&s| Config::new(app, s, 100, 12, 11))
        })
        .collect();
    let base = std::env::temp_dir().join(format!("sluice-token-account-{}", std::process::id()));
    let mut files = Vec::new();
    for (i, threads) in [1, 2].into_iter().enumerate() {
        let mut out = run_batch(&configs, threads, &|_, _| {}, &|_, _, _| {}).unwrap();
        compare(&mut out);
        let dir = base.join(i.to_string());
        write_results(&dir, &out).unwrap();
        files.push(support::files(&dir));
    }
    std::fs::remove_dir_all(&base).ok();
    assert!(
        files[0].len() >= 5,
        "expected runs.csv, series.csv and charts"
    );
    assert_eq!(files[0], files[1]);
}

/// Bad parameters are errors, not panics.
#[test]
fn rejects_bad_configs() {
    let bad = [
        Config::new(App::PushGossip, Strategy::Proactive, 10, 10, 1),
        Config::new(App::PushGossip, Strategy::Proactive, 100, 0, 1),
        Config::new(
            App::PushGossip,
            Strategy::Randomized { a: 5, c: 2 },
            100,
            10,
            1,
        ),
    ];
    for c in bad {
        assert!(token_account::run(&c, &mut |_, _| {}).is_err(), "{c:?}");
    }
}
