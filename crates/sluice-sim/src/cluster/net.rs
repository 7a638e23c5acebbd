//! The simulated network of `sluice sim cluster`'s Sluice strategy, built for a thousand
//! nodes and more.
//!
//! It is event for event the harness of [`sluice_coord::testing::Cluster`] (the same
//! [`Node`] state machines, the same wire encoding, the same seeded draws in the same order,
//! the same delivery order by `(arrival, send sequence)`), so a seed gives the same run,
//! byte for byte. Two things differ, both about cost, not about what happens:
//!
//! * Messages in flight are a FIFO queue when the network has no delay (every message then
//!   arrives at the instant it is sent, so sending order is delivery order), else a binary
//!   heap on `(arrival, sequence)`; the harness scans a vector for its minimum at every
//!   delivery (O(F) per message, F ≈ 8,000 per cycle at 1,000 nodes of degree 8).
//! * The conservation check (Σ enforced − L after every event, seed 003 §IV) is kept as a
//!   running sum. At one instant an event changes only the node it happens at, and
//!   [`Node::enforced`] is a pure function of a node's state and the time, so the sum is
//!   updated by that node's change alone; it is recomputed in full whenever time advances.
//!   The harness re-sums all N nodes after each event, which made a 1,000-node cycle
//!   (≈ 8,000 events) cost ≈ 8·10⁶ calls of `Node::enforced`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use sluice_coord::node::{Config, Nanos, Node};
use sluice_coord::stability::ConfigError;
use sluice_coord::testing::{NetConfig, Rng, links_of};
use sluice_coord::wire::{self, Key, Message, NodeId};

/// A message on its way: ordered by arrival time, then by when it was sent.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Flight {
    at: Nanos,
    seq: u64,
    from: NodeId,
    to: NodeId,
    bytes: Payload,
}

/// A message's encoding: its own buffer, or a range of the FIFO's arena.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Payload {
    Owned(Vec<u8>),
    Arena(usize, usize),
}

/// Messages in flight, popped in `(arrival, sequence)` order.
#[derive(Debug)]
enum Flights {
    /// No delay: arrival = send time, and time only grows, so the order is FIFO. The
    /// encodings are appended to one arena, emptied whenever the queue is: no buffer per
    /// message (≈ 8,000 a cycle at 1,000 nodes), and delivery reads it front to back.
    Fifo(VecDeque<Flight>, Vec<u8>),
    /// Random delays: messages overtake each other.
    Heap(BinaryHeap<Reverse<Flight>>),
}

impl Flights {
    /// Encodes `m` where this queue keeps it; returns it and its length in bytes.
    fn encode(&mut self, m: &Message) -> (Payload, usize) {
        match self {
            Self::Fifo(_, arena) => {
                let start = arena.len();
                wire::encode_into(m, arena);
                (Payload::Arena(start, arena.len()), arena.len() - start)
            }
            Self::Heap(_) => {
                let bytes = wire::encode(m);
                let len = bytes.len();
                (Payload::Owned(bytes), len)
            }
        }
    }

    /// The bytes of a payload of this queue.
    fn bytes<'a>(&'a self, p: &'a Payload) -> &'a [u8] {
        match (self, p) {
            (_, Payload::Owned(b)) => b,
            (Self::Fifo(_, arena), &Payload::Arena(s, e)) => arena.get(s..e).unwrap_or(&[]),
            (Self::Heap(_), Payload::Arena(..)) => &[],
        }
    }

    fn push(&mut self, f: Flight) {
        match self {
            Self::Fifo(q, _) => q.push_back(f),
            Self::Heap(h) => h.push(Reverse(f)),
        }
    }

    /// The next message if it has arrived by `now`.
    fn pop_due(&mut self, now: Nanos) -> Option<Flight> {
        match self {
            Self::Fifo(q, arena) => {
                // Nothing in flight refers to the arena (the last popped message has been
                // handled by now): start it again.
                if q.is_empty() {
                    arena.clear();
                }
                if q.front().is_none_or(|f| f.at > now) {
                    return None;
                }
                q.pop_front()
            }
            Self::Heap(h) => {
                if h.peek().is_none_or(|f| f.0.at > now) {
                    return None;
                }
                h.pop().map(|Reverse(f)| f)
            }
        }
    }

    fn drop_to(&mut self, id: NodeId) {
        match self {
            Self::Fifo(q, _) => q.retain(|f| f.to != id),
            Self::Heap(h) => h.retain(|f| f.0.to != id),
        }
    }
}

