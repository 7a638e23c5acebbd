//! Maximum flow on the graph G of seed 001 Appendix A: source σ → balancer b (capacity w_b),
//! b → s for s ∈ S_b (unbounded), s → sink τ (capacity c_s). The maximum flow is the farm's
//! maximum throughput r*; with capacities c_s + q_s it decides whether q is a feasible
//! overflow vector (q ∈ Q, eq. 1–5).

use crate::Farm;

/// A maximum flow: its value and the balancer→server flows w_bs.
#[derive(Debug, Clone, PartialEq)]
pub struct FarmFlow {
    /// Total flow σ → τ.
    pub value: f64,
    /// `routing[b][s]` = w_bs (0 where b cannot reach s).
    pub routing: Vec<Vec<f64>>,
}

/// Flow below this is treated as zero (capacities are rates of order 1–10⁴).
const EPS: f64 = 1e-12;

/// Edmonds–Karp on the farm graph with the given demands w_b and server capacities.
/// Shortest augmenting paths terminate after O(V·E) augmentations whatever the capacities,
/// so this ends on real-valued inputs too.
#[must_use]
#[allow(clippy::needless_range_loop)] // a dense matrix reads best with indices
pub fn max_flow(farm: &Farm, demand: &[f64], server_caps: &[f64]) -> FarmFlow {
    let (nb, ns) = (farm.balancers(), farm.servers());
    let n = nb + ns + 2;
    let (src, sink) = (nb + ns, nb + ns + 1);
    let mut cap = vec![vec![0.0_f64; n]; n];
    for b in 0..nb {
        cap[src][b] = demand.get(b).copied().unwrap_or(0.0).max(0.0);
        for &s in farm.reach(b) {
            cap[b][nb + s] = f64::INFINITY;
        }
    }
    for s in 0..ns {
        cap[nb + s][sink] = server_caps.get(s).copied().unwrap_or(0.0).max(0.0);
    }
    let mut flow = vec![vec![0.0_f64; n]; n];
    let residual =
        |cap: &Vec<Vec<f64>>, flow: &Vec<Vec<f64>>, u: usize, v: usize| cap[u][v] - flow[u][v];
    let mut value = 0.0;
    loop {
        // BFS for a shortest augmenting path in the residual graph.
        let mut parent = vec![usize::MAX; n];
        parent[src] = src;
        let mut queue = std::collections::VecDeque::from([src]);
        while let Some(u) = queue.pop_front() {
            if u == sink {
                break;
            }
            for v in 0..n {
                if parent[v] == usize::MAX && residual(&cap, &flow, u, v) > EPS {
                    parent[v] = u;
                    queue.push_back(v);
                }
            }
        }
        if parent[sink] == usize::MAX {
            break;
        }
        let mut push = f64::INFINITY;
        let mut v = sink;
        while v != src {
            let u = parent[v];
            push = push.min(residual(&cap, &flow, u, v));
            v = u;
        }
        let mut v = sink;
        while v != src {
            let u = parent[v];
            flow[u][v] += push;
            flow[v][u] -= push;
            v = u;
        }
        value += push;
    }
    let routing = (0..nb)
        .map(|b| (0..ns).map(|s| flow[b][nb + s].max(0.0)).collect())
        .collect();
    FarmFlow { value, routing }
}

/// r*: the maximum throughput of the farm under demand w (seed 001 Appendix A).
#[must_use]
pub fn max_throughput(farm: &Farm, demand: &[f64]) -> f64 {
    max_flow(farm, demand, farm.capacities()).value
}

/// Whether q lies in the feasible overflow region Q up to `tol` (eq. 1–5): some routing of
/// the demand loads every server with at most c_s + q_s. (Q also contains points with more
/// overflow than load, by idling servers; for increasing penalties only this boundary
/// matters.)
#[must_use]
pub fn is_feasible(farm: &Farm, demand: &[f64], q: &[f64], tol: f64) -> bool {
    if q.len() != farm.servers() || q.iter().any(|x| !x.is_finite() || *x < -tol) {
        return false;
    }
    let caps: Vec<f64> = farm
        .capacities()
        .iter()
        .zip(q)
        .map(|(c, x)| c + x.max(0.0))
        .collect();
    max_flow(farm, demand, &caps).value >= demand.iter().sum::<f64>() - tol
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_balancer_example_of_section_v_c() {
        // Seed 001 Fig. 6: w = (3, 2), S_1 = {1}, S_2 = {1, 2}, unit capacities: r* = 2.
        let farm = Farm::new(vec![1.0, 1.0], vec![vec![0], vec![0, 1]]).unwrap();
        let f = max_flow(&farm, &[3.0, 2.0], farm.capacities());
        assert!((f.value - 2.0).abs() < 1e-12);
        assert!(is_feasible(&farm, &[3.0, 2.0], &[2.0, 1.0], 1e-9));
        assert!(
            !is_feasible(&farm, &[3.0, 2.0], &[1.5, 1.5], 1e-9),
            "balancer 1 alone overloads server 1 by 2"
        );
    }
}
