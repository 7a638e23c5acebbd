//! `sluice sim token-account`: seed 004 §4, token accounts vs the proactive baseline.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context as _, bail};
use sluice_sim::token_account::{
    self, App, Config, Outcome, best_by_kind, default_pairs, paper_pairs,
};

use super::progress::Progress;

/// Push gossip, gossip learning and chaotic power iteration paced by token accounts
/// (proactive / simple / generalized / randomized) at equal message count.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Network size N (the paper: 5000, and 500000 for push gossip and gossip learning).
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Periods Δ = 172.8 s to simulate (the paper: 1000, two virtual days).
    #[arg(long, default_value_t = 1000)]
    periods: u64,
    /// Applications, comma-separated: push-gossip, gossip-learning, power-iteration
    /// (short: push, learning, power) [default: all three].
    #[arg(long, value_delimiter = ',')]
    apps: Vec<App>,
    /// A:C pairs, comma-separated (e.g. 5:10,10:20); default: a representative selection.
    #[arg(long, value_delimiter = ',')]
    pairs: Vec<String>,
    /// Use the paper's whole grid (A ∈ {1,2,5,10,15,20,40}, C − A ∈ {0,…,80}; §4.2).
    #[arg(long, conflicts_with = "pairs")]
    paper_grid: bool,
    /// Strategy kinds besides the proactive baseline: simple, generalized, randomized
    /// [default: all three].
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (results do not depend on it) [default: available cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Output directory for runs.csv, series.csv and the SVG charts.
    #[arg(long, default_value = "results/token-account")]
    out: PathBuf,
    /// Print one JSON object to stdout instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_pair(s: &str) -> anyhow::Result<(u32, u32)> {
    let (a, c) = s
        .split_once(':')
        .with_context(|| format!("--pairs: expected A:C, got {s:?}"))?;
    let a: u32 = a
        .trim()
        .parse()
        .with_context(|| format!("--pairs: bad A in {s:?}"))?;
    let c: u32 = c
        .trim()
        .parse()
        .with_context(|| format!("--pairs: bad C in {s:?}"))?;
    if a == 0 {
        bail!("--pairs: A must be at least 1 in {s:?}");
    }
    if a > c {
        bail!("--pairs: need A <= C in {s:?} (seed 004 eq. 4)");
    }
    Ok((a, c))
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let pairs = if a.paper_grid {
        paper_pairs()
    } else if a.pairs.is_empty() {
        default_pairs()
    } else {
        a.pairs
            .iter()
            .map(|s| parse_pair(s))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    for k in &a.kinds {
        if !["simple", "generalized", "randomized"].contains(&k.as_str()) {
            bail!("--kinds: unknown kind {k:?} (simple, generalized, randomized)");
        }
    }
    let kinds: Vec<&str> = a.kinds.iter().map(String::as_str).collect();
    let apps = if a.apps.is_empty() {
        App::ALL.to_vec()
    } else {
        a.apps.clone()
    };
    let strategies = token_account::strategies(&pairs, &kinds);
    let configs: Vec<Config> = apps
        .iter()
        .flat_map(|&app| {
            strategies
                .iter()
                .map(move |&s| Config::new(app, s, a.nodes, a.periods, a.seed))
        })
        .collect();
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    eprintln!(
        "token-account: seed {}, N = {}, {} periods, {} runs on {} threads",
        a.seed,
        a.nodes,
        a.periods,
        configs.len(),
        threads
    );
    let started = Instant::now();
    let total = configs.len();
    // The runs go on in parallel: the bar counts the periods of all of them.
    let periods = Mutex::new((vec![0u64; total], Progress::new("token-account", "periods")));
    let all = total as u64 * a.periods;
    let advance = |i: usize, d: u64| {
        if let Ok(mut g) = periods.lock() {
            let (per_run, bar) = &mut *g;
            if let Some(p) = per_run.get_mut(i) {
                *p = d;
            }
            let sum = per_run.iter().sum();
            bar.update(sum, all);
        }
    };
    let done = |i: usize, o: &Outcome| {
        advance(i, a.periods);
        let line = format!(
            "[{}/{total}] {} {}: metric {:.4}, {:.3} msg/node/period, {} events, state {:.1} MB, \
             peak {} in flight ({:.0} s elapsed)",
            i + 1,
            o.app.name(),
            o.strategy,
            o.metric,
            o.messages_per_node_period,
            o.events,
            o.state_bytes as f64 / 1e6,
            o.peak_in_flight,
            started.elapsed().as_secs_f64()
        );
        if let Ok(g) = periods.lock() {
            g.1.println(&line);
        }
    };
    let progress = |i: usize, d: u64, _: u64| advance(i, d);
    let outcomes = token_account::run_batch(&configs, threads, &done, &progress);
    if let Ok(mut g) = periods.lock() {
        g.1.finish();
    }
    let mut outcomes = outcomes?;
    token_account::compare(&mut outcomes);
    token_account::write_results(&a.out, &outcomes)
        .with_context(|| format!("writing {}", a.out.display()))?;
    if a.json {
        let per_app: Vec<serde_json::Value> = apps
            .iter()
            .map(|&app| {
                let best: Vec<serde_json::Value> = best_by_kind(&outcomes, app)
                    .into_iter()
                    .map(|o| {
                        serde_json::json!({
                            "strategy": o.strategy, "metric": o.metric, "speedup": o.speedup,
                            "messages_per_node_period": o.messages_per_node_period,
                        })
                    })
                    .collect();
                serde_json::json!({"app": app.name(), "metric": app.metric_name(), "best": best})
            })
            .collect();
        let obj = serde_json::json!({
            "experiment": "token-account",
            "seed": a.seed,
            "nodes": a.nodes,
            "periods": a.periods,
            "apps": per_app,
            "runs": outcomes,
            "out": a.out,
        });
        println!("{obj}");
    } else {
        for &app in &apps {
            println!("{} — {}", app.name(), app.metric_name());
            for o in outcomes.iter().filter(|o| o.app == app) {
                let speedup = o
                    .speedup
                    .map_or_else(|| "-".to_string(), |s| format!("{s:.2}×"));
                let tokens = match (o.predicted_tokens, o.predicted_tokens_measured_u) {
                    (Some(p), Some(pu)) => format!(
                        "tokens {:.2} (mean-field {p:.2}; {pu:.2} with measured u = {:.2})",
                        o.mean_tokens, o.useful_fraction
                    ),
                    _ => format!("tokens {:.2}", o.mean_tokens),
                };
                println!(
                    "  {:<26} {:>10.4}  speed-up {:>7}  {:.3} msg/node/period  {tokens}",
                    o.strategy, o.metric, speedup, o.messages_per_node_period
                );
            }
        }
        println!("seed {}; results in {}", a.seed, a.out.display());
    }
    Ok(())
}
