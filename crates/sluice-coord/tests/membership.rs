#![allow(clippy::unwrap_used)]
//! Run-time membership (docs/PROTOCOL.md, "Membership"): joiners that the voters never
//! configured, learned of by one seed and introduced to the rest, earn a share by the law;
//! a joiner that crashes is fenced like any node, its link goes, and its capacity comes back
//! through the audit; a joiner that comes back after its fence joins again.

use sluice_coord::node::{Config, LeaseState};
use sluice_coord::testing::{Cluster, NetConfig, Step, complete};
use sluice_coord::wire::NodeId;

const CYCLE: u64 = 100_000_000;
const LEASE: u64 = 1_000_000_000;
const KEY: u64 = 7;
const LIMIT: u64 = 1_000_000;
const VOTERS: u32 = 3;

/// How long a departed joiner's dead floor is kept (the smallest allowed).
const FORGET: u64 = 6 * LEASE + 64 * CYCLE;

fn config(id: NodeId, links: Vec<(NodeId, f64)>) -> Config {
    let mut c = Config::new(id, (0..VOTERS).collect(), links, LIMIT);
    c.forget_departed = FORGET;
    // Stable for the degree a voter reaches with every joiner (the law also caps γ by the
    // live degree at every tick).
    c.gamma = 0.1;
    c.cycle = CYCLE;
    c.lease = LEASE;
    c.demand_tau = 2 * CYCLE;
    c.audit_every = Some(20 * CYCLE);
    c
}

/// Three voters at half their share's demand each, settled.
fn voters() -> Cluster {
    let mut c = Cluster::new(VOTERS, &complete(VOTERS), config, NetConfig::perfect(), 3).unwrap();
    for i in 0..VOTERS {
        c.apply(Step::SetDemand(i, KEY, 0.2 * LIMIT as f64));
    }
    c.apply(Step::Run(20));
    c
}

/// A joiner that knows only node 0 (its seed); the driver introduces it to the others as
/// it learns of them (what the daemon's directory does), and the others to it.
fn join(c: &mut Cluster, id: NodeId, demand: f64) {
    c.apply(Step::AddNode(Box::new(config(id, vec![(0, 1.0)]))));
    c.apply(Step::SetDemand(id, KEY, demand));
    c.apply(Step::Run(2));
    // Every voter up (a crashed one learns nothing).
    for v in 1..VOTERS {
        let Some((n, now)) = c.node_mut(v) else {
            continue;
        };
        n.add_peer(id, 1.0, now);
        let (n, now) = c.node_mut(id).unwrap();
        n.add_peer(v, 1.0, now);
    }
}

/// [`voters`] and joiners 10 and 11 asking 0.3 L each, settled with a share each.
fn voters_and_two_joiners() -> Cluster {
    let mut c = voters();
    join(&mut c, 10, 0.3 * LIMIT as f64);
    join(&mut c, 11, 0.3 * LIMIT as f64);
    c.apply(Step::Run(30));
    assert!(c.node(11).unwrap().own(KEY) > 0);
    assert!(c.node(10).unwrap().own(KEY) > 0);
    c
}

fn leased(c: &Cluster, id: NodeId) -> bool {
    c.node(id).unwrap().lease_state(c.now()) != LeaseState::Expired
}

