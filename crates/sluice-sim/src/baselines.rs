//! `sluice sim baselines`: Sluice next to the ways other systems share a global limit, on
//! the `sluice sim cluster` workloads, with the same workload and seed for everyone.
//!
//! * `sluice`, `dst-sync`, `static`: [`crate::cluster::run`] (the real nodes; seed 000 eq. 3
//!   in synchronous rounds as published; `L/N` for ever).
//! * The others are small direct implementations of the published designs, NOT Sluice,
//!   written here as baselines in the same cycle model (a cycle is 100 ms; node `i` has
//!   demand `r_i(k)` capacity units in cycle `k` and admits `a_i(k) ≤ r_i(k)`):
//!   - `grd`: Global Random Drop (Raghavan et al., SIGCOMM 2007 §3.2; seed 003 §I-C): every
//!     limiter sends its last-interval demand to every other (the DRL paper's mesh) and
//!     drops with probability `max(0, 1 − L/T̂)`, `T̂` the sum of the last reports.
//!   - `fps`: Flow Proportional Share (same paper §3.3) with demand as the weight (the
//!     workloads have no TCP flows): local limit `L·w_i/Σ ŵ_j` from the last reports.
//!   - `central`: one exact token bucket (`L` per cycle) asked once per request (seed 002's
//!     central token server): a request counts when it reaches the bucket, and is admitted
//!     when the answer comes back; lost answers fail closed.
//!   - `owner`: Gubernator's `GLOBAL` behaviour: the key's owner holds the bucket (`10·L`
//!     per 1 s window, the usual "per second" limit), the other nodes answer from a cached
//!     copy of the owner's last broadcast, send their hits to the owner once per cycle
//!     (the 100 ms sync), and the owner broadcasts its remaining count every cycle.
//!   - `doorman`: Doorman-style leases: a capacity server grants each client a lease
//!     (max-min fair share of `L` over the reported wants, never more than is free) for
//!     20 cycles; clients refresh every 5 cycles (staggered) and fall to 0 when a lease
//!     runs out.
//!
//! Metrics, computed the same way for every strategy from the per-cycle totals:
//! over-throttling `Σ max(0, min(L, r) − a) / Σ min(L, r)`, overshoot
//! `Σ max(0, a − L) / Σ L` (seed 000 §6), Jain's index of the Case I indicator `r_i − x_i`
//! at the end (seed 003 eq. 16; `x_i` is the node's enforced limit, or for baselines without
//! one, what it admitted), and messages and encoded bytes per node per second (the central
//! servers' messages are divided among the nodes too).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use sluice_coord::law::jfi;
use sluice_coord::testing::Rng;
use sluice_graph::TopologySpec;

use crate::cluster::{self, ClusterError, CycleRow, Demand, Scenario, Strategy, Workload};

/// Cycles per second (a cycle is 100 ms, as in `sluice sim cluster`).
const CYCLES_PER_SECOND: f64 = 10.0;
/// Bytes of a report, a hit count or an RPC: the key and one number (8 + 8).
const SMALL_MESSAGE_BYTES: u64 = 16;
/// Bytes of an owner broadcast or a lease message: key and two numbers.
const LEASE_MESSAGE_BYTES: u64 = 24;
/// `owner`: the bucket's window in cycles (a limit "per second" with 100 ms syncs).
pub const OWNER_WINDOW_CYCLES: u64 = 10;
/// `doorman`: cycles between a client's lease refreshes.
pub const DOORMAN_REFRESH_CYCLES: u64 = 5;
/// `doorman`: lease length in cycles.
pub const DOORMAN_LEASE_CYCLES: u64 = 20;

/// A way of sharing the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// The real Sluice nodes.
    Sluice,
    /// Seed 000 eq. 3 in synchronous rounds, as published.
    DstSync,
    /// `L/N` for ever.
    Static,
    /// Global Random Drop.
    Grd,
    /// Flow Proportional Share.
    Fps,
    /// One central exact token bucket, one round trip per request.
    Central,
    /// One owner per key; the others forward hits and answer from a cache (Gubernator).
    Owner,
    /// Leases from a capacity server (Doorman).
    Doorman,
}

impl Baseline {
    /// Every strategy, in table order.
    pub const ALL: [Self; 8] = [
        Self::Sluice,
        Self::DstSync,
        Self::Static,
        Self::Grd,
        Self::Fps,
        Self::Central,
        Self::Owner,
        Self::Doorman,
    ];

