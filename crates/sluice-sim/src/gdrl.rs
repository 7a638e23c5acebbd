//! Seed 003 §III's experiments on the production [`Node`] state machines: `gdrl-ring`
//! (§III-A, Figs. 3–4), `gdrl-dynamic` (§III-B, Figs. 5–6) and `gdrl-scale` (§III-C, Fig. 7).
//!
//! Setup, as in the paper: N limiters on a ring or a random d-regular graph; limiter `i`
//! (1-based) sees arrivals at rate `λ_i = i/(N+1)` packets per slot (one Bernoulli draw per
//! slot, so the low-pass estimate is unbiased); the performance indicator is the "spare
//! bandwidth" `q_i = λ̂_i − C_i` (eq. 14, the node's [`Measure::Throttled`]); `λ̂` is the
//! low-pass filter `λ̂ ← (1 − α)λ̂ + αδ` with `α = 10⁻³` (the node's demand filter with time
//! constant `τ = slot / −ln(1 − α)`, which is that filter exactly); the gain is the stability
//! bound `η = 1/(2d)` (eq. 15); the capacities start by the 1/N rule (eq. 6); fairness is
//! Jain's index of `q` (eq. 16).
//!
//! The nodes are the real [`Node`]s: capacity moves as gifts on monotone counters, every
//! message goes through the real wire encoding, and the sum of the capacities never exceeds
//! `C` (seed 003 Lemma 1, checked every cycle). One node cycle (the update interval `Δ` of
//! Fig. 1) is `slots_per_cycle` slots; capacities are integers in units of `1/UNIT` packets
//! per cycle, fine enough that rounding is invisible at the paper's scale.
//!
//! ```
//! use sluice_sim::gdrl::{Demand, Setup, simulate};
//!
//! let mut s = Setup::ring(10, 1.1, Demand::Constant);
//! s.slots = 2_000;
//! let t = simulate(&s, &mut |_, _| {}).unwrap();
//! // Seed 003 Fig. 4: the indicators equalise (JFI → 1) and Σ C_i never exceeds C.
//! assert!(t.jfi.last().copied().unwrap() > 0.99);
//! assert!(t.max_sum_over_limit <= 0.0);
//! ```

use std::collections::VecDeque;
use std::path::Path;

use serde::Serialize;
use sluice_coord::law::{Measure, jfi};
use sluice_coord::node::{Config, Leases, Node};
use sluice_coord::stability::ConfigError;
use sluice_coord::testing::{Rng, links_of};
use sluice_coord::wire::{self, NodeId};
use sluice_graph::{GraphError, Topology};

use crate::chart::LineChart;

/// The one key every limiter limits.
const KEY: u64 = 1;
/// One slot of the paper's discrete time, on the nodes' nanosecond clocks.
const SLOT_NS: u64 = 1_000_000;
/// Capacity units per packet: capacities move in whole units, so a fine unit keeps the
/// rounding of the gifts (≤ 1 unit per link and cycle) far below the estimation noise.
pub const UNIT: f64 = 1e6;
/// JFI level the paper's figures reach ("very close to 1"); the targets use it.
pub const JFI_TARGET: f64 = 0.99;
/// Largest number of rows written to a CSV (longer runs are sampled evenly).
const MAX_ROWS: usize = 2000;

