//! envoyproxy/ratelimit's counting details, for the engine: the counter a `share_threshold`
//! match is kept under, the `near_limit` share of an admitted request, and whether a check
//! of 0 hits finds its counter already past the limit.

use sluice_limits::{AlgorithmKind, AnyAlgorithm, KeyedStore, Limit, Nanos};

use std::sync::atomic::Ordering;

use super::{CounterKey, CounterView, Descriptor, DescriptorStatus, Engine};
use crate::config::Limited;

/// The descriptor whose counter a `share_threshold` match is kept under: `d` with each
/// value in `shared` replaced by its pattern; `None` when nothing is shared.
pub(super) fn shared_counter(d: &Descriptor, shared: &[(usize, &str)]) -> Option<Descriptor> {
    if shared.is_empty() {
        return None;
    }
    let mut counter = d.clone();
    for &(i, pattern) in shared {
        if let Some(e) = counter.entries.get_mut(i) {
            pattern.clone_into(&mut e.value);
        }
    }
    Some(counter)
}

/// envoyproxy/ratelimit's `near_limit` share of an admitted request: its hits above
/// `floor(0.8 · requests_per_unit)` (its `checkNearLimitThreshold`); for the fixed windows,
/// whose `limit_remaining` says the count after the request.
pub(super) fn near_limit_hits(rule: &Limited, s: &DescriptorStatus, cost: u64) -> u64 {
    if !matches!(
        rule.algorithm,
        AlgorithmKind::FixedWindow | AlgorithmKind::FixedWindowFirst
    ) {
        return 0;
    }
    let n = u64::from(rule.rate.requests_per_unit);
    let near = n * 4 / 5;
    let after = n.saturating_sub(u64::from(s.limit_remaining));
    let before = after.saturating_sub(cost);
    after.saturating_sub(near.max(before))
}

/// Whether the hits counted on `key` are already past `limit` (only counted refused
/// hits take a state there): a one-hit request would be refused even with one permit
/// more.
pub(super) fn over_already(
    store: &KeyedStore<CounterKey, AnyAlgorithm>,
    key: &CounterView<'_>,
    limit: &Limit,
    now: Nanos,
) -> bool {
    let Ok(one_more) = Limit::from_nanos(limit.count().saturating_add(1), limit.period()) else {
        return false;
    };
    let one_more = one_more
        .with_burst(limit.burst().saturating_add(1))
        .unwrap_or(one_more);
    !store.peek_view(key, &one_more, now, 1).allowed
}

impl Engine {
    /// Whether refused hits count against the fixed-window limits this node decides: `true`
    /// (the default) as envoyproxy/ratelimit, which counts every hit; `false`, Sluice's
    /// opt-in, leaves a refused request's permits to later, smaller requests. (The other
    /// algorithms never count refused hits.)
    pub fn set_count_refused(&self, count: bool) {
        self.count_refused.store(count, Ordering::Relaxed);
    }

    /// Whether refused hits are counted ([`Engine::set_count_refused`]).
    #[must_use]
    pub fn counts_refused(&self) -> bool {
        self.count_refused.load(Ordering::Relaxed)
    }
}
