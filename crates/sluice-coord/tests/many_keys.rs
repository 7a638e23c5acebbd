#![allow(clippy::unwrap_used)]
//! Many keys (docs/PROTOCOL.md, "Many keys"): delta messages, the per-link byte budget and
//! the cap on keys with state, on a small in-memory network where every message goes
//! through the wire encoding.

use sluice_coord::node::{Config, Node};
use sluice_coord::testing::{complete, links_of};
use sluice_coord::wire::{self, Key, NodeId};

const CYCLE: u64 = 100_000_000;
const LIMIT: u64 = 1_000_000;

fn config(n: u32, id: NodeId) -> Config {
    let mut c = Config::new(id, (0..n).collect(), links_of(id, &complete(n)), LIMIT);
    c.gamma = 0.25;
    c.cycle = CYCLE;
    c.lease = 10 * CYCLE;
    c.demand_tau = 2 * CYCLE;
    c
}

/// Nodes whose messages are all delivered within the cycle, counted per link.
struct Net {
    nodes: Vec<Node>,
    now: u64,
    /// Per message: `(from, to, bytes, keys)`, since the last `take_log`.
    log: Vec<(NodeId, NodeId, usize, Vec<Key>)>,
}

impl Net {
    fn new(n: u32, tune: impl Fn(&mut Config)) -> Self {
        let nodes = (0..n)
            .map(|id| {
                let mut c = config(n, id);
                tune(&mut c);
                Node::new(c, 0).unwrap()
            })
            .collect();
        Self {
            nodes,
            now: 0,
            log: Vec::new(),
        }
    }

    fn cycle(&mut self, demand: &[(NodeId, Key, f64)]) {
        self.now += CYCLE;
        let now = self.now;
        let mut draw = || 0.5;
        for &(i, k, r) in demand {
            self.nodes[i as usize].set_demand(now, k, r);
        }
        let mut queue = Vec::new();
        for n in &mut self.nodes {
            n.tick(now, &mut draw);
            let id = n.id();
            queue.extend(n.ready(now).messages.into_iter().map(|m| (id, m)));
        }
        while let Some((from, out)) = queue.pop() {
            let bytes = wire::encode(&out.message);
            let keys = out.message.keys.iter().map(|e| e.key).collect();
            self.log.push((from, out.to, bytes.len(), keys));
            let msg = wire::decode(&bytes).unwrap();
            let to = &mut self.nodes[out.to as usize];
            to.handle_message(now, from, msg, &mut draw);
            queue.extend(to.ready(now).messages.into_iter().map(|m| (out.to, m)));
        }
    }

    fn sum_own(&self, key: Key) -> u64 {
        self.nodes.iter().map(|n| n.own(key)).sum()
    }

    fn sum_enforced(&self, key: Key) -> u64 {
        self.nodes.iter().map(|n| n.enforced(key, self.now)).sum()
    }

    /// Messages from `from` to `to` logged that carry `key`.
    fn carried(&self, from: NodeId, to: NodeId, key: Key) -> usize {
        self.log
            .iter()
            .filter(|(f, t, _, keys)| (*f, *t) == (from, to) && keys.contains(&key))
            .count()
    }
}

/// A key whose entry does not change is not sent every cycle (only with the rolling
/// refresh), and a change is sent in the next message. Fails if every send carries every
/// key, or if a change waits for the refresh.
#[test]
fn a_steady_key_is_not_resent_and_a_change_is_sent() {
    let mut net = Net::new(3, |_| {});
    let (hot, steady) = (1, 2);
    let demand = [
        (0, hot, 900_000.0),
        (1, hot, 200_000.0),
        (2, hot, 200_000.0),
        (0, steady, 100_000.0),
        (1, steady, 600_000.0),
        (2, steady, 600_000.0),
    ];
    for _ in 0..200 {
        net.cycle(&demand);
    }
    for k in [hot, steady] {
        assert_eq!(
            net.sum_own(k),
            LIMIT,
            "key {k} converged with nothing in flight"
        );
    }
    net.log.clear();
    let cycles = 40;
    for _ in 0..cycles {
        net.cycle(&demand);
    }
    let sends = net
        .log
        .iter()
        .filter(|(f, t, ..)| (*f, *t) == (0, 1))
        .count();
    let carried = net.carried(0, 1, steady);
    println!("steady key: in {carried} of {sends} messages 0 -> 1 over {cycles} cycles");
    assert!(sends >= cycles, "a message every cycle ({sends})");
    assert!(
        carried * 4 <= sends,
        "a steady key went in {carried} of {sends} messages"
    );
    assert!(
        carried >= 1,
        "the rolling refresh sends every key now and then"
    );
    // A change: node 0's demand for the steady key jumps; its next message says so.
    net.log.clear();
    let mut changed = demand;
    changed[3].2 = 900_000.0;
    net.cycle(&changed);
    assert!(net.carried(0, 1, steady) >= 1, "the change was not sent");
    assert!(net.carried(0, 2, steady) >= 1, "the change was not sent");
    // ... and the law acts on it: capacity moves to node 0.
    let before = net.nodes[0].own(steady);
    for _ in 0..50 {
        net.cycle(&changed);
        assert!(net.sum_enforced(steady) <= LIMIT);
    }
    assert!(net.nodes[0].own(steady) > before + 100_000);
    assert_eq!(net.sum_own(steady), LIMIT);
}

