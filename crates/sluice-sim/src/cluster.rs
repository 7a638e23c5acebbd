//! `sluice sim cluster`: real `sluice-coord` nodes on a seeded in-memory network, with a
//! workload of clients per node, compared side by side with two baselines on the same
//! workload and seed (seed 000 §6, seed 003 §III).
//!
//! * `sluice` drives the production [`Node`](sluice_coord::Node) state machines through
//!   a seeded network that is, event for event, [`sluice_coord::testing::Cluster`]'s
//!   (real wire encoding, loss, duplication, delay, crashes, partitions), kept fast enough
//!   for 1,000 nodes (see `cluster/net.rs`).
//! * `dst-sync` is seed 000 eq. 3 in synchronous rounds, as published: a small direct
//!   implementation of the published law (NOT Sluice's protocol), kept here as a baseline.
//! * `static` gives every node `L/N` for ever.
//!
//! ```
//! use sluice_sim::cluster::{Scenario, Strategy, Workload, run};
//!
//! let mut s = Scenario::new("ring:5".parse().unwrap(), Strategy::Sluice, Workload::Steady);
//! s.cycles = 60;
//! let out = run(&s, &mut |_, _| {}).unwrap();
//! // The shares never add up to more than the limit.
//! assert!(out.report.max_share_sum_over_limit <= 0.0);
//! assert!(out.report.over_throttling_pct < 5.0);
//! ```

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use sluice_coord::law::{Measure, jfi};
use sluice_coord::node::{Config, Leases};
use sluice_coord::pacing::Strategy as PacingStrategy;
use sluice_coord::stability::{ConfigError, max_gain};
use sluice_coord::testing::{NetConfig, Rng, links_of};
use sluice_coord::wire::NodeId;
use sluice_graph::{GraphError, Topology, TopologySpec, auto_gamma};

mod demand;
mod net;
mod spec;

pub(crate) use demand::Demand;
pub use spec::{Crash, Gain, Pacing, Partition};

/// The one key every node limits.
const KEY: u64 = 1;
/// The update cycle Δ of the simulated nodes (the node default, 100 ms).
const CYCLE_NS: u64 = 100_000_000;
/// Bytes of one `dst-sync` report: the key and the indicator `p_i` (8 + 8).
const DST_MESSAGE_BYTES: u64 = 16;

