//! Deciding locally while the center does not answer (seed 002 §4.4(4)).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_limits::{Algorithm, AnyAlgorithm, AnyState, Decision, Limit, Nanos};

use crate::center::{AlgorithmId, Center, CenterError};
use crate::debt::Debt;
use crate::share::{Share, take_what_fits};
use crate::sweep::Sweep;

/// Where decisions are being made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// By the center.
    Central,
    /// Locally, since `since` (the caller's clock), because the center did not answer.
    Fallback {
        /// When the fallback began.
        since: Nanos,
    },
}

/// A change of [`Mode`], returned by the call that caused it so the caller can log it
/// once.
#[derive(Debug)]
pub enum Transition<E> {
    /// The center stopped answering; decisions are local from now on.
    ToFallback {
        /// Why (a time out, a connection error, a server that does not serve).
        cause: E,
    },
    /// The center answered a probe; decisions are central again.
    ToCentral {
        /// When the fallback had begun.
        fallback_since: Nanos,
    },
}

/// Who decided a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The center (or a batch or lease taken from it).
    Central,
    /// The local limiter.
    Local,
}

/// The answer of a [`FallbackLimiter`]: always a decision, never an error.
#[derive(Debug)]
pub struct Outcome<E> {
    /// The decision.
    pub decision: Decision,
    /// Who made it.
    pub source: Source,
    /// The mode change this call caused, if any.
    pub transition: Option<Transition<E>>,
    /// A configuration error of the center for this rule (e.g. an algorithm or a limit
    /// Redis' scripts cannot run): decided locally, mode unchanged. Worth logging.
    pub problem: Option<E>,
}

/// A fallback's state and counters (for `/metrics` and `/v1/cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackStats {
    /// Where decisions are being made now.
    pub mode: Mode,
    /// When the current mode began (the caller's clock); `None` while central since the
    /// start.
    pub since: Option<Nanos>,
    /// Changes of mode so far (to fallback and back count one each).
    pub transitions: u64,
    /// Decisions made by the center (or from a batch or lease taken from it).
    pub decisions_central: u64,
    /// Decisions made locally (the share, or a rule the center could not run).
    pub decisions_local: u64,
}

/// How the fallback behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FallbackConfig {
    /// The local limit during a fallback (default: all of it; use [`Share::one_of`] with
    /// the number of nodes).
    pub share: Share,
    /// During a fallback, one request per this interval (caller's clock, default 100 ms)
    /// tries the center again; if it answers, decisions are central again.
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

/// A [`Center`] (Redis exact or batched, a token server) that decides locally while the
/// center does not answer.
///
/// No call waits longer than the center's own timeout (50 ms by default for both): a call
/// that fails as unavailable ([`CenterError::is_unavailable`]) is answered by the local
/// limiter and switches to [`Mode::Fallback`]; after that only one request per
/// [`FallbackConfig::probe_every`] tries the center (within the same timeout) and the
/// others are decided locally at once. Locally means: from the batch or lease the node
/// holds while it is valid ([`Center::held`]: its permits, nothing more, until it expires),
/// then with the node's share of the limit. Only an answer of the center itself ends a
/// fallback — a probe is never answered from a batch or from an earlier refusal.
///
/// **Guarantee.** The share's state counts every permit the node admits, its central ones
/// too (as far as the share holds them), so in a window in which the center stops
/// answering a node admits at most `max(a, L/N)`, `a` what it admitted through the center
/// (`L` the limit, `1/N` the share). Every permit the share admits is owed to the center
/// ([`Debt`]) and charged to it, unconditionally, before the node's next central decision
/// of the key, in the same call ([`Center::probe`]); while that call is on its way the key
/// is decided locally, and if it fails the debt stays (a charge that timed out may have
/// been counted: charging it again only over-counts) and so does the fallback. So the
/// decisions the center takes after a node's return count what that node admitted
/// locally.
#[derive(Debug)]
pub struct FallbackLimiter<B> {
    central: B,
    keys: parking_lot::Mutex<Keys>,
    config: FallbackConfig,
    /// 0: central; otherwise the fallback's start + 1.
    fallback_since: AtomicU64,
    next_probe: AtomicU64,
    probing: AtomicBool,
    /// Some key may owe the center or have a charge on its way: a central call must look
    /// at its key's debt before it asks. Set under the keys' lock with every debt; cleared
    /// under it by a sweep that finds none, so the usual central call (nothing owed
    /// anywhere) asks the center without taking the lock first.
    owing: AtomicBool,
    counters: Counters,
}

