//! The offline optimum of seed 001 (9)–(13) on random small farms: feasible (eq. 1–5),
//! throughput optimal (Theorem 1) and no worse than any routing we can sample.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_balance::Farm;
use sluice_balance::maxflow::{is_feasible, max_throughput};
use sluice_balance::optimum::{alpha_fair, alpha_fair_penalty, most_balanced};

#[derive(Debug, Clone)]
struct Case {
    farm: Farm,
    demand: Vec<f64>,
    weights: Vec<f64>,
    alpha: f64,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=4, 1usize..=3)
        .prop_flat_map(|(ns, nb)| {
            (
                prop::collection::vec(0.5f64..5.0, ns),
                prop::collection::vec(1u32..(1 << ns), nb),
                prop::collection::vec(0.0f64..10.0, nb),
                prop::collection::vec(0.3f64..3.0, ns),
                prop_oneof![Just(0.0), 0.2f64..8.0, Just(50.0)],
                any::<u64>(),
            )
        })
        .prop_map(|(caps, masks, demand, weights, alpha, seed)| {
            let ns = caps.len();
            let reach = masks
                .iter()
                .map(|m| (0..ns).filter(|s| m & (1 << s) != 0).collect())
                .collect();
            Case {
                farm: Farm::new(caps, reach).unwrap(),
                demand,
                weights,
                alpha,
                seed,
            }
        })
}

/// Overflow (L_s − c_s)^+ of a random routing: each balancer splits its demand over S_b.
fn random_overflow(c: &Case, rng: &mut u64) -> Vec<f64> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        (*rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut load = vec![0.0; c.farm.servers()];
    for (b, &w) in c.demand.iter().enumerate() {
        let reach = c.farm.reach(b);
        // Skewed splits reach the polytope's corners as well as its middle.
        let raw: Vec<f64> = reach.iter().map(|_| next().powi(3)).collect();
        let total: f64 = raw.iter().sum::<f64>().max(1e-300);
        for (&s, r) in reach.iter().zip(&raw) {
            load[s] += w * r / total;
        }
    }
    load.iter()
        .zip(c.farm.capacities())
        .map(|(l, cap)| (l - cap).max(0.0))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Seed 001 eq. (5) and Theorem 1: q^(α) ∈ Q and Σ q = demand − max-flow.
    #[test]
    fn optimum_is_feasible_and_throughput_optimal(c in case()) {
        let opt = alpha_fair(&c.farm, &c.demand, c.alpha, &c.weights).unwrap();
        let demand: f64 = c.demand.iter().sum();
        prop_assert!(opt.q.iter().all(|&x| x >= 0.0));
        prop_assert!(is_feasible(&c.farm, &c.demand, &opt.q, 1e-7), "{:?}", opt.q);
        let overflow: f64 = opt.q.iter().sum();
        let r_star = max_throughput(&c.farm, &c.demand);
        prop_assert!((overflow - (demand - r_star)).abs() <= 1e-7 * (1.0 + demand), "Σq {overflow} vs {demand} − {r_star}");
        // The routing is a superflow: each balancer's demand is routed, only inside S_b.
        for b in 0..c.farm.balancers() {
            let routed: f64 = opt.routing[b].iter().sum();
            prop_assert!((routed - c.demand[b]).abs() <= 1e-7 * (1.0 + demand));
            for s in 0..c.farm.servers() {
                prop_assert!(c.farm.reaches(b, s) || opt.routing[b][s] == 0.0);
            }
        }
    }

    /// Seed 001 (9)–(13): no sampled routing has a smaller α-fair penalty.
    #[test]
    fn no_sampled_routing_beats_the_optimum(c in case()) {
        let opt = alpha_fair(&c.farm, &c.demand, c.alpha, &c.weights).unwrap();
        let best = alpha_fair_penalty(&opt.q, c.alpha, &c.weights).unwrap();
        let mut rng = c.seed | 1;
        for _ in 0..300 {
            let q = random_overflow(&c, &mut rng);
            let p = alpha_fair_penalty(&q, c.alpha, &c.weights).unwrap();
            // α = 0 is solved as α = 1e-6: its penalty is within a relative 1e-5 of exact.
            prop_assert!(best <= p * (1.0 + 1e-5) + 1e-9, "sampled {q:?} ({p}) beats {:?} ({best})", opt.q);
        }
    }

    /// Seed 001 §III ([8]): the most-balanced vector minimises the largest overflow and is
    /// the optimum of every symmetric α-fair penalty.
    #[test]
    fn most_balanced_is_min_max_and_symmetric_optimum(c in case()) {
        let mb = most_balanced(&c.farm, &c.demand).unwrap();
        let ones = vec![1.0; c.farm.servers()];
        for alpha in [0.5, 1.0, 4.0] {
            let o = alpha_fair(&c.farm, &c.demand, alpha, &ones).unwrap();
            for (a, b) in o.q.iter().zip(&mb.q) {
                prop_assert!((a - b).abs() <= 1e-9 * (1.0 + a.abs()));
            }
        }
        let max = mb.q.iter().cloned().fold(0.0, f64::max);
        let mut rng = c.seed | 1;
        for _ in 0..300 {
            let q = random_overflow(&c, &mut rng);
            prop_assert!(max <= q.iter().cloned().fold(0.0, f64::max) + 1e-9);
        }
    }
}
