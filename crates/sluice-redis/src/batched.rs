//! The batched mode (seed 002 §4.4(5)): a node takes a batch of permits from Redis at once,
//! sized by its own consumption rate and smaller as the quota left shrinks, and answers
//! locally until the batch runs out or expires.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_limits::{AlgorithmKind, AnyAlgorithm, Decision, Limit, Nanos};

use sluice_center::{Center, ConsumptionRate, PRUNE_EVERY, Sweep};

use crate::error::Error;
use crate::script::Shape;
use crate::store::RedisStore;

/// How batches are sized and how long they live.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchConfig {
    /// A batch covers this much of the node's own consumption at its measured rate
    /// (default 20 ms): one Redis call per `horizon` under steady load.
    pub horizon: Nanos,
    /// Never more than this many permits at once (default 1000).
    pub max_batch: u64,
    /// Never more than this fraction of what Redis said was left (default 0.5), so the
    /// batches shrink with the quota and the last permits are spread over the nodes
    /// (seed 002 §4.4(5), third point).
    pub share_of_remaining: f64,
    /// A batch expires this long after it was taken (default 100 ms); a fixed-window batch
    /// also expires at the end of its window.
    pub lease: Nanos,
    /// Weight of the newest measurement in the rate estimate (default 0.5).
    pub smoothing: f64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            horizon: 20_000_000,
            max_batch: 1000,
            share_of_remaining: 0.5,
            lease: 100_000_000,
            smoothing: 0.5,
        }
    }
}

/// A key's batch on this node.
#[derive(Debug, Clone, Copy, Default)]
struct Lease {
    /// Permits of the batch not given out yet.
    left: u64,
    /// The batch may be used before this time only.
    expires: Nanos,
    /// How fast this node uses the key's permits, and the last batch asked for.
    rate: ConsumptionRate,
    /// What Redis said was left after the last batch (None: not asked yet).
    central_left: Option<u64>,
    /// Redis refused a batch: requests the lease cannot serve are refused here until then
    /// without asking again (one call per refusal period, not one per request).
    refused_until: Nanos,
}

/// Batched mode over a [`RedisStore`] (which it also uses for the time source).
///
/// **Guarantee.** Every permit given out was first taken from Redis by an atomic script
/// call, and is given out at most [`BatchConfig::lease`] after that call (measured on the
/// node's clock, from before the call). So for a fixed window the permits given out within
/// each window never exceed the limit over all nodes (a batch expires at the end of its
/// window); for the other algorithms, the permits given out over all nodes in an interval
/// `[s, e]` are at most what the algorithm admits centrally in `[s − lease, e]`. The price:
/// permits of a batch that expires unused are lost (under-admission, never over-admission),
/// and a node's answers lag the others' consumption by up to one batch.
#[derive(Debug)]
pub struct BatchedStore {
    store: RedisStore,
    config: BatchConfig,
    leases: parking_lot::Mutex<Leases>,
    calls: AtomicU64,
}

/// The keys' batches, and when the map is next swept of idle ones.
#[derive(Debug, Default)]
struct Leases {
    map: HashMap<(String, AlgorithmKind), Lease>,
    sweep: Sweep,
}

impl Leases {
    /// Drops the batches idle for [`PRUNE_EVERY`], at most once per [`PRUNE_EVERY`]: a key's
    /// batch goes once it has been expired (and any refusal over) for as long. Only the rate
    /// estimate is lost with it: an expired batch holds no permit that could still be given
    /// out.
    fn prune(&mut self, now: Nanos) {
        if !self.sweep.due(now) {
            return;
        }
        self.map
            .retain(|_, l| now < l.expires.max(l.refused_until).saturating_add(PRUNE_EVERY));
    }
}

impl BatchedStore {
    /// Batches over `store`.
    #[must_use]
    pub fn new(store: RedisStore, config: BatchConfig) -> Self {
        Self {
            store,
            config,
            leases: parking_lot::Mutex::new(Leases::default()),
            calls: AtomicU64::new(0),
        }
    }

    /// The store batches are taken from.
    #[must_use]
    pub fn store(&self) -> &RedisStore {
        &self.store
    }

    /// How many batches were asked of Redis so far.
    #[must_use]
    pub fn central_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Keys this node holds a batch record for (expired ones included until they are swept,
    /// [`PRUNE_EVERY`] after they expired).
    #[must_use]
    pub fn keys(&self) -> usize {
        self.leases.lock().map.len()
    }

    /// Decides a request of `cost` at `now` (the node's clock): from the key's batch if it
    /// holds enough, else after taking a new batch from Redis.
    ///
    /// # Errors
    /// As [`RedisStore::check`], when a new batch was needed.
    pub async fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.decide(alg, key, limit, now, cost, None).await
    }

