//! The token bucket of seed 002 §3.4, made exact.
//!
//! The seed's code adds `(long)((now − lastInjectTime) · velocity)` tokens at every call but
//! moves `lastInjectTime` only on admission, so each denied call counts the same refill again
//! (over-admitting); it truncates the fractional token at each admission (under-admitting);
//! and it admits on `left − 1 > 0`, one token short of the capacity.
//! Here the refill is integer arithmetic on `count` and `period` with the remainder carried,
//! so the bucket refills at exactly `count / period`.

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::decision::Decision;
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

/// The state refilled up to `max(now, last)` under `limit`.
fn refill(s: &TokenBucketState, limit: &Limit, now: Nanos) -> TokenBucketState {
    let now = now.max(s.last);
    let burst = limit.burst();
    let full = TokenBucketState {
        tokens: burst,
        credit: 0,
        last: now,
    };
    if s.tokens >= burst {
        return full;
    }
    let period = limit.period();
    let credit = s.credit.min(period - 1);
    let elapsed = now - s.last;
    // u64 arithmetic when it fits (the common case), u128 otherwise:
    // (2⁶⁴−1)² + 2⁶⁴ < 2¹²⁸, so the wide path cannot overflow.
    let (whole, credit) = match elapsed
        .checked_mul(limit.count())
        .and_then(|x| x.checked_add(credit))
    {
        Some(total) if total < period => (0, total),
        Some(total) => (total / period, total % period),
        None => {
            let total = u128::from(credit) + u128::from(elapsed) * u128::from(limit.count());
            let whole = u64::try_from(total / u128::from(period)).unwrap_or(u64::MAX);
            // The remainder is < period, so it fits.
            (
                whole,
                u64::try_from(total % u128::from(period)).unwrap_or(0),
            )
        }
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

/// Nanoseconds until a refilled state `s` holds `want` tokens (0 if it already does).
fn time_to(s: &TokenBucketState, limit: &Limit, want: u64) -> Nanos {
    if s.tokens >= want {
        return 0;
    }
    // `credit < period`, so `needed > 0`.
    match (want - s.tokens).checked_mul(limit.period()) {
        Some(units) => (units - s.credit).div_ceil(limit.count()),
        None => {
            let needed =
                u128::from(want - s.tokens) * u128::from(limit.period()) - u128::from(s.credit);
            u64::try_from(needed.div_ceil(u128::from(limit.count()))).unwrap_or(u64::MAX)
        }
    }
}

fn decide(
    s: &TokenBucketState,
    limit: &Limit,
    now: Nanos,
    cost: u64,
) -> (Decision, Option<TokenBucketState>) {
    let r = refill(s, limit, now);
    // The bucket decides at its latest time when `now` went backwards; waits are reported
    // from the caller's `now`, so a caller that waits them out is really admitted.
    let lag = s.last.saturating_sub(now);
    // A bucket that already holds what is wanted needs no wait, whatever the lag.
    let time_to = |st: &TokenBucketState, limit: &Limit, want: u64| match time_to(st, limit, want) {
        0 => 0,
        t => t.saturating_add(lag),
    };
    let burst = limit.burst();
    if cost == 0 {
        return (
            Decision::allow(limit.count(), r.tokens, time_to(&r, limit, burst)),
            None,
        );
    }
    if cost > burst {
        return (
            Decision::deny(limit.count(), r.tokens, time_to(&r, limit, burst), None),
            None,
        );
    }
    if r.tokens >= cost {
        let after = TokenBucketState {
            tokens: r.tokens - cost,
            ..r
        };
        (
            Decision::allow(limit.count(), after.tokens, time_to(&after, limit, burst)),
            Some(after),
        )
    } else {
        let retry = time_to(&r, limit, cost);
        (
            Decision::deny(
                limit.count(),
                r.tokens,
                time_to(&r, limit, burst),
                Some(retry),
            ),
            None,
        )
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
        let (decision, after) = decide(state, limit, now, cost);
        if let Some(after) = after {
            *state = after;
        }
        decision
    }

    fn peek(&self, state: &TokenBucketState, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        decide(state, limit, now, cost).0
    }

    /// Idle once the bucket is full at `now`: then it decides as a new state would.
    fn is_idle(&self, state: &TokenBucketState, limit: &Limit, now: Nanos) -> bool {
        refill(state, limit, now).tokens >= limit.burst()
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
