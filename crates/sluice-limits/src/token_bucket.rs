//! The token bucket of seed 002 §3.4, made exact.
//!
//! The seed's code adds `(long)((now − lastInjectTime) · velocity)` tokens at every call but
//! moves `lastInjectTime` only on admission, so each denied call counts the same refill again
//! (over-admitting); it truncates the fractional token at each admission (under-admitting);
//! and it admits on `left − 1 > 0`, one token short of the capacity.
//! Here the refill is integer arithmetic on `count` and `period` with the remainder carried,
//! so the bucket refills at exactly `count / period`.

use crate::algorithm::Algorithm;
use crate::any::measured_from_caller;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::gcra::div_by;
use crate::limit::Limit;

/// Token bucket: `burst` tokens at most, refilled at exactly `count` per `period`.
///
/// # Guarantees (checked by `tests/buckets_props.rs`)
/// - **Bound.** In every closed interval `[t1, t2]` of length `L`, the permits admitted at
///   times in it are at most `burst + ⌊L·count / period⌋` (exact rate, no rounding: the
///   bucket holds at most `burst` at `t1` and gains `L·count / period` tokens, of which only
///   whole ones can be taken).
/// - **No false denial.** If every request of `n ≤ burst` permits is followed by a gap of at
///   least `n·period / count` (a fortiori [`Limit::emission_interval`]·n) before the next
///   one, every request is admitted: the bucket is full at every arrival.
/// - **Limit changes.** The state is (whole tokens, credit toward the next token, time of the
///   last update); the limit is read at each call. After a change, the whole tokens are
///   capped at the new `burst` and the partial credit below one token of the new limit, and
///   refill continues at the new rate: the bound holds, with the new limit, for every
///   interval starting at or after the change.
/// - **Time.** A `now` earlier than the state's last update is treated as that time (no
///   refill, no panic).
/// - Cost 0 is always admitted and changes nothing; a cost above `burst` is denied with
///   `retry_after: None`; arithmetic is done in `u128` or saturates, so nothing panics.
///
/// Under a fixed limit whose `period` is a multiple of `count`, it decides exactly as
/// [`crate::Gcra`] (which keeps the same bucket as one number); it differs after a limit
/// change (the bucket keeps its tokens, GCRA keeps its debt in time) and when `count` does
/// not divide `period` (GCRA rounds the emission interval up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenBucket;

/// Per-key state of [`TokenBucket`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Whole tokens in the bucket at `last`.
    tokens: u64,
    /// Credit toward the next token, in units of `1 / period` token (so `< period`).
    credit: u64,
    /// When the state was last updated; refills are counted from here.
    last: Nanos,
}

impl TokenBucketState {
    /// Whole tokens held at the last update.
    #[must_use]
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Time of the last update.
    #[must_use]
    pub fn last(&self) -> Nanos {
        self.last
    }
}

/// A [`Limit`] prepared for the token bucket: its divisions turned into multiplications.
///
/// [`TokenBucket`] through [`Algorithm`] reads the limit at every call and pays two
/// 64-bit hardware divisions per check (refill, and time to full). A `TokenBucketLimit`,
/// prepared once, holds the reciprocals of `period` and `count` and the time an empty bucket
/// takes to fill, so [`TokenBucket::check_prepared`] divides by nothing and skips the refill
/// arithmetic when the bucket has had time to fill. Its decisions are *identical* to the
/// plain check's (`tests/buckets_prepared.rs`). A limit that changes at run time is simply
/// prepared again; the state does not depend on it.
///
/// ```
/// use sluice_limits::token_bucket::TokenBucketLimit;
/// use sluice_limits::{Algorithm, Limit, TokenBucket};
/// let limit: Limit = "10/1s".parse().unwrap();
/// let prepared = TokenBucketLimit::new(&limit);
/// let mut key = TokenBucket.new_state(&limit, 0);
/// assert!((0..10).all(|_| TokenBucket.check_prepared(&mut key, &prepared, 0, 1).allowed));
/// let refused = TokenBucket.check_prepared(&mut key, &prepared, 0, 1);
/// assert_eq!(refused, TokenBucket.peek(&key, &limit, 0, 1));
/// assert_eq!(refused.retry_after, Some(100_000_000));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokenBucketLimit {
    count: u64,
    period: Nanos,
    burst: u64,
    /// `⌊(2⁶⁴ − 1) / period⌋` (0: divide in hardware).
    period_magic: u64,
    /// `⌊(2⁶⁴ − 1) / count⌋` (0: divide in hardware).
    count_magic: u64,
    /// After more than this many ns any state is full: `⌈burst·period / count⌉ − 1`
    /// (`u64::MAX`, never exceeded, when not computed or out of range).
    fills_after: Nanos,
    /// `⌈period / count⌉`: the time one token takes (0: not computed).
    one_token: Nanos,
}

