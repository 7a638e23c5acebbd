#![allow(clippy::unwrap_used)]
//! One scripted test per mechanism of the failure layer (docs/PROTOCOL.md, "Leases and
//! fences"): each fails when its mechanism is taken out. On the deterministic in-memory
//! network, with real messages through the real encoding.

use sluice_coord::node::{Config, Fallback, LeaseState, Node};
use sluice_coord::testing::{Cluster, NetConfig, Step, complete};
use sluice_coord::wire::{self, NodeId};

const CYCLE: u64 = 100_000_000;
const LEASE: u64 = 1_000_000_000;
const KEY: u64 = 7;
const LIMIT: u64 = 1_000_000;

fn mesh(n: u32) -> impl Fn(NodeId, Vec<(NodeId, f64)>) -> Config + Clone {
    move |id, links| {
        let mut c = Config::new(id, (0..n).collect(), links, LIMIT);
        c.gamma = 1.0 / (2.0 * f64::from(n - 1));
        c.cycle = CYCLE;
        c.lease = LEASE;
        c.demand_tau = 2 * CYCLE;
        c
    }
}

fn cluster(n: u32) -> Cluster {
    let mut c = Cluster::new(n, &complete(n), mesh(n), NetConfig::perfect(), 1).unwrap();
    for i in 0..n {
        c.apply(Step::SetDemand(i, KEY, 0.5 * LIMIT as f64));
    }
    c.apply(Step::Run(20));
    c
}

fn leased(c: &Cluster, id: NodeId) -> bool {
    let n = c.node(id).unwrap();
    n.lease_state(c.now()) != LeaseState::Expired
}

