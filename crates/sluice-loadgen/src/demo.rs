//! `sluice demo`: a real cluster on loopback. Five nodes (each a full [`Daemon`]: gRPC,
//! HTTP, peer transport over UDP, all on 127.0.0.1), one `coordination: cluster` rule, and
//! gRPC load generators ([`crate`], Envoy's own client) whose skewed demand moves
//! between nodes. Every second it reports the global admitted rate against the limit and
//! each node's share; at the end, over-throttling and overshoot (as `sluice sim cluster`
//! defines them, seed 000 §6), decisions per second and latency: the decision latency inside
//! the nodes (their `sluice_decision_duration_seconds` histograms, read in process from each
//! node's metrics registry, what its `/metrics` shows) and the gRPC round trip the load
//! generators saw.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use sluice_server::cluster::{ClusterSpec, PeerSpec};
use sluice_server::config::ConfigSource;
use sluice_server::daemon::{Daemon, DaemonError, DaemonSpec};
use sluice_server::metrics::{Api, DecisionHistogram};
use sluice_server::peer::PeerKey;

use crate::{LoadError, LoadSpec, Stop, Target};

/// What to run.
#[derive(Debug, Clone)]
pub struct DemoSpec {
    /// Nodes (at least 2).
    pub nodes: usize,
    /// The global limit, requests per second.
    pub limit: u32,
    /// Length of each of the four demand phases, seconds.
    pub phase_seconds: u64,
    /// The update cycle.
    pub cycle: Duration,
    /// How the nodes divide the limit (the rule's `fairness`).
    pub fairness: sluice_server::config::Fairness,
}

impl Default for DemoSpec {
    fn default() -> Self {
        Self {
            nodes: 5,
            limit: 1_000,
            phase_seconds: 14,
            cycle: Duration::from_millis(50),
            fairness: sluice_server::config::Fairness::default(),
        }
    }
}

/// A demand phase: total offered load (× the limit) and how it splits over the nodes.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Name shown in the progress.
    pub name: String,
    /// Offered load as a multiple of the limit.
    pub load: f64,
    /// Relative weights per node.
    pub weights: Vec<f64>,
}

/// The demo's phases for `n` nodes: skew on node 0, a shift to the last node, demand under
/// the limit (nobody should be throttled), and a return to overload spread unevenly.
#[must_use]
pub fn phases(n: usize) -> Vec<Phase> {
    let zipf: Vec<f64> = (0..n).map(|i| 1.0 / (i + 1) as f64).collect();
    let reversed: Vec<f64> = zipf.iter().rev().copied().collect();
    let ramp: Vec<f64> = (0..n).map(|i| (i + 1) as f64).collect();
    vec![
        Phase {
            name: "overload, skewed to node 0".into(),
            load: 1.5,
            weights: zipf.clone(),
        },
        Phase {
            name: "demand shifts to the last node".into(),
            load: 1.5,
            weights: reversed,
        },
        Phase {
            name: "under the limit (70%)".into(),
            load: 0.7,
            weights: zipf,
        },
        Phase {
            name: "overload, linear skew".into(),
            load: 1.2,
            weights: ramp,
        },
    ]
}

/// One second of the run.
#[derive(Debug, Clone, Serialize)]
pub struct SecondRow {
    /// Seconds since the load started (end of this second).
    pub t: u64,
    /// Phase index.
    pub phase: usize,
    /// Offered requests this second.
    pub offered: u64,
    /// Admitted requests this second, all nodes.
    pub admitted: u64,
    /// The global limit per second.
    pub limit: u64,
    /// Admitted per node.
    pub node_admitted: Vec<u64>,
    /// Each node's share of the limit at the end of the second.
    pub shares: Vec<f64>,
    /// Median decision latency inside the nodes this second, microseconds (each node's
    /// observations of this second, merged; `None` if no decision).
    pub decision_p50_us: Option<f64>,
    /// 99th percentile of the same.
    pub decision_p99_us: Option<f64>,
}

/// Latency summary, microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LatencySummary {
    /// Median of the nodes' medians.
    pub p50_us: f64,
    /// Largest of the nodes' 99th percentiles.
    pub p99_us: f64,
}

/// Decision latency inside the nodes over the whole run, microseconds: the gRPC shell's
/// time in the engine (`sluice_decision_duration_seconds{api="grpc"}` of every node,
/// merged), estimated from the histogram's doubling buckets as Prometheus'
/// `histogram_quantile` does (so to within a factor of 2).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DecisionLatency {
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Decisions the histograms hold.
    pub decisions: u64,
}