/// Why an experiment cannot run.
#[derive(Debug, thiserror::Error)]
pub enum GdrlError {
    /// The communication graph could not be built.
    #[error("topology: {0}")]
    Graph(#[from] GraphError),
    /// A node refused its configuration (e.g. a gain above seed 003 eq. 9).
    #[error("node configuration: {0}")]
    Config(#[from] ConfigError),
    /// A parameter is out of range.
    #[error("{0}")]
    Invalid(String),
    /// Writing the results failed.
    #[error("{0}")]
    Io(String),
}

/// The demand pattern over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Demand {
    /// `λ_i = i/(N+1)` for ever (§III-A, §III-C).
    Constant,
    /// §III-B: `i/(N+1)` on `[0, τ0)`, an abrupt swap to `1 − i/(N+1)` on `[τ0, 2τ0)`, a
    /// linear shift back over `[2τ0, 3τ0)`, `i/(N+1)` again on `[3τ0, 4τ0)`.
    ///
    /// The printed formula for `[2τ0, 3τ0]` runs from `i/(N+1)` to `1 − i/(N+1)`, which
    /// would add two more jumps (at `2τ0` and `3τ0`); the text ("a slow smooth change") and
    /// Fig. 5 ("4 segments") describe a continuous shift, which is what this is.
    Dynamic {
        /// `τ0` in slots (the paper: 10⁴).
        tau0: u64,
    },
}

impl Demand {
    /// `λ_i(t)` for node `i` (0-based) of `n`, at slot `t`.
    #[must_use]
    pub fn lambda(self, i: usize, n: usize, slot: u64) -> f64 {
        let a = (i + 1) as f64 / (n + 1) as f64;
        match self {
            Self::Constant => a,
            Self::Dynamic { tau0 } => {
                let (t, t0) = (slot as f64, tau0.max(1) as f64);
                if t < t0 || t >= 3.0 * t0 {
                    a
                } else if t < 2.0 * t0 {
                    1.0 - a
                } else {
                    let s = (t - 2.0 * t0) / t0;
                    s * a + (1.0 - s) * (1.0 - a)
                }
            }
        }
    }

    /// Slots at which the demand starts to change (abruptly or not).
    #[must_use]
    pub fn changes(self) -> Vec<u64> {
        match self {
            Self::Constant => Vec::new(),
            Self::Dynamic { tau0 } => vec![tau0, 2 * tau0, 3 * tau0],
        }
    }
}

/// One run: graph, parameters, demand.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The communication graph.
    pub topology: Topology,
    /// A name for it (`ring:10`, `random-regular:100:4`).
    pub topology_name: String,
    /// The gain `η`; `None`: the stability bound `1/(2 max d)` (eq. 15).
    pub eta: Option<f64>,
    /// The low-pass filter parameter `α` (per slot).
    pub alpha: f64,
    /// `C / Λ`: 1.1 in §III-A, `1/0.9` ("load 90 %") in §III-B and §III-C.
    pub capacity_factor: f64,
    /// The demand.
    pub demand: Demand,
    /// Slots to simulate.
    pub slots: u64,
    /// Slots per node cycle (the update interval `Δ`).
    pub slots_per_cycle: u64,
    /// Seed of the arrivals and of the network.
    pub seed: u64,
    /// Per-message loss probability.
    pub loss: f64,
    /// Keep every node's `q_i` and `λ̂_i` in the trace (small N only).
    pub record_nodes: bool,
}

impl Setup {
    /// §III-A / §III-B's setup on a ring of `n` nodes: `α = 10⁻³`, `η = 1/4`, one update
    /// per slot, 10⁴ slots, seed 1.
    ///
    /// # Panics
    /// Never for `n ≥ 3` (a ring needs three nodes).
    #[must_use]
    pub fn ring(n: usize, capacity_factor: f64, demand: Demand) -> Self {
        let topology = Topology::ring(n.max(3)).unwrap_or_else(|_| unreachable!());
        Self {
            topology_name: format!("ring:{}", topology.nodes()),
            topology,
            eta: None,
            alpha: 1e-3,
            capacity_factor,
            demand,
            slots: 10_000,
            slots_per_cycle: 1,
            seed: 1,
            loss: 0.0,
            record_nodes: true,
        }
    }

    /// §III-C's setup on a random `d`-regular graph of `n` nodes drawn from `seed`.
    ///
    /// # Errors
    /// [`GdrlError::Graph`] if no such connected graph exists.
    pub fn regular(n: usize, d: usize, seed: u64) -> Result<Self, GdrlError> {
        let topology = Topology::random_regular(n, d, seed)?;
        Ok(Self {
            topology,
            topology_name: format!("random-regular:{n}:{d}"),
            eta: None,
            alpha: 1e-3,
            capacity_factor: 1.0 / 0.9,
            demand: Demand::Constant,
            slots: 20_000,
            slots_per_cycle: 1,
            seed,
            loss: 0.0,
            record_nodes: false,
        })
    }

