//! The pure half of a node's token client: its leases per key and their sizing (time is an
//! argument). The fallback share and what it owes the servers are the fallback's
//! ([`sluice_center::FallbackLimiter`]), as for Redis.

use std::collections::HashMap;

use sluice_center::{ConsumptionRate, PRUNE_EVERY, Sweep};
use sluice_limits::{AlgorithmKind, Decision, Limit, Nanos};

/// How a node sizes its requests for permits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestSizing {
    /// A request covers this much of the node's consumption at its measured rate (default
    /// 20 ms): one server call per horizon under steady load.
    pub horizon: Nanos,
    /// Weight of the newest measurement in the rate estimate (default 0.5).
    pub smoothing: f64,
}

impl Default for RequestSizing {
    fn default() -> Self {
        Self {
            horizon: 20_000_000,
            smoothing: 0.5,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Lease {
    left: u64,
    expires: Nanos,
    rate: ConsumptionRate,
    refused_until: Nanos,
}

/// What the lease says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Decided from the lease (admitted), or refused until the server's retry time.
    Decided(Decision),
    /// The lease cannot serve it: ask the server for this many permits.
    Ask(u64),
}

/// A node's leases, per key (the pure half of [`super::TokenClient`]).
#[derive(Debug, Default)]
pub struct LeaseBook {
    config: RequestSizing,
    leases: HashMap<(String, AlgorithmKind), Lease>,
    sweep: Sweep,
}

impl LeaseBook {
    /// No lease yet.
    #[must_use]
    pub fn new(config: RequestSizing) -> Self {
        Self {
            config,
            leases: HashMap::new(),
            sweep: Sweep::default(),
        }
    }

    /// The key's lease, created if new; swept of idle keys when a sweep is due.
    fn lease(&mut self, key: &str, kind: AlgorithmKind, now: Nanos) -> &mut Lease {
        if self.sweep.due(now) {
            self.retain(now, PRUNE_EVERY);
        }
        self.leases.entry((key.to_string(), kind)).or_default()
    }

    /// Decides from the lease if it can.
    pub fn try_local(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Local {
        let lease = self.lease(key, kind, now);
        if now >= lease.expires {
            lease.left = 0;
        }
        if lease.left >= cost {
            return Local::Decided(take(lease, limit, now, cost));
        }
        if now < lease.refused_until {
            let wait = lease.refused_until - now;
            return Local::Decided(Decision::deny(limit.count(), lease.left, wait, Some(wait)));
        }
        Local::Ask(self.want(key, kind, now, cost))
    }

    /// How many permits to ask a server for, whatever the lease holds: the node's
    /// consumption over the horizon, at least what the lease lacks for `cost`.
    pub fn want(&mut self, key: &str, kind: AlgorithmKind, now: Nanos, cost: u64) -> u64 {
        let (horizon, smoothing) = (self.config.horizon, self.config.smoothing);
        let lease = self.lease(key, kind, now);
        if now >= lease.expires {
            lease.left = 0;
        }
        let by_rate = lease.rate.batch(now, horizon, smoothing);
        let want = by_rate.max(cost.saturating_sub(lease.left));
        lease.rate.asked(want);
        want
    }

    /// Decides from the key's lease only, without a server: `None` when it holds no valid
    /// lease; while it holds one that cannot cover `cost`, a refusal until it expires (the
    /// lease's rate, never more).
    pub fn held(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Option<Decision> {
        let lease = self.leases.get_mut(&(key.to_string(), kind))?;
        if now >= lease.expires {
            return None;
        }
        if lease.left >= cost {
            return Some(take(lease, limit, now, cost));
        }
        let wait = lease.expires - now;
        Some(Decision::deny(limit.count(), lease.left, wait, Some(wait)))
    }

    /// Whether the key holds an unexpired lease with permits left.
    #[must_use]
    pub fn holds(&self, key: &str, kind: AlgorithmKind, now: Nanos) -> bool {
        self.leases
            .get(&(key.to_string(), kind))
            .is_some_and(|l| now < l.expires && l.left > 0)
    }

    /// Applies a grant answered to a request sent at `sent` and decides the request of
    /// `cost` at `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        sent: Nanos,
        now: Nanos,
        cost: u64,
        granted: u64,
        valid_for: Nanos,
        retry_after: Option<Nanos>,
    ) -> Decision {
        let lease = self.lease(key, kind, now);
        if now >= lease.expires {
            lease.left = 0;
        }
        // From the send time: the server granted after it, so the lease ends no later
        // than `lease` after the grant whatever the two clocks say.
        let expires = sent.saturating_add(valid_for);
        if granted > 0 && expires > now {
            lease.expires = if lease.left > 0 {
                lease.expires.min(expires)
            } else {
                expires
            };
            lease.left += granted;
        }
        if lease.left >= cost {
            return take(lease, limit, now, cost);
        }
        let wait = retry_after.unwrap_or(1).max(1);
        if granted == 0 {
            lease.refused_until = now.saturating_add(wait);
        }
        Decision::deny(limit.count(), lease.left, wait, Some(wait))
    }

    /// Permits held in unexpired leases at `now`, over all keys.
    #[must_use]
    pub fn held_permits(&self, now: Nanos) -> u64 {
        self.leases
            .values()
            .filter(|l| now < l.expires)
            .map(|l| l.left)
            .sum()
    }

    /// Forgets leases idle since before `now - keep` (expired, no refusal running, no use
    /// measured): only their rate estimate is lost.
    pub fn retain(&mut self, now: Nanos, keep: Nanos) {
        self.leases.retain(|_, l| {
            now < l.expires.max(l.refused_until).saturating_add(keep)
                || now < l.rate.since().saturating_add(keep)
        });
    }

    /// Keys with a lease record.
    #[must_use]
    pub fn keys(&self) -> usize {
        self.leases.len()
    }
}

/// Gives `cost` permits out of the lease.
fn take(lease: &mut Lease, limit: &Limit, now: Nanos, cost: u64) -> Decision {
    lease.left -= cost;
    lease.rate.used(cost);
    Decision::allow(limit.count(), lease.left, lease.expires.saturating_sub(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn fw(n: u64) -> Limit {
        Limit::from_nanos(n, S).unwrap()
    }

    #[test]
    fn a_grant_that_arrives_after_its_validity_admits_nothing() {
        // Sent at S, valid 10 ms from the send (the window's end), answered 12 ms later:
        // the server counted those permits in a window that is over.
        let mut b = LeaseBook::new(RequestSizing::default());
        let (l, k) = (fw(1000), AlgorithmKind::FixedWindow);
        let d = b.apply("k", k, &l, S, S + 12_000_000, 1, 4, 10_000_000, None);
        assert!(!d.allowed, "{d:?}");
        assert_eq!(b.held_permits(S + 12_000_000), 0);
        // In time, the same grant admits.
        let d = b.apply("k", k, &l, S, S + 9_000_000, 1, 4, 10_000_000, None);
        assert!(d.allowed, "{d:?}");
        assert_eq!(b.held_permits(S + 9_000_000), 3);
    }

    #[test]
    fn the_lease_book_asks_by_rate_and_serves_from_the_lease() {
        let mut b = LeaseBook::new(RequestSizing::default());
        let l = fw(1000);
        let k = AlgorithmKind::FixedWindow;
        assert_eq!(b.try_local("k", k, &l, S, 1), Local::Ask(1));
        let d = b.apply("k", k, &l, S, S, 1, 4, 100_000_000, None);
        assert!(d.allowed);
        for _ in 0..3 {
            assert!(matches!(b.try_local("k", k, &l, S + 1, 1), Local::Decided(d) if d.allowed));
        }
        // Slow start: twice the last request.
        assert_eq!(b.try_local("k", k, &l, S + 2, 1), Local::Ask(2));
        // An expired lease serves nothing.
        b.apply("k", k, &l, S + 2, S + 2, 1, 0, 0, Some(5));
        assert!(matches!(b.try_local("k", k, &l, S + 3, 1), Local::Decided(d) if !d.allowed));
        // Without a server the lease (valid until S + 100 ms, used up) refuses until it ends.
        let d = b.held("k", k, &l, S + 10, 1).unwrap();
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.retry_after, Some(100_000_000 - 10));
        assert_eq!(b.held("k", k, &l, S + 100_000_000, 1), None, "expired");
    }

    #[test]
    fn idle_leases_are_swept() {
        let mut b = LeaseBook::new(RequestSizing::default());
        let (l, k) = (fw(1000), AlgorithmKind::FixedWindow);
        b.apply("k", k, &l, S, S, 1, 4, 100_000_000, None);
        assert_eq!(b.keys(), 1);
        b.try_local("other", k, &l, S + 2 * PRUNE_EVERY, 1);
        assert_eq!(b.keys(), 1, "only the key just asked for");
    }
}