/// Why a scenario cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The topology spec could not be built.
    #[error("topology: {0}")]
    Graph(#[from] GraphError),
    /// A node refused its configuration (e.g. an unstable gain, seed 003 Thm 1).
    #[error("node configuration: {0}")]
    Config(#[from] ConfigError),
    /// A parameter is out of range.
    #[error("{0}")]
    Invalid(String),
}

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$vm])* $v,)* }

        impl $name {
            /// The name used on the command line and in JSON.
            #[must_use]
            pub fn name(self) -> &'static str {
                match self { $(Self::$v => $s,)* }
            }
        }

        impl FromStr for $name {
            type Err = ClusterError;
            fn from_str(s: &str) -> Result<Self, ClusterError> {
                match s {
                    $($s => Ok(Self::$v),)*
                    _ => Err(ClusterError::Invalid(format!(
                        concat!("unknown ", stringify!($name), " `{}` (expected one of: {})"),
                        s,
                        [$($s),*].join(", ")
                    ))),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    };
}

named_enum! {
    /// How the limit is divided among the nodes.
    Strategy {
        /// The real Sluice nodes.
        Sluice = "sluice",
        /// Seed 000 eq. 3 in synchronous rounds, as published.
        DstSync = "dst-sync",
        /// `L/N` each, never moves.
        Static = "static",
    }
}

named_enum! {
    /// The performance measure `p_i` of the nodes.
    MeasureKind {
        /// Seed 000 Table 1 Case I, `r − x`.
        Throttled = "throttled",
        /// Seed 000 Case II, `(r − x)/r`.
        Ratio = "ratio",
        /// Seed 000 Case III, `ln(r/x)`.
        LogRatio = "log-ratio",
        /// Seed 000 Case IV, `x`.
        Allowed = "allowed",
        /// Seed 003 eq. 14 spare bandwidth: the same law as Case I.
        Spare = "spare",
        /// Seed 003 §III M/M/1 mean response time `1/(x − r)`.
        ResponseTime = "response-time",
    }
}

named_enum! {
    /// The demand of the clients of every node over time.
    Workload {
        /// Constant, node `i` ∝ `i + 1`, total `0.9·L` (seed 003 §III-A).
        Steady = "steady",
        /// Constant, Zipf(1) over a seeded order of the nodes, total `1.2·L`.
        Skewed = "skewed",
        /// Seed 003 §III-B: steady, an abrupt swap at `K/4`, a linear shift back over
        /// `[K/2, 3K/4]`, total `0.9·L`.
        Shift = "shift",
        /// Idle until cycle 10, then `2·L` at node 0 only.
        Hotspot = "hotspot",
        /// Seed 000 §6 Example 2's shape: 100 clients per node with random usage curves,
        /// total wandering around `L`.
        PaperEx2 = "paper-ex2",
    }
}

impl MeasureKind {
    /// The node's measure for limit `limit` over `n` nodes. Floors and caps are set from
    /// the fair share `L/N` so the stability bound (seed 003 Thm 1) leaves a usable gain.
    #[must_use]
    pub fn measure(self, limit: u64, n: usize) -> Measure {
        let fair = limit as f64 / n.max(1) as f64;
        match self {
            Self::Throttled | Self::Spare => Measure::Throttled,
            Self::Ratio => Measure::ThrottledRatio {
                min_demand: (fair / 10.0).max(1.0),
            },
            Self::LogRatio => Measure::LogRatio {
                min_share: (fair / 10.0).max(1.0),
            },
            Self::Allowed => Measure::Allowed,
            // q is capped where the spare capacity falls below 0.1 % of the fair share.
            Self::ResponseTime => Measure::MeanResponseTime {
                max_response: 1000.0 / fair.max(1e-9),
            },
        }
    }

    /// The default limit `L`: response time needs a fine capacity unit, because capacity
    /// moves in whole units and `q = 1/(x − r)` shrinks as the unit does.
    #[must_use]
    pub fn default_limit(self) -> u64 {
        match self {
            Self::ResponseTime => 10_000_000,
            _ => 10_000,
        }
    }
}

/// One simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The communication graph.
    pub topology: TopologySpec,
    /// Expected node count (checked against the topology when given).
    pub nodes: Option<usize>,
    /// How the limit is divided.
    pub strategy: Strategy,
    /// The nodes' performance measure.
    pub measure: MeasureKind,
    /// The demand.
    pub workload: Workload,
    /// Cycles to simulate.
    pub cycles: u64,
    /// Seed of everything random (random topologies without their own seed, workload,
    /// network).
    pub seed: u64,
    /// The gain.
    pub gain: Gain,
    /// The global limit `L` (requests per cycle, [`Scenario::units_per_request`] capacity
    /// units each); `None`: the measure's default.
    pub limit: Option<u64>,
    /// Capacity units per request `K` of the Sluice nodes and the static split, as
    /// `sluice serve` maps a rule onto its 2²⁰ units: the nodes divide `K·L` units, a
    /// node's demand reaches it as `K·r` units, and a node holding `u` units admits
    /// `⌊u/K⌋` requests per cycle. Demand, admissions and the report stay in requests.
    /// 1 (the default): a unit is a request. `dst-sync`'s shares are real numbers, so
    /// it takes only 1.
    pub units_per_request: u64,
    /// Per-message loss probability.
    pub loss: f64,
    /// Per-message duplication probability.
    pub dup: f64,
    /// Reorder messages (a random delay of up to one cycle when `delay_ms` is 0).
    pub reorder: bool,
    /// Largest message delay in ms (uniform in `[0, delay_ms]`).
    pub delay_ms: u64,
    /// Crashes.
    pub crashes: Vec<Crash>,
    /// Partitions.
    pub partitions: Vec<Partition>,
    /// Message pacing of the Sluice nodes.
    pub pacing: Pacing,
    /// Relay spare capacity toward unmet demand over several hops (Sluice nodes; off: the
    /// plain law).
    pub relay: bool,
    /// Time constant of the nodes' demand filter, in cycles (seed 003 §III).
    pub demand_tau_cycles: f64,
}

