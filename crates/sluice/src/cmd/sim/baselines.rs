//! `sluice sim baselines`: Sluice side by side with static split, GRD, FPS, a central token
//! bucket, owner forwarding (Gubernator GLOBAL), Doorman-style leases and the published DST
//! law, on the `sluice sim cluster` workloads.

use std::path::PathBuf;

use anyhow::Context as _;
use sluice_graph::TopologySpec;
use sluice_sim::baselines::{Baseline, Setup, run as compare};
use sluice_sim::cluster::Workload;

use super::progress::Progress;

/// Every strategy on every workload, with and without message loss: over-throttling,
/// overshoot, JFI, messages and bytes per node per second. Same seed ⇒ the same table.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Communication graph of Sluice and dst-sync (see `sluice sim cluster --help`); the
    /// other strategies only use its node count.
    #[arg(long, default_value = "ring:10")]
    topology: TopologySpec,
    /// Workloads, comma-separated: steady, skewed, shift, hotspot, paper-ex2 [default: all].
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Strategies, comma-separated: sluice, dst-sync, static, grd, fps, central, owner,
    /// doorman [default: all].
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<Baseline>,
    /// Loss probabilities, comma-separated (every run once per value).
    #[arg(long, value_delimiter = ',', default_values_t = [0.0, 0.1])]
    loss: Vec<f64>,
    /// Cycles of 100 ms per run.
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// The global limit L per cycle.
    #[arg(long, default_value_t = 10_000)]
    limit: u64,
    /// Seed of everything random.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory for baselines.csv and the charts.
    #[arg(long, default_value = "results/baselines")]
    out: PathBuf,
    /// Print one JSON object to stdout instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let mut s = Setup::new(a.topology);
    if !a.workloads.is_empty() {
        s.workloads = a.workloads;
    }
    if !a.strategies.is_empty() {
        s.strategies = a.strategies;
    }
    s.losses = a.loss;
    s.cycles = a.cycles;
    s.limit = a.limit;
    s.seed = a.seed;
    eprintln!("baselines: seed {}", s.seed);
    let mut progress = Progress::new("baselines", "runs");
    let table = compare(&s, &mut |done, total| {
        progress.update(done as u64, total as u64);
    })?;
    progress.finish();
    table
        .write(&a.out)
        .with_context(|| format!("writing to {}", a.out.display()))?;
    eprintln!("wrote baselines.csv and charts to {}", a.out.display());
    if a.json {
        println!("{}", serde_json::to_string(&table)?);
        return Ok(());
    }
    println!(
        "{} ({} nodes), L = {} per 100 ms cycle, {} cycles, seed {}",
        table.topology, table.nodes, table.limit, table.cycles, table.seed
    );
    println!(
        "| workload | loss | strategy | over-throttling % | overshoot % | JFI | msg/node/s | bytes/node/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &table.rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.4} | {:.1} | {:.0} |",
            r.workload,
            r.loss,
            r.strategy,
            r.over_throttling_pct,
            r.overshoot_pct,
            r.jfi_final,
            r.messages_per_node_per_s,
            r.bytes_per_node_per_s
        );
    }
    Ok(())
}
