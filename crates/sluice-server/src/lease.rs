//! Capacity leases for client-side throttling (seed 000 §7; the Doorman style of leasing).
//!
//! A client that throttles itself asks the node for capacity on one *resource* — a domain
//! and one descriptor, governed by a configured rule — saying how much it wants. The node
//! answers with a rate, an expiry and when to ask again; the client decides every request
//! locally against that rate and refreshes before the expiry. The node divides its capacity
//! for the resource among the clients holding leases on it with seed 000 §7 Alg. 2 (max-min
//! fair water-filling, the default) or Alg. 1 (proportional), through
//! [`sluice_coord::allocation::ClientLeases`], which also keeps the lease bookkeeping.
//!
//! **Terms per rule**: a rule's `leases: { policy, duration }` ([`crate::config::RuleLeases`])
//! chooses its division rule and lease duration; what it leaves out comes from the node's
//! [`LeaseConfig`]. A rule's own duration is refreshed after the same fraction of it as the
//! node's lease (3 s of 10 s by default). When a reload changes a resource's terms, its table
//! is *retired*, not dropped: the grants it handed out stay valid until they expire (they
//! cannot be recalled), and the new table divides only what they leave of the capacity.
//!
//! **Capacity of a resource** (re-read at every request, so a reload or a moved share applies
//! at once): for a `coordination: cluster` rule with a cluster attached, this node's current
//! share of the rule's limit ([`crate::shares`]); for a `coordination: redis` rule with Redis
//! attached, the share the node would enforce in fallback (`1/N`); otherwise the rule's
//! limit (`local` rules, and `cluster` rules of a node alone). `requests_per_unit: 0` is
//! capacity 0; `unlimited` grants what is asked; `coordination: token-server` rules are
//! refused (the token server hands out batches, not a share to divide).
//!
//! **Guarantee** (from `ClientLeases`, seed 000 §7 with non-recallable grants): at every
//! instant the rates of this node's unexpired grants on a resource add up to at most the
//! largest capacity the resource had during the last lease duration — so at most the current
//! capacity while it does not decrease, and again within one lease duration after it
//! decreases (after a change of terms, the longer of the old and new durations). For cluster
//! rules the capacities of all nodes add up to at most the global limit (seed 003 §IV
//! conservation), so the leases of the whole cluster do too. A client
//! whose lease expires drops out and its capacity goes to the others at their next refresh.
//!
//! Rates are held in integer nano-requests per second ([`RATE_SCALE`] units per request per
//! second), so the sums are exact. Leased traffic is not counted by the engine: a resource
//! used through leases should not also be checked in-band, or the two add up. For cluster
//! rules the leased demand (what the clients want) is reported to the cluster as hits
//! ([`Leases::tick`]), so the node's share follows its lease clients' demand.
//!
//! Time is an argument (`now`, nanoseconds on the caller's clock); the HTTP shell
//! ([`crate::http`], `POST`/`DELETE /v1/lease`) passes its clock.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use foldhash::HashMap;
use parking_lot::Mutex;
use sluice_coord::allocation::{AllocationPolicy, ClientId, ClientLeases, Units};
use sluice_limits::{Clock, Nanos};

use crate::config::RuleLeases;
use crate::engine::{Descriptor, Engine};

// What a resource can give (a rule's limit, this node's share of it) and rates in units.
#[path = "lease_capacity.rs"]
mod capacity;
pub use capacity::{Capacity, ClusterRef, per_second, rate_units, units_of};

/// Units of rate per request per second: rates are integer nano-requests per second.
pub const RATE_SCALE: u64 = 1_000_000_000;

/// Tables a resource may have retired at once (after reloads that changed its terms); beyond
/// it, the resource keeps its current terms until one has drained (bounds memory and work
/// under a flurry of reloads).
pub const MAX_RETIRED: usize = 4;

/// Longest accepted `client_id`, in bytes.
pub const MAX_CLIENT_ID: usize = 128;

const NS_PER_S: u128 = 1_000_000_000;

/// How leases are handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How a resource's capacity is divided among its clients (seed 000 §7 Alg. 1 or 2).
    pub policy: AllocationPolicy,
    /// How long a grant is valid.
    pub lease: Duration,
    /// When a client should ask again (less than `lease`, so that a refresh lost or late
    /// still leaves time for another before the grant expires).
    pub refresh: Duration,
    /// Clients per resource; a new client beyond it is refused (bounds memory per resource).
    pub max_clients: usize,
    /// Resources with live leases; a new resource beyond it is refused.
    pub max_resources: usize,
}

