//! What a limit says: `count` permits per `period`, with a `burst`.

use std::time::Duration;

use crate::clock::{Nanos, nanos};

/// An invalid limit, refused when it is built rather than misbehaving later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// `count` was zero. A limit that admits nothing is a block rule, not a rate.
    #[error("a limit must allow at least 1 request per period (got 0)")]
    ZeroCount,
    /// The period was zero.
    #[error("the period of a limit must be longer than 0")]
    ZeroPeriod,
    /// The burst was zero.
    #[error("the burst of a limit must be at least 1 (got 0)")]
    ZeroBurst,
    /// A textual limit could not be parsed.
    #[error(
        "cannot parse limit {text:?}: {reason} (expected N/DURATION, e.g. 100/1s, 10/100ms, 5000/1m)"
    )]
    Parse {
        /// The text given.
        text: String,
        /// What was wrong with it.
        reason: &'static str,
    },
}

/// `count` permits per `period`, and how many may be taken at once (`burst`).
///
/// Window algorithms read `count` per `period` (the window). Bucket algorithms and GCRA read
/// the rate `count / period` and the bucket size `burst`, which defaults to `count`: a fresh
/// bucket admits `count` at once and then refills at the rate.
///
/// A `Limit` is an *argument* of every decision, never part of an algorithm's state: the
/// coordination layer changes a node's share of a limit all the time, and per-key state
/// must survive that (governor issues #273, #39).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    count: u64,
    period: Nanos,
    burst: u64,
}

impl Limit {
    /// `count` permits per `period`, burst `count`.
    ///
    /// # Errors
    /// [`LimitError::ZeroCount`] or [`LimitError::ZeroPeriod`].
    pub fn new(count: u64, period: Duration) -> Result<Self, LimitError> {
        Self::from_nanos(count, nanos(period))
    }

    /// As [`Limit::new`], with the period in nanoseconds.
    ///
    /// # Errors
    /// [`LimitError::ZeroCount`] or [`LimitError::ZeroPeriod`].
    pub fn from_nanos(count: u64, period: Nanos) -> Result<Self, LimitError> {
        if count == 0 {
            return Err(LimitError::ZeroCount);
        }
        if period == 0 {
            return Err(LimitError::ZeroPeriod);
        }
        Ok(Self {
            count,
            period,
            burst: count,
        })
    }

    /// The same rate with another burst.
    ///
    /// # Errors
    /// [`LimitError::ZeroBurst`].
    pub fn with_burst(self, burst: u64) -> Result<Self, LimitError> {
        if burst == 0 {
            return Err(LimitError::ZeroBurst);
        }
        Ok(Self { burst, ..self })
    }

    /// Permits per period.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The period (window length) in nanoseconds.
    #[must_use]
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// How many permits may be taken at once.
    #[must_use]
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Nanoseconds between two permits at the steady rate (`period / count`), rounded up so
    /// the rate is never exceeded; at least 1.
    #[must_use]
    pub fn emission_interval(&self) -> Nanos {
        self.period.div_ceil(self.count).max(1)
    }

    /// The rate in permits per second, for display.
    #[must_use]
    pub fn per_second(&self) -> f64 {
        self.count as f64 * 1e9 / self.period as f64
    }
}

impl std::str::FromStr for Limit {
    type Err = LimitError;

    /// Parses `N/DURATION`, where DURATION is a number with a unit `ns`, `us`, `ms`, `s`,
    /// `m`, `h` or `d` (`100/1s`, `10/100ms`), or a bare unit (`100/s`, `5000/minute`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| LimitError::Parse {
            text: s.to_string(),
            reason,
        };
        let (n, d) = s.trim().split_once('/').ok_or_else(|| err("missing '/'"))?;
        let count: u64 = n
            .trim()
            .parse()
            .map_err(|_| err("the count is not a whole number"))?;
        let period = parse_duration(d.trim()).ok_or_else(|| err("unknown duration"))?;
        Self::from_nanos(count, period)
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}ns", self.count, self.period)?;
        if self.burst != self.count {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

/// Parses `10ms`, `1s`, `2m`, `s`, `minute`, `hour`, `day`: a whole number (default 1) and a
/// unit. Returns `None` for anything else, including overflow.
#[must_use]
pub fn parse_duration(s: &str) -> Option<Nanos> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: u64 = if num.is_empty() { 1 } else { num.parse().ok()? };
    let unit_ns: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "second" => 1_000_000_000,
        "m" | "min" | "minute" => 60_000_000_000,
        "h" | "hour" => 3_600_000_000_000,
        "d" | "day" => 86_400_000_000_000,
        _ => return None,
    };
    num.checked_mul(unit_ns).filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_limits() {
        let l: Limit = "100/1s".parse().unwrap();
        assert_eq!(
            (l.count(), l.period(), l.burst()),
            (100, 1_000_000_000, 100)
        );
        let l: Limit = "10/100ms".parse().unwrap();
        assert_eq!(l.period(), 100_000_000);
        let l: Limit = "5/minute".parse().unwrap();
        assert_eq!(l.period(), 60_000_000_000);
        assert_eq!(l.emission_interval(), 12_000_000_000);
    }

    #[test]
    fn refuses_bad_limits() {
        assert!(matches!(
            "0/1s".parse::<Limit>(),
            Err(LimitError::ZeroCount)
        ));
        assert!(matches!(
            "1/0s".parse::<Limit>(),
            Err(LimitError::Parse { .. })
        ));
        assert!(matches!(
            "x/1s".parse::<Limit>(),
            Err(LimitError::Parse { .. })
        ));
        assert!(matches!(
            "10".parse::<Limit>(),
            Err(LimitError::Parse { .. })
        ));
        assert!("1/99999999999999999999d".parse::<Limit>().is_err());
        assert!(matches!(
            Limit::new(1, Duration::from_secs(1)).unwrap().with_burst(0),
            Err(LimitError::ZeroBurst)
        ));
    }
}