    /// The name used on the command line and in tables.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Sluice => "sluice",
            Self::DstSync => "dst-sync",
            Self::Static => "static",
            Self::Grd => "grd",
            Self::Fps => "fps",
            Self::Central => "central",
            Self::Owner => "owner",
            Self::Doorman => "doorman",
        }
    }
}

impl fmt::Display for Baseline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Baseline {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self, ClusterError> {
        Self::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|b| b.name()).collect();
                ClusterError::Invalid(format!(
                    "unknown strategy `{s}` (expected one of: {})",
                    names.join(", ")
                ))
            })
    }
}

impl Serialize for Baseline {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The comparison to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// The communication graph of Sluice and dst-sync (the others do not use one).
    pub topology: TopologySpec,
    /// Workloads.
    pub workloads: Vec<Workload>,
    /// Strategies.
    pub strategies: Vec<Baseline>,
    /// Loss probabilities to run (each workload and strategy once per value).
    pub losses: Vec<f64>,
    /// Cycles per run.
    pub cycles: u64,
    /// Seed of everything random.
    pub seed: u64,
    /// The global limit `L` per cycle.
    pub limit: u64,
}

impl Setup {
    /// Every workload and strategy on `ring:10`, 1000 cycles, `L = 10000`, loss 0 and 0.1,
    /// seed 1.
    #[must_use]
    pub fn new(topology: TopologySpec) -> Self {
        Self {
            topology,
            workloads: vec![
                Workload::Steady,
                Workload::Skewed,
                Workload::Shift,
                Workload::Hotspot,
                Workload::PaperEx2,
            ],
            strategies: Baseline::ALL.to_vec(),
            losses: vec![0.0, 0.1],
            cycles: 1000,
            seed: 1,
            limit: 10_000,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Workload.
    pub workload: Workload,
    /// Message loss probability.
    pub loss: f64,
    /// Strategy.
    pub strategy: Baseline,
    /// Over-throttling, % of `Σ min(L, r)`.
    pub over_throttling_pct: f64,
    /// Overshoot, % of `Σ L`.
    pub overshoot_pct: f64,
    /// Jain's index of `r_i − x_i` at the end.
    pub jfi_final: f64,
    /// Messages per node per second.
    pub messages_per_node_per_s: f64,
    /// Encoded bytes per node per second.
    pub bytes_per_node_per_s: f64,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    /// Topology of Sluice and dst-sync.
    pub topology: String,
    /// Nodes.
    pub nodes: usize,
    /// Cycles per run (100 ms each).
    pub cycles: u64,
    /// Seed.
    pub seed: u64,
    /// `L` per cycle.
    pub limit: u64,
    /// The rows: workload-major, then loss, then strategy.
    pub rows: Vec<Row>,
}

/// Per-cycle totals of one run and what the summary needs.
struct Raw {
    /// `(ideal, accepted)` per cycle.
    cycles: Vec<(f64, f64)>,
    jfi_final: f64,
    messages: f64,
    bytes: f64,
}

/// Runs the comparison; `progress(done, total)` after each run.
///
/// # Errors
/// [`ClusterError`] for a bad topology or parameter.
pub fn run(s: &Setup, progress: &mut dyn FnMut(usize, usize)) -> Result<Table, ClusterError> {
    let n = s.topology.build_seeded(Some(s.seed))?.nodes();
    if n < 2 {
        return Err(ClusterError::Invalid("at least two nodes".into()));
    }
    if s.cycles == 0 || s.limit == 0 {
        return Err(ClusterError::Invalid(
            "cycles and the limit must be positive".into(),
        ));
    }
    if let Some(p) = s.losses.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(ClusterError::Invalid(format!(
            "loss {p}: a probability in [0, 1]"
        )));
    }
    let total = s.workloads.len() * s.losses.len() * s.strategies.len();
    let mut rows = Vec::with_capacity(total);
    for &w in &s.workloads {
        let demand = Demand::new(w, n, s.limit as f64, s.cycles, s.seed);
        for &loss in &s.losses {
            for &b in &s.strategies {
                let raw = match b {
                    Baseline::Sluice => via_cluster(s, w, loss, Strategy::Sluice)?,
                    Baseline::DstSync => via_cluster(s, w, loss, Strategy::DstSync)?,
                    Baseline::Static => via_cluster(s, w, loss, Strategy::Static)?,
                    other => direct(other, s, &demand, loss, n),
                };
                rows.push(summarise(w, loss, b, &raw, s, n));
                progress(rows.len(), total);
            }
        }
    }
    Ok(Table {
        topology: s.topology.to_string(),
        nodes: n,
        cycles: s.cycles,
        seed: s.seed,
        limit: s.limit,
        rows,
    })
}

fn via_cluster(s: &Setup, w: Workload, loss: f64, st: Strategy) -> Result<Raw, ClusterError> {
    let mut sc = Scenario::new(s.topology.clone(), st, w);
    sc.cycles = s.cycles;
    sc.seed = s.seed;
    sc.limit = Some(s.limit);
    sc.loss = loss;
    let out = cluster::run(&sc, &mut |_, _| {})?;
    let r = &out.report;
    let per = r.nodes as f64 * r.cycles as f64;
    Ok(Raw {
        cycles: out
            .trace
            .iter()
            .map(|c: &CycleRow| (c.ideal, c.accepted))
            .collect(),
        jfi_final: r.jfi_final,
        messages: r.messages_per_node_per_cycle * per,
        bytes: r.bytes_per_node_per_cycle * per,
    })
}

fn summarise(w: Workload, loss: f64, b: Baseline, raw: &Raw, s: &Setup, n: usize) -> Row {
    let l = s.limit as f64;
    let ideal: f64 = raw.cycles.iter().map(|c| c.0).sum();
    let lost: f64 = raw.cycles.iter().map(|c| (c.0 - c.1).max(0.0)).sum();
    let over: f64 = raw.cycles.iter().map(|c| (c.1 - l).max(0.0)).sum();
    let seconds = raw.cycles.len() as f64 / CYCLES_PER_SECOND;
    let per = (n as f64 * seconds).max(f64::MIN_POSITIVE);
    // Float noise of the baselines' arithmetic is not a breach of the limit.
    let clean = |v: f64| if v.abs() < 1e-9 { 0.0 } else { v };
    Row {
        workload: w,
        loss,
        strategy: b,
        over_throttling_pct: if ideal > 0.0 {
            clean(lost / ideal * 100.0)
        } else {
            0.0
        },
        overshoot_pct: clean(over / (l * raw.cycles.len().max(1) as f64) * 100.0),
        jfi_final: raw.jfi_final,
        messages_per_node_per_s: raw.messages / per,
        bytes_per_node_per_s: raw.bytes / per,
    }
}

/// The baselines implemented here, in the same cycle model.
fn direct(b: Baseline, s: &Setup, demand: &Demand, loss: f64, n: usize) -> Raw {
    let mut rng = Rng::new(s.seed ^ 0xBA5E_11E5 ^ ((b as u64) << 40));
    let mut lost = move || rng.next_f64() < loss;
    let l = s.limit as f64;
    let mut st = State::new(b, n, l);
    let mut raw = Raw {
        cycles: Vec::with_capacity(s.cycles as usize),
        jfi_final: 1.0,
        messages: 0.0,
        bytes: 0.0,
    };
    let mut p = vec![0.0; n];
    for k in 0..s.cycles {
        let r = demand.at(k);
        let a = st.cycle(k, &r, loss, &mut lost, &mut raw);
        let total_r: f64 = r.iter().sum();
        raw.cycles.push((total_r.min(l), a.iter().sum()));
        for ((pi, ri), ai) in p.iter_mut().zip(&r).zip(&a) {
            *pi = ri - ai;
        }
    }
    raw.jfi_final = jfi(&p);
    raw
}

/// The state of one direct baseline.
struct State {
    b: Baseline,
    n: usize,
    l: f64,
    /// grd / fps: `known[i][j]`, the last demand of `j` that reached `i`.
    known: Vec<Vec<f64>>,
    /// grd / fps: each node's own demand of the last cycle.
    last: Vec<f64>,
    /// owner: the owner's bucket and every node's cached remaining count.
    bucket: f64,
    cache: Vec<f64>,
    /// doorman: the server's view `(wants, granted, expiry)` and the clients' leases
    /// `(capacity, expiry)`.
    server: Vec<(f64, f64, u64)>,
    lease: Vec<(f64, u64)>,
}

impl State {
    fn new(b: Baseline, n: usize, l: f64) -> Self {
        Self {
            b,
            n,
            l,
            known: vec![vec![0.0; n]; n],
            last: vec![0.0; n],
            bucket: 0.0,
            cache: vec![0.0; n],
            server: vec![(0.0, 0.0, 0); n],
            lease: vec![(0.0, 0); n],
        }
    }