#[derive(Debug)]
struct Slot {
    node: Option<Node>,
    cfg: Config,
    incarnation: u64,
    /// The demand of the one key, re-asserted every cycle as the harness does.
    demand: Option<f64>,
    /// `enforced(key, now)` as last counted in `sum`.
    enforced: u64,
}

/// Nodes on a seeded network; real time advances one cycle per [`Net::run_cycle`].
#[derive(Debug)]
pub(crate) struct Net {
    slots: Vec<Slot>,
    flights: Flights,
    seq: u64,
    now: Nanos,
    cycle: Nanos,
    limit: u64,
    net: NetConfig,
    rng: Rng,
    cut: Vec<bool>,
    /// The key the demand is set for; the check starts once it is known.
    key: Option<Key>,
    /// Σ `enforced` over the slots (crashed nodes count 0).
    sum: i128,
    /// Worst `Σ enforced − L` seen at any event.
    pub(crate) max_over: i128,
    /// Messages sent.
    pub(crate) messages: u64,
    /// Encoded bytes sent.
    pub(crate) bytes: u64,
    /// The message being delivered: one buffer for the whole run (a thousand nodes deliver
    /// ≈ 8,000 messages a cycle; decoding each into a fresh one was a visible share).
    inbox: Message,
}

impl Net {
    /// `n` nodes on `edges`, each configured by `make(id, links)`.
    pub(crate) fn new(
        n: u32,
        edges: &[(NodeId, NodeId, f64)],
        make: impl Fn(NodeId, Vec<(NodeId, f64)>) -> Config,
        net: NetConfig,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        // Links of every node in one pass over the edges (the harness scans every edge for
        // every node); `links_of` then orders them as the harness does.
        let mut incident: Vec<Vec<(NodeId, NodeId, f64)>> = vec![Vec::new(); n as usize];
        for &(a, b, w) in edges {
            for end in [a, b] {
                if let Some(v) = incident.get_mut(end as usize) {
                    v.push((a, b, w));
                }
            }
        }
        let (mut cycle, mut limit) = (1, 0);
        let mut slots = Vec::with_capacity(n as usize);
        for (id, own_edges) in (0..n).zip(&incident) {
            let cfg = make(id, links_of(id, own_edges));
            cycle = cfg.cycle;
            limit = cfg.limit;
            let node = Node::new(cfg.clone(), 0)?;
            slots.push(Slot {
                node: Some(node),
                cfg,
                incarnation: 1,
                demand: None,
                enforced: 0,
            });
        }
        Ok(Self {
            slots,
            flights: if net.max_delay == 0 {
                Flights::Fifo(VecDeque::new(), Vec::new())
            } else {
                Flights::Heap(BinaryHeap::new())
            },
            seq: 0,
            now: 0,
            cycle,
            limit,
            net,
            rng: Rng::new(seed),
            cut: vec![false; n as usize],
            key: None,
            sum: 0,
            max_over: i128::MIN,
            messages: 0,
            bytes: 0,
            inbox: Message::default(),
        })
    }

    /// Real time now.
    pub(crate) fn now(&self) -> Nanos {
        self.now
    }

    /// A running node.
    pub(crate) fn node(&self, id: NodeId) -> Option<&Node> {
        self.slots.get(id as usize).and_then(|s| s.node.as_ref())
    }

    /// Indicators of `key` at the running nodes, in id order.
    pub(crate) fn indicators(&self, key: Key) -> Vec<f64> {
        self.slots
            .iter()
            .filter_map(|s| s.node.as_ref().map(|n| n.indicator(key)))
            .collect()
    }

    /// Re-counts node `id`'s enforced limit after an event at it, and checks the sum.
    fn touched(&mut self, id: NodeId) {
        let Some(key) = self.key else { return };
        let now = self.now;
        if let Some(s) = self.slots.get_mut(id as usize) {
            let e = s.node.as_ref().map_or(0, |n| n.enforced(key, now));
            self.sum += i128::from(e) - i128::from(s.enforced);
            s.enforced = e;
        }
        self.check();
    }

    /// Re-counts every node (time moved: leases may have expired).
    fn recount(&mut self) {
        let Some(key) = self.key else { return };
        let now = self.now;
        let mut sum = 0i128;
        for s in &mut self.slots {
            s.enforced = s.node.as_ref().map_or(0, |n| n.enforced(key, now));
            sum += i128::from(s.enforced);
        }
        self.sum = sum;
    }

