//! The bridge between the decision engine (many threads, nanoseconds per call) and the
//! cluster driver (one task, once per tick): this node's share of every `coordination:
//! cluster` key, and the hits the engine saw since the driver last looked.
//!
//! Shares are in *capacity units*: every key's global limit is [`SCALE`] units, whatever its
//! rule's rate, so one `sluice-coord` node (one global `L`) divides every rule's limit. A node
//! holding `u` units of a rule of `N` requests per unit enforces `⌊N·u/SCALE⌋` per unit; the
//! floors never add up to more than `N` because the units never add up to more than `SCALE`
//! (seed 003 §IV conservation, proven in `sluice-coord`).
//!
//! **Windowed algorithms.** Σ units ≤ SCALE holds at every instant, but a fixed window, a
//! sliding window or a sliding log counts a node's admissions over a whole window: if shares
//! move within a window, the node that gave capacity has already used it there and the node
//! that got it uses it again (two nodes at 500 of 1,000 each admit 500; the shares move to
//! 300/700; the second admits 200 more: 1,200 in the window). So for those algorithms a node
//! enforces the *smallest* share it held over the last `period` of the rule
//! ([`Shares::on_rule_hit`] with `windowed`, as the engine calls it for those algorithms):
//! a lower share applies at once, a higher one after a full window. For a node's last
//! admission at `t` in a window starting at `w` (`t − period < w ≤ t`) its count is at most
//! its share at `w`, and those add up to at most the limit. The bucket algorithms meter a
//! rate, so they take the current share.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::HashMap;
use parking_lot::{Mutex, RwLock};
use sluice_limits::Nanos;

/// Capacity units of every key's global limit (2²⁰: a millionth of the limit, and a rule of
/// up to 2⁴³ requests per unit still multiplies without overflow in `u128`).
pub const SCALE: u64 = 1 << 20;

const SHARDS: usize = 16;

/// This node's share of one key, and its demand since the driver's last drain.
#[derive(Debug)]
pub struct KeyShare {
    /// Capacity units this node enforces.
    units: AtomicU64,
    /// The smallest `units` in force over the last `period` (windowed algorithms).
    units_windowed: AtomicU64,
    /// `(since, units)` steps covering the last `period`, oldest first; the driver's only.
    history: Mutex<VecDeque<(Nanos, u64)>>,
    /// Hits seen since the last drain (admitted or not: demand, not throughput).
    hits: AtomicU64,
    /// Whether a request was refused since the last drain.
    refused: std::sync::atomic::AtomicBool,
    /// The rule's requests per unit and unit (to turn hits into capacity units).
    count: AtomicU64,
    period: AtomicU64,
    /// Whether the driver has set `units` (else the node's default applies).
    known: std::sync::atomic::AtomicBool,
    /// When the key was first hit here ([`Shares::clock`], 0: not yet; a peer's message may
    /// create the entry long before): its first demand is measured from then, not from the
    /// driver's previous tick.
    first_hit: AtomicU64,
    /// The rule that decided it here first, `(domain, descriptor path)`, for operators
    /// (`/metrics`, `/v1/cluster`); unset for a key only peers have told this node about.
    rule: std::sync::OnceLock<(Box<str>, Box<str>)>,
}

/// The hits of one key since the previous drain, with its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// The cluster key.
    pub key: u64,
    /// Hits since the previous drain.
    pub hits: u64,
    /// The rule's requests per unit.
    pub count: u64,
    /// The rule's unit, nanoseconds.
    pub period: Nanos,
    /// A request on it was refused since the previous drain.
    pub refused: bool,
    /// When the key was first hit here ([`Shares::clock`]; 0: never).
    pub first_hit: u64,
}

/// Shares and demand of every cluster key on this node. See the module documentation.
#[derive(Debug)]
pub struct Shares {
    shards: Vec<RwLock<HashMap<u64, Arc<KeyShare>>>>,
    /// Where [`Shares::clock`] counts from: the runtime's clock, as the driver's (a simulated
    /// one in the partition tests).
    origin: tokio::time::Instant,
    /// Units of a key the driver has not set yet (the node's default share: `SCALE/N` at
    /// start, its fallback when its lease has expired).
    default_units: AtomicU64,
    /// The lease on shared capacity, checked at every decision: see [`LeaseGate`].
    gate: LeaseGate,
}