/// 10,000 keys become busy at once at one node: each link sends at most its byte budget a
/// cycle (after the first cycle's saved budget), in messages of at most one datagram, and
/// every key still reaches its peers and converges; Σ own ≤ L for every key throughout and
/// Σ own = L once the burst has gone out. Fails without the budget (the first cycle would
/// send every key, ~200 kB a link).
#[test]
fn a_burst_of_keys_is_paced_by_the_link_budget() {
    let budget = 20_000;
    let mut net = Net::new(3, |c| c.link_budget = budget);
    let keys = 10_000u64;
    let demand: Vec<(NodeId, Key, f64)> = (0..keys)
        .map(|k| ((k % 3) as NodeId, 1_000 + k, 600_000.0))
        .collect();
    let mut cycles = 0;
    loop {
        net.log.clear();
        net.cycle(&demand);
        cycles += 1;
        for from in 0..3 {
            for to in 0..3 {
                let sent: usize = net
                    .log
                    .iter()
                    .filter(|(f, t, ..)| (*f, *t) == (from, to))
                    .map(|l| l.2)
                    .sum();
                // One cycle's budget, plus the heads of reactive sends.
                assert!(
                    sent <= budget + 2_000,
                    "cycle {cycles}: {from} -> {to} sent {sent} bytes"
                );
            }
        }
        assert!(net.log.iter().all(|l| l.2 <= 60_000));
        for k in (0..keys).step_by(97) {
            assert!(net.sum_own(1_000 + k) <= LIMIT);
        }
        let done = (0..keys).all(|k| {
            let key = 1_000 + k;
            net.nodes.iter().all(|n| n.has_state(key)) && net.sum_own(key) == LIMIT
        });
        if done && net.nodes[0].own(1_000) > LIMIT / 2 {
            break;
        }
        assert!(cycles < 200, "the burst never went out");
    }
    // ~200 kB of entries per link at 20 kB a cycle: it took several cycles.
    assert!(cycles >= 8, "{cycles}");
    println!("10,000 keys at a {budget} B budget: out and converged in {cycles} cycles");
}

/// More keys change every cycle than a link's budget carries: each still goes out within a
/// few cycles, the highest-numbered ones too (a busy key beside a flood of changing keys,
/// "Many keys": a key keeps its place in the order of changes until its entry goes out).
/// Fails if every change takes a new number: keys changing every cycle are then renumbered
/// in key order at every send, and those past the budget never go out.
#[test]
fn keys_changing_every_cycle_all_go_out_past_the_budget() {
    let budget = 20_000;
    let mut net = Net::new(3, |c| c.link_budget = budget);
    let keys = 3_000u64;
    let demand = |high: bool| -> Vec<(NodeId, Key, f64)> {
        (0..keys)
            .map(|k| (0, 10_000 + k, if high { 800_000.0 } else { 200_000.0 }))
            .collect()
    };
    for c in 0..10 {
        net.cycle(&demand(c % 2 == 0));
    }
    net.log.clear();
    let cycles = 20;
    for c in 0..cycles {
        net.cycle(&demand(c % 2 == 0));
    }
    let bytes: usize = net
        .log
        .iter()
        .filter(|(f, t, ..)| (*f, *t) == (0, 1))
        .map(|l| l.2)
        .sum();
    // The budget binds: the changes did not all fit.
    assert!(bytes <= (budget + 2_000) * cycles, "{bytes}");
    let mut carried = vec![0usize; keys as usize];
    for (f, t, _, ks) in &net.log {
        if (*f, *t) == (0, 1) {
            for k in ks {
                if let Some(n) = k
                    .checked_sub(10_000)
                    .and_then(|i| carried.get_mut(i as usize))
                {
                    *n += 1;
                }
            }
        }
    }
    let never = carried.iter().filter(|&&n| n == 0).count();
    let least = carried.iter().min().copied().unwrap_or(0);
    println!(
        "{keys} keys changing every cycle at a {budget} B budget: {bytes} B over {cycles} \
         cycles, each key out {least}..{} times",
        carried.iter().max().copied().unwrap_or(0)
    );
    assert_eq!(never, 0, "{never} keys never went out in {cycles} cycles");
    assert!(
        least >= 2,
        "a key went out only {least} times in {cycles} cycles"
    );
    for k in (0..keys).step_by(97) {
        assert!(net.sum_enforced(10_000 + k) <= LIMIT);
    }
}

