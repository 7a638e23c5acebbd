//! Keyed state: millions of keys, many threads, bounded memory.
//!
//! A sharded hash table (hashbrown's `HashTable` behind a `parking_lot::RwLock` per shard,
//! foldhash for hashing) maps each key to one `AtomicU64` holding its GCRA state. A check on a
//! known key takes the shard's lock for *reading* and updates the key with the same CAS loop
//! as [`crate::AtomicGcra`], so threads never wait for each other on existing keys (except
//! while a new key is being inserted in the same shard: only that takes the write lock).
//!
//! Memory is bounded two ways. Eviction only ever removes idle keys, so it changes no future
//! decision; the cap may refuse new keys:
//! - [`KeyedGcra::retain_recent`] evicts keys that are idle (`TAT ≤ now`, i.e. full bucket,
//!   indistinguishable from a key never seen): the caller runs it periodically.
//! - [`KeyedConfig::max_keys`] caps the table. A new key arriving at a full shard first
//!   evicts that shard's idle keys; if none is idle, the new key is refused (fail closed),
//!   because forgetting a busy key would hand it a fresh burst.
//!
//! [`KeyedStore`] is the same table for any [`Algorithm`], with a mutex per shard. Its cap
//! ([`KeyedStore::with_max_keys`]) never refuses: a new key arriving at a full shard first
//! evicts the shard's idle keys (no decision changes), then, if the shard is still above
//! 7/8 of its part of the cap, its least recently used keys. Evicting a key that is not idle
//! forgets what it used: that key may admit at most one more burst (its limit's burst, or
//! its window's count) than it would have. Both kinds are counted
//! ([`KeyedStore::evictions`]).

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};

use crate::algorithm::Algorithm;
use crate::atomic::{Word, check_word};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::gcra::{AsGcraLimit, GcraState, decide};
use crate::limit::Limit;

/// A borrowed form of a key of type `K`, to look a key up without building it: a server's
/// key is often made of strings taken from a request, and building the owned key costs an
/// allocation per part on every decision, while it is only needed when the key is new.
///
/// Contract: `self.matches(k)` exactly when `self.to_key() == *k`, and `self` hashes as
/// `self.to_key()` does (same [`Hash`] writes). Every key is its own view.
pub trait KeyView<K>: Hash {
    /// Whether `key` is the key this view stands for.
    fn matches(&self, key: &K) -> bool;
    /// The owned key, built when it is stored.
    fn to_key(&self) -> K;
}

impl<K: Hash + Eq + Clone> KeyView<K> for K {
    #[inline]
    fn matches(&self, key: &K) -> bool {
        self == key
    }
    #[inline]
    fn to_key(&self) -> K {
        self.clone()
    }
}

/// How a [`KeyedGcra`] is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedConfig {
    /// Number of shards (rounded up to a power of two, at least 1). More shards: less
    /// contention on new keys and on lock words; a few hundred bytes each.
    pub shards: usize,
    /// Most keys held at once (`None`: unbounded, eviction only by
    /// [`KeyedGcra::retain_recent`]). Enforced per shard as `⌈max_keys / shards⌉`.
    pub max_keys: Option<usize>,
}

impl Default for KeyedConfig {
    fn default() -> Self {
        Self {
            shards: 64,
            max_keys: None,
        }
    }
}

struct Shard<K> {
    table: HashTable<(K, AtomicU64)>,
    /// No key of this shard is idle before this instant (a lower bound of the stored `TAT`s:
    /// the smallest at the last sweep, lowered by each insertion; stored `TAT`s only grow),
    /// so a full shard is not swept again before it: sweeping would free nothing.
    busy_until: Nanos,
}

