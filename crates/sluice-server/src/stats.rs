//! Per-rule decision counters, named as envoyproxy/ratelimit names its statistics
//! (`DOMAIN.key_value.key2`: `total_hits`, `over_limit`, `within_limit`, `shadow_mode`), so
//! dashboards built for it keep working. Counters survive configuration reloads: a rule with
//! the same domain and descriptor path keeps its counters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Counters of one rule. Hits count `hits_addend` (like envoyproxy/ratelimit); decisions
/// count descriptor statuses.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Hits asked for.
    pub total_hits: AtomicU64,
    /// Hits refused (answered `OVER_LIMIT`).
    pub over_limit: AtomicU64,
    /// Hits admitted.
    pub within_limit: AtomicU64,
    /// Hits over the limit but answered `OK` because the rule is in shadow mode.
    pub shadow_mode: AtomicU64,
    /// Descriptor decisions answered `OK` (shadowed ones included).
    pub decisions_ok: AtomicU64,
    /// Descriptor decisions answered `OVER_LIMIT`.
    pub decisions_over_limit: AtomicU64,
}

/// One decision's outcome, for [`RuleStats::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted.
    Within,
    /// Refused.
    Over,
    /// Refused by the count, answered `OK` (shadow mode).
    Shadow,
}

impl RuleStats {
    /// Counts one descriptor decision of `hits` hits.
    pub fn record(&self, outcome: Outcome, hits: u64) {
        // Relaxed: independent counters, read for reporting only.
        self.total_hits.fetch_add(hits, Ordering::Relaxed);
        match outcome {
            Outcome::Within => {
                self.within_limit.fetch_add(hits, Ordering::Relaxed);
                self.decisions_ok.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Over => {
                self.over_limit.fetch_add(hits, Ordering::Relaxed);
                self.decisions_over_limit.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Shadow => {
                self.shadow_mode.fetch_add(hits, Ordering::Relaxed);
                self.decisions_ok.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counters' current values.
    #[must_use]
    pub fn snapshot(&self) -> RuleCounts {
        RuleCounts {
            total_hits: self.total_hits.load(Ordering::Relaxed),
            over_limit: self.over_limit.load(Ordering::Relaxed),
            within_limit: self.within_limit.load(Ordering::Relaxed),
            shadow_mode: self.shadow_mode.load(Ordering::Relaxed),
            decisions_ok: self.decisions_ok.load(Ordering::Relaxed),
            decisions_over_limit: self.decisions_over_limit.load(Ordering::Relaxed),
        }
    }
}

/// A copy of a rule's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleCounts {
    /// See [`RuleStats::total_hits`].
    pub total_hits: u64,
    /// See [`RuleStats::over_limit`].
    pub over_limit: u64,
    /// See [`RuleStats::within_limit`].
    pub within_limit: u64,
    /// See [`RuleStats::shadow_mode`].
    pub shadow_mode: u64,
    /// See [`RuleStats::decisions_ok`].
    pub decisions_ok: u64,
    /// See [`RuleStats::decisions_over_limit`].
    pub decisions_over_limit: u64,
}

/// The counters of every rule ever configured, by `(domain, descriptor path)`.
#[derive(Debug, Default)]
pub struct StatsRegistry {
    rules: Mutex<BTreeMap<(String, String), Arc<RuleStats>>>,
}

impl StatsRegistry {
    /// The counters of `domain`'s rule at `path`, created on first use.
    pub fn rule(&self, domain: &str, path: &str) -> Arc<RuleStats> {
        self.rules
            .lock()
            .entry((domain.to_owned(), path.to_owned()))
            .or_default()
            .clone()
    }

    /// Every rule's counters: `(domain, path, counts)`, sorted.
    #[must_use]
    pub fn snapshot(&self) -> Vec<(String, String, RuleCounts)> {
        self.rules
            .lock()
            .iter()
            .map(|((d, p), s)| (d.clone(), p.clone(), s.snapshot()))
            .collect()
    }
}
