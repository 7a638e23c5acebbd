//! Message pacing with token accounts (seed 004, Danner & Jelasity).
//!
//! Every link gets a [`TokenAccount`]. Once per period `Δ` the account either sends a
//! *proactive* message or saves a token (Alg. 4, lines 2–10); when news arrives (a jump in
//! demand, a received message) the *reactive* function spends saved tokens on messages sent
//! at once (Alg. 4, lines 11–18). Proactive traffic keeps information flowing when messages
//! are lost; reactive traffic lets a hotspot cross the graph in a few hops instead of a few
//! periods. The account never holds more than `C` tokens, which bounds bursts (seed 004 §3.4):
//!
//! > in every half-open window `[s, s + t)`, at most `⌈t/Δ⌉ + C` messages are sent on the
//! > link — `⌊t/Δ⌋ + C` when `t` is a whole number of periods, the paper's form.
//!
//! (For arbitrary `t` the paper's `⌊t/Δ⌋ + C` is one too small: a purely proactive link sends
//! one message inside a window of length `Δ/2` that contains a period boundary.)
//!
//! Sans-IO: the caller passes the time and a uniform random number `draw ∈ [0, 1)` to every
//! call; nothing here reads a clock or a global RNG.
//!
//! ```
//! use sluice_coord::pacing::{Strategy, TokenAccount};
//!
//! const DELTA: u64 = 1_000_000; // 1 ms period
//! let strategy = Strategy::randomized(5, 10).unwrap();
//! let mut link = TokenAccount::new(strategy, DELTA, 0).unwrap();
//! // Quiet periods: the account saves tokens (randomized: no proactive message below A−1).
//! for k in 1..=4 {
//!     assert!(!link.on_tick(k * DELTA, 0.5));
//! }
//! assert_eq!(link.tokens(), 4);
//! // News: spend a/A = 4/5 tokens in expectation, at once; draw 0.1 < 0.8 rounds up to 1.
//! assert_eq!(link.on_news(4 * DELTA + 7, 0.1), 1);
//! assert_eq!(link.tokens(), 3);
//! ```

use thiserror::Error;

/// Nanoseconds since a caller-chosen epoch (the same unit as `sluice_limits::Nanos`).
type Nanos = u64;

/// Impossible token-account parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PacingError {
    /// `A` must be a positive integer (seed 004 eq. 3 and 5 divide by it).
    #[error("token account parameter A must be at least 1, got {a}")]
    ZeroA {
        /// The rejected `A`.
        a: u32,
    },
    /// The randomized proactive function (seed 004 eq. 4) ramps from `A − 1` up to `C`,
    /// which needs `A ≤ C` (its denominator is `C − A + 1`).
    #[error("randomized token account needs A <= C, got A = {a}, C = {c}")]
    RandomizedAAboveC {
        /// The rejected `A`.
        a: u32,
        /// The rejected `C`.
        c: u32,
    },
    /// The period `Δ` must be positive.
    #[error("token account period must be positive")]
    ZeroPeriod,
}

/// The proactive and reactive functions of a token account (seed 004 §3.3).
///
/// `a` is the balance, `C` the capacity (the smallest balance at which the proactive
/// function is 1, so the balance never exceeds it), `A` how fast tokens are spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Purely proactive (the baseline): one message every period, never reactive.
    /// Equivalent to `Simple { c: 0 }`.
    Proactive,
    /// Simple token account, eq. 1–2: proactive only when full (`a ≥ C`); one reactive
    /// message per news while `a > 0`.
    Simple {
        /// Capacity `C ≥ 0`.
        c: u32,
    },
    /// Generalized token account, eq. 1 and 3: proactive only when full; reactive
    /// `⌊(A − 1 + a)/A⌋` for useful news, `⌊(A − 1 + a)/(2A)⌋` otherwise.
    Generalized {
        /// Spending rate `A ≥ 1` (`A = 1` spends everything; `A ≥ C` acts like `Simple`).
        a: u32,
        /// Capacity `C ≥ 0`.
        c: u32,
    },
    /// Randomized token account, eq. 4–5: proactive with probability rising linearly from
    /// 0 at `a = A − 1` to 1 at `a = C`; reactive `a/A` in expectation (randomly rounded)
    /// for useful news, nothing otherwise.
    Randomized {
        /// Spending rate `1 ≤ A ≤ C`.
        a: u32,
        /// Capacity `C ≥ A`.
        c: u32,
    },
}

