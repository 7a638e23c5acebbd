//! Typed errors: bad topology specs, bad edge lists, graphs the analysis refuses.

use std::path::PathBuf;

/// Why a topology spec, an edge list, a weight vector or an analysis request was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The spec named a kind of topology that does not exist.
    #[error(
        "unknown topology kind `{kind}` (expected ring:N, path:N, star:N, complete:N, grid:RxC, \
         random-regular:N:D[:SEED], tree:N[:SEED], or the path of an edge-list file)"
    )]
    UnknownKind {
        /// The kind as written.
        kind: String,
    },
    /// The spec has the right kind but its parameters are malformed.
    #[error("malformed topology spec `{spec}`: expected {expected}")]
    MalformedSpec {
        /// The spec as written.
        spec: String,
        /// What the parameters should look like.
        expected: &'static str,
    },
    /// Too few nodes for this kind of topology.
    #[error("{kind} needs at least {min} nodes, got {n}")]
    TooSmall {
        /// Topology kind.
        kind: &'static str,
        /// Requested node count.
        n: usize,
        /// Smallest allowed node count.
        min: usize,
    },
    /// A D-regular graph on N nodes needs D·N even (every edge has two ends).
    #[error("random-regular:{n}:{d}: D·N = {} is odd, so no {d}-regular graph on {n} nodes exists", n * d)]
    OddDegreeSum {
        /// Node count.
        n: usize,
        /// Degree.
        d: usize,
    },
    /// A simple D-regular graph on N nodes needs 1 ≤ D < N.
    #[error("random-regular:{n}:{d}: the degree D must satisfy 1 ≤ D < N")]
    BadDegree {
        /// Node count.
        n: usize,
        /// Degree.
        d: usize,
    },
    /// A 1-regular graph on more than 2 nodes is a matching: never connected.
    #[error("random-regular:{n}:1 is a perfect matching, never connected; use D ≥ 2")]
    NeverConnected {
        /// Node count.
        n: usize,
    },
    /// Random generation did not produce a connected graph within its attempt budget.
    #[error("random-regular:{n}:{d}: no connected graph found after {attempts} attempts")]
    GenerationFailed {
        /// Node count.
        n: usize,
        /// Degree.
        d: usize,
        /// Attempts made.
        attempts: usize,
    },
    /// A line of an edge-list file (or weights file) is malformed.
    #[error("edge list line {line}: {message}")]
    EdgeListLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The edge list holds no edge.
    #[error("edge list holds no edge")]
    EmptyEdgeList,
    /// A file could not be read.
    #[error("cannot read `{}`: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An edge in constructed topology is invalid (self-loop, duplicate, out of range).
    #[error("invalid edge {a}–{b}: {message}")]
    InvalidEdge {
        /// One end.
        a: usize,
        /// Other end.
        b: usize,
        /// Why it is invalid.
        message: &'static str,
    },
    /// A weight is negative or not finite.
    #[error("weight {weight} of edge {a}–{b} must be finite and ≥ 0")]
    InvalidWeight {
        /// One end.
        a: usize,
        /// Other end.
        b: usize,
        /// The bad weight.
        weight: f64,
    },
    /// A weight vector has the wrong length.
    #[error("expected {expected} weights (one per edge), got {got}")]
    WeightCount {
        /// Edge count.
        expected: usize,
        /// Provided count.
        got: usize,
    },
    /// The analysis needs a connected graph (seed 000 §2: λ2 > 0).
    #[error(
        "the topology is disconnected ({components} components over edges of positive weight); \
         seed 000 assumes a connected graph (λ2 > 0), so it cannot be analysed"
    )]
    Disconnected {
        /// Number of connected components.
        components: usize,
    },
    /// The update cycle must be a positive finite number.
    #[error("the update cycle γ must be finite and > 0, got {0}")]
    BadGamma(f64),
    /// The noise level must be finite and ≥ 0.
    #[error("σ must be finite and ≥ 0, got {0}")]
    BadSigma(f64),
    /// The covariance matrix is unusable.
    #[error("covariance matrix: {0}")]
    BadCovariance(String),
    /// A numerical routine failed (should not happen on valid input).
    #[error("numerical failure: {0}")]
    Numerical(String),
}
