//! The pure half of a node's token client: its leases per key, their sizing, the fallback
//! share and what it owes the servers (time is an argument).

use std::collections::HashMap;

use sluice_limits::{
    Algorithm, AlgorithmKind, AnyAlgorithm, AnyState, Decision, Limit, Nanos, Options,
};
use sluice_redis::{ConsumptionRate, Debt, Share, Source, take_what_fits};

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
    /// The node's own share of the limit (`1/nodes`), on the rule's algorithm: charged with
    /// every permit admitted from leases (as far as it goes), and the fallback's limiter
    /// once the lease has expired — so a share used up from leases is not spent twice.
    share: Option<AnyState>,
    /// What the share admitted that no server has counted yet.
    debt: Debt,
    /// The debt a request carries to a server now (at most one at a time per key).
    charging: Option<Debt>,
}

/// What the lease says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Decided from the lease (admitted), or refused until the server's retry time.
    Decided(Decision),
    /// The lease cannot serve it: ask the server for this many permits.
    Ask(u64),
}

/// A node's leases, per key (the pure half of [`TokenClient`]).
#[derive(Debug, Default)]
pub struct LeaseBook {
    config: RequestSizing,
    leases: HashMap<(String, AlgorithmKind), Lease>,
    /// The fallback's share is `1/nodes` (0 counts as 1).
    nodes: u64,
}

impl LeaseBook {
    /// No lease yet; the fallback's share is the whole limit ([`LeaseBook::with_nodes`]).
    #[must_use]
    pub fn new(config: RequestSizing) -> Self {
        Self {
            config,
            leases: HashMap::new(),
            nodes: 1,
        }
    }

    /// The fallback's share is `1/nodes` of each limit.
    #[must_use]
    pub fn with_nodes(mut self, nodes: u64) -> Self {
        self.nodes = nodes.max(1);
        self
    }

    /// This node's share of `limit`.
    fn share_of(&self, limit: &Limit) -> Limit {
        Share::one_of(self.nodes).apply(limit)
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
        let horizon = self.config.horizon;
        let smoothing = self.config.smoothing;
        let share = self.share_of(limit);
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
        if now >= lease.expires {
            lease.left = 0;
        }
        if lease.left >= cost {
            return Local::Decided(take(lease, kind, limit, &share, now, cost));
        }
        if now < lease.refused_until {
            let wait = lease.refused_until - now;
            return Local::Decided(Decision::deny(limit.count(), lease.left, wait, Some(wait)));
        }
        let by_rate = lease.rate.batch(now, horizon, smoothing);
        let want = by_rate.max(cost - lease.left);
        lease.rate.asked(want);
        Local::Ask(want)
    }