impl Strategy {
    /// A simple token account with capacity `c` (never fails; `c = 0` is the baseline).
    #[must_use]
    pub fn simple(c: u32) -> Self {
        Self::Simple { c }
    }

    /// A generalized token account; errors if `a = 0`.
    pub fn generalized(a: u32, c: u32) -> Result<Self, PacingError> {
        Self::Generalized { a, c }.validated()
    }

    /// A randomized token account; errors unless `1 ≤ a ≤ c`.
    pub fn randomized(a: u32, c: u32) -> Result<Self, PacingError> {
        Self::Randomized { a, c }.validated()
    }

    /// Checks the parameters (the variants are public, so a value may be built directly).
    pub fn validated(self) -> Result<Self, PacingError> {
        match self {
            Self::Proactive | Self::Simple { .. } => Ok(self),
            Self::Generalized { a, .. } if a == 0 => Err(PacingError::ZeroA { a }),
            Self::Generalized { .. } => Ok(self),
            Self::Randomized { a, .. } if a == 0 => Err(PacingError::ZeroA { a }),
            Self::Randomized { a, c } if a > c => Err(PacingError::RandomizedAAboveC { a, c }),
            Self::Randomized { .. } => Ok(self),
        }
    }

    /// The capacity `C`: the balance never exceeds it, and the burst bound is `⌈t/Δ⌉ + C`.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        match *self {
            Self::Proactive => 0,
            Self::Simple { c } | Self::Generalized { c, .. } | Self::Randomized { c, .. } => c,
        }
    }

    /// PROACTIVE(a): the probability of sending a proactive message at the end of a period
    /// with balance `a` (eq. 1, eq. 4). Monotone non-decreasing, 1 for `a ≥ C`.
    #[must_use]
    pub fn proactive_probability(&self, balance: u32) -> f64 {
        let (num, den) = self.proactive_ratio(balance);
        f64::from(num) / f64::from(den)
    }

    /// PROACTIVE(a) as an exact ratio `num/den` with `num ≤ den`, `den ≥ 1`.
    fn proactive_ratio(&self, balance: u32) -> (u32, u32) {
        match *self {
            Self::Proactive => (1, 1),
            Self::Simple { c } | Self::Generalized { c, .. } => (u32::from(balance >= c), 1),
            Self::Randomized { a, c } => {
                // Ramp (a − A + 1)/(C − A + 1) on [A − 1, C]; validation ensures A ≤ C.
                let den = c.saturating_sub(a).saturating_add(1);
                if balance >= c {
                    (1, 1)
                } else if u64::from(balance) + 1 < u64::from(a) {
                    (0, 1)
                } else {
                    (balance + 1 - a, den)
                }
            }
        }
    }

    /// Whether a period ending with balance `balance` sends proactively, given `draw`.
    fn fires(&self, balance: u32, draw: f64) -> bool {
        let draw = sanitize(draw);
        let (num, den) = self.proactive_ratio(balance);
        // draw < num/den, without a division; num = den gives "always" for draw < 1.
        num == den || draw * f64::from(den) < f64::from(num)
    }

    /// REACTIVE(a, u) as an expected value (eq. 2, 3, 5); at most `a`.
    #[must_use]
    pub fn reactive_mean(&self, balance: u32, useful: bool) -> f64 {
        match *self {
            Self::Randomized { a, .. } if useful => f64::from(balance) / f64::from(a.max(1)),
            Self::Randomized { .. } => 0.0,
            _ => f64::from(self.reactive_count(balance, useful, 0.0)),
        }
    }

    /// REACTIVE(a, u) rounded as Alg. 4 line 13 does (randomly for the randomized strategy,
    /// `⌊r⌋ + Bernoulli(r − ⌊r⌋)` with `draw`), clamped to the balance: no overspending.
    fn reactive_count(&self, balance: u32, useful: bool, draw: f64) -> u32 {
        let n = match *self {
            Self::Proactive => 0,
            Self::Simple { .. } => u32::from(balance > 0),
            Self::Generalized { a, .. } => {
                let a = u64::from(a.max(1));
                let num = a - 1 + u64::from(balance);
                let den = if useful { a } else { 2 * a };
                u32::try_from(num / den).unwrap_or(u32::MAX)
            }
            Self::Randomized { a, .. } if useful => {
                let draw = sanitize(draw);
                let a = a.max(1);
                let whole = balance / a;
                let frac = balance % a; // r − ⌊r⌋ = frac / A, exactly
                whole + u32::from(draw * f64::from(a) < f64::from(frac))
            }
            Self::Randomized { .. } => 0,
        };
        n.min(balance)
    }
}