impl TokenBucketLimit {
    /// Prepares `limit`.
    #[must_use]
    pub fn new(limit: &Limit) -> Self {
        let fill = (u128::from(limit.burst()) * u128::from(limit.period()))
            .div_ceil(u128::from(limit.count()));
        Self {
            count: limit.count(),
            period: limit.period(),
            burst: limit.burst(),
            period_magic: u64::MAX / limit.period(),
            count_magic: u64::MAX / limit.count(),
            // fill ≥ 1: burst, period and count are ≥ 1.
            fills_after: u64::try_from(fill - 1).unwrap_or(u64::MAX),
            one_token: limit.period().div_ceil(limit.count()),
        }
    }

    /// The limit as read by a single call: no reciprocal, no fill time (each would cost the
    /// division it saves).
    #[inline]
    fn for_one_call(limit: &Limit) -> Self {
        Self {
            count: limit.count(),
            period: limit.period(),
            burst: limit.burst(),
            period_magic: 0,
            count_magic: 0,
            fills_after: u64::MAX,
            one_token: 0,
        }
    }

    /// The limit's count (for `RateLimit-Limit`).
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The period in ns.
    #[must_use]
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// The burst (bucket size).
    #[must_use]
    pub fn burst(&self) -> u64 {
        self.burst
    }
}

/// Equal when they decide alike (whether the reciprocals were computed does not matter).
impl PartialEq for TokenBucketLimit {
    fn eq(&self, other: &Self) -> bool {
        (self.count, self.period, self.burst) == (other.count, other.period, other.burst)
    }
}

impl Eq for TokenBucketLimit {}

impl From<Limit> for TokenBucketLimit {
    fn from(limit: Limit) -> Self {
        Self::new(&limit)
    }
}

/// `⌈n / d⌉`, by multiplication when `magic` is the reciprocal (see [`div_by`]).
#[inline]
fn div_ceil_by(n: u64, d: u64, magic: u64) -> u64 {
    let q = div_by(n, d, magic);
    // q·d ≤ n, and q < u64::MAX whenever q·d < n.
    if q * d == n { q } else { q + 1 }
}

/// The state refilled up to `max(now, last)` under `p`.
#[inline]
fn refill(s: &TokenBucketState, p: &TokenBucketLimit, now: Nanos) -> TokenBucketState {
    let now = now.max(s.last);
    let burst = p.burst;
    let full = TokenBucketState {
        tokens: burst,
        credit: 0,
        last: now,
    };
    let elapsed = now - s.last;
    // Already full, or long enough since the last update to be full whatever it held.
    if s.tokens >= burst || elapsed > p.fills_after {
        return full;
    }
    let period = p.period;
    let credit = s.credit.min(period - 1);
    // u64 arithmetic when it fits (the common case), u128 otherwise.
    let (whole, credit) = match elapsed
        .checked_mul(p.count)
        .and_then(|x| x.checked_add(credit))
    {
        Some(total) if total < period => (0, total),
        // Enough to fill the bucket: `tokens + ⌊total / period⌋ ≥ burst` iff
        // `total ≥ (burst − tokens)·period`, a multiplication instead of a division.
        Some(total)
            if (burst - s.tokens)
                .checked_mul(period)
                .is_some_and(|n| total >= n) =>
        {
            return full;
        }
        Some(total) => {
            let whole = div_by(total, period, p.period_magic);
            (whole, total - whole * period)
        }
        None => refill_wide(elapsed, p.count, credit, period),
    };
    match s.tokens.checked_add(whole) {
        Some(tokens) if tokens < burst => TokenBucketState {
            tokens,
            credit,
            last: now,
        },
        _ => full,
    }
}

/// Whether `s` is full after `elapsed` more ns (`false` when the products overflow: the
/// caller then takes the general path, which handles them).
#[inline]
fn full_after(s: &TokenBucketState, p: &TokenBucketLimit, elapsed: Nanos) -> bool {
    s.tokens >= p.burst
        || elapsed > p.fills_after
        || elapsed
            .checked_mul(p.count)
            .and_then(|x| x.checked_add(s.credit.min(p.period - 1)))
            .zip((p.burst - s.tokens).checked_mul(p.period))
            .is_some_and(|(total, needed)| total >= needed)
}

