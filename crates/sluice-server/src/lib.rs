//! The node daemon's core: envoyproxy/ratelimit's configuration and decision semantics,
//! with time as an argument and no I/O besides reading configuration files.
//!
//! ```
//! use sluice_server::{Code, Config, Descriptor, Engine, Request};
//!
//! // An envoyproxy/ratelimit file, unchanged (its README's Example 3).
//! let config = Config::from_yaml("edge.yaml", "
//! domain: edge_proxy_per_ip
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 2 }
//!   - key: remote_address
//!     value: 50.0.0.5
//!     rate_limit: { unit: second, requests_per_unit: 0 }
//! ")?;
//! let engine = Engine::new(config);
//! let now = 1_700_000_000_000_000_000; // ns since the unix epoch
//! let ip = |a: &str| Request::new("edge_proxy_per_ip", [Descriptor::new([("remote_address", a)])]);
//!
//! assert_eq!(engine.should_rate_limit(now, &ip("50.0.0.1"))?.overall_code, Code::Ok);
//! assert_eq!(engine.should_rate_limit(now, &ip("50.0.0.1"))?.overall_code, Code::Ok);
//! let third = engine.should_rate_limit(now, &ip("50.0.0.1"))?;
//! assert_eq!(third.overall_code, Code::OverLimit);
//! assert_eq!(third.statuses[0].limit_remaining, 0);
//! // Each address has its own counter; the blocked one is always over the limit.
//! assert_eq!(engine.should_rate_limit(now, &ip("50.0.0.2"))?.overall_code, Code::Ok);
//! assert_eq!(engine.should_rate_limit(now, &ip("50.0.0.5"))?.overall_code, Code::OverLimit);
//! // The next second is a new window.
//! assert_eq!(engine.should_rate_limit(now + 1_000_000_000, &ip("50.0.0.1"))?.overall_code, Code::Ok);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`config`] reads envoyproxy/ratelimit's YAML files (a file or a directory of them) plus
//! Sluice's per-rule `algorithm`, `burst` and `coordination`, and rejects a bad file with its
//! file, line, column and reason. [`engine`] answers `ShouldRateLimit` as envoyproxy/ratelimit
//! does; the servers of `sluice serve` are thin shells over both: [`grpc`] (Envoy RLS v3
//! `ShouldRateLimit` over gRPC, on Envoy's own protobuf types, with graceful shutdown) and
//! [`http`] (envoyproxy/ratelimit's `/json`, health, `/metrics`, `/v1/cluster`, capacity
//! leases). [`daemon`] starts them with the rest of a node: the cluster driver ([`cluster`],
//! [`peer`], [`shares`]), Redis ([`central`]) and the token server ([`token_server`]) — the
//! two centers behind one fallback (`sluice-center`).

pub mod cluster;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod grpc;
pub mod http;
pub mod lease;
pub mod metrics;
pub mod peer;
pub mod shares;
pub mod stats;
pub mod status;
pub mod token_server;

pub use config::{
    Config, ConfigError, ConfigErrorKind, ConfigSource, Coordination, Domain, Limited, Location,
    Metadata, Policy, RateLimit, Rule, Unit,
};
pub use engine::central;
pub use engine::{
    Code, Descriptor, DescriptorStatus, Engine, Entry, Request, RequestError, Response,
};