    fn check(&mut self) {
        if self.key.is_some() {
            self.max_over = self.max_over.max(self.sum - i128::from(self.limit));
        }
    }

    /// Node `id` crashes: it forgets everything, and messages to it are lost.
    pub(crate) fn crash(&mut self, id: NodeId) {
        if let Some(s) = self.slots.get_mut(id as usize)
            && let Some(n) = s.node.take()
        {
            // A real node persists its incarnation (or uses a boot timestamp).
            s.incarnation = s.incarnation.max(n.incarnation());
        }
        self.flights.drop_to(id);
        self.touched(id);
    }

    /// A crashed node `id` comes back as a new incarnation.
    pub(crate) fn restart(&mut self, id: NodeId) {
        let now = self.now;
        if let Some(s) = self.slots.get_mut(id as usize)
            && s.node.is_none()
        {
            s.incarnation += 1;
            let mut cfg = s.cfg.clone();
            cfg.incarnation = s.incarnation;
            s.node = Node::new(cfg, now).ok();
            if let (Some(n), Some(key), Some(r)) = (s.node.as_mut(), self.key, s.demand) {
                n.set_demand(now, key, r);
            }
        }
        self.touched(id);
    }

    /// Cuts `ids` off from the other nodes (replacing any earlier cut).
    pub(crate) fn partition(&mut self, ids: &[NodeId]) {
        self.cut.iter_mut().for_each(|c| *c = false);
        for &id in ids {
            if let Some(c) = self.cut.get_mut(id as usize) {
                *c = true;
            }
        }
        self.check();
    }

    /// Removes the cut.
    pub(crate) fn heal(&mut self) {
        self.cut.iter_mut().for_each(|c| *c = false);
        self.check();
    }

    /// Sets node `id`'s demand for `key` (one key per network).
    pub(crate) fn set_demand(&mut self, id: NodeId, key: Key, rate: f64) {
        if self.key.is_none() {
            self.key = Some(key);
            self.recount();
        }
        let now = self.now;
        if let Some(s) = self.slots.get_mut(id as usize) {
            s.demand = Some(rate);
            if let Some(n) = s.node.as_mut() {
                n.set_demand(now, key, rate);
            }
        }
        self.touched(id);
    }

    fn blocked(&self, a: NodeId, b: NodeId) -> bool {
        let cut = |id: NodeId| self.cut.get(id as usize).copied().unwrap_or(false);
        cut(a) != cut(b)
    }

    /// Sends what node `id` has to send (the draws: loss, then duplication, then delay).
    fn drain(&mut self, id: NodeId) {
        let now = self.now;
        let Some(ready) = self
            .slots
            .get_mut(id as usize)
            .and_then(|s| s.node.as_mut())
            .map(|n| n.ready(now))
        else {
            return;
        };
        // By reference: a message is a few hundred bytes, only its encoding travels.
        for out in &ready.messages {
            let (mut bytes, len) = self.flights.encode(&out.message);
            self.messages += 1;
            self.bytes += len as u64;
            if self.rng.next_f64() < self.net.loss {
                continue;
            }
            let copies = if self.rng.next_f64() < self.net.dup {
                2
            } else {
                1
            };
            for copy in 1..=copies {
                let delay = if self.net.max_delay > 0 {
                    self.rng.below(self.net.max_delay + 1)
                } else {
                    0
                };
                self.seq += 1;
                // The last copy takes the buffer itself.
                let bytes = if copy == copies {
                    std::mem::replace(&mut bytes, Payload::Arena(0, 0))
                } else {
                    bytes.clone()
                };
                self.flights.push(Flight {
                    at: now + delay,
                    seq: self.seq,
                    from: id,
                    to: out.to,
                    bytes,
                });
            }
        }
    }

    /// Delivers every message due by now, earliest `(arrival, sequence)` first, including
    /// the answers they cause.
    fn deliver_due(&mut self) {
        // A guard against message storms (a protocol bug would otherwise hang a run).
        for _ in 0..1_000_000 {
            let Some(f) = self.flights.pop_due(self.now) else {
                break;
            };
            if self.blocked(f.from, f.to) {
                continue;
            }
            let now = self.now;
            let rng = &mut self.rng;
            let Some(node) = self
                .slots
                .get_mut(f.to as usize)
                .and_then(|s| s.node.as_mut())
            else {
                continue;
            };
            // A message the wire cannot decode is dropped, as a real node drops it.
            if wire::decode_into(self.flights.bytes(&f.bytes), &mut self.inbox).is_ok() {
                node.handle_message_in(now, f.from, &mut self.inbox, &mut || rng.next_f64());
            }
            self.drain(f.to);
            self.touched(f.to);
        }
    }