    fn max_degree(&self) -> f64 {
        (0..self.topology.nodes())
            .map(|i| self.topology.weighted_degree(i))
            .fold(0.0, f64::max)
    }

    /// The gain used: the given one, or `1/(2 max d)` (eq. 15).
    #[must_use]
    pub fn gain(&self) -> f64 {
        self.eta.unwrap_or(1.0 / (2.0 * self.max_degree().max(1.0)))
    }

    fn validate(&self) -> Result<(), GdrlError> {
        let bad = |m: &str| Err(GdrlError::Invalid(m.to_string()));
        if self.topology.nodes() < 2 {
            return bad("at least two limiters");
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return bad("alpha must be in (0, 1)");
        }
        if !(self.capacity_factor.is_finite() && self.capacity_factor > 0.0) {
            return bad("the capacity factor C/Λ must be positive");
        }
        if self.slots == 0 || self.slots_per_cycle == 0 {
            return bad("slots and slots per cycle must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.loss) {
            return bad("loss must be a probability in [0, 1]");
        }
        Ok(())
    }
}

/// What a run recorded, once per node cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Nodes.
    pub nodes: usize,
    /// The gain used.
    pub eta: f64,
    /// `C` in packets per slot.
    pub capacity: f64,
    /// `Λ = Σ λ_i` at slot 0, packets per slot.
    pub total_demand: f64,
    /// The slot at the end of each cycle.
    pub slot: Vec<u64>,
    /// `JFI(q(t))` (eq. 16) at the end of each cycle.
    pub jfi: Vec<f64>,
    /// Per cycle, every node's `q_i` in packets per slot (empty unless recorded).
    pub q: Vec<Vec<f64>>,
    /// Per cycle, every node's estimate `λ̂_i` (empty unless recorded).
    pub lambda_hat: Vec<Vec<f64>>,
    /// Every node's `q_i` after the last cycle (kept when the per-cycle record is off).
    pub q_final: Vec<f64>,
    /// Largest `(Σ enforced − C)/C` seen (≤ 0: Lemma 1 held).
    pub max_sum_over_limit: f64,
    /// Messages sent.
    pub messages: u64,
    /// Encoded bytes sent.
    pub bytes: u64,
}

impl Trace {
    /// The first slot from which `JFI ≥ level` at every later cycle in `[from, to)` (slots),
    /// counted from `from`; `None` if the window ends below the level.
    #[must_use]
    pub fn settle_slots(&self, level: f64, from: u64, to: u64) -> Option<u64> {
        let mut start = None;
        for (&t, &j) in self.slot.iter().zip(&self.jfi) {
            if t < from || t >= to {
                continue;
            }
            if j >= level {
                start.get_or_insert(t);
            } else {
                start = None;
            }
        }
        start.map(|s| s - from)
    }

    /// Smallest JFI over cycles ending in `[from, to)`.
    #[must_use]
    pub fn min_jfi(&self, from: u64, to: u64) -> f64 {
        self.window(from, to).fold(f64::INFINITY, f64::min)
    }

    /// Mean JFI over cycles ending in `[from, to)`.
    #[must_use]
    pub fn mean_jfi(&self, from: u64, to: u64) -> f64 {
        let (s, n) = self
            .window(from, to)
            .fold((0.0, 0u64), |(s, n), j| (s + j, n + 1));
        if n == 0 { f64::NAN } else { s / n as f64 }
    }

    fn window(&self, from: u64, to: u64) -> impl Iterator<Item = f64> + '_ {
        self.slot
            .iter()
            .zip(&self.jfi)
            .filter(move |(t, _)| **t >= from && **t < to)
            .map(|(_, j)| *j)
    }

    /// Cycle indices to write: all, or an even sample of at most `MAX_ROWS` (the last kept).
    fn rows(&self) -> Vec<usize> {
        let n = self.slot.len();
        let step = n.div_ceil(MAX_ROWS).max(1);
        let mut v: Vec<usize> = (0..n).step_by(step).collect();
        if n > 0 && v.last() != Some(&(n - 1)) {
            v.push(n - 1);
        }
        v
    }
}

