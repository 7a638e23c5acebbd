//! Client allocation inside a node (seed 000 §7, Alg. 1 and 2), with capacity leases.
//!
//! A node's share `x_i` of the global limit is divided among the clients it serves. Each
//! client reports what it wants and receives a *lease*: a rate it may use until an expiry,
//! refreshed by asking again (the Doorman style of capacity leasing). Two division rules:
//!
//! - [`allocate_proportional`] (Alg. 1): everyone gets what it asked when that fits;
//!   otherwise everyone is throttled by the same ratio, `x·w_j/Σw`.
//! - [`allocate_max_min`] (Alg. 2, water-filling): small demands are met in full, and the
//!   largest ones are cut to a common level `l`.
//!
//! Rates are integer [`Units`] (choose a fine unit, e.g. milli-requests per period), which
//! makes every sum exact: an allocation never exceeds the share by even one unit.
//!
//! ```
//! use sluice_coord::allocation::{allocate_max_min, allocate_proportional};
//! use sluice_coord::allocation::{AllocationPolicy, ClientLeases};
//!
//! assert_eq!(allocate_proportional(60, &[10, 50, 60]), vec![5, 25, 30]);
//! assert_eq!(allocate_max_min(60, &[10, 50, 60]), vec![10, 25, 25]);
//!
//! const LEASE: u64 = 10_000_000_000; // 10 s
//! let mut leases = ClientLeases::new(AllocationPolicy::MaxMin, LEASE, 100, 0).unwrap();
//! assert_eq!(leases.request(0, 1, 80).rate, 80);
//! // Client 1 holds 80 until its lease expires, so client 2 gets the remaining 20 now...
//! assert_eq!(leases.request(1, 2, 80).rate, 20);
//! // ...and its fair 50 once client 1 has refreshed down to 50 and the old lease is gone.
//! assert_eq!(leases.request(2, 1, 80).rate, 50);
//! assert_eq!(leases.request(LEASE + 1, 2, 80).rate, 50);
//! ```

use std::collections::BTreeMap;

use thiserror::Error;

/// Nanoseconds since a caller-chosen epoch (the same unit as `sluice_limits::Nanos`).
type Nanos = u64;

/// An integer amount of rate. Integer units make `Σ grants ≤ share` exact.
pub type Units = u64;

/// A client's identifier, chosen by the caller.
pub type ClientId = u64;

/// Converts a non-negative real rate to [`Units`] by rounding down (so totals never grow);
/// NaN and negative values give 0, values too large saturate.
#[must_use]
pub fn units_floor(rate: f64) -> Units {
    if rate.is_nan() || rate <= 0.0 {
        0
    } else {
        // `as` saturates for large finite values and +inf.
        rate.floor() as Units
    }
}

/// Seed 000 Alg. 1: keeps the throttled ratio uniform.
///
/// If `Σ wants ≤ share` everyone gets what it wants. Otherwise client `j` gets
/// `share·w_j/Σw` rounded to a neighbouring integer: the floors, plus one unit to each of the
/// `share − Σ floors` clients with the largest fractional parts (ties to the lower index), so
/// the total is exactly `share` and nobody gets more than it asked.
#[must_use]
pub fn allocate_proportional(share: Units, wants: &[Units]) -> Vec<Units> {
    let total: u128 = wants.iter().map(|&w| u128::from(w)).sum();
    if total <= u128::from(share) {
        return wants.to_vec();
    }
    let mut out = Vec::with_capacity(wants.len());
    let mut remainders = Vec::with_capacity(wants.len());
    let mut given: u128 = 0;
    for (j, &w) in wants.iter().enumerate() {
        let num = u128::from(share) * u128::from(w);
        // num / total < w because share < total, so it fits in Units.
        let floor = num / total;
        given += floor;
        out.push(Units::try_from(floor).unwrap_or(w));
        remainders.push((num % total, j));
    }
    // Σ remainders = (share − Σ floors)·total and each remainder < total, so at least
    // `leftover` clients have a positive remainder: the extra unit goes only to them.
    let leftover = usize::try_from(u128::from(share) - given).unwrap_or(usize::MAX);
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, j) in remainders.iter().take(leftover) {
        out[j] += 1;
    }
    out
}

