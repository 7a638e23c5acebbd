//! `sluice sim gdrl-ring`, `gdrl-dynamic`, `gdrl-scale`: seed 003 §III-A, B, C on the real
//! `sluice-coord` nodes.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sluice_sim::gdrl::{self, Demand, RunReport, Setup};

use super::progress::Progress;

/// Parameters shared by the three experiments.
#[derive(Debug, clap::Args)]
pub(crate) struct Common {
    /// Slots to simulate.
    #[arg(long)]
    slots: Option<u64>,
    /// Slots per node update cycle (the update interval Δ of seed 003 Fig. 1).
    #[arg(long, default_value_t = 1)]
    slots_per_cycle: u64,
    /// Low-pass filter parameter α (per slot).
    #[arg(long, default_value_t = 1e-3)]
    alpha: f64,
    /// The gain η [default: the stability bound 1/(2d), seed 003 eq. 15].
    #[arg(long)]
    eta: Option<f64>,
    /// Per-message loss probability.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Seed of the arrivals, the network and the random graphs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory for the CSV and SVG files.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON object to stdout instead of text.
    #[arg(long)]
    json: bool,
}

impl Common {
    fn apply(&self, s: &mut Setup) {
        if let Some(v) = self.slots {
            s.slots = v;
        }
        s.slots_per_cycle = self.slots_per_cycle;
        s.alpha = self.alpha;
        s.eta = self.eta;
        s.loss = self.loss;
        s.seed = self.seed;
    }

    fn out(&self, default: &str) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| Path::new("results").join(default))
    }
}

/// Seed 003 §III-A (Figs. 3–4): N limiters on a ring, λ_i = i/(N+1), C = 1.1 Λ, α = 10⁻³,
/// η = 1/4: the indicators q_i = λ̂_i − C_i and their JFI over time.
#[derive(Debug, clap::Args)]
pub(crate) struct RingArgs {
    /// Number of limiters on the ring.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// C / Λ (the paper: 1.1).
    #[arg(long, default_value_t = 1.1)]
    capacity_factor: f64,
    #[command(flatten)]
    common: Common,
}

/// Seed 003 §III-B (Figs. 5–6): the ring with demands that swap abruptly at τ0 and shift
/// back linearly over [2τ0, 3τ0], load 90 %.
#[derive(Debug, clap::Args)]
pub(crate) struct DynamicArgs {
    /// Number of limiters on the ring.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// τ0 in slots (the run lasts 4 τ0).
    #[arg(long, default_value_t = 10_000)]
    tau0: u64,
    #[command(flatten)]
    common: Common,
}

/// Seed 003 §III-C (Fig. 7): random d-regular graphs, N = 10, 100, 1000 and d = 2, 4, 8,
/// η = 1/(2d), load 90 %: JFI(q(t)) for each. N = 1000 with d = 8 dominates the run time
/// (several CPU-minutes at the default 2000 slots).
#[derive(Debug, clap::Args)]
pub(crate) struct ScaleArgs {
    /// Graph sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [10usize, 100, 1000])]
    sizes: Vec<usize>,
    /// Degrees, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8])]
    degrees: Vec<usize>,
    #[command(flatten)]
    common: Common,
}

fn print_run(r: &RunReport) {
    println!(
        "{} ({} nodes), η = {:.4}, α = {}, C/Λ = {:.4}, {} slots ({} per cycle), loss {}, seed {}",
        r.topology,
        r.nodes,
        r.eta,
        r.alpha,
        r.capacity_factor,
        r.slots,
        r.slots_per_cycle,
        r.loss,
        r.seed
    );
    println!(
        "  JFI first {:.4}, final {:.5}, mean of last 10 % {:.5}",
        r.jfi_first, r.jfi_final, r.jfi_mean_last_10pct
    );
    match r.settle_slots_099 {
        Some(s) => println!("  JFI ≥ 0.99 from slot {s} on"),
        None => println!("  JFI never stays ≥ 0.99"),
    }
    println!(
        "  q* = (Λ − C)/N = {:.5}; mean final q = {:.5}",
        r.q_star, r.q_mean_final
    );
    println!(
        "  max (Σ C_i − C)/C = {:.3e} (≤ 0: seed 003 Lemma 1); {:.2} msg, {:.1} bytes per node per cycle",
        r.max_sum_over_limit, r.messages_per_node_per_cycle, r.bytes_per_node_per_cycle
    );
}