/// What [`FallbackStats`] counts.
#[derive(Debug, Default)]
struct Counters {
    /// 0: never changed; else the time of the last change + 1.
    changed_at: AtomicU64,
    transitions: AtomicU64,
    central: AtomicU64,
    local: AtomicU64,
}

/// A key's share state and debt, per algorithm (its parameters included) and key.
#[derive(Debug, Default)]
struct Keys {
    /// By a copyable id first, so a lookup by a borrowed key allocates nothing.
    by_algorithm: HashMap<AlgorithmId, HashMap<String, KeyState>>,
    /// Idle keys are forgotten at most every
    /// [`PRUNE_EVERY`](crate::sweep::PRUNE_EVERY) of the caller's clock.
    sweep: Sweep,
}

#[derive(Debug)]
struct KeyState {
    alg: AnyAlgorithm,
    limit: Limit,
    share: Limit,
    /// The node's share of the limit: its local admissions, and its central ones as far as
    /// the share holds them (so a share used through the center is not spent again locally).
    state: AnyState,
    /// Local admissions the center has not counted yet.
    debt: Debt,
    /// A call charging this key's debt is on its way to the center.
    charging: bool,
}

impl KeyState {
    /// Decides on the share; an admission is owed to the center.
    fn decide_owed(&mut self, now: Nanos, cost: u64) -> Decision {
        let d = self.alg.check(&mut self.state, &self.share, now, cost);
        if d.allowed {
            self.debt.record(&self.alg, &self.limit, now, cost);
        }
        d
    }
}

/// One request, with what each step of it needs worked out once per call.
struct Req<'a> {
    alg: &'a AnyAlgorithm,
    id: AlgorithmId,
    key: &'a str,
    limit: &'a Limit,
    /// The node's share of `limit`.
    share: Limit,
    now: Nanos,
    cost: u64,
}

impl Keys {
    /// The request's key state, created if new, with the limit and share as given now.
    fn get(&mut self, r: &Req<'_>) -> Option<&mut KeyState> {
        let keys = self.by_algorithm.entry(r.id).or_default();
        // Looked up by the borrowed key: no allocation once the key is known.
        if !keys.contains_key(r.key) {
            let k = KeyState {
                alg: *r.alg,
                limit: *r.limit,
                share: r.share,
                state: r.alg.new_state(&r.share, r.now),
                debt: Debt::new(),
                charging: false,
            };
            keys.insert(r.key.to_string(), k);
        }
        let k = keys.get_mut(r.key)?;
        (k.limit, k.share) = (*r.limit, r.share);
        Some(k)
    }

    /// Forgets keys whose share state is new again and who owe nothing (a debt that no
    /// longer weighs is dropped); returns whether some key still owes or is being charged.
    fn prune(&mut self, now: Nanos) -> bool {
        let mut owing = false;
        for keys in self.by_algorithm.values_mut() {
            keys.retain(|_, k| {
                if !k.charging && k.debt.due(&k.alg, &k.limit, now) == 0 {
                    k.debt = Debt::new();
                }
                owing |= k.charging || !k.debt.is_empty();
                k.charging || !k.debt.is_empty() || !k.alg.is_idle(&k.state, &k.share, now)
            });
        }
        self.by_algorithm.retain(|_, keys| !keys.is_empty());
        owing
    }
}

/// What asking the center came to.
enum Asked<E> {
    /// A charge of the key was on its way: decided locally (and owed).
    Local(Decision),
    /// The center's answer, or why there was none.
    Answer(Result<Decision, E>),
}

