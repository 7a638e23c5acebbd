//! The protocol between Sluice nodes, as a sans-IO state machine (seeds 000, 003, 004).
//!
//! Every node holds a share of a global limit `L` per key and re-divides it with its
//! neighbours by the share update law (seed 000 eq. 3, seed 003 GDRL). Capacity moves only
//! as gifts recorded in monotone per-link counters, so the shares never add up to more than
//! `L`, whatever the network does to the messages. Time and randomness are arguments.
//!
//! ```
//! use sluice_coord::node::{Config, Node};
//! use sluice_coord::wire;
//!
//! // Two nodes sharing 1000 units of every key.
//! let cfg = |id, peer| Config::new(id, vec![0, 1], vec![(peer, 1.0)], 1000);
//! let mut a = Node::new(cfg(0, 1), 0).unwrap();
//! let mut b = Node::new(cfg(1, 0), 0).unwrap();
//! let mut draw = || 0.5;
//! let key = 42;
//! a.set_demand(0, key, 900.0); // a is busy, b idle
//! b.set_demand(0, key, 0.0);
//! for k in 1..=60u64 {
//!     let now = k * 100_000_000;
//!     a.tick(now, &mut draw);
//!     b.tick(now, &mut draw);
//!     let (ra, rb) = (a.ready(now), b.ready(now));
//!     for m in ra.messages {
//!         let bytes = wire::encode(&m.message);
//!         b.handle_message(now, 0, wire::decode(&bytes).unwrap(), &mut draw);
//!     }
//!     for m in rb.messages {
//!         a.handle_message(now, 1, m.message, &mut draw);
//!     }
//! }
//! // Shares always add up to the limit, and capacity moved to the busy node.
//! assert_eq!(a.own(key) + b.own(key), 1000);
//! assert!(a.own(key) > 900);
//! ```

pub mod allocation;
pub mod filter;
pub mod law;
pub mod node;
pub mod pacing;
pub mod stability;
pub mod testing;
pub mod wire;

pub use law::Measure;
pub use node::{Config, Fallback, LeaseState, LinkState, Node, Outgoing, Ready};
pub use stability::ConfigError;
pub use wire::{Key, Lifecycle, Message, NodeId, WireError};