/// GCRA for many keys, safe to share between threads (see the [module docs](self)).
///
/// Decisions are exactly those of [`crate::Gcra`] on each key's own sequence of calls
/// (`tests/buckets_props.rs` replays random traces on both), except that a new key may be
/// refused when [`KeyedConfig::max_keys`] is reached and no key is idle.
///
/// State per key beyond the key itself: one `u64` in the table slot plus hashbrown's one
/// control byte, divided by the table's load factor (between 7/16 and 7/8); docs/BENCHMARKS.md
/// gives the measured figure (about 28 bytes per `u64` key at one million keys).
///
/// ```
/// use sluice_limits::{KeyedGcra, Limit};
/// let store: KeyedGcra<String> = KeyedGcra::new();
/// let limit: Limit = "2/1s".parse().unwrap();
/// let alice = "alice".to_string();
/// assert!(store.check(&alice, &limit, 0, 1).allowed);
/// assert!(store.check(&alice, &limit, 0, 1).allowed);
/// assert!(!store.check(&alice, &limit, 0, 1).allowed);
/// assert!(store.check(&"bob".to_string(), &limit, 0, 1).allowed);
/// // One second later both buckets are full again: forgetting them changes nothing.
/// assert_eq!(store.retain_recent(1_000_000_000), 2);
/// assert_eq!(store.len(), 0);
/// ```
pub struct KeyedGcra<K, S = foldhash::fast::RandomState> {
    shards: Box<[CachePadded<RwLock<Shard<K>>>]>,
    hasher: S,
    shard_mask: u64,
    max_per_shard: usize,
}

impl<K, S> std::fmt::Debug for KeyedGcra<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedGcra")
            .field("shards", &self.shards.len())
            .field("max_per_shard", &self.max_per_shard)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone> Default for KeyedGcra<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone> KeyedGcra<K> {
    /// An empty store with the default configuration and a randomly seeded hasher.
    #[must_use]
    pub fn new() -> Self {
        Self::with_config(KeyedConfig::default())
    }

    /// An empty store laid out as `config` says.
    #[must_use]
    pub fn with_config(config: KeyedConfig) -> Self {
        Self::with_config_and_hasher(config, foldhash::fast::RandomState::default())
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> KeyedGcra<K, S> {
    /// An empty store laid out as `config` says, hashing with `hasher`.
    #[must_use]
    pub fn with_config_and_hasher(config: KeyedConfig, hasher: S) -> Self {
        let n = config.shards.max(1).next_power_of_two();
        let shards = (0..n)
            .map(|_| {
                CachePadded::new(RwLock::new(Shard {
                    table: HashTable::new(),
                    busy_until: 0,
                }))
            })
            .collect();
        let max_per_shard = config.max_keys.map_or(usize::MAX, |m| m.div_ceil(n).max(1));
        Self {
            shards,
            hasher,
            shard_mask: (n - 1) as u64,
            max_per_shard,
        }
    }

    #[inline]
    fn locate(&self, key: &K) -> (u64, &RwLock<Shard<K>>) {
        let hash = self.hasher.hash_one(key);
        // hashbrown uses the low bits (bucket) and the top 7 (tag); the shard takes bits
        // from the middle so the three stay independent.
        let index = ((hash >> 32) & self.shard_mask) as usize;
        (hash, &self.shards[index])
    }

    /// Decides a request of `cost` permits for `key` at `now` under `limit`, consuming the
    /// permits if admitted. A key is stored only once it has consumed something.
    pub fn check<L: AsGcraLimit + ?Sized>(
        &self,
        key: &K,
        limit: &L,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        let limit = &limit.gcra_limit();
        let (hash, shard) = self.locate(key);
        {
            let guard = shard.read();
            if let Some((_, word)) = guard.table.find(hash, |(k, _)| k == key) {
                return check_word(word, limit, now, cost);
            }
        }
        // An unseen key decides as a new state; it is inserted only if that changes it.
        let (decision, new_tat) = decide(0, limit, now, cost);
        let Some(new_tat) = new_tat else {
            return decision;
        };
        let mut guard = shard.write();
        // Another thread may have inserted it between the two locks.
        if let Some((_, word)) = guard.table.find(hash, |(k, _)| k == key) {
            return check_word(word, limit, now, cost);
        }
        if guard.table.len() >= self.max_per_shard {
            if now >= guard.busy_until {
                guard.table.retain(|(_, w)| Word::load(w) > now);
                guard.busy_until = guard
                    .table
                    .iter()
                    .map(|(_, w)| Word::load(w))
                    .min()
                    .unwrap_or(0);
            }
            if guard.table.len() >= self.max_per_shard {
                // Full of busy keys: refuse the newcomer rather than forget a busy key.
                let wait = guard.busy_until.saturating_sub(now);
                return Decision::deny(limit.count(), 0, wait, Some(wait));
            }
        }
        // Keep `busy_until` a lower bound of the stored TATs.
        guard.busy_until = guard.busy_until.min(new_tat);
        let hasher = &self.hasher;
        guard
            .table
            .insert_unique(hash, (key.clone(), AtomicU64::new(new_tat)), |(k, _)| {
                hasher.hash_one(k)
            });
        decision
    }

    /// Decides as [`KeyedGcra::check`] would, without consuming anything or inserting `key`.
    #[must_use]
    pub fn peek<L: AsGcraLimit + ?Sized>(
        &self,
        key: &K,
        limit: &L,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        decide(self.state(key).tat(), &limit.gcra_limit(), now, cost).0
    }

    /// The state of `key` (a new state if it is not stored).
    #[must_use]
    pub fn state(&self, key: &K) -> GcraState {
        let (hash, shard) = self.locate(key);
        let guard = shard.read();
        let tat = guard
            .table
            .find(hash, |(k, _)| k == key)
            .map_or(0, |(_, w)| Word::load(w));
        GcraState::from_tat(tat)
    }

    /// Evicts every key that is idle at `now` (its bucket full again, `TAT ≤ now`) and returns
    /// how many were evicted. Future decisions are unchanged for any call at time `≥ now`:
    /// an idle key decides exactly as a key never seen.
    ///
    /// Takes each shard's write lock in turn, briefly; tables that became mostly empty give
    /// back their memory.
    pub fn retain_recent(&self, now: Nanos) -> usize {
        let hasher = &self.hasher;
        let mut evicted = 0;
        for shard in &self.shards {
            let mut guard = shard.write();
            let before = guard.table.len();
            guard.table.retain(|(_, w)| Word::load(w) > now);
            evicted += before - guard.table.len();
            if guard.table.len() * 4 < guard.table.capacity() {
                guard.table.shrink_to_fit(|(k, _)| hasher.hash_one(k));
            }
        }
        evicted
    }

    /// Number of keys stored.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().table.len()).sum()
    }

    /// Whether no key is stored.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes allocated by the tables (slots and control bytes), not counting heap memory
    /// owned by the keys themselves nor the fixed per-shard overhead.
    #[must_use]
    pub fn table_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().table.allocation_size())
            .sum()
    }
}

