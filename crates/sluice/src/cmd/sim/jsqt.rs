//! `sluice sim jsqt`: JSQ / JSQT overload balancing on a slotted server farm (seed 001 §V).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use sluice_balance::{Farm, PolicyKind};
use sluice_sim::jsqt::{self, Config, Outcome, Preset};

use super::progress::Progress;

/// Simulate a farm (or one of seed 001's cases with --preset) and compare the empirical
/// overflow q with the optimum q_opt of the same α-fair penalty.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// One of seed 001 §V's cases, at the paper's sizes: a-symmetric, a-weighted,
    /// a-alpha-sweep, b-bursty, c-two-balancers. Only --seed, --slots, --out and --json
    /// apply on top of a preset.
    #[arg(long)]
    preset: Option<Preset>,
    /// The farm and the policy (boxed: it is the bulk of the arguments).
    #[command(flatten)]
    farm: Box<FarmArgs>,
    /// Slots to simulate (default 10^5; presets default to the paper's sizes).
    #[arg(long)]
    slots: Option<u64>,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for summary.csv, trace.csv, workload.svg, backlog.svg
    /// (default results/jsqt/<preset or "custom">).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON object to stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// A farm described by flags.
#[derive(Debug, clap::Args)]
struct FarmArgs {
    /// Server capacities c_s (work per slot), comma-separated.
    #[arg(long, value_delimiter = ',')]
    capacities: Vec<f64>,
    /// Mean job arrivals per slot at each balancer, comma-separated.
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// Reachable servers per balancer, 1-based: "1,2;2" is S_1 = {1,2}, S_2 = {2}.
    /// Default: every balancer reaches every server.
    #[arg(long)]
    reach: Option<String>,
    /// Penalty weights ξ_s, comma-separated (default all 1).
    #[arg(long, value_delimiter = ',')]
    weights: Vec<f64>,
    /// α of the penalty (q/ξ)^{1+α}/(1+α) [default: 1].
    #[arg(long)]
    alpha: Option<f64>,
    /// V of the virtual-queue mechanism [default: 100].
    #[arg(long)]
    v: Option<f64>,
    /// y_max (default B_max times a far tail of the per-slot arrivals).
    #[arg(long)]
    y_max: Option<f64>,
    /// Alternate the rates with these every --period slots (bursty arrivals, §V-B).
    #[arg(long, value_delimiter = ',')]
    rates_high: Vec<f64>,
    /// Alternation period in slots [default: 250].
    #[arg(long)]
    period: Option<u64>,
    /// jsqt or jsq [default: jsqt].
    #[arg(long)]
    policy: Option<PolicyKind>,
}

fn custom(a: &FarmArgs, slots: Option<u64>, seed: u64) -> anyhow::Result<Config> {
    if a.capacities.is_empty() || a.rates.is_empty() {
        bail!("give --capacities and --rates (or a --preset)");
    }
    let servers = a.capacities.len();
    let reach = match &a.reach {
        Some(text) => Farm::parse_reach(text, servers).context("--reach")?,
        None => vec![(0..servers).collect(); a.rates.len()],
    };
    if reach.len() != a.rates.len() {
        bail!(
            "--reach names {} balancers but --rates has {}",
            reach.len(),
            a.rates.len()
        );
    }
    let weights = if a.weights.is_empty() {
        vec![1.0; servers]
    } else {
        a.weights.clone()
    };
    let policy = a.policy.unwrap_or_default();
    Ok(Config {
        label: policy.to_string(),
        reach,
        rates_high: (!a.rates_high.is_empty()).then(|| a.rates_high.clone()),
        period: a.period.unwrap_or(250),
        weights,
        alpha: a.alpha.unwrap_or(1.0),
        v: a.v.unwrap_or(100.0),
        y_max: a.y_max,
        slots: slots.unwrap_or(100_000),
        seed,
        policy,
        ..Config::new(a.capacities.clone(), a.rates.clone())
    })
}

fn fmt(xs: &[f64]) -> String {
    let parts: Vec<String> = xs.iter().map(|x| format!("{x:.4}")).collect();
    format!("({})", parts.join(", "))
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let (name, configs) = match a.preset {
        Some(p) => {
            let f = &a.farm;
            let farm_flags = !(f.capacities.is_empty()
                && f.rates.is_empty()
                && f.reach.is_none()
                && f.weights.is_empty()
                && f.rates_high.is_empty());
            let knobs = f.alpha.is_some()
                || f.v.is_some()
                || f.y_max.is_some()
                || f.period.is_some()
                || f.policy.is_some();
            if farm_flags || knobs {
                bail!(
                    "--preset fixes the farm and the policy; only --seed, --slots, --out and --json \
                     apply (describe the farm with flags instead to change anything else)"
                );
            }
            let mut cs = p.configs(a.seed);
            if let Some(slots) = a.slots {
                cs.iter_mut().for_each(|c| c.slots = slots);
            }
            (p.to_string(), cs)
        }
        None => (
            "custom".to_string(),
            vec![custom(&a.farm, a.slots, a.seed)?],
        ),
    };
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(configs.len());
    for c in &configs {
        let label = c.label.clone();
        let mut progress = Progress::new(format!("jsqt {label}"), "slots");
        let o = jsqt::run(c, &mut |done, total| progress.update(done, total));
        progress.finish();
        outcomes.push(o.with_context(|| format!("run {label}"))?);
    }
    let dir = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join("jsqt").join(&name));
    jsqt::write_results(&dir, &format!("sluice sim jsqt {name}"), &outcomes)?;
    let Some(first) = outcomes.first() else {
        bail!("no runs")
    };
    if a.json {
        let obj = serde_json::json!({
            "experiment": "jsqt",
            "preset": name,
            "seed": a.seed,
            "q": first.q,
            "q_opt": first.q_opt,
            "throughput": first.throughput,
            "throughput_opt": first.throughput_opt,
            "runs": outcomes,
            "out": dir,
        });
        println!("{obj}");
    } else {
        for o in &outcomes {
            println!(
                "{}: q = {}  q_opt = {}  throughput = {:.4} (max {:.4}, demand {:.4})  mean backlog = {:.1}",
                o.config.label,
                fmt(&o.q),
                fmt(&o.q_opt),
                o.throughput,
                o.throughput_opt,
                o.demand,
                o.mean_backlog
            );
        }
        println!("results in {}", dir.display());
    }
    Ok(())
}
