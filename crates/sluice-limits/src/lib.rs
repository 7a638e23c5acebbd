//! Standalone rate limiting algorithms (seed 002 §3), with time as an argument.
//!
//! ```
//! use sluice_limits::{Algorithm, Gcra, Limit};
//!
//! let limit: Limit = "2/1s".parse()?; // 2 per second, burst 2
//! let mut key = Gcra.new_state(&limit, 0);
//! assert!(Gcra.check(&mut key, &limit, 0, 1).allowed);
//! assert!(Gcra.check(&mut key, &limit, 0, 1).allowed);
//! let refused = Gcra.check(&mut key, &limit, 0, 1);
//! assert!(!refused.allowed);
//! assert_eq!(refused.retry_after, Some(500_000_000)); // one permit every 500 ms
//! assert!(Gcra.check(&mut key, &limit, 500_000_000, 1).allowed);
//! # Ok::<(), sluice_limits::LimitError>(())
//! ```
//!
//! Sluice decides every request locally; this crate is what decides. Each algorithm
//! implements [`Algorithm`]: parameters in the algorithm value, per-key state kept by the
//! caller, and the [`Limit`] and the time passed to every call.

mod algorithm;
pub mod any;
pub mod atomic;
pub mod clock;
mod decision;
pub mod fixed_window;
pub mod gcra;
pub mod keyed;
pub mod leaky_bucket;
pub mod limit;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;
pub mod warmup;

pub use algorithm::Algorithm;
pub use any::{AlgorithmKind, AnyAlgorithm, AnyState, Options, UnknownAlgorithm};
pub use atomic::AtomicGcra;
pub use clock::{Clock, ManualClock, Nanos, SystemClock};
pub use decision::Decision;
pub use fixed_window::{Alignment, FixedWindow, FixedWindowState};
pub use gcra::{AsGcraLimit, Gcra, GcraLimit, GcraState};
pub use keyed::{Evictions, KeyView, KeyedConfig, KeyedGcra, KeyedStore};
pub use leaky_bucket::{DelayPolicy, LeakyBucket, LeakyState, Shaped, Shaper};
pub use limit::{Limit, LimitError};
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use sliding_window::{SlidingWindow, SlidingWindowState};
pub use token_bucket::{TokenBucket, TokenBucketLimit, TokenBucketState};
pub use warmup::{WarmUp, WarmUpError, WarmUpState};
