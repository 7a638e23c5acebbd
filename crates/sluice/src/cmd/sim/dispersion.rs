//! `sluice sim dispersion`: Monte-Carlo Φ_ss next to seed 000 eq. 24 and eq. 20.

use anyhow::Context as _;
use sluice_graph::TopologySpec;
use sluice_sim::dispersion::{Params, run as simulate};

/// Seed 000 §4.2: runs p(k+1) = (I − γL) p(k) + v(k+1) with the production share law and
/// demand steps v ~ N(0, γσ²·I) (Remark 3), measures the steady-state dispersion
/// Σ_i (p_i − p̄)² as a time average after the warm-up, and prints it next to the closed forms
/// eq. 24 (eigenvalues) and eq. 20 (trace form), with the relative errors. Same flags ⇒ the
/// same output.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// ring:N, path:N, star:N, complete:N, grid:RxC, random-regular:N:D[:SEED], tree:N[:SEED],
    /// or an edge-list file (`a b [weight]` per line). Random kinds without a SEED use --seed.
    #[arg(long, value_name = "SPEC")]
    topology: String,
    /// Update cycle γ, or `auto` for γ* = 2/(λ2 + λn) (seed 000 Thm 2).
    #[arg(long, value_name = "G|auto", default_value = "auto")]
    gamma: String,
    /// Per-node demand noise σ: Cov(v) = γ·σ²·I.
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    sigma: f64,
    /// Cycles averaged after the warm-up.
    #[arg(long, value_name = "K", default_value_t = 200_000)]
    cycles: u64,
    /// Cycles discarded before averaging.
    #[arg(long, value_name = "W", default_value_t = 10_000)]
    warmup: u64,
    /// Seed of the demand noise (and of a random topology without its own seed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let spec: TopologySpec = args.topology.parse().context("--topology")?;
    let topology = spec.build_seeded(Some(args.seed)).context("--topology")?;
    let gamma = match args.gamma.as_str() {
        "auto" => None,
        g => Some(
            g.parse::<f64>()
                .with_context(|| format!("--gamma: `{g}` is neither a number nor `auto`"))?,
        ),
    };
    let p = Params {
        gamma,
        sigma: args.sigma,
        cycles: args.cycles,
        warmup: args.warmup,
        seed: args.seed,
    };
    let r = simulate(&topology, &p)?;
    let text = if args.json {
        let mut v = serde_json::to_value(&r)?;
        v["topology"] = serde_json::Value::from(args.topology.clone());
        serde_json::to_string(&v)? + "\n"
    } else {
        format!(
            "seed 000 Φ_ss on {} ({} nodes, {} links): γ = {:.6}{}, Φ_cr = {:.4}, σ = {}\n\
             {} cycles after {} warm-up cycles, seed {}\n\
             measured (Monte-Carlo) {:>12.6} ± {:.6} (1 s.e.)\n\
             eq. 24 (Remark 3)      {:>12.6}   relative error {:+.2} %\n\
             eq. 20 (Thm 1, trace)  {:>12.6}   relative error {:+.2} %\n",
            args.topology,
            r.nodes,
            r.links,
            r.gamma,
            if gamma.is_none() { " (γ*)" } else { "" },
            r.phi_cr,
            r.sigma,
            r.cycles,
            r.warmup,
            r.seed,
            r.phi_ss_measured,
            r.std_error,
            r.phi_ss_eq24,
            100.0 * r.rel_err_eq24,
            r.phi_ss_eq20,
            100.0 * r.rel_err_eq20,
        )
    };
    emit(&text)
}

/// Writes the report; a closed pipe (`| head`) is not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