#[test]
fn a_joiner_introduced_by_one_seed_earns_its_share() {
    let mut c = voters();
    join(&mut c, 10, 0.3 * LIMIT as f64);
    // A lease from a quorum of the voters, then a share by the law: within lease + 3 cycles.
    c.apply(Step::Run(LEASE / CYCLE + 3));
    assert!(leased(&c, 10), "the joiner holds a lease from the voters");
    let own = c.node(10).unwrap().own(KEY);
    assert!(own >= LIMIT / 4, "the joiner's share: {own}");
    assert_eq!(c.sum_own(KEY), LIMIT, "the shares still add up to L");
    // Every voter knows it, and every node shows the same membership version.
    let versions: Vec<u64> = [0, 1, 2, 10]
        .iter()
        .map(|&i| c.node(i).unwrap().membership().version)
        .collect();
    assert!(versions.windows(2).all(|w| w[0] == w[1]), "{versions:?}");
    let m = c.node(1).unwrap().membership();
    assert_eq!(m.voters, vec![0, 1, 2]);
    assert!(m.live.iter().any(|&(p, _)| p == 10), "{m:?}");
    assert!(m.changes.joins >= 1);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

#[test]
fn a_crashed_joiner_is_fenced_and_its_capacity_minted_again() {
    let mut c = voters();
    join(&mut c, 10, 0.3 * LIMIT as f64);
    c.apply(Step::Run(30));
    let held = c.node(10).unwrap().own(KEY);
    assert!(held > 0);
    c.apply(Step::Crash(10));
    // Votes after lease·(1+ρ)², a fence, a fold, an audit (within ten more cycles).
    c.apply(Step::Run(LEASE / CYCLE + 12));
    assert_eq!(c.sum_own(KEY), LIMIT, "what the joiner held is back");
    for v in 0..VOTERS {
        let n = c.node(v).unwrap();
        assert_eq!(n.dead_floors().get(&10), Some(&1), "node {v}");
        assert!(
            n.membership().live.iter().all(|&(p, _)| p != 10),
            "node {v} keeps no link with a fenced joiner"
        );
        assert_eq!(n.link_state(10, c.now()), None, "node {v}");
        assert!(n.membership().changes.fences >= 1);
    }
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

#[test]
fn a_fenced_joiner_that_comes_back_joins_again() {
    let mut c = voters();
    join(&mut c, 10, 0.3 * LIMIT as f64);
    c.apply(Step::Run(30));
    // Cut off long enough to be fenced (the voters drop its link) and to start again on its
    // own (two leases without a lease); it still knows every voter's incarnation, so its
    // messages are not a joiner's introduction: the dead floor lets them in.
    c.apply(Step::Partition(vec![10]));
    c.apply(Step::Run(3 * LEASE / CYCLE + 5));
    assert!(c.node(10).unwrap().incarnation() > 1, "started again");
    assert_eq!(c.node(0).unwrap().link_state(10, c.now()), None);
    c.apply(Step::Heal);
    c.apply(Step::Run(30));
    assert!(leased(&c, 10), "the later incarnation holds a lease again");
    assert!(c.node(10).unwrap().own(KEY) >= LIMIT / 4);
    for v in 0..VOTERS {
        assert!(c.node(v).unwrap().peer_incarnation(10) > 1, "node {v}");
    }
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

#[test]
fn a_joiner_that_leaves_hands_its_share_back() {
    let mut c = voters_and_two_joiners();
    c.apply(Step::Leave(11));
    c.apply(Step::Run(20));
    assert_eq!(c.node(11).unwrap().own(KEY), 0);
    assert_eq!(c.sum_own(KEY), LIMIT);
    for v in 0..VOTERS {
        let m = c.node(v).unwrap().membership();
        assert_eq!(m.changes.leaves, 1, "node {v}: {m:?}");
        assert!(m.live.iter().all(|&(p, _)| p != 11));
    }
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// A join, a leave and a crash at the same time (issue: elastic clusters), the crash of a
/// joiner or of a voter: Σ enforced ≤ L after every cycle (the harness checks), and once
/// the crashed node is fenced and audited the cluster is back at exactly L, the newcomer
/// holding a lease and a share, the leaver nothing.
#[test]
fn a_join_a_leave_and_a_crash_at_once_end_at_exactly_l() {
    for crashed in [10, 2] {
        let mut c = voters_and_two_joiners();
        c.apply(Step::Leave(11));
        c.apply(Step::Crash(crashed));
        join(&mut c, 12, 0.3 * LIMIT as f64);
        c.apply(Step::Run(LEASE / CYCLE + 20));
        assert_eq!(c.sum_own(KEY), LIMIT, "crash of {crashed}");
        assert_eq!(c.node(11).unwrap().own(KEY), 0, "crash of {crashed}");
        assert!(
            leased(&c, 12),
            "crash of {crashed}: the newcomer holds a lease"
        );
        assert!(
            c.node(12).unwrap().own(KEY) >= LIMIT / 5,
            "crash of {crashed}: the newcomer's share {}",
            c.node(12).unwrap().own(KEY)
        );
        for v in (0..VOTERS).filter(|&v| v != crashed) {
            let n = c.node(v).unwrap();
            assert!(n.dead_floors().get(&crashed).is_some(), "node {v}");
            assert_eq!(n.membership().changes.leaves, 1, "node {v}");
        }
        assert!(
            c.violations.is_empty(),
            "crash of {crashed}: {:?}",
            c.violations
        );
    }
}

#[test]
fn a_joiner_restarted_before_its_fence_is_a_neighbour_again() {
    let mut c = voters();
    join(&mut c, 10, 0.3 * LIMIT as f64);
    c.apply(Step::Run(30));
    // kill -9 and a restart with its state file, well within lease·(1+ρ)²: the voters fold
    // the old incarnation and link with the new one, which must echo them (`heard_us`)
    // though it is in its quarantine (a joiner's echo makes no lease).
    c.apply(Step::Crash(10));
    c.apply(Step::Restart(10));
    c.apply(Step::Run(LEASE / CYCLE + 20));
    assert!(c.node(10).unwrap().incarnation() > 1);
    assert!(leased(&c, 10), "the later incarnation holds a lease");
    let own = c.node(10).unwrap().own(KEY);
    assert!(
        own >= LIMIT / 4,
        "the later incarnation earns its share again: {own}"
    );
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// Joiners with ids never used again come and go (a Deployment scaled up and down for
/// months): a node keeps a departed joiner's dead floor for `forget_departed`, so the floors
/// it holds, and those every message carries, stay bounded by the departures of that long,
/// and the cluster stays at exactly `L` throughout.
#[test]
fn churn_of_joiner_ids_leaves_bounded_dead_floors() {
    let mut c = voters();
    let round = 20; // cycles per joiner
    let joiners = 40;
    let mut most = 0;
    for j in 0..joiners {
        let id = 100 + j;
        join(&mut c, id, 0.2 * LIMIT as f64);
        c.apply(Step::Run(round - 6));
        // Half leave gracefully, half crash (fenced).
        c.apply(if j % 2 == 0 {
            Step::Leave(id)
        } else {
            Step::Crash(id)
        });
        c.apply(Step::Run(4));
        for v in 0..VOTERS {
            most = most.max(c.node(v).unwrap().dead_floors().len());
        }
    }
    // Departures within `forget_departed` (plus the floors' own ages), not all 40.
    let window = (FORGET / CYCLE / round) as usize + 3;
    assert!(most <= window, "floors held: {most} (window {window})");
    c.apply(Step::Run(2 * FORGET / CYCLE));
    for v in 0..VOTERS {
        let n = c.node(v).unwrap();
        assert!(
            n.dead_floors().is_empty(),
            "node {v}: {:?}",
            n.dead_floors()
        );
        assert_eq!(n.membership().live.len(), VOTERS as usize, "node {v}");
    }
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// An attacker on the path records a joiner's datagrams (its introduction, then its gifts
/// back to the voters) and replays them after the joiner is gone and its dead floor
/// forgotten. They authenticate; the link they open counts nothing, because the replayed
/// messages never echo one sent on it (`Link::heard_us`), so no capacity comes twice.
#[test]
fn a_departed_joiners_datagrams_replayed_after_its_floor_is_forgotten_add_nothing() {
    let mut c = voters();
    c.record(true);
    join(&mut c, 10, 0.3 * LIMIT as f64);
    c.apply(Step::Run(30));
    assert!(c.node(10).unwrap().own(KEY) >= LIMIT / 4);
    // Its demand goes: it gives its share back, and those messages are recorded too.
    c.apply(Step::SetDemand(10, KEY, 0.0));
    c.apply(Step::Run(30));
    c.apply(Step::Crash(10));
    c.record(false);
    c.apply(Step::Run(FORGET / CYCLE + 20));
    for v in 0..VOTERS {
        assert_eq!(
            c.node(v).unwrap().dead_floors().get(&10),
            None,
            "node {v} forgot"
        );
    }
    assert_eq!(c.sum_own(KEY), LIMIT);
    for _ in 0..3 {
        c.apply(Step::Replay(10));
        c.apply(Step::Run(2));
    }
    assert!(
        c.sum_own(KEY) <= LIMIT,
        "replayed gifts taken: {}",
        c.sum_own(KEY)
    );
    assert!(c.violations.is_empty(), "{:?}", c.violations);
    // The phantom link is voted out, fenced and dropped like a crashed joiner.
    c.apply(Step::Run(LEASE / CYCLE + 20));
    assert_eq!(c.sum_own(KEY), LIMIT);
    for v in 0..VOTERS {
        assert_eq!(c.node(v).unwrap().link_state(10, c.now()), None, "node {v}");
    }
}

/// Two processes under one id (A1 broken: two nodes drew one random id, or `--node-id` given
/// twice). The later one tells its own dead floor, its incarnation − 1, as every node does;
/// the earlier one hears it through a peer, above its own incarnation, and starts again above
/// it — above the later one's incarnation too, never on it: two processes with the same id
/// *and* incarnation would mix their counters on every link.
#[test]
fn a_node_that_hears_its_namesakes_floor_starts_above_the_namesake() {
    use sluice_coord::node::Node;
    let cfg = |id: NodeId, inc: u64| {
        let mut c = config(id, vec![(if id == 0 { 1 } else { 0 }, 1.0)]);
        c.incarnation = inc;
        c
    };
    let mut draw = || 0.5;
    let mut peer = Node::new(cfg(0, 3), 1).unwrap();
    let mut first = Node::new(cfg(1, 5), 1).unwrap();
    let mut second = Node::new(cfg(1, 10), 1).unwrap();
    // The peer hears the later process of id 1 (and so its floor, 9).
    second.tick(2, &mut draw);
    for m in second.ready(2).messages {
        peer.handle_message(3, 1, m.message, &mut draw);
    }
    assert_eq!(peer.dead_floors().get(&1), Some(&9));
    // The earlier process of id 1 hears the peer's floors.
    peer.tick(4, &mut draw);
    for m in peer.ready(4).messages {
        first.handle_message(5, 0, m.message, &mut draw);
    }
    assert_eq!(first.id_conflicts(), 1);
    assert!(
        first.incarnation() > second.incarnation(),
        "started again at {}, the namesake runs {}",
        first.incarnation(),
        second.incarnation()
    );
}

/// A directory sent just before its sender fenced a crashed joiner reaches a voter just after
/// that voter fenced it (seen on real processes: the two fall on the same cycle): the voter
/// links with the dead joiner again (`Node::add_peer`). That link never hears anything, so
/// it goes after two leases, and the joiner's floor is forgotten as any departed one's.
#[test]
fn a_link_to_a_fenced_joiner_made_again_by_a_late_directory_goes_and_its_floor_too() {
    let mut c = voters();
    join(&mut c, 10, 0.2 * LIMIT as f64);
    c.apply(Step::Run(30));
    c.apply(Step::Crash(10));
    c.apply(Step::Run(LEASE / CYCLE + 12));
    assert_eq!(c.node(0).unwrap().dead_floors().get(&10), Some(&1));
    let (n, now) = c.node_mut(0).unwrap();
    assert!(
        n.add_peer(10, 1.0, now),
        "the late directory links it again"
    );
    c.apply(Step::Run(2 * FORGET / CYCLE));
    let n = c.node(0).unwrap();
    assert_eq!(n.link_state(10, c.now()), None, "the unheard link is gone");
    assert_eq!(n.dead_floors().get(&10), None, "its floor is forgotten");
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}
