//! `sluice demo`: the README's main job. By default a real 5-node cluster on loopback
//! (`sluice_loadgen::demo`); `--algorithms` shows the standalone algorithms on a bursty trace.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use sluice_limits::Limit;
use sluice_loadgen::demo::{self, DemoSpec};
use sluice_sim::chart::LineChart;
use sluice_sim::showcase;

/// Arguments of `sluice demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    /// The global limit, requests per second, that the nodes divide among themselves.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Seconds per demand phase (four phases).
    #[arg(long, default_value_t = 14)]
    phase_seconds: u64,
    /// Where to write demo.csv and demo.svg.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Show the standalone limiting algorithms on one bursty trace instead (no cluster).
    #[arg(long)]
    algorithms: bool,
    /// With --algorithms: seed of the generated traffic (same seed, same output).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// With --algorithms: the limit every algorithm enforces, as N/DURATION.
    #[arg(long, default_value = "100/1s")]
    limit: String,
    /// With --algorithms: seconds of traffic.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// How the nodes divide the limit: `max-min` (the default of cluster rules),
    /// `throttled` (seed 000 Case I) or `ratio` (Case II).
    #[arg(long, default_value = "max-min")]
    fairness: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    if args.algorithms {
        return algorithms(&args);
    }
    cluster(&args)
}