impl Scenario {
    /// A scenario with defaults: Case I, the stable gain, 1000 cycles, seed 0, a perfect
    /// network.
    #[must_use]
    pub fn new(topology: TopologySpec, strategy: Strategy, workload: Workload) -> Self {
        Self {
            topology,
            nodes: None,
            strategy,
            measure: MeasureKind::Throttled,
            workload,
            cycles: 1000,
            seed: 0,
            gain: Gain::Stable,
            limit: None,
            units_per_request: 1,
            loss: 0.0,
            dup: 0.0,
            reorder: false,
            delay_ms: 0,
            crashes: Vec::new(),
            partitions: Vec::new(),
            pacing: Pacing::DEFAULT,
            relay: true,
            demand_tau_cycles: 5.0,
        }
    }
}

/// The summary of a run: the JSON object of `sluice sim cluster --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Strategy.
    pub strategy: Strategy,
    /// Measure.
    pub measure: MeasureKind,
    /// Workload.
    pub workload: Workload,
    /// Topology spec.
    pub topology: String,
    /// Nodes.
    pub nodes: usize,
    /// Cycles.
    pub cycles: u64,
    /// Seed.
    pub seed: u64,
    /// Gain used.
    pub gamma: f64,
    /// Message pacing of the Sluice nodes.
    pub pacing: Pacing,
    /// Whether the Sluice nodes relay spare capacity toward unmet demand.
    pub relay: bool,
    /// Global limit `L`.
    pub limit: u64,
    /// Capacity units per request of the nodes (absent when 1, so runs without the option
    /// print what they always printed).
    #[serde(skip_serializing_if = "is_one")]
    pub units_per_request: u64,
    /// Seed 000 §6: `Σ_k (a_ideal − a_total) / Σ_k a_ideal × 100`, `a_ideal = min(L, r_total)`.
    pub over_throttling_pct: f64,
    /// `Σ_k max(0, accepted_k − L) / Σ_k L × 100`.
    pub overshoot_pct: f64,
    /// Largest `(Σ enforced − L)/L` seen at any instant (≤ 0: conservation held). With
    /// several units per request it is counted in units, `(Σ u − K·L)/(K·L)`: an upper
    /// bound of the same ratio in requests, since `Σ ⌊u/K⌋ ≤ Σ u / K`.
    pub max_share_sum_over_limit: f64,
    /// Seed 003 eq. 16 over the performance indicators at the end.
    pub jfi_final: f64,
    /// Cycles from the last change of demand until every later cycle admits ≥ 99 % of
    /// `min(L, total demand)`; `null` if that never happens (or demand never settles).
    pub converge_cycles: Option<u64>,
    /// Messages sent per node per cycle.
    pub messages_per_node_per_cycle: f64,
    /// Encoded bytes sent per node per cycle.
    pub bytes_per_node_per_cycle: f64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn is_one(v: &u64) -> bool {
    *v == 1
}

/// The largest number of capacity units a run may divide, `K·L`: the nodes' law, demand
/// and indicators are `f64`, exact for integers up to 2⁵³.
pub const MAX_UNITS: u64 = 1 << 53;

/// One cycle of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CycleRow {
    /// Cycle index.
    pub cycle: u64,
    /// Total demand `r_total`.
    pub demand: f64,
    /// `min(L, r_total)`.
    pub ideal: f64,
    /// Total accepted `Σ min(x_i, r_i)`.
    pub accepted: f64,
    /// Σ enforced limits at the end of the cycle.
    pub sum_enforced: f64,
    /// JFI of the indicators.
    pub jfi: f64,
}

