//! A node's share of a limit, and counting on it what was admitted elsewhere.

use sluice_limits::{Algorithm, AnyAlgorithm, AnyState, Limit, Nanos};

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

/// Counts `n` permits admitted elsewhere (by the central store, or by another node) on a
/// local `state` of `alg` under `limit` at `now`, as far as the state holds them: all `n` if
/// they fit as one admission, else as many as the state still admits, else none. Never
/// counts past the limit, unlike [`sluice_limits::Algorithm::charge`]: a local share that
/// follows what was admitted elsewhere must not be spent again, but need not remember more
/// than it could have admitted itself.
///
/// Returns how many permits were counted (`0..=n`).
pub fn take_what_fits(
    alg: &AnyAlgorithm,
    state: &mut AnyState,
    limit: &Limit,
    now: Nanos,
    n: u64,
) -> u64 {
    if n == 0 || alg.check(state, limit, now, n).allowed {
        return n;
    }
    let d = alg.peek(state, limit, now, 1);
    let fits = if d.allowed {
        d.remaining.saturating_add(1).min(n)
    } else {
        0
    };
    // `remaining` is an estimate for some algorithms: count only what was admitted.
    if fits > 0 && alg.check(state, limit, now, fits).allowed {
        return fits;
    }
    0
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
