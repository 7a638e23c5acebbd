//! The topology spec shared by `sluice analyze`, `sluice sim` and the server config.
//!
//! `ring:N`, `path:N`, `star:N`, `complete:N`, `grid:RxC`, `random-regular:N:D[:SEED]`,
//! `tree:N[:SEED]`, or the path of an edge-list file (`file:PATH` also works). Random kinds
//! without a SEED use [`DEFAULT_SEED`].

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::{GraphError, Topology};

/// Seed of `random-regular` and `tree` when the spec gives none.
pub const DEFAULT_SEED: u64 = 0;

/// A parsed topology spec. Parsing does no I/O; [`TopologySpec::build`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologySpec {
    /// `ring:N`
    Ring(usize),
    /// `path:N`
    Path(usize),
    /// `star:N` (N nodes in all, hub 0)
    Star(usize),
    /// `complete:N`
    Complete(usize),
    /// `grid:RxC`
    Grid(usize, usize),
    /// `random-regular:N:D[:SEED]`
    RandomRegular {
        /// Nodes.
        n: usize,
        /// Degree.
        d: usize,
        /// Seed, if the spec gave one.
        seed: Option<u64>,
    },
    /// `tree:N[:SEED]`
    Tree {
        /// Nodes.
        n: usize,
        /// Seed, if the spec gave one.
        seed: Option<u64>,
    },
    /// An edge-list file, `a b [weight]` per line.
    EdgeList(PathBuf),
}

const KINDS: [&str; 7] = [
    "ring",
    "path",
    "star",
    "complete",
    "grid",
    "random-regular",
    "tree",
];

impl TopologySpec {
    /// Builds the topology; random kinds use the spec's seed or [`DEFAULT_SEED`].
    pub fn build(&self) -> Result<Topology, GraphError> {
        self.build_seeded(None)
    }

    /// Builds the topology; a random kind whose spec has no SEED uses `fallback_seed`
    /// (e.g. the simulator's own seed), or [`DEFAULT_SEED`] when that is `None` too.
    pub fn build_seeded(&self, fallback_seed: Option<u64>) -> Result<Topology, GraphError> {
        let seed = |s: Option<u64>| s.or(fallback_seed).unwrap_or(DEFAULT_SEED);
        match self {
            Self::Ring(n) => Topology::ring(*n),
            Self::Path(n) => Topology::path(*n),
            Self::Star(n) => Topology::star(*n),
            Self::Complete(n) => Topology::complete(*n),
            Self::Grid(r, c) => Topology::grid(*r, *c),
            Self::RandomRegular { n, d, seed: s } => Topology::random_regular(*n, *d, seed(*s)),
            Self::Tree { n, seed: s } => Topology::random_tree(*n, seed(*s)),
            Self::EdgeList(path) => Topology::read_edge_list(path),
        }
    }
}

impl FromStr for TopologySpec {
    type Err = GraphError;

    fn from_str(spec: &str) -> Result<Self, GraphError> {
        let spec = spec.trim();
        let malformed = |expected| GraphError::MalformedSpec {
            spec: spec.to_owned(),
            expected,
        };
        if let Some(path) = spec.strip_prefix("file:") {
            return Ok(Self::EdgeList(PathBuf::from(path)));
        }
        let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
        if !KINDS.contains(&kind) {
            // Anything that looks like `word:` with an unknown word is a typo, not a file.
            let looks_like_kind = spec.contains(':')
                && !kind.is_empty()
                && kind.chars().all(|c| c.is_ascii_alphabetic() || c == '-')
                && !std::path::Path::new(spec).exists();
            if looks_like_kind || spec.is_empty() {
                return Err(GraphError::UnknownKind {
                    kind: kind.to_owned(),
                });
            }
            return Ok(Self::EdgeList(PathBuf::from(spec)));
        }
        let parts: Vec<&str> = rest.split(':').collect();
        let num = |s: &str, expected| s.trim().parse::<usize>().map_err(|_| malformed(expected));
        let seed = |s: &str, expected| s.trim().parse::<u64>().map_err(|_| malformed(expected));
        Ok(match (kind, parts.as_slice()) {
            ("ring", [n]) => Self::Ring(num(n, "ring:N")?),
            ("path", [n]) => Self::Path(num(n, "path:N")?),
            ("star", [n]) => Self::Star(num(n, "star:N")?),
            ("complete", [n]) => Self::Complete(num(n, "complete:N")?),
            ("grid", [rc]) => {
                let (r, c) = rc
                    .split_once(['x', 'X'])
                    .ok_or_else(|| malformed("grid:RxC"))?;
                Self::Grid(num(r, "grid:RxC")?, num(c, "grid:RxC")?)
            }
            ("random-regular", [n, d, rest @ ..]) if rest.len() <= 1 => {
                const E: &str = "random-regular:N:D[:SEED]";
                Self::RandomRegular {
                    n: num(n, E)?,
                    d: num(d, E)?,
                    seed: rest.first().map(|s| seed(s, E)).transpose()?,
                }
            }
            ("tree", [n, rest @ ..]) if rest.len() <= 1 => {
                const E: &str = "tree:N[:SEED]";
                Self::Tree {
                    n: num(n, E)?,
                    seed: rest.first().map(|s| seed(s, E)).transpose()?,
                }
            }
            ("ring", _) => return Err(malformed("ring:N")),
            ("path", _) => return Err(malformed("path:N")),
            ("star", _) => return Err(malformed("star:N")),
            ("complete", _) => return Err(malformed("complete:N")),
            ("grid", _) => return Err(malformed("grid:RxC")),
            ("random-regular", _) => return Err(malformed("random-regular:N:D[:SEED]")),
            _ => return Err(malformed("tree:N[:SEED]")),
        })
    }
}

impl fmt::Display for TopologySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ring(n) => write!(f, "ring:{n}"),
            Self::Path(n) => write!(f, "path:{n}"),
            Self::Star(n) => write!(f, "star:{n}"),
            Self::Complete(n) => write!(f, "complete:{n}"),
            Self::Grid(r, c) => write!(f, "grid:{r}x{c}"),
            Self::RandomRegular {
                n,
                d,
                seed: Some(s),
            } => write!(f, "random-regular:{n}:{d}:{s}"),
            Self::RandomRegular { n, d, seed: None } => write!(f, "random-regular:{n}:{d}"),
            Self::Tree { n, seed: Some(s) } => write!(f, "tree:{n}:{s}"),
            Self::Tree { n, seed: None } => write!(f, "tree:{n}"),
            Self::EdgeList(p) => write!(f, "file:{}", p.display()),
        }
    }
}