/// Report and trace of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The summary.
    pub report: Report,
    /// Per cycle.
    pub trace: Vec<CycleRow>,
}

/// Runs a scenario; `progress(done, total)` is called after every cycle.
///
/// # Errors
/// [`ClusterError`] for a bad topology, parameter or node configuration.
pub fn run(s: &Scenario, progress: &mut dyn FnMut(u64, u64)) -> Result<Outcome, ClusterError> {
    let topo = s.topology.build_seeded(Some(s.seed))?;
    run_on(s, &topo, progress)
}

/// Runs a scenario on an already built topology (`s.topology` only names it in the report).
///
/// # Errors
/// [`ClusterError`] for a bad parameter or node configuration.
pub fn run_on(
    s: &Scenario,
    topo: &Topology,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Outcome, ClusterError> {
    let n = topo.nodes();
    if let Some(want) = s.nodes
        && want != n
    {
        return Err(ClusterError::Invalid(format!(
            "--nodes {want} but topology `{}` has {n} nodes",
            s.topology
        )));
    }
    if n == 0 || u32::try_from(n).is_err() {
        return Err(ClusterError::Invalid("the topology has no nodes".into()));
    }
    if s.cycles == 0 {
        return Err(ClusterError::Invalid("cycles must be at least 1".into()));
    }
    if !(s.demand_tau_cycles.is_finite() && s.demand_tau_cycles >= 0.0) {
        return Err(ClusterError::Invalid(format!(
            "--demand-tau {}: a number of cycles >= 0",
            s.demand_tau_cycles
        )));
    }
    for (what, p) in [("loss", s.loss), ("dup", s.dup)] {
        if !(0.0..=1.0).contains(&p) {
            return Err(ClusterError::Invalid(format!(
                "--{what} {p}: a probability in [0, 1]"
            )));
        }
    }
    for c in &s.crashes {
        if c.node as usize >= n {
            return Err(ClusterError::Invalid(format!(
                "crash of node {} but there are {n} nodes",
                c.node
            )));
        }
    }
    for p in &s.partitions {
        if let Some(bad) = p.nodes.iter().find(|&&x| x as usize >= n) {
            return Err(ClusterError::Invalid(format!(
                "partition names node {bad} but there are {n} nodes"
            )));
        }
    }
    let limit = s.limit.unwrap_or_else(|| s.measure.default_limit());
    if limit == 0 {
        return Err(ClusterError::Invalid("the limit must be positive".into()));
    }
    let per = s.units_per_request;
    if per == 0 {
        return Err(ClusterError::Invalid(
            "--units-per-request 0: a request is at least one capacity unit".into(),
        ));
    }
    if per > 1 && s.strategy == Strategy::DstSync {
        return Err(ClusterError::Invalid(format!(
            "--units-per-request {per}: dst-sync's shares are real numbers, not units \
             (the option applies to sluice and static)"
        )));
    }
    let units = limit
        .checked_mul(per)
        .filter(|&u| u <= MAX_UNITS)
        .ok_or_else(|| {
            ClusterError::Invalid(format!(
                "--units-per-request {per} with a limit of {limit}: K·L must be at most 2^53 \
                 capacity units (the nodes compute in f64)"
            ))
        })?;
    // The nodes' measure (its floors and caps) and hence the gain are in capacity units.
    let measure = s.measure.measure(units, n);
    let gamma = gain(s.gain, topo, &measure)?;
    let demand = Demand::new(s.workload, n, limit as f64, s.cycles, s.seed);
    let mut ctx = Run {
        s,
        topo,
        n,
        limit,
        per,
        measure,
        gamma,
        demand: &demand,
    };
    let (trace, max_over, traffic, final_q) = match s.strategy {
        Strategy::Sluice => ctx.sluice(progress)?,
        Strategy::DstSync => ctx.dst_sync(progress),
        Strategy::Static => ctx.fixed(progress),
    };
    let report = summarise(&ctx, &trace, max_over, traffic, &final_q);
    Ok(Outcome { report, trace })
}

fn gain(g: Gain, topo: &Topology, measure: &Measure) -> Result<f64, ClusterError> {
    let max_degree = (0..topo.nodes())
        .map(|i| topo.weighted_degree(i))
        .fold(0.0, f64::max);
    let stable = max_gain(measure, max_degree);
    Ok(match g {
        Gain::Stable => stable,
        Gain::Auto => {
            if topo.nodes() < 2 {
                stable
            } else {
                (auto_gamma(topo)? * measure.min_slope()).min(stable)
            }
        }
        Gain::Fixed(v) => v,
    })
}

struct Run<'a> {
    s: &'a Scenario,
    topo: &'a Topology,
    n: usize,
    /// `L`, requests per cycle.
    limit: u64,
    /// Capacity units per request `K`.
    per: u64,
    measure: Measure,
    gamma: f64,
    demand: &'a Demand,
}