/// `credit + elapsed·count` split into whole tokens and credit, when it passes 2⁶⁴:
/// (2⁶⁴−1)² + 2⁶⁴ < 2¹²⁸, so this cannot overflow.
#[cold]
#[inline(never)]
fn refill_wide(elapsed: u64, count: u64, credit: u64, period: u64) -> (u64, u64) {
    let total = u128::from(credit) + u128::from(elapsed) * u128::from(count);
    let whole = u64::try_from(total / u128::from(period)).unwrap_or(u64::MAX);
    // The remainder is < period, so it fits.
    (
        whole,
        u64::try_from(total % u128::from(period)).unwrap_or(0),
    )
}

/// Nanoseconds until a refilled state `s` holds `want` tokens (0 if it already does).
#[inline]
fn time_to(s: &TokenBucketState, p: &TokenBucketLimit, want: u64) -> Nanos {
    if s.tokens >= want {
        return 0;
    }
    // One token short with no credit (one permit taken from a full bucket): precomputed.
    if s.tokens + 1 == want && s.credit == 0 && p.one_token != 0 {
        return p.one_token;
    }
    // `credit < period`, so `needed > 0`.
    match (want - s.tokens).checked_mul(p.period) {
        Some(units) => div_ceil_by(units - s.credit, p.count, p.count_magic),
        None => time_to_wide(want - s.tokens, s.credit, p),
    }
}

#[cold]
#[inline(never)]
fn time_to_wide(missing: u64, credit: u64, p: &TokenBucketLimit) -> Nanos {
    let needed = u128::from(missing) * u128::from(p.period) - u128::from(credit);
    u64::try_from(needed.div_ceil(u128::from(p.count))).unwrap_or(u64::MAX)
}

#[inline]
fn decide(
    s: &TokenBucketState,
    p: &TokenBucketLimit,
    now: Nanos,
    cost: u64,
) -> (Decision, Option<TokenBucketState>) {
    // The bucket decides at its latest time when `now` went backwards; waits are reported
    // from the caller's `now` (as every algorithm does), so waiting them out really admits.
    let (d, next) = decide_at(s, p, now, cost);
    (measured_from_caller(d, s.last.saturating_sub(now)), next)
}

#[inline]
fn decide_at(
    s: &TokenBucketState,
    p: &TokenBucketLimit,
    now: Nanos,
    cost: u64,
) -> (Decision, Option<TokenBucketState>) {
    let r = refill(s, p, now);
    let time_to = |st: &TokenBucketState, want: u64| time_to(st, p, want);
    let burst = p.burst;
    if cost == 0 {
        return (Decision::allow(p.count, r.tokens, time_to(&r, burst)), None);
    }
    if cost > burst {
        return (
            Decision::deny(p.count, r.tokens, time_to(&r, burst), None),
            None,
        );
    }
    if r.tokens >= cost {
        let after = TokenBucketState {
            tokens: r.tokens - cost,
            ..r
        };
        (
            Decision::allow(p.count, after.tokens, time_to(&after, burst)),
            Some(after),
        )
    } else {
        let retry = time_to(&r, cost);
        (
            Decision::deny(p.count, r.tokens, time_to(&r, burst), Some(retry)),
            None,
        )
    }
}

impl TokenBucket {
    /// [`Algorithm::check`] with a limit prepared once ([`TokenBucketLimit`]): the same
    /// decision and the same new state, without a division.
    #[inline]
    pub fn check_prepared(
        &self,
        state: &mut TokenBucketState,
        limit: &TokenBucketLimit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        // The common case under the limit, with fewer live values: one permit from a bucket
        // that is full at `now` (no lag). Decides exactly as `decide` would
        // (`tests/buckets_prepared.rs`); `one_token` is 0 for a limit read once.
        if cost == 1
            && limit.one_token != 0
            && now >= state.last
            && full_after(state, limit, now - state.last)
        {
            *state = TokenBucketState {
                tokens: limit.burst - 1,
                credit: 0,
                last: now,
            };
            return Decision::allow(limit.count, limit.burst - 1, limit.one_token);
        }
        let (decision, after) = decide(state, limit, now, cost);
        if let Some(after) = after {
            *state = after;
        }
        decision
    }

    /// [`Algorithm::peek`] with a prepared limit.
    #[inline]
    #[must_use]
    pub fn peek_prepared(
        &self,
        state: &TokenBucketState,
        limit: &TokenBucketLimit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        decide(state, limit, now, cost).0
    }
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;

    fn new_state(&self, limit: &Limit, now: Nanos) -> TokenBucketState {
        TokenBucketState {
            tokens: limit.burst(),
            credit: 0,
            last: now,
        }
    }

