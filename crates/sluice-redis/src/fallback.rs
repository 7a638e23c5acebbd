//! Deciding locally when Redis does not answer (seed 002 §4.4(4)).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_limits::{AnyAlgorithm, Decision, Limit, Nanos};

use crate::backend::{Backend, MemoryStore};
use crate::error::Error;

/// Where decisions are being made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// By Redis (the central store).
    Central,
    /// Locally, since `since` (the caller's clock), because Redis did not answer.
    Fallback {
        /// When the fallback began.
        since: Nanos,
    },
}

/// A change of [`Mode`], returned by the call that caused it so the caller can log it
/// once.
#[derive(Debug)]
pub enum Transition {
    /// Redis stopped answering; decisions are local from now on.
    ToFallback {
        /// Why (a time out or a connection error).
        cause: Error,
    },
    /// Redis answered a probe; decisions are central again.
    ToCentral {
        /// When the fallback had begun.
        fallback_since: Nanos,
    },
}

/// Who decided a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Redis.
    Central,
    /// The local limiter.
    Local,
}

/// The answer of a [`FallbackLimiter`]: always a decision, never an error.
#[derive(Debug)]
pub struct Outcome {
    /// The decision.
    pub decision: Decision,
    /// Who made it.
    pub source: Source,
    /// The mode change this call caused, if any.
    pub transition: Option<Transition>,
    /// A configuration error of the central store for this rule (an algorithm or a limit
    /// its scripts cannot run): decided locally, mode unchanged. Worth logging.
    pub problem: Option<Error>,
}

/// What share of the global limit a node enforces on its own during a fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    num: u64,
    den: u64,
}

impl Share {
    /// `1/n` of the limit: `n` nodes splitting it evenly (at least 1 permit each).
    #[must_use]
    pub fn one_of(n: u64) -> Self {
        Self {
            num: 1,
            den: n.max(1),
        }
    }

    /// `num/den` of the limit (at most all of it).
    #[must_use]
    pub fn fraction(num: u64, den: u64) -> Self {
        let den = den.max(1);
        Self {
            num: num.min(den),
            den,
        }
    }

    /// `limit` scaled by the share: count and burst rounded down, at least 1.
    #[must_use]
    pub fn apply(&self, limit: &Limit) -> Limit {
        let scale = |x: u64| {
            u64::try_from(u128::from(x) * u128::from(self.num) / u128::from(self.den))
                .unwrap_or(u64::MAX)
                .max(1)
        };
        Limit::from_nanos(scale(limit.count()), limit.period())
            .and_then(|l| l.with_burst(scale(limit.burst())))
            .unwrap_or(*limit)
    }
}

/// How the fallback behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FallbackConfig {
    /// The local limit during a fallback (default: all of it; use [`Share::one_of`] with
    /// the number of nodes).
    pub share: Share,
    /// During a fallback, one request per this interval (caller's clock, default 100 ms)
    /// tries Redis again; if Redis answers, decisions are central again.
    pub probe_every: Nanos,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        Self {
            share: Share::one_of(1),
            probe_every: 100_000_000,
        }
    }
}

/// A central limiter (exact or batched Redis) that decides locally while Redis does not
/// answer.
///
/// No call waits longer than the central store's timeout ([`crate::RedisConfig::timeout`],
/// 50 ms by default): a call that times out is answered by the local limiter and switches
/// to [`Mode::Fallback`]; after that only one request per
/// [`FallbackConfig::probe_every`] tries Redis (within the same timeout) and the others
/// are decided locally at once. Locally means: from the batch the node holds while it is
/// valid (batched mode: its permits, nothing more, until it expires), then with the node's
/// share of the limit. Only an answer of Redis itself ends a fallback — a probe is never
/// answered from a batch or from an earlier refusal. Permits admitted locally are not known
/// to Redis when it comes back; the local limit is the node's share so that all nodes
/// together stay near the global limit meanwhile.
#[derive(Debug)]
pub struct FallbackLimiter<B> {
    central: B,
    local: MemoryStore,
    config: FallbackConfig,
    /// 0: central; otherwise the fallback's start + 1.
    fallback_since: AtomicU64,
    next_probe: AtomicU64,
    probing: AtomicBool,
}

