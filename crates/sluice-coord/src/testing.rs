//! A deterministic in-memory cluster for tests and simulations: seeded randomness,
//! per-message loss, duplication, reordering and delay, per-node clock rates, crashes,
//! restarts, partitions, and a scenario harness of named steps.
//!
//! It drives the real [`Node`] state machines and sends every message through the real
//! [`wire`] encoding. Invariant violations (the sum of enforced limits above `L` in a strict
//! mode) are recorded at every event, so a test can assert none happened.

use std::collections::{BTreeMap, BTreeSet};

use crate::node::{Config, Fallback, Nanos, Node};
use crate::wire::{self, Key, NodeId};

/// SplitMix64: a tiny, seedable, portable generator (no global RNG).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Undirected edges of a ring `0-1-…-(n-1)-0`, weight 1.
#[must_use]
pub fn ring(n: u32) -> Vec<(NodeId, NodeId, f64)> {
    match n {
        0 | 1 => Vec::new(),
        2 => vec![(0, 1, 1.0)],
        _ => (0..n).map(|i| (i, (i + 1) % n, 1.0)).collect(),
    }
}

/// Undirected edges of a path `0-1-…-(n-1)`, weight 1.
#[must_use]
pub fn path(n: u32) -> Vec<(NodeId, NodeId, f64)> {
    (1..n).map(|i| (i - 1, i, 1.0)).collect()
}

/// Undirected edges of the complete graph, weight 1.
#[must_use]
pub fn complete(n: u32) -> Vec<(NodeId, NodeId, f64)> {
    (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j, 1.0)))
        .collect()
}

/// A random connected graph on `n` nodes, weight 1: a random tree (each node `i > 0` linked
/// to a random earlier one) plus every other pair with probability `extra`.
#[must_use]
pub fn random_connected(n: u32, extra: f64, rng: &mut Rng) -> Vec<(NodeId, NodeId, f64)> {
    let mut edges: Vec<(NodeId, NodeId, f64)> = (1..n)
        .map(|i| (rng.below(u64::from(i)) as NodeId, i, 1.0))
        .collect();
    for i in 0..n {
        for j in i + 1..n {
            if !edges.iter().any(|&(a, b, _)| a == i && b == j) && rng.next_f64() < extra {
                edges.push((i, j, 1.0));
            }
        }
    }
    edges
}

/// Neighbours of `id` with weights.
#[must_use]
pub fn links_of(id: NodeId, edges: &[(NodeId, NodeId, f64)]) -> Vec<(NodeId, f64)> {
    let mut l: Vec<(NodeId, f64)> = edges
        .iter()
        .filter_map(|&(a, b, w)| match (a == id, b == id) {
            (true, false) => Some((b, w)),
            (false, true) => Some((a, w)),
            _ => None,
        })
        .collect();
    // The next node on a ring first.
    l.sort_by_key(|&(p, _)| (p.wrapping_sub(id).wrapping_sub(1), p));
    l
}

/// What the network does to messages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetConfig {
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub dup: f64,
    /// Largest extra delay (uniform in `[0, max_delay]`); messages overtake each other.
    pub max_delay: Nanos,
}

impl NetConfig {
    /// A perfect network (delivery within the cycle, in order).
    #[must_use]
    pub fn perfect() -> Self {
        Self {
            loss: 0.0,
            dup: 0.0,
            max_delay: 0,
        }
    }
}

/// A named step of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Add a node with this configuration (a joiner).
    AddNode(Box<Config>),
    /// Crash a node (it forgets everything, sends and enforces nothing).
    Crash(NodeId),
    /// Restart a crashed node as a new incarnation that knows the one it follows (a daemon
    /// with a state file).
    Restart(NodeId),
    /// Restart a crashed node as a much later incarnation that does not know the one it
    /// follows (a daemon without a state file: its incarnation comes from the clock).
    RestartFromClock(NodeId),
    /// Restart a crashed node as this incarnation, whatever it held before (an operator's
    /// mistake when below: a state file added after starts from the clock).
    RestartAs(NodeId, u64),
    /// Cut these nodes off from the others.
    Partition(Vec<NodeId>),
    /// Remove every partition.
    Heal,
    /// Set a node's demand for a key (rate, capacity units).
    SetDemand(NodeId, Key, f64),
    /// A node leaves gracefully.
    Leave(NodeId),
    /// Run this many cycles.
    Run(u64),
    /// Deliver again, now and in their order, every datagram this node sent since
    /// [`Cluster::record`] was turned on (an attacker on the path replaying what it
    /// captured: they authenticate, so only the protocol can refuse them).
    Replay(NodeId),
}

