//! The demand every node sees over a run, by workload (the real nodes and every baseline
//! strategy read the same).

use super::*;

/// The demand of every node over time (shared with [`crate::baselines`], so every strategy
/// there sees exactly the demand the real nodes see here).
#[derive(Debug, Clone)]
pub(crate) struct Demand {
    workload: Workload,
    n: usize,
    limit: f64,
    cycles: u64,
    /// Constant pattern(s): base, swapped (shift), per-node weights.
    base: Vec<f64>,
    swapped: Vec<f64>,
    /// paper-ex2: per node (period, phase) of the node factor, and its clients
    /// `(level, amplitude, period, phase)`.
    nodes_curve: Vec<(f64, f64)>,
    clients: Vec<Vec<(f64, f64, f64, f64)>>,
}

impl Demand {
    pub(crate) fn new(workload: Workload, n: usize, limit: f64, cycles: u64, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x5EED_D3A4_D000_0001);
        let scale = |w: Vec<f64>, total: f64| -> Vec<f64> {
            let s: f64 = w.iter().sum();
            w.iter().map(|v| v / s * total).collect()
        };
        let rising: Vec<f64> = (0..n).map(|i| (i + 1) as f64).collect();
        let falling: Vec<f64> = (0..n).map(|i| (n - i) as f64).collect();
        let mut d = Self {
            workload,
            n,
            limit,
            cycles,
            base: Vec::new(),
            swapped: Vec::new(),
            nodes_curve: Vec::new(),
            clients: Vec::new(),
        };
        match workload {
            Workload::Steady | Workload::Shift => {
                d.base = scale(rising, 0.9 * limit);
                d.swapped = scale(falling, 0.9 * limit);
            }
            Workload::Skewed => {
                // Zipf(1) over a seeded order of the nodes (Fisher–Yates).
                let mut order: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut w = vec![0.0; n];
                for (rank, &node) in order.iter().enumerate() {
                    w[node] = 1.0 / (rank + 1) as f64;
                }
                d.base = scale(w, 1.2 * limit);
            }
            Workload::Hotspot => {}
            Workload::PaperEx2 => {
                let tau = std::f64::consts::TAU;
                for _ in 0..n {
                    d.nodes_curve
                        .push((200.0 + 600.0 * rng.next_f64(), tau * rng.next_f64()));
                    let cl = (0..100)
                        .map(|_| {
                            (
                                0.2 + 1.6 * rng.next_f64(),
                                0.8 * rng.next_f64(),
                                50.0 + 350.0 * rng.next_f64(),
                                tau * rng.next_f64(),
                            )
                        })
                        .collect();
                    d.clients.push(cl);
                }
                // Mean total = L.
                let levels: f64 = d.clients.iter().flatten().map(|c| c.0).sum();
                for c in d.clients.iter_mut().flatten() {
                    c.0 *= limit / levels;
                }
            }
        }
        d
    }

    /// Demand of every node in cycle `k`.
    pub(crate) fn at(&self, k: u64) -> Vec<f64> {
        match self.workload {
            Workload::Steady | Workload::Skewed => self.base.clone(),
            Workload::Shift => {
                // Seed 003 §III-B with τ0 = K/4.
                let t0 = (self.cycles / 4).max(1) as f64;
                let t = k as f64;
                if t < t0 || t >= 3.0 * t0 {
                    self.base.clone()
                } else if t < 2.0 * t0 {
                    self.swapped.clone()
                } else {
                    let s = (t - 2.0 * t0) / t0;
                    self.base
                        .iter()
                        .zip(&self.swapped)
                        .map(|(b, w)| s * b + (1.0 - s) * w)
                        .collect()
                }
            }
            Workload::Hotspot => {
                let mut v = vec![0.0; self.n];
                if k >= 10
                    && let Some(first) = v.first_mut()
                {
                    *first = 2.0 * self.limit;
                }
                v
            }
            Workload::PaperEx2 => {
                let tau = std::f64::consts::TAU;
                let t = k as f64;
                self.clients
                    .iter()
                    .zip(&self.nodes_curve)
                    .map(|(cl, &(np, nph))| {
                        let f = 1.0 + 0.3 * (tau * t / np + nph).sin();
                        f * cl
                            .iter()
                            .map(|&(b, a, p, ph)| b * (1.0 + a * (tau * t / p + ph).sin()))
                            .sum::<f64>()
                    })
                    .collect()
            }
        }
    }

    /// The last cycle at which demand changes (`None`: it never stops changing).
    pub(super) fn last_change(&self) -> Option<u64> {
        match self.workload {
            Workload::Steady | Workload::Skewed => Some(0),
            Workload::Hotspot => Some(10),
            Workload::Shift => Some(3 * (self.cycles / 4).max(1)),
            Workload::PaperEx2 => None,
        }
    }
}
