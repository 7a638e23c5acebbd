//! Seed 004 §4: token accounts against the purely proactive baseline, in the paper's three
//! applications — push gossip and gossip learning on a fixed random 20-out overlay, chaotic
//! power iteration on a Watts–Strogatz ring — at equal message count (one token per node per
//! period `Δ`).
//!
//! Every node's pacing is a production [`TokenAccount`] from `sluice-coord` (seed 004 Alg. 4);
//! this module only supplies the applications (`createMessage` / `updateState` of §3.2), the
//! overlay, message transfer and virtual time. Time is in milliseconds with the paper's
//! constants: `Δ = 172.8 s`, transfer time `Δ/100 = 1.728 s`, a push-gossip update injected
//! every `Δ/10`, 1,000 periods (two virtual days) by default.
//!
//! Two event sources, both O(1) per event and bounded in memory whatever the run length:
//! - **Messages** all take the same transfer time, so they arrive in the order they were sent:
//!   the queue is one FIFO ring buffer ([`VecDeque`]) holding only the messages in flight
//!   (about `N/100` plus bursts — a few hundred kilobytes at N = 500,000).
//! - **Period ends** of node `i` fall on `phase_i + kΔ`, a fixed cyclic schedule: the nodes
//!   are kept sorted by phase and a cursor walks that list, wrapping once per period, so
//!   period ends never enter a queue. On the random 20-out overlay, node labels carry no
//!   structure, so the sorted phases are handed out in label order (the joint law of overlay,
//!   phases and injections is invariant under relabelling) and every period's accounts are
//!   touched in memory order; the Watts–Strogatz ring keeps truly random phases.
//!
//! Virtual time jumps from event to event (millisecond resolution; push gossip's lag is
//! integrated exactly between events), and the run is deterministic: same [`Config`], same
//! [`Outcome`], bit for bit.
//!
//! ```
//! use sluice_coord::pacing::Strategy;
//! use sluice_sim::token_account::{App, Config, run};
//!
//! let proactive = run(&Config::new(App::PushGossip, Strategy::Proactive, 300, 40, 1), &mut |_, _| {}).unwrap();
//! let tokens = Strategy::randomized(5, 10).unwrap();
//! let randomized = run(&Config::new(App::PushGossip, tokens, 300, 40, 1), &mut |_, _| {}).unwrap();
//! // Same budget (at most one message per node per period), far fresher updates.
//! assert!(randomized.messages_per_node_period <= 1.0);
//! assert!(randomized.metric < proactive.metric);
//! ```

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sluice_coord::pacing::{PacingError, Strategy, TokenAccount};

use crate::chart::LineChart;

mod models;

use models::{GossipLearning, Model, PushGossip, out_overlay, watts_strogatz};

/// The proactive period `Δ = 172.8 s`, in milliseconds (seed 004 §4.1).
pub const DELTA_MS: u64 = 172_800;
/// Transfer time of one message, `Δ/100 = 1.728 s` (seed 004 §4.1).
pub const TRANSFER_MS: u64 = DELTA_MS / 100;
/// Push gossip: a new update is injected at a random node every `Δ/10 = 17.28 s` (§4.1.2).
pub const INJECT_MS: u64 = DELTA_MS / 10;
/// Out-degree of the random overlay of push gossip and gossip learning (§4.1).
pub const OUT_DEGREE: usize = 20;
/// Curve points recorded per run.
const SAMPLES: u64 = 400;

/// Errors of the experiment.
#[derive(Debug, thiserror::Error)]
pub enum TokenAccountError {
    /// Invalid token-account parameters.
    #[error(transparent)]
    Pacing(#[from] PacingError),
    /// Inconsistent experiment configuration.
    #[error("{0}")]
    Config(String),
    /// Writing results failed.
    #[error("writing results: {0}")]
    Io(#[from] std::io::Error),
}

/// The three applications of seed 004 §2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum App {
    /// Push gossip (Alg. 2, §4.1.2): metric = mean lag behind the freshest update (eq. 7).
    PushGossip,
    /// Gossip learning (Alg. 1, §4.1.1): metric = visited nodes relative to a hot potato (eq. 6).
    GossipLearning,
    /// Chaotic asynchronous power iteration (Alg. 3, §4.1.3): metric = angle to the
    /// dominant eigenvector.
    PowerIteration,
}

impl App {
    /// All three, in the paper's order of §4.
    pub const ALL: [App; 3] = [App::PushGossip, App::GossipLearning, App::PowerIteration];