/// One shard of a [`KeyedStore`].
type StoreShard<K, A> = Mutex<HashTable<Slot<K, <A as Algorithm>::State>>>;

/// A key's entry in a [`KeyedStore`]: its state, and when it was last decided on (the order
/// of least recent use, for the cap).
struct Slot<K, S> {
    key: K,
    state: S,
    used: Nanos,
}

/// Keys a [`KeyedStore`] evicted to stay under its cap, since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Idle keys (their state was a fresh key's): no decision changed.
    pub idle: u64,
    /// Keys that were not idle, least recently used first: each may admit at most one more
    /// burst than it would have.
    pub forced: u64,
}

/// Any [`Algorithm`] for many keys: a sharded table of `A::State` behind a mutex per shard.
///
/// The general form, for algorithms whose state is more than one word (token bucket, windows,
/// sliding log). Each check locks one shard for the length of the decision; for GCRA prefer
/// [`KeyedGcra`], whose checks on known keys never wait. Eviction follows the same rule —
/// only keys for which [`Algorithm::is_idle`] holds are removed, so (under the contract of
/// `is_idle`, and calls at times `≥ now`) no future decision changes.
///
/// ```
/// use sluice_limits::{KeyedStore, Limit, TokenBucket};
/// let store: KeyedStore<u32, TokenBucket> = KeyedStore::new(TokenBucket, 16);
/// let limit: Limit = "1/1s".parse().unwrap();
/// assert!(store.check(&7, &limit, 0, 1).allowed);
/// assert!(!store.check(&7, &limit, 0, 1).allowed);
/// assert_eq!(store.retain_idle(1_000_000_000, |_| limit), 1);
/// ```
pub struct KeyedStore<K, A: Algorithm, S = foldhash::fast::RandomState> {
    algorithm: A,
    shards: Box<[CachePadded<StoreShard<K, A>>]>,
    hasher: S,
    shard_mask: u64,
    /// Most keys per shard (`usize::MAX`: no cap).
    max_per_shard: usize,
    evicted_idle: AtomicU64,
    evicted_forced: AtomicU64,
}

/// Judges no key idle: evictions under the cap are then least recently used first.
fn no_judge<K>(_: &K) -> Option<Limit> {
    None
}

