//! Choosing an algorithm at run time: [`AlgorithmKind`] names them, [`AnyAlgorithm`] and
//! [`AnyState`] dispatch over an enum (no generics, no boxing) for callers such as trace
//! replay and server configuration.
//!
//! ```
//! use sluice_limits::{Algorithm, AlgorithmKind, AnyAlgorithm, Limit, Options};
//!
//! let kind: AlgorithmKind = "sliding-log".parse()?;
//! let alg = AnyAlgorithm::new(kind, Options::default());
//! let limit: Limit = "2/1s".parse()?;
//! let mut state = alg.new_state(&limit, 0);
//! assert!(alg.check(&mut state, &limit, 0, 1).allowed);
//! assert!(alg.check(&mut state, &limit, 10, 1).allowed);
//! let refused = alg.check(&mut state, &limit, 20, 1);
//! // The first entry leaves the log 1 s after it was admitted.
//! assert_eq!((refused.allowed, refused.retry_after), (false, Some(999_999_980)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::fixed_window::{Alignment, FixedWindow, FixedWindowState};
use crate::gcra::{Gcra, GcraState};
use crate::leaky_bucket::{LeakyBucket, LeakyState};
use crate::limit::Limit;
use crate::sliding_log::{SlidingLog, SlidingLogState};
use crate::sliding_window::{SlidingWindow, SlidingWindowState};
use crate::token_bucket::{TokenBucket, TokenBucketState};
use crate::warmup::{WarmUp, WarmUpState};

/// `d`, decided at a time `early` ns later than the caller's `now` (time read as the latest
/// seen), with its waits measured from the caller's `now` again.
pub(crate) fn measured_from_caller(mut d: Decision, early: Nanos) -> Decision {
    if early > 0 {
        if d.reset_after > 0 {
            d.reset_after = d.reset_after.saturating_add(early);
        }
        if !d.allowed {
            d.retry_after = d.retry_after.map(|r| r.saturating_add(early));
        }
    }
    d
}

/// The name of an algorithm, as given on a command line or in a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    /// `fixed-window`: [`FixedWindow`] aligned to time 0.
    FixedWindow,
    /// `fixed-window-first`: [`FixedWindow`] opened by the first request.
    FixedWindowFirst,
    /// `sliding-window`: [`SlidingWindow`] with `K` sub-windows.
    SlidingWindow,
    /// `sliding-log`: [`SlidingLog`].
    SlidingLog,
    /// `leaky-bucket`: [`LeakyBucket`] (the meter).
    LeakyBucket,
    /// `token-bucket`: [`TokenBucket`].
    TokenBucket,
    /// `gcra`: [`Gcra`].
    Gcra,
    /// `warm-up`: [`WarmUp`] (Guava `SmoothWarmingUp`).
    WarmUp,
}

impl AlgorithmKind {
    /// Every kind, in the order of [`AlgorithmKind::NAMES`].
    pub const ALL: [AlgorithmKind; 8] = [
        Self::FixedWindow,
        Self::FixedWindowFirst,
        Self::SlidingWindow,
        Self::SlidingLog,
        Self::LeakyBucket,
        Self::TokenBucket,
        Self::Gcra,
        Self::WarmUp,
    ];

    /// Every name [`FromStr`] accepts.
    pub const NAMES: [&'static str; 8] = [
        "fixed-window",
        "fixed-window-first",
        "sliding-window",
        "sliding-log",
        "leaky-bucket",
        "token-bucket",
        "gcra",
        "warm-up",
    ];

    /// This kind's position in [`AlgorithmKind::ALL`] (and [`AlgorithmKind::NAMES`]): an
    /// index for tables with one entry per kind.
    #[must_use]
    pub const fn index(self) -> usize {
        // `ALL` lists the variants in declaration order (checked by a test).
        self as usize
    }