/// The outcome.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// Nodes.
    pub nodes: usize,
    /// Limit per second.
    pub limit: u32,
    /// The phases.
    pub phases: Vec<Phase>,
    /// One row per second.
    pub rows: Vec<SecondRow>,
    /// Σ (min(offered, L) − admitted)⁺ / Σ min(offered, L) × 100, over the seconds after each
    /// phase's first (convergence) second.
    pub over_throttling_pct: f64,
    /// Σ (admitted − L)⁺ / Σ L × 100 over every second.
    pub overshoot_pct: f64,
    /// Decisions answered per second (all nodes, admitted or not).
    pub decisions_per_s: f64,
    /// Round-trip gRPC latency of `ShouldRateLimit` on loopback, as the load generators saw it
    /// (open loop: measured from each request's intended send time).
    pub latency: LatencySummary,
    /// Decision latency inside the nodes (`None` if their metrics could not be read).
    pub decision_latency: Option<DecisionLatency>,
    /// Requests that got an error (should be 0).
    pub errors: u64,
    /// Peer messages per node per second (average).
    pub peer_messages_per_node_per_s: f64,
    /// Peer bytes per node per second (average).
    pub peer_bytes_per_node_per_s: f64,
}

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A node could not start.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// The load generator failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Bad parameters.
    #[error("{0}")]
    Invalid(String),
    /// No free port.
    #[error("cannot find a free port on 127.0.0.1: {0}")]
    Io(#[from] std::io::Error),
    /// A node's decision latency histogram could not be read.
    #[error("reading a node's metrics: {0}")]
    Metrics(#[from] std::fmt::Error),
}

fn yaml(limit: u32, fairness: sluice_server::config::Fairness) -> String {
    format!(
        "
domain: demo
descriptors:
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: {limit}
      algorithm: gcra
      burst: {}
      coordination: cluster
      fairness: {}
",
        (limit / 50).max(1),
        fairness.name()
    )
}

/// Runs the demo; `progress` gets every second's row as it ends.
///
/// # Errors
/// [`DemoError`]: a node or the load generator failed to start.
pub async fn run(
    spec: &DemoSpec,
    mut progress: impl FnMut(&SecondRow, &Phase),
) -> Result<DemoReport, DemoError> {
    if spec.nodes < 2 || spec.limit == 0 || spec.phase_seconds < 2 {
        return Err(DemoError::Invalid(
            "the demo needs at least 2 nodes, a positive limit and phases of 2 s or more".into(),
        ));
    }
    let n = spec.nodes;
    let dir = std::env::temp_dir().join(format!("sluice-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("demo.yaml");
    std::fs::write(&config_path, yaml(spec.limit, spec.fairness))?;
    // Peer ports: picked free, then handed to the nodes (each node must know the others').
    let mut peer_addrs = Vec::new();
    for _ in 0..n {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        peer_addrs.push(s.local_addr()?);
    }
    let key_text: String = (0..32)
        .map(|i| char::from(b'a' + ((std::process::id() as usize + i * 7) % 26) as u8))
        .collect();
    let key = PeerKey::from_text(&key_text).map_err(|e| DemoError::Invalid(e.to_string()))?;
    let mut daemons = Vec::new();
    for i in 0..n {
        let peers = (0..n)
            .filter(|&j| j != i)
            .map(|j| PeerSpec {
                id: j as u32,
                addr: peer_addrs[j].into(),
                weight: 1.0,
            })
            .collect();
        let mut cs = ClusterSpec::new(i as u32, peers, key.clone());
        cs.cycle = spec.cycle;
        cs.lease = spec.cycle * 20;
        let ds = DaemonSpec {
            source: ConfigSource::Path(config_path.clone()),
            grpc_addr: ([127, 0, 0, 1], 0).into(),
            http_addr: Some(([127, 0, 0, 1], 0).into()),
            cluster: Some((cs, peer_addrs[i])),
            watch: None,
            redis: None,
        };
        daemons.push(Daemon::start(ds).await?);
    }
    let phases = phases(n);
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let offered: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let mut latencies = Vec::new();
    let mut rows = Vec::new();
    let start = Instant::now();
    let (mut last_admitted, mut last_offered) = (vec![0u64; n], vec![0u64; n]);
    let mut t = 0u64;
    // Each node's histogram at the last row: a second's observations are the per-node
    // differences, merged (a difference of merged totals would mix nodes read at different
    // times).
    let mut decided = vec![DecisionHistogram::default(); n];
    for (pi, phase) in phases.iter().enumerate() {
        let wsum: f64 = phase.weights.iter().sum();
        let mut runs = Vec::new();
        for (i, d) in daemons.iter().enumerate() {
            let rate = f64::from(spec.limit) * phase.load * phase.weights[i] / wsum;
            let target = Target::Grpc(vec![d.grpc_addr.to_string()]);
            let mut ls = LoadSpec::new("demo", vec![vec![("tenant".into(), "acme".into())]]);
            ls.rate = Some(rate);
            ls.concurrency = 64;
            ls.stop = Stop::Duration(Duration::from_secs(spec.phase_seconds));
            ls.progress_every = Duration::from_millis(100);
            let (admitted, offered, errors) = (admitted.clone(), offered.clone(), errors.clone());
            let (base_a, base_o) = (
                admitted[i].load(Ordering::Relaxed),
                offered[i].load(Ordering::Relaxed),
            );
            let base_e = errors.load(Ordering::Relaxed);
            runs.push(tokio::spawn(async move {
                let r = crate::run(&target, &ls, |p| {
                    admitted[i].store(base_a + p.ok, Ordering::Relaxed);
                    offered[i].store(base_o + p.sent, Ordering::Relaxed);
                    let _ = base_e;
                })
                .await;
                if let Ok(r) = &r {
                    admitted[i].store(base_a + r.ok, Ordering::Relaxed);
                    offered[i].store(base_o + r.sent, Ordering::Relaxed);
                    errors.fetch_add(r.errors, Ordering::Relaxed);
                }
                r
            }));
        }
        // One row per second while the phase runs.
        for _ in 0..spec.phase_seconds {
            t += 1;
            tokio::time::sleep_until(tokio::time::Instant::from_std(
                start + Duration::from_secs(t),
            ))
            .await;
            let a: Vec<u64> = admitted.iter().map(|x| x.load(Ordering::Relaxed)).collect();
            let o: Vec<u64> = offered.iter().map(|x| x.load(Ordering::Relaxed)).collect();
            let node_admitted: Vec<u64> =
                a.iter().zip(&last_admitted).map(|(x, y)| x - y).collect();
            let now_decided = decision_histograms(&daemons)?;
            let mut second = DecisionHistogram::default();
            for (now, before) in now_decided.iter().zip(&decided) {
                second.merge(&now.since(before));
            }
            let us = |q: f64| second.quantile(q).map(|s| s * 1e6);
            let row = SecondRow {
                t,
                phase: pi,
                offered: o.iter().zip(&last_offered).map(|(x, y)| x - y).sum(),
                admitted: node_admitted.iter().sum(),
                limit: u64::from(spec.limit),
                node_admitted,
                shares: daemons
                    .iter()
                    .map(|d| d.status().keys.first().map_or(0.0, |k| k.share))
                    .collect(),
                decision_p50_us: us(0.5),
                decision_p99_us: us(0.99),
            };
            decided = now_decided;
            progress(&row, phase);
            rows.push(row);
            (last_admitted, last_offered) = (a, o);
        }
        for r in runs {
            match r.await {
                Ok(Ok(report)) => {
                    if let Some(l) = report.latency_us {
                        latencies.push(l);
                    }
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => return Err(DemoError::Invalid(format!("load generator: {e}"))),
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let statuses: Vec<_> = daemons.iter().map(Daemon::status).collect();
    let mut decided = DecisionHistogram::default();
    for h in decision_histograms(&daemons)? {
        decided.merge(&h);
    }
    let decision_latency = match (decided.quantile(0.5), decided.quantile(0.99)) {
        (Some(p50), Some(p99)) => Some(DecisionLatency {
            p50_us: p50 * 1e6,
            p99_us: p99 * 1e6,
            decisions: decided.count(),
        }),
        _ => None,
    };
    for d in daemons {
        d.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let l = f64::from(spec.limit);
    // Over-throttling after the first second of each phase (the network needs a moment to
    // re-divide; the per-second rows show that second too).
    let steady = rows.iter().filter(|r| (r.t - 1) % spec.phase_seconds != 0);
    let (mut ideal, mut lost) = (0.0, 0.0);
    for r in steady {
        let want = (r.offered as f64).min(l);
        ideal += want;
        lost += (want - r.admitted as f64).max(0.0);
    }
    let over: f64 = rows.iter().map(|r| (r.admitted as f64 - l).max(0.0)).sum();
    let decisions: u64 = rows.iter().map(|r| r.offered).sum();
    let mut p50s: Vec<f64> = latencies.iter().map(|x| x.p50).collect();
    p50s.sort_by(f64::total_cmp);
    let p50 = p50s.get(p50s.len() / 2).copied().unwrap_or(0.0);
    let p99 = latencies.iter().map(|x| x.p99).fold(0.0, f64::max);
    let msgs: u64 = statuses.iter().map(|s| s.peer.messages_sent).sum();
    let bytes: u64 = statuses.iter().map(|s| s.peer.bytes_sent).sum();
    Ok(DemoReport {
        nodes: n,
        limit: spec.limit,
        phases,
        over_throttling_pct: if ideal > 0.0 {
            lost / ideal * 100.0
        } else {
            0.0
        },
        overshoot_pct: over / (l * rows.len().max(1) as f64) * 100.0,
        decisions_per_s: decisions as f64 / elapsed,
        latency: LatencySummary {
            p50_us: p50,
            p99_us: p99,
        },
        decision_latency,
        errors: errors.load(Ordering::Relaxed),
        peer_messages_per_node_per_s: msgs as f64 / n as f64 / elapsed,
        peer_bytes_per_node_per_s: bytes as f64 / n as f64 / elapsed,
        rows,
    })
}

/// Each node's gRPC decision latency histogram, in node order, read from its metrics
/// registry in this process.
fn decision_histograms(daemons: &[Daemon]) -> Result<Vec<DecisionHistogram>, DemoError> {
    daemons
        .iter()
        .map(|d| Ok(d.metrics().decision_histogram(Api::Grpc)?))
        .collect()
}