/// Seed 000 Alg. 2: max-min fair division (water-filling).
///
/// If `Σ wants ≤ share` everyone gets what it wants. Otherwise there is a level `l` such that
/// clients wanting at most `l` get their want and every other client gets `l` or `l + 1`
/// (the indivisible leftover units go to the largest wants); the total is exactly `share`.
/// This is max-min fairness in whole units: a client that got less than it asked has at
/// least everyone else's allocation minus one unit, so it can gain only at the expense of a
/// client that has no more than it would then have.
///
/// (The paper's line 17 assigns `l` to every client; the figure it illustrates, and the
/// "never more than asked" rule, cap each client at its own request, as done here.)
#[must_use]
pub fn allocate_max_min(share: Units, wants: &[Units]) -> Vec<Units> {
    let total: u128 = wants.iter().map(|&w| u128::from(w)).sum();
    if total <= u128::from(share) {
        return wants.to_vec();
    }
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&j| (wants[j], j));
    let mut out = vec![0; wants.len()];
    let mut remaining = share;
    for (pos, &j) in order.iter().enumerate() {
        let left = (wants.len() - pos) as Units;
        let level = remaining / left;
        if wants[j] <= level {
            out[j] = wants[j];
            remaining -= wants[j];
        } else {
            // Everyone from here on wants more than the level: fill them all to it, and hand
            // the `remaining mod left` indivisible units to the largest wants (each wants at
            // least level + 1, so nobody exceeds its request).
            let extra = remaining % left;
            for (k, &i) in order[pos..].iter().rev().enumerate() {
                out[i] = level + Units::from((k as Units) < extra);
            }
            break;
        }
    }
    out
}

/// How a node divides its share among its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationPolicy {
    /// Seed 000 Alg. 1, [`allocate_proportional`].
    Proportional,
    /// Seed 000 Alg. 2, [`allocate_max_min`].
    MaxMin,
}

impl AllocationPolicy {
    /// Divides `share` among `wants` with this policy.
    #[must_use]
    pub fn allocate(self, share: Units, wants: &[Units]) -> Vec<Units> {
        match self {
            Self::Proportional => allocate_proportional(share, wants),
            Self::MaxMin => allocate_max_min(share, wants),
        }
    }
}

/// Bad lease-table parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum AllocationError {
    /// A lease must last a positive time.
    #[error("lease duration must be positive")]
    ZeroLeaseDuration,
}

/// What a client is told: it may use up to `rate` until `expires_at` (exclusive), and
/// should ask again before then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The granted rate.
    pub rate: Units,
    /// The first instant at which the grant is no longer valid.
    pub expires_at: Nanos,
}

/// One client's entry.
#[derive(Debug, Clone)]
struct Client {
    wants: Units,
    /// Its current fair part of the share under the policy.
    target: Units,
    /// Unexpired grants it may still be using, oldest first; the last is the current one.
    /// A newer grant does not recall an older one (the client may not have received it),
    /// so an older grant is kept until it expires unless a newer one is at least as large.
    /// Hence rates strictly decrease along the list and the commitment is the first.
    leases: Vec<Grant>,
}

impl Client {
    fn committed(&self) -> Units {
        self.leases.first().map_or(0, |g| g.rate)
    }
}

/// The leases a node has handed out to its clients, and the share they divide.
///
/// **Guarantees** (checked by `tests/allocation_props.rs`). Let `L` be the lease duration and
/// a client's *commitment* the largest rate among its unexpired grants (it may use any of
/// them until each expires: a grant cannot be recalled, a newer smaller one may not have
/// reached it).
/// 1. At every instant `τ`, `Σ commitments ≤ max{share in effect at σ : σ ∈ (τ − L, τ]}`.
///    In particular the total never exceeds the current share once `L` has passed since the
///    last decrease, and never exceeds it at all while the share does not decrease.
/// 2. Right after [`set_share`](Self::set_share), the *targets* (what clients will be
///    granted when they refresh) add up to at most the new share; the excess of old grants
///    over a decreased share drains as they expire, within `L`.
/// 3. No grant exceeds what the client asked, nor its target under the policy; once every
///    grant older than the last change of share or demands has expired (at most `L` later), a
///    refreshing client receives exactly its target.
/// 4. A client whose grants have all expired is forgotten: its demand no longer counts and
///    its capacity goes to the others.
///
/// Proof of 1: take, among the clients committing a positive rate at `τ`, the one whose
/// committing grant was issued last, at `σ* > τ − L`. Every other committing grant was
/// issued before and is unexpired at `τ`, so it was counted when that grant was cut to the
/// headroom `share(σ*) − Σ other commitments at σ*`.
#[derive(Debug, Clone)]
pub struct ClientLeases {
    policy: AllocationPolicy,
    lease: Nanos,
    share: Units,
    last_now: Nanos,
    clients: BTreeMap<ClientId, Client>,
}