impl<C: Center> FallbackLimiter<C> {
    /// `central` with a local fallback.
    pub fn new(central: C, config: FallbackConfig) -> Self {
        Self {
            central,
            keys: parking_lot::Mutex::new(Keys::default()),
            config,
            fallback_since: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            owing: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// The center.
    pub fn central(&self) -> &C {
        &self.central
    }

    /// The configuration.
    pub fn config(&self) -> &FallbackConfig {
        &self.config
    }

    /// Where decisions are made now, since when, and how many each way so far.
    pub fn stats(&self) -> FallbackStats {
        let c = &self.counters;
        let mode = self.mode();
        FallbackStats {
            mode,
            since: match mode {
                Mode::Central => c.changed_at.load(Ordering::Acquire).checked_sub(1),
                Mode::Fallback { since } => Some(since),
            },
            transitions: c.transitions.load(Ordering::Relaxed),
            decisions_central: c.central.load(Ordering::Relaxed),
            decisions_local: c.local.load(Ordering::Relaxed),
        }
    }

    /// Where decisions are being made now.
    pub fn mode(&self) -> Mode {
        match self.fallback_since.load(Ordering::Acquire) {
            0 => Mode::Central,
            s => Mode::Fallback { since: s - 1 },
        }
    }

    /// What `key` owes the center at `now`: permits its share admitted that the center has
    /// not counted yet and that still weigh ([`Debt::due`]).
    pub fn owed(&self, alg: &AnyAlgorithm, key: &str, limit: &Limit, now: Nanos) -> u64 {
        let keys = self.keys.lock();
        keys.by_algorithm
            .get(&AlgorithmId::of(alg))
            .and_then(|m| m.get(key))
            .map_or(0, |k| k.debt.due(alg, limit, now))
    }

    /// The keys, swept of idle ones when a sweep is due at `now`.
    fn keys(&self, now: Nanos) -> parking_lot::MutexGuard<'_, Keys> {
        let mut keys = self.keys.lock();
        if keys.sweep.due(now) {
            let owing = keys.prune(now);
            // Under the lock, as every debt is recorded: no debt is missed.
            self.owing.store(owing, Ordering::Release);
        }
        keys
    }

    /// Decides on the key's share, the admission owed to the center; the caller holds the
    /// lock.
    fn decide_owed(&self, k: &mut KeyState, r: &Req<'_>) -> Decision {
        let d = k.decide_owed(r.now, r.cost);
        if d.allowed {
            self.owing.store(true, Ordering::Release);
        }
        d
    }

    /// Decides a request; never fails, never waits longer than the center's timeout.
    pub async fn check(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Outcome<C::Error> {
        let out = self.decide(alg, key, limit, now, cost).await;
        let c = &self.counters;
        match out.source {
            Source::Central => c.central.fetch_add(1, Ordering::Relaxed),
            Source::Local => c.local.fetch_add(1, Ordering::Relaxed),
        };
        if out.transition.is_some() {
            c.transitions.fetch_add(1, Ordering::Relaxed);
            c.changed_at.store(now.saturating_add(1), Ordering::Release);
        }
        out
    }

    async fn decide(
        &self,
        alg: &AnyAlgorithm,
        key: &str,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Outcome<C::Error> {
        let r = Req {
            alg,
            id: AlgorithmId::of(alg),
            key,
            limit,
            share: self.config.share.apply(limit),
            now,
            cost,
        };
        let since = self.fallback_since.load(Ordering::Acquire);
        if since != 0
            && let Some(out) = self.fallback(&r, since).await
        {
            return out;
        }
        match self.ask(&r, false).await {
            Asked::Local(d) => local(d, None, None),
            Asked::Answer(Ok(decision)) => central(decision, None),
            Asked::Answer(Err(e)) if e.is_unavailable() => {
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
                self.without_center(&r, t)
            }
            Asked::Answer(Err(e)) => self.problem(&r, e),
        }
    }

    /// In fallback since `since`: the batch held, the share, or a probe. `None` when the
    /// mode turned central meanwhile (a probe of another request): the caller asks the
    /// center.
    async fn fallback(&self, r: &Req<'_>, since: Nanos) -> Option<Outcome<C::Error>> {
        // A batch still valid decides first: the node keeps to what the center gave it.
        let held = self.central.held(r.alg, r.key, r.limit, r.now, r.cost);
        if let Some(d) = held.filter(|d| d.allowed) {
            self.counted_centrally(r);
            return Some(central(d, None));
        }
        let probe = r.now >= self.next_probe.load(Ordering::Acquire)
            && !self.probing.swap(true, Ordering::AcqRel);
        if !probe {
            return match held {
                Some(d) => Some(central(d, None)),
                None => self.share_if_fallback(r),
            };
        }
        self.next_probe.store(
            r.now.saturating_add(self.config.probe_every),
            Ordering::Release,
        );
        // Cleared even if the caller drops this future mid-probe.
        let guard = ProbeGuard(&self.probing);
        // Only an answer of the center itself counts as its return (not the batch, nor an
        // earlier refusal); the probe charges what the key owes first.
        let asked = self.ask(r, true).await;
        drop(guard);
        Some(match asked {
            Asked::Local(d) => local(d, None, None),
            Asked::Answer(Ok(decision)) => {
                let transition = self
                    .fallback_since
                    .compare_exchange(since, 0, Ordering::AcqRel, Ordering::Acquire)
                    .ok()
                    .map(|s| Transition::ToCentral {
                        fallback_since: s - 1,
                    });
                central(decision, transition)
            }
            Asked::Answer(Err(e)) if e.is_unavailable() => self.without_center(r, None),
            Asked::Answer(Err(e)) => self.problem(r, e),
        })
    }

    /// Asks the center (`probe`: always the center itself), charging what the key owes
    /// first; while another call charges the key, decides locally instead. Takes the keys'
    /// lock once when nothing is owed (after an admission, to count it on the share; not at
    /// all after a refusal), twice otherwise.
    async fn ask(&self, r: &Req<'_>, probe: bool) -> Asked<C::Error> {
        let owed = if probe || self.owing.load(Ordering::Acquire) {
            let mut keys = self.keys(r.now);
            match keys.get(r) {
                Some(k) if k.charging => return Asked::Local(self.decide_owed(k, r)),
                Some(k) if !k.debt.is_empty() => {
                    if k.debt.due(r.alg, r.limit, r.now) == 0 {
                        k.debt = Debt::new();
                        None
                    } else {
                        k.charging = true;
                        Some(k.debt.take())
                    }
                }
                _ => None,
            }
        } else {
            None
        };
        let charge = owed.as_ref().map_or(0, |d| d.due(r.alg, r.limit, r.now));
        // Puts the debt back if this call fails or is dropped on the way.
        let mut pending = Pending {
            keys: &self.keys,
            id: r.id,
            key: r.key,
            owed,
        };
        let answer = if probe || charge > 0 {
            self.central
                .probe(r.alg, r.key, r.limit, r.now, r.cost, charge)
                .await
        } else {
            self.central
                .check(r.alg, r.key, r.limit, r.now, r.cost)
                .await
        };
        if let Ok(d) = &answer
            && (d.allowed || pending.owed.is_some())
        {
            let mut keys = self.keys(r.now);
            if let Some(k) = keys.get(r) {
                if pending.owed.take().is_some() {
                    k.charging = false;
                }
                if d.allowed {
                    take_what_fits(r.alg, &mut k.state, &r.share, r.now, r.cost);
                }
            }
        }
        drop(pending);
        Asked::Answer(answer)
    }

    /// A permit admitted from a batch or lease: the share counts it (as far as it holds).
    fn counted_centrally(&self, r: &Req<'_>) {
        if let Some(k) = self.keys(r.now).get(r) {
            take_what_fits(r.alg, &mut k.state, &r.share, r.now, r.cost);
        }
    }

    /// In fallback, without asking the center: the node's share, the admission owed. `None`
    /// if the mode is central again and no charge of the key is on its way: then only a
    /// central decision may follow what the key owes.
    fn share_if_fallback(&self, r: &Req<'_>) -> Option<Outcome<C::Error>> {
        let mut keys = self.keys(r.now);
        // Under the lock: a call that takes the key's debt after this sees this admission.
        let k = keys.get(r)?;
        if self.fallback_since.load(Ordering::Acquire) == 0 && !k.charging {
            return None;
        }
        Some(local(self.decide_owed(k, r), None, None))
    }

    /// The center did not answer: the batch held while it is valid, then the share, owed.
    fn without_center(
        &self,
        r: &Req<'_>,
        transition: Option<Transition<C::Error>>,
    ) -> Outcome<C::Error> {
        if let Some(d) = self.central.held(r.alg, r.key, r.limit, r.now, r.cost) {
            if d.allowed {
                self.counted_centrally(r);
            }
            return central(d, transition);
        }
        let d = match self.keys(r.now).get(r) {
            Some(k) => self.decide_owed(k, r),
            None => r
                .alg
                .peek(&r.alg.new_state(&r.share, r.now), &r.share, r.now, r.cost),
        };
        local(d, transition, None)
    }

    /// A rule the center cannot run: decided on the share, owed to no one.
    fn problem(&self, r: &Req<'_>, problem: C::Error) -> Outcome<C::Error> {
        let d = match self.keys(r.now).get(r) {
            Some(k) => k.alg.check(&mut k.state, &r.share, r.now, r.cost),
            None => r
                .alg
                .peek(&r.alg.new_state(&r.share, r.now), &r.share, r.now, r.cost),
        };
        local(d, None, Some(problem))
    }
}

/// A key's debt on its way to the center: put back, and the key's charge marked done, unless
/// the call succeeded (`owed` taken).
struct Pending<'a> {
    keys: &'a parking_lot::Mutex<Keys>,
    id: AlgorithmId,
    key: &'a str,
    owed: Option<Debt>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(owed) = self.owed.take() else {
            return;
        };
        let mut keys = self.keys.lock();
        if let Some(k) = keys
            .by_algorithm
            .get_mut(&self.id)
            .and_then(|m| m.get_mut(self.key))
        {
            k.debt.restore(owed);
            k.charging = false;
        }
    }
}

/// A decision of the node's share.
fn local<E>(
    decision: Decision,
    transition: Option<Transition<E>>,
    problem: Option<E>,
) -> Outcome<E> {
    Outcome {
        decision,
        source: Source::Local,
        transition,
        problem,
    }
}

/// A decision of the center, or of a batch or lease taken from it.
fn central<E>(decision: Decision, transition: Option<Transition<E>>) -> Outcome<E> {
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
    use sluice_limits::{AlgorithmKind, Options};

    const S: Nanos = 1_000_000_000;

    #[derive(Debug, thiserror::Error)]
    #[error("the center does not answer")]
    struct Down;

    impl CenterError for Down {
        fn is_unavailable(&self) -> bool {
            true
        }
    }

    /// A center in memory that can be taken down, holds probes at a gate, and remembers the
    /// charges it was sent.
    #[derive(Default)]
    struct Flaky {
        states: parking_lot::Mutex<HashMap<String, AnyState>>,
        down: AtomicBool,
        charges: parking_lot::Mutex<Vec<u64>>,
        gate: Option<tokio::sync::Semaphore>,
        /// A batch or lease taken from the center: permits left, valid until.
        batch: parking_lot::Mutex<Option<(u64, Nanos)>>,
    }

    impl Flaky {
        /// Decides from the batch while it is valid: its permits, then refusals until it
        /// ends (as a batched store or a token client's lease).
        fn batch_decision(&self, limit: &Limit, now: Nanos, cost: u64) -> Option<Decision> {
            let mut batch = self.batch.lock();
            let (left, until) = batch.as_mut().filter(|b| now < b.1)?;
            if *left >= cost {
                *left -= cost;
                return Some(Decision::allow(limit.count(), *left, *until - now));
            }
            let wait = *until - now;
            Some(Decision::deny(limit.count(), *left, wait, Some(wait)))
        }

        fn unavailable(&self) -> Option<Down> {
            self.down.load(Ordering::Acquire).then_some(Down)
        }

        /// Counts `charge` as admitted whatever the limit says, then decides (as Redis does).
        fn decide(
            &self,
            alg: &AnyAlgorithm,
            key: &str,
            limit: &Limit,
            now: Nanos,
            cost: u64,
            charge: u64,
        ) -> Decision {
            let mut states = self.states.lock();
            let state = states
                .entry(key.to_string())
                .or_insert_with(|| alg.new_state(limit, now));
            if charge > 0 {
                alg.charge(state, limit, now, charge);
            }
            alg.check(state, limit, now, cost)
        }
    }

    impl Center for Flaky {
        type Error = Down;

        fn check(
            &self,
            alg: &AnyAlgorithm,
            key: &str,
            limit: &Limit,
            now: Nanos,
            cost: u64,
        ) -> impl Future<Output = Result<Decision, Down>> + Send {
            let r = match (self.batch_decision(limit, now, cost), self.unavailable()) {
                (Some(d), _) if d.allowed => Ok(d),
                (_, Some(e)) => Err(e),
                (_, None) => Ok(self.decide(alg, key, limit, now, cost, 0)),
            };
            std::future::ready(r)
        }

        fn held(
            &self,
            _alg: &AnyAlgorithm,
            _key: &str,
            limit: &Limit,
            now: Nanos,
            cost: u64,
        ) -> Option<Decision> {
            self.batch_decision(limit, now, cost)
        }

        async fn probe(
            &self,
            alg: &AnyAlgorithm,
            key: &str,
            limit: &Limit,
            now: Nanos,
            cost: u64,
            charge: u64,
        ) -> Result<Decision, Down> {
            if let Some(gate) = &self.gate {
                let _pass = gate.acquire().await;
            }
            if let Some(e) = self.unavailable() {
                return Err(e);
            }
            self.charges.lock().push(charge);
            Ok(self.decide(alg, key, limit, now, cost, charge))
        }
    }

    fn rig(gate: bool) -> (FallbackLimiter<Flaky>, AnyAlgorithm, Limit) {
        let central = Flaky {
            gate: gate.then(|| tokio::sync::Semaphore::new(0)),
            ..Flaky::default()
        };
        let config = FallbackConfig {
            share: Share::one_of(2),
            probe_every: S / 10,
        };
        let alg = AnyAlgorithm::new(AlgorithmKind::FixedWindow, Options::default());
        let limit = Limit::from_nanos(100, S).unwrap();
        (FallbackLimiter::new(central, config), alg, limit)
    }

    /// Admissions of `n` requests at `now`, and who made them.
    async fn admit(
        f: &FallbackLimiter<Flaky>,
        alg: &AnyAlgorithm,
        limit: &Limit,
        now: Nanos,
        n: usize,
    ) -> (u64, u64) {
        let (mut central, mut local) = (0, 0);
        for _ in 0..n {
            let out = f.check(alg, "k", limit, now, 1).await;
            if out.decision.allowed {
                match out.source {
                    Source::Central => central += 1,
                    Source::Local => local += 1,
                }
            }
        }
        (central, local)
    }

    #[tokio::test]
    async fn the_share_counts_central_admissions_and_redis_is_charged_on_the_return() {
        let (f, alg, l) = rig(false);
        let t = 10 * S;
        // 30 through Redis, then Redis stops answering: the share of 50 holds 20 more, not
        // 50 on top (max(30, 50) in the window).
        assert_eq!(admit(&f, &alg, &l, t, 30).await, (30, 0));
        f.central.down.store(true, Ordering::Release);
        assert_eq!(admit(&f, &alg, &l, t + 1, 100).await, (0, 20));
        assert!(matches!(f.mode(), Mode::Fallback { .. }));
        // The next window in fallback: the whole share, owed to Redis.
        let w = 11 * S;
        assert_eq!(admit(&f, &alg, &l, w, 100).await, (0, 50));
        assert_eq!(f.owed(&alg, "k", &l, w + 1), 50);
        // Redis is back: the probe charges the 50 first, so Redis admits 50 more in this
        // window, not 100 (the window admits L, not L + L/2).
        f.central.down.store(false, Ordering::Release);
        let (central, local) = admit(&f, &alg, &l, w + S / 5, 100).await;
        assert_eq!((central, local), (50, 0));
        assert_eq!(*f.central.charges.lock(), [50]);
        assert_eq!(f.mode(), Mode::Central);
        assert_eq!(f.owed(&alg, "k", &l, w + S / 5), 0);
    }

    #[tokio::test]
    async fn a_failed_charge_stays_owed_and_the_node_stays_in_fallback() {
        let (f, alg, l) = rig(false);
        let w = 11 * S;
        f.central.down.store(true, Ordering::Release);
        assert_eq!(admit(&f, &alg, &l, w, 10).await, (0, 10));
        // Probes fail: nothing was charged, all of it is still owed, and still local.
        for i in 1..4 {
            let out = f.check(&alg, "k", &l, w + i * S / 10, 1).await;
            assert_eq!(out.source, Source::Local);
            assert!(matches!(f.mode(), Mode::Fallback { .. }));
        }
        assert_eq!(f.owed(&alg, "k", &l, w + S / 2), 13);
        assert!(f.central.charges.lock().is_empty());
        // Another key returns first: "k" still owes, and its first central call pays.
        f.central.down.store(false, Ordering::Release);
        let out = f.check(&alg, "other", &l, w + S / 2, 1).await;
        assert!(matches!(out.transition, Some(Transition::ToCentral { .. })));
        assert_eq!(f.owed(&alg, "k", &l, w + S / 2), 13);
        assert_eq!(admit(&f, &alg, &l, w + S / 2, 100).await, (87, 0));
        assert_eq!(*f.central.charges.lock(), [0, 13]);
    }

    #[tokio::test]
    async fn while_a_charge_is_on_its_way_the_key_is_decided_locally_and_a_dropped_charge_stays_owed()
     {
        let (f, alg, l) = rig(true);
        let w = 11 * S;
        f.central.down.store(true, Ordering::Release);
        assert_eq!(admit(&f, &alg, &l, w, 10).await, (0, 10));
        f.central.down.store(false, Ordering::Release);
        // The probe (held at the gate) carries the 10; meanwhile the key is decided on the
        // share and owes that too.
        let mut probe = Box::pin(f.check(&alg, "k", &l, w + S / 5, 1));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), &mut probe)
                .await
                .is_err()
        );
        let out = f.check(&alg, "k", &l, w + S / 5, 1).await;
        assert!(
            out.decision.allowed && out.source == Source::Local,
            "{out:?}"
        );
        // Dropped on its way (the caller gave up): all 11 stay owed.
        drop(probe);
        assert_eq!(f.owed(&alg, "k", &l, w + S / 5), 11);
        // The next probe gets through with all of it.
        f.central.gate.as_ref().unwrap().add_permits(10);
        let out = f.check(&alg, "k", &l, w + 3 * S / 10, 1).await;
        assert!(matches!(out.transition, Some(Transition::ToCentral { .. })));
        assert_eq!(*f.central.charges.lock(), [11]);
        assert_eq!(admit(&f, &alg, &l, w + S / 2, 100).await, (88, 0));
    }

    #[tokio::test]
    async fn central_calls_skip_the_debts_once_a_sweep_finds_none_and_a_new_debt_is_charged() {
        let (f, alg, l) = rig(false);
        let t = 10 * S;
        f.central.down.store(true, Ordering::Release);
        assert_eq!(admit(&f, &alg, &l, t, 5).await, (0, 5));
        assert!(f.owing.load(Ordering::Acquire));
        f.central.down.store(false, Ordering::Release);
        assert_eq!(admit(&f, &alg, &l, t + S / 5, 1).await, (1, 0));
        assert_eq!(*f.central.charges.lock(), [5]);
        // The sweep ten seconds on finds nothing owed: central calls ask at once.
        assert_eq!(admit(&f, &alg, &l, t + 20 * S, 1).await, (1, 0));
        assert!(!f.owing.load(Ordering::Acquire));
        // Down again: what the share admits is owed, and charged on the return.
        f.central.down.store(true, Ordering::Release);
        assert_eq!(admit(&f, &alg, &l, t + 21 * S, 3).await, (0, 3));
        assert!(f.owing.load(Ordering::Acquire));
        f.central.down.store(false, Ordering::Release);
        assert_eq!(admit(&f, &alg, &l, t + 21 * S + S / 5, 1).await, (1, 0));
        assert_eq!(*f.central.charges.lock(), [5, 3]);
        assert_eq!(f.owed(&alg, "k", &l, t + 21 * S + S / 5), 0);
    }

    #[tokio::test]
    async fn a_fallback_keeps_to_the_batch_then_to_a_share_that_counts_the_batch() {
        let (f, alg, l) = rig(false);
        let lease = S / 10;
        let t = 10 * S;
        // 30 of a 40-permit batch (or lease) used centrally.
        *f.central.batch.lock() = Some((40, t + lease));
        assert_eq!(admit(&f, &alg, &l, t, 30).await, (30, 0));
        // The center is gone. While the batch is valid: its 10 permits, then refusals until
        // it ends — not the share on top.
        f.central.down.store(true, Ordering::Release);
        let mid = t + lease / 2;
        assert_eq!(admit(&f, &alg, &l, mid, 10).await, (10, 0));
        let out = f.check(&alg, "k", &l, mid, 1).await;
        assert!(
            !out.decision.allowed && out.source == Source::Central,
            "{out:?}"
        );
        assert_eq!(out.decision.retry_after, Some(lease / 2));
        // After it: the share of 50, less the 40 taken from the batch in this window.
        assert_eq!(admit(&f, &alg, &l, t + 2 * lease, 100).await, (0, 10));
        // The next window: the whole share.
        assert_eq!(admit(&f, &alg, &l, t + S, 100).await, (0, 50));
        let stats = f.stats();
        assert!(matches!(stats.mode, Mode::Fallback { .. }), "{stats:?}");
        assert_eq!(stats.transitions, 1);
        assert_eq!((stats.decisions_central, stats.decisions_local), (41, 200));
    }
}