    /// The name of this kind (what [`fmt::Display`] prints and [`FromStr`] reads).
    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self.index()]
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that is not one of [`AlgorithmKind::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {0:?} (expected one of: {names})", names = AlgorithmKind::NAMES.join(", "))]
pub struct UnknownAlgorithm(pub String);

impl FromStr for AlgorithmKind {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Self::NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(t))
            .map(|i| Self::ALL[i])
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// Parameters some algorithms need besides the [`Limit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Sub-windows of the sliding window counter (`K`).
    pub sub_windows: u32,
    /// The warm-up algorithm's parameters.
    pub warm_up: WarmUp,
}

impl Default for Options {
    /// 10 sub-windows; a warm-up of 1 s with Guava's cold factor 3.
    fn default() -> Self {
        Self {
            sub_windows: 10,
            warm_up: WarmUp::guava(1_000_000_000),
        }
    }
}

/// Any algorithm of this crate, chosen at run time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AnyAlgorithm {
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingWindow`].
    SlidingWindow(SlidingWindow),
    /// See [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// See [`LeakyBucket`].
    LeakyBucket(LeakyBucket),
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`Gcra`].
    Gcra(Gcra),
    /// See [`WarmUp`].
    WarmUp(WarmUp),
}

/// The per-key state of an [`AnyAlgorithm`].
#[derive(Debug, Clone, PartialEq)]
pub enum AnyState {
    /// See [`FixedWindowState`].
    FixedWindow(FixedWindowState),
    /// See [`SlidingWindowState`].
    SlidingWindow(SlidingWindowState),
    /// See [`SlidingLogState`].
    SlidingLog(SlidingLogState),
    /// See [`LeakyState`].
    LeakyBucket(LeakyState),
    /// See [`TokenBucketState`].
    TokenBucket(TokenBucketState),
    /// See [`GcraState`].
    Gcra(GcraState),
    /// See [`WarmUpState`].
    WarmUp(WarmUpState),
}

impl AnyAlgorithm {
    /// The algorithm `kind`, with its parameters from `options`.
    #[must_use]
    pub fn new(kind: AlgorithmKind, options: Options) -> Self {
        match kind {
            AlgorithmKind::FixedWindow => Self::FixedWindow(FixedWindow::epoch()),
            AlgorithmKind::FixedWindowFirst => Self::FixedWindow(FixedWindow::first_request()),
            AlgorithmKind::SlidingWindow => {
                Self::SlidingWindow(SlidingWindow::new(options.sub_windows))
            }
            AlgorithmKind::SlidingLog => Self::SlidingLog(SlidingLog),
            AlgorithmKind::LeakyBucket => Self::LeakyBucket(LeakyBucket),
            AlgorithmKind::TokenBucket => Self::TokenBucket(TokenBucket),
            AlgorithmKind::Gcra => Self::Gcra(Gcra),
            AlgorithmKind::WarmUp => Self::WarmUp(options.warm_up),
        }
    }

    /// This algorithm's kind (the fixed window's alignment tells its two kinds apart), as
    /// [`AnyAlgorithm::new`] takes it.
    #[must_use]
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            Self::FixedWindow(f) => match f.alignment() {
                Alignment::Epoch => AlgorithmKind::FixedWindow,
                Alignment::FirstRequest => AlgorithmKind::FixedWindowFirst,
            },
            Self::SlidingWindow(_) => AlgorithmKind::SlidingWindow,
            Self::SlidingLog(_) => AlgorithmKind::SlidingLog,
            Self::LeakyBucket(_) => AlgorithmKind::LeakyBucket,
            Self::TokenBucket(_) => AlgorithmKind::TokenBucket,
            Self::Gcra(_) => AlgorithmKind::Gcra,
            Self::WarmUp(_) => AlgorithmKind::WarmUp,
        }
    }
}

/// Runs `$body` with `$a` bound to the algorithm and `$s` to its state when they match, or
/// `$mismatch` otherwise.
macro_rules! dispatch {
    ($alg:expr, $state:expr, |$a:ident, $s:ident| $body:expr, $mismatch:expr) => {
        match ($alg, $state) {
            (AnyAlgorithm::FixedWindow($a), AnyState::FixedWindow($s)) => $body,
            (AnyAlgorithm::SlidingWindow($a), AnyState::SlidingWindow($s)) => $body,
            (AnyAlgorithm::SlidingLog($a), AnyState::SlidingLog($s)) => $body,
            (AnyAlgorithm::LeakyBucket($a), AnyState::LeakyBucket($s)) => $body,
            (AnyAlgorithm::TokenBucket($a), AnyState::TokenBucket($s)) => $body,
            (AnyAlgorithm::Gcra($a), AnyState::Gcra($s)) => $body,
            (AnyAlgorithm::WarmUp($a), AnyState::WarmUp($s)) => $body,
            _ => $mismatch,
        }
    };
}

/// A state of another algorithm is read as a fresh state of this one: `check` replaces it,
/// `peek` decides as on a fresh state, `charge` replaces it too, `is_idle` says yes (nothing of this algorithm's is
/// lost by evicting it). So a mismatch never panics.
impl Algorithm for AnyAlgorithm {
    type State = AnyState;

    fn new_state(&self, limit: &Limit, now: Nanos) -> Self::State {
        match self {
            Self::FixedWindow(a) => AnyState::FixedWindow(a.new_state(limit, now)),
            Self::SlidingWindow(a) => AnyState::SlidingWindow(a.new_state(limit, now)),
            Self::SlidingLog(a) => AnyState::SlidingLog(a.new_state(limit, now)),
            Self::LeakyBucket(a) => AnyState::LeakyBucket(a.new_state(limit, now)),
            Self::TokenBucket(a) => AnyState::TokenBucket(a.new_state(limit, now)),
            Self::Gcra(a) => AnyState::Gcra(a.new_state(limit, now)),
            Self::WarmUp(a) => AnyState::WarmUp(a.new_state(limit, now)),
        }
    }

    fn check(&self, state: &mut Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        dispatch!(self, &mut *state, |a, s| a.check(s, limit, now, cost), {
            *state = self.new_state(limit, now);
            self.check(state, limit, now, cost)
        })
    }

    fn peek(&self, state: &Self::State, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        dispatch!(self, state, |a, s| a.peek(s, limit, now, cost), {
            self.peek(&self.new_state(limit, now), limit, now, cost)
        })
    }

    fn is_idle(&self, state: &Self::State, limit: &Limit, now: Nanos) -> bool {
        dispatch!(self, state, |a, s| a.is_idle(s, limit, now), true)
    }

    fn charge(&self, state: &mut Self::State, limit: &Limit, now: Nanos, n: u64) {
        dispatch!(self, &mut *state, |a, s| a.charge(s, limit, now, n), {
            *state = self.new_state(limit, now);
            self.charge(state, limit, now, n);
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn index_is_the_position_in_all() {
        for (i, k) in super::AlgorithmKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i, "{k}");
        }
    }

    use super::*;

    #[test]
    fn kind_is_what_new_was_given() {
        for k in AlgorithmKind::ALL {
            assert_eq!(AnyAlgorithm::new(k, Options::default()).kind(), k);
        }
    }

    #[test]
    fn names_round_trip() {
        for (k, n) in AlgorithmKind::ALL.iter().zip(AlgorithmKind::NAMES) {
            assert_eq!(k.to_string(), n);
            assert_eq!(n.parse::<AlgorithmKind>().unwrap(), *k);
        }
        let e = "leaky".parse::<AlgorithmKind>().unwrap_err();
        assert!(e.to_string().contains("sliding-log"), "{e}");
    }

    #[test]
    fn mismatched_state_is_replaced_not_a_panic() {
        let l = Limit::from_nanos(2, 10).unwrap();
        let log = AnyAlgorithm::new(AlgorithmKind::SlidingLog, Options::default());
        let fw = AnyAlgorithm::new(AlgorithmKind::FixedWindow, Options::default());
        let mut s = fw.new_state(&l, 0);
        assert!(log.is_idle(&s, &l, 0));
        assert!(log.peek(&s, &l, 0, 2).allowed);
        assert!(log.check(&mut s, &l, 0, 2).allowed);
        assert!(matches!(s, AnyState::SlidingLog(_)));
    }
}