    fn owner(&self) -> usize {
        // The key's owner: hash(key) mod N, with the one key of the workloads (key 1).
        1 % self.n
    }

    /// Admits cycle `k`'s demand `r`; returns what each node admitted.
    fn cycle(
        &mut self,
        k: u64,
        r: &[f64],
        loss: f64,
        lost: &mut dyn FnMut() -> bool,
        raw: &mut Raw,
    ) -> Vec<f64> {
        let (n, l) = (self.n, self.l);
        let mut send = |count: f64, bytes: u64| {
            raw.messages += count;
            raw.bytes += count * bytes as f64;
        };
        match self.b {
            Baseline::Grd | Baseline::Fps => {
                let a: Vec<f64> = (0..n)
                    .map(|i| {
                        // The estimate of the last interval: own and reported demands.
                        let t: f64 = self.last[i]
                            + (0..n)
                                .filter(|&j| j != i)
                                .map(|j| self.known[i][j])
                                .sum::<f64>();
                        if self.b == Baseline::Grd {
                            let keep = if t > l { l / t } else { 1.0 };
                            r[i] * keep
                        } else {
                            let limit = if t > 0.0 {
                                l * self.last[i] / t
                            } else {
                                l / n as f64
                            };
                            r[i].min(limit)
                        }
                    })
                    .collect();
                // End of the interval: every limiter reports its demand to every other.
                for (i, &ri) in r.iter().enumerate().take(n) {
                    self.last[i] = ri;
                    for j in (0..n).filter(|&j| j != i) {
                        send(1.0, SMALL_MESSAGE_BYTES);
                        if !lost() {
                            self.known[j][i] = ri;
                        }
                    }
                }
                a
            }
            Baseline::Central => {
                // Fluid: a fraction (1 − loss) of the requests reaches the bucket, the
                // bucket admits up to L of them, a fraction (1 − loss) of the answers
                // comes back. Each request and each answer is a message.
                let reach: Vec<f64> = r.iter().map(|v| v * (1.0 - loss)).collect();
                let arrived: f64 = reach.iter().sum();
                let keep = if arrived > l { l / arrived } else { 1.0 };
                let total_r: f64 = r.iter().sum();
                send(total_r + arrived, SMALL_MESSAGE_BYTES);
                reach.iter().map(|v| v * keep * (1.0 - loss)).collect()
            }
            Baseline::Owner => {
                let o = self.owner();
                let window = OWNER_WINDOW_CYCLES as f64 * l;
                if k.is_multiple_of(OWNER_WINDOW_CYCLES) {
                    // A new window: the owner refills, and every cache sees its reset time
                    // pass and starts from a full bucket too.
                    self.bucket = window;
                    self.cache.iter_mut().for_each(|c| *c = window);
                }
                let mut a = vec![0.0; n];
                for i in 0..n {
                    if i == o {
                        a[i] = r[i].min(self.bucket);
                        self.bucket -= a[i];
                    } else {
                        a[i] = r[i].min(self.cache[i].max(0.0));
                        self.cache[i] -= a[i];
                    }
                }
                // The sync: hits to the owner, then the owner's remaining count to all.
                for i in (0..n).filter(|&i| i != o && a[i] > 0.0) {
                    send(1.0, SMALL_MESSAGE_BYTES);
                    if !lost() {
                        self.bucket = (self.bucket - a[i]).max(0.0);
                    }
                }
                for i in (0..n).filter(|&i| i != o) {
                    send(1.0, LEASE_MESSAGE_BYTES);
                    if !lost() {
                        self.cache[i] = self.bucket;
                    }
                }
                a
            }
            Baseline::Doorman => {
                for (i, &ri) in r.iter().enumerate().take(n) {
                    if (k + i as u64).is_multiple_of(DOORMAN_REFRESH_CYCLES) {
                        send(1.0, LEASE_MESSAGE_BYTES);
                        if lost() {
                            continue;
                        }
                        self.server[i].0 = ri;
                        let grant = self.grant(i, k);
                        self.server[i].1 = grant;
                        self.server[i].2 = k + DOORMAN_LEASE_CYCLES;
                        send(1.0, LEASE_MESSAGE_BYTES);
                        if !lost() {
                            self.lease[i] = (grant, k + DOORMAN_LEASE_CYCLES);
                        }
                    }
                }
                (0..n)
                    .map(|i| {
                        let (cap, until) = self.lease[i];
                        if k < until { r[i].min(cap) } else { 0.0 }
                    })
                    .collect()
            }
            Baseline::Sluice | Baseline::DstSync | Baseline::Static => vec![0.0; n],
        }
    }