impl Default for LeaseConfig {
    /// Max-min (Alg. 2), 10 s leases refreshed every 3 s, 10,000 clients per resource,
    /// 100,000 resources.
    fn default() -> Self {
        Self {
            policy: AllocationPolicy::MaxMin,
            lease: Duration::from_secs(10),
            refresh: Duration::from_secs(3),
            max_clients: 10_000,
            max_resources: 100_000,
        }
    }
}

impl LeaseConfig {
    /// The default with leases of `lease`, refreshed after a third of it.
    #[must_use]
    pub fn with_lease(lease: Duration) -> Self {
        Self {
            lease,
            refresh: lease / 3,
            ..Self::default()
        }
    }

    /// The terms of a rule whose `leases` are `rule`: each field it leaves out from this
    /// configuration; a duration of its own is refreshed after the same fraction of it as
    /// [`LeaseConfig::lease`] is ([`LeaseConfig::refresh_for`]).
    #[must_use]
    pub fn terms(&self, rule: &RuleLeases) -> LeaseTerms {
        let lease = sluice_limits::clock::nanos(rule.duration.unwrap_or(self.lease)).max(1);
        LeaseTerms {
            policy: rule.policy.unwrap_or(self.policy),
            lease,
            refresh: self.refresh_for(lease),
        }
    }

    /// When to refresh a lease of `lease` ns: `lease · refresh / self.lease`, rounded down,
    /// so shorter than `lease` whenever [`LeaseConfig::refresh`] is shorter than
    /// [`LeaseConfig::lease`] (which [`Leases::new`] checks).
    #[must_use]
    pub fn refresh_for(&self, lease: Nanos) -> Nanos {
        let own = u128::from(sluice_limits::clock::nanos(self.lease)).max(1);
        let refresh = u128::from(sluice_limits::clock::nanos(self.refresh));
        Nanos::try_from(u128::from(lease) * refresh / own).unwrap_or(lease.saturating_sub(1))
    }
}

/// What a resource's leases are handed out under ([`LeaseConfig::terms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    /// The division rule (seed 000 §7 Alg. 1 or 2).
    pub policy: AllocationPolicy,
    /// How long a grant is valid, ns (≥ 1).
    pub lease: Nanos,
    /// When a client should ask again, ns from the grant.
    pub refresh: Nanos,
}

/// A lease configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    /// The lease lasts no time (below a nanosecond).
    #[error("lease duration must be positive")]
    ZeroLease,
    /// Refreshing no earlier than the expiry would let every lease lapse.
    #[error("refresh interval ({refresh:?}) must be shorter than the lease ({lease:?})")]
    RefreshNotBeforeExpiry {
        /// The lease.
        lease: Duration,
        /// The refresh interval.
        refresh: Duration,
    },
}

/// A client's request for capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRequest {
    /// The domain.
    pub domain: String,
    /// The resource: one descriptor (its entries; a `limit` override is refused).
    pub descriptor: Descriptor,
    /// The client, as it names itself (1 to [`MAX_CLIENT_ID`] bytes): asking again with the
    /// same id refreshes its lease rather than adding a client.
    pub client_id: String,
    /// The rate it wants, requests per second (finite, ≥ 0).
    pub wants: f64,
}

/// What a client is told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseGrant {
    /// The granted rate, in [`RATE_SCALE`] units (nano-requests per second).
    pub rate_units: Units,
    /// When the grant stops being valid (exclusive), on the caller's clock.
    pub expires_at: Nanos,
    /// `expires_at − now`.
    pub expires_in: Nanos,
    /// When to ask again, from now.
    pub refresh_in: Nanos,
    /// The rule's limit in requests per second (`None`: `unlimited`).
    pub limit_per_second: Option<f64>,
    /// This node's capacity for the resource, requests per second (`None`: `unlimited`).
    pub share_per_second: Option<f64>,
    /// The division rule.
    pub policy: AllocationPolicy,
    /// Clients holding a lease on the resource, this one included.
    pub clients: usize,
}

impl LeaseGrant {
    /// The granted rate, requests per second.
    #[must_use]
    pub fn rate_per_second(&self) -> f64 {
        per_second(self.rate_units)
    }
}