/// `(trace, max Σ enforced − K·L in capacity units, (messages, bytes), final indicators)`.
type Raw = (Vec<CycleRow>, f64, (u64, u64), Vec<f64>);

/// Events of cycle `k`: `(crashed, restarted, partition started (nodes), healed)`.
struct Events {
    crash: Vec<u32>,
    restart: Vec<u32>,
    cut: Option<Vec<u32>>,
    heal: bool,
}

impl Run<'_> {
    fn events(&self, k: u64) -> Events {
        let s = self.s;
        Events {
            crash: s
                .crashes
                .iter()
                .filter(|c| c.at == k)
                .map(|c| c.node)
                .collect(),
            restart: s
                .crashes
                .iter()
                .filter(|c| c.restart == Some(k))
                .map(|c| c.node)
                .collect(),
            cut: s
                .partitions
                .iter()
                .find(|p| p.from == k)
                .map(|p| p.nodes.clone()),
            heal: s.partitions.iter().any(|p| p.to == k),
        }
    }

    fn edges(&self) -> Vec<(NodeId, NodeId, f64)> {
        self.topo
            .edges()
            .iter()
            .filter(|e| e.weight > 0.0)
            .map(|e| (e.a as NodeId, e.b as NodeId, e.weight))
            .collect()
    }

    fn row(&self, k: u64, r: &[f64], enforced: &[f64], q: &[f64]) -> CycleRow {
        let demand: f64 = r.iter().sum();
        CycleRow {
            cycle: k,
            demand,
            ideal: demand.min(self.limit as f64),
            accepted: r.iter().zip(enforced).map(|(a, b)| a.min(*b)).sum(),
            sum_enforced: enforced.iter().sum(),
            jfi: jfi(q),
        }
    }

    /// The real nodes on the simulated network.
    fn sluice(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<Raw, ClusterError> {
        let s = self.s;
        let (n, measure, gamma) = (self.n, self.measure, self.gamma);
        // The nodes divide K·L capacity units (validated in `run_on` not to overflow).
        let per = self.per;
        let units = self.limit * per;
        let max_delay = match (s.delay_ms, s.reorder) {
            (0, true) => CYCLE_NS,
            (d, _) => d.saturating_mul(1_000_000),
        };
        let net = NetConfig {
            loss: s.loss,
            dup: s.dup,
            max_delay,
        };
        let nn = n as u32;
        let mut c = net::Net::new(
            nn,
            &self.edges(),
            |id, links| {
                let mut cfg = Config::new(id, (0..nn).collect(), links, units);
                // Leases (and their n² heartbeats) only where something fails: a run
                // without crashes or cuts simulates the law, as the papers do.
                cfg.leases = if s.crashes.is_empty() && s.partitions.is_empty() {
                    Leases::Off
                } else {
                    Leases::Quorum
                };
                cfg.gamma = gamma;
                cfg.measure = measure;
                cfg.cycle = CYCLE_NS;
                cfg.pacing = s.pacing.0;
                cfg.relay = s.relay;
                cfg.demand_tau = (s.demand_tau_cycles * CYCLE_NS as f64) as u64;
                cfg
            },
            net,
            s.seed,
        )?;
        let mut last = vec![f64::NAN; n];
        let mut trace = Vec::with_capacity(s.cycles as usize);
        for k in 0..s.cycles {
            let ev = self.events(k);
            for id in ev.crash {
                c.crash(id);
            }
            for id in ev.restart {
                c.restart(id);
            }
            if ev.heal {
                c.heal();
            }
            if let Some(cut) = ev.cut {
                c.partition(&cut);
            }
            let r = self.demand.at(k);
            for (i, (&v, old)) in r.iter().zip(last.iter_mut()).enumerate() {
                // Only changes are applied: the harness re-asserts demand every cycle.
                if v.to_bits() != old.to_bits() {
                    // In capacity units, as the daemon turns hits into units (× K is exact
                    // for K = 1).
                    c.set_demand(i as u32, KEY, v * per as f64);
                    *old = v;
                }
            }
            c.run_cycle();
            let now = c.now();
            // A node holding u units admits ⌊u/K⌋ requests (the daemon's `scaled`).
            let enforced: Vec<f64> = (0..nn)
                .map(|i| {
                    c.node(i)
                        .map_or(0.0, |nd| (nd.enforced(KEY, now) / per) as f64)
                })
                .collect();
            trace.push(self.row(k, &r, &enforced, &c.indicators(KEY)));
            progress(k + 1, s.cycles);
        }
        let over = c.max_over.max(i128::from(i64::MIN)) as f64;
        Ok((trace, over, (c.messages, c.bytes), c.indicators(KEY)))
    }

    /// Seed 000 eq. 3 in synchronous rounds, as published: every node sends `p_i` to its
    /// neighbours each round and applies `x_i += γ Σ w_ij (p_i − p_j)` with the latest
    /// `p_j` it received. A direct implementation of the published law, NOT Sluice's
    /// protocol: shares are plain numbers, so a lost or stale report breaks `Σ x = L`, a
    /// share can go negative, and a restarted node starts again from `L/N`.
    fn dst_sync(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Raw {
        let s = self.s;
        let n = self.n;
        let limit = self.limit as f64;
        let mut rng = Rng::new(s.seed ^ 0xD57_5E4C);
        let mut x = vec![limit / n as f64; n];
        let mut alive = vec![true; n];
        let mut cut = vec![false; n];
        let edges = self.edges();
        let adj: Vec<Vec<(usize, f64)>> = (0..n)
            .map(|i| {
                links_of(i as NodeId, &edges)
                    .into_iter()
                    .map(|(j, w)| (j as usize, w))
                    .collect()
            })
            .collect();
        // known[i][slot]: latest p of the slot-th neighbour at node i (None: never heard).
        let mut known: Vec<Vec<Option<f64>>> = adj.iter().map(|a| vec![None; a.len()]).collect();
        // In flight: (arrival round, seq, to, slot at receiver, p).
        let mut flights: Vec<(u64, u64, usize, usize, f64)> = Vec::new();
        let delay_rounds = match (s.delay_ms, s.reorder) {
            (0, true) => 1,
            (d, _) => d.saturating_mul(1_000_000) / CYCLE_NS,
        };
        let (mut msgs, mut seq) = (0u64, 0u64);
        let mut max_over = f64::NEG_INFINITY;
        let mut trace = Vec::with_capacity(s.cycles as usize);
        let mut q = vec![0.0; n];
        for k in 0..s.cycles {
            let ev = self.events(k);
            for id in ev.crash {
                alive[id as usize] = false;
                x[id as usize] = 0.0;
                known[id as usize].iter_mut().for_each(|v| *v = None);
            }
            for id in ev.restart {
                alive[id as usize] = true;
                x[id as usize] = limit / n as f64;
            }
            if ev.heal {
                cut.iter_mut().for_each(|v| *v = false);
            }
            if let Some(nodes) = ev.cut {
                cut.iter_mut().for_each(|v| *v = false);
                for id in nodes {
                    cut[id as usize] = true;
                }
            }
            let r = self.demand.at(k);
            for i in 0..n {
                q[i] = self.measure.indicator(r[i], x[i]);
            }
            // Send this round's reports.
            for i in (0..n).filter(|&i| alive[i]) {
                for &(j, _) in &adj[i] {
                    msgs += 1;
                    if rng.next_f64() < s.loss {
                        continue;
                    }
                    let copies = if rng.next_f64() < s.dup { 2 } else { 1 };
                    for _ in 0..copies {
                        let late = if delay_rounds > 0 {
                            rng.below(delay_rounds + 1)
                        } else {
                            0
                        };
                        let slot = adj[j].iter().position(|&(p, _)| p == i).unwrap_or(0);
                        seq += 1;
                        flights.push((k + late, seq, j, slot, q[i]));
                    }
                }
            }
            // Deliver what is due, in (arrival, send) order; stale copies overwrite.
            flights.sort_by_key(|f| (f.0, f.1));
            let due = flights.partition_point(|f| f.0 <= k);
            for (_, _, to, slot, p) in flights.drain(..due) {
                let from = adj[to][slot].0;
                if alive[to] && cut[to] == cut[from] {
                    known[to][slot] = Some(p);
                }
            }
            // The synchronous update (seed 000 eq. 3).
            let next: Vec<f64> = (0..n)
                .map(|i| {
                    if !alive[i] {
                        return x[i];
                    }
                    let flow: f64 = adj[i]
                        .iter()
                        .zip(&known[i])
                        .map(|(&(_, w), p)| p.map_or(0.0, |p| w * (q[i] - p)))
                        .sum();
                    x[i] + self.gamma * flow
                })
                .collect();
            x = next;
            let enforced: Vec<f64> = (0..n)
                .map(|i| if alive[i] { x[i].max(0.0) } else { 0.0 })
                .collect();
            let sum: f64 = enforced.iter().sum();
            max_over = max_over.max(sum - limit);
            for i in 0..n {
                q[i] = self.measure.indicator(r[i], x[i]);
            }
            let live_q: Vec<f64> = (0..n).filter(|&i| alive[i]).map(|i| q[i]).collect();
            trace.push(self.row(k, &r, &enforced, &live_q));
            progress(k + 1, s.cycles);
        }
        let live_q: Vec<f64> = (0..n).filter(|&i| alive[i]).map(|i| q[i]).collect();
        (trace, max_over, (msgs, msgs * DST_MESSAGE_BYTES), live_q)
    }

    /// `L/N` each (1/N rule with the remainder to the lowest ids), never moves. With K units
    /// per request, `K·L/N` units each, admitting `⌊units/K⌋` requests.
    fn fixed(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Raw {
        let s = self.s;
        let n = self.n;
        let per = self.per;
        let units = self.limit * per;
        let cfg = Config::new(0, (0..n as u32).collect(), Vec::new(), units);
        let held: Vec<u64> = (0..n as u32).map(|i| cfg.initial_share(i)).collect();
        let share: Vec<f64> = held.iter().map(|&u| (u / per) as f64).collect();
        let mut alive = vec![true; n];
        let mut max_over = f64::NEG_INFINITY;
        let mut trace = Vec::with_capacity(s.cycles as usize);
        let mut q = Vec::new();
        for k in 0..s.cycles {
            let ev = self.events(k);
            for id in ev.crash {
                alive[id as usize] = false;
            }
            for id in ev.restart {
                alive[id as usize] = true;
            }
            let r = self.demand.at(k);
            let enforced: Vec<f64> = (0..n)
                .map(|i| if alive[i] { share[i] } else { 0.0 })
                .collect();
            let held_sum: u64 = (0..n).filter(|&i| alive[i]).map(|i| held[i]).sum();
            max_over = max_over.max(held_sum as f64 - units as f64);
            // The measure is in units: demand and share as the nodes would see them.
            q = (0..n)
                .filter(|&i| alive[i])
                .map(|i| self.measure.indicator(r[i] * per as f64, held[i] as f64))
                .collect();
            trace.push(self.row(k, &r, &enforced, &q));
            progress(k + 1, s.cycles);
        }
        (trace, max_over, (0, 0), q)
    }
}

impl Outcome {
    /// Writes `cluster.csv` (the trace) and `cluster.svg` (demand, ideal, accepted,
    /// Σ enforced per cycle) to `dir`, creating it.
    ///
    /// # Errors
    /// Any I/O or CSV error.
    pub fn write(&self, dir: &std::path::Path) -> Result<(), ClusterError> {
        let io = |e: &dyn fmt::Display| ClusterError::Invalid(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| io(&e))?;
        let mut w = csv::Writer::from_path(dir.join("cluster.csv")).map_err(|e| io(&e))?;
        for row in &self.trace {
            w.serialize(row).map_err(|e| io(&e))?;
        }
        w.flush().map_err(|e| io(&e))?;
        let pts = |f: fn(&CycleRow) -> f64| -> Vec<(f64, f64)> {
            self.trace.iter().map(|r| (r.cycle as f64, f(r))).collect()
        };
        let r = &self.report;
        crate::chart::LineChart::new(
            format!("{} / {} on {}", r.strategy, r.workload, r.topology),
            "cycle",
            // A unit is a request unless the run says otherwise.
            if r.units_per_request == 1 {
                "capacity units per cycle"
            } else {
                "requests per cycle"
            },
        )
        .series("total demand", pts(|r| r.demand))
        .series("ideal min(L, demand)", pts(|r| r.ideal))
        .series("accepted", pts(|r| r.accepted))
        .series("sum of enforced limits", pts(|r| r.sum_enforced))
        .write(&dir.join("cluster.svg"))
        .map_err(|e| io(&e))
    }
}

fn summarise(
    ctx: &Run<'_>,
    trace: &[CycleRow],
    max_over: f64,
    traffic: (u64, u64),
    final_q: &[f64],
) -> Report {
    let s = ctx.s;
    let l = ctx.limit as f64;
    let ideal: f64 = trace.iter().map(|r| r.ideal).sum();
    let lost: f64 = trace.iter().map(|r| r.ideal - r.accepted).sum();
    let over: f64 = trace.iter().map(|r| (r.accepted - l).max(0.0)).sum();
    let converge_cycles = ctx.demand.last_change().and_then(|c0| {
        // The first cycle after which every cycle admits ≥ 99 % of min(L, r_total).
        let good = |r: &CycleRow| r.accepted >= 0.99 * r.ideal - 1e-9;
        let tail = trace
            .iter()
            .rev()
            .take_while(|r| r.cycle >= c0 && good(r))
            .last()?;
        Some(tail.cycle - c0)
    });
    let per = (ctx.n as f64 * s.cycles as f64).max(1.0);
    // dst-sync's shares are floats: rounding noise is not a breach of the limit.
    let clean = |v: f64| if v.abs() < 1e-9 { 0.0 } else { v };
    Report {
        strategy: s.strategy,
        measure: s.measure,
        workload: s.workload,
        topology: s.topology.to_string(),
        nodes: ctx.n,
        cycles: s.cycles,
        seed: s.seed,
        gamma: ctx.gamma,
        pacing: s.pacing,
        relay: s.relay,
        limit: ctx.limit,
        units_per_request: ctx.per,
        over_throttling_pct: if ideal > 0.0 {
            lost / ideal * 100.0
        } else {
            0.0
        },
        overshoot_pct: clean(over / (l * s.cycles as f64) * 100.0),
        // In capacity units (`max_over` is): K·L is exact in f64 (≤ 2⁵³), and is L for K = 1.
        max_share_sum_over_limit: clean(max_over / (ctx.limit * ctx.per) as f64),
        jfi_final: jfi(final_q),
        converge_cycles,
        messages_per_node_per_cycle: traffic.0 as f64 / per,
        bytes_per_node_per_cycle: traffic.1 as f64 / per,
    }
}

#[cfg(test)]
mod tests;