/// Runs one setup on real nodes; `progress(done, total)` is called after every cycle.
///
/// # Errors
/// [`GdrlError`] for a bad parameter or a configuration a node refuses.
pub fn simulate(s: &Setup, progress: &mut dyn FnMut(u64, u64)) -> Result<Trace, GdrlError> {
    s.validate()?;
    let n = s.topology.nodes();
    let nn = u32::try_from(n).map_err(|_| GdrlError::Invalid("too many nodes".into()))?;
    let m = s.slots_per_cycle;
    let cycle_ns = m.saturating_mul(SLOT_NS);
    let per_cycle = m as f64 * UNIT; // capacity units per (packet per slot)
    let total: f64 = (0..n).map(|i| s.demand.lambda(i, n, 0)).sum();
    let capacity = s.capacity_factor * total;
    let limit = (capacity * per_cycle).round() as u64;
    let eta = s.gain();
    // The paper's per-slot filter has weight α per slot: exp(−slot/τ) = 1 − α.
    let tau = (SLOT_NS as f64 / -(1.0 - s.alpha).ln()).round() as u64;
    let edges: Vec<(NodeId, NodeId, f64)> = s
        .topology
        .edges()
        .iter()
        .map(|e| (e.a as NodeId, e.b as NodeId, e.weight))
        .collect();
    let members: Vec<NodeId> = (0..nn).collect();
    let mut nodes = Vec::with_capacity(n);
    for id in 0..nn {
        let mut cfg = Config::new(id, members.clone(), links_of(id, &edges), limit);
        cfg.gamma = eta;
        cfg.measure = Measure::Throttled;
        cfg.cycle = cycle_ns;
        cfg.lease = 10 * cycle_ns;
        // The paper's law on its own graph: nothing fails here, so no leases (and none of
        // their heartbeats to every member).
        cfg.leases = Leases::Off;
        cfg.demand_tau = tau;
        let mut node = Node::new(cfg, 0)?;
        // The filter has been running before the limiters start to coordinate: it starts
        // at the true rate, so the transient is the algorithm's, not the filter's warm-up.
        node.set_demand(0, KEY, s.demand.lambda(id as usize, n, 0) * per_cycle);
        nodes.push(node);
    }
    let mut arrivals = Rng::new(s.seed ^ 0x6D52_1A00_0003);
    let mut net = Rng::new(s.seed ^ 0x6D52_1A00_4E37);
    let cycles = s.slots.div_ceil(m);
    let mut tr = Trace {
        nodes: n,
        eta,
        capacity,
        total_demand: total,
        slot: Vec::with_capacity(cycles as usize),
        jfi: Vec::with_capacity(cycles as usize),
        q: Vec::new(),
        lambda_hat: Vec::new(),
        q_final: Vec::new(),
        max_sum_over_limit: f64::NEG_INFINITY,
        messages: 0,
        bytes: 0,
    };
    let mut queue: VecDeque<(NodeId, NodeId, Vec<u8>)> = VecDeque::new();
    let mut q = vec![0.0; n];
    for k in 1..=cycles {
        let now = k * cycle_ns;
        let first_slot = (k - 1) * m;
        for (i, node) in nodes.iter_mut().enumerate() {
            let count = (first_slot..first_slot + m)
                .filter(|&t| arrivals.next_f64() < s.demand.lambda(i, n, t))
                .count() as f64;
            node.observe_arrivals(now, KEY, (count * UNIT).round() as u64);
        }
        for (i, node) in nodes.iter_mut().enumerate() {
            // Pacing is off: the draw is never used, but the node wants a source.
            node.tick(now, &mut || 0.5);
            enqueue(&mut queue, i as NodeId, node.ready(now).messages, &mut tr);
        }
        // Deliver everything within the cycle (FIFO), including what deliveries trigger.
        let mut budget = 64 * (edges.len() + n) + 1024;
        while let Some((from, to, bytes)) = queue.pop_front() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                return Err(GdrlError::Invalid("message storm: a protocol bug".into()));
            }
            if net.next_f64() < s.loss {
                continue;
            }
            let Some(node) = nodes.get_mut(to as usize) else {
                continue;
            };
            let msg = wire::decode(&bytes)
                .map_err(|e| GdrlError::Invalid(format!("wire round trip failed: {e}")))?;
            node.handle_message(now, from, msg, &mut || 0.5);
            enqueue(&mut queue, to, node.ready(now).messages, &mut tr);
        }
        let sum: u64 = nodes.iter().map(|nd| nd.enforced(KEY, now)).sum();
        let over = (sum as f64 - limit as f64) / limit.max(1) as f64;
        tr.max_sum_over_limit = tr.max_sum_over_limit.max(over);
        for (qi, node) in q.iter_mut().zip(&nodes) {
            *qi = node.indicator(KEY) / per_cycle;
        }
        tr.slot.push(k * m);
        tr.jfi.push(jfi(&q));
        if s.record_nodes {
            tr.q.push(q.clone());
            tr.lambda_hat
                .push(nodes.iter().map(|nd| nd.demand(KEY) / per_cycle).collect());
        }
        progress(k, cycles);
    }
    tr.q_final = q;
    Ok(tr)
}

