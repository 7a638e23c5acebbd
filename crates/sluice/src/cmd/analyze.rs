//! `sluice analyze`: convergence, robustness, optimal update cycle and weights of a topology
//! (seed 000 §4–5, seed 003 Thm 1). All the work is in `sluice-graph`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::{Value, json};
use sluice_graph::{
    Analysis, Noise, SolverOptions, Synthesis, Topology, TopologySpec, fastest_weights,
    robust_weights,
};

/// Which weights to synthesise.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Goal {
    /// Smallest Φ_cr: fastest convergence (seed 000 SDP 33).
    Fastest,
    /// Smallest Φ_ss: least mismatch under demand noise (seed 000 SDP 35).
    Robust,
}

/// Arguments of `sluice analyze`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// ring:N, path:N, star:N, complete:N, grid:RxC, random-regular:N:D[:SEED], tree:N[:SEED],
    /// or an edge-list file (`a b [weight]` per line, nodes 0..n).
    #[arg(long, value_name = "SPEC")]
    topology: String,
    /// Link weights to use instead of the topology's: `a b weight` per line.
    #[arg(long, value_name = "FILE")]
    weights: Option<PathBuf>,
    /// Update cycle γ (default: the optimal γ* = 2/(λ2 + λn) of the input weights).
    #[arg(long, value_name = "G")]
    gamma: Option<f64>,
    /// Per-node demand noise σ: Cov(v) = γ·σ²·I (seed 000 Remark 3). Default 1.
    #[arg(long, value_name = "S", conflicts_with = "cov")]
    sigma: Option<f64>,
    /// Covariance matrix of the demand noise: n rows of n numbers.
    #[arg(long, value_name = "FILE")]
    cov: Option<PathBuf>,
    /// Synthesise link weights for the given γ and noise.
    #[arg(long, value_enum)]
    optimize: Option<Goal>,
    /// Write the resulting weights as an edge-list file (usable as a server topology).
    #[arg(long, value_name = "FILE")]
    weights_out: Option<PathBuf>,
    /// Print one JSON object instead of a report.
    #[arg(long)]
    json: bool,
}

fn read(path: &PathBuf, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("{what}: cannot read {}", path.display()))
}

/// Writes the report; a closed pipe (`| head`) is not an error.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// JSON has no ∞: an unstable γ reports `null`.
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    emit(&report(&args)?)
}

/// The whole command except printing: the report as text or JSON.
fn report(args: &Args) -> anyhow::Result<String> {
    let spec: TopologySpec = args.topology.parse().context("--topology")?;
    let mut topology = spec.build().context("--topology")?;
    if let Some(path) = &args.weights {
        topology = topology
            .with_weights_from_edge_list(&read(path, "--weights")?)
            .with_context(|| format!("--weights {}", path.display()))?;
    }
    let noise = match &args.cov {
        Some(path) => Noise::parse_covariance(&read(path, "--cov")?).context("--cov")?,
        None => Noise::Iid {
            sigma: args.sigma.unwrap_or(1.0),
        },
    };
    let input = Analysis::new(&topology, args.gamma, &noise)?;
    let gamma = input.gamma;

    let synthesis = match args.optimize {
        None => None,
        Some(Goal::Fastest) => Some(fastest_weights(&topology, gamma, SolverOptions::default())?),
        Some(Goal::Robust) => Some(robust_weights(
            &topology,
            gamma,
            &noise,
            SolverOptions::default(),
        )?),
    };
    let (final_topology, result) = match &synthesis {
        Some(s) => (
            &s.topology,
            Analysis::new(&s.topology, Some(gamma), &noise)?,
        ),
        None => (&topology, input.clone()),
    };
    if let Some(path) = &args.weights_out {
        std::fs::write(path, final_topology.to_edge_list())
            .with_context(|| format!("--weights-out: cannot write {}", path.display()))?;
    }

    if args.json {
        let report = json_report(
            &spec,
            final_topology,
            &result,
            &input,
            args.optimize,
            &synthesis,
        );
        Ok(serde_json::to_string_pretty(&report)? + "\n")
    } else {
        let mut out = String::new();
        let (a, goal) = (&result, args.optimize);
        text_report(&mut out, &spec, final_topology, a, &input, goal, &synthesis);
        Ok(out)
    }
}