impl<K, A: Algorithm, S> std::fmt::Debug for KeyedStore<K, A, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedStore")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, A: Algorithm> KeyedStore<K, A> {
    /// An empty store of `shards` shards (rounded up to a power of two).
    #[must_use]
    pub fn new(algorithm: A, shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        Self {
            algorithm,
            shards: (0..n)
                .map(|_| CachePadded::new(Mutex::new(HashTable::new())))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            shard_mask: (n - 1) as u64,
            max_per_shard: usize::MAX,
            evicted_idle: AtomicU64::new(0),
            evicted_forced: AtomicU64::new(0),
        }
    }
}

impl<K: Hash + Eq + Clone, A: Algorithm, S: BuildHasher> KeyedStore<K, A, S> {
    /// The store with at most about `max` keys (`None`: no cap): `⌈max / shards⌉` per shard
    /// (see the [module docs](self)).
    #[must_use]
    pub fn with_max_keys(mut self, max: Option<usize>) -> Self {
        self.max_per_shard = max.map_or(usize::MAX, |m| m.div_ceil(self.shards.len()).max(1));
        self
    }

    /// The most keys the store holds (`None`: no cap).
    #[must_use]
    pub fn max_keys(&self) -> Option<usize> {
        (self.max_per_shard != usize::MAX).then(|| self.max_per_shard * self.shards.len())
    }

    /// Keys evicted to stay under the cap, since the store was made.
    #[must_use]
    pub fn evictions(&self) -> Evictions {
        Evictions {
            idle: self.evicted_idle.load(Ordering::Relaxed),
            forced: self.evicted_forced.load(Ordering::Relaxed),
        }
    }

    /// Stores a new key used at `now` in `table` (its shard), making room first if the
    /// shard is full.
    fn insert(
        &self,
        table: &mut HashTable<Slot<K, A::State>>,
        hash: u64,
        (key, state, now): (K, A::State, Nanos),
        idle_limit: &dyn Fn(&K) -> Option<Limit>,
    ) {
        if table.len() >= self.max_per_shard {
            self.make_room(table, now, idle_limit);
        }
        let slot = Slot {
            key,
            state,
            used: now,
        };
        let hasher = &self.hasher;
        table.insert_unique(hash, slot, |s| hasher.hash_one(&s.key));
    }

    /// A full shard: drops its idle keys, then, above 7/8 of the shard's cap, its least
    /// recently used ones down to 7/8 (so a flood of new keys pays this once per eighth of
    /// a shard, not once per key).
    fn make_room(
        &self,
        table: &mut HashTable<Slot<K, A::State>>,
        now: Nanos,
        idle_limit: &dyn Fn(&K) -> Option<Limit>,
    ) {
        let before = table.len();
        table.retain(|s| {
            !idle_limit(&s.key).is_some_and(|l| self.algorithm.is_idle(&s.state, &l, now))
        });
        self.evicted_idle
            .fetch_add((before - table.len()) as u64, Ordering::Relaxed);
        let keep = self.max_per_shard - self.max_per_shard / 8 - 1;
        if table.len() <= keep {
            return;
        }
        let excess = table.len() - keep;
        let mut used: Vec<Nanos> = table.iter().map(|s| s.used).collect();
        let (_, &mut cut, _) = used.select_nth_unstable(excess - 1);
        // Every key used before `cut`, and as many used at `cut` as make up the excess.
        let mut left = excess;
        table.retain(|s| {
            let evict = left > 0 && s.used <= cut;
            left -= usize::from(evict);
            !evict
        });
        self.evicted_forced
            .fetch_add((excess - left) as u64, Ordering::Relaxed);
    }