impl<B: Backend> FallbackLimiter<B> {
    /// `central` with a local fallback.
    pub fn new(central: B, config: FallbackConfig) -> Self {
        Self {
            central,
            local: MemoryStore::new(),
            config,
            fallback_since: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// The central store.
    pub fn central(&self) -> &B {
        &self.central
    }

    /// Where decisions are being made now.
    pub fn mode(&self) -> Mode {
        match self.fallback_since.load(Ordering::Acquire) {
            0 => Mode::Central,
            s => Mode::Fallback { since: s - 1 },
        }
    }

    /// Decides a request; never fails, never waits longer than the central timeout.
    pub async fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Outcome {
        let since = self.fallback_since.load(Ordering::Acquire);
        if since != 0 {
            // A batch still valid decides first: the node keeps to what Redis gave it.
            let held = self.central.held(alg, key, limit, now, cost);
            if let Some(d) = held.filter(|d| d.allowed) {
                return central(d, None);
            }
            let probe = now >= self.next_probe.load(Ordering::Acquire)
                && !self.probing.swap(true, Ordering::AcqRel);
            if !probe {
                return match held {
                    Some(d) => central(d, None),
                    None => self.share(alg, key, limit, now, cost, None, None),
                };
            }
            self.next_probe.store(
                now.saturating_add(self.config.probe_every),
                Ordering::Release,
            );
            // Cleared even if the caller drops this future mid-probe.
            let guard = ProbeGuard(&self.probing);
            // Only an answer of Redis itself counts as its return (not the batch, nor an
            // earlier refusal).
            let r = self.central.probe(alg, key, limit, now, cost).await;
            drop(guard);
            return match r {
                Ok(decision) => {
                    let transition = self
                        .fallback_since
                        .compare_exchange(since, 0, Ordering::AcqRel, Ordering::Acquire)
                        .ok()
                        .map(|s| Transition::ToCentral {
                            fallback_since: s - 1,
                        });
                    central(decision, transition)
                }
                Err(e) if e.is_unavailable() => self.local(alg, key, limit, now, cost, None, None),
                Err(e) => self.local(alg, key, limit, now, cost, None, Some(e)),
            };
        }
        match self.central.check(alg, key, limit, now, cost).await {
            Ok(decision) => central(decision, None),
            Err(e) if e.is_unavailable() => {
                self.next_probe.store(
                    now.saturating_add(self.config.probe_every),
                    Ordering::Release,
                );
                // Only the call that flips the mode reports the transition.
                let t = self
                    .fallback_since
                    .compare_exchange(
                        0,
                        now.saturating_add(1),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .ok()
                    .map(|_| Transition::ToFallback { cause: e });
                self.local(alg, key, limit, now, cost, t, None)
            }
            Err(e) => self.local(alg, key, limit, now, cost, None, Some(e)),
        }
    }

    /// Without Redis: the batch held while it is valid, then the node's share.
    #[allow(clippy::too_many_arguments)]
    fn local(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        transition: Option<Transition>,
        problem: Option<Error>,
    ) -> Outcome {
        if problem.is_none()
            && let Some(d) = self.central.held(alg, key, limit, now, cost)
        {
            return central(d, transition);
        }
        self.share(alg, key, limit, now, cost, transition, problem)
    }

    /// The node's share of the limit, on the local limiter.
    #[allow(clippy::too_many_arguments)]
    fn share(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        transition: Option<Transition>,
        problem: Option<Error>,
    ) -> Outcome {
        let share = self.config.share.apply(limit);
        Outcome {
            decision: self.local.decide(alg, key, &share, now, cost),
            source: Source::Local,
            transition,
            problem,
        }
    }
}

/// A decision of Redis, or of a batch taken from it.
fn central(decision: Decision, transition: Option<Transition>) -> Outcome {
    Outcome {
        decision,
        source: Source::Central,
        transition,
        problem: None,
    }
}

/// Marks the end of a probe when dropped.
struct ProbeGuard<'a>(&'a AtomicBool);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_down_but_keep_one_permit() {
        let l = Limit::from_nanos(10, 1000).unwrap().with_burst(7).unwrap();
        let q = Share::one_of(4).apply(&l);
        assert_eq!((q.count(), q.burst(), q.period()), (2, 1, 1000));
        let tiny = Share::one_of(100).apply(&l);
        assert_eq!((tiny.count(), tiny.burst()), (1, 1));
        let all = Share::fraction(5, 3).apply(&l);
        assert_eq!((all.count(), all.burst()), (10, 7));
    }
}