/// The lease on shared capacity as the deciding threads see it. The driver sets the units
/// of the lease it holds and arms a timer at its end, but a process that was frozen
/// (SIGSTOP, a stalled VM) runs the requests that queued meanwhile before any timer: each
/// decision therefore reads the clock and, past the lease's end, enforces at most the
/// fallback (`min(units, fallback)`), whatever the driver last wrote.
#[derive(Debug)]
struct LeaseGate {
    /// The driver's clock origin (its `now` is nanoseconds since it, plus one).
    origin: std::sync::OnceLock<tokio::time::Instant>,
    /// The first instant (driver clock) at which the lease reads expired; `u64::MAX` while
    /// no lease applies (no cluster, or the `last-share` fallback).
    until: AtomicU64,
    /// Units a node enforces per key once its lease has expired (its reservation).
    fallback: AtomicU64,
}

impl Shares {
    /// No key yet; keys start at `default_units`.
    #[must_use]
    pub fn new(default_units: u64) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            default_units: AtomicU64::new(default_units),
            origin: tokio::time::Instant::now(),
            gate: LeaseGate {
                origin: std::sync::OnceLock::new(),
                until: AtomicU64::new(u64::MAX),
                fallback: AtomicU64::new(0),
            },
        }
    }

    /// Nanoseconds since these shares were made (when keys were first hit: [`Drained::first_hit`]).
    #[must_use]
    pub fn clock(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Checks the lease at every decision from now on (see [`LeaseGate`]): `origin` is the
    /// driver's clock origin (its time `t` is `origin + t − 1` ns), `fallback` the units per
    /// key once the lease has expired. Set once; later calls change only `fallback`.
    pub fn gate_lease(&self, origin: tokio::time::Instant, fallback: u64) {
        let _ = self.gate.origin.set(origin);
        self.gate.fallback.store(fallback, Ordering::Relaxed);
    }

    /// The lease now ends at `until` (driver clock; `None`: no lease applies).
    pub fn set_lease_until(&self, until: Option<Nanos>) {
        self.gate
            .until
            .store(until.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// `units`, capped by the fallback if the lease has ended by now.
    fn gated(&self, units: u64) -> u64 {
        let until = self.gate.until.load(Ordering::Acquire);
        if until == u64::MAX {
            return units;
        }
        let Some(origin) = self.gate.origin.get() else {
            return units;
        };
        // The driver's clock (`nanos since origin + 1`): a clock read per decision, on the
        // runtime's clock so that simulated time (the partition tests) agrees with it.
        let now = u64::try_from(origin.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        if now >= until {
            units.min(self.gate.fallback.load(Ordering::Relaxed))
        } else {
            units
        }
    }

    fn shard(&self, key: u64) -> &RwLock<HashMap<u64, Arc<KeyShare>>> {
        // The key is already a hash; its low bits pick the shard.
        &self.shards[(key as usize) % SHARDS]
    }

    /// Counts `hits` against `key` (a rule of `count` per `period`) and returns the units
    /// this node enforces for it now.
    pub fn on_hit(&self, key: u64, count: u64, period: Nanos, hits: u64) -> u64 {
        self.hit_key(key, None, count, period, hits, false)
    }

    /// [`Shares::on_hit`] by the engine, which names the key's rule, `(domain, descriptor
    /// path)`, so operators can tell which rule a key's share belongs to ([`Shares::rule`]).
    /// With `windowed` (a fixed window, sliding window or sliding log) it returns the
    /// smallest units this node held over the rule's last `period` (see the module
    /// documentation).
    pub fn on_rule_hit(
        &self,
        key: u64,
        rule: (&str, &str),
        count: u64,
        period: Nanos,
        hits: u64,
        windowed: bool,
    ) -> u64 {
        self.hit_key(key, Some(rule), count, period, hits, windowed)
    }

    /// The rule that first decided `key` on this node, `(domain, descriptor path)`; `None`
    /// for a key this node has only heard of from its peers.
    #[must_use]
    pub fn rule(&self, key: u64) -> Option<(String, String)> {
        let shard = self.shard(key).read();
        let (d, p) = shard.get(&key)?.rule.get()?;
        Some((d.to_string(), p.to_string()))
    }

    fn hit_key(
        &self,
        key: u64,
        rule: Option<(&str, &str)>,
        count: u64,
        period: Nanos,
        hits: u64,
        windowed: bool,
    ) -> u64 {
        let shard = self.shard(key);
        // Under the read lock, without cloning the `Arc`: a clone per hit would write its
        // reference count, a cache line every deciding core shares.
        if let Some(entry) = shard.read().get(&key) {
            name(entry, rule);
            return self.hit(entry, count, period, hits, windowed);
        }
        let mut guard = shard.write();
        let entry = guard.entry(key).or_insert_with(|| {
            Arc::new(KeyShare {
                units: AtomicU64::new(0),
                units_windowed: AtomicU64::new(0),
                history: Mutex::new(VecDeque::new()),
                hits: AtomicU64::new(0),
                refused: std::sync::atomic::AtomicBool::new(false),
                count: AtomicU64::new(count),
                period: AtomicU64::new(period),
                known: std::sync::atomic::AtomicBool::new(false),
                rule: std::sync::OnceLock::new(),
                first_hit: AtomicU64::new(0),
            })
        });
        name(entry, rule);
        self.hit(entry, count, period, hits, windowed)
    }

    fn hit(&self, entry: &KeyShare, count: u64, period: Nanos, hits: u64, windowed: bool) -> u64 {
        // Relaxed: each field is a value on its own; the driver tolerates a hit counted in
        // the next drain rather than this one.
        entry.hits.fetch_add(hits, Ordering::Relaxed);
        // One clock read per key, at its first hit.
        if entry.first_hit.load(Ordering::Relaxed) == 0 {
            entry
                .first_hit
                .store(self.clock().max(1), Ordering::Relaxed);
        }
        // Written only when the rule changed (a reload), so hot keys do not keep dirtying the
        // line for the other threads.
        if entry.count.load(Ordering::Relaxed) != count {
            entry.count.store(count, Ordering::Relaxed);
        }
        if entry.period.load(Ordering::Relaxed) != period {
            entry.period.store(period, Ordering::Relaxed);
        }
        self.held(entry, windowed)
    }

    /// What the node enforces for `e`: its units (for a windowed algorithm, the smallest
    /// over the last period), or the default while the driver has not set them.
    fn held(&self, e: &KeyShare, windowed: bool) -> u64 {
        self.gated(self.held_ungated(e, windowed))
    }

    fn held_ungated(&self, e: &KeyShare, windowed: bool) -> u64 {
        if !e.known.load(Ordering::Acquire) {
            return self.default_units.load(Ordering::Relaxed);
        }
        let units = e.units.load(Ordering::Relaxed);
        if windowed {
            e.units_windowed.load(Ordering::Relaxed).min(units)
        } else {
            units
        }
    }

    /// The units this node enforces for `key` (without counting a hit).
    #[must_use]
    pub fn units(&self, key: u64) -> u64 {
        match self.shard(key).read().get(&key) {
            Some(e) => self.held(e, false),
            None => self.gated(self.default_units.load(Ordering::Relaxed)),
        }
    }

    /// [`Shares::units`] for a windowed algorithm.
    #[must_use]
    pub fn units_windowed(&self, key: u64) -> u64 {
        match self.shard(key).read().get(&key) {
            Some(e) => self.held(e, true),
            None => self.gated(self.default_units.load(Ordering::Relaxed)),
        }
    }

    /// Sets the units of `key` at `now` (the driver's clock), from `sluice-coord`'s enforced
    /// limit. A key the engine has not seen yet is added: the node may hold less than its
    /// default for it (it gave some away), and the first local hit must see that, not the
    /// default.
    pub fn set(&self, key: u64, units: u64, now: Nanos) {
        if let Some(e) = self.shard(key).read().get(&key) {
            let mut h = e.history.lock();
            if !e.known.load(Ordering::Acquire) {
                // Until now the engine enforced the default for it: that counts in the
                // window too.
                h.push_back((now, self.default_units.load(Ordering::Relaxed)));
            }
            e.units.store(units, Ordering::Relaxed);
            e.known.store(true, Ordering::Release);
            h.push_back((now, units));
            windowed_min(e, &mut h, now);
            return;
        }
        let mut guard = self.shard(key).write();
        let e = guard.entry(key).or_insert_with(|| {
            Arc::new(KeyShare {
                units: AtomicU64::new(units),
                units_windowed: AtomicU64::new(units),
                history: Mutex::new(VecDeque::new()),
                hits: AtomicU64::new(0),
                refused: std::sync::atomic::AtomicBool::new(false),
                // Unknown until the first hit; no hits, no demand.
                count: AtomicU64::new(0),
                period: AtomicU64::new(0),
                known: std::sync::atomic::AtomicBool::new(true),
                rule: std::sync::OnceLock::new(),
                first_hit: AtomicU64::new(0),
            })
        });
        e.units.store(units, Ordering::Relaxed);
        let mut h = e.history.lock();
        h.push_back((now, units));
        windowed_min(e, &mut h, now);
    }

    /// Lets time pass for the windowed shares: steps older than a key's `period` no longer
    /// count (the driver calls it every tick, after [`Shares::set`]).
    pub fn refresh(&self, now: Nanos) {
        for shard in &self.shards {
            for e in shard.read().values() {
                let mut h = e.history.lock();
                windowed_min(e, &mut h, now);
            }
        }
    }

    /// Sets the units of every key the driver has not set.
    pub fn set_default(&self, units: u64) {
        self.default_units.store(units, Ordering::Relaxed);
    }

    /// The default units.
    #[must_use]
    pub fn default_units(&self) -> u64 {
        self.default_units.load(Ordering::Relaxed)
    }

    /// Takes every key's hits since the previous drain (keys without hits included, with 0).
    pub fn drain(&self) -> Vec<Drained> {
        let mut out = Vec::new();
        for shard in &self.shards {
            for (&key, e) in shard.read().iter() {
                out.push(Drained {
                    key,
                    hits: e.hits.swap(0, Ordering::Relaxed),
                    count: e.count.load(Ordering::Relaxed),
                    period: e.period.load(Ordering::Relaxed),
                    refused: e.refused.swap(false, Ordering::Relaxed),
                    first_hit: e.first_hit.load(Ordering::Relaxed),
                });
            }
        }
        out.sort_unstable_by_key(|d| d.key);
        out
    }

    /// A request on `key` was refused (the engine tells it, only on refusals: admitted
    /// requests write nothing more). Written only when not already set, so a key refused
    /// at a high rate does not keep dirtying the line.
    pub fn note_refused(&self, key: u64) {
        if let Some(e) = self.shard(key).read().get(&key)
            && !e.refused.load(Ordering::Relaxed)
        {
            e.refused.store(true, Ordering::Relaxed);
        }
    }

    /// Forgets `key` (idle); its next hit starts again from the default share.
    pub fn remove(&self, key: u64) {
        self.shard(key).write().remove(&key);
    }

    /// Number of keys.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Whether there is no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Names `e`'s rule the first time one is given (a read of a set cell afterwards: the
/// name is copied once per key, not per hit).
fn name(e: &KeyShare, rule: Option<(&str, &str)>) {
    if let Some((domain, path)) = rule
        && e.rule.get().is_none()
    {
        let _ = e.rule.set((domain.into(), path.into()));
    }
}

/// Drops the steps that ended before `now − period` and stores the smallest units of the
/// rest (the step in force at `now − period` included).
fn windowed_min(e: &KeyShare, h: &mut VecDeque<(Nanos, u64)>, now: Nanos) {
    let from = now.saturating_sub(e.period.load(Ordering::Relaxed));
    while h.len() >= 2 && h[1].0 <= from {
        h.pop_front();
    }
    let current = e.units.load(Ordering::Relaxed);
    let min = h
        .iter()
        .map(|&(_, u)| u)
        .min()
        .unwrap_or(current)
        .min(current);
    e.units_windowed.store(min, Ordering::Relaxed);
}

/// `⌊count·units/SCALE⌋`: this node's part of a rule's `count` (0 when it holds nothing).
#[must_use]
pub fn scaled(count: u64, units: u64) -> u64 {
    let v = u128::from(count) * u128::from(units.min(SCALE)) / u128::from(SCALE);
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// The cluster key of a descriptor: a 64-bit FNV-1a hash of the domain and its entries.
/// Stable across processes, platforms and versions (every node must compute the same key
/// for the same descriptor), unlike `std`'s or `foldhash`'s seeded hashers.
#[must_use]
pub fn cluster_key<'a>(domain: &str, entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    fn eat(mut h: u64, bytes: &[u8], sep: u8) -> u64 {
        for &b in bytes.iter().chain(std::iter::once(&sep)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
        h
    }
    // Separators outside UTF-8's byte range keep `a=bc` and `ab=c` apart.
    let mut h = eat(OFFSET, domain.as_bytes(), 0xff);
    for (k, v) in entries {
        h = eat(h, k.as_bytes(), 0xfe);
        h = eat(h, v.as_bytes(), 0xff);
    }
    h
}

/// What the driver does with a key the engine saw, at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyRole {
    /// Its demand goes to the node, which divides it among the peers.
    Coordinated,
    /// It stays on the static split: the node serves it from its default share and tells
    /// its peers nothing (a key with little traffic costs no coordination).
    Light,
    /// No hit and no coordination: forgotten (its next hit starts from the split).
    Gone,
}

/// A key is coordinated once the node has state for it (its own demand or a peer's made
/// it), or once the static split is not enough here: a request was refused, or more than
/// one request came in a cycle at a rate above this node's split. A flood of keys seen once
/// each (new client addresses) therefore never reaches the protocol: those keys live only
/// in the engine's store, each node enforcing its static split of them.
pub(crate) fn key_role(state: bool, hits: u64, refused: bool, rate: f64, split: f64) -> KeyRole {
    if state || refused || (hits >= 2 && rate > split) {
        KeyRole::Coordinated
    } else if hits > 0 {
        KeyRole::Light
    } else {
        KeyRole::Gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frozen process wakes with the driver's last units in place and requests queued: the
    /// decisions must read the lease's end themselves (the driver's timer has not run yet).
    #[test]
    fn decisions_past_the_lease_enforce_the_fallback_before_the_driver_runs() {
        let s = Shares::new(SCALE / 3);
        let origin = tokio::time::Instant::now()
            .checked_sub(std::time::Duration::from_millis(50))
            .expect("a clock past its origin");
        s.gate_lease(origin, SCALE / 10);
        s.set(7, SCALE / 2, 1);
        // A lease running for another second: the driver's units.
        s.set_lease_until(Some(1_000_000_000));
        assert_eq!(s.on_hit(7, 100, 1_000_000_000, 1), SCALE / 2);
        assert_eq!(s.units(8), SCALE / 3, "a key without state: the default");
        // The lease ended 40 ms ago (driver clock: 10 ms after its origin); nobody told the
        // shares: every decision caps at the fallback, known key or not.
        s.set_lease_until(Some(10_000_000));
        assert_eq!(s.on_hit(7, 100, 1_000_000_000, 1), SCALE / 10);
        assert_eq!(s.units(7), SCALE / 10);
        assert_eq!(s.units_windowed(7), SCALE / 10);
        assert_eq!(s.units(8), SCALE / 10);
        // Renewed: the units again.
        s.set_lease_until(Some(10_000_000_000));
        assert_eq!(s.units(7), SCALE / 2);
        // No lease applies (the `last-share` fallback): never capped.
        s.set_lease_until(None);
        assert_eq!(s.units(7), SCALE / 2);
    }

    /// Keys seen once each stay on the static split; a refusal, or a rate above the split
    /// over more than one request, makes a key coordinated; state keeps it so; a light key
    /// without hits is forgotten.
    #[test]
    fn only_keys_the_split_cannot_serve_are_coordinated() {
        let split = (SCALE / 3) as f64;
        // One request in a cycle reads as a high rate; it is still served by the split.
        assert_eq!(
            key_role(false, 1, false, split * 1.5, split),
            KeyRole::Light
        );
        assert_eq!(
            key_role(false, 1, true, split * 1.5, split),
            KeyRole::Coordinated
        );
        assert_eq!(
            key_role(false, 5, false, split * 1.1, split),
            KeyRole::Coordinated
        );
        assert_eq!(
            key_role(false, 5, false, split * 0.9, split),
            KeyRole::Light
        );
        assert_eq!(key_role(true, 0, false, 0.0, split), KeyRole::Coordinated);
        assert_eq!(key_role(false, 0, false, 0.0, split), KeyRole::Gone);
    }

    #[test]
    fn without_a_gate_the_units_are_the_drivers() {
        let s = Shares::new(SCALE / 3);
        s.set(7, SCALE / 2, 1);
        s.set_lease_until(Some(0));
        assert_eq!(
            s.units(7),
            SCALE / 2,
            "no cluster clock given: nothing to check"
        );
    }

    #[test]
    fn floors_never_add_up_to_more_than_the_count() {
        for count in [1u64, 3, 7, 10, 1000, 12_345] {
            for parts in [2u64, 3, 5, 7] {
                let mut left = SCALE;
                let mut sum = 0;
                for p in 0..parts {
                    let u = if p + 1 == parts { left } else { SCALE / parts };
                    left -= u;
                    sum += scaled(count, u);
                }
                assert!(sum <= count);
                assert!(sum + parts > count, "floors lose less than one per part");
            }
        }
    }

    #[test]
    fn keys_are_stable_and_separated() {
        let a = cluster_key("d", [("k", "v")]);
        assert_eq!(a, cluster_key("d", [("k", "v")]));
        assert_ne!(
            cluster_key("d", [("ab", "c")]),
            cluster_key("d", [("a", "bc")])
        );
        assert_ne!(
            cluster_key("d", [("k", "v")]),
            cluster_key("e", [("k", "v")])
        );
        // Pinned: a change here splits a cluster of mixed versions.
        assert_eq!(
            cluster_key("api", [("tenant", "acme")]),
            0xcad4_78b4_9b1a_b469
        );
    }

    #[test]
    fn drain_takes_hits_once() {
        let s = Shares::new(SCALE / 2);
        assert_eq!(s.on_hit(7, 10, 1_000, 3), SCALE / 2);
        s.set(7, 100, 0);
        assert_eq!(s.on_hit(7, 10, 1_000, 2), 100);
        let d = s.drain();
        assert!(d[0].first_hit <= s.clock());
        assert_eq!(
            d,
            vec![Drained {
                key: 7,
                hits: 5,
                count: 10,
                period: 1_000,
                refused: false,
                first_hit: d[0].first_hit,
            }]
        );
        assert_eq!(s.drain()[0].hits, 0);
    }

    /// A key the node gave away before any local hit: the first hit sees the node's real
    /// holding, not the default share (else the node would enforce capacity it no longer has).
    #[test]
    fn a_key_set_before_its_first_hit_keeps_the_set_value() {
        let s = Shares::new(SCALE / 2);
        s.set(9, 3, 0);
        assert_eq!(s.units(9), 3);
        assert_eq!(s.on_hit(9, 10, 1_000, 1), 3);
        s.set_default(SCALE);
        assert_eq!(s.on_hit(9, 10, 1_000, 1), 3);
    }

    /// The module documentation's example: a share that moves within a window is used once,
    /// not twice, by windowed algorithms; buckets take the new share at once.
    #[test]
    fn windowed_shares_take_a_raise_after_a_full_window_and_a_cut_at_once() {
        let second = 1_000_000_000;
        let s = Shares::new(SCALE / 2);
        // Known to the engine first (hits at the default), then set by the driver.
        let windowed = |s: &Shares| s.on_rule_hit(1, ("d", "k"), 1000, second, 1, true);
        assert_eq!(windowed(&s), SCALE / 2);
        s.set(1, SCALE / 2, 0);
        // A raise at 0.3 s: buckets see it now, windows only once a full period has passed.
        s.set(1, SCALE * 7 / 10, 300_000_000);
        assert_eq!(s.on_hit(1, 1000, second, 1), SCALE * 7 / 10);
        assert_eq!(windowed(&s), SCALE / 2);
        s.refresh(1_200_000_000);
        assert_eq!(s.units_windowed(1), SCALE / 2, "0.5 was in force at 0.2 s");
        s.refresh(1_300_000_000);
        assert_eq!(s.units_windowed(1), SCALE * 7 / 10, "a full second at 0.7");
        // A cut applies at once to both.
        s.set(1, SCALE / 10, 1_400_000_000);
        assert_eq!(s.on_hit(1, 1000, second, 1), SCALE / 10);
        assert_eq!(windowed(&s), SCALE / 10);
        // A key the driver set before any hit, and a key never set: as `units`.
        s.set(2, 5, 0);
        assert_eq!(s.units_windowed(2), 5);
        assert_eq!(s.units_windowed(3), SCALE / 2);
    }

    #[test]
    fn a_key_is_named_after_the_first_rule_that_decides_it() {
        let s = Shares::new(SCALE / 2);
        // Heard of from a peer first: no rule yet.
        s.set(1, 7, 0);
        assert_eq!(s.rule(1), None);
        s.on_hit(1, 10, 1_000, 1);
        assert_eq!(s.rule(1), None, "a client lease's demand names nothing");
        s.on_rule_hit(1, ("api", "tenant"), 10, 1_000, 1, false);
        s.on_rule_hit(1, ("api", "other"), 10, 1_000, 1, true);
        assert_eq!(s.rule(1), Some(("api".into(), "tenant".into())));
        // Decided here first.
        assert_eq!(
            s.on_rule_hit(2, ("d", "k_v"), 10, 1_000, 1, false),
            SCALE / 2
        );
        assert_eq!(s.rule(2), Some(("d".into(), "k_v".into())));
        assert_eq!(s.rule(3), None);
    }
}