/// A lease request the node refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeaseError {
    /// `domain` is empty.
    #[error("lease domain must not be empty")]
    EmptyDomain,
    /// The descriptor has no entries.
    #[error("lease descriptor must have at least one entry")]
    NoEntries,
    /// The descriptor carries its own `limit`: leases divide a configured rule.
    #[error("a leased descriptor cannot carry its own limit: leases divide a configured rule")]
    Override,
    /// `client_id` is empty or too long.
    #[error("client_id must be 1 to {MAX_CLIENT_ID} bytes")]
    BadClientId,
    /// `wants` is negative, NaN or infinite.
    #[error("wants must be a finite rate ≥ 0 (requests per second), not {0}")]
    BadWants(f64),
    /// No file defines the domain.
    #[error("unknown domain {0:?}")]
    UnknownDomain(String),
    /// No rule governs the descriptor (or a `replaces` would drop it).
    #[error("no rate limit rule governs this descriptor in domain {0:?}")]
    NoRule(String),
    /// The rule's coordination cannot be leased.
    #[error("leases are not available for coordination: {0} rules")]
    Unsupported(&'static str),
    /// The resource has [`LeaseConfig::max_clients`] clients already.
    #[error("too many clients hold leases on this resource ({0})")]
    TooManyClients(usize),
    /// [`LeaseConfig::max_resources`] resources have leases already.
    #[error("too many leased resources ({0})")]
    TooManyResources(usize),
}

/// A resource: a domain and a descriptor's entries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ResourceKey {
    domain: Box<str>,
    entries: Box<[(Box<str>, Box<str>)]>,
}

impl ResourceKey {
    fn new(domain: &str, d: &Descriptor) -> Self {
        Self {
            domain: domain.into(),
            entries: d
                .entries
                .iter()
                .map(|e| (e.key.as_str().into(), e.value.as_str().into()))
                .collect(),
        }
    }
}

/// The leases of one resource.
#[derive(Debug)]
struct Resource {
    /// Under the resource's current terms.
    table: ClientLeases,
    /// Tables of earlier terms (at most [`MAX_RETIRED`]) whose grants have not all expired:
    /// no new grant comes from them, and `table` divides what they leave of the capacity.
    retired: Vec<ClientLeases>,
    /// Client names to the table's ids (never reused within a resource) and what each
    /// wants (for the demand reported to the cluster).
    ids: HashMap<Box<str>, (ClientId, Units)>,
    next_id: ClientId,
    cluster: Option<ClusterRef>,
    /// The rule's limit (rate units): the most the clients' wants add up to.
    limit: Units,
    /// Demand reporting: when last reported, and the remainder below one request, in
    /// units·ns (`RATE_SCALE·10⁹` of them make one request).
    reported_at: Nanos,
    carry: u128,
}

impl Resource {
    /// Forgets the names of clients the table dropped (all their grants expired). While
    /// tables are retired this is left to the sweep (`all`), as it looks in every table.
    fn forget_expired(&mut self, all: bool) {
        if self.ids.len() == self.table.len() || !(all || self.retired.is_empty()) {
            return;
        }
        let (table, retired) = (&self.table, &self.retired);
        self.ids.retain(|_, (id, _)| {
            table.target(*id).is_some() || retired.iter().any(|t| t.target(*id).is_some())
        });
    }

    /// Drops the retired tables' expired grants, and the tables left with none.
    fn expire_retired(&mut self, now: Nanos) {
        for t in &mut self.retired {
            t.expire(now);
        }
        self.retired.retain(|t| !t.is_empty());
    }

    /// What the retired tables' clients may still be using.
    fn retired_outstanding(&self) -> Units {
        self.retired
            .iter()
            .fold(0, |sum: Units, t| sum.saturating_add(t.outstanding()))
    }

    /// Every grant that may be in use: the table's and the retired tables'.
    fn outstanding(&self) -> Units {
        self.table
            .outstanding()
            .saturating_add(self.retired_outstanding())
    }

    fn is_empty(&self) -> bool {
        self.table.is_empty() && self.retired.is_empty()
    }

    /// Demand since the last report, in whole requests, for the cluster's demand estimate:
    /// what the live clients want, over the time elapsed.
    fn demand_since(&mut self, now: Nanos) -> u64 {
        let elapsed = now.saturating_sub(self.reported_at);
        self.reported_at = self.reported_at.max(now);
        let wants: u128 = self
            .ids
            .values()
            .map(|&(_, w)| u128::from(w))
            .sum::<u128>()
            .min(u128::from(self.limit));
        let acc = self.carry + wants * u128::from(elapsed);
        let one = u128::from(RATE_SCALE) * NS_PER_S;
        self.carry = acc % one;
        u64::try_from(acc / one).unwrap_or(u64::MAX)
    }
}

