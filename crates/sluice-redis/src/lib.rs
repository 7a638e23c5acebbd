//! The Redis backend of Sluice: every `sluice-limits` algorithm as one atomic Lua script,
//! shared by the daemon and by `sluice replay`.
//!
//! ```no_run
//! use sluice_limits::{AlgorithmKind, AnyAlgorithm, Limit, Options};
//! use sluice_redis::{FallbackConfig, FallbackLimiter, RedisConfig, RedisStore, Share, Source};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Exact mode: one script call per decision, on the Redis server's clock.
//! let store = RedisStore::new("redis://127.0.0.1:6379/", RedisConfig::default())?;
//! let gcra = AnyAlgorithm::new(AlgorithmKind::Gcra, Options::default());
//! let limit: Limit = "100/1s".parse()?;
//! let d = store.check(&gcra, "tenant-a", &limit, 0, 1).await?;
//! println!("allowed: {}, remaining: {}", d.allowed, d.remaining);
//!
//! // The same, falling back to a local limiter (a quarter of the limit: 4 nodes) when
//! // Redis does not answer within 50 ms.
//! let limiter = FallbackLimiter::new(store, FallbackConfig {
//!     share: Share::one_of(4),
//!     ..FallbackConfig::default()
//! });
//! let now = 0; // the node's clock, in ns: used by the fallback and its probes
//! let out = limiter.check(&gcra, "tenant-a", &limit, now, 1).await;
//! if let Some(t) = out.transition {
//!     eprintln!("rate limit store: {t:?}"); // logged once per change
//! }
//! assert!(matches!(out.source, Source::Central | Source::Local));
//! # Ok(())
//! # }
//! ```
//!
//! # Modes
//!
//! - **Exact** ([`RedisStore`]): one `EVALSHA` per decision. The script of each algorithm
//!   mirrors `sluice-limits` line by line, so with [`TimeSource::Caller`] the decisions are
//!   *identical* to the in-memory algorithms' (`tests/conformance.rs` replays random traces
//!   through both). With [`TimeSource::Server`] the script reads Redis' `TIME`, so the
//!   clients' clocks do not matter; it then works in microseconds (periods rounded up to a
//!   whole µs, waits reported in whole µs).
//! - **Batched** ([`BatchedStore`], seed 002 §4.4(5)): a node takes a batch of permits sized
//!   by its own consumption rate, never more than a share of what is left, and answers
//!   locally until the batch runs out or its lease expires.
//! - **Fallback** ([`FallbackLimiter`], seed 002 §4.4(4), written once in `sluice-center`
//!   for every center): when Redis does not answer within the timeout, the batch the node
//!   holds decides while it is valid, then a local `sluice-limits` limiter with the node's
//!   share of the limit, on a state that also counts what Redis admitted; one request per
//!   probe interval tries Redis again, and only Redis answering ends the fallback. What the
//!   share admitted is owed to Redis ([`Debt`]) and charged to it ([`RedisStore::charge`]:
//!   every script counts `n` permits unconditionally) before the node's next central
//!   decision of the key. [`RedisStore`] and [`BatchedStore`] are [`Center`]s.
//!
//! # Exactness
//!
//! Lua numbers are doubles: integers are exact below 2^53 only. A unix time in ns (1.7e18)
//! is past that, which is why server time is read in µs (exact until the year 2112).
//! Before every call the values a script will compute are checked against 2^53 in the
//! call's unit ([`Error::OutOfRange`] otherwise), for a state a charge left holding about
//! twice the limit and a request of one limit's worth on top: in ns, caller times must stay
//! below 104 days; the windows need `3 × count < 2^53` (the sliding log's running total,
//! which grows while a key lives, is moved back near 0 when it would reach 2^52, which
//! changes no decision); the token and leaky buckets keep
//! their level in units of `1/period` permit: the token bucket needs
//! `(burst + 2) × period + count < 2^53` units (in µs: up to 100,000 per day) and
//! `now + 2 × ⌈burst × period / count⌉ < 2^53` (a charge stores an empty bucket as of two
//! full refills ahead), the leaky bucket `(3 × burst + 1) × period + count < 2^53` (in µs:
//! up to 34,000 per day). GCRA, whose state is a time, needs only
//! `now + (3 × burst + 1) × T < 2^53`. Every division in the scripts is corrected to the
//! exact integer quotient. Warm-up keeps floating-point state: its script performs
//! `sluice-limits`' operations in the same order on the same IEEE doubles and stores the
//! stored fraction with 17 significant digits, which reads back as the same double; it
//! needs `now + 4 × (⌈burst × cold interval⌉ + 1) + warm-up period < 2^53` (twice
//! [`sluice_limits::WarmUp::reach`], the most a charge puts the next free instant ahead).
//!
//! # Keys
//!
//! A rule's state is at `{prefix}{KEY}:{algorithm}` (the sliding log adds `:log` and
//! `:meta`): one hash tag, so in Redis Cluster it lives in one slot and `MOVED`/`ASK` are
//! followed by the client. A state expires once it is idle (it then decides as a missing
//! key would), never sooner than [`RedisConfig::min_ttl`].

mod backend;
mod batched;
mod error;
mod script;
mod store;

pub use backend::MemoryStore;
pub use batched::{BatchConfig, BatchedStore};
pub use error::Error;
// The contract every center implements and the fallback written once for all of them.
pub use script::{TimeSource, check_limit};
pub use sluice_center::{
    Center, CenterError, Debt, FallbackConfig, FallbackLimiter, Mode, Share, Source,
};
pub use store::{RedisConfig, RedisStore};

/// The answer of a [`FallbackLimiter`] over Redis.
pub type Outcome = sluice_center::Outcome<Error>;
/// A change of [`Mode`] of a [`FallbackLimiter`] over Redis.
pub type Transition = sluice_center::Transition<Error>;
