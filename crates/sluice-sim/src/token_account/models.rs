//! The three applications of seed 004 §2 as [`Model`]s: what a message carries, what
//! receiving it does, and the metric; plus their overlays (a random 20-out graph, a
//! Watts–Strogatz ring).

use std::collections::HashSet;

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use super::{INJECT_MS, OUT_DEGREE, TRANSFER_MS, TokenAccountError};

/// The application side of Alg. 4: what a message carries and what receiving it does.
pub(super) trait Model {
    /// `createMessage()`: the state node `node` sends.
    fn payload(&self, node: usize) -> u64;
    /// `updateState(m)`: returns the usefulness `u`.
    fn receive(&mut self, to: usize, from: usize, payload: u64) -> bool;
    /// `selectPeer()`.
    fn peer(&self, node: usize, rng: &mut ChaCha8Rng) -> usize;
    /// Whether node labels carry no structure (random overlay), so that period phases may
    /// be assigned in label order (see the module docs).
    fn exchangeable(&self) -> bool;
    /// The state is constant on `[from, to)` (ms): integrate what the metric needs.
    fn integrate(&mut self, _from: u64, _to: u64) {}
    /// When the next external news arrives (push gossip's injected updates), if ever.
    fn next_news(&self) -> u64 {
        u64::MAX
    }
    /// External news at `now = next_news()`: the node that got it.
    fn inject(&mut self, _now: u64, _rng: &mut ChaCha8Rng) -> Option<usize> {
        None
    }
    /// Touches the state `receive(node, ..)` will read, so that the memory load overlaps
    /// other work (a safe software prefetch; has no effect on the results).
    fn touch(&self, _node: usize) -> u64 {
        0
    }
    /// The metric at `now` (may consume state accumulated since the last sample).
    fn sample(&mut self, now: u64) -> f64;
    /// The headline metric at the end of a run of `end` ms.
    fn headline(&self, end: u64, series: &[(f64, f64)]) -> f64;
    /// Bytes of state held (topology and per-node values).
    fn bytes(&self) -> usize;
}

/// Random 20-out overlay: 20 distinct out-neighbours per node, uniform, no self-loops.
pub(super) fn out_overlay(nodes: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
    let mut out = Vec::with_capacity(nodes * OUT_DEGREE);
    for i in 0..nodes {
        let start = out.len();
        while out.len() - start < OUT_DEGREE {
            let p = rng.random_range(0..nodes);
            if p != i && !out[start..].contains(&(p as u32)) {
                out.push(p as u32);
            }
        }
    }
    out
}

pub(super) struct PushGossip {
    overlay: Vec<u32>,
    /// Timestamp (ms) of the freshest update each node holds; 0 before any.
    ts: Vec<u64>,
    /// Σ_i (fresh − ts_i) in ms.
    lag: u128,
    fresh: u64,
    /// ∫ Σ_i (fresh − ts_i) dt since the last sample, and over the second half.
    since_sample: u128,
    second_half: u128,
    half: u64,
    last_sample: u64,
    next_inject: u64,
}

impl Model for PushGossip {
    fn payload(&self, node: usize) -> u64 {
        self.ts[node]
    }
    fn receive(&mut self, to: usize, _from: usize, payload: u64) -> bool {
        if payload > self.ts[to] {
            self.lag -= u128::from(payload - self.ts[to]);
            self.ts[to] = payload;
            true
        } else {
            false
        }
    }
    fn peer(&self, node: usize, rng: &mut ChaCha8Rng) -> usize {
        self.overlay[node * OUT_DEGREE + rng.random_range(0..OUT_DEGREE)] as usize
    }
    fn exchangeable(&self) -> bool {
        true
    }
    fn integrate(&mut self, from: u64, to: u64) {
        // Σ_i (fresh − ts_i), kept up to date by `receive` and `inject`, is constant between
        // events, so the time integral is exact.
        self.since_sample += self.lag * u128::from(to - from);
        let from_half = from.max(self.half);
        if to > from_half {
            self.second_half += self.lag * u128::from(to - from_half);
        }
    }
    fn next_news(&self) -> u64 {
        self.next_inject
    }
    fn inject(&mut self, now: u64, rng: &mut ChaCha8Rng) -> Option<usize> {
        if now != self.next_inject {
            return None;
        }
        self.next_inject += INJECT_MS;
        let node = rng.random_range(0..self.ts.len());
        // Every node falls behind by the new update's age gain; the chosen one catches up.
        self.lag += self.ts.len() as u128 * u128::from(now - self.fresh);
        self.lag -= u128::from(now - self.ts[node]);
        self.ts[node] = now;
        self.fresh = now;
        Some(node)
    }
    fn sample(&mut self, now: u64) -> f64 {
        let span = (now - self.last_sample).max(1);
        self.last_sample = now;
        let v = std::mem::take(&mut self.since_sample) as f64;
        v / (self.ts.len() as f64 * span as f64) / 1000.0
    }
    fn touch(&self, node: usize) -> u64 {
        self.ts[node]
    }
    fn headline(&self, end: u64, _series: &[(f64, f64)]) -> f64 {
        let span = (end - self.half).max(1);
        self.second_half as f64 / (self.ts.len() as f64 * span as f64) / 1000.0
    }
    fn bytes(&self) -> usize {
        self.overlay.capacity() * 4 + self.ts.capacity() * 8
    }
}

