//! What can go wrong talking to Redis.

use std::time::Duration;

use sluice_limits::AlgorithmKind;

/// An error of the Redis backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Redis answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis did not answer within the configured timeout.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// A value the script would compute passes 2^53 and would lose precision in Lua's doubles.
    #[error(
        "{algorithm}: {what} passes 2^53 {unit} and cannot be computed exactly in a Redis script"
    )]
    OutOfRange {
        /// The algorithm.
        algorithm: AlgorithmKind,
        /// Which quantity.
        what: &'static str,
        /// The time unit of the script call (`ns` or `µs`).
        unit: &'static str,
    },
    /// A script answered something other than six integers.
    #[error("unexpected reply from a Sluice script: {0}")]
    Reply(String),
}

impl sluice_center::CenterError for Error {
    fn is_unavailable(&self) -> bool {
        Error::is_unavailable(self)
    }
}

impl Error {
    /// Whether the error says Redis is unreachable (time out, connection refused or
    /// dropped, cluster down): the cases in which a caller should decide locally. Other
    /// errors are configuration errors that retrying will not fix.
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Timeout(_) => true,
            Self::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_cluster_error()
                    || e.is_unrecoverable_error()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::BusyLoading
                                | redis::ServerErrorKind::ClusterDown
                                | redis::ServerErrorKind::TryAgain
                                | redis::ServerErrorKind::MasterDown
                        )
                    )
            }
            Self::OutOfRange { .. } | Self::Reply(_) => false,
        }
    }
}
