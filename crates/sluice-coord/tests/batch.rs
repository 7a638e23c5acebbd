#![allow(clippy::unwrap_used)]
//! Messages received together (`Node::handle_messages`, what the daemon's driver calls
//! with the datagrams queued behind one): taken exactly as one at a time, answered once.

use sluice_coord::node::{Config, Node};
use sluice_coord::wire::{Message, NodeId};

const CYCLE: u64 = 100_000_000;
const LIMIT: u64 = 1_000_000;
const KEYS: [u64; 3] = [7, 8, 9];

fn node(id: NodeId) -> Node {
    let links = (0..3).filter(|&p| p != id).map(|p| (p, 1.0)).collect();
    let mut c = Config::new(id, vec![0, 1, 2], links, LIMIT);
    c.cycle = CYCLE;
    c.lease = 10 * CYCLE;
    Node::new(c, 0).unwrap()
}

/// Three nodes, node 0 starved on every key: a few cycles of the law, every message
/// delivered. Returns the nodes and the messages to node 0 of the last cycle.
fn warm(cycles: u64) -> (Vec<Node>, Vec<(NodeId, Message)>, u64) {
    let mut nodes: Vec<Node> = (0..3).map(node).collect();
    let mut draw = || 0.5;
    let mut to_zero = Vec::new();
    let mut now = 0;
    for c in 1..=cycles {
        now = c * CYCLE;
        for (i, n) in nodes.iter_mut().enumerate() {
            for &k in &KEYS {
                let d = if i == 0 { 0.9 } else { 0.05 };
                n.set_demand(now, k, d * LIMIT as f64);
            }
        }
        let mut inbox: Vec<(NodeId, NodeId, Message)> = Vec::new();
        for (i, n) in nodes.iter_mut().enumerate() {
            n.tick(now, &mut draw);
            for m in n.ready(now).messages {
                inbox.push((i as NodeId, m.to, m.message));
            }
        }
        to_zero.clear();
        for (from, to, m) in inbox {
            if to == 0 && c == cycles {
                to_zero.push((from, m));
            } else {
                nodes[to as usize].handle_message(now + 1, from, m, &mut draw);
            }
        }
    }
    (nodes, to_zero, now + 1)
}

/// The same counters, shares and lease whether node 0 takes its peers' messages one at a
/// time or as one batch; and the batch answers each peer at most once.
#[test]
fn a_batch_is_taken_as_its_messages_one_by_one_and_answered_once() {
    for cycles in [2, 3, 5, 8, 13] {
        let (nodes, msgs, now) = warm(cycles);
        assert!(msgs.len() >= 2, "both peers wrote to node 0");
        let mut one = nodes[0].clone();
        let mut batch = nodes[0].clone();
        let mut draw = || 0.5;
        for (from, m) in msgs.clone() {
            one.handle_message(now, from, m, &mut draw);
        }
        batch.handle_messages(now, msgs, &mut draw);
        for &k in &KEYS {
            assert_eq!(one.own(k), batch.own(k), "key {k} after {cycles} cycles");
            for p in [1, 2] {
                assert_eq!(one.link_counters(k, p), batch.link_counters(k, p));
            }
        }
        assert_eq!(one.lease_until(), batch.lease_until());
        let answers = batch.ready(now).messages;
        for p in [1, 2] {
            assert!(
                answers.iter().filter(|m| m.to == p).count() <= 1,
                "node {p} answered more than once: {answers:?}"
            );
        }
    }
}
