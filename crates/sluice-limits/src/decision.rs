//! What a limiter answers: enough for a server to emit `RateLimit-*` and `Retry-After`.

use crate::clock::Nanos;

/// The answer to "may this request (of `cost` permits) go ahead now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted (and, for a consuming check, its permits taken).
    pub allowed: bool,
    /// The limit's count, for `RateLimit-Limit`.
    pub limit: u64,
    /// Permits that a request arriving right after this one could still take
    /// (`RateLimit-Remaining`).
    pub remaining: u64,
    /// Time until the limiter is back to its full allowance (`RateLimit-Reset`): the end of
    /// the window for window algorithms, the time to refill for buckets.
    pub reset_after: Nanos,
    /// `Some(0)` when allowed. When denied, the earliest wait after which the same request
    /// could be admitted if nothing else arrives (`Retry-After`); `None` when it never can
    /// under this limit (its cost exceeds what the limit can ever hold).
    pub retry_after: Option<Nanos>,
}

impl Decision {
    /// An admitted request.
    #[must_use]
    pub fn allow(limit: u64, remaining: u64, reset_after: Nanos) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            reset_after,
            retry_after: Some(0),
        }
    }

    /// A refused request that may succeed after `retry_after` (`None`: never).
    #[must_use]
    pub fn deny(
        limit: u64,
        remaining: u64,
        reset_after: Nanos,
        retry_after: Option<Nanos>,
    ) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            reset_after,
            retry_after,
        }
    }
}
