//! Overload balancing for server farms: JSQ and JSQ with job tagging (JSQT), after seed 001
//! (Li, Paschos, Tassiulas & Modiano, *Dynamic Overload Balancing in Server Farms*).
//!
//! When demand exceeds what the servers can do, some queue must grow. JSQT decides *which*:
//! it routes like join-the-shortest-queue over min{N_s, Y_s} and tags jobs as overflow so
//! that the long-run overflow rates minimise a chosen α-fair penalty (§IV), without knowing
//! the arrival rates. [`optimum`] computes the offline optimum the policy is checked against.
//!
//! ```
//! use sluice_balance::{optimum, AlphaFair, DriftParams, Farm, Jsqt, Policy, Tag};
//!
//! // Two servers of capacity 1 and 2 behind one balancer (seed 001 §V-A).
//! let farm = Farm::fully_connected(vec![1.0, 2.0], 1)?;
//! let penalties = AlphaFair::per_server(1.0, &[1.0, 1.0])?;
//! let mut jsqt = Jsqt::new(farm.clone(), penalties, DriftParams::new(100.0, 20.0, 1.0)?)?;
//!
//! let route = jsqt.route(0)?; // which server, tagged or not
//! assert!(farm.reaches(0, route.server));
//! jsqt.on_arrival(route.server, 1, route.tag);
//! jsqt.end_slot(); // virtual queues advance once per slot, eq. (21)
//!
//! // With demand 4 the optimum overflows 0.5 at each server (the most-balanced vector).
//! let opt = optimum::most_balanced(&farm, &[4.0])?;
//! assert!((opt.q[0] - 0.5).abs() < 1e-9 && (opt.q[1] - 0.5).abs() < 1e-9);
//! assert_eq!(route.tag, Tag::Untagged);
//! # Ok::<(), sluice_balance::BalanceError>(())
//! ```

mod error;
mod farm;
pub mod maxflow;
pub mod optimum;
mod penalty;
mod policy;
#[cfg(feature = "tower")]
pub mod tower;

pub use error::BalanceError;
pub use farm::Farm;
pub use penalty::{AlphaFair, DriftParams, Penalty};
pub use policy::{AnyPolicy, Jsq, Jsqt, Policy, PolicyKind, Route, ServerQueues, Tag};