fn cluster(args: &Args) -> anyhow::Result<()> {
    let spec = DemoSpec {
        nodes: args.nodes,
        limit: args.rate,
        phase_seconds: args.phase_seconds,
        cycle: Duration::from_millis(50),
        fairness: match args.fairness.as_str() {
            "max-min" | "max_min" => sluice_server::config::Fairness::MaxMin,
            "throttled" => sluice_server::config::Fairness::Throttled,
            "ratio" => sluice_server::config::Fairness::Ratio,
            other => anyhow::bail!("--fairness {other}: expected max-min, throttled or ratio"),
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let quiet = args.json;
    if !quiet {
        println!(
            "Sluice demo: {} nodes on 127.0.0.1 (gRPC + HTTP + UDP peers each), one rule of {}/s \
             shared by all,\nopen-loop gRPC load per node; demand moves between nodes every {} s.\n",
            spec.nodes, spec.limit, spec.phase_seconds
        );
        let shares: String = (0..spec.nodes).map(|i| format!(" node{i:<2}")).collect();
        println!(
            "{:>4} {:>8} {:>8} {:>6}  share of the limit:{shares}",
            "t(s)", "offered", "admitted", "limit"
        );
    }
    let mut phase_seen = usize::MAX;
    let report = runtime.block_on(demo::run(&spec, |row, phase| {
        if quiet {
            return;
        }
        if row.phase != phase_seen {
            phase_seen = row.phase;
            println!("-- phase {}: {}", row.phase + 1, phase.name);
        }
        let shares: String = row
            .shares
            .iter()
            .map(|s| format!(" {:>6.1}%", s * 100.0))
            .collect();
        println!(
            "{:>4} {:>8} {:>8} {:>6}  {:>18}{shares}",
            row.t, row.offered, row.admitted, row.limit, ""
        );
        let _ = std::io::stdout().flush();
    }))?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv_path = args.out.join("demo.csv");
    let mut csv = String::from("t,phase,offered,admitted,limit");
    for i in 0..report.nodes {
        csv.push_str(&format!(",share_{i},admitted_{i}"));
    }
    // Appended, so the columns before keep their places.
    csv.push_str(",decision_p50_us,decision_p99_us\n");
    for r in &report.rows {
        csv.push_str(&format!(
            "{},{},{},{},{}",
            r.t,
            r.phase + 1,
            r.offered,
            r.admitted,
            r.limit
        ));
        for (s, a) in r.shares.iter().zip(&r.node_admitted) {
            csv.push_str(&format!(",{s:.6},{a}"));
        }
        let us = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.3}"));
        csv.push_str(&format!(
            ",{},{}\n",
            us(r.decision_p50_us),
            us(r.decision_p99_us)
        ));
    }
    std::fs::write(&csv_path, csv)
        .with_context(|| format!("cannot write {}", csv_path.display()))?;
    let svg_path = args.out.join("demo.svg");
    let pts = |f: &dyn Fn(&demo::SecondRow) -> f64| -> Vec<(f64, f64)> {
        report.rows.iter().map(|r| (r.t as f64, f(r))).collect()
    };
    let mut chart = LineChart::new(
        format!(
            "sluice demo: {} nodes sharing {}/s",
            report.nodes, report.limit
        ),
        "seconds",
        "requests per second",
    )
    .series("offered", pts(&|r| r.offered as f64))
    .series("admitted (all nodes)", pts(&|r| r.admitted as f64))
    .series("global limit", pts(&|r| r.limit as f64));
    for i in 0..report.nodes {
        chart = chart.series(
            format!("node {i} admitted"),
            pts(&|r| r.node_admitted[i] as f64),
        );
    }
    chart
        .write(&svg_path)
        .with_context(|| format!("cannot write {}", svg_path.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "\nSummary ({} nodes, limit {}/s, {} s):",
        report.nodes,
        report.limit,
        report.rows.len()
    );
    println!(
        "  {:<40} {:>10.2}%",
        "over-throttling (seed 000 §6)", report.over_throttling_pct
    );
    println!(
        "  {:<40} {:>10.2}%",
        "overshoot above the global limit", report.overshoot_pct
    );
    println!(
        "  {:<40} {:>11.0}",
        "decisions per second (all nodes)", report.decisions_per_s
    );
    match report.decision_latency {
        Some(d) => {
            println!(
                "  {:<40} {:>9.2} µs",
                "p50 decision latency (in the nodes)", d.p50_us
            );
            println!(
                "  {:<40} {:>9.2} µs",
                "p99 decision latency (in the nodes)", d.p99_us
            );
        }
        None => println!(
            "  {:<40} {:>11}",
            "decision latency (in the nodes)", "unknown"
        ),
    }
    println!(
        "  {:<40} {:>9.0} µs",
        "p50 latency (gRPC round trip)", report.latency.p50_us
    );
    println!(
        "  {:<40} {:>9.0} µs",
        "p99 latency (gRPC round trip)", report.latency.p99_us
    );
    println!(
        "  {:<40} {:>11.1}",
        "peer messages per node per second", report.peer_messages_per_node_per_s
    );
    println!(
        "  {:<40} {:>11.0}",
        "peer bytes per node per second", report.peer_bytes_per_node_per_s
    );
    println!("  {:<40} {:>11}", "errors", report.errors);
    println!("\nWrote {} and {}.", csv_path.display(), svg_path.display());
    println!(
        "Run the daemon yourself: sluice serve --config FILE (single node), or with \
         --node-id/--peers for a cluster."
    );
    Ok(())
}

fn algorithms(args: &Args) -> anyhow::Result<()> {
    let limit: Limit = args.limit.parse().context("--limit")?;
    anyhow::ensure!(
        args.seconds >= 2,
        "--seconds must be at least 2 (got {})",
        args.seconds
    );
    let report = showcase::compare_algorithms(args.seed, limit, args.seconds);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "One key, limit {} per {} ms, {} requests over {} s (seed {}):",
        report.limit,
        report.period_ns / 1_000_000,
        report.requests,
        args.seconds,
        report.seed
    );
    println!(
        "steady demand at 30% of the limit, plus a burst across every other window boundary.\n"
    );
    println!(
        "{:<20} {:>9} {:>9} {:>22}",
        "algorithm", "admitted", "refused", "most in any window"
    );
    for r in &report.rows {
        let over = r.max_in_any_window as f64 / report.limit as f64;
        println!(
            "{:<20} {:>9} {:>9} {:>12} ({:>4.2}× limit)",
            r.algorithm, r.admitted, r.refused, r.max_in_any_window, over
        );
    }
    println!(
        "\nThe fixed window lets close to twice the limit through across a boundary (seed 002 §3.1);\n\
         the sliding log never lets more than the limit through in any window (§3.5).\n\
         Replay your own traffic: sluice replay --algorithm ALG --limit N/DURATION --trace FILE"
    );
    Ok(())
}
