//! The Lua scripts and the arguments they are called with.
//!
//! Every script is the shared prelude (argument parsing, exact integer division, the
//! server/caller time switch), one algorithm's `decide`, and the shared epilogue (partial
//! grants for batched mode, storing the state, the reply). They mirror `sluice-limits`
//! line by line, so the same trace gives the same decisions (`tests/conformance.rs`).

use std::sync::LazyLock;

use redis::Script;
use sluice_limits::{AlgorithmKind, Alignment, AnyAlgorithm, Decision, Limit, Nanos};

use crate::error::Error;

macro_rules! script {
    ($file:literal) => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!(concat!("lua/", $file)),
            include_str!("lua/epilogue.lua")
        )
    };
}

/// One script per algorithm; `Script` keeps its SHA1, so calls are `EVALSHA`, and a
/// `NOSCRIPT` answer (a restarted or flushed server, a new cluster node) loads it again.
static SCRIPTS: LazyLock<[Script; 7]> = LazyLock::new(|| {
    [
        Script::new(script!("fixed_window.lua")),
        Script::new(script!("sliding_window.lua")),
        Script::new(script!("sliding_log.lua")),
        Script::new(script!("leaky_bucket.lua")),
        Script::new(script!("token_bucket.lua")),
        Script::new(script!("gcra.lua")),
        Script::new(script!("warm_up.lua")),
    ]
});

/// Integers are exact in Lua's doubles below this.
pub(crate) const EXACT: u128 = 1 << 53;

/// Where a script reads the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeSource {
    /// Redis server time (`TIME`), in microseconds: the clients' clocks do not matter, and
    /// every client of one Redis sees one clock. Limits are applied at 1 µs resolution
    /// (periods rounded up to a whole µs); the `now` given to a call is ignored by the
    /// script (the local fallback still uses it).
    #[default]
    Server,
    /// The caller's `now`, in nanoseconds, as `sluice-limits` reads it: for trace replay
    /// and conformance tests. Decisions are exactly those of `sluice-limits` as long as every
    /// time stays below 2^53 ns (104 days from the caller's epoch).
    Caller,
}

impl TimeSource {
    fn unit(self) -> &'static str {
        match self {
            Self::Server => "µs",
            Self::Caller => "ns",
        }
    }
}

/// The algorithm a script implements, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Shape {
    pub(crate) kind: AlgorithmKind,
    index: usize,
    /// The fixed window's alignment, the sliding window's sub-windows, the warm-up period
    /// (in ns; in the call's unit once sent).
    param: u64,
    /// The warm-up's cold factor (0 for the others).
    factor: f64,
}

impl Shape {
    /// The script for `alg`.
    pub(crate) fn of(alg: &AnyAlgorithm) -> Self {
        let kind = alg.kind();
        let (param, factor) = match alg {
            AnyAlgorithm::FixedWindow(f) => {
                (u64::from(f.alignment() == Alignment::FirstRequest), 0.0)
            }
            AnyAlgorithm::SlidingWindow(s) => (u64::from(s.sub_windows()), 0.0),
            AnyAlgorithm::WarmUp(w) => (w.warmup(), w.cold_factor()),
            _ => (0, 0.0),
        };
        // One script per kind, the fixed window's two alignments sharing one.
        let index = match kind {
            AlgorithmKind::FixedWindow | AlgorithmKind::FixedWindowFirst => 0,
            AlgorithmKind::SlidingWindow => 1,
            AlgorithmKind::SlidingLog => 2,
            AlgorithmKind::LeakyBucket => 3,
            AlgorithmKind::TokenBucket => 4,
            AlgorithmKind::Gcra => 5,
            AlgorithmKind::WarmUp => 6,
        };
        Self {
            kind,
            index,
            param,
            factor,
        }
    }

    pub(crate) fn script(&self) -> &'static Script {
        &SCRIPTS[self.index]
    }

    /// The Redis keys of `key`'s state: one hash tag, so every key of a rule lives in one
    /// cluster slot.
    pub(crate) fn keys(&self, prefix: &str, key: &str) -> Vec<String> {
        let base = format!("{prefix}{{{}}}:{}", hash_tag(key), self.kind.name());
        if self.kind == AlgorithmKind::SlidingLog {
            vec![format!("{base}:log"), format!("{base}:meta")]
        } else {
            vec![base]
        }
    }
}