    /// Short name (CLI and file names).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            App::PushGossip => "push-gossip",
            App::GossipLearning => "gossip-learning",
            App::PowerIteration => "power-iteration",
        }
    }

    /// What [`Outcome::metric`] measures.
    #[must_use]
    pub fn metric_name(self) -> &'static str {
        match self {
            App::PushGossip => "mean lag behind the freshest update, 2nd half (s)",
            App::GossipLearning => "visited nodes / hot-potato walk at the end (eq. 6)",
            App::PowerIteration => "angle to the dominant eigenvector at the end (rad)",
        }
    }

    /// Whether a smaller metric is better.
    #[must_use]
    pub fn lower_is_better(self) -> bool {
        !matches!(self, App::GossipLearning)
    }
}

impl std::str::FromStr for App {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "push" | "push-gossip" => Ok(App::PushGossip),
            "learning" | "gossip-learning" => Ok(App::GossipLearning),
            "power" | "power-iteration" => Ok(App::PowerIteration),
            _ => Err(format!(
                "unknown application {s:?} (push-gossip, gossip-learning, power-iteration)"
            )),
        }
    }
}

/// A strategy's label, e.g. `randomized A=5 C=10`.
#[must_use]
pub fn label(s: Strategy) -> String {
    match s {
        Strategy::Proactive => "proactive".to_string(),
        Strategy::Simple { c } => format!("simple C={c}"),
        Strategy::Generalized { a, c } => format!("generalized A={a} C={c}"),
        Strategy::Randomized { a, c } => format!("randomized A={a} C={c}"),
    }
}

fn kind(s: Strategy) -> &'static str {
    match s {
        Strategy::Proactive => "proactive",
        Strategy::Simple { .. } => "simple",
        Strategy::Generalized { .. } => "generalized",
        Strategy::Randomized { .. } => "randomized",
    }
}

/// The paper's parameter grid (§4.2): `A ∈ {1,2,5,10,15,20,40}`, `C − A ∈ {0,1,2,5,10,15,20,40,80}`.
#[must_use]
pub fn paper_pairs() -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for a in [1, 2, 5, 10, 15, 20, 40] {
        for d in [0, 1, 2, 5, 10, 15, 20, 40, 80] {
            v.push((a, a + d));
        }
    }
    v
}

/// A representative selection of the grid (the settings §4.2 discusses by name).
#[must_use]
pub fn default_pairs() -> Vec<(u32, u32)> {
    vec![(1, 5), (1, 10), (2, 20), (5, 10), (10, 10), (10, 20)]
}

/// Proactive, then simple (one per distinct `C`), generalized and randomized for each pair.
#[must_use]
pub fn strategies(pairs: &[(u32, u32)], kinds: &[&str]) -> Vec<Strategy> {
    let mut out = vec![Strategy::Proactive];
    let want = |k: &str| kinds.is_empty() || kinds.contains(&k);
    if want("simple") {
        let mut cs: Vec<u32> = pairs.iter().map(|&(_, c)| c).collect();
        cs.sort_unstable();
        cs.dedup();
        out.extend(cs.into_iter().filter(|&c| c > 0).map(Strategy::simple));
    }
    for &(a, c) in pairs {
        if want("generalized") && a >= 1 {
            out.push(Strategy::Generalized { a, c });
        }
        if want("randomized") && a >= 1 && a <= c {
            out.push(Strategy::Randomized { a, c });
        }
    }
    out
}

/// One simulation run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// The application.
    pub app: App,
    /// Every node's token-account strategy.
    pub strategy: Strategy,
    /// Network size `N`.
    pub nodes: usize,
    /// Periods `Δ` to simulate.
    pub periods: u64,
    /// RNG seed (overlay, phases, initial values and every random choice).
    pub seed: u64,
}

