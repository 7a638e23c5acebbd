//! Typed errors of the balancing library.

/// Why a farm, a penalty or a policy could not be built or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BalanceError {
    /// A farm needs at least one server and one load balancer.
    #[error("a farm needs at least one server and one load balancer")]
    EmptyFarm,
    /// Server capacities must be finite and positive (seed 001 §II: c_s > 0).
    #[error("capacity of server {} must be finite and > 0, got {value}", .server + 1)]
    BadCapacity {
        /// Server index (0-based; messages show it 1-based).
        server: usize,
        /// The rejected value.
        value: f64,
    },
    /// Balancer `balancer` reaches no server, or names a server that does not exist.
    #[error(
        "load balancer {}: reachable set must be non-empty, match the backends given, and name servers 1..={servers}",
        .balancer + 1
    )]
    BadReach {
        /// Balancer index (0-based; messages show it 1-based).
        balancer: usize,
        /// Number of servers in the farm.
        servers: usize,
    },
    /// Demand rates must be finite and non-negative, one per balancer.
    #[error("demand rates must be finite, >= 0 and one per balancer ({balancers}); got {got:?}")]
    BadDemand {
        /// Number of balancers.
        balancers: usize,
        /// The rejected rates.
        got: Vec<f64>,
    },
    /// Penalty weights ξ_s must be finite and positive, one per server.
    #[error("penalty weights must be finite, > 0 and one per server ({servers}); got {got:?}")]
    BadWeights {
        /// Number of servers.
        servers: usize,
        /// The rejected weights.
        got: Vec<f64>,
    },
    /// α must be finite and ≥ 0 (seed 001 eq. 11).
    #[error("alpha must be finite and >= 0, got {0}")]
    BadAlpha(f64),
    /// A control parameter (V, y_max, E\[X\], slot length) is out of range.
    #[error("parameter {name} must be finite and > 0, got {value}")]
    BadParameter {
        /// Which parameter.
        name: &'static str,
        /// The rejected value.
        value: f64,
    },
    /// The exact optimum enumerates server subsets; it is limited to small farms.
    #[error("the offline optimum supports at most {max} servers, the farm has {got}")]
    TooManyServers {
        /// The limit.
        max: usize,
        /// Servers in the farm.
        got: usize,
    },
    /// A balancer or server index out of range.
    #[error("{what} index {index} out of range (have {len})")]
    OutOfRange {
        /// "balancer" or "server".
        what: &'static str,
        /// The index.
        index: usize,
        /// How many exist.
        len: usize,
    },
    /// `Service::call` without a successful `poll_ready` first (tower contract).
    #[error("call() before poll_ready() returned Ready")]
    NotReady,
}