pub(crate) fn run_ring(a: RingArgs) -> anyhow::Result<()> {
    let mut s = Setup::ring(a.nodes, a.capacity_factor, Demand::Constant);
    a.common.apply(&mut s);
    eprintln!("gdrl-ring: seed {}", s.seed);
    let mut progress = Progress::new("gdrl-ring", "cycles");
    let out = gdrl::ring(&s, &mut |done, total| progress.update(done, total))?;
    progress.finish();
    let dir = a.common.out("gdrl-ring");
    out.trace
        .write(&dir, s.demand, "seed 003 §III-A")
        .with_context(|| format!("writing to {}", dir.display()))?;
    eprintln!(
        "wrote trace.csv, q.svg, jfi.svg, lambda.svg to {}",
        dir.display()
    );
    if a.common.json {
        println!("{}", serde_json::to_string(&out.report)?);
    } else {
        print_run(&out.report);
    }
    Ok(())
}

pub(crate) fn run_dynamic(a: DynamicArgs) -> anyhow::Result<()> {
    let mut s = Setup::ring(a.nodes, 1.0 / 0.9, Demand::Dynamic { tau0: a.tau0 });
    s.slots = 4 * a.tau0;
    a.common.apply(&mut s);
    eprintln!("gdrl-dynamic: seed {}", s.seed);
    let mut progress = Progress::new("gdrl-dynamic", "cycles");
    let out = gdrl::dynamic(&s, &mut |done, total| progress.update(done, total))?;
    progress.finish();
    let dir = a.common.out("gdrl-dynamic");
    out.trace
        .write(&dir, s.demand, "seed 003 §III-B")
        .with_context(|| format!("writing to {}", dir.display()))?;
    eprintln!(
        "wrote trace.csv, q.svg, jfi.svg, lambda.svg to {}",
        dir.display()
    );
    if a.common.json {
        println!("{}", serde_json::to_string(&out.report)?);
        return Ok(());
    }
    print_run(&out.report.run);
    for p in &out.report.phases {
        let settle = p
            .settle_slots_099
            .map_or("never".to_string(), |v| format!("{v} slots"));
        println!(
            "  [{:>6}, {:>6}) {:<18} JFI min {:.4}, at end {:.5}, ≥ 0.99 after {settle}",
            p.from, p.to, p.demand, p.jfi_min, p.jfi_end
        );
    }
    Ok(())
}

pub(crate) fn run_scale(a: ScaleArgs) -> anyhow::Result<()> {
    let mut s = Setup::regular(10, 2, a.common.seed)?;
    s.slots = 2_000;
    a.common.apply(&mut s);
    eprintln!("gdrl-scale: seed {}", s.seed);
    // Work per cycle grows with N·d (arrivals, messages): the bar weighs each case by it.
    let weight = |n: usize, d: usize| (n * (d + 1)) as u64;
    let all: u64 = a
        .sizes
        .iter()
        .flat_map(|&n| a.degrees.iter().map(move |&d| weight(n, d)))
        .sum();
    let mut progress = Progress::new("gdrl-scale", "work");
    // Work of the cases finished, and the case under way with its weight.
    let (mut before, mut case, mut last_w) = (0u64, usize::MAX, 0u64);
    let out = gdrl::scale(&s, &a.sizes, &a.degrees, &mut |p| {
        let w = weight(p.nodes, p.degree);
        if p.case != case {
            before += last_w * p.cycles;
            (case, last_w) = (p.case, w);
            progress.set_message(p.name);
        }
        progress.update(before + w * p.done, all * p.cycles);
    })?;
    progress.finish();
    let dir = a.common.out("gdrl-scale");
    out.write(&dir)
        .with_context(|| format!("writing to {}", dir.display()))?;
    eprintln!(
        "wrote jfi.csv, cases.csv and jfi-N*.svg to {}",
        dir.display()
    );
    if a.common.json {
        println!("{}", serde_json::to_string(&out.report())?);
        return Ok(());
    }
    println!(
        "seed 003 §III-C: random d-regular graphs, η = 1/(2d), load 90 %, {} slots, seed {}",
        s.slots, s.seed
    );
    println!(
        "  {:<24} {:>8} {:>10} {:>10} {:>14} {:>9}",
        "graph", "η", "JFI final", "JFI mean", "≥0.99 from", "msg/node"
    );
    for (_, _, r) in &out.cases {
        let settle = r
            .settle_slots_099
            .map_or("never".to_string(), |v| format!("slot {v}"));
        println!(
            "  {:<24} {:>8.4} {:>10.5} {:>10.5} {:>14} {:>9.2}",
            r.topology,
            r.eta,
            r.jfi_final,
            r.jfi_mean_last_10pct,
            settle,
            r.messages_per_node_per_cycle
        );
    }
    Ok(())
}