/// A caller's draw outside `[0, 1)` (or NaN) is clamped rather than trusted.
fn sanitize(draw: f64) -> f64 {
    if draw.is_nan() {
        0.0
    } else {
        draw.clamp(0.0, 1.0)
    }
}

/// Counters of what an account did, for experiments and assertions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacingStats {
    /// Periods that ended in a proactive message.
    pub proactive_sent: u64,
    /// Messages sent reactively (tokens spent).
    pub reactive_sent: u64,
    /// Periods whose token was saved in the account.
    pub tokens_saved: u64,
    /// Periods whose token was lost: the account was full and no proactive message went out
    /// (the period was missed by a late caller, or the burst guard vetoed it).
    pub tokens_lost: u64,
    /// Messages the strategy wanted but the burst guard refused. Zero whenever `on_tick` is
    /// called at every period boundary (checked by `tests/pacing_props.rs`); only a late
    /// caller, whose periods then bunch up, can make it positive.
    pub guard_vetoes: u64,
}

/// One link's token account (seed 004 Alg. 4), driven by the caller's time.
///
/// Periods end on the grid `t0 + kΔ`, `k ≥ 1`, where `t0` is the creation time, so the
/// long-run rate is exactly one token per `Δ` however `on_tick` is scheduled. Each period
/// end is decided once, by the first `on_tick` at or after it:
/// - the latest due period follows Alg. 4: send proactively with probability
///   PROACTIVE(a), else save a token;
/// - periods a late caller skipped entirely cannot send in the past, so they only save their
///   token (lost if the account is full).
///
/// **Burst bound.** Every message (proactive or reactive) also passes a burst guard — the
/// GCRA envelope with emission interval `Δ` and tolerance `C·Δ`, started empty at `t0`. A
/// message sequence passes that guard iff every window holds at most `⌊(τ_j − τ_i)/Δ⌋ + C + 1`
/// messages with times in `[τ_i, τ_j]`, i.e. at most `⌈t/Δ⌉ + C` in any half-open window of
/// length `t`. Called on time, Alg. 4 already satisfies this (a window holds at most the `C`
/// saved tokens plus one token per period boundary inside it), so the guard never changes
/// what the paper's algorithm does; it only protects the bound from a late caller, whose
/// skipped period ends would otherwise bunch up.
#[derive(Debug, Clone)]
pub struct TokenAccount {
    strategy: Strategy,
    period: Nanos,
    capacity: u32,
    balance: u32,
    /// End of the next undecided period.
    next_tick: Nanos,
    /// Latest time seen; earlier times are treated as this one.
    last_now: Nanos,
    /// Burst guard: theoretical arrival time of the GCRA envelope.
    tat: Nanos,
    stats: PacingStats,
}

impl TokenAccount {
    /// A fresh account with no tokens (as in seed 004 §4.1), first period ending at
    /// `now + period`.
    pub fn new(strategy: Strategy, period: Nanos, now: Nanos) -> Result<Self, PacingError> {
        let strategy = strategy.validated()?;
        if period == 0 {
            return Err(PacingError::ZeroPeriod);
        }
        Ok(Self {
            capacity: strategy.capacity(),
            strategy,
            period,
            balance: 0,
            next_tick: now.saturating_add(period),
            last_now: now,
            tat: now,
            stats: PacingStats::default(),
        })
    }

    /// The strategy in use.
    #[must_use]
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The period `Δ`.
    #[must_use]
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// The balance `a` (at most `C`).
    #[must_use]
    pub fn tokens(&self) -> u32 {
        self.balance
    }

    /// When the next period ends: the latest time at which `on_tick` should be called next.
    #[must_use]
    pub fn next_tick(&self) -> Nanos {
        self.next_tick
    }