fn json_report(
    spec: &TopologySpec,
    topology: &Topology,
    a: &Analysis,
    input: &Analysis,
    goal: Option<Goal>,
    synthesis: &Option<Synthesis>,
) -> Value {
    let weights: Vec<Value> = topology
        .edges()
        .iter()
        .map(|e| json!({ "a": e.a, "b": e.b, "weight": e.weight }))
        .collect();
    let mut report = json!({
        "topology": spec.to_string(),
        "nodes": a.nodes,
        "edges": topology.edges().len(),
        "lambda2": a.lambda2,
        "lambda_n": a.lambda_n,
        "gamma_opt": a.gamma_opt,
        "phi_cr_at_gamma_opt": a.phi_cr_opt,
        "gamma": a.gamma,
        "gamma_max": a.gamma_max,
        "stable": a.stable,
        "phi_cr": a.phi_cr,
        "phi_ss": num(a.phi_ss),
        "total_effective_resistance": a.total_effective_resistance,
        "gdrl_eta_bound": a.gdrl_eta_bound,
        "weights": weights,
        "centrality": a.centrality.iter().map(|&c| num(c)).collect::<Vec<_>>(),
    });
    if let (Some(goal), Some(s)) = (goal, synthesis) {
        report["optimization"] = json!({
            "goal": match goal { Goal::Fastest => "fastest", Goal::Robust => "robust" },
            "objective": s.objective,
            "lower_bound": s.lower_bound,
            "duality_gap": s.duality_gap,
            "newton_steps": s.newton_steps,
            "cg_iterations": s.cg_iterations,
            "input_phi_cr": input.phi_cr,
            "input_phi_ss": num(input.phi_ss),
        });
    }
    report
}