fn enqueue(
    queue: &mut VecDeque<(NodeId, NodeId, Vec<u8>)>,
    from: NodeId,
    out: Vec<sluice_coord::Outgoing>,
    tr: &mut Trace,
) {
    for o in out {
        let bytes = wire::encode(&o.message);
        tr.messages += 1;
        tr.bytes += bytes.len() as u64;
        queue.push_back((from, o.to, bytes));
    }
}

/// The summary of one run (JSON of `gdrl-ring`, and one case of `gdrl-scale`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// Topology.
    pub topology: String,
    /// Nodes.
    pub nodes: usize,
    /// Gain `η`.
    pub eta: f64,
    /// Filter parameter `α`.
    pub alpha: f64,
    /// `C / Λ`.
    pub capacity_factor: f64,
    /// Slots simulated.
    pub slots: u64,
    /// Slots per node cycle (`Δ`).
    pub slots_per_cycle: u64,
    /// Seed.
    pub seed: u64,
    /// Message loss probability.
    pub loss: f64,
    /// JFI at slot 0+ (after the first cycle).
    pub jfi_first: f64,
    /// JFI at the end.
    pub jfi_final: f64,
    /// Mean JFI over the last 10 % of the run.
    pub jfi_mean_last_10pct: f64,
    /// Slots until JFI stays ≥ 0.99 to the end; `null` if it does not.
    pub settle_slots_099: Option<u64>,
    /// The equilibrium `q* = (Λ − C)/N` (packets per slot).
    pub q_star: f64,
    /// Mean of the final `q_i` (`q*` up to the estimation error of `λ̂`).
    pub q_mean_final: f64,
    /// Largest `(Σ enforced − C)/C` (≤ 0: seed 003 Lemma 1 held).
    pub max_sum_over_limit: f64,
    /// Messages per node per cycle.
    pub messages_per_node_per_cycle: f64,
    /// Encoded bytes per node per cycle.
    pub bytes_per_node_per_cycle: f64,
}

