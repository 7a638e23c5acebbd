//! The grants of a serving token server (pure; time is an argument): per rule and
//! descriptor a central state of the rule's `sluice-limits` algorithm; a grant of `n` permits
//! is a decision of cost `n` on it.

use std::collections::HashMap;

use sluice_limits::{Algorithm, AlgorithmKind, AnyAlgorithm, AnyState, Limit, Nanos, Options};

use super::{Reply, Report, Spent};

/// Most keys a [`Report`] lists (the most spent): it travels in every renewal.
pub const REPORT_KEYS: usize = 256;

/// About the most bytes a [`Report`]'s keys take in a renewal (whose limit is 64 KiB).
const REPORT_BYTES: usize = 32 * 1024;

/// How a token server sizes its grants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrantConfig {
    /// A grant may be used this long after its request was sent (default 100 ms); a fixed
    /// window's grant also ends with its window.
    pub lease: Nanos,
    /// Never more than this fraction of what is left (default 0.5): batches shrink as the
    /// quota runs out and the last permits are spread over the nodes (seed 002 §4.4(5)).
    pub share_of_remaining: f64,
    /// Never more than this many permits at once (default 1000).
    pub max_batch: u64,
    /// A server that takes over from a predecessor counts what the predecessor may have
    /// granted as given out (default true: the limit holds across a takeover): what its
    /// reports say and its allowance beyond them, or without a report every permit the rule
    /// allowed at the last instant the predecessor may have granted.
    pub assume_predecessor_spent: bool,
}

impl Default for GrantConfig {
    fn default() -> Self {
        Self {
            lease: 100_000_000,
            share_of_remaining: 0.5,
            max_batch: 1000,
            assume_predecessor_spent: true,
        }
    }
}

struct KeyState {
    state: AnyState,
    limit: Limit,
    /// Permits granted since the key's state was made.
    granted: u64,
    /// `granted` at the last report a majority received: grants beyond it are bounded by
    /// the allowance.
    acked: u64,
    /// `granted` at the report of a round not yet received by a majority.
    pending: Option<(u64, u64)>,
}

/// What a server that took over knows of its predecessors.
#[derive(Debug)]
struct Inherited {
    /// The last instant (wall clock) the latest predecessor may have granted.
    until: Nanos,
    /// The latest report of each earlier holder its voters kept (none: count everything
    /// as spent at `until`).
    reports: Vec<Report>,
}

/// The central state of a serving token server.
///
/// Guarantee: a permit granted at `t` was admitted by the rule's algorithm at `t` on this
/// server's state, so for a fixed window the permits granted within one window never exceed
/// the limit (and a grant never outlives its window); after [`Grants::take_over`] with a
/// predecessor, each key starts with everything the rule allowed at the predecessor's last
/// possible grant counted as used, so the grants of this server and of the predecessor
/// together stay within the limit too.
pub struct Grants {
    config: GrantConfig,
    inherited: Option<Inherited>,
    /// How often holders report (the serving lease's renewals): an allowance covers three
    /// of them at the rule's rate.
    renew_every: Nanos,
    /// How long after its report a holder may still grant (its serving lease, stretched,
    /// plus a renewal for the servers' wall clocks).
    holder_tail: Nanos,
    algorithms: Vec<AnyAlgorithm>,
    states: HashMap<(String, AlgorithmKind), KeyState>,
    granted: u64,
    /// Grants held back because their key's allowance beyond its last report was used.
    unreported: u64,
}

impl std::fmt::Debug for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grants")
            .field("config", &self.config)
            .field("inherited", &self.inherited)
            .field("keys", &self.states.len())
            .field("granted", &self.granted)
            .finish()
    }
}

/// How many permits `alg` admits at `now` in one request.
fn available(alg: &AnyAlgorithm, state: &AnyState, limit: &Limit, now: Nanos) -> u64 {
    let d = alg.peek(state, limit, now, 1);
    if d.allowed {
        d.remaining.saturating_add(1)
    } else {
        0
    }
}