    /// Decides during a fallback, without the server: while the key's lease is valid, from
    /// it only (its permits, then refusals until it expires: the lease's rate, never more);
    /// after that with the node's share, on a state that already counts what the node took
    /// from leases. Says which: [`Source::Central`] for the lease, [`Source::Local`].
    pub fn fallback(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> (Decision, Source) {
        let share = self.share_of(limit);
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
        if now < lease.expires {
            if lease.left >= cost {
                return (take(lease, kind, limit, &share, now, cost), Source::Central);
            }
            let wait = lease.expires - now;
            return (
                Decision::deny(limit.count(), lease.left, wait, Some(wait)),
                Source::Central,
            );
        }
        let alg = AnyAlgorithm::new(kind, Options::default());
        let state = lease
            .share
            .get_or_insert_with(|| alg.new_state(&share, now));
        let d = alg.check(state, &share, now, cost);
        if d.allowed {
            // No server knows of it: the next request for a grant carries it.
            lease.debt.record(&alg, limit, now, cost);
        }
        (d, Source::Local)
    }

    /// The permits a request for a grant of the key carries ([`GrantRequest::charge`]): what
    /// the share admitted that still weighs, taken out until [`LeaseBook::charged`] says how
    /// the request went. `None` while another request carries the key's debt: the caller
    /// decides locally ([`LeaseBook::fallback`]), so no grant is asked for before the server
    /// has counted the key's local permits.
    pub fn charge(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
    ) -> Option<u64> {
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
        if lease.charging.is_some() {
            return None;
        }
        let alg = AnyAlgorithm::new(kind, Options::default());
        let due = lease.debt.due(&alg, limit, now);
        if due == 0 {
            lease.debt = Debt::new();
        } else {
            lease.charging = Some(lease.debt.take());
        }
        Some(due)
    }

    /// Ends the charge taken by [`LeaseBook::charge`]: counted by a server (`counted`), or
    /// not known to be — then still owed (charging it again only over-counts).
    pub fn charged(&mut self, key: &str, kind: AlgorithmKind, counted: bool) {
        if let Some(lease) = self.leases.get_mut(&(key.to_string(), kind))
            && let Some(owed) = lease.charging.take()
            && !counted
        {
            lease.debt.restore(owed);
        }
    }

    /// Whether a request carries the key's debt to a server now.
    #[must_use]
    pub fn charging(&self, key: &str, kind: AlgorithmKind) -> bool {
        self.leases
            .get(&(key.to_string(), kind))
            .is_some_and(|l| l.charging.is_some())
    }

    /// What the key owes the servers at `now` (permits of its share no server counted yet).
    #[must_use]
    pub fn owed(&self, key: &str, kind: AlgorithmKind, limit: &Limit, now: Nanos) -> u64 {
        let alg = AnyAlgorithm::new(kind, Options::default());
        self.leases
            .get(&(key.to_string(), kind))
            .map_or(0, |l| l.debt.due(&alg, limit, now))
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
        let share = self.share_of(limit);
        let lease = self.leases.entry((key.to_string(), kind)).or_default();
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
            return take(lease, kind, limit, &share, now, cost);
        }
        let wait = retry_after.unwrap_or(1).max(1);
        if granted == 0 {
            lease.refused_until = now.saturating_add(wait);
        }
        Decision::deny(limit.count(), lease.left, wait, Some(wait))
    }

    /// Permits held in unexpired leases at `now`, over all keys.
    #[must_use]
    pub fn held(&self, now: Nanos) -> u64 {
        self.leases
            .values()
            .filter(|l| now < l.expires)
            .map(|l| l.left)
            .sum()
    }

    /// Forgets leases idle since before `now - keep`.
    pub fn retain(&mut self, now: Nanos, keep: Nanos) {
        self.leases.retain(|_, l| {
            now < l.expires.saturating_add(keep)
                || now < l.rate.since().saturating_add(keep)
                || !l.debt.is_empty()
                || l.charging.is_some()
        });
    }
}