impl ClientLeases {
    /// An empty table dividing `share` with `policy`, granting leases of `lease` ns.
    pub fn new(
        policy: AllocationPolicy,
        lease: Nanos,
        share: Units,
        now: Nanos,
    ) -> Result<Self, AllocationError> {
        if lease == 0 {
            return Err(AllocationError::ZeroLeaseDuration);
        }
        Ok(Self {
            policy,
            lease,
            share,
            last_now: now,
            clients: BTreeMap::new(),
        })
    }

    /// The division rule.
    #[must_use]
    pub fn policy(&self) -> AllocationPolicy {
        self.policy
    }

    /// The lease duration `L`.
    #[must_use]
    pub fn lease_duration(&self) -> Nanos {
        self.lease
    }

    /// The current share.
    #[must_use]
    pub fn share(&self) -> Units {
        self.share
    }

    /// Number of live clients (with an unexpired grant, as of the last call).
    #[must_use]
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether no client is live.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// A live client's target: what it would be granted now if nothing else were held.
    #[must_use]
    pub fn target(&self, client: ClientId) -> Option<Units> {
        self.clients.get(&client).map(|c| c.target)
    }

    /// Sum of the targets (at most the share).
    #[must_use]
    pub fn total_target(&self) -> Units {
        self.clients.values().map(|c| c.target).sum()
    }

    /// Sum of the commitments as of the last call: the rate clients may be using.
    #[must_use]
    pub fn outstanding(&self) -> Units {
        self.clients.values().map(Client::committed).sum()
    }

    /// A client asks for `wants` at `now`: records the demand, re-divides the share, and
    /// grants `min(target, share − Σ others' commitments)` until `now + L`.
    pub fn request(&mut self, now: Nanos, client: ClientId, wants: Units) -> Grant {
        let now = self.observe(now);
        self.prune(now);
        // A refresh with unchanged demand (the common case) leaves the targets as they are.
        let changed = match self.clients.get_mut(&client) {
            Some(c) => std::mem::replace(&mut c.wants, wants) != wants,
            None => {
                let fresh = Client {
                    wants,
                    target: 0,
                    leases: Vec::new(),
                };
                self.clients.insert(client, fresh);
                true
            }
        };
        if changed {
            self.redivide();
        }
        let others: u128 = self
            .clients
            .iter()
            .filter(|(id, _)| **id != client)
            .map(|(_, c)| u128::from(c.committed()))
            .sum();
        let headroom = u128::from(self.share).saturating_sub(others);
        let entry = self.clients.get_mut(&client);
        let Some(entry) = entry else {
            // Inserted above; an empty grant keeps this path panic-free.
            return Grant {
                rate: 0,
                expires_at: now,
            };
        };
        let rate = Units::try_from(u128::from(entry.target).min(headroom)).unwrap_or(0);
        let grant = Grant {
            rate,
            expires_at: now.saturating_add(self.lease),
        };
        // Grants issued later expire no earlier, so older ones no larger are covered by it.
        entry.leases.retain(|g| g.rate > rate);
        entry.leases.push(grant);
        grant
    }

    /// The client says it stopped using its grants: forget it and re-divide.
    pub fn release(&mut self, now: Nanos, client: ClientId) {
        let now = self.observe(now);
        self.prune(now);
        if self.clients.remove(&client).is_some() {
            self.redivide();
        }
    }

    /// Drops grants expired by `now` and clients with none left, re-dividing the share.
    pub fn expire(&mut self, now: Nanos) {
        let now = self.observe(now);
        self.prune(now);
    }

    /// The node's share changed (the share law moved it): re-divide the targets. Grants
    /// already handed out stay valid until they expire (guarantee 1).
    pub fn set_share(&mut self, now: Nanos, share: Units) {
        let now = self.observe(now);
        self.prune(now);
        if share != self.share {
            self.share = share;
            self.redivide();
        }
    }

    fn observe(&mut self, now: Nanos) -> Nanos {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    fn prune(&mut self, now: Nanos) {
        let before = self.clients.len();
        for c in self.clients.values_mut() {
            c.leases.retain(|g| g.expires_at > now);
        }
        self.clients.retain(|_, c| !c.leases.is_empty());
        if self.clients.len() != before {
            self.redivide();
        }
    }

    fn redivide(&mut self) {
        let wants: Vec<Units> = self.clients.values().map(|c| c.wants).collect();
        let targets = self.policy.allocate(self.share, &wants);
        for (c, t) in self.clients.values_mut().zip(targets) {
            c.target = t;
        }
    }
}
