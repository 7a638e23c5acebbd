#![allow(clippy::unwrap_used)]
//! The members digest (`wire::Message::members`, docs/PROTOCOL.md "Messages"): a node ignores
//! every message from a node started with other voting members, which would count other
//! quorums and initial shares. Scripted message by message, through the real encoding.

use sluice_coord::node::{Config, LeaseState, Node};
use sluice_coord::wire::{self, NodeId};

const CYCLE: u64 = 100_000_000;

fn node(id: NodeId, members: Vec<NodeId>, peer: NodeId) -> Node {
    let mut c = Config::new(id, members, vec![(peer, 1.0)], 1_000_000);
    c.gamma = 0.5;
    c.cycle = CYCLE;
    c.lease = 10 * CYCLE;
    Node::new(c, 1).unwrap()
}

/// Runs `a` and `b` for `cycles`, each delivering its messages to the other encoded as
/// `version` (the version a negotiated link speaks). Returns when that ended (the clock).
fn exchange(a: &mut Node, b: &mut Node, cycles: u64, version: u8) -> u64 {
    let mut now = 1;
    for _ in 0..cycles {
        now += CYCLE;
        deliver(a, b, now, version);
        deliver(b, a, now, version);
    }
    now
}

fn deliver(from: &mut Node, to: &mut Node, now: u64, version: u8) {
    let mut draw = || 0.5;
    from.tick(now, &mut draw);
    // Messages to member 2, which is not running, are lost.
    let peer = to.id();
    for m in from
        .ready(now)
        .messages
        .into_iter()
        .filter(|m| m.to == peer)
    {
        let bytes = wire::encode_as(&m.message, version).unwrap();
        to.handle_message(now, from.id(), wire::decode(&bytes).unwrap(), &mut draw);
    }
}

/// Node 1 believes the members are {0, 1, 2}: it needs node 0's echo for a quorum (2 of 3),
/// and node 0, configured with {0, 1}, must not give it: neither takes the other's messages,
/// so node 1 never holds a lease and never links with node 0. With the same members they do.
#[test]
fn a_node_with_other_members_is_ignored() {
    let mut a = node(0, vec![0, 1], 1);
    let mut b = node(1, vec![0, 1, 2], 0);
    let now = exchange(&mut a, &mut b, 20, wire::VERSION);
    assert_eq!(
        b.lease_state(now),
        LeaseState::Expired,
        "no quorum for node 1"
    );
    assert_eq!((a.peer_incarnation(1), b.peer_incarnation(0)), (0, 0));
    assert!(a.refused_membership() >= 20, "{}", a.refused_membership());
    assert!(b.refused_membership() >= 20, "{}", b.refused_membership());

    // The control: the same two nodes with the same members link and node 1 is leased.
    let mut a = node(0, vec![0, 1, 2], 1);
    let mut b = node(1, vec![0, 1, 2], 0);
    let now = exchange(&mut a, &mut b, 20, wire::VERSION);
    assert_eq!((a.refused_membership(), b.refused_membership()), (0, 0));
    assert_ne!(b.lease_state(now), LeaseState::Expired);
    assert_eq!((a.peer_incarnation(1), b.peer_incarnation(0)), (1, 1));
}