fn text_report(
    out: &mut String,
    spec: &TopologySpec,
    topology: &Topology,
    a: &Analysis,
    input: &Analysis,
    goal: Option<Goal>,
    synthesis: &Option<Synthesis>,
) {
    let _ = writeln!(
        out,
        "Topology {spec}: {} nodes, {} links",
        a.nodes,
        topology.edges().len()
    );
    let _ = writeln!(out, "  λ2 = {:.6}   λn = {:.6}", a.lambda2, a.lambda_n);
    let _ = writeln!(
        out,
        "  optimal update cycle γ* = 2/(λ2+λn) = {:.6}   (Φ_cr there: {:.6})",
        a.gamma_opt, a.phi_cr_opt
    );
    let _ = writeln!(
        out,
        "  stable for 0 < γ < 2/λn = {:.6}; seed 003 bound on η: {:.6}",
        a.gamma_max, a.gdrl_eta_bound
    );
    let _ = writeln!(out, "At γ = {:.6}:", a.gamma);
    if a.stable {
        let _ = writeln!(
            out,
            "  Φ_cr = {:.6}  (mismatch shrinks by this factor per cycle; ≈{:.1} cycles per e-fold)",
            a.phi_cr,
            -1.0 / a.phi_cr.ln()
        );
        let _ = writeln!(
            out,
            "  Φ_ss = {:.6}  (steady-state dispersion of the p_i under demand noise)",
            a.phi_ss
        );
    } else {
        let _ = writeln!(
            out,
            "  UNSTABLE: Φ_cr = {:.6} ≥ 1, Φ_ss = ∞ (Lemma 2 fails)",
            a.phi_cr
        );
    }
    let _ = writeln!(
        out,
        "  total effective resistance Σ r_ij = {:.6}",
        a.total_effective_resistance
    );
    if a.stable {
        let mut order: Vec<usize> = (0..a.nodes).collect();
        order.sort_by(|&i, &j| a.centrality[j].total_cmp(&a.centrality[i]));
        let top: Vec<String> = order
            .iter()
            .take(5)
            .map(|&i| format!("{i} ({:.4})", a.centrality[i]))
            .collect();
        let _ = writeln!(
            out,
            "  nodes contributing most to Φ_ss (c†_ii): {}",
            top.join(", ")
        );
    }
    if let (Some(goal), Some(s)) = (goal, synthesis) {
        let (name, before) = match goal {
            Goal::Fastest => ("fastest (Φ_cr)", input.phi_cr),
            Goal::Robust => ("most robust (Φ_ss)", input.phi_ss),
        };
        let _ = writeln!(
            out,
            "Optimised weights, {name}: {:.6} → {:.6}",
            before, s.objective
        );
        let _ = writeln!(
            out,
            "  certificate: optimum ≥ {:.6}, duality gap {:.2e} ({} Newton steps)",
            s.lower_bound, s.duality_gap, s.newton_steps
        );
    }
    let edges = topology.edges();
    if edges.len() <= 24 {
        let list: Vec<String> = edges
            .iter()
            .map(|e| format!("{}-{}: {:.4}", e.a, e.b, e.weight))
            .collect();
        let _ = writeln!(out, "Weights: {}", list.join(", "));
    } else {
        let (lo, hi) = edges
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), e| {
                (l.min(e.weight), h.max(e.weight))
            });
        let _ = writeln!(
            out,
            "Weights: {} links, from {lo:.4} to {hi:.4} (all of them: --json or --weights-out)",
            edges.len()
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn run_json(argv: &[&str]) -> Value {
        let cli =
            Cli::try_parse_from(std::iter::once("analyze").chain(argv.iter().copied())).unwrap();
        serde_json::from_str(&report(&cli.args).unwrap()).unwrap()
    }

    /// The JSON contract of `sluice analyze --json`, on seed 000 Example 1 (S5, γ = 1).
    #[test]
    fn json_has_the_contract_fields_and_example_1_values() {
        let v = run_json(&[
            "--topology",
            "star:5",
            "--gamma",
            "1",
            "--optimize",
            "fastest",
            "--json",
        ]);
        for key in [
            "lambda2",
            "lambda_n",
            "gamma_opt",
            "phi_cr",
            "phi_ss",
            "total_effective_resistance",
            "weights",
            "centrality",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!((v["phi_cr"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-6);
        for w in v["weights"].as_array().unwrap() {
            assert!((w["weight"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-3);
        }
        assert_eq!(v["centrality"].as_array().unwrap().len(), 5);
        assert!(v["optimization"]["duality_gap"].as_f64().unwrap() < 1e-5);
    }

    /// `--sigma S` is Cov(v) = γ·S²·I (seed 000 Remark 3): eq. 24 on K4 at γ = 0.25 gives
    /// Σ S²/(λ(2 − γλ)) = 3·4/(4·1) = 3 for S = 2.
    #[test]
    fn sigma_means_remark_3_covariance_and_unstable_gamma_gives_null() {
        let v = run_json(&[
            "--topology",
            "complete:4",
            "--gamma",
            "0.25",
            "--sigma",
            "2",
            "--json",
        ]);
        assert!((v["phi_ss"].as_f64().unwrap() - 3.0).abs() < 1e-9);
        let u = run_json(&["--topology", "complete:4", "--gamma", "0.6", "--json"]);
        assert!(u["phi_ss"].is_null() && u["stable"] == Value::Bool(false));
    }

    #[test]
    fn sigma_and_cov_conflict_and_bad_specs_are_errors() {
        let both = [
            "analyze",
            "--topology",
            "ring:4",
            "--sigma",
            "1",
            "--cov",
            "c.txt",
        ];
        assert!(Cli::try_parse_from(both).is_err());
        let cli = Cli::try_parse_from(["analyze", "--topology", "ring:2"]).unwrap();
        let e = report(&cli.args).unwrap_err();
        assert!(format!("{e:#}").contains("at least 3 nodes"), "{e:#}");
    }
}