    /// Counters since creation.
    #[must_use]
    pub fn stats(&self) -> PacingStats {
        self.stats
    }

    /// Ends every period due by `now`; returns `true` if a proactive message must be sent
    /// now (at most one per call). Calling before a period ends does nothing and returns
    /// `false`, so calling often is harmless; call at least once per period so that no
    /// period is skipped (a skipped period only saves its token). `draw` is a uniform random
    /// number in `[0, 1)`, used by the randomized strategy.
    pub fn on_tick(&mut self, now: Nanos, draw: f64) -> bool {
        let now = self.observe(now);
        if now < self.next_tick {
            return false;
        }
        let due = (now - self.next_tick) / self.period + 1;
        // Skipped period ends: no message can go out in the past, so their tokens are saved.
        self.save(due - 1);
        self.next_tick = self
            .next_tick
            .saturating_add(due.saturating_mul(self.period));
        // The latest period end: Alg. 4 lines 4–10.
        if self.strategy.fires(self.balance, draw) {
            if self.admit(now, 1) == 1 {
                self.stats.proactive_sent += 1;
                return true;
            }
            self.stats.guard_vetoes += 1;
        }
        self.save(1);
        false
    }

    /// Useful news arrived at `now` (a received message that changed the state, a jump in
    /// demand): returns how many messages to send now, REACTIVE(a, 1) rounded as in Alg. 4;
    /// that many tokens are spent. Does not end periods: call [`on_tick`](Self::on_tick)
    /// first if one is due.
    pub fn on_news(&mut self, now: Nanos, draw: f64) -> u32 {
        self.on_message(now, true, draw)
    }

    /// Like [`on_news`](Self::on_news) with the usefulness `u` of seed 004 §3.1: the
    /// generalized strategy sends half as many messages for news that is not useful, the
    /// randomized one none.
    pub fn on_message(&mut self, now: Nanos, useful: bool, draw: f64) -> u32 {
        let now = self.observe(now);
        let wanted = self.strategy.reactive_count(self.balance, useful, draw);
        self.spend(now, wanted)
    }

    /// Like [`on_news`](Self::on_news), but the caller can use at most `max` messages now
    /// (e.g. `max = 1` on a per-link account, where every message carries the same state):
    /// only `min(REACTIVE(a, 1), max)` tokens are spent, the rest stay for later news.
    pub fn on_news_at_most(&mut self, now: Nanos, draw: f64, max: u32) -> u32 {
        let now = self.observe(now);
        let wanted = self
            .strategy
            .reactive_count(self.balance, true, draw)
            .min(max);
        self.spend(now, wanted)
    }

    fn spend(&mut self, now: Nanos, wanted: u32) -> u32 {
        let sent = self.admit(now, wanted);
        self.stats.guard_vetoes += u64::from(wanted - sent);
        self.stats.reactive_sent += u64::from(sent);
        self.balance -= sent;
        sent
    }

    fn observe(&mut self, now: Nanos) -> Nanos {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    /// Saves `n` period tokens, up to the capacity; the rest are lost.
    fn save(&mut self, n: u64) {
        let room = u64::from(self.capacity - self.balance);
        let kept = n.min(room);
        // kept ≤ room ≤ capacity − balance, so it fits in u32.
        self.balance += u32::try_from(kept).unwrap_or(0);
        self.stats.tokens_saved += kept;
        self.stats.tokens_lost += n - kept;
    }

    /// Burst guard: how many of `wanted` messages at `now` keep the GCRA envelope
    /// (`max(TAT, now) + k·Δ ≤ now + (C + 1)·Δ` for the k-th); records them.
    fn admit(&mut self, now: Nanos, wanted: u32) -> u32 {
        if wanted == 0 {
            return 0;
        }
        let period = u128::from(self.period);
        let base = u128::from(self.tat.max(now));
        let limit = u128::from(now) + (u128::from(self.capacity) + 1) * period;
        let fit = limit.saturating_sub(base) / period;
        let n = u32::try_from(fit.min(u128::from(wanted))).unwrap_or(wanted);
        let tat = base + u128::from(n) * period;
        self.tat = u64::try_from(tat).unwrap_or(u64::MAX);
        n
    }
}