    /// One cycle: deliver what is due, tick every running node (demand re-asserted first),
    /// deliver what arrives within the cycle.
    pub(crate) fn run_cycle(&mut self) {
        self.now += self.cycle;
        self.recount();
        self.deliver_due();
        for id in 0..self.slots.len() as NodeId {
            let now = self.now;
            let key = self.key;
            let rng = &mut self.rng;
            let Some(s) = self.slots.get_mut(id as usize) else {
                continue;
            };
            let Some(n) = s.node.as_mut() else { continue };
            if let (Some(key), Some(r)) = (key, s.demand) {
                n.set_demand(now, key, r);
            }
            n.tick(now, &mut || rng.next_f64());
            self.drain(id);
            self.touched(id);
        }
        // Messages without delay arrive within the cycle.
        self.deliver_due();
        self.check();
    }
}

#[cfg(test)]
mod tests {
    //! The claim of the module docs, checked: the same scenarios through this network and
    //! through `sluice_coord::testing::Cluster` give the same nodes after every cycle.
    #![allow(clippy::unwrap_used)]

    use sluice_coord::pacing::Strategy;
    use sluice_coord::testing::{Cluster, Step, complete, random_connected, ring};

    use super::*;

    const KEY: Key = 1;
    const CYCLE: Nanos = 100_000_000;

    /// A scenario: graph, network, pacing, and when node `crash.1` crashes (cycle `crash.0`)
    /// and restarts (`crash.2`), and which nodes are cut off over `[cut.0, cut.1)`.
    struct Case {
        name: &'static str,
        n: u32,
        edges: Vec<(NodeId, NodeId, f64)>,
        net: NetConfig,
        pacing: Option<Strategy>,
        relay: bool,
        cycles: u64,
        seed: u64,
        crash: Option<(u64, NodeId, u64)>,
        cut: Option<(u64, u64, Vec<NodeId>)>,
    }

    /// Every node as both harnesses see it after a cycle: incarnation, enforced limit, own
    /// share, indicator and demand estimate (as bits), or `None` while crashed.
    type NodeView = Option<(u64, u64, u64, u64, u64)>;

    /// What is compared after every cycle: time, every node, messages, bytes, worst excess.
    type Snapshot = (Nanos, Vec<NodeView>, u64, u64, i128);

    fn view(n: Option<&Node>, now: Nanos) -> NodeView {
        n.map(|n| {
            (
                n.incarnation(),
                n.enforced(KEY, now),
                n.own(KEY),
                n.indicator(KEY).to_bits(),
                n.demand(KEY).to_bits(),
            )
        })
    }

    /// Demand of node `id` in cycle `k`: uneven, some nodes above the fair share, changing
    /// every 10 cycles, a total wandering around the limit.
    fn demand(id: NodeId, k: u64) -> f64 {
        let phase = (u64::from(id) * 7 + k / 10) % 5;
        400.0 + 350.0 * phase as f64 + f64::from(id) * 0.25
    }

