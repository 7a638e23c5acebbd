//! What a leased resource can give on this node ([`Capacity`]): the rule it matches and this
//! node's part of it; and rates in [`RATE_SCALE`] units.

use sluice_coord::allocation::Units;
use sluice_limits::Nanos;

use super::{LeaseError, NS_PER_S, RATE_SCALE};
use crate::config::{Coordination, Limited, Policy, RuleLeases};
use crate::engine::{Descriptor, Engine};
use crate::shares::{SCALE, cluster_key};

/// What a resource can give, as resolved from the engine ([`Capacity::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    /// `unlimited`: every client gets what it asks.
    Unlimited,
    /// A limited rule.
    Limited {
        /// The rule's limit, [`RATE_SCALE`] units.
        limit: Units,
        /// This node's capacity, [`RATE_SCALE`] units (≤ `limit`).
        share: Units,
        /// For a cluster rule: where to report the leased demand.
        cluster: Option<ClusterRef>,
    },
}

/// A cluster rule's key in [`crate::shares::Shares`] and its rate, for reporting demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterRef {
    /// [`cluster_key`] of the descriptor.
    pub key: u64,
    /// Requests per unit.
    pub count: u64,
    /// The unit, nanoseconds.
    pub period: Nanos,
}

impl Capacity {
    /// A limited resource with this capacity (tests, or a caller that knows its share).
    #[must_use]
    pub fn fixed(share: Units) -> Self {
        Self::Limited {
            limit: share,
            share,
            cluster: None,
        }
    }

    /// The capacity of `descriptor` in `domain` on this node now: the rule it matches (as
    /// the engine matches it) and this node's part of it (see the module documentation).
    ///
    /// # Errors
    /// [`LeaseError`] for a malformed request or when no rule governs the descriptor.
    pub fn of(engine: &Engine, domain: &str, descriptor: &Descriptor) -> Result<Self, LeaseError> {
        Self::of_rule(engine, domain, descriptor).map(|(capacity, _)| capacity)
    }

    /// As [`Capacity::of`], with the rule's own `leases` settings (read from the same
    /// configuration, so a reload cannot pair one rule's capacity with another's terms).
    ///
    /// # Errors
    /// As [`Capacity::of`].
    pub fn of_rule(
        engine: &Engine,
        domain: &str,
        descriptor: &Descriptor,
    ) -> Result<(Self, RuleLeases), LeaseError> {
        if domain.is_empty() {
            return Err(LeaseError::EmptyDomain);
        }
        if descriptor.entries.is_empty() {
            return Err(LeaseError::NoEntries);
        }
        if descriptor.limit.is_some() {
            return Err(LeaseError::Override);
        }
        let config = engine.config();
        let Some(d) = config.domain(domain) else {
            return Err(LeaseError::UnknownDomain(domain.to_owned()));
        };
        let entries = || {
            descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
        };
        let Some(rule) = d.rule_for(entries()) else {
            return Err(LeaseError::NoRule(domain.to_owned()));
        };
        let terms = rule.leases;
        let l: &Limited = match &rule.policy {
            Policy::Unlimited => return Ok((Self::Unlimited, terms)),
            Policy::Limited(l) => l,
        };
        let limit = rate_units(u64::from(l.rate.requests_per_unit), l.rate.unit.nanos());
        let Some(rule_limit) = l.limit else {
            // `requests_per_unit: 0`: a block rule.
            let blocked = Self::Limited {
                limit: 0,
                share: 0,
                cluster: None,
            };
            return Ok((blocked, terms));
        };
        let capacity = match (l.coordination, engine.shares()) {
            (Coordination::Cluster, Some(shares)) => {
                let key = l.fairness.key(cluster_key(domain, entries()));
                let units = u128::from(shares.units(key).min(SCALE));
                let share = u128::from(limit) * units / u128::from(SCALE);
                Self::Limited {
                    limit,
                    share: Units::try_from(share).unwrap_or(limit),
                    cluster: Some(ClusterRef {
                        key,
                        count: rule_limit.count(),
                        period: rule_limit.period(),
                    }),
                }
            }
            (Coordination::Redis, _) => match engine.redis() {
                Some(central) => {
                    let fallback = central.fallback_limit(&rule_limit);
                    Self::Limited {
                        limit,
                        share: rate_units(fallback.count(), fallback.period()).min(limit),
                        cluster: None,
                    }
                }
                None => Self::fixed(limit),
            },
            // The token server hands out batches, not a share this node could divide; the
            // whole limit on every node would break the global limit.
            (Coordination::TokenServer, _) => {
                return Err(LeaseError::Unsupported(Coordination::TokenServer.name()));
            }
            (Coordination::Local | Coordination::Cluster, _) => Self::fixed(limit),
        };
        Ok((capacity, terms))
    }
}

/// `count` per `period` ns in [`RATE_SCALE`] units, rounded down (never more than the rule).
#[must_use]
pub fn rate_units(count: u64, period: Nanos) -> Units {
    if period == 0 {
        return 0;
    }
    let v = u128::from(count) * u128::from(RATE_SCALE) * NS_PER_S / u128::from(period);
    Units::try_from(v).unwrap_or(Units::MAX)
}

/// Requests per second for `units` [`RATE_SCALE`] units.
#[must_use]
pub fn per_second(units: Units) -> f64 {
    units as f64 / RATE_SCALE as f64
}

/// [`RATE_SCALE`] units for a rate in requests per second, rounded down.
#[must_use]
pub fn units_of(per_second: f64) -> Units {
    sluice_coord::allocation::units_floor(per_second * RATE_SCALE as f64)
}