/// A lease needs a quorum's echoes: a node cut off alone loses it within a lease (and then
/// enforces its fallback), while the two that still hear each other keep theirs.
#[test]
fn a_lease_needs_a_quorum() {
    let mut c = cluster(3);
    assert!((0..3).all(|i| leased(&c, i)));
    c.apply(Step::Partition(vec![2]));
    c.apply(Step::Run(11));
    assert!(!leased(&c, 2), "alone, node 2 holds no lease");
    assert_eq!(c.node(2).unwrap().enforced(KEY, c.now()), 0);
    assert!(leased(&c, 0) && leased(&c, 1));
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// A fence needs a quorum of votes: cut 2|2, the side with the lowest id is a quorum and
/// fences the other side (its dead floors cover it); the other side fences nobody.
#[test]
fn only_a_quorum_fences() {
    let mut c = cluster(4);
    c.apply(Step::Partition(vec![2, 3]));
    c.apply(Step::Run(15));
    for i in [0, 1] {
        let dead = c.node(i).unwrap().dead_floors();
        assert_eq!(dead.get(&2), Some(&1), "node {i}: {dead:?}");
        assert_eq!(dead.get(&3), Some(&1), "node {i}: {dead:?}");
    }
    for i in [2, 3] {
        let dead = c.node(i).unwrap().dead_floors();
        assert!(
            !dead.contains_key(&0) && !dead.contains_key(&1),
            "node {i}: {dead:?}"
        );
    }
    // And the quorum's audit minted the cut-off side's shares: L is enforced on one side.
    c.apply(Step::Run(10));
    assert_eq!(c.sum_enforced(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// A vote is a promise never to echo the incarnation again: after the cut heals, the fenced
/// incarnation hears everybody but gets no lease back (its share was minted again); told of
/// its fence, it starts again holding nothing.
#[test]
fn a_fenced_incarnation_never_holds_a_lease_again() {
    let mut c = cluster(3);
    c.apply(Step::Partition(vec![2]));
    c.apply(Step::Run(13));
    assert_eq!(c.node(0).unwrap().dead_floors().get(&2), Some(&1));
    c.apply(Step::Heal);
    for _ in 0..20 {
        c.apply(Step::Run(1));
        let n = c.node(2).unwrap();
        if n.incarnation() == 1 {
            assert!(!leased(&c, 2), "the fenced incarnation was leased again");
        }
        assert!(c.sum_enforced(KEY) <= LIMIT);
    }
    assert!(c.node(2).unwrap().incarnation() > 1);
    c.apply(Step::Run(60));
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// Three nodes driven by hand: every message of `from` delivered at `now`, or dropped.
struct Hand {
    nodes: Vec<Node>,
}

impl Hand {
    fn new(incarnations: [u64; 3]) -> Self {
        let nodes = (0..3)
            .map(|id| {
                let links = (0..3).filter(|&p| p != id).map(|p| (p, 1.0)).collect();
                let cfg = Config {
                    incarnation: incarnations[id as usize],
                    ..mesh(3)(id, links)
                };
                Node::new(cfg, 0).unwrap()
            })
            .collect();
        Self { nodes }
    }

    /// Ticks every node at `now`; delivers what each sends to the nodes in `to[sender]`.
    fn cycle(&mut self, now: u64, to: [&[NodeId]; 3]) -> Vec<(NodeId, NodeId, wire::Message)> {
        let mut draw = || 0.5;
        let mut sent = Vec::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            n.tick(now, &mut draw);
            for m in n.ready(now).messages {
                sent.push((i as NodeId, m.to, m.message));
            }
        }
        for (from, dest, m) in &sent {
            if to[*from as usize].contains(dest) {
                let bytes = wire::encode(m);
                self.nodes[*dest as usize].handle_message(
                    now,
                    *from,
                    wire::decode(&bytes).unwrap(),
                    &mut draw,
                );
            }
        }
        sent
    }
}

/// The echo each node sent to node 2 at this cycle.
fn echoes_to_2(sent: &[(NodeId, NodeId, wire::Message)]) -> Vec<(NodeId, u64)> {
    sent.iter()
        .filter(|(_, to, _)| *to == 2)
        .map(|(from, _, m)| (*from, m.echo))
        .collect()
}

/// A vote is a promise never to echo the incarnation again: node 0 stops hearing node 2,
/// votes to fence it, and when node 2 is heard again its messages get no echo from node 0
/// (node 1, which kept hearing it, echoes as before).
#[test]
fn a_voter_never_echoes_again() {
    let mut h = Hand::new([1, 1, 1]);
    let all: [&[NodeId]; 3] = [&[1, 2], &[0, 2], &[0, 1]];
    for k in 1..=10 {
        h.cycle(k * CYCLE, all);
    }
    // Node 2 goes silent to node 0 only.
    let cut: [&[NodeId]; 3] = [&[1, 2], &[0, 2], &[1]];
    for k in 11..=24 {
        h.cycle(k * CYCLE, cut);
    }
    assert_eq!(
        h.nodes[0].pending_votes().get(&2).and_then(|v| v.get(&0)),
        Some(&1),
        "node 0 voted against node 2's incarnation 1"
    );
    for k in 25..=27 {
        let sent = h.cycle(k * CYCLE, all);
        let echoes = echoes_to_2(&sent);
        assert!(
            echoes.contains(&(0, 0)),
            "node 0 echoes a node it voted against: {echoes:?}"
        );
        assert!(echoes.iter().any(|&(f, e)| f == 1 && e > 0), "{echoes:?}");
    }
}

/// A restarted node has lost its votes: until its quarantine ends it echoes nobody, or a
/// fenced incarnation could get a lease from it and from a voter that is left. Node 1 is
/// a restart (incarnation 5): its messages carry no echo for the quarantine, then echo.
#[test]
fn a_restarted_node_echoes_nobody_in_quarantine() {
    let mut h = Hand::new([1, 5, 1]);
    let all: [&[NodeId]; 3] = [&[1, 2], &[0, 2], &[0, 1]];
    let q = h.nodes[1].quarantine_until();
    assert!(q >= 3 * LEASE, "quarantine ends at {q}");
    let mut k = 1;
    while k * CYCLE < q {
        let sent = h.cycle(k * CYCLE, all);
        for (from, _, m) in &sent {
            if *from == 1 {
                assert_eq!(m.echo, 0, "an echo in quarantine at {}", k * CYCLE);
            }
        }
        k += 1;
    }
    let sent = h.cycle(k * CYCLE, all);
    assert!(echoes_to_2(&sent).iter().any(|&(f, e)| f == 1 && e > 0));
    // Node 1 held a lease meanwhile (its peers echo it), but never made one for others.
    assert!(h.nodes[1].lease_state(k * CYCLE) != LeaseState::Expired);
}

/// A node without a lease for two leases starts again: a node cut off alone for long is a
/// new incarnation holding only its reservation by the time the cut heals.
#[test]
fn a_node_without_a_lease_starts_again() {
    let make = move |id, links| {
        let mut c = mesh(3)(id, links);
        c.fallback = Fallback::Reserved(0.5);
        c
    };
    let mut c = Cluster::new(3, &complete(3), make, NetConfig::perfect(), 1).unwrap();
    c.apply(Step::Run(20));
    c.apply(Step::Partition(vec![2]));
    c.apply(Step::Run(25));
    assert_eq!(c.node(2).unwrap().incarnation(), 1, "not before two leases");
    c.apply(Step::Run(10));
    let n = c.node(2).unwrap();
    assert!(n.incarnation() > 1);
    assert_eq!(n.own(KEY), LIMIT / 3 / 2, "its reservation, no more");
    c.apply(Step::Heal);
    c.apply(Step::Run(60));
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// Hearing a later incarnation of a peer folds the link with the earlier one into the base:
/// the node's own share is unchanged, the link's counters are gone (message level).
#[test]
fn a_later_incarnation_folds_the_link_with_the_earlier_one() {
    let cfg = |id, peer| {
        let mut c = Config::new(id, vec![0, 1], vec![(peer, 1.0)], 1000);
        c.audit_every = None;
        c
    };
    let mut a = Node::new(cfg(0, 1), 0).unwrap();
    let mut b = Node::new(cfg(1, 0), 0).unwrap();
    let mut draw = || 0.5;
    a.set_demand(0, KEY, 900.0);
    b.set_demand(0, KEY, 0.0);
    for k in 1..=30u64 {
        let now = k * CYCLE;
        a.tick(now, &mut draw);
        b.tick(now, &mut draw);
        for m in a.ready(now).messages {
            b.handle_message(
                now,
                0,
                wire::decode(&wire::encode(&m.message)).unwrap(),
                &mut draw,
            );
        }
        for m in b.ready(now).messages {
            a.handle_message(
                now,
                1,
                wire::decode(&wire::encode(&m.message)).unwrap(),
                &mut draw,
            );
        }
    }
    let own = a.own(KEY);
    assert!(a.link_counters(KEY, 1).1 > 0, "a received gifts from b");
    // Node 1 restarts as incarnation 2: its first message folds our link with incarnation 1.
    let mut b2 = Node::new(
        Config {
            incarnation: 2,
            ..cfg(1, 0)
        },
        31 * CYCLE,
    )
    .unwrap();
    b2.tick(31 * CYCLE, &mut draw);
    for m in b2.ready(31 * CYCLE).messages {
        a.handle_message(31 * CYCLE, 1, m.message, &mut draw);
    }
    assert_eq!(a.link_counters(KEY, 1), (0, 0));
    assert_eq!(a.own(KEY), own, "a fold changes no share");
    assert_eq!(a.dead_floors().get(&1), Some(&1));
}

/// Votes are cast only under a lease: cut 2|2, the side without a quorum must not promise
/// never to echo the other side, or after the heal and a crash of node 0, node 1 could get
/// no lease from nodes 2 and 3 (the scenario of the real-stack failure this design
/// replaces: capacity lost for good).
#[test]
fn a_cut_off_minority_casts_no_vote() {
    let mut c = cluster(4);
    c.apply(Step::Partition(vec![2, 3]));
    c.apply(Step::Run(30));
    for i in [2, 3] {
        let votes = c.node(i).unwrap().pending_votes();
        assert!(
            !votes.contains_key(&0) && !votes.contains_key(&1),
            "node {i}: {votes:?}"
        );
    }
    c.apply(Step::Heal);
    c.apply(Step::Run(30));
    c.apply(Step::Crash(0));
    c.apply(Step::Run(25));
    assert!(leased(&c, 1), "node 1 keeps its lease through the crash");
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}

/// An incarnation that went backwards (A3 broken: a state file added after starts from the
/// clock, so the next start is incarnation 1) is heard again: the peers' dead floor for the
/// node lies above it, the node hears that floor and starts again above it (counted as an id
/// conflict), gets a lease, and the cluster is back at exactly L. Without the jump it would
/// creep up one incarnation per two leases, ignored by every peer, for ever.
#[test]
fn an_incarnation_that_went_backwards_starts_again_above_the_floor() {
    let mut c = cluster(3);
    c.apply(Step::Crash(2));
    c.apply(Step::RestartFromClock(2));
    c.apply(Step::Run(30));
    let from_clock = c.node(2).unwrap().incarnation();
    assert!(from_clock > 1_000_000 && leased(&c, 2));
    c.apply(Step::Crash(2));
    c.apply(Step::Run(20));
    assert!(c.node(0).unwrap().dead_floors()[&2] >= from_clock);
    c.apply(Step::RestartAs(2, 1));
    c.apply(Step::Run(30));
    let n = c.node(2).unwrap();
    assert!(n.incarnation() > from_clock, "{}", n.incarnation());
    assert_eq!(n.id_conflicts(), 1);
    assert!(leased(&c, 2), "node 2 is heard again");
    c.apply(Step::Run(30));
    assert_eq!(c.sum_own(KEY), LIMIT);
    assert!(c.violations.is_empty(), "{:?}", c.violations);
}