    /// Doorman's fair share: the max-min fair split of `L` over the wants the server knows
    /// (water filling), capped by what other unexpired leases leave free.
    fn grant(&self, i: usize, k: u64) -> f64 {
        let live = |j: usize| self.server[j].2 > k || j == i;
        let mut wants: Vec<(usize, f64)> = (0..self.n)
            .filter(|&j| live(j))
            .map(|j| (j, self.server[j].0))
            .collect();
        wants.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (mut left, mut fair_i) = (self.l, 0.0);
        let count = wants.len();
        for (idx, (j, w)) in wants.into_iter().enumerate() {
            let share = left / (count - idx) as f64;
            let give = w.min(share);
            left -= give;
            if j == i {
                fair_i = give;
            }
        }
        let held: f64 = (0..self.n)
            .filter(|&j| j != i && self.server[j].2 > k)
            .map(|j| self.server[j].1)
            .sum();
        fair_i.min((self.l - held).max(0.0))
    }
}

/// Total demand per cycle of a workload, as this module generates it (for the check that it
/// matches `sluice sim cluster`).
#[must_use]
pub fn total_demand(w: Workload, n: usize, limit: u64, cycles: u64, seed: u64) -> Vec<f64> {
    let d = Demand::new(w, n, limit as f64, cycles, seed);
    (0..cycles).map(|k| d.at(k).iter().sum()).collect()
}

impl Table {
    /// Writes `baselines.csv` (the rows) and one `error-loss-<loss>.svg` chart per loss
    /// (over-throttling + overshoot per strategy and workload) to `dir`.
    ///
    /// # Errors
    /// [`ClusterError::Invalid`] naming the I/O problem.
    pub fn write(&self, dir: &std::path::Path) -> Result<(), ClusterError> {
        let io = |e: &dyn fmt::Display| ClusterError::Invalid(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| io(&e))?;
        let mut w = csv::Writer::from_path(dir.join("baselines.csv")).map_err(|e| io(&e))?;
        for r in &self.rows {
            w.serialize(r).map_err(|e| io(&e))?;
        }
        w.flush().map_err(|e| io(&e))?;
        // Rows are workload-major: the same losses repeat for every workload.
        let mut losses: Vec<f64> = self.rows.iter().map(|r| r.loss).collect();
        losses.sort_by(f64::total_cmp);
        losses.dedup_by(|a, b| a.to_bits() == b.to_bits());
        let mut workloads: Vec<Workload> = Vec::new();
        for r in &self.rows {
            if !workloads.contains(&r.workload) {
                workloads.push(r.workload);
            }
        }
        for loss in losses {
            let mut chart = crate::chart::LineChart::new(
                format!(
                    "over-throttling and overshoot by strategy, loss {loss} (x: workloads {})",
                    workloads
                        .iter()
                        .enumerate()
                        .map(|(i, w)| format!("{i}={w}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                "workload",
                "% (over-throttling + overshoot)",
            );
            for b in Baseline::ALL {
                let pts: Vec<(f64, f64)> = self
                    .rows
                    .iter()
                    .filter(|r| r.strategy == b && r.loss.to_bits() == loss.to_bits())
                    .filter_map(|r| {
                        let x = workloads.iter().position(|w| *w == r.workload)?;
                        Some((x as f64, r.over_throttling_pct + r.overshoot_pct))
                    })
                    .collect();
                if !pts.is_empty() {
                    chart = chart.series(b.name(), pts);
                }
            }
            chart
                .write(&dir.join(format!("error-loss-{loss}.svg")))
                .map_err(|e| io(&e))?;
        }
        Ok(())
    }
}