    #[inline]
    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, &StoreShard<K, A>) {
        let hash = self.hasher.hash_one(key);
        (
            hash,
            &self.shards[((hash >> 32) & self.shard_mask) as usize],
        )
    }

    /// Decides a request of `cost` for `key`, as `A::check` on the key's state. A key is
    /// stored only when a request for it is admitted (a denial leaves a state unchanged).
    pub fn check(&self, key: &K, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        self.check_view(key, limit, now, cost)
    }

    /// [`KeyedStore::check`] for the key `view` stands for; the owned key is built only
    /// when it is stored (a new key admitted).
    pub fn check_view<Q: KeyView<K> + ?Sized>(
        &self,
        view: &Q,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        self.check_view_judged(view, limit, now, cost, &no_judge)
    }

    /// [`KeyedStore::check_view`], with `idle_limit` giving the limit of any stored key
    /// (`None`: unknown), so that a full shard evicts idle keys before used ones.
    pub fn check_view_judged<Q: KeyView<K> + ?Sized>(
        &self,
        view: &Q,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        idle_limit: &dyn Fn(&K) -> Option<Limit>,
    ) -> Decision {
        let (hash, shard) = self.locate(view);
        let mut table = shard.lock();
        if let Some(slot) = table.find_mut(hash, |s| view.matches(&s.key)) {
            slot.used = slot.used.max(now);
            return self.algorithm.check(&mut slot.state, limit, now, cost);
        }
        let mut state = self.algorithm.new_state(limit, now);
        let decision = self.algorithm.check(&mut state, limit, now, cost);
        if decision.allowed {
            self.insert(&mut table, hash, (view.to_key(), state, now), idle_limit);
        }
        decision
    }

    /// As [`KeyedStore::check_view`], except that a refused request is counted all the
    /// same, as envoyproxy/ratelimit counts every hit: its `cost` is charged
    /// ([`Algorithm::charge`], in at most two steps, so a window takes up to twice its
    /// count), and a key first seen on a refusal is stored. Later requests then see the
    /// refused hits, as they would see admitted ones.
    pub fn check_counting_refused_view<Q: KeyView<K> + ?Sized>(
        &self,
        view: &Q,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        self.check_counting_refused_view_judged(view, limit, now, cost, &no_judge)
    }

    /// [`KeyedStore::check_counting_refused_view`] with an idle judge for the cap, as
    /// [`KeyedStore::check_view_judged`].
    pub fn check_counting_refused_view_judged<Q: KeyView<K> + ?Sized>(
        &self,
        view: &Q,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        idle_limit: &dyn Fn(&K) -> Option<Limit>,
    ) -> Decision {
        let charge = |state: &mut A::State| {
            self.algorithm.charge(state, limit, now, cost);
            let count = limit.count();
            if cost > count {
                self.algorithm.charge(state, limit, now, cost - count);
            }
        };
        let (hash, shard) = self.locate(view);
        let mut table = shard.lock();
        if let Some(slot) = table.find_mut(hash, |s| view.matches(&s.key)) {
            slot.used = slot.used.max(now);
            let decision = self.algorithm.check(&mut slot.state, limit, now, cost);
            if !decision.allowed {
                charge(&mut slot.state);
            }
            return decision;
        }
        let mut state = self.algorithm.new_state(limit, now);
        let decision = self.algorithm.check(&mut state, limit, now, cost);
        if !decision.allowed {
            charge(&mut state);
        }
        if decision.allowed || cost > 0 {
            self.insert(&mut table, hash, (view.to_key(), state, now), idle_limit);
        }
        decision
    }

    /// Decides as [`KeyedStore::check`] would, changing nothing.
    #[must_use]
    pub fn peek(&self, key: &K, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        self.peek_view(key, limit, now, cost)
    }

    /// [`KeyedStore::peek`] for the key `view` stands for; builds no key.
    #[must_use]
    pub fn peek_view<Q: KeyView<K> + ?Sized>(
        &self,
        view: &Q,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        let (hash, shard) = self.locate(view);
        let table = shard.lock();
        match table.find(hash, |s| view.matches(&s.key)) {
            Some(slot) => self.algorithm.peek(&slot.state, limit, now, cost),
            None => self
                .algorithm
                .peek(&self.algorithm.new_state(limit, now), limit, now, cost),
        }
    }

    /// Evicts every key idle at `now` under its limit (`limit_of(key)`); returns how many.
    pub fn retain_idle(&self, now: Nanos, limit_of: impl Fn(&K) -> Limit) -> usize {
        let hasher = &self.hasher;
        let mut evicted = 0;
        for shard in &self.shards {
            let mut table = shard.lock();
            let before = table.len();
            table.retain(|s| !self.algorithm.is_idle(&s.state, &limit_of(&s.key), now));
            evicted += before - table.len();
            if table.len() * 4 < table.capacity() {
                table.shrink_to_fit(|s| hasher.hash_one(&s.key));
            }
        }
        evicted
    }

    /// Number of keys stored.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no key is stored.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
