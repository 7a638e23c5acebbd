#![allow(clippy::unwrap_used)]
//! Max-min fairness (seed 000 Table 1 Case IV with the appendix bounds, water-filling across
//! nodes) on the deterministic in-memory network: how fast a node short of its demand is
//! served from what the others hold.

use sluice_coord::law::Measure;
use sluice_coord::node::{Config, Fallback, LeaseState};
use sluice_coord::testing::{Cluster, NetConfig, Step, complete};
use sluice_coord::wire::NodeId;

const CYCLE: u64 = 100_000_000;
const LEASE: u64 = 1_000_000_000;
const KEY: u64 = 7;
const LIMIT: u64 = 1_000_000;

/// What `sluice serve` configures for `n` nodes in a full mesh, with max-min shares: γ at the
/// bound `1/(2(n − 1))`, new demand followed within a cycle.
fn daemon(n: u32) -> impl Fn(NodeId, Vec<(NodeId, f64)>) -> Config {
    move |id, links| {
        let mut c = Config::new(id, (0..n).collect(), links, LIMIT);
        c.measure = Measure::MaxMin;
        c.gamma = 1.0 / (2.0 * f64::from(n - 1));
        c.cycle = CYCLE;
        c.lease = LEASE;
        c.demand_tau = 5 * CYCLE;
        c.demand_rise_tau = Some(CYCLE);
        c.fallback = Fallback::None;
        c
    }
}

/// Three voters asking 0.3, 0.1 and 0.05 L, then four joiners one after the other, each
/// asking 0.1 L and linked with every node (as the daemon's directory links it): the 3 → 7
/// scale-out of the chaos suite. A joiner starts with nothing; its advertised level makes
/// the others' gifts add up to what it lacks whatever their shares, so it holds its demand
/// within 3 cycles of its first lease (a cycle for the advert to reach the others, one for
/// the gifts to come back, one for the filter). A level bounded by the richest giver alone
/// (`lowest + unmet/(γ·Σw)`) took 3, 7, 11 and 14 cycles: each joiner more, as the shares
/// it was given from grew more unequal (and on real processes a joiner refused for up to
/// 1.7 s after it joined).
#[test]
fn a_joiner_is_served_within_a_few_cycles_of_its_lease() {
    let n = 3;
    let mut c = Cluster::new(n, &complete(n), daemon(n), NetConfig::perfect(), 1).unwrap();
    let l = LIMIT as f64;
    for (id, d) in [(0, 0.3), (1, 0.1), (2, 0.05)] {
        c.apply(Step::SetDemand(id, KEY, d * l));
    }
    c.apply(Step::Run(20));
    let mut took = Vec::new();
    for joiner in n..n + 4 {
        let before: Vec<u64> = (0..joiner).map(|i| c.node(i).unwrap().own(KEY)).collect();
        c.apply(Step::AddNode(Box::new(daemon(n)(joiner, vec![(0, 1.0)]))));
        c.apply(Step::SetDemand(joiner, KEY, 0.1 * l));
        for v in 1..joiner {
            let (j, now) = c.node_mut(joiner).unwrap();
            j.add_peer(v, 1.0, now);
            let (v, now) = c.node_mut(v).unwrap();
            v.add_peer(joiner, 1.0, now);
        }
        let mut leased = None;
        let mut served = None;
        for k in 1..=40u64 {
            c.apply(Step::Run(1));
            let node = c.node(joiner).unwrap();
            if leased.is_none() && node.lease_state(c.now()) != LeaseState::Expired {
                leased = Some(k);
            }
            if node.own(KEY) as f64 >= 0.99 * 0.1 * l {
                served = Some(k);
                break;
            }
        }
        let after: Vec<u64> = (0..=joiner).map(|i| c.node(i).unwrap().own(KEY)).collect();
        took.push((
            served.zip(leased).map(|(s, l)| s - l),
            format!("{before:?} -> {after:?}"),
        ));
        c.apply(Step::Run(30));
    }
    assert!(
        took.iter().all(|t| t.0.is_some_and(|k| k <= 3)),
        "{took:#?}"
    );
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations.first());
}