impl PushGossip {
    /// On `overlay` (one list of `OUT_DEGREE` per node), for a run of `end` ms.
    pub(super) fn new(overlay: Vec<u32>, end: u64) -> Self {
        let nodes = overlay.len() / OUT_DEGREE;
        Self {
            overlay,
            ts: vec![0; nodes],
            lag: 0,
            fresh: 0,
            since_sample: 0,
            second_half: 0,
            half: end / 2,
            last_sample: 0,
            next_inject: INJECT_MS,
        }
    }
}

pub(super) struct GossipLearning {
    overlay: Vec<u32>,
    /// Nodes visited by each node's current model.
    age: Vec<u64>,
    sum_age: u128,
}

impl GossipLearning {
    /// On `overlay` (one list of `OUT_DEGREE` per node).
    pub(super) fn new(overlay: Vec<u32>) -> Self {
        let nodes = overlay.len() / OUT_DEGREE;
        Self {
            overlay,
            age: vec![0; nodes],
            sum_age: 0,
        }
    }
}

impl Model for GossipLearning {
    fn payload(&self, node: usize) -> u64 {
        self.age[node]
    }
    fn receive(&mut self, to: usize, _from: usize, payload: u64) -> bool {
        // §3.2: not useful iff the local model has visited more nodes than the received one.
        if self.age[to] > payload {
            return false;
        }
        let new = payload + 1;
        self.sum_age = self.sum_age + u128::from(new) - u128::from(self.age[to]);
        self.age[to] = new;
        true
    }
    fn peer(&self, node: usize, rng: &mut ChaCha8Rng) -> usize {
        self.overlay[node * OUT_DEGREE + rng.random_range(0..OUT_DEGREE)] as usize
    }
    fn exchangeable(&self) -> bool {
        true
    }
    fn touch(&self, node: usize) -> u64 {
        self.age[node]
    }
    fn bytes(&self) -> usize {
        self.overlay.capacity() * 4 + self.age.capacity() * 8
    }
    fn sample(&mut self, now: u64) -> f64 {
        // eq. 6: (1/N) Σ n_i(t) / n*(t), n*(t) = t / transfer time.
        let ideal = now as f64 / TRANSFER_MS as f64;
        self.sum_age as f64 / self.age.len() as f64 / ideal
    }
    fn headline(&self, _end: u64, series: &[(f64, f64)]) -> f64 {
        series.last().map_or(f64::NAN, |p| p.1)
    }
}

pub(super) struct PowerIteration {
    /// CSR adjacency of the undirected Watts–Strogatz graph.
    offsets: Vec<usize>,
    adj: Vec<u32>,
    /// `b_ki` for every slot (node i, neighbour k), and `A_ik = 1/deg(k)`.
    buffer: Vec<f64>,
    weight: Vec<f64>,
    x: Vec<f64>,
    /// The dominant eigenvector of `A_ik = 1/deg(k)`: the degrees, normalised.
    target: Vec<f64>,
}

impl PowerIteration {
    fn recompute(&mut self, i: usize) {
        let (lo, hi) = (self.offsets[i], self.offsets[i + 1]);
        self.x[i] = self.buffer[lo..hi]
            .iter()
            .zip(&self.weight[lo..hi])
            .map(|(b, w)| b * w)
            .sum();
    }
}