impl Config {
    /// A run with the given parameters.
    #[must_use]
    pub fn new(app: App, strategy: Strategy, nodes: usize, periods: u64, seed: u64) -> Self {
        Self {
            app,
            strategy,
            nodes,
            periods,
            seed,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// Application.
    pub app: App,
    /// Strategy label.
    pub strategy: String,
    /// `proactive`, `simple`, `generalized` or `randomized`.
    pub kind: &'static str,
    /// `A` (generalized, randomized).
    pub a: Option<u32>,
    /// `C` (all but proactive).
    pub c: Option<u32>,
    /// Network size.
    pub nodes: usize,
    /// Periods simulated.
    pub periods: u64,
    /// Seed.
    pub seed: u64,
    /// The application's headline metric (see [`App::metric_name`]).
    pub metric: f64,
    /// Speed-up over the proactive run of the same application and seed, filled in by
    /// [`compare`]: lag ratio (push gossip), metric ratio (gossip learning), ratio of the
    /// times needed to reach the proactive run's final angle (power iteration).
    pub speedup: Option<f64>,
    /// Messages sent per node per period (the budget is 1).
    pub messages_per_node_period: f64,
    /// Average balance over nodes and over the second half of the run.
    pub mean_tokens: f64,
    /// Seed 004 §4.3 mean-field balance `A·C/(C+1)` (randomized strategy, u = 1).
    pub predicted_tokens: Option<f64>,
    /// The same mean-field balance with the measured fraction `u` of useful messages in
    /// place of u = 1: `A·C/(u·(C − A + 1) + A)` (randomized strategy).
    pub predicted_tokens_measured_u: Option<f64>,
    /// Fraction of received messages that were useful (§3.2).
    pub useful_fraction: f64,
    /// Events processed: period ends plus message deliveries (plus injections).
    pub events: u64,
    /// Most messages in flight at once.
    pub peak_in_flight: u64,
    /// Bytes of simulation state at its peak, accounted (accounts, overlay or graph,
    /// application state, period schedule, the message ring buffer at its largest capacity,
    /// curves) — independent of the allocator, so reproducible; peak RSS adds the binary,
    /// allocator slack and the other runs in parallel.
    pub state_bytes: u64,
    /// Metric over time: (period, value).
    #[serde(skip)]
    pub series: Vec<(f64, f64)>,
    /// Average balance over time: (period, tokens).
    #[serde(skip)]
    pub tokens_series: Vec<(f64, f64)>,
}

/// A message in flight, 24 bytes.
#[derive(Debug, Clone, Copy)]
struct Message {
    /// Delivery time (ms).
    at: u64,
    to: u32,
    from: u32,
    payload: u64,
}

/// Runs one configuration. `progress(done, total)` is called every tenth of the run
/// (periods).
pub fn run(cfg: &Config, progress: &mut dyn FnMut(u64, u64)) -> Result<Outcome, TokenAccountError> {
    let strategy = cfg.strategy.validated()?;
    if cfg.nodes < 2 * OUT_DEGREE + 2 {
        return Err(TokenAccountError::Config(format!(
            "need at least {} nodes, got {}",
            2 * OUT_DEGREE + 2,
            cfg.nodes
        )));
    }
    if u32::try_from(cfg.nodes).is_err() || cfg.nodes == u32::MAX as usize {
        return Err(TokenAccountError::Config(format!(
            "too many nodes: {}",
            cfg.nodes
        )));
    }
    if cfg.periods < 2 || cfg.periods > 1_000_000 {
        return Err(TokenAccountError::Config(format!(
            "periods must be in 2..=1000000, got {}",
            cfg.periods
        )));
    }
    // The topology and initial values depend on the seed only, so every strategy of one
    // seed runs on the same network (common random numbers).
    let mut topo_rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let end = cfg.periods * DELTA_MS;
    match cfg.app {
        App::PushGossip => {
            let overlay = out_overlay(cfg.nodes, &mut topo_rng);
            simulate(PushGossip::new(overlay, end), cfg, strategy, progress)
        }
        App::GossipLearning => {
            let overlay = out_overlay(cfg.nodes, &mut topo_rng);
            simulate(GossipLearning::new(overlay), cfg, strategy, progress)
        }
        App::PowerIteration => {
            let model = watts_strogatz(cfg.nodes, &mut topo_rng)?;
            simulate(model, cfg, strategy, progress)
        }
    }
}

/// How far ahead in the message queue [`Model::touch`] reaches: enough deliveries for the
/// loads to arrive from memory before they are needed, few enough to stay in cache.
const LOOKAHEAD: usize = 8;

fn simulate<M: Model>(
    mut model: M,
    cfg: &Config,
    strategy: Strategy,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Outcome, TokenAccountError> {
    let n = cfg.nodes;
    let end = cfg.periods * DELTA_MS;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x7A11_0C0A_u64.rotate_left(32));
    // Unsynchronised rounds (§2.1): every node starts its periods at a random phase.
    let mut phases: Vec<u64> = (0..n).map(|_| rng.random_range(0..DELTA_MS)).collect();
    if model.exchangeable() {
        phases.sort_unstable();
    }
    let accounts: Result<Vec<TokenAccount>, PacingError> = phases
        .iter()
        .map(|&p| TokenAccount::new(strategy, DELTA_MS, p))
        .collect();
    let mut accounts = accounts?;
    // The cyclic schedule of period ends: (phase, node), sorted; node i's k-th period ends at
    // phase_i + kΔ, k ≥ 1 (`TokenAccount::new` at `phase_i`).
    let mut schedule: Vec<(u64, u32)> = phases
        .iter()
        .enumerate()
        .map(|(i, &p)| (p, i as u32))
        .collect();
    schedule.sort_unstable();
    drop(phases);
    let mut cursor = 0usize;
    let mut round = DELTA_MS;
    let mut queue: VecDeque<Message> = VecDeque::new();
    let mut peak_queue_capacity = 0usize;
    let mut peak_in_flight = 0usize;

    let sample_every = (end / SAMPLES).max(1);
    let mut next_sample = sample_every;
    let mut series = Vec::with_capacity(SAMPLES as usize + 1);
    let mut tokens_series = Vec::with_capacity(SAMPLES as usize + 1);
    let (mut token_sum, mut token_samples) = (0.0, 0u64);
    let (mut sent, mut events): (u64, u64) = (0, 0);
    let (mut received, mut useful_count) = (0u64, 0u64);
    let tenth = (cfg.periods / 10).max(1) * DELTA_MS;
    let mut next_progress = tenth;
    // Σ balances, kept up to date around every account call: summing N accounts at every
    // sample would stream the whole account array (48 MB at N = 500,000) 400 times.
    let mut token_total: u64 = 0;
    // Everything before `clock` has been processed and integrated.
    let mut clock = 0u64;
    loop {
        let next_tick = round + schedule[cursor].0;
        let now = queue
            .front()
            .map_or(u64::MAX, |m| m.at)
            .min(next_tick)
            .min(model.next_news())
            .min(next_sample)
            .min(end);
        model.integrate(clock, now);
        clock = now;
        if now == next_sample || now == end {
            next_sample += sample_every;
            let x = now as f64 / DELTA_MS as f64;
            series.push((x, model.sample(now)));
            let tokens = token_total as f64 / n as f64;
            tokens_series.push((x, tokens));
            if now > end / 2 {
                token_sum += tokens;
                token_samples += 1;
            }
        }
        while now >= next_progress && next_progress <= end {
            progress(next_progress / DELTA_MS, cfg.periods);
            next_progress += tenth;
        }
        if now == end {
            break;
        }
        // Within one millisecond: injected news, then deliveries (in sending order), then
        // period ends (in phase order). Messages sent now arrive TRANSFER_MS later.
        let mut send =
            |node: usize, k: u32, rng: &mut ChaCha8Rng, model: &M, q: &mut VecDeque<Message>| {
                if k > 0 {
                    let payload = model.payload(node);
                    for _ in 0..k {
                        let to = model.peer(node, rng);
                        q.push_back(msg(now + TRANSFER_MS, to, node, payload));
                    }
                    sent += u64::from(k);
                }
            };
        if model.next_news() == now
            && let Some(node) = model.inject(now, &mut rng)
        {
            events += 1;
            let acc = &mut accounts[node];
            let before = acc.tokens();
            let k = acc.on_news(now, rng.random());
            token_total = token_total + u64::from(acc.tokens()) - u64::from(before);
            send(node, k, &mut rng, &model, &mut queue);
        }
        while let Some(&m) = queue.front()
            && m.at == now
        {
            queue.pop_front();
            events += 1;
            if let Some(ahead) = queue.get(LOOKAHEAD) {
                let to = ahead.to as usize;
                std::hint::black_box((accounts[to].tokens(), model.touch(to)));
            }
            let node = m.to as usize;
            let useful = model.receive(node, m.from as usize, m.payload);
            received += 1;
            useful_count += u64::from(useful);
            let acc = &mut accounts[node];
            let before = acc.tokens();
            let k = acc.on_message(now, useful, rng.random());
            token_total = token_total + u64::from(acc.tokens()) - u64::from(before);
            send(node, k, &mut rng, &model, &mut queue);
        }
        while round + schedule[cursor].0 == now {
            let node = schedule[cursor].1 as usize;
            events += 1;
            let acc = &mut accounts[node];
            debug_assert_eq!(acc.next_tick(), now);
            let before = acc.tokens();
            let fire = acc.on_tick(now, rng.random());
            token_total = token_total + u64::from(acc.tokens()) - u64::from(before);
            send(node, u32::from(fire), &mut rng, &model, &mut queue);
            cursor += 1;
            if cursor == schedule.len() {
                cursor = 0;
                round += DELTA_MS;
            }
        }
        peak_in_flight = peak_in_flight.max(queue.len());
        peak_queue_capacity = peak_queue_capacity.max(queue.capacity());
    }
    let (a, c) = match strategy {
        Strategy::Proactive => (None, None),
        Strategy::Simple { c } => (None, Some(c)),
        Strategy::Generalized { a, c } | Strategy::Randomized { a, c } => (Some(a), Some(c)),
    };
    let useful_fraction = useful_count as f64 / received.max(1) as f64;
    let (predicted_tokens, predicted_tokens_measured_u) = match strategy {
        Strategy::Randomized { a, c } => {
            let (a, c) = (f64::from(a), f64::from(c));
            // eq. 10 with REACTIVE = u·a/A: u·a/A + (a − A + 1)/(C − A + 1) = 1.
            let with_u = a * c / (useful_fraction * (c - a + 1.0) + a);
            (Some(a * c / (c + 1.0)), Some(with_u))
        }
        _ => (None, None),
    };
    debug_assert_eq!(
        token_total,
        accounts.iter().map(|a| u64::from(a.tokens())).sum::<u64>()
    );
    let state_bytes = accounts.capacity() * size_of::<TokenAccount>()
        + schedule.capacity() * size_of::<(u64, u32)>()
        + peak_queue_capacity * size_of::<Message>()
        + model.bytes()
        + (series.capacity() + tokens_series.capacity()) * size_of::<(f64, f64)>();
    Ok(Outcome {
        app: cfg.app,
        strategy: label(strategy),
        kind: kind(strategy),
        a,
        c,
        nodes: n,
        periods: cfg.periods,
        seed: cfg.seed,
        metric: model.headline(end, &series),
        speedup: None,
        messages_per_node_period: sent as f64 / (n as f64 * cfg.periods as f64),
        mean_tokens: token_sum / token_samples.max(1) as f64,
        predicted_tokens,
        predicted_tokens_measured_u,
        useful_fraction,
        events,
        peak_in_flight: peak_in_flight as u64,
        state_bytes: state_bytes as u64,
        series,
        tokens_series,
    })
}

fn msg(at: u64, to: usize, from: usize, payload: u64) -> Message {
    Message {
        at,
        to: to as u32,
        from: from as u32,
        payload,
    }
}

/// Runs `configs` on `threads` worker threads (results in input order, independent of the
/// thread count). `done(index, outcome)` is called as each run finishes; `progress(index,
/// done, total)` inside long runs.
pub fn run_batch(
    configs: &[Config],
    threads: usize,
    done: &(dyn Fn(usize, &Outcome) + Sync),
    progress: &(dyn Fn(usize, u64, u64) + Sync),
) -> Result<Vec<Outcome>, TokenAccountError> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Outcome, TokenAccountError>>>> =
        Mutex::new((0..configs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, configs.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(cfg) = configs.get(i) else { break };
                    let r = run(cfg, &mut |d, t| progress(i, d, t));
                    if let Ok(o) = &r {
                        done(i, o);
                    }
                    if let Ok(mut g) = results.lock() {
                        g[i] = Some(r);
                    }
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| TokenAccountError::Config("a worker thread panicked".into()))?;
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(TokenAccountError::Config("run missing".into()))))
        .collect()
}

