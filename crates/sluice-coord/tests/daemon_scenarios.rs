#![allow(clippy::unwrap_used)]
//! Scenarios first seen on real `sluice serve` processes (the chaos suite), on the
//! deterministic in-memory network with the configuration the daemon's cluster driver gives
//! each node ([`daemon_config`]): crashes after cuts, restarts with and without a state
//! file, rolling restarts.

use sluice_coord::node::{Config, Fallback};
use sluice_coord::testing::{Cluster, NetConfig, Step, complete};
use sluice_coord::wire::NodeId;

const CYCLE: u64 = 100_000_000;
const LEASE: u64 = 1_000_000_000;
const KEY: u64 = 7;

/// The chaos suite's failing scenario (`a_crash_after_a_healed_partition_recovers`) on the
/// in-memory network, with the daemon's configuration: 4 nodes in a full mesh, fallback none,
/// an audit every ten leases, demand 1.6 L split 8:4:2:1. The cluster is
/// cut 2|2 for three leases, healed, and three seconds later one node crashes for good; the
/// survivors must hold the whole limit again within three leases and a cycle (the bound
/// the chaos suite asserts), and keep it.
#[test]
fn a_crash_after_a_healed_two_two_cut_gives_the_whole_limit_back() {
    let limit = 1_000_000;
    let daemon = daemon_config(4, limit);
    let mut failed = Vec::new();
    for seed in 1..=3u64 {
        for victim in 0..4u32 {
            let net = NetConfig {
                loss: 0.0,
                dup: 0.0,
                max_delay: CYCLE / 10,
            };
            let mut c = Cluster::new(4, &complete(4), daemon.clone(), net, seed).unwrap();
            for (i, w) in [8.0, 4.0, 2.0, 1.0].into_iter().enumerate() {
                c.apply(Step::SetDemand(
                    i as NodeId,
                    KEY,
                    1.6 * limit as f64 * w / 15.0,
                ));
            }
            c.apply(Step::Run(30));
            c.apply(Step::Partition(vec![0, 1]));
            c.apply(Step::Run(30));
            c.apply(Step::Heal);
            c.apply(Step::Run(30));
            c.apply(Step::Crash(victim));
            c.apply(Step::Run(31));
            // Within a thousandth: a gift in flight is in no node's share.
            let back = c.sum_own(KEY);
            c.apply(Step::Run(200));
            let end = c.sum_own(KEY);
            assert!(c.violations.is_empty(), "{:?}", c.violations.first());
            if back < limit - limit / 1000 || end != limit {
                failed.push(format!(
                    "seed {seed} crash {victim}: {back} after 3 leases, {end} at the end"
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// The daemon's two restart paths (issue "The cluster survives real operations", item 7): a
/// state file gives the incarnation a restart follows (`Step::Restart`); without one the
/// incarnation comes from the clock and the previous one is unknown
/// (`Step::RestartFromClock`). On 3 nodes with the daemon's configuration, one node is
/// killed and restarted, then another (or the same) crashes for good: no instant above L,
/// and the survivors hold the whole limit again.
#[test]
fn both_restart_paths_of_the_daemon_keep_the_limit_and_give_it_back() {
    let limit = 1_000_000;
    let daemon = daemon_config(3, limit);
    let mut failed = Vec::new();
    for from_clock in [false, true] {
        for restarted in 0..3u32 {
            for victim in 0..3u32 {
                let mut c =
                    Cluster::new(3, &complete(3), daemon.clone(), NetConfig::perfect(), 1).unwrap();
                for (i, f) in [0.5, 0.3, 0.2].into_iter().enumerate() {
                    c.apply(Step::SetDemand(i as NodeId, KEY, 1.6 * limit as f64 * f));
                }
                c.apply(Step::Run(30));
                c.apply(Step::Crash(restarted));
                c.apply(Step::Run(5));
                c.apply(if from_clock {
                    Step::RestartFromClock(restarted)
                } else {
                    Step::Restart(restarted)
                });
                c.apply(Step::Run(30));
                c.apply(Step::Crash(victim));
                c.apply(Step::Run(300));
                let case = format!("from clock {from_clock}, restart {restarted}, crash {victim}");
                assert!(
                    c.violations.is_empty(),
                    "{case}: {:?}",
                    c.violations.first()
                );
                let end = c.sum_own(KEY);
                if end != limit {
                    failed.push(format!("{case}: {end}"));
                }
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A rolling restart as Kubernetes does it, on the daemon's configuration: each node in turn
/// leaves gracefully (SIGTERM: it hands its shares to a neighbour), exits, and starts again by
/// either restart path. The busy key and a key nobody has used (held as every node's default)
/// stay at exactly L at every step, and nothing is ever enforced above L.
#[test]
fn a_rolling_restart_by_sigterm_keeps_the_whole_limit() {
    let limit = 1_000_000;
    let daemon = daemon_config(3, limit);
    let demand = |i: NodeId| 1.6 * limit as f64 * [0.5, 0.3, 0.2][i as usize];
    let unused = KEY + 1;
    for from_clock in [false, true] {
        let mut c = Cluster::new(3, &complete(3), daemon.clone(), NetConfig::perfect(), 1).unwrap();
        for i in 0..3 {
            c.apply(Step::SetDemand(i, KEY, demand(i)));
        }
        c.apply(Step::Run(30));
        for i in 0..3 {
            c.apply(Step::Leave(i));
            c.apply(Step::Run(25));
            c.apply(Step::Crash(i));
            c.apply(if from_clock {
                Step::RestartFromClock(i)
            } else {
                Step::Restart(i)
            });
            c.apply(Step::SetDemand(i, KEY, demand(i)));
            c.apply(Step::Run(30));
            let case = format!("from clock {from_clock}, node {i} restarted");
            assert_eq!(c.sum_own(KEY), limit, "{case}");
            assert_eq!(c.sum_enforced(KEY), limit, "{case}");
            assert_eq!(c.sum_own(unused), limit, "{case}: the default holdings");
        }
        assert!(c.violations.is_empty(), "{:?}", c.violations.first());
    }
}

/// What `sluice serve` configures for `n` nodes in a full mesh (`sluice-server`'s cluster
/// driver): fallback none, γ at the bound `1/(2(n − 1))`, an audit every ten
/// leases, idle keys after 30 leases.
fn daemon_config(n: u32, limit: u64) -> impl Fn(NodeId, Vec<(NodeId, f64)>) -> Config + Clone {
    let members: Vec<NodeId> = (0..n).collect();
    move |id, links| {
        let mut c = Config::new(id, members.clone(), links, limit);
        c.gamma = 1.0 / (2.0 * f64::from(n - 1));
        c.cycle = CYCLE;
        c.lease = LEASE;
        c.demand_tau = 5 * CYCLE;
        c.fallback = Fallback::None;
        c.audit_every = Some(10 * LEASE);
        c.idle_after = Some(30 * LEASE);
        c
    }
}