impl Model for PowerIteration {
    fn payload(&self, node: usize) -> u64 {
        self.x[node].to_bits()
    }
    fn receive(&mut self, to: usize, from: usize, payload: u64) -> bool {
        let (lo, hi) = (self.offsets[to], self.offsets[to + 1]);
        let Some(j) = self.adj[lo..hi].iter().position(|&k| k as usize == from) else {
            return false;
        };
        let old = self.buffer[lo + j];
        // §3.2: useful iff the message changes the local state.
        if old.to_bits() == payload {
            return false;
        }
        self.buffer[lo + j] = f64::from_bits(payload);
        self.recompute(to);
        true
    }
    fn peer(&self, node: usize, rng: &mut ChaCha8Rng) -> usize {
        let (lo, hi) = (self.offsets[node], self.offsets[node + 1]);
        self.adj[lo + rng.random_range(0..hi - lo)] as usize
    }
    fn exchangeable(&self) -> bool {
        // Node labels are ring positions: phases must stay independent of them.
        false
    }
    fn bytes(&self) -> usize {
        self.offsets.capacity() * 8
            + self.adj.capacity() * 4
            + (self.buffer.capacity() + self.weight.capacity()) * 8
            + (self.x.capacity() + self.target.capacity()) * 8
    }
    fn sample(&mut self, _now: u64) -> f64 {
        let norm = self.x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let dot: f64 = self.x.iter().zip(&self.target).map(|(a, b)| a * b).sum();
        (dot / norm).clamp(-1.0, 1.0).acos()
    }
    fn headline(&self, _end: u64, series: &[(f64, f64)]) -> f64 {
        series.last().map_or(f64::NAN, |p| p.1)
    }
}

/// Watts–Strogatz (§4.1.3): a ring where every node links to its 4 closest nodes, each link
/// rewired to a uniform random target with probability 0.01 (no self-loops or duplicates).
pub(super) fn watts_strogatz(
    nodes: usize,
    rng: &mut ChaCha8Rng,
) -> Result<PowerIteration, TokenAccountError> {
    let mut edges: HashSet<(u32, u32)> = HashSet::with_capacity(nodes * 2);
    let key = |a: usize, b: usize| (a.min(b) as u32, a.max(b) as u32);
    let mut list = Vec::with_capacity(nodes * 2);
    for i in 0..nodes {
        for d in 1..=2 {
            let j = (i + d) % nodes;
            edges.insert(key(i, j));
            list.push((i, j));
        }
    }
    for e in &mut list {
        if rng.random::<f64>() < 0.01 {
            let (i, j) = *e;
            let t = rng.random_range(0..nodes);
            if t != i && !edges.contains(&key(i, t)) {
                edges.remove(&key(i, j));
                edges.insert(key(i, t));
                *e = (i, t);
            }
        }
    }
    let mut adj_lists: Vec<Vec<u32>> = vec![Vec::new(); nodes];
    for &(i, j) in &list {
        adj_lists[i].push(j as u32);
        adj_lists[j].push(i as u32);
    }
    // The eigenvector is unique only on a connected graph.
    let mut seen = vec![false; nodes];
    let mut stack = vec![0usize];
    seen[0] = true;
    let mut count = 1;
    while let Some(v) = stack.pop() {
        for &w in &adj_lists[v] {
            if !seen[w as usize] {
                seen[w as usize] = true;
                count += 1;
                stack.push(w as usize);
            }
        }
    }
    if count != nodes {
        return Err(TokenAccountError::Config(
            "the Watts-Strogatz graph came out disconnected; try another seed".into(),
        ));
    }
    let mut offsets = Vec::with_capacity(nodes + 1);
    offsets.push(0);
    let mut adj = Vec::with_capacity(list.len() * 2);
    for l in &adj_lists {
        adj.extend_from_slice(l);
        offsets.push(adj.len());
    }
    let deg: Vec<f64> = adj_lists.iter().map(|l| l.len() as f64).collect();
    let weight: Vec<f64> = adj.iter().map(|&k| 1.0 / deg[k as usize]).collect();
    // Alg. 3 line 1: any positive value.
    let buffer: Vec<f64> = adj.iter().map(|_| rng.random::<f64>() + 1e-3).collect();
    let norm = deg.iter().map(|d| d * d).sum::<f64>().sqrt();
    let target = deg.iter().map(|d| d / norm).collect();
    let mut model = PowerIteration {
        offsets,
        adj,
        buffer,
        weight,
        x: vec![0.0; nodes],
        target,
    };
    for i in 0..nodes {
        model.recompute(i);
    }
    Ok(model)
}