    /// Decides from the key's batch only, without I/O: `None` when the key holds no valid
    /// batch; while it holds one that cannot cover `cost`, a refusal until it expires.
    #[must_use]
    pub fn held(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Option<Decision> {
        let id = (key.to_string(), Shape::of(alg).kind);
        let mut leases = self.leases.lock();
        let lease = leases.map.get_mut(&id)?;
        if now >= lease.expires {
            return None;
        }
        if cost == 0 || lease.left >= cost {
            return Some(self.take(lease, limit, now, cost));
        }
        let wait = lease.expires - now;
        Some(Decision::deny(limit.count(), lease.left, wait, Some(wait)))
    }

    /// Takes a new batch from Redis whatever the key's batch holds or an earlier refusal
    /// said — after Redis has counted `charge` permits admitted without it (see
    /// [`Center::probe`]), within one timeout — then decides as [`BatchedStore::check`]
    /// does.
    ///
    /// # Errors
    /// As [`RedisStore::check`]; an error says nothing of the charge.
    pub async fn probe(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        charge: u64,
    ) -> Result<Decision, Error> {
        self.decide(alg, key, limit, now, cost, Some(charge)).await
    }

    /// `probe`: ask Redis even when the batch or a refusal could answer, charging it first.
    async fn decide(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        probe: Option<u64>,
    ) -> Result<Decision, Error> {
        let force = probe.is_some();
        let id = (key.to_string(), Shape::of(alg).kind);
        let wanted = {
            let mut leases = self.leases.lock();
            leases.prune(now);
            let lease = leases.map.entry(id.clone()).or_default();
            if now >= lease.expires {
                lease.left = 0;
            }
            if !force && (cost == 0 || lease.left >= cost) {
                return Ok(self.take(lease, limit, now, cost));
            }
            if !force && now < lease.refused_until {
                let wait = lease.refused_until - now;
                return Ok(Decision::deny(limit.count(), lease.left, wait, Some(wait)));
            }
            self.batch_size(lease, limit, now, cost)
        };
        // The call happens without the lock; other requests meanwhile use what is left or
        // take batches of their own.
        self.calls.fetch_add(1, Ordering::Relaxed);
        let charge = probe.unwrap_or(0);
        let r = self
            .store
            .call(alg, key, limit, now, wanted, true, charge)
            .await?;
        let (central, granted) = (r.decision, r.granted);
        let expires = now.saturating_add(match alg {
            // A window's permits are good until the window ends.
            AnyAlgorithm::FixedWindow(_) => self.config.lease.min(central.reset_after),
            _ => self.config.lease,
        });
        let mut leases = self.leases.lock();
        let lease = leases.map.entry(id).or_default();
        if now >= lease.expires {
            lease.left = 0;
        }
        if granted > 0 {
            // Keep the older permits, under the sooner expiry.
            lease.expires = if lease.left > 0 {
                lease.expires.min(expires)
            } else {
                expires
            };
            lease.left += granted;
        }
        lease.central_left = Some(central.remaining);
        if lease.left >= cost {
            return Ok(self.take(lease, limit, now, cost));
        }
        let mut d = central;
        if granted == 0 {
            // Nothing left centrally: wait for the central retry, within one lease (another
            // node's expiring batch cannot give permits back, so waiting longer only
            // under-admits).
            let wait = d
                .retry_after
                .unwrap_or(self.config.lease)
                .min(self.config.lease);
            lease.refused_until = now.saturating_add(wait);
        }
        d.allowed = false;
        d.remaining = lease.left;
        if d.retry_after == Some(0) {
            // Redis granted part of the cost: the rest may come when the next batch does.
            d.retry_after = Some(d.reset_after.max(1));
        }
        Ok(d)
    }

    /// Gives `cost` permits out of the lease and updates the rate.
    fn take(&self, lease: &mut Lease, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        lease.left -= cost;
        lease.rate.used(cost);
        Decision::allow(limit.count(), lease.left, lease.expires.saturating_sub(now))
    }

    /// How many permits to ask for: the node's consumption over the horizon, at most
    /// `max_batch` and the configured share of what Redis had left, never less than the
    /// cost (minus what the lease still holds). Until a rate is measured (one horizon of
    /// use), each batch doubles the last, from 1.
    fn batch_size(&self, lease: &mut Lease, limit: &Limit, now: Nanos, cost: u64) -> u64 {
        let by_rate = lease
            .rate
            .batch(now, self.config.horizon, self.config.smoothing);
        let left = lease.central_left.unwrap_or(limit.count());
        let by_share = (left as f64 * self.config.share_of_remaining).floor() as u64;
        // At least 1: a probe may come with the cost already in the lease.
        let need = cost.saturating_sub(lease.left).max(1);
        let size = by_rate.min(self.config.max_batch).min(by_share).max(need);
        lease.rate.asked(size);
        size
    }
}

impl Center for BatchedStore {
    type Error = Error;

    fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        BatchedStore::check(self, alg, key, limit, now, cost)
    }

    fn held(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Option<Decision> {
        BatchedStore::held(self, alg, key, limit, now, cost)
    }

    fn probe(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        charge: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        BatchedStore::probe(self, alg, key, limit, now, cost, charge)
    }
}