/// The text between `{` and `}`: the key itself when it contains no `}` (which would end
/// the tag early) and does not start with `~`; otherwise `~` and the key in hex, so two
/// keys never share a tag by accident.
pub(crate) fn hash_tag(key: &str) -> String {
    if !key.contains('}') && !key.starts_with('~') && !key.is_empty() {
        return key.to_string();
    }
    let mut s = String::with_capacity(1 + 2 * key.len());
    s.push('~');
    for b in key.bytes() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Checks, before any request, that the scripts run `alg` under `limit` exactly with the
/// time source `time`: [`Error::OutOfRange`] when a value a script computes could pass 2^53
/// in the unit of `time`. With [`TimeSource::Server`] this covers every time the server's
/// clock gives until the year 2112; with [`TimeSource::Caller`] it checks the limit alone
/// (times are checked per call).
///
/// # Errors
/// As above.
pub fn check_limit(alg: &AnyAlgorithm, limit: &Limit, time: TimeSource) -> Result<(), Error> {
    Call::new(alg, "", "k", limit, time, 0, 1, false, 0, 0).map(|_| ())
}

/// A script call's arguments, checked to be exact.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) shape: Shape,
    pub(crate) keys: Vec<String>,
    pub(crate) args: [String; 11],
    time: TimeSource,
}

/// What a script answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) decision: Decision,
    /// Permits taken (the cost when admitted; with a partial call, what was left).
    pub(crate) granted: u64,
}

