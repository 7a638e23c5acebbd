//! The keys an [`Engine`] holds: forgetting the idle ones, the cap on how many, and what the
//! cap evicted.

use sluice_limits::{KeyedStore, Limit, Nanos};

use super::counter_key::CounterKey;
use super::{Engine, override_rule};
use crate::config::{Config, Policy};

impl Engine {
    /// Forgets every key whose state is, at `now`, that of a key never seen (so no future
    /// decision changes), and every key no rule governs any more; returns how many.
    pub fn retain_idle(&self, now: Nanos) -> usize {
        let config = self.config();
        // A key no rule governs is judged under a 1-per-nanosecond limit: idle as soon as
        // its last activity is past.
        let Ok(fallback) = Limit::from_nanos(1, 1) else {
            return 0;
        };
        self.stores
            .iter()
            .map(|store| store.retain_idle(now, |key| limit_of(&config, key).unwrap_or(fallback)))
            .sum()
    }

    /// Keys evicted to stay under the cap ([`Engine::with_max_keys`]), over every table.
    #[must_use]
    pub fn evictions(&self) -> sluice_limits::Evictions {
        self.stores.iter().map(KeyedStore::evictions).fold(
            sluice_limits::Evictions::default(),
            |a, e| sluice_limits::Evictions {
                idle: a.idle + e.idle,
                forced: a.forced + e.forced,
            },
        )
    }

    /// The cap on keys per algorithm, if any.
    #[must_use]
    pub fn max_keys(&self) -> Option<usize> {
        self.stores.first().and_then(KeyedStore::max_keys)
    }

    /// Number of keys with state.
    #[must_use]
    pub fn len(&self) -> usize {
        self.stores.iter().map(KeyedStore::len).sum()
    }

    /// Whether no key has state.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The limit a stored key is decided under now: its override, or its rule's (`None`: no rule
/// governs it any more, or the rule is unlimited).
pub(super) fn limit_of(config: &Config, key: &CounterKey) -> Option<Limit> {
    if let Some(rate) = key.limit {
        return override_rule(rate).limit;
    }
    config
        .domain(key.domain())
        .and_then(|d| d.rule_for(key.entries()))
        .and_then(|r| match &r.policy {
            Policy::Limited(l) => l.limit,
            Policy::Unlimited => None,
        })
}
