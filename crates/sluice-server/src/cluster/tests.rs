//! The driver's unit tests: the automatic gain, the fallback's parsing.

use super::gamma::auto_gain;
use super::*;

fn complete(n: u32) -> AutoGamma {
    let mut edges = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            edges.push((a, b, 1.0));
        }
    }
    AutoGamma {
        edges,
        measure: Measure::Throttled,
    }
}

/// On K_n the stability bound binds: γ = 1/(2(n−1)) (seed 003 eq. 15) below
/// γ* = 1/n (seed 000 Thm 2); without a member, the survivors are K_{n−1}.
#[test]
fn auto_gain_follows_the_live_members() {
    let k5 = complete(5);
    let all: BTreeSet<NodeId> = (0..5).collect();
    let g5 = auto_gain(0, &all, &k5, 4.0, true).unwrap().unwrap();
    assert!((g5 - 1.0 / 8.0).abs() < 1e-12, "{g5}");
    let four: BTreeSet<NodeId> = (0..4).collect();
    let g4 = auto_gain(0, &four, &k5, 3.0, false).unwrap().unwrap();
    assert!((g4 - 1.0 / 6.0).abs() < 1e-12, "{g4}");
    // Alone: no graph, the caller keeps its gain.
    let me = BTreeSet::from([0]);
    assert_eq!(auto_gain(0, &me, &k5, 0.0, false).unwrap(), None);
}

/// A ring that loses a node is a path, and only `me`'s component counts; at start a
/// disconnected configured graph is an error, not a smaller cluster.
#[test]
fn auto_gain_on_a_broken_ring_uses_the_path() {
    let ring = AutoGamma {
        edges: vec![(0, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0), (3, 0, 1.0)],
        measure: Measure::Throttled,
    };
    let live: BTreeSet<NodeId> = [0, 1, 2].into();
    // Path 0-1-2: λ = 0, 1, 3, so γ* = 2/4; node 0 has one live neighbour: cap 1/2.
    let g = auto_gain(0, &live, &ring, 1.0, false).unwrap().unwrap();
    assert!((g - 0.5).abs() < 1e-9, "{g}");
    let split = AutoGamma {
        edges: vec![(0, 1, 1.0), (2, 3, 1.0)],
        measure: Measure::Throttled,
    };
    let all: BTreeSet<NodeId> = (0..4).collect();
    assert!(auto_gain(0, &all, &split, 1.0, true).is_err());
    // At run time the same graph is node 0's component: K_2.
    let g = auto_gain(0, &all, &split, 1.0, false).unwrap().unwrap();
    assert!((g - 0.5).abs() < 1e-9, "{g}");
}

/// The lease ends exactly `lease` after the message a quorum echoed was sent.
#[test]
fn lease_end_is_exact() {
    let cfg = |id, peer| {
        let mut c = NodeConfig::new(id, vec![0, 1], vec![(peer, 1.0)], SCALE);
        c.lease = 1_000_000_000;
        c
    };
    // Node 1 needs node 0's echo (node 0, the lower id, is a quorum of two alone).
    let mut a = Node::new(cfg(0, 1), 0).unwrap();
    let mut b = Node::new(cfg(1, 0), 0).unwrap();
    assert_eq!(lease_end(&b, 5), None, "no lease before an echo");
    let mut draw = || 0.5;
    b.tick(5, &mut draw);
    for m in b.ready(5).messages {
        a.handle_message(6, 1, m.message, &mut draw);
    }
    a.tick(7, &mut draw);
    for m in a.ready(7).messages {
        b.handle_message(8, 0, m.message, &mut draw);
    }
    let end = lease_end(&b, 8).unwrap();
    assert_eq!(node_lease_state(&b, end), LeaseState::Expired);
    assert_ne!(node_lease_state(&b, end - 1), LeaseState::Expired);
    assert_eq!(end, 5 + 1_000_000_000);
    assert_eq!(lease_end(&b, end), None);
}

fn node_lease_state(n: &Node, at: u64) -> LeaseState {
    n.lease_state(at)
}