impl Grants {
    /// No key yet, no predecessor.
    #[must_use]
    pub fn new(config: GrantConfig) -> Self {
        Self {
            config,
            inherited: None,
            renew_every: 100_000_000,
            holder_tail: 500_000_000,
            unreported: 0,
            algorithms: AlgorithmKind::ALL
                .iter()
                .map(|&k| AnyAlgorithm::new(k, Options::default()))
                .collect(),
            states: HashMap::new(),
            granted: 0,
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &GrantConfig {
        &self.config
    }

    /// Holders report every `renew_every`, and grant at most `holder_tail` after their last
    /// report.
    pub fn set_timing(&mut self, renew_every: Nanos, holder_tail: Nanos) {
        self.renew_every = renew_every.max(1);
        self.holder_tail = holder_tail;
    }

    /// What a holder may grant of a key beyond its last report a majority
    /// received: the rule's rate over three renewals (a round's report is received before
    /// the next), at least a twentieth of the count (or burst) and 1, at most all of
    /// it. A
    /// successor counts it as spent on top of the report.
    #[must_use]
    pub fn allowance(&self, kind: AlgorithmKind, limit: &Limit) -> u64 {
        let cap = sluice_center::charge_cap(kind, limit).max(1);
        let by_rate = u128::from(limit.count()) * 3 * u128::from(self.renew_every)
            / u128::from(limit.period().max(1));
        u64::try_from(by_rate)
            .unwrap_or(u64::MAX)
            .max(cap / 20)
            .clamp(1, cap)
    }

    /// The server (re)acquired the serving lease. With a predecessor that may have granted
    /// until `predecessor_until` (wall clock), every key starts over with what the earlier
    /// holders' `reports` say was spent, and each one's allowance beyond it, counted as given
    /// out (without reports: everything the rule allowed at `predecessor_until`, the window
    /// in progress then, a bucket's burst then, refilling since); without a predecessor (a
    /// fresh cluster, or this server's own lease lapsed and came back with nobody between),
    /// its states stay.
    pub fn take_over(&mut self, predecessor_until: Option<Nanos>, reports: Vec<Report>) {
        if let Some(until) = predecessor_until
            && self.config.assume_predecessor_spent
        {
            self.states.clear();
            self.inherited = Some(Inherited { until, reports });
        }
    }

    /// Grants held back so far because a key's allowance beyond its last report was used.
    #[must_use]
    pub fn unreported(&self) -> u64 {
        self.unreported
    }

    /// What every key's state has spent at `now` (wall clock), for the renewal of `round`:
    /// the most spent [`REPORT_KEYS`]. Remembers each key's grants so far until a majority
    /// has received it ([`Grants::acked`]).
    pub fn report(&mut self, holder: u32, round: u64, now: Nanos) -> Report {
        let mut keys = Vec::new();
        for ((key, kind), k) in &mut self.states {
            k.pending = Some((round, k.granted));
            let Some(alg) = self.algorithms.get(kind.index()) else {
                continue;
            };
            let fresh = available(alg, &alg.new_state(&k.limit, now), &k.limit, now);
            let used = fresh.saturating_sub(available(alg, &k.state, &k.limit, now));
            if used > 0 {
                keys.push(Spent {
                    key: key.clone(),
                    algorithm: kind.name().to_string(),
                    used,
                });
            }
        }
        // The most spent first, as many as fit in a renewal.
        keys.sort_unstable_by_key(|k| std::cmp::Reverse(k.used));
        let all = keys.len();
        let mut bytes = 0;
        keys.truncate(REPORT_KEYS);
        keys.retain(|k| {
            bytes += k.key.len() + k.algorithm.len() + 48;
            bytes <= REPORT_BYTES
        });
        let complete = keys.len() == all;
        Report {
            holder,
            at: now,
            complete,
            keys,
        }
    }

    /// A majority received the report of `round`: grants up to it are known.
    pub fn acked(&mut self, round: u64) {
        for k in self.states.values_mut() {
            if let Some((r, granted)) = k.pending
                && r == round
            {
                k.acked = granted;
                k.pending = None;
            }
        }
    }

    /// A new key's state: what earlier holders may have spent counted as given out.
    fn inherited_state(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        now: Nanos,
    ) -> AnyState {
        let Some(inherited) = &self.inherited else {
            return alg.new_state(limit, now);
        };
        let until = inherited.until.min(now);
        // (when, permits; `None`: all the rule allows then)
        let mut spent: Vec<(Nanos, Option<u64>)> = Vec::new();
        if inherited.reports.is_empty() {
            spent.push((until, None));
        } else {
            let allowance = self.allowance(kind, limit);
            // The latest holder's grants beyond its last report (or all it granted, if it
            // held without a report a majority received).
            spent.push((until, Some(allowance)));
            for r in &inherited.reports {
                // Each holder granted at most `holder_tail` after its report.
                let end = r.at.saturating_add(self.holder_tail).min(until);
                match r
                    .keys
                    .iter()
                    .find(|s| s.key == key && s.algorithm == kind.name())
                {
                    Some(s) => spent.push((r.at.min(until), Some(s.used))),
                    None if !r.complete => spent.push((end, None)),
                    None => {}
                }
                spent.push((end, Some(allowance)));
            }
            spent.sort_unstable_by_key(|&(t, _)| t);
        }
        let mut state = alg.new_state(limit, spent.first().map_or(until, |s| s.0));
        for (t, n) in spent {
            // At most what the rule allowed then: a state never counts past its limit here.
            let all = available(alg, &state, limit, t);
            let n = n.map_or(all, |n| n.min(all));
            if n > 0 {
                alg.check(&mut state, limit, t, n);
            }
        }
        state
    }

    /// Permits granted so far.
    #[must_use]
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Answers a request for permits of `kind` under `limit` at `now`, after counting the
    /// `charge` permits the node admitted on its own as admitted now, whatever the limit
    /// says ([`Algorithm::charge`]: past the limit the state takes the excess, saturating,
    /// and keeps it off the grants while it still weighs).
    #[allow(clippy::too_many_arguments)]
    pub fn grant(
        &mut self,
        key: &str,
        kind: AlgorithmKind,
        limit: &Limit,
        want: u64,
        cost: u64,
        charge: u64,
        now: Nanos,
    ) -> Reply {
        let index = kind.index();
        let Some(alg) = self.algorithms.get(index) else {
            return Reply::Standby { holder: None };
        };
        let allowance = self.allowance(kind, limit);
        let id = (key.to_string(), kind);
        if !self.states.contains_key(&id) {
            // What predecessors may have given out, decaying from then by the algorithm's
            // own rules.
            let state = self.inherited_state(alg, key, kind, limit, now);
            self.states.insert(
                id.clone(),
                KeyState {
                    state,
                    limit: *limit,
                    granted: 0,
                    acked: 0,
                    pending: None,
                },
            );
        }
        let Some(entry) = self.states.get_mut(&id) else {
            return Reply::Standby { holder: None };
        };
        entry.limit = *limit;
        if charge > 0 {
            // As the Redis scripts and the in-memory store charge: past the limit the state
            // takes the excess, so it keeps those permits off the grants while they weigh.
            alg.charge(&mut entry.state, limit, now, charge);
        }
        let left = available(alg, &entry.state, limit, now);
        let by_share = (left as f64 * self.config.share_of_remaining).floor() as u64;
        // A successor counts only the last report a majority received and the allowance
        // beyond it: never grant past that.
        let unreported = if self.config.assume_predecessor_spent {
            allowance.saturating_sub(entry.granted.saturating_sub(entry.acked))
        } else {
            // No successor counts on it.
            u64::MAX
        };
        let size = want
            .min(self.config.max_batch)
            .min(by_share)
            .max(cost.max(1))
            .min(left);
        if size > 0 && unreported < cost.max(1) {
            // Until the next report reaches a majority (a renewal).
            self.unreported = self.unreported.saturating_add(1);
            return Reply::Grant {
                granted: 0,
                remaining: left,
                valid_for: 0,
                retry_after: Some(self.renew_every.min(self.config.lease)),
            };
        }
        let size = size.min(unreported);
        if size > 0 {
            let d = alg.check(&mut entry.state, limit, now, size);
            if d.allowed {
                entry.granted = entry.granted.saturating_add(size);
                self.granted = self.granted.saturating_add(size);
                let valid_for = match alg {
                    AnyAlgorithm::FixedWindow(_) => self.config.lease.min(d.reset_after),
                    _ => self.config.lease,
                };
                return Reply::Grant {
                    granted: size,
                    remaining: d.remaining,
                    valid_for,
                    retry_after: None,
                };
            }
        }
        let d = alg.peek(&entry.state, limit, now, cost.max(1));
        Reply::Grant {
            granted: 0,
            remaining: 0,
            valid_for: 0,
            retry_after: Some(
                d.retry_after
                    .unwrap_or(self.config.lease)
                    .clamp(1, self.config.lease),
            ),
        }
    }

    /// Forgets keys whose state is that of a key never seen; returns how many.
    pub fn retain_idle(&mut self, now: Nanos) -> usize {
        let before = self.states.len();
        let algorithms = &self.algorithms;
        self.states.retain(|(_, kind), s| {
            let index = kind.index();
            algorithms
                .get(index)
                .is_some_and(|a| !a.is_idle(&s.state, &s.limit, now))
        });
        before - self.states.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn fw(n: u64) -> Limit {
        Limit::from_nanos(n, S).unwrap()
    }

    #[test]
    fn grants_shrink_with_what_is_left_and_never_pass_the_window() {
        let cfg = GrantConfig {
            assume_predecessor_spent: false,
            ..GrantConfig::default()
        };
        let mut s = Grants::new(cfg);
        let l = fw(100);
        let mut sizes = Vec::new();
        let t = 10 * S;
        loop {
            match s.grant("k", AlgorithmKind::FixedWindow, &l, 1000, 1, 0, t) {
                Reply::Grant { granted: 0, .. } => break,
                Reply::Grant {
                    granted, valid_for, ..
                } => {
                    assert!(valid_for <= cfg.lease);
                    sizes.push(granted);
                }
                r => panic!("{r:?}"),
            }
        }
        assert_eq!(sizes.iter().sum::<u64>(), 100);
        // Half of what is left each time: 50, 25, 12, ...
        assert_eq!(&sizes[..3], &[50, 25, 12]);
        // The next window is fresh.
        assert!(matches!(
            s.grant("k", AlgorithmKind::FixedWindow, &l, 10, 1, 0, t + S),
            Reply::Grant { granted: 10, .. }
        ));
    }

    #[test]
    fn a_takeover_counts_what_the_predecessor_may_have_granted_and_a_fresh_start_does_not() {
        let start = 10 * S + S / 2;
        let l = fw(100);
        // A fresh cluster: the window in progress is not spent.
        let mut fresh = Grants::new(GrantConfig::default());
        fresh.take_over(None, Vec::new());
        assert!(matches!(
            fresh.grant("k", AlgorithmKind::FixedWindow, &l, 5, 1, 0, start),
            Reply::Grant { granted: 5, .. }
        ));
        // A predecessor may have granted until `start`: its window is spent, the next not.
        let mut s = Grants::new(GrantConfig::default());
        s.take_over(Some(start), Vec::new());
        assert!(matches!(
            s.grant("k", AlgorithmKind::FixedWindow, &l, 5, 1, 0, start),
            Reply::Grant {
                granted: 0,
                retry_after: Some(_),
                ..
            }
        ));
        assert!(matches!(
            s.grant("k", AlgorithmKind::FixedWindow, &l, 5, 1, 0, 11 * S),
            Reply::Grant { granted: 5, .. }
        ));
    }

    #[test]
    fn a_charge_is_counted_before_the_grant_and_what_the_state_cannot_hold_is_kept_off() {
        let cfg = GrantConfig {
            assume_predecessor_spent: false,
            ..GrantConfig::default()
        };
        let mut s = Grants::new(cfg);
        let t = 10 * S;
        let window = AlgorithmKind::FixedWindow;
        let drain = |s: &mut Grants, kind, l: &Limit, now, charge| {
            let mut total = 0;
            let mut charge = charge;
            while let Reply::Grant { granted, .. } = s.grant("k", kind, l, 1000, 1, charge, now) {
                if granted == 0 {
                    break;
                }
                total += granted;
                charge = 0;
            }
            total
        };
        // 30 admitted locally by a node: the window grants the other 70.
        assert_eq!(drain(&mut s, window, &fw(100), t, 30), 70);
        // A sliding log: 80 granted, then a node charges 50 — the log takes all 50, 30 past
        // the count, which keeps them off the grants while they weigh (a period).
        let log = AlgorithmKind::SlidingLog;
        let l = fw(100);
        assert!(matches!(
            s.grant("k", log, &l, 80, 80, 0, t),
            Reply::Grant { granted: 80, .. }
        ));
        assert_eq!(drain(&mut s, log, &l, t + S / 2, 50), 0);
        // At t + S the first 80 leave; the 50 charged still weigh: 50 left, not 80.
        assert_eq!(drain(&mut s, log, &l, t + S, 0), 50);
    }
}