#[derive(Debug)]
struct Slot {
    node: Option<Node>,
    cfg: Config,
    rate: f64,
    incarnation: u64,
    demand: BTreeMap<Key, f64>,
}

#[derive(Debug)]
struct Flight {
    at: Nanos,
    seq: u64,
    from: NodeId,
    to: NodeId,
    bytes: Vec<u8>,
}

/// Traffic counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages sent.
    pub messages: u64,
    /// Encoded bytes sent.
    pub bytes: u64,
    /// Messages larger than the sender's `Config::max_message_bytes`: dropped, as a daemon
    /// drops a message that does not fit in one datagram.
    pub oversized: u64,
}

/// A cluster on a simulated network. Real time advances in steps of one cycle.
#[derive(Debug)]
pub struct Cluster {
    slots: BTreeMap<NodeId, Slot>,
    flights: Vec<Flight>,
    seq: u64,
    now: Nanos,
    cycle: Nanos,
    limit: u64,
    net: NetConfig,
    rng: Rng,
    cut: BTreeSet<NodeId>,
    keys: BTreeSet<Key>,
    /// Worst `Σ enforced − L` seen (per key), at any event.
    pub max_over: i128,
    /// Descriptions of strict-invariant violations.
    pub violations: Vec<String>,
    /// Traffic since creation.
    pub traffic: Traffic,
    /// The steps applied, in order.
    pub log: Vec<String>,
    /// Whether datagrams sent are recorded (see [`Step::Replay`]).
    recording: bool,
    /// Datagrams sent while recording, `(from, to, bytes)`.
    recorded: Vec<(NodeId, NodeId, Vec<u8>)>,
}

impl Cluster {
    /// A cluster of `n` nodes on `edges`, each configured by `make(id, links)`.
    ///
    /// # Panics
    /// If a configuration is refused (tests build valid ones).
    pub fn new(
        n: u32,
        edges: &[(NodeId, NodeId, f64)],
        make: impl Fn(NodeId, Vec<(NodeId, f64)>) -> Config,
        net: NetConfig,
        seed: u64,
    ) -> Result<Self, crate::stability::ConfigError> {
        let mut slots = BTreeMap::new();
        let mut cycle = 1;
        let mut limit = 0;
        for id in 0..n {
            let cfg = make(id, links_of(id, edges));
            cycle = cfg.cycle;
            limit = cfg.limit;
            let node = Node::new(cfg.clone(), 0)?;
            slots.insert(
                id,
                Slot {
                    node: Some(node),
                    cfg,
                    rate: 1.0,
                    incarnation: 1,
                    demand: BTreeMap::new(),
                },
            );
        }
        Ok(Self {
            slots,
            flights: Vec::new(),
            seq: 0,
            now: 0,
            cycle,
            limit,
            net,
            rng: Rng::new(seed),
            cut: BTreeSet::new(),
            keys: BTreeSet::new(),
            max_over: i128::MIN,
            violations: Vec::new(),
            traffic: Traffic::default(),
            log: Vec::new(),
            recording: false,
            recorded: Vec::new(),
        })
    }

    /// Starts (or stops) recording every datagram sent, for [`Step::Replay`]; what was
    /// recorded stays.
    pub fn record(&mut self, on: bool) {
        self.recording = on;
    }

    /// Sets node `id`'s clock rate (local time = real time × rate).
    pub fn set_clock_rate(&mut self, id: NodeId, rate: f64) {
        if let Some(s) = self.slots.get_mut(&id) {
            s.rate = rate;
        }
    }

    /// Changes what the network does from now on (messages in flight keep their fate).
    pub fn set_net(&mut self, net: NetConfig) {
        self.net = net;
    }

    /// Real time now.
    #[must_use]
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// The cycle length.
    #[must_use]
    pub fn cycle(&self) -> Nanos {
        self.cycle
    }

    fn local(&self, id: NodeId) -> Nanos {
        self.slots
            .get(&id)
            .map_or(self.now, |s| (self.now as f64 * s.rate) as Nanos)
    }