/// First time (in periods) a series reaches `target` or below.
fn first_below(series: &[(f64, f64)], target: f64) -> Option<f64> {
    series.iter().find(|p| p.1 <= target).map(|p| p.0)
}

/// Fills in [`Outcome::speedup`] against the proactive run of the same application, size,
/// length and seed.
pub fn compare(outcomes: &mut [Outcome]) {
    let baselines: Vec<Outcome> = outcomes
        .iter()
        .filter(|o| o.kind == "proactive")
        .cloned()
        .collect();
    for o in outcomes.iter_mut() {
        let Some(b) = baselines.iter().find(|b| {
            b.app == o.app && b.nodes == o.nodes && b.periods == o.periods && b.seed == o.seed
        }) else {
            continue;
        };
        o.speedup = match o.app {
            App::PushGossip => Some(b.metric / o.metric),
            App::GossipLearning => Some(o.metric / b.metric),
            App::PowerIteration => {
                let t_b = first_below(&b.series, b.metric);
                let t_o = first_below(&o.series, b.metric);
                match (t_b, t_o) {
                    (Some(tb), Some(to)) if to > 0.0 => Some(tb / to),
                    _ => None,
                }
            }
        };
    }
}

/// The best run of each strategy kind for `app` (by metric).
#[must_use]
pub fn best_by_kind(outcomes: &[Outcome], app: App) -> Vec<&Outcome> {
    let mut best: Vec<&Outcome> = Vec::new();
    for k in ["proactive", "simple", "generalized", "randomized"] {
        let mut it = outcomes.iter().filter(|o| o.app == app && o.kind == k);
        let Some(mut b) = it.next() else { continue };
        for o in it {
            let better = if app.lower_is_better() {
                o.metric < b.metric
            } else {
                o.metric > b.metric
            };
            if better {
                b = o;
            }
        }
        best.push(b);
    }
    best
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(String::new, |v| format!("{v:.6}"))
}