impl RunReport {
    /// Summarises a trace of `setup`.
    #[must_use]
    pub fn new(s: &Setup, t: &Trace) -> Self {
        let last_slot = t.slot.last().copied().unwrap_or(0);
        let tail = last_slot - last_slot / 10;
        let per = (t.nodes as f64 * t.slot.len() as f64).max(1.0);
        let q_mean_final = if t.q_final.is_empty() {
            f64::NAN
        } else {
            t.q_final.iter().sum::<f64>() / t.q_final.len() as f64
        };
        Self {
            topology: s.topology_name.clone(),
            nodes: t.nodes,
            eta: t.eta,
            alpha: s.alpha,
            capacity_factor: s.capacity_factor,
            slots: s.slots,
            slots_per_cycle: s.slots_per_cycle,
            seed: s.seed,
            loss: s.loss,
            jfi_first: t.jfi.first().copied().unwrap_or(f64::NAN),
            jfi_final: t.jfi.last().copied().unwrap_or(f64::NAN),
            jfi_mean_last_10pct: t.mean_jfi(tail, u64::MAX),
            settle_slots_099: t.settle_slots(JFI_TARGET, 0, u64::MAX),
            q_star: (t.total_demand - t.capacity) / t.nodes.max(1) as f64,
            q_mean_final,
            max_sum_over_limit: clean(t.max_sum_over_limit),
            messages_per_node_per_cycle: t.messages as f64 / per,
            bytes_per_node_per_cycle: t.bytes as f64 / per,
        }
    }
}

fn clean(v: f64) -> f64 {
    if v.abs() < 1e-12 { 0.0 } else { v }
}

/// `gdrl-ring`: report and trace.
#[derive(Debug, Clone, PartialEq)]
pub struct RingOutcome {
    /// The summary.
    pub report: RunReport,
    /// The trace.
    pub trace: Trace,
}

/// Seed 003 §III-A: N limiters on a ring, `C = 1.1 Λ`.
///
/// # Errors
/// See [`simulate`].
pub fn ring(s: &Setup, progress: &mut dyn FnMut(u64, u64)) -> Result<RingOutcome, GdrlError> {
    let trace = simulate(s, progress)?;
    Ok(RingOutcome {
        report: RunReport::new(s, &trace),
        trace,
    })
}

/// One phase of `gdrl-dynamic`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// First slot.
    pub from: u64,
    /// End slot (exclusive).
    pub to: u64,
    /// What the demand does.
    pub demand: &'static str,
    /// Smallest JFI in the phase.
    pub jfi_min: f64,
    /// JFI at the end of the phase.
    pub jfi_end: f64,
    /// Slots from the phase start until JFI stays ≥ 0.99 to the phase end; `null` if not.
    pub settle_slots_099: Option<u64>,
}

/// `gdrl-dynamic`'s summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DynamicReport {
    /// The run as a whole.
    pub run: RunReport,
    /// `τ0` (slots).
    pub tau0: u64,
    /// The four phases.
    pub phases: Vec<Phase>,
}

/// `gdrl-dynamic`: report and trace.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamicOutcome {
    /// The summary.
    pub report: DynamicReport,
    /// The trace.
    pub trace: Trace,
}

/// Seed 003 §III-B: the ring with the demand of [`Demand::Dynamic`], load 90 %.
///
/// # Errors
/// See [`simulate`]; [`GdrlError::Invalid`] if the demand is not dynamic.
pub fn dynamic(s: &Setup, progress: &mut dyn FnMut(u64, u64)) -> Result<DynamicOutcome, GdrlError> {
    let Demand::Dynamic { tau0 } = s.demand else {
        return Err(GdrlError::Invalid(
            "gdrl-dynamic needs Demand::Dynamic".into(),
        ));
    };
    let trace = simulate(s, progress)?;
    let names = ["steady", "abrupt swap", "linear shift back", "steady again"];
    let phases = names
        .iter()
        .enumerate()
        .map(|(p, name)| {
            let (from, to) = (p as u64 * tau0, (p as u64 + 1) * tau0);
            let end = trace
                .slot
                .iter()
                .zip(&trace.jfi)
                .rfind(|(t, _)| **t < to)
                .map_or(f64::NAN, |(_, j)| *j);
            Phase {
                from,
                to,
                demand: name,
                jfi_min: trace.min_jfi(from, to),
                jfi_end: end,
                settle_slots_099: trace.settle_slots(JFI_TARGET, from, to),
            }
        })
        .collect();
    Ok(DynamicOutcome {
        report: DynamicReport {
            run: RunReport::new(s, &trace),
            tau0,
            phases,
        },
        trace,
    })
}

/// `gdrl-scale`: one report per (N, d), and their JFI traces.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleOutcome {
    /// `(N, d, report)`.
    pub cases: Vec<(usize, usize, RunReport)>,
    /// The traces, in the same order.
    pub traces: Vec<Trace>,
}