/// With `max_keys`, a node never holds state for more keys than the cap on demand alone: new
/// keys stay on the static split (Σ enforced ≤ L for every key), refusals are counted, idle
/// keys are retired early, and once they are dropped new keys get state again.
#[test]
fn the_cap_bounds_keys_with_state_and_conserves() {
    let cap = 50;
    let mut net = Net::new(3, |c| {
        c.max_keys = Some(cap);
        c.idle_after = Some(50 * CYCLE);
    });
    let first: Vec<(NodeId, Key, f64)> = (0..120u64)
        .map(|k| ((k % 3) as NodeId, 10 + k, 500_000.0))
        .collect();
    for _ in 0..30 {
        net.cycle(&first);
        for n in &net.nodes {
            assert!(n.coordinated_keys() <= cap, "{}", n.coordinated_keys());
        }
        for k in 0..120 {
            assert!(net.sum_enforced(10 + k) <= LIMIT);
        }
    }
    assert!(net.nodes.iter().all(|n| n.refused_keys() > 0));
    // The first keys go idle: they are retired early (the cap is held) and dropped, and a
    // second set of keys gets state.
    let idle: Vec<(NodeId, Key, f64)> = first.iter().map(|&(i, k, _)| (i, k, 0.0)).collect();
    for _ in 0..60 {
        net.cycle(&idle);
    }
    assert!(net.nodes.iter().all(|n| n.evicted_keys() > 0));
    assert!(
        net.nodes.iter().all(|n| n.coordinated_keys() < cap),
        "{:?}",
        net.nodes
            .iter()
            .map(Node::coordinated_keys)
            .collect::<Vec<_>>()
    );
    let second: Vec<(NodeId, Key, f64)> = (0..30u64)
        .map(|k| ((k % 3) as NodeId, 1_000 + k, 500_000.0))
        .collect();
    for _ in 0..30 {
        net.cycle(&second);
    }
    assert!((0..30).all(|k| net.nodes[(k % 3) as usize].has_state(1_000 + k)));
    for k in (0..120).map(|k| 10 + k).chain((0..30).map(|k| 1_000 + k)) {
        assert!(net.sum_enforced(k) <= LIMIT);
        assert!(net.sum_own(k) <= LIMIT);
    }
}

/// Bytes per cycle per link in a steady state with many coordinated keys, against what a
/// message holding every key costs (what every send carried before delta messages). With
/// steady demand, entries change only at the refresh: at most a quarter of the full size.
/// Prints the figures recorded in docs/BENCHMARKS.md.
#[test]
fn steady_keys_cost_a_fraction_of_full_messages() {
    let keys = 3_000u64;
    let mut net = Net::new(3, |_| {});
    let demand: Vec<(NodeId, Key, f64)> = (0..keys)
        .flat_map(|k| {
            (0..3).map(move |i| {
                let busy = (k % 3) as NodeId == i;
                (i, 5_000 + k, if busy { 700_000.0 } else { 250_000.0 })
            })
        })
        .collect();
    for _ in 0..300 {
        net.cycle(&demand);
    }
    net.log.clear();
    let cycles = 80;
    for _ in 0..cycles {
        net.cycle(&demand);
    }
    let sent: usize = net
        .log
        .iter()
        .filter(|(f, t, ..)| (*f, *t) == (0, 1))
        .map(|l| l.2)
        .sum();
    let per_cycle = sent as f64 / f64::from(cycles);
    // A message holding every key: what each send cost before.
    let full: usize = (0..keys)
        .map(|k| {
            wire::key_entry_len(&wire::KeyEntry {
                key: 5_000 + k,
                given: net.nodes[0].link_counters(5_000 + k, 1).0,
                seen: net.nodes[0].link_counters(5_000 + k, 1).1,
                indicator: 0.0,
                saturated: false,
                relay: 0.0,
                relay_hops: 0,
                idle: false,
            })
        })
        .sum();
    println!(
        "{keys} coordinated keys, steady: {per_cycle:.0} B/cycle on link 0->1 \
         (a message of every key: {full} B)"
    );
    for k in (0..keys).step_by(101) {
        assert_eq!(net.sum_own(5_000 + k), LIMIT);
    }
    assert!(per_cycle * 4.0 <= full as f64, "{per_cycle} vs {full}");
}