    /// A running node.
    #[must_use]
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.slots.get(&id).and_then(|s| s.node.as_ref())
    }

    /// A running node, to change at run time (e.g. [`Node::set_gamma`]), with its local time.
    pub fn node_mut(&mut self, id: NodeId) -> Option<(&mut Node, Nanos)> {
        let now = self.local(id);
        self.slots
            .get_mut(&id)
            .and_then(|s| s.node.as_mut())
            .map(|n| (n, now))
    }

    /// Ids of running nodes.
    #[must_use]
    pub fn alive(&self) -> Vec<NodeId> {
        self.slots
            .iter()
            .filter(|(_, s)| s.node.is_some())
            .map(|(&i, _)| i)
            .collect()
    }

    /// Σ enforced limits of `key` over running nodes, each at its own clock.
    #[must_use]
    pub fn sum_enforced(&self, key: Key) -> u64 {
        self.slots
            .iter()
            .filter_map(|(&id, s)| s.node.as_ref().map(|n| n.enforced(key, self.local(id))))
            .sum()
    }

    /// Σ shares (`own`) of `key` over running nodes.
    #[must_use]
    pub fn sum_own(&self, key: Key) -> u64 {
        self.slots
            .values()
            .filter_map(|s| s.node.as_ref().map(|n| n.own(key)))
            .sum()
    }

    /// Indicators of `key` at running nodes.
    #[must_use]
    pub fn indicators(&self, key: Key) -> Vec<f64> {
        self.slots
            .values()
            .filter_map(|s| s.node.as_ref().map(|n| n.indicator(key)))
            .collect()
    }

    /// Whether any message is in flight.
    #[must_use]
    pub fn quiet(&self) -> bool {
        self.flights.is_empty()
    }

    fn strict(&self) -> bool {
        self.slots
            .values()
            .all(|s| s.cfg.fallback != Fallback::LastShare)
    }

    fn check(&mut self, what: &str) {
        let keys: Vec<Key> = self.keys.iter().copied().collect();
        for k in keys {
            let sum = self.sum_enforced(k);
            let over = i128::from(sum) - i128::from(self.limit);
            self.max_over = self.max_over.max(over);
            if over > 0 && self.strict() && self.violations.len() < 20 {
                self.violations.push(format!(
                    "t={} after {what}: key {k} sum enforced {sum} > L {}",
                    self.now, self.limit
                ));
            }
        }
    }

    /// Applies one step.
    pub fn apply(&mut self, step: Step) {
        self.log.push(format!("{step:?}"));
        match step {
            Step::AddNode(cfg) => {
                let cfg = *cfg;
                let id = cfg.id;
                let local = self.local(id);
                if let Ok(node) = Node::new(cfg.clone(), local) {
                    self.slots.insert(
                        id,
                        Slot {
                            node: Some(node),
                            incarnation: cfg.incarnation,
                            cfg,
                            rate: 1.0,
                            demand: BTreeMap::new(),
                        },
                    );
                }
            }
            Step::Crash(id) => {
                if let Some(s) = self.slots.get_mut(&id) {
                    // A real node persists its incarnation (or uses a boot timestamp).
                    if let Some(n) = s.node.take() {
                        s.incarnation = s.incarnation.max(n.incarnation());
                    }
                }
                self.flights.retain(|f| f.to != id);
            }
            Step::Restart(id) | Step::RestartFromClock(id) | Step::RestartAs(id, _) => {
                let local = self.local(id);
                if let Some(s) = self.slots.get_mut(&id)
                    && s.node.is_none()
                {
                    // A restart that persisted its incarnation takes the next one; one from
                    // the clock jumps far ahead.
                    s.incarnation = match step {
                        Step::RestartAs(_, inc) => inc,
                        Step::RestartFromClock(_) => s.incarnation + 1_000_000,
                        _ => s.incarnation + 1,
                    };
                    let mut cfg = s.cfg.clone();
                    cfg.incarnation = s.incarnation;
                    s.node = Node::new(cfg, local).ok();
                    if let Some(n) = s.node.as_mut() {
                        for (&k, &r) in &s.demand {
                            n.set_demand(local, k, r);
                        }
                    }
                }
            }
            Step::Partition(ids) => self.cut = ids.into_iter().collect(),
            Step::Heal => self.cut.clear(),
            Step::SetDemand(id, key, rate) => {
                self.keys.insert(key);
                let local = self.local(id);
                if let Some(s) = self.slots.get_mut(&id) {
                    s.demand.insert(key, rate);
                    if let Some(n) = s.node.as_mut() {
                        n.set_demand(local, key, rate);
                    }
                }
            }
            Step::Leave(id) => {
                let local = self.local(id);
                if let Some(n) = self.slots.get_mut(&id).and_then(|s| s.node.as_mut()) {
                    n.leave(local);
                }
            }
            Step::Run(k) => {
                for _ in 0..k {
                    self.cycle_once();
                }
            }
            Step::Replay(id) => {
                let copies: Vec<(NodeId, Vec<u8>)> = self
                    .recorded
                    .iter()
                    .filter(|r| r.0 == id)
                    .map(|r| (r.1, r.2.clone()))
                    .collect();
                for (to, bytes) in copies {
                    self.seq += 1;
                    self.flights.push(Flight {
                        at: self.now,
                        seq: self.seq,
                        from: id,
                        to,
                        bytes,
                    });
                }
                self.deliver_due();
            }
        }
        self.check("step");
    }

    fn blocked(&self, a: NodeId, b: NodeId) -> bool {
        self.cut.contains(&a) != self.cut.contains(&b)
    }

    fn drain(&mut self, id: NodeId) {
        let local = self.local(id);
        let Some(ready) = self
            .slots
            .get_mut(&id)
            .and_then(|s| s.node.as_mut())
            .map(|n| n.ready(local))
        else {
            return;
        };
        let most = self
            .slots
            .get(&id)
            .map_or(usize::MAX, |s| s.cfg.max_message_bytes);
        for out in ready.messages {
            let bytes = wire::encode(&out.message);
            self.traffic.messages += 1;
            self.traffic.bytes += bytes.len() as u64;
            if bytes.len() > most {
                self.traffic.oversized += 1;
                continue;
            }
            if self.recording {
                self.recorded.push((id, out.to, bytes.clone()));
            }
            if self.rng.next_f64() < self.net.loss {
                continue;
            }
            let copies = if self.rng.next_f64() < self.net.dup {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let delay = if self.net.max_delay > 0 {
                    self.rng.below(self.net.max_delay + 1)
                } else {
                    0
                };
                self.seq += 1;
                self.flights.push(Flight {
                    at: self.now + delay,
                    seq: self.seq,
                    from: id,
                    to: out.to,
                    bytes: bytes.clone(),
                });
            }
        }
    }

    fn deliver_due(&mut self) {
        // A guard against message storms (a protocol bug would otherwise hang a test).
        for _ in 0..1_000_000 {
            let due = self
                .flights
                .iter()
                .enumerate()
                .filter(|(_, f)| f.at <= self.now)
                .min_by_key(|(_, f)| (f.at, f.seq))
                .map(|(i, _)| i);
            let Some(i) = due else { break };
            let f = self.flights.swap_remove(i);
            if self.blocked(f.from, f.to) {
                continue;
            }
            let local = self.local(f.to);
            let mut rng = self.rng.clone();
            let Some(node) = self.slots.get_mut(&f.to).and_then(|s| s.node.as_mut()) else {
                continue;
            };
            match wire::decode(&f.bytes) {
                Ok(msg) => node.handle_message(local, f.from, msg, &mut || rng.next_f64()),
                Err(e) => self.violations.push(format!("decode error {e}")),
            }
            self.rng = rng;
            self.drain(f.to);
            self.check("delivery");
        }
    }

    /// One cycle: deliver what is due, tick every running node, re-assert demands.
    fn cycle_once(&mut self) {
        self.now += self.cycle;
        self.deliver_due();
        let ids = self.alive();
        for id in ids {
            let local = self.local(id);
            let mut rng = self.rng.clone();
            if let Some(s) = self.slots.get_mut(&id)
                && let Some(n) = s.node.as_mut()
            {
                for (&k, &r) in &s.demand {
                    n.set_demand(local, k, r);
                }
                n.tick(local, &mut || rng.next_f64());
            }
            self.rng = rng;
            self.drain(id);
            self.check("tick");
        }
        // Messages without delay arrive within the cycle.
        self.deliver_due();
    }

    /// Runs until no message is in flight and nothing changes (at most `max` cycles); for
    /// checks "once messages get through".
    pub fn settle(&mut self, max: u64) {
        for _ in 0..max {
            self.cycle_once();
        }
    }
}
