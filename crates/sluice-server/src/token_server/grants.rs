//! The grants of a serving token server (pure; time is an argument): per rule and
//! descriptor a central state of the rule's `sluice-limits` algorithm; a grant of `n` permits
//! is a decision of cost `n` on it.

use std::collections::HashMap;

use sluice_limits::{Algorithm, AlgorithmKind, AnyAlgorithm, AnyState, Limit, Nanos, Options};

use super::Reply;

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
    /// A server that takes over from a predecessor counts every permit the rule allowed at
    /// the last instant the predecessor may have granted as given out (default true: the
    /// limit holds across a takeover).
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
    predecessor_until: Option<Nanos>,
    algorithms: Vec<AnyAlgorithm>,
    states: HashMap<(String, AlgorithmKind), KeyState>,
    granted: u64,
}

impl std::fmt::Debug for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grants")
            .field("config", &self.config)
            .field("predecessor_until", &self.predecessor_until)
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
            predecessor_until: None,
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

    /// The server (re)acquired the serving lease. With a predecessor that may have granted
    /// until `predecessor_until` (wall clock), every key starts over with what the rule
    /// allowed then counted as given out (the window in progress then, a bucket's burst
    /// then, refilling since); without one (a fresh cluster, or this server's own lease
    /// lapsed and came back with nobody between), its states stay.
    pub fn take_over(&mut self, predecessor_until: Option<Nanos>) {
        if let Some(t) = predecessor_until
            && self.config.assume_predecessor_spent
        {
            self.states.clear();
            self.predecessor_until = Some(t);
        }
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
        let precharge = self.predecessor_until.map(|t| t.min(now));
        let entry = self
            .states
            .entry((key.to_string(), kind))
            .or_insert_with(|| match precharge {
                Some(t) => {
                    // What a predecessor may have given out: all the rule allowed at its last
                    // possible grant, decaying from then by the algorithm's own rules.
                    let mut state = alg.new_state(limit, t);
                    let all = available(alg, &state, limit, t);
                    if all > 0 {
                        alg.check(&mut state, limit, t, all);
                    }
                    KeyState {
                        state,
                        limit: *limit,
                    }
                }
                None => KeyState {
                    state: alg.new_state(limit, now),
                    limit: *limit,
                },
            });
        entry.limit = *limit;
        if charge > 0 {
            // As the Redis scripts and the in-memory store charge: past the limit the state
            // takes the excess, so it keeps those permits off the grants while they weigh.
            alg.charge(&mut entry.state, limit, now, charge);
        }
        let left = available(alg, &entry.state, limit, now);
        let by_share = (left as f64 * self.config.share_of_remaining).floor() as u64;
        let size = want
            .min(self.config.max_batch)
            .min(by_share)
            .max(cost.max(1))
            .min(left);
        if size > 0 {
            let d = alg.check(&mut entry.state, limit, now, size);
            if d.allowed {
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
        fresh.take_over(None);
        assert!(matches!(
            fresh.grant("k", AlgorithmKind::FixedWindow, &l, 5, 1, 0, start),
            Reply::Grant { granted: 5, .. }
        ));
        // A predecessor may have granted until `start`: its window is spent, the next not.
        let mut s = Grants::new(GrantConfig::default());
        s.take_over(Some(start));
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