/// A crash with thousands of keys whose shares moved: the survivors fold their links with
/// the dead node, so every key's base deviates from the default, and the capacity audit
/// must gather and mint over all of them. A report that large goes in parts (wire
/// `Audit::part`), each within a datagram; every message fits in one (a daemon drops one
/// that does not), and the dead node's capacity comes back: Σ own = L for every key. On a
/// perfect network, and with loss, duplication and reordering (parts lost, resent, twice,
/// out of order). Keys are 64-bit hashes, as the daemon's are.
#[test]
fn a_crash_with_thousands_of_moved_keys_is_audited_in_datagrams() {
    use sluice_coord::testing::{Cluster, NetConfig, Step};
    let lossy = NetConfig {
        loss: 0.1,
        dup: 0.05,
        max_delay: CYCLE,
    };
    for (n, edges, net, keys, seed) in [
        (3, complete(3), NetConfig::perfect(), 6_000u64, 7),
        (4, complete(4), lossy, 6_000, 11),
    ] {
        let keys: Vec<Key> = (0..keys)
            .map(|k| {
                // splitmix64: well-spread 64-bit keys.
                let mut z = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            })
            .collect();
        let make = |id, links| {
            let mut c = config(n, id);
            c.links = links;
            c.gamma = 0.15;
            c.audit_every = Some(20 * CYCLE);
            c
        };
        let mut c = Cluster::new(n, &edges, make, net, seed).unwrap();
        for (i, &k) in keys.iter().enumerate() {
            let busy = (i as u32) % n;
            for node in 0..n {
                let r = if node == busy { 700_000.0 } else { 100_000.0 };
                c.apply(Step::SetDemand(node, k, r));
            }
        }
        c.apply(Step::Run(40));
        c.apply(Step::Crash(n - 1));
        // Back within lease·(1+ρ)² + 10 + (P − 1) cycles on a perfect network, P the parts
        // of the largest report (docs/PROTOCOL.md, "Liveness"): at most 14 bytes a key.
        let parts = (keys.len() * 14).div_ceil(c.node(0).unwrap().config().max_message_bytes / 2);
        let bound = (1.001f64 * 1.001 * 10.0).ceil() as u64 + 10 + parts as u64 - 1;
        let mut back = None;
        for cycle in 1..=150 {
            c.apply(Step::Run(1));
            if back.is_none() && keys.iter().all(|&k| c.sum_own(k) == LIMIT) {
                back = Some(cycle);
            }
        }
        if net == NetConfig::perfect() {
            let back = back.expect("the dead node's capacity never came back");
            assert!(
                back <= bound,
                "{n} nodes: back after {back} cycles, bound {bound}"
            );
        } else {
            // Under loss and delay some gift is in flight at most instants while shares
            // still move: Σ own = L is checked once the last ones got through.
            c.set_net(NetConfig::perfect());
            c.apply(Step::Run(3));
        }
        assert!(c.violations.is_empty(), "{n} nodes: {:?}", c.violations);
        assert_eq!(
            c.traffic.oversized, 0,
            "{n} nodes: {} messages did not fit in a datagram",
            c.traffic.oversized
        );
        let short = keys.iter().filter(|&&k| c.sum_own(k) != LIMIT).count();
        assert_eq!(
            short, 0,
            "{n} nodes: {short} keys did not get the dead node's capacity back"
        );
    }
}
