//! Client-side throttling with capacity leases from a Sluice node (seed 000 §7, the Doorman
//! style): the client asks the node for a rate on one resource, decides every request
//! locally against it, and keeps the lease fresh in the background.
//!
//! ```no_run
//! use std::time::Duration;
//! use sluice_client::{LeaseClient, LeaseConfig};
//!
//! # async fn run() -> Result<(), sluice_client::ClientError> {
//! // 300 requests per second wanted on domain `api`, descriptor `tenant=acme`.
//! let config = LeaseConfig::new("http://127.0.0.1:8080", "api", [("tenant", "acme")], "worker-7", 300.0)
//!     .fallback_rate(10.0); // what to allow when no valid lease is held
//! let client = LeaseClient::start(config)?;
//! client.wait_for_lease(Duration::from_secs(2)).await?;
//! if client.try_acquire(1) {
//!     // do the request
//! }
//! client.close().await; // hands the capacity back at once
//! # Ok(())
//! # }
//! ```
//!
//! What the client guarantees, given the node's answers:
//! - [`LeaseClient::try_acquire`] admits at most `rate·t + burst` over any span `t` during
//!   which one rate is in force (GCRA on one atomic word, [`LocalLimiter`]); a new rate
//!   applies without resetting what was already taken.
//! - A grant is used only until its expiry as counted from *before* the request was sent,
//!   so never past the node's own expiry (the node's answer rounds down to a millisecond).
//!   Then the configured fallback rate applies (0 by default: nothing is admitted without a
//!   lease), whether or not the refresher is running.
//! - The lease is refreshed when the node says (`refresh_in_ms`, before the expiry); a failed
//!   refresh is retried with exponential backoff while the last grant stays in force until
//!   its expiry.
//!
//! The node's side (`POST /v1/lease` of `sluice serve`) divides its capacity for the
//! resource among its clients max-min fairly (seed 000 §7 Alg. 2) and guarantees that the
//! unexpired grants never add up to more than that capacity.

mod client;
mod limiter;

pub use client::{ClientError, Lease, LeaseClient, LeaseConfig};
pub use limiter::{LocalLimiter, gcra_limit};
