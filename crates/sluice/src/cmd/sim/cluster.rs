//! `sluice sim cluster`: real `sluice-coord` nodes on a seeded in-memory network
//! (seeds 000 §6, 003 §III), side by side with the published law and a static split.

use std::path::PathBuf;

use anyhow::Context as _;
use sluice_graph::TopologySpec;
use sluice_sim::cluster::{
    Crash, Gain, MeasureKind, Outcome, Pacing, Partition, Scenario, Strategy, Workload,
    run as simulate,
};

use super::progress::Progress;

/// Run N real Sluice nodes (or a baseline) on a deterministic, seeded in-memory network with
/// a workload of clients per node, and report over-throttling, overshoot, conservation,
/// fairness, convergence and traffic. Same flags and seed ⇒ byte-identical JSON.
///
/// Times (T, RESTART_T, T1, T2) are in cycles of 100 ms.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Number of nodes (checked against the topology).
    #[arg(long)]
    nodes: Option<usize>,
    /// ring:N, path:N, star:N, complete:N, grid:RxC, random-regular:N:D, tree:N (random
    /// tree from the seed), or the path of an edge-list file (`a b [weight]` per line).
    #[arg(long)]
    topology: TopologySpec,
    /// sluice: the real nodes (gifts on monotone counters, quorum leases, fences, audits).
    /// dst-sync: seed 000 eq. 3 in synchronous rounds, as published.
    /// static: L/N each, never moves.
    #[arg(long, default_value = "sluice")]
    strategy: Strategy,
    /// throttled (seed 000 Table 1 Case I, r − x), ratio (Case II, (r − x)/r), log-ratio
    /// (Case III, ln(r/x)), allowed (Case IV, x), spare (seed 003 eq. 14, the Case I law),
    /// response-time (seed 003 §III, 1/(x − r); default --limit 10^7 because capacity
    /// moves in whole units).
    #[arg(long, default_value = "throttled")]
    measure: MeasureKind,
    /// steady: constant, uneven, node i ∝ i+1, total 0.9·L (seed 003 §III-A).
    /// skewed: constant, Zipf(1) over a seeded order of the nodes, total 1.2·L.
    /// shift: seed 003 §III-B with τ0 = cycles/4: steady, an abrupt swap at τ0, a linear
    /// shift back over [2τ0, 3τ0], total 0.9·L.
    /// hotspot: idle, then from cycle 10 all demand, 2·L, at node 0.
    /// paper-ex2: seed 000 §6 Example 2's shape: 100 clients per node, each a random
    /// sinusoidal usage curve, times a slow per-node curve; total wandering around L.
    #[arg(long, default_value = "steady")]
    workload: Workload,
    /// Cycles to simulate.
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// Seed of everything random (network, workload, random topologies without a seed).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The gain γ, or `auto` (seed 000 Thm 2's 2/(λ2+λn), capped at the stable gain).
    /// Default: the largest stable gain, min_slope/(2·max degree) (seed 003 eq. 9, 15).
    #[arg(long)]
    gamma: Option<Gain>,
    /// The global limit L in requests per cycle [default: 10000; 10^7 for
    /// response-time].
    #[arg(long)]
    limit: Option<u64>,
    /// Capacity units per request K, as `sluice serve` gives every limit 2^20 units: the
    /// sluice nodes (and the static split) divide K·L units and a node holding u units
    /// admits floor(u/K) requests. Demand, admissions and the report stay in requests.
    /// With 1, a unit is a request and capacity moves in whole requests, which stalls a
    /// cluster whose nodes hold few (e.g. 1,000 nodes at L = 10000). K·L ≤ 2^53;
    /// dst-sync takes only 1.
    #[arg(long, default_value_t = 1)]
    units_per_request: u64,
    /// Probability that a message is lost.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability that a message is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Reorder messages: without --delay-ms, each message is delayed by up to one cycle.
    #[arg(long)]
    reorder: bool,
    /// Largest message delay in ms; each message is delayed uniformly in [0, D], so
    /// messages overtake each other.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// T:NODE[:RESTART_T]: NODE crashes at cycle T (and restarts at RESTART_T). Repeatable.
    #[arg(long)]
    crash: Vec<Crash>,
    /// T1-T2:NODES: cut NODES (comma-separated) off from the others from cycle T1 to T2.
    /// Repeatable; one cut at a time.
    #[arg(long)]
    partition: Vec<Partition>,
    /// Message pacing of the Sluice nodes' links (seed 004): none (a message every cycle,
    /// never reactive), proactive, simple:C, generalized:A:C or randomized:A:C. The
    /// default simple:2 sends one message per link and cycle on average, and news at once.
    #[arg(long, default_value_t = Pacing::DEFAULT)]
    pacing: Pacing,
    /// Turn off the relay of spare capacity toward unmet demand (the plain law).
    #[arg(long)]
    no_relay: bool,
    /// Time constant of the nodes' demand filter, in cycles (seed 003 §III).
    #[arg(long, default_value_t = 5.0)]
    demand_tau: f64,
    /// Write cluster.csv (per cycle) and cluster.svg (demand, ideal, accepted, Σ enforced)
    /// to this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print one JSON object to stdout instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let mut s = Scenario::new(args.topology, args.strategy, args.workload);
    s.nodes = args.nodes;
    s.measure = args.measure;
    s.cycles = args.cycles;
    s.seed = args.seed;
    s.gain = args.gamma.unwrap_or(Gain::Stable);
    s.limit = args.limit;
    s.units_per_request = args.units_per_request;
    s.loss = args.loss;
    s.dup = args.dup;
    s.reorder = args.reorder;
    s.delay_ms = args.delay_ms;
    s.crashes = args.crash;
    s.partitions = args.partition;
    s.pacing = args.pacing;
    s.relay = !args.no_relay;
    s.demand_tau_cycles = args.demand_tau;
    let mut progress = Progress::new("cluster", "cycles");
    let out = run_scenario(&s, &mut |done, total| progress.update(done, total))?;
    progress.finish();
    if let Some(dir) = &args.out {
        out.write(dir)
            .with_context(|| format!("writing to {}", dir.display()))?;
        eprintln!("wrote cluster.csv and cluster.svg to {}", dir.display());
    }
    let r = &out.report;
    if args.json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    println!(
        "{} on {} ({} nodes), measure {}, workload {}, {} cycles, seed {}, γ = {:.4}, L = {}{}",
        r.strategy,
        r.topology,
        r.nodes,
        r.measure,
        r.workload,
        r.cycles,
        r.seed,
        r.gamma,
        r.limit,
        if r.units_per_request == 1 {
            String::new()
        } else {
            format!(" ({} units per request)", r.units_per_request)
        }
    );
    if r.strategy == Strategy::Sluice {
        println!(
            "  pacing {}, relay {}",
            r.pacing,
            if r.relay { "on" } else { "off" }
        );
    }
    println!(
        "  over-throttling        {:8.3} %   (seed 000 §6)",
        r.over_throttling_pct
    );
    println!("  overshoot              {:8.3} %", r.overshoot_pct);
    println!(
        "  max (Σ enforced − L)/L {:8.4}     (≤ 0: conservation held)",
        r.max_share_sum_over_limit
    );
    println!(
        "  JFI(final indicators)  {:8.4}     (seed 003 eq. 16)",
        r.jfi_final
    );
    match r.converge_cycles {
        Some(c) => println!("  converged after        {c:8} cycles"),
        None => println!("  converged              never (or demand never settles)"),
    }
    println!(
        "  traffic                {:8.2} msg, {:.1} bytes per node per cycle",
        r.messages_per_node_per_cycle, r.bytes_per_node_per_cycle
    );
    Ok(())
}

fn run_scenario(s: &Scenario, progress: &mut dyn FnMut(u64, u64)) -> anyhow::Result<Outcome> {
    Ok(simulate(s, progress)?)
}
