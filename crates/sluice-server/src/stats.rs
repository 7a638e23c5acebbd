//! Per-rule decision counters, named as envoyproxy/ratelimit names its statistics
//! (`DOMAIN.key_value.key2`: `total_hits`, `over_limit`, `within_limit`, `shadow_mode`), so
//! dashboards built for it keep working. Counters survive configuration reloads: a rule with
//! the same domain and descriptor path keeps its counters.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

/// Stripes per rule (a power of two). Every decision adds to its rule's counters; with one
/// shared word per counter the cores deciding at once would pass its cache line back and
/// forth on every request, so each thread adds to its own stripe and a snapshot sums them.
const STRIPES: usize = 8;

/// One stripe: the six counters of [`RuleCounts`], in one cache line.
#[derive(Debug, Default)]
struct Stripe {
    total_hits: AtomicU64,
    over_limit: AtomicU64,
    within_limit: AtomicU64,
    near_limit: AtomicU64,
    shadow_mode: AtomicU64,
    decisions_ok: AtomicU64,
    decisions_over_limit: AtomicU64,
    decisions_shadow: AtomicU64,
}

/// This thread's stripe, handed out round robin on first use.
fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        i.get()
    })
}

/// Counters of one rule. Hits count `hits_addend` (like envoyproxy/ratelimit); decisions
/// count descriptor statuses. Read them with [`RuleStats::snapshot`].
#[derive(Debug, Default)]
pub struct RuleStats {
    stripes: [CachePadded<Stripe>; STRIPES],
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
    /// Counts `hits` admitted above the near-limit threshold (envoyproxy/ratelimit's
    /// `near_limit`).
    pub fn record_near(&self, hits: u64) {
        if hits > 0 {
            let s = &self.stripes[stripe_index()];
            s.near_limit.fetch_add(hits, Ordering::Relaxed);
        }
    }

    pub fn record(&self, outcome: Outcome, hits: u64) {
        let s = &self.stripes[stripe_index()];
        // Relaxed: independent counters, read for reporting only.
        s.total_hits.fetch_add(hits, Ordering::Relaxed);
        match outcome {
            Outcome::Within => {
                s.within_limit.fetch_add(hits, Ordering::Relaxed);
                s.decisions_ok.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Over => {
                s.over_limit.fetch_add(hits, Ordering::Relaxed);
                s.decisions_over_limit.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Shadow => {
                s.shadow_mode.fetch_add(hits, Ordering::Relaxed);
                s.decisions_ok.fetch_add(1, Ordering::Relaxed);
                s.decisions_shadow.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counters' current values (each summed over the stripes; a decision being
    /// recorded meanwhile may be seen in some counters and not yet in others).
    #[must_use]
    pub fn snapshot(&self) -> RuleCounts {
        let sum = |f: fn(&Stripe) -> &AtomicU64| {
            self.stripes
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .fold(0u64, u64::wrapping_add)
        };
        RuleCounts {
            total_hits: sum(|s| &s.total_hits),
            over_limit: sum(|s| &s.over_limit),
            within_limit: sum(|s| &s.within_limit),
            near_limit: sum(|s| &s.near_limit),
            shadow_mode: sum(|s| &s.shadow_mode),
            decisions_ok: sum(|s| &s.decisions_ok),
            decisions_over_limit: sum(|s| &s.decisions_over_limit),
            decisions_shadow: sum(|s| &s.decisions_shadow),
        }
    }
}

/// A copy of a rule's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleCounts {
    /// Hits asked for.
    pub total_hits: u64,
    /// Hits refused (answered `OVER_LIMIT`).
    pub over_limit: u64,
    /// Hits admitted.
    pub within_limit: u64,
    /// Hits admitted above 80 % of the limit (envoyproxy/ratelimit's `near_limit`, with its
    /// default `NEAR_LIMIT_RATIO`); counted for the fixed windows.
    pub near_limit: u64,
    /// Hits over the limit but answered `OK` because the rule is in shadow mode.
    pub shadow_mode: u64,
    /// Descriptor decisions answered `OK` (shadowed ones included).
    pub decisions_ok: u64,
    /// Descriptor decisions answered `OVER_LIMIT`.
    pub decisions_over_limit: u64,
    /// Descriptor decisions over the limit answered `OK` (shadow mode; also counted in
    /// `decisions_ok`).
    pub decisions_shadow: u64,
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