/// Gives `cost` permits out of the lease, and charges them to the node's share (what fits).
fn take(
    lease: &mut Lease,
    kind: AlgorithmKind,
    limit: &Limit,
    share: &Limit,
    now: Nanos,
    cost: u64,
) -> Decision {
    lease.left -= cost;
    lease.rate.used(cost);
    let alg = AnyAlgorithm::new(kind, Options::default());
    let state = lease.share.get_or_insert_with(|| alg.new_state(share, now));
    // More than the share from leases: the share is used up, no more (by design it counts
    // only what fits, not past the limit as a charge would: it limits this node's fallback,
    // and a lease's permits were already counted centrally).
    take_what_fits(&alg, state, share, now, cost);
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
        assert_eq!(b.held(S + 12_000_000), 0);
        // In time, the same grant admits.
        let d = b.apply("k", k, &l, S, S + 9_000_000, 1, 4, 10_000_000, None);
        assert!(d.allowed, "{d:?}");
        assert_eq!(b.held(S + 9_000_000), 3);
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
        // In fallback the lease (valid until S + 100 ms, used up) refuses until it ends.
        let (d, source) = b.fallback("k", k, &l, S + 10, 1);
        assert!(!d.allowed && source == Source::Central, "{d:?}");
        assert_eq!(d.retry_after, Some(100_000_000 - 10));
    }

    #[test]
    fn a_fallback_keeps_to_the_lease_then_to_a_share_that_counts_the_leases() {
        // Two nodes: the share is 50 of 100 per window.
        let mut b = LeaseBook::new(RequestSizing::default()).with_nodes(2);
        let (l, k) = (fw(100), AlgorithmKind::FixedWindow);
        let lease = 100_000_000;
        let t = 10 * S;
        // 30 of a 40-permit lease used centrally.
        assert!(b.apply("k", k, &l, t, t, 1, 40, lease, None).allowed);
        for _ in 0..29 {
            assert!(matches!(b.try_local("k", k, &l, t + 1, 1), Local::Decided(d) if d.allowed));
        }
        // The server is gone. While the lease is valid: its 10 permits, then refusals until
        // it ends — not the share on top.
        let mid = t + lease / 2;
        for _ in 0..10 {
            assert_eq!(b.fallback("k", k, &l, mid, 1).1, Source::Central);
        }
        let (d, source) = b.fallback("k", k, &l, mid, 1);
        assert!(!d.allowed && source == Source::Central, "{d:?}");
        assert_eq!(d.retry_after, Some(lease / 2));
        // After it: the share, less the 40 taken from leases in this window.
        let after = t + 2 * lease;
        let local = (0..100)
            .filter(|_| {
                let (d, source) = b.fallback("k", k, &l, after, 1);
                assert_eq!(source, Source::Local);
                d.allowed
            })
            .count();
        assert_eq!(local, 10, "40 from leases + 10 = the share of 50");
        // The next window: the whole share.
        let next = (0..100)
            .filter(|_| b.fallback("k", k, &l, t + S, 1).0.allowed)
            .count();
        assert_eq!(next, 50);

        // A node that took more than its share from leases admits nothing more locally in
        // that window: max(leases, share), never their sum.
        assert!(b.apply("big", k, &l, t, t, 1, 80, lease, None).allowed);
        for _ in 0..79 {
            assert!(matches!(b.try_local("big", k, &l, t + 1, 1), Local::Decided(d) if d.allowed));
        }
        assert!(!b.fallback("big", k, &l, after, 1).0.allowed);
        assert!(b.fallback("big", k, &l, t + S, 1).0.allowed);
    }

    #[test]
    fn the_share_owes_its_admissions_until_a_grant_counts_them() {
        let mut b = LeaseBook::new(RequestSizing::default()).with_nodes(2);
        let (l, k) = (fw(100), AlgorithmKind::FixedWindow);
        let t = 10 * S;
        // No lease: the share decides, and owes what it admits.
        let local = (0..60)
            .filter(|_| b.fallback("k", k, &l, t, 1).0.allowed)
            .count();
        assert_eq!(local, 50);
        assert_eq!(b.owed("k", k, &l, t + 1), 50);
        // One request carries it; another meanwhile is told to decide locally.
        assert_eq!(b.charge("k", k, &l, t + 1), Some(50));
        assert!(b.charging("k", k));
        assert_eq!(b.charge("k", k, &l, t + 1), None);
        // Not counted (no grant): owed again, with nothing lost.
        b.charged("k", k, false);
        assert!(!b.charging("k", k));
        assert_eq!(b.owed("k", k, &l, t + 2), 50);
        // Counted: nothing owed.
        assert_eq!(b.charge("k", k, &l, t + 2), Some(50));
        b.charged("k", k, true);
        assert_eq!(b.owed("k", k, &l, t + 3), 0);
        assert_eq!(b.charge("k", k, &l, t + 3), Some(0));
        // The next window owes nothing for the last one.
        b.fallback("k", k, &l, t + S / 2, 1);
        assert_eq!(b.owed("k", k, &l, t + S), 0);
    }
}