/// Writes `runs.csv`, `series.csv`, one `<app>.svg` per application (proactive and the best
/// of each kind) and `tokens.svg` (average balance against the §4.3 prediction) into `dir`.
pub fn write_results(dir: &Path, outcomes: &[Outcome]) -> Result<(), TokenAccountError> {
    std::fs::create_dir_all(dir)?;
    let mut runs = String::from(
        "app,strategy,kind,a,c,nodes,periods,seed,metric,speedup,messages_per_node_period,useful_fraction,mean_tokens,predicted_tokens,predicted_tokens_measured_u,events,peak_in_flight,state_bytes\n",
    );
    let mut series = String::from("app,strategy,seed,period,metric,mean_tokens\n");
    for o in outcomes {
        let _ = writeln!(
            runs,
            "{},{},{},{},{},{},{},{},{:.6},{},{:.6},{:.6},{:.6},{},{},{},{},{}",
            o.app.name(),
            o.strategy,
            o.kind,
            o.a.map_or_else(String::new, |v| v.to_string()),
            o.c.map_or_else(String::new, |v| v.to_string()),
            o.nodes,
            o.periods,
            o.seed,
            o.metric,
            opt(o.speedup),
            o.messages_per_node_period,
            o.useful_fraction,
            o.mean_tokens,
            opt(o.predicted_tokens),
            opt(o.predicted_tokens_measured_u),
            o.events,
            o.peak_in_flight,
            o.state_bytes
        );
        for ((t, m), (_, tok)) in o.series.iter().zip(&o.tokens_series) {
            let _ = writeln!(
                series,
                "{},{},{},{t:.3},{m:.6},{tok:.6}",
                o.app.name(),
                o.strategy,
                o.seed
            );
        }
    }
    std::fs::write(dir.join("runs.csv"), runs)?;
    std::fs::write(dir.join("series.csv"), series)?;
    let mut apps: Vec<App> = outcomes.iter().map(|o| o.app).collect();
    apps.sort_unstable();
    apps.dedup();
    for app in apps {
        let y = match app {
            App::PushGossip => "mean lag (s)",
            App::GossipLearning => "visited / ideal (eq. 6)",
            App::PowerIteration => "angle (rad)",
        };
        let mut chart = LineChart::new(
            format!("seed 004 §4: {} at equal message count", app.name()),
            "period",
            y,
        );
        for o in best_by_kind(outcomes, app) {
            chart = chart.series(o.strategy.clone(), o.series.clone());
        }
        chart.write(&dir.join(format!("{}.svg", app.name())))?;
    }
    let mut tokens = LineChart::new(
        "seed 004 §4.3: average tokens, randomized, vs A·C/(C+1)",
        "period",
        "tokens",
    );
    let mut shown = 0;
    for o in outcomes
        .iter()
        .filter(|o| o.kind == "randomized" && o.app == App::GossipLearning)
    {
        if shown == 4 {
            break;
        }
        shown += 1;
        let pred = o.predicted_tokens.unwrap_or(f64::NAN);
        let last = o.tokens_series.last().map_or(0.0, |p| p.0);
        tokens = tokens
            .series(o.strategy.clone(), o.tokens_series.clone())
            .series(
                format!("{} mean-field", o.strategy),
                vec![(0.0, pred), (last, pred)],
            );
    }
    if shown > 0 {
        tokens.write(&dir.join("tokens.svg"))?;
    }
    Ok(())
}