/// The leases this node has handed out, per resource. Safe to share between threads (one
/// lock: lease requests come once per client per refresh interval, not per request).
/// [`Leases::default`] hands leases out with [`LeaseConfig::default`].
#[derive(Default)]
pub struct Leases {
    config: LeaseConfig,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    resources: HashMap<ResourceKey, Resource>,
    last_sweep: Nanos,
}

impl fmt::Debug for Leases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leases")
            .field("config", &self.config)
            .field("resources", &self.inner.lock().resources.len())
            .finish()
    }
}

impl Leases {
    /// No lease yet; leases handed out under `config`.
    ///
    /// # Errors
    /// [`LeaseConfigError`] for a zero lease or a refresh not shorter than the lease.
    pub fn new(config: LeaseConfig) -> Result<Self, LeaseConfigError> {
        if config.lease.is_zero() || sluice_limits::clock::nanos(config.lease) == 0 {
            return Err(LeaseConfigError::ZeroLease);
        }
        if config.refresh >= config.lease {
            return Err(LeaseConfigError::RefreshNotBeforeExpiry {
                lease: config.lease,
                refresh: config.refresh,
            });
        }
        Ok(Self {
            config,
            inner: Mutex::default(),
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Grants `request` at `now` against the capacity the engine gives its resource
    /// ([`Capacity::of`]), reporting the leased demand of a cluster rule to the cluster.
    ///
    /// # Errors
    /// [`LeaseError`]; nothing changes then.
    pub fn acquire(
        &self,
        engine: &Engine,
        now: Nanos,
        request: &LeaseRequest,
    ) -> Result<LeaseGrant, LeaseError> {
        check_request(request)?;
        let (capacity, terms) = Capacity::of_rule(engine, &request.domain, &request.descriptor)?;
        let grant = self.acquire_under(now, capacity, terms, request)?;
        if let (
            Capacity::Limited {
                cluster: Some(c), ..
            },
            Some(shares),
        ) = (capacity, engine.shares())
        {
            let key = ResourceKey::new(&request.domain, &request.descriptor);
            let hits = self
                .inner
                .lock()
                .resources
                .get_mut(&key)
                .map_or(0, |r| r.demand_since(now));
            shares.on_hit(c.key, c.count, c.period, hits);
        }
        Ok(grant)
    }

    /// The pure core of [`Leases::acquire`] under the node's terms: grants `request` at
    /// `now` when its resource has `capacity`. As [`Leases::acquire_under`] with a rule
    /// that sets no `leases`.
    ///
    /// # Errors
    /// [`LeaseError`] for a malformed request or a full table; nothing changes then.
    pub fn acquire_with(
        &self,
        now: Nanos,
        capacity: Capacity,
        request: &LeaseRequest,
    ) -> Result<LeaseGrant, LeaseError> {
        self.acquire_under(now, capacity, RuleLeases::default(), request)
    }

    /// Grants `request` at `now` when its resource has `capacity` and its rule's `leases`
    /// are `rule` ([`LeaseConfig::terms`]). The client's demand is recorded, the capacity
    /// re-divided among the live clients with the terms' policy, and the client granted
    /// `min(its part, capacity − what the others may still be using)` until `now + lease`.
    ///
    /// When the terms differ from those the resource's table was made with (a reload
    /// changed the rule), the table is retired and a new one started; while the retired
    /// grants last, the new table divides the capacity less what they may still be using
    /// (the retired grants only expire, so that part only grows: the seed 000 §7 bound holds
    /// for old and new grants together).
    ///
    /// # Errors
    /// [`LeaseError`] for a malformed request or a full table; nothing changes then.
    pub fn acquire_under(
        &self,
        now: Nanos,
        capacity: Capacity,
        rule: RuleLeases,
        request: &LeaseRequest,
    ) -> Result<LeaseGrant, LeaseError> {
        check_request(request)?;
        let terms = self.config.terms(&rule);
        let wants = units_of(request.wants);
        let (limit, share, cluster) = match capacity {
            Capacity::Unlimited => {
                let expires_at = now.saturating_add(terms.lease);
                return Ok(LeaseGrant {
                    rate_units: wants,
                    expires_at,
                    expires_in: terms.lease,
                    refresh_in: terms.refresh,
                    limit_per_second: None,
                    share_per_second: None,
                    policy: terms.policy,
                    clients: 1,
                });
            }
            Capacity::Limited {
                limit,
                share,
                cluster,
            } => (limit, share, cluster),
        };
        // Nobody can use more than the whole limit: a client asking for more (1e308 once
        // moved every node's share to the one it asked) is taken to ask for the limit, here
        // and in the demand this node reports to the cluster.
        let wants = wants.min(limit);
        let mut inner = self.inner.lock();
        self.sweep_if_due(&mut inner, now);
        let key = ResourceKey::new(&request.domain, &request.descriptor);
        if !inner.resources.contains_key(&key) {
            if inner.resources.len() >= self.config.max_resources {
                return Err(LeaseError::TooManyResources(self.config.max_resources));
            }
            let table = self.table(terms, share, now)?;
            inner.resources.insert(
                key.clone(),
                Resource {
                    table,
                    retired: Vec::new(),
                    ids: HashMap::default(),
                    next_id: 0,
                    cluster,
                    limit,
                    reported_at: now,
                    carry: 0,
                },
            );
        }
        let Some(r) = inner.resources.get_mut(&key) else {
            return Err(LeaseError::TooManyResources(self.config.max_resources));
        };
        r.cluster = cluster;
        r.limit = limit;
        r.expire_retired(now);
        let changed = r.table.policy() != terms.policy || r.table.lease_duration() != terms.lease;
        if changed && r.retired.len() < MAX_RETIRED {
            let fresh = self.table(terms, 0, now)?;
            let old = std::mem::replace(&mut r.table, fresh);
            r.retired.push(old);
            r.forget_expired(true);
        }
        // Expire first: a departed client's name must not count against the table's size.
        // The retired grants are held against the capacity until they expire.
        r.table
            .set_share(now, share.saturating_sub(r.retired_outstanding()));
        r.forget_expired(false);
        let id = match r.ids.get_mut(request.client_id.as_str()) {
            Some((id, w)) => {
                *w = wants;
                *id
            }
            None => {
                if r.ids.len() >= self.config.max_clients {
                    return Err(LeaseError::TooManyClients(self.config.max_clients));
                }
                let id = r.next_id;
                r.next_id += 1;
                r.ids.insert(request.client_id.as_str().into(), (id, wants));
                id
            }
        };
        let grant = r.table.request(now, id, wants);
        let clients = r.table.len();
        // The table's terms: the requested ones unless too many tables are retired already.
        let policy = r.table.policy();
        let refresh_in = self.config.refresh_for(r.table.lease_duration());
        Ok(LeaseGrant {
            rate_units: grant.rate,
            expires_at: grant.expires_at,
            expires_in: grant.expires_at.saturating_sub(now),
            refresh_in,
            limit_per_second: Some(per_second(limit)),
            share_per_second: Some(per_second(share)),
            policy,
            clients,
        })
    }

    /// A new table under `terms` (a lease of at least 1 ns: it cannot fail; if it did,
    /// refusing the request is safe).
    fn table(
        &self,
        terms: LeaseTerms,
        share: Units,
        now: Nanos,
    ) -> Result<ClientLeases, LeaseError> {
        ClientLeases::new(terms.policy, terms.lease.max(1), share, now)
            .map_err(|_| LeaseError::TooManyResources(self.config.max_resources))
    }

    /// The client says it no longer uses its lease on the resource: its capacity goes to
    /// the others at once. Returns whether it held one.
    pub fn release(&self, now: Nanos, domain: &str, descriptor: &Descriptor, client: &str) -> bool {
        let mut inner = self.inner.lock();
        let key = ResourceKey::new(domain, descriptor);
        let Some(r) = inner.resources.get_mut(&key) else {
            return false;
        };
        let Some((id, _)) = r.ids.remove(client) else {
            return false;
        };
        r.table.release(now, id);
        for t in &mut r.retired {
            t.release(now, id);
        }
        r.expire_retired(now);
        r.forget_expired(false);
        if r.is_empty() {
            inner.resources.remove(&key);
        }
        true
    }

    /// Periodic work (the daemon calls it every cluster cycle or so): drops expired leases
    /// and resources without any, and reports every cluster resource's leased demand since
    /// the last report to the cluster (as hits, which is how the cluster measures demand).
    pub fn tick(&self, engine: &Engine, now: Nanos) {
        let mut inner = self.inner.lock();
        self.sweep(&mut inner, now);
        if let Some(shares) = engine.shares() {
            for r in inner.resources.values_mut() {
                if let Some(c) = r.cluster {
                    let hits = r.demand_since(now);
                    shares.on_hit(c.key, c.count, c.period, hits);
                }
            }
        }
    }

    /// Rates of the unexpired grants of a resource, as of the last call: what its clients
    /// may be using (the sum the guarantee bounds). 0 for a resource without leases.
    #[must_use]
    pub fn outstanding(&self, domain: &str, descriptor: &Descriptor) -> Units {
        self.inner
            .lock()
            .resources
            .get(&ResourceKey::new(domain, descriptor))
            .map_or(0, Resource::outstanding)
    }

    /// Clients holding a lease on the resource, as of the last call.
    #[must_use]
    pub fn clients(&self, domain: &str, descriptor: &Descriptor) -> usize {
        self.inner
            .lock()
            .resources
            .get(&ResourceKey::new(domain, descriptor))
            .map_or(0, |r| r.table.len())
    }

    /// Resources with at least one client, as of the last sweep.
    #[must_use]
    pub fn resources(&self) -> usize {
        self.inner.lock().resources.len()
    }

    /// Sweeps when a lease duration has passed since the last sweep: bounds the memory of
    /// resources whose clients all left without a node-wide timer.
    fn sweep_if_due(&self, inner: &mut Inner, now: Nanos) {
        let lease = sluice_limits::clock::nanos(self.config.lease);
        if now >= inner.last_sweep.saturating_add(lease) {
            self.sweep(inner, now);
        }
    }

    #[allow(clippy::unused_self)] // a method, so every lease operation reads alike
    fn sweep(&self, inner: &mut Inner, now: Nanos) {
        inner.last_sweep = inner.last_sweep.max(now);
        inner.resources.retain(|_, r| {
            r.table.expire(now);
            r.expire_retired(now);
            r.forget_expired(true);
            !r.is_empty()
        });
    }
}

/// Calls [`Leases::tick`] every `every` on `clock` until `done` completes: the daemon's
/// task, so expired leases are dropped and cluster rules see their leased demand smoothly
/// (not only when a client refreshes).
pub async fn tick_every(
    leases: Arc<Leases>,
    engine: Arc<Engine>,
    clock: impl Clock,
    every: Duration,
    done: impl Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(done);
    loop {
        tokio::select! {
            () = &mut done => return,
            _ = tick.tick() => leases.tick(&engine, clock.now()),
        }
    }
}

fn check_request(request: &LeaseRequest) -> Result<(), LeaseError> {
    if request.domain.is_empty() {
        return Err(LeaseError::EmptyDomain);
    }
    if request.descriptor.entries.is_empty() {
        return Err(LeaseError::NoEntries);
    }
    if request.descriptor.limit.is_some() {
        return Err(LeaseError::Override);
    }
    if request.client_id.is_empty() || request.client_id.len() > MAX_CLIENT_ID {
        return Err(LeaseError::BadClientId);
    }
    if !request.wants.is_finite() || request.wants < 0.0 {
        return Err(LeaseError::BadWants(request.wants));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::Config;

    const S: Nanos = 1_000_000_000;

    fn ask(client: &str, wants: f64) -> LeaseRequest {
        LeaseRequest {
            domain: "d".into(),
            descriptor: Descriptor::new([("k", "v")]),
            client_id: client.into(),
            wants,
        }
    }

    #[test]
    fn rates_convert_exactly() {
        assert_eq!(rate_units(1_000, S), 1_000 * RATE_SCALE);
        assert_eq!(rate_units(60, 60 * S), RATE_SCALE);
        assert_eq!(units_of(300.0), 300 * RATE_SCALE);
        assert!((per_second(700 * RATE_SCALE) - 700.0).abs() < 1e-9);
    }

    #[test]
    fn capacity_follows_the_rule() {
        let engine = Engine::new(
            Config::from_yaml(
                "t.yaml",
                "
domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 600 }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
",
            )
            .unwrap(),
        );
        let cap = |k: &str| Capacity::of(&engine, "d", &Descriptor::new([(k, "x")]));
        assert_eq!(cap("k").unwrap(), Capacity::fixed(10 * RATE_SCALE));
        assert_eq!(
            cap("blocked").unwrap(),
            Capacity::Limited {
                limit: 0,
                share: 0,
                cluster: None
            }
        );
        assert_eq!(cap("free").unwrap(), Capacity::Unlimited);
        assert!(matches!(cap("other"), Err(LeaseError::NoRule(_))));
        assert!(matches!(
            Capacity::of(&engine, "e", &Descriptor::new([("k", "x")])),
            Err(LeaseError::UnknownDomain(_))
        ));
    }

    #[test]
    fn max_min_then_expiry_hands_the_capacity_over() {
        let leases = Leases::new(LeaseConfig::with_lease(Duration::from_secs(1))).unwrap();
        let cap = Capacity::fixed(units_of(1_000.0));
        let a = leases.acquire_with(0, cap, &ask("a", 300.0)).unwrap();
        let b = leases.acquire_with(1, cap, &ask("b", 900.0)).unwrap();
        assert_eq!(a.rate_units, units_of(300.0));
        assert_eq!(b.rate_units, units_of(700.0));
        assert_eq!(b.clients, 2);
        // `a` stops refreshing: once its lease is over, `b` gets what it wants.
        let b = leases.acquire_with(S + 1, cap, &ask("b", 900.0)).unwrap();
        assert_eq!(b.rate_units, units_of(900.0));
        assert_eq!(b.clients, 1);
    }

    /// Issue "Central backends", bounded inputs: `wants: 1e308` moved a cluster rule's
    /// whole limit to the node asked. A want is taken as at most the limit, in the grant and
    /// in the demand the node reports (over one second, at most the limit's requests).
    #[test]
    fn wants_above_the_limit_count_as_the_limit() {
        let leases = Leases::new(LeaseConfig::with_lease(Duration::from_secs(10))).unwrap();
        let cap = Capacity::fixed(units_of(1_000.0));
        let g = leases.acquire_with(0, cap, &ask("greedy", 1e308)).unwrap();
        assert_eq!(g.rate_units, units_of(1_000.0));
        let g = leases.acquire_with(0, cap, &ask("other", 1e308)).unwrap();
        assert_eq!(g.rate_units, 0, "the limit is already leased");
        let key = ResourceKey::new("d", &Descriptor::new([("k", "v")]));
        let demand = leases
            .inner
            .lock()
            .resources
            .get_mut(&key)
            .map(|r| r.demand_since(S))
            .unwrap();
        assert_eq!(
            demand, 1_000,
            "two greedy clients report the limit, not 2e308"
        );
    }

    #[test]
    fn release_frees_at_once_and_bad_requests_change_nothing() {
        let leases = Leases::default();
        let cap = Capacity::fixed(units_of(100.0));
        leases.acquire_with(0, cap, &ask("a", 100.0)).unwrap();
        assert_eq!(
            leases
                .acquire_with(0, cap, &ask("b", 100.0))
                .unwrap()
                .rate_units,
            0
        );
        assert!(leases.release(0, "d", &Descriptor::new([("k", "v")]), "a"));
        assert_eq!(
            leases
                .acquire_with(0, cap, &ask("b", 100.0))
                .unwrap()
                .rate_units,
            units_of(100.0)
        );
        for bad in [ask("", 1.0), ask("a", -1.0), ask("a", f64::NAN)] {
            assert!(leases.acquire_with(0, cap, &bad).is_err());
        }
        assert_eq!(leases.clients("d", &Descriptor::new([("k", "v")])), 1);
    }

    #[test]
    fn terms_come_from_the_rule_else_the_node() {
        let node = LeaseConfig::default();
        assert_eq!(
            node.terms(&RuleLeases::default()),
            LeaseTerms {
                policy: AllocationPolicy::MaxMin,
                lease: 10 * S,
                refresh: 3 * S
            }
        );
        let rule = RuleLeases {
            policy: Some(AllocationPolicy::Proportional),
            duration: Some(Duration::from_secs(2)),
        };
        assert_eq!(
            node.terms(&rule),
            LeaseTerms {
                policy: AllocationPolicy::Proportional,
                lease: 2 * S,
                refresh: 600_000_000
            }
        );
    }

    /// A reload changes a resource's policy while grants are out: they stay valid (no
    /// recall), the new table divides only what they leave, and the new policy's parts are
    /// reached once they have expired.
    #[test]
    fn changed_terms_retire_the_table_without_recalling_grants() {
        let leases = Leases::new(LeaseConfig::with_lease(Duration::from_secs(1))).unwrap();
        let cap = Capacity::fixed(units_of(60.0));
        let prop = RuleLeases {
            policy: Some(AllocationPolicy::Proportional),
            duration: Some(Duration::from_secs(2)),
        };
        let max_min = RuleLeases::default();
        let d = Descriptor::new([("k", "v")]);
        // Max-min: 10 and 50 of 60.
        let a = leases
            .acquire_under(0, cap, max_min, &ask("a", 10.0))
            .unwrap();
        let b = leases
            .acquire_under(0, cap, max_min, &ask("b", 50.0))
            .unwrap();
        assert_eq!(
            (a.rate_units, b.rate_units),
            (units_of(10.0), units_of(50.0))
        );
        // Proportional from now on: `c` arrives wanting 60; a and b may use 60 until 1 s.
        let c = leases
            .acquire_under(S / 2, cap, prop, &ask("c", 60.0))
            .unwrap();
        assert_eq!(c.policy, AllocationPolicy::Proportional);
        assert_eq!(c.expires_in, 2 * S);
        assert_eq!(c.rate_units, 0, "nothing is left while the old grants last");
        assert_eq!(leases.outstanding("d", &d), units_of(60.0));
        let a = leases
            .acquire_under(S / 2, cap, prop, &ask("a", 10.0))
            .unwrap();
        let b = leases
            .acquire_under(S / 2, cap, prop, &ask("b", 50.0))
            .unwrap();
        assert!(leases.outstanding("d", &d) <= units_of(60.0));
        assert_eq!(a.rate_units + b.rate_units, 0);
        // The old grants have expired: Alg. 1 on 10/50/60 of 60 is 5/25/30.
        let t = S + 1;
        let got: Vec<Units> = [("a", 10.0), ("b", 50.0), ("c", 60.0)]
            .iter()
            .map(|(n, w)| {
                leases
                    .acquire_under(t, cap, prop, &ask(n, *w))
                    .unwrap()
                    .rate_units
            })
            .collect();
        assert_eq!(got, [5, 25, 30].map(|r| units_of(f64::from(r))));
        assert_eq!(leases.clients("d", &d), 3);
        // A released client leaves the retired tables too.
        assert!(leases.release(t, "d", &d, "a"));
        assert!(!leases.release(t, "d", &d, "a"));
    }

    #[test]
    fn retired_tables_are_bounded() {
        let leases = Leases::new(LeaseConfig::with_lease(Duration::from_secs(1))).unwrap();
        let cap = Capacity::fixed(units_of(100.0));
        let terms = |ms: u64| RuleLeases {
            policy: None,
            duration: Some(Duration::from_millis(ms)),
        };
        for ms in 1..=u64::try_from(MAX_RETIRED).unwrap() + 1 {
            let g = leases
                .acquire_under(0, cap, terms(ms * 1_000), &ask("a", 1.0))
                .unwrap();
            assert_eq!(g.expires_in, ms * S);
        }
        // One change too many: the current terms stay until a retired table drains.
        let g = leases
            .acquire_under(0, cap, terms(100), &ask("a", 1.0))
            .unwrap();
        assert_eq!(g.expires_in, 5 * S);
        let g = leases
            .acquire_under(S, cap, terms(100), &ask("a", 1.0))
            .unwrap();
        assert_eq!(g.expires_in, S / 10, "the 1 s table drained at 1 s");
    }

    #[test]
    fn tables_are_bounded() {
        let leases = Leases::new(LeaseConfig {
            max_clients: 2,
            max_resources: 1,
            ..LeaseConfig::default()
        })
        .unwrap();
        let cap = Capacity::fixed(10);
        leases.acquire_with(0, cap, &ask("a", 1.0)).unwrap();
        leases.acquire_with(0, cap, &ask("b", 1.0)).unwrap();
        assert_eq!(
            leases.acquire_with(0, cap, &ask("c", 1.0)),
            Err(LeaseError::TooManyClients(2))
        );
        let mut other = ask("a", 1.0);
        other.descriptor = Descriptor::new([("k", "w")]);
        assert_eq!(
            leases.acquire_with(0, cap, &other),
            Err(LeaseError::TooManyResources(1))
        );
        // Once every lease is over the table is swept and a new resource fits.
        leases.tick(&Engine::new(Config::default()), 11 * S);
        assert_eq!(leases.resources(), 0);
        assert!(leases.acquire_with(11 * S, cap, &other).is_ok());
    }
}
