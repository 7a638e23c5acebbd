//! Standalone rate limiting algorithms (seed 002 §3), with time as an argument.
//!
//! Sluice decides every request locally; this crate is what decides. Each algorithm
//! implements [`Algorithm`]: parameters in the algorithm value, per-key state kept by the
//! caller, and the [`Limit`] and the time passed to every call.

mod algorithm;
pub mod clock;
mod decision;
pub mod limit;

pub use algorithm::Algorithm;
pub use clock::{Clock, ManualClock, Nanos, SystemClock};
pub use decision::Decision;
pub use limit::{Limit, LimitError};