    fn check(
        &self,
        state: &mut TokenBucketState,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Decision {
        self.check_prepared(state, &TokenBucketLimit::for_one_call(limit), now, cost)
    }

    fn peek(&self, state: &TokenBucketState, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        self.peek_prepared(state, &TokenBucketLimit::for_one_call(limit), now, cost)
    }

    /// Idle once the bucket is full at `now`: then it decides as a new state would.
    fn is_idle(&self, state: &TokenBucketState, limit: &Limit, now: Nanos) -> bool {
        refill(state, &TokenBucketLimit::for_one_call(limit), now).tokens >= limit.burst()
    }

    /// Takes `min(n, burst)` tokens at `now` (read as the latest time seen). Past the tokens
    /// held the bucket owes the rest: it is stored empty as of the time the rest has refilled
    /// (a time ahead, which later calls read as the bucket's latest time), at most the time
    /// two full refills take ahead of `now`.
    fn charge(&self, state: &mut TokenBucketState, limit: &Limit, now: Nanos, n: u64) {
        let p = TokenBucketLimit::for_one_call(limit);
        let n = n.min(p.burst);
        if n == 0 {
            return;
        }
        let r = refill(state, &p, now);
        if r.tokens >= n {
            *state = TokenBucketState {
                tokens: r.tokens - n,
                ..r
            };
            return;
        }
        let empty = |credit| TokenBucketState {
            tokens: 0,
            credit,
            last: r.last,
        };
        let full = time_to(&empty(0), &p, p.burst);
        // `n` is at most the burst, so the rest owed is at most one bucket.
        let owed = time_to(&empty(r.credit), &p, n - r.tokens);
        let paid = r.last.saturating_add(owed);
        let reach = now.saturating_add(full.saturating_mul(2));
        *state = TokenBucketState {
            last: r.last.max(paid.min(reach)),
            ..empty(0)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(count: u64, period: Nanos, burst: u64) -> Limit {
        Limit::from_nanos(count, period)
            .unwrap()
            .with_burst(burst)
            .unwrap()
    }

    #[test]
    fn refills_fractions_exactly() {
        // 3 per 10 ns: a token every 3.33 ns. Checked every ns, the seed's code would never
        // refill; this one admits exactly 3 per 10 ns after the burst. (Burst 2, so the
        // bucket is never full after the start and no credit overflows.)
        let l = lim(3, 10, 2);
        let mut s = TokenBucket.new_state(&l, 0);
        let admitted = (0..=1000)
            .filter(|&t| TokenBucket.check(&mut s, &l, t, 1).allowed)
            .count();
        assert_eq!(admitted, 2 + 300);
    }

    proptest::proptest! {
        /// The reciprocal ceiling division equals the hardware one.
        #[test]
        fn div_ceil_by_is_exact(
            n in proptest::prop_oneof![proptest::num::u64::ANY, (u64::MAX - 1000)..=u64::MAX],
            d in proptest::prop_oneof![1u64..=1000, 1u64..=u64::MAX],
        ) {
            proptest::prop_assert_eq!(div_ceil_by(n, d, u64::MAX / d), n.div_ceil(d));
        }
    }

    #[test]
    fn edge_cases_do_not_panic() {
        let l = lim(u64::MAX, 1, u64::MAX);
        let mut s = TokenBucket.new_state(&l, 0);
        assert!(TokenBucket.check(&mut s, &l, u64::MAX, u64::MAX).allowed);
        let l = lim(1, u64::MAX, 2);
        let mut s = TokenBucket.new_state(&l, u64::MAX);
        assert!(TokenBucket.check(&mut s, &l, 0, 2).allowed);
        let d = TokenBucket.check(&mut s, &l, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(u64::MAX));
        let d = TokenBucket.check(&mut s, &l, 0, 3);
        assert_eq!(d.retry_after, None);
        let before = s;
        assert!(TokenBucket.check(&mut s, &l, 0, 0).allowed);
        assert_eq!(s, before);
    }

    #[test]
    fn keeps_tokens_across_a_limit_change() {
        let a = lim(10, 1000, 10);
        let mut s = TokenBucket.new_state(&a, 0);
        assert!(TokenBucket.check(&mut s, &a, 0, 4).allowed);
        // Six left; under a smaller burst they are capped at 5.
        let b = lim(1, 1000, 5);
        assert_eq!(TokenBucket.peek(&s, &b, 0, 1).remaining, 4);
        assert!(TokenBucket.check(&mut s, &b, 0, 5).allowed);
        assert!(!TokenBucket.check(&mut s, &b, 999, 1).allowed);
        assert!(TokenBucket.check(&mut s, &b, 1000, 1).allowed);
    }
}