impl Call {
    /// Builds the call; [`Error::OutOfRange`] if some value the script computes could pass
    /// 2^53 in its unit. With `charge > 0` the call counts that many permits admitted
    /// without Redis instead of deciding `cost` (at most [`sluice_center::charge_cap`]: a
    /// node's share admits no more than that of what still weighs, so capping loses
    /// nothing, and it keeps every value the script computes exact).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        alg: &AnyAlgorithm,
        prefix: &str,
        key: &str,
        limit: &Limit,
        time: TimeSource,
        now: Nanos,
        cost: u64,
        partial: bool,
        min_ttl_ms: u64,
        charge: u64,
    ) -> Result<Self, Error> {
        let shape = Shape::of(alg);
        let (now_arg, now_max, period, units_per_ms) = match time {
            TimeSource::Caller => (now.to_string(), u128::from(now), limit.period(), 1_000_000),
            // TIME in µs stays below 2^52 until the year 2112.
            TimeSource::Server => (
                "server".to_string(),
                1 << 52,
                limit.period().div_ceil(1000).max(1),
                1_000,
            ),
        };
        // The warm-up period in the call's unit, rounded up as periods are (never faster).
        let param = match (shape.kind, time) {
            (AlgorithmKind::WarmUp, TimeSource::Server) => shape.param.div_ceil(1000),
            _ => shape.param,
        };
        let (count, burst) = (u128::from(limit.count()), u128::from(limit.burst()));
        let p = u128::from(period);
        let fail = |what| {
            Err(Error::OutOfRange {
                algorithm: shape.kind,
                what,
                unit: time.unit(),
            })
        };
        if count >= EXACT || burst >= EXACT || p >= EXACT {
            return fail("the count, burst or period");
        }
        // A charge leaves a state holding up to about twice the limit (`Algorithm::charge`),
        // and a request of up to one limit's worth is added to it before it is refused: every
        // bound below is for a state that holds three limits' worth.
        let ok = match shape.kind {
            AlgorithmKind::FixedWindow | AlgorithmKind::FixedWindowFirst => {
                // Counts: up to 2N charged, plus a cost of up to N.
                now_max + 2 * p < EXACT && 3 * count < EXACT
            }
            AlgorithmKind::SlidingWindow => {
                let k = u128::from(shape.param);
                let width = p.div_ceil(k).max(1);
                now_max + (k + 2) * width < EXACT && 3 * count < EXACT
            }
            AlgorithmKind::SlidingLog => now_max + 2 * p < EXACT && 3 * count < EXACT,
            // Levels in units of 1/period: a bucket and its refill, `(B + 2)·p + N`. A charge
            // stores an empty bucket as of up to two full refills, `2·⌈B·p/N⌉`, ahead of now.
            AlgorithmKind::TokenBucket => {
                (burst + 2) * p + count < EXACT && now_max + 2 * (burst * p).div_ceil(count) < EXACT
            }
            // A level of up to `2B·p` after a charge, plus a cost of up to `B·p`, plus a
            // drain of less than `N`.
            AlgorithmKind::LeakyBucket => (3 * burst + 1) * p + count < EXACT && now_max < EXACT,
            AlgorithmKind::Gcra => {
                // TAT up to `2B·T` ahead of now after a charge, plus a cost of up to `B·T`.
                let t = p.div_ceil(count).max(1);
                now_max + (3 * burst + 1) * t < EXACT
            }
            AlgorithmKind::WarmUp => {
                // The next free instant stays within `reach` ahead of the time (the script
                // computes it as `WarmUp::reach` does, in the call's unit); a charge adds a
                // cost of at most `reach / 2` to it before it stops there, and the expiry
                // adds the warm-up period.
                let reach = match alg {
                    AnyAlgorithm::WarmUp(w) => Limit::from_nanos(limit.count(), period)
                        .and_then(|l| l.with_burst(limit.burst()))
                        .map_or(u128::MAX, |l| u128::from(w.reach(&l))),
                    _ => u128::MAX,
                };
                let w = u128::from(param);
                reach < EXACT && w < EXACT && now_max + 2 * reach + w + 2 < EXACT
            }
        };
        if !ok {
            return fail("the state (time, or burst × period)");
        }
        // A cost past 2^53 is refused with `retry_after: None` whatever it is exactly
        // (count and burst are below 2^53).
        let cost = cost.min((EXACT - 1) as u64);
        let args = [
            now_arg,
            limit.count().to_string(),
            period.to_string(),
            limit.burst().to_string(),
            cost.to_string(),
            if partial { "1" } else { "0" }.to_string(),
            min_ttl_ms.to_string(),
            units_per_ms.to_string(),
            param.to_string(),
            charge
                .min(sluice_center::charge_cap(shape.kind, limit))
                .to_string(),
            // Shortest digits that read back as the same double (Lua's tonumber is strtod).
            format!("{:e}", shape.factor),
        ];
        Ok(Self {
            shape,
            keys: shape.keys(prefix, key),
            args,
            time,
        })
    }

    /// Reads the script's reply `[allowed, limit, remaining, reset, retry, granted]`, times
    /// converted back to nanoseconds.
    pub(crate) fn reply(&self, v: &[i64]) -> Result<Reply, Error> {
        let [allowed, limit, remaining, reset, retry, granted] = v else {
            return Err(Error::Reply(format!("{v:?}")));
        };
        let scale: u64 = match self.time {
            TimeSource::Caller => 1,
            TimeSource::Server => 1_000,
        };
        let nat = |x: i64| u64::try_from(x).map_err(|_| Error::Reply(format!("{v:?}")));
        let time = |x: i64| nat(x).map(|t| t.saturating_mul(scale));
        let (limit, remaining, reset) = (nat(*limit)?, nat(*remaining)?, time(*reset)?);
        let decision = if *allowed == 1 {
            Decision::allow(limit, remaining, reset)
        } else {
            let retry = if *retry < 0 {
                None
            } else {
                Some(time(*retry)?)
            };
            Decision::deny(limit, remaining, reset, retry)
        };
        Ok(Reply {
            decision,
            granted: nat(*granted)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_never_break_the_slot() {
        assert_eq!(hash_tag("alice"), "alice");
        assert_eq!(hash_tag("a}b"), "~617d62");
        assert_eq!(hash_tag("~x"), "~7e78");
        assert_eq!(hash_tag(""), "~");
        let shape = Shape::of(&AnyAlgorithm::SlidingLog(sluice_limits::SlidingLog));
        assert_eq!(
            shape.keys("sluice:", "k"),
            ["sluice:{k}:sliding-log:log", "sluice:{k}:sliding-log:meta"]
        );
    }

    #[test]
    fn refuses_what_lua_cannot_compute_exactly() {
        let alg = AnyAlgorithm::TokenBucket(sluice_limits::TokenBucket);
        let day: Limit = "1000000/1d".parse().unwrap();
        let e = Call::new(&alg, "", "k", &day, TimeSource::Caller, 0, 1, false, 0, 0);
        assert!(matches!(e, Err(Error::OutOfRange { .. })), "{e:?}");
        // In µs the same limit is 8.64e16: still too much for a token bucket…
        assert!(Call::new(&alg, "", "k", &day, TimeSource::Server, 0, 1, false, 0, 0).is_err());
        // …but fine for GCRA, whose state is a time.
        let gcra = AnyAlgorithm::Gcra(sluice_limits::Gcra);
        assert!(Call::new(&gcra, "", "k", &day, TimeSource::Server, 0, 1, false, 0, 0).is_ok());
        // The bounds stated in the crate docs, in µs.
        let ok = |alg: &AnyAlgorithm, l: &str| {
            let l: Limit = l.parse().unwrap();
            Call::new(alg, "", "k", &l, TimeSource::Server, 0, 1, false, 0, 0).is_ok()
        };
        assert!(ok(&alg, "100000/1d"));
        let leaky = AnyAlgorithm::LeakyBucket(sluice_limits::LeakyBucket);
        // A charged level holds two bursts, and a cost adds a third: 34,749 per day at most.
        assert!(ok(&leaky, "34000/1d") && !ok(&leaky, "35000/1d") && !ok(&leaky, "100000/1d"));
        // Warm-up: a burst at the cold interval ahead of the time, plus the warm-up period.
        let warm = AnyAlgorithm::new(AlgorithmKind::WarmUp, sluice_limits::Options::default());
        assert!(ok(&warm, "1000000/1d"));
        let huge = AnyAlgorithm::WarmUp(sluice_limits::WarmUp::new(1, 1e300).unwrap());
        assert!(!ok(&huge, "1/1s"));
        let long = AnyAlgorithm::WarmUp(sluice_limits::WarmUp::guava(u64::MAX));
        assert!(!ok(&long, "1/1s"));
    }

    /// Whether `alg` under `limit` may run at `now` (caller's time, ns).
    fn fits(alg: &AnyAlgorithm, limit: &Limit, now: Nanos) -> bool {
        Call::new(alg, "", "k", limit, TimeSource::Caller, now, 1, false, 0, 0).is_ok()
    }

    #[test]
    fn the_guards_hold_a_state_charged_past_the_limit() {
        let e = 1u64 << 53;
        let l = |count: u64, period: Nanos, burst: u64| {
            Limit::from_nanos(count, period)
                .unwrap()
                .with_burst(burst)
                .unwrap()
        };
        // GCRA: a TAT two bursts ahead plus one burst's cost, `now + (3B + 1)·T < 2^53`.
        let gcra = AnyAlgorithm::Gcra(sluice_limits::Gcra);
        let g = l(1, 1000, 10);
        assert!(fits(&gcra, &g, e - 31_000 - 1));
        assert!(!fits(&gcra, &g, e - 31_000));
        // Leaky bucket: a level of two bursts plus a cost, `(3B + 1)·p + N < 2^53`.
        let leaky = AnyAlgorithm::LeakyBucket(sluice_limits::LeakyBucket);
        assert!(fits(&leaky, &l(1, (1 << 51) - 1, 1), 0));
        assert!(!fits(&leaky, &l(1, 1 << 51, 1), 0));
        // Token bucket: empty as of two full refills ahead, `now + 2·⌈B·p/N⌉ < 2^53`.
        let token = AnyAlgorithm::TokenBucket(sluice_limits::TokenBucket);
        let t = l(1, 1000, 10);
        assert!(fits(&token, &t, e - 20_000 - 1));
        assert!(!fits(&token, &t, e - 20_000));
        // The windows: a count of two limits plus a cost of one, `3N < 2^53`.
        let n = (e - 1) / 3;
        for kind in [
            AlgorithmKind::FixedWindow,
            AlgorithmKind::FixedWindowFirst,
            AlgorithmKind::SlidingWindow,
            AlgorithmKind::SlidingLog,
        ] {
            let alg = AnyAlgorithm::new(kind, sluice_limits::Options::default());
            assert!(fits(&alg, &l(n, 1000, 1), 0), "{kind}");
            assert!(!fits(&alg, &l(n + 1, 1000, 1), 0), "{kind}");
        }
    }
}