/// `gdrl-scale`'s JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScaleReport {
    /// One summary per case.
    pub cases: Vec<RunReport>,
}

/// Where [`scale`] is: case `case` (counted from 0, sizes then degrees) of `nodes` nodes of
/// degree `degree`, `done` of its `cycles` cycles.
#[derive(Debug, Clone, Copy)]
pub struct ScaleProgress<'a> {
    /// The case's index in the order the cases run.
    pub case: usize,
    /// Its number of nodes.
    pub nodes: usize,
    /// Its degree.
    pub degree: usize,
    /// Its topology's name.
    pub name: &'a str,
    /// Cycles done.
    pub done: u64,
    /// Cycles of the case (the same for every case).
    pub cycles: u64,
}

/// Seed 003 §III-C: random d-regular graphs of N nodes, `η = 1/(2d)`, load 90 %. Each case
/// draws its graph from `seed` and uses `template`'s other parameters.
///
/// # Errors
/// See [`simulate`]; a graph that cannot be drawn (e.g. `d ≥ N`).
pub fn scale(
    template: &Setup,
    sizes: &[usize],
    degrees: &[usize],
    progress: &mut dyn FnMut(ScaleProgress<'_>),
) -> Result<ScaleOutcome, GdrlError> {
    let mut out = ScaleOutcome {
        cases: Vec::new(),
        traces: Vec::new(),
    };
    let cases = sizes
        .iter()
        .flat_map(|&n| degrees.iter().map(move |&d| (n, d)));
    for (case, (n, d)) in cases.enumerate() {
        let mut s = Setup::regular(n, d, template.seed)?;
        s.alpha = template.alpha;
        s.capacity_factor = template.capacity_factor;
        s.slots = template.slots;
        s.slots_per_cycle = template.slots_per_cycle;
        s.loss = template.loss;
        s.eta = template.eta;
        s.record_nodes = false;
        let name = s.topology_name.clone();
        let t = simulate(&s, &mut |done, cycles| {
            progress(ScaleProgress {
                case,
                nodes: n,
                degree: d,
                name: &name,
                done,
                cycles,
            });
        })?;
        out.cases.push((n, d, RunReport::new(&s, &t)));
        out.traces.push(t);
    }
    Ok(out)
}

impl ScaleOutcome {
    /// The JSON summary.
    #[must_use]
    pub fn report(&self) -> ScaleReport {
        ScaleReport {
            cases: self.cases.iter().map(|c| c.2.clone()).collect(),
        }
    }

    /// Writes `jfi.csv` (slot, one JFI column per case), `cases.csv` and one
    /// `jfi-N<n>.svg` per size to `dir`.
    ///
    /// # Errors
    /// [`GdrlError::Io`].
    pub fn write(&self, dir: &Path) -> Result<(), GdrlError> {
        create(dir)?;
        let Some(first) = self.traces.first() else {
            return Ok(());
        };
        let mut w = csv_writer(&dir.join("jfi.csv"))?;
        let mut head = vec!["slot".to_string()];
        head.extend(self.cases.iter().map(|(n, d, _)| format!("n{n}_d{d}")));
        w.write_record(&head).map_err(io)?;
        for i in first.rows() {
            let mut rec = vec![first.slot[i].to_string()];
            rec.extend(
                self.traces
                    .iter()
                    .map(|t| t.jfi.get(i).map_or(String::new(), |j| format!("{j:.6}"))),
            );
            w.write_record(&rec).map_err(io)?;
        }
        w.flush().map_err(io)?;
        let mut w = csv_writer(&dir.join("cases.csv"))?;
        for (_, _, r) in &self.cases {
            w.serialize(r).map_err(io)?;
        }
        w.flush().map_err(io)?;
        let mut sizes: Vec<usize> = self.cases.iter().map(|c| c.0).collect();
        sizes.dedup();
        for n in sizes {
            let mut chart = LineChart::new(
                format!("seed 003 Fig. 7: JFI(q(t)), N = {n}, random d-regular, η = 1/(2d)"),
                "slot",
                "JFI",
            );
            for ((cn, d, _), t) in self.cases.iter().zip(&self.traces) {
                if *cn == n {
                    chart = chart.series(format!("d = {d}"), jfi_points(t));
                }
            }
            chart
                .write(&dir.join(format!("jfi-N{n}.svg")))
                .map_err(io)?;
        }
        Ok(())
    }
}

fn jfi_points(t: &Trace) -> Vec<(f64, f64)> {
    t.rows()
        .into_iter()
        .map(|i| (t.slot[i] as f64, t.jfi[i]))
        .collect()
}

fn io(e: impl std::fmt::Display) -> GdrlError {
    GdrlError::Io(e.to_string())
}

fn create(dir: &Path) -> Result<(), GdrlError> {
    std::fs::create_dir_all(dir).map_err(|e| GdrlError::Io(format!("{}: {e}", dir.display())))
}

fn csv_writer(path: &Path) -> Result<csv::Writer<std::fs::File>, GdrlError> {
    csv::Writer::from_path(path).map_err(|e| GdrlError::Io(format!("{}: {e}", path.display())))
}

impl Trace {
    /// Writes `trace.csv` (slot, JFI, and per node `q_i`, `λ̂_i`, `λ_i` when recorded),
    /// `q.svg` (Figs. 3 / 6 top), `jfi.svg` (Figs. 4 / 6 bottom) and, when recorded,
    /// `lambda.svg` (Fig. 5) to `dir`.
    ///
    /// # Errors
    /// [`GdrlError::Io`].
    pub fn write(&self, dir: &Path, demand: Demand, title: &str) -> Result<(), GdrlError> {
        create(dir)?;
        let n = self.nodes;
        let nodes = !self.q.is_empty();
        let mut w = csv_writer(&dir.join("trace.csv"))?;
        let mut head = vec!["slot".to_string(), "jfi".to_string()];
        if nodes {
            head.extend((1..=n).map(|i| format!("q{i}")));
            head.extend((1..=n).map(|i| format!("lambda_hat{i}")));
            head.extend((1..=n).map(|i| format!("lambda{i}")));
        }
        w.write_record(&head).map_err(io)?;
        let rows = self.rows();
        for &r in &rows {
            let mut rec = vec![self.slot[r].to_string(), format!("{:.6}", self.jfi[r])];
            if nodes {
                rec.extend(self.q[r].iter().map(|v| format!("{v:.6}")));
                rec.extend(self.lambda_hat[r].iter().map(|v| format!("{v:.6}")));
                rec.extend((0..n).map(|i| format!("{:.6}", demand.lambda(i, n, self.slot[r]))));
            }
            w.write_record(&rec).map_err(io)?;
        }
        w.flush().map_err(io)?;
        LineChart::new(format!("{title}: JFI(q(t)) (eq. 16)"), "slot", "JFI")
            .series("JFI", jfi_points(self))
            .write(&dir.join("jfi.svg"))
            .map_err(io)?;
        if nodes {
            let mut chart = LineChart::new(
                format!("{title}: q_i(t) = λ̂_i − C_i"),
                "slot",
                "packets per slot",
            );
            for i in 0..n {
                let pts = rows
                    .iter()
                    .map(|&r| (self.slot[r] as f64, self.q[r][i]))
                    .collect();
                chart = chart.series(format!("q{}", i + 1), pts);
            }
            chart.write(&dir.join("q.svg")).map_err(io)?;
            let mut chart = LineChart::new(
                format!("{title}: λ_i(t) and the low-pass estimates λ̂_i(t)"),
                "slot",
                "packets per slot",
            );
            for i in 0..n {
                let est = rows
                    .iter()
                    .map(|&r| (self.slot[r] as f64, self.lambda_hat[r][i]))
                    .collect();
                chart = chart.series(format!("λ̂{}", i + 1), est);
            }
            chart.write(&dir.join("lambda.svg")).map_err(io)?;
        }
        Ok(())
    }
}
