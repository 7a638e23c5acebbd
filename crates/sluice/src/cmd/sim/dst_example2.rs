//! `sluice sim dst-example2`: seed 000 §6 Example 2 (Tables 3–4, Fig. 5).

use std::path::PathBuf;

use anyhow::Context as _;
use sluice_sim::dst_example2::{Params, run as simulate};

use super::progress::Progress;

/// Seed 000 §6 Example 2: 10 servers with 100 clients each, 1,000 cycles of a random usage
/// curve, on a tree (graph #1) and the tree with added links (graph #2), at γ = 0.02 and γ*.
/// Reports Ψ_cr, Ψ_ss and over-throttling for the published law (dst-sync), Sluice and a
/// static split, next to the paper's numbers. Same flags ⇒ the same output.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Cycles to simulate (the paper: 1,000).
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// Seed of the usage curve and of the nodes' randomness.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The global limit L in capacity units per cycle.
    #[arg(long, default_value_t = 10_000)]
    limit: u64,
    /// Directory for summary.csv, trace.csv and accepted.svg [default: results/dst-example2].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON object to stdout instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let p = Params {
        cycles: args.cycles,
        seed: args.seed,
        limit: args.limit,
    };
    let mut progress = Progress::new("dst-example2", "cycles");
    let out = simulate(&p, &mut |done, total| progress.update(done, total))?;
    progress.finish();
    let dir = args
        .out
        .unwrap_or_else(|| PathBuf::from("results").join("dst-example2"));
    out.write(&dir)
        .with_context(|| format!("writing to {}", dir.display()))?;
    eprintln!(
        "wrote summary.csv, trace.csv and accepted.svg to {}",
        dir.display()
    );
    if args.json {
        println!("{}", serde_json::to_string(&out.summary(&dir))?);
        return Ok(());
    }
    println!(
        "seed 000 Example 2: 10 servers, 100 clients each, {} cycles, seed {}, L = {}",
        p.cycles, p.seed, p.limit
    );
    println!(
        "γ*: graph #1 {:.4} (paper 0.4226), graph #2 {:.4} (paper 0.2222)",
        out.gamma_opt[0], out.gamma_opt[1]
    );
    println!(
        "{:<7} {:<9} {:<7} {:>7} {:>8} {:>10} {:>9} {:>8}  paper (Ψ_cr / Ψ_ss / over-thr.)",
        "graph", "strategy", "asked", "γ", "Ψ_cr", "Ψ_ss", "over-thr", "msg/n/c"
    );
    for r in &out.rows {
        let paper = match (r.paper_psi_cr, r.paper_psi_ss, r.paper_over_throttling_pct) {
            (Some(cr), Some(ss), Some(ot)) => format!("{cr:.4} / {ss:.1} / {ot:.1} %"),
            (Some(cr), Some(ss), None) => format!("{cr:.4} / {ss:.1}"),
            _ => String::new(),
        };
        println!(
            "{:<7} {:<9} {:<7} {:>7.4} {:>8.4} {:>10.2} {:>8.2}% {:>8.2}  {paper}",
            r.graph,
            r.strategy,
            r.gamma_label,
            r.gamma,
            r.psi_cr,
            r.psi_ss,
            r.over_throttling_pct,
            r.messages_per_node_per_cycle
        );
    }
    println!("results in {}", dir.display());
    Ok(())
}