    fn make(c: &Case) -> impl Fn(NodeId, Vec<(NodeId, f64)>) -> Config + '_ {
        move |id, links| {
            let mut cfg = Config::new(id, (0..c.n).collect(), links, 10_000);
            if c.crash.is_none() {
                cfg.leases = sluice_coord::node::Leases::Off;
            }
            cfg.cycle = CYCLE;
            cfg.pacing = c.pacing;
            cfg.relay = c.relay;
            cfg
        }
    }

    /// The scenario's steps before cycle `k` (crash, restart, heal, cut: the order of
    /// `cluster::Run::sluice`), then the demands that changed.
    fn steps(c: &Case, k: u64) -> Vec<Step> {
        let mut v = Vec::new();
        if let Some((at, id, back)) = c.crash {
            if k == at {
                v.push(Step::Crash(id));
            }
            if k == back {
                v.push(Step::Restart(id));
            }
        }
        if let Some((from, to, ids)) = &c.cut {
            if k == *to {
                v.push(Step::Heal);
            }
            if k == *from {
                v.push(Step::Partition(ids.clone()));
            }
        }
        for id in 0..c.n {
            let r = demand(id, k);
            if k == 0 || r.to_bits() != demand(id, k - 1).to_bits() {
                v.push(Step::SetDemand(id, KEY, r));
            }
        }
        v
    }

    fn through_harness(c: &Case) -> Vec<Snapshot> {
        let mut h = Cluster::new(c.n, &c.edges, make(c), c.net, c.seed).unwrap();
        (0..c.cycles)
            .map(|k| {
                for s in steps(c, k) {
                    h.apply(s);
                }
                h.apply(Step::Run(1));
                let now = h.now();
                let nodes = (0..c.n).map(|id| view(h.node(id), now)).collect();
                (now, nodes, h.traffic.messages, h.traffic.bytes, h.max_over)
            })
            .collect()
    }

    fn through_net(c: &Case) -> Vec<Snapshot> {
        let mut net = Net::new(c.n, &c.edges, make(c), c.net, c.seed).unwrap();
        (0..c.cycles)
            .map(|k| {
                for s in steps(c, k) {
                    match s {
                        Step::Crash(id) => net.crash(id),
                        Step::Restart(id) => net.restart(id),
                        Step::Heal => net.heal(),
                        Step::Partition(ids) => net.partition(&ids),
                        Step::SetDemand(id, key, r) => net.set_demand(id, key, r),
                        other => unreachable!("{other:?}"),
                    }
                }
                net.run_cycle();
                let now = net.now();
                let nodes = (0..c.n).map(|id| view(net.node(id), now)).collect();
                (now, nodes, net.messages, net.bytes, net.max_over)
            })
            .collect()
    }

    fn cases() -> Vec<Case> {
        let lossy = NetConfig {
            loss: 0.2,
            dup: 0.1,
            max_delay: 0,
        };
        // Delays up to 1.5 cycles: messages overtake each other and cross cycle ends.
        let delayed = NetConfig {
            loss: 0.1,
            dup: 0.05,
            max_delay: 150_000_000,
        };
        vec![
            Case {
                name: "ring, perfect network, paced",
                n: 8,
                edges: ring(8),
                net: NetConfig::perfect(),
                pacing: Some(Strategy::Simple { c: 2 }),
                relay: true,
                cycles: 120,
                seed: 1,
                crash: None,
                cut: None,
            },
            Case {
                name: "ring, loss and duplication, crash and restart, partition",
                n: 8,
                edges: ring(8),
                net: lossy,
                pacing: Some(Strategy::Simple { c: 2 }),
                relay: true,
                cycles: 200,
                seed: 2,
                crash: Some((30, 3, 70)),
                cut: Some((100, 140, vec![0, 1, 2])),
            },
            Case {
                name: "random graph, delay, loss, duplication, crash, partition, randomized",
                n: 10,
                edges: random_connected(10, 0.3, &mut Rng::new(9)),
                net: delayed,
                pacing: Some(Strategy::Randomized { a: 2, c: 4 }),
                relay: true,
                cycles: 200,
                seed: 3,
                crash: Some((20, 2, 50)),
                cut: Some((80, 120, vec![5, 6])),
            },
            Case {
                name: "complete graph, delay, no pacing, no relay, crash without restart",
                n: 6,
                edges: complete(6),
                net: NetConfig {
                    loss: 0.05,
                    dup: 0.0,
                    max_delay: 30_000_000,
                },
                pacing: None,
                relay: false,
                cycles: 150,
                seed: 4,
                crash: Some((40, 0, u64::MAX)),
                cut: Some((60, 90, vec![4])),
            },
        ]
    }

    #[test]
    fn every_cycle_is_the_harness_cycle() {
        for c in cases() {
            let (h, n) = (through_harness(&c), through_net(&c));
            assert_eq!(h.len(), n.len());
            for (k, (a, b)) in h.iter().zip(&n).enumerate() {
                assert_eq!(a, b, "{}: cycle {k} differs (harness, then net)", c.name);
            }
            // The scenarios exercise what they claim: traffic, a crash, the invariant.
            let last = &n[n.len() - 1];
            assert!(last.2 > 0 && last.3 > last.2, "{}: no traffic", c.name);
            assert!(
                last.4 <= 0,
                "{}: Σ enforced exceeded L by {}",
                c.name,
                last.4
            );
            if let Some((at, id, _)) = c.crash {
                assert!(n[at as usize].1[id as usize].is_none(), "{}", c.name);
            }
        }
    }
}
