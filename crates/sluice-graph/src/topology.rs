//! The communication graph of a cluster: nodes 0..n, undirected weighted edges, neighbours.

use std::collections::{BTreeSet, BinaryHeap, HashSet};
use std::fmt::Write as _;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::GraphError;

/// Random topologies try this many times to draw a connected graph before giving up.
const MAX_ATTEMPTS: usize = 1000;

/// One undirected link `{a, b}` with its weight `w_ab` (seed 000 eq. 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    /// Smaller endpoint.
    pub a: usize,
    /// Larger endpoint.
    pub b: usize,
    /// Link weight, finite and ≥ 0.
    pub weight: f64,
}

/// An undirected simple graph with non-negative link weights.
///
/// Edges are stored with `a < b`, in the order they were given; weight 0 is allowed (the link
/// exists but carries nothing), which is what weight synthesis may produce.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    n: usize,
    edges: Vec<Edge>,
    /// For each node, `(neighbour, edge index)`.
    adj: Vec<Vec<(usize, usize)>>,
}

impl Topology {
    /// Builds a topology from weighted edges; rejects self-loops, duplicates, out-of-range
    /// nodes and negative or non-finite weights.
    pub fn from_edges(
        n: usize,
        edges: impl IntoIterator<Item = (usize, usize, f64)>,
    ) -> Result<Self, GraphError> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut adj = vec![Vec::new(); n];
        for (x, y, weight) in edges {
            let (a, b) = (x.min(y), x.max(y));
            if a == b {
                return Err(GraphError::InvalidEdge {
                    a,
                    b,
                    message: "self-loop",
                });
            }
            if b >= n {
                return Err(GraphError::InvalidEdge {
                    a,
                    b,
                    message: "node out of range",
                });
            }
            if !weight.is_finite() || weight < 0.0 {
                return Err(GraphError::InvalidWeight { a, b, weight });
            }
            if !seen.insert((a, b)) {
                return Err(GraphError::InvalidEdge {
                    a,
                    b,
                    message: "duplicate edge",
                });
            }
            adj[a].push((b, out.len()));
            adj[b].push((a, out.len()));
            out.push(Edge { a, b, weight });
        }
        Ok(Self { n, edges: out, adj })
    }

    fn unit(n: usize, pairs: impl IntoIterator<Item = (usize, usize)>) -> Result<Self, GraphError> {
        Self::from_edges(n, pairs.into_iter().map(|(a, b)| (a, b, 1.0)))
    }

    fn check_min(kind: &'static str, n: usize, min: usize) -> Result<(), GraphError> {
        if n < min {
            Err(GraphError::TooSmall { kind, n, min })
        } else {
            Ok(())
        }
    }

    /// Cycle C_n (n ≥ 3), unit weights.
    pub fn ring(n: usize) -> Result<Self, GraphError> {
        Self::check_min("ring", n, 3)?;
        Self::unit(n, (0..n).map(|i| (i, (i + 1) % n)))
    }

    /// Path P_n (n ≥ 2), unit weights.
    pub fn path(n: usize) -> Result<Self, GraphError> {
        Self::check_min("path", n, 2)?;
        Self::unit(n, (0..n - 1).map(|i| (i, i + 1)))
    }

    /// Star S_n: hub 0 linked to nodes 1..n (n ≥ 2 nodes in all), unit weights.
    pub fn star(n: usize) -> Result<Self, GraphError> {
        Self::check_min("star", n, 2)?;
        Self::unit(n, (1..n).map(|i| (0, i)))
    }

    /// Complete graph K_n (n ≥ 2), unit weights.
    pub fn complete(n: usize) -> Result<Self, GraphError> {
        Self::check_min("complete", n, 2)?;
        Self::unit(n, (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))))
    }

    /// `rows × cols` lattice, node `r·cols + c`, 4-neighbour links, unit weights.
    pub fn grid(rows: usize, cols: usize) -> Result<Self, GraphError> {
        Self::check_min("grid", rows.saturating_mul(cols), 2)?;
        let mut pairs = Vec::new();
        for r in 0..rows {
            for c in 0..cols {
                let i = r * cols + c;
                if c + 1 < cols {
                    pairs.push((i, i + 1));
                }
                if r + 1 < rows {
                    pairs.push((i, i + cols));
                }
            }
        }
        Self::unit(rows * cols, pairs)
    }

    /// A connected random `d`-regular graph on `n` nodes, drawn from `seed` (ChaCha8).
    ///
    /// Pairs the `n·d` half-edges one at a time, never forming a self-loop or a double link
    /// (Steger–Wormald); restarts when stuck or when the result is disconnected.
    pub fn random_regular(n: usize, d: usize, seed: u64) -> Result<Self, GraphError> {
        Self::check_min("random-regular", n, 2)?;
        if d == 0 || d >= n {
            return Err(GraphError::BadDegree { n, d });
        }
        if (n * d) % 2 == 1 {
            return Err(GraphError::OddDegreeSum { n, d });
        }
        if d == 1 && n > 2 {
            return Err(GraphError::NeverConnected { n });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..MAX_ATTEMPTS {
            if let Some(pairs) = try_pair_regular(n, d, &mut rng) {
                let t = Self::unit(n, pairs)?;
                if t.is_connected() {
                    return Ok(t);
                }
            }
        }
        Err(GraphError::GenerationFailed {
            n,
            d,
            attempts: MAX_ATTEMPTS,
        })
    }

    /// A uniformly random labelled tree on `n ≥ 2` nodes (random Prüfer sequence, ChaCha8).
    pub fn random_tree(n: usize, seed: u64) -> Result<Self, GraphError> {
        Self::check_min("tree", n, 2)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let prufer: Vec<usize> = (0..n - 2).map(|_| rng.random_range(0..n)).collect();
        let mut degree = vec![1usize; n];
        for &p in &prufer {
            degree[p] += 1;
        }
        // Min-heap of current leaves (Reverse for smallest first).
        let mut leaves: BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
            .filter(|&i| degree[i] == 1)
            .map(std::cmp::Reverse)
            .collect();
        let mut pairs = Vec::with_capacity(n - 1);
        for &p in &prufer {
            let Some(std::cmp::Reverse(leaf)) = leaves.pop() else {
                break;
            };
            pairs.push((leaf, p));
            degree[p] -= 1;
            if degree[p] == 1 {
                leaves.push(std::cmp::Reverse(p));
            }
        }
        let rest: Vec<usize> = leaves.into_iter().map(|r| r.0).collect();
        if let [x, y] = rest[..] {
            pairs.push((x, y));
        }
        Self::unit(n, pairs)
    }

    /// Parses an edge list: one edge per line, `a b [weight]` (weight defaults to 1), nodes
    /// named by integers from 0; blank lines and `#` comments are ignored. The node count is
    /// the largest index + 1.
    pub fn parse_edge_list(text: &str) -> Result<Self, GraphError> {
        let rows = parse_edge_rows(text)?;
        if rows.is_empty() {
            return Err(GraphError::EmptyEdgeList);
        }
        let n = rows.iter().map(|r| r.1.max(r.2)).max().unwrap_or(0) + 1;
        let mut seen = HashSet::new();
        for &(line, a, b, _) in &rows {
            if a == b {
                return Err(GraphError::EdgeListLine {
                    line,
                    message: format!("self-loop {a} {b}"),
                });
            }
            if !seen.insert((a.min(b), a.max(b))) {
                return Err(GraphError::EdgeListLine {
                    line,
                    message: format!("duplicate edge {a} {b}"),
                });
            }
        }
        Self::from_edges(
            n,
            rows.into_iter()
                .map(|(_, a, b, w)| (a, b, w.unwrap_or(1.0))),
        )
    }

    /// Reads [`Topology::parse_edge_list`] from a file.
    pub fn read_edge_list(path: &std::path::Path) -> Result<Self, GraphError> {
        let text = std::fs::read_to_string(path).map_err(|source| GraphError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_edge_list(&text)
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.n
    }

    /// The edges, each with `a < b`.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// Neighbours of `node` with the weight of the link to each.
    pub fn neighbours(&self, node: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.adj
            .get(node)
            .into_iter()
            .flatten()
            .map(|&(j, e)| (j, self.edges[e].weight))
    }

    /// Number of links at `node`.
    pub fn degree(&self, node: usize) -> usize {
        self.adj.get(node).map_or(0, Vec::len)
    }

    /// Σ_j w_ij: the diagonal of the Laplacian.
    pub fn weighted_degree(&self, node: usize) -> f64 {
        self.neighbours(node).map(|(_, w)| w).sum()
    }

    /// The same links with new weights, in [`Topology::edges`] order.
    pub fn with_weights(&self, weights: &[f64]) -> Result<Self, GraphError> {
        if weights.len() != self.edges.len() {
            return Err(GraphError::WeightCount {
                expected: self.edges.len(),
                got: weights.len(),
            });
        }
        Self::from_edges(
            self.n,
            self.edges.iter().zip(weights).map(|(e, &w)| (e.a, e.b, w)),
        )
    }

    /// Overrides weights from an edge-list text (`a b weight` per line). Every listed pair
    /// must be a link of this topology; links not listed keep their weight.
    pub fn with_weights_from_edge_list(&self, text: &str) -> Result<Self, GraphError> {
        let mut weights: Vec<f64> = self.edges.iter().map(|e| e.weight).collect();
        for (line, a, b, w) in parse_edge_rows(text)? {
            let Some(w) = w else {
                return Err(GraphError::EdgeListLine {
                    line,
                    message: "a weights file needs `a b weight`".into(),
                });
            };
            let Some(&(_, e)) = self
                .adj
                .get(a)
                .and_then(|v| v.iter().find(|&&(j, _)| j == b))
            else {
                return Err(GraphError::EdgeListLine {
                    line,
                    message: format!("{a} {b} is not a link of the topology"),
                });
            };
            weights[e] = w;
        }
        self.with_weights(&weights)
    }

    /// Number of connected components over links of positive weight.
    pub fn components(&self) -> usize {
        let mut seen = vec![false; self.n];
        let mut count = 0;
        let mut stack = Vec::new();
        for s in 0..self.n {
            if seen[s] {
                continue;
            }
            count += 1;
            seen[s] = true;
            stack.push(s);
            while let Some(i) = stack.pop() {
                for (j, w) in self.neighbours(i) {
                    if w > 0.0 && !seen[j] {
                        seen[j] = true;
                        stack.push(j);
                    }
                }
            }
        }
        count
    }

    /// True when every node reaches every other over links of positive weight.
    pub fn is_connected(&self) -> bool {
        self.components() == 1
    }

    /// The edge list in the format [`Topology::parse_edge_list`] reads (weights included),
    /// e.g. to feed synthesised weights to a server config.
    pub fn to_edge_list(&self) -> String {
        let mut s = String::new();
        for e in &self.edges {
            let _ = writeln!(s, "{} {} {}", e.a, e.b, e.weight);
        }
        s
    }
}

/// `(line, a, b, weight?)` of one non-comment line.
type EdgeRow = (usize, usize, usize, Option<f64>);

/// Every non-comment line of an edge list.
fn parse_edge_rows(text: &str) -> Result<Vec<EdgeRow>, GraphError> {
    let mut rows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let bad = |message: String| GraphError::EdgeListLine { line, message };
        let fields: Vec<&str> = content.split_whitespace().collect();
        if fields.len() != 2 && fields.len() != 3 {
            return Err(bad(format!("expected `a b [weight]`, got `{content}`")));
        }
        let node = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| bad(format!("`{s}` is not a node index (integers from 0)")))
        };
        let (a, b) = (node(fields[0])?, node(fields[1])?);
        let w = match fields.get(2) {
            None => None,
            Some(s) => {
                let w: f64 = s
                    .parse()
                    .map_err(|_| bad(format!("`{s}` is not a number")))?;
                if !w.is_finite() || w < 0.0 {
                    return Err(bad(format!("weight {w} must be finite and ≥ 0")));
                }
                Some(w)
            }
        };
        rows.push((line, a, b, w));
    }
    Ok(rows)
}

/// One attempt at pairing half-edges into a simple d-regular graph; `None` when stuck.
fn try_pair_regular(n: usize, d: usize, rng: &mut ChaCha8Rng) -> Option<Vec<(usize, usize)>> {
    let mut points: Vec<usize> = (0..n).flat_map(|i| std::iter::repeat_n(i, d)).collect();
    let mut links: BTreeSet<(usize, usize)> = BTreeSet::new();
    let ok = |links: &BTreeSet<(usize, usize)>, u: usize, v: usize| {
        u != v && !links.contains(&(u.min(v), u.max(v)))
    };
    while !points.is_empty() {
        let mut chosen = None;
        for _ in 0..64 {
            let i = rng.random_range(0..points.len());
            let j = rng.random_range(0..points.len());
            if i != j && ok(&links, points[i], points[j]) {
                chosen = Some((i, j));
                break;
            }
        }
        if chosen.is_none() {
            if points.len() > 4096 {
                return None;
            }
            // Few points left: pick uniformly among the suitable pairs, or give up.
            let suitable: Vec<(usize, usize)> = (0..points.len())
                .flat_map(|i| (i + 1..points.len()).map(move |j| (i, j)))
                .filter(|&(i, j)| ok(&links, points[i], points[j]))
                .collect();
            if suitable.is_empty() {
                return None;
            }
            chosen = Some(suitable[rng.random_range(0..suitable.len())]);
        }
        let (i, j) = chosen?;
        let (u, v) = (points[i], points[j]);
        links.insert((u.min(v), u.max(v)));
        let (hi, lo) = (i.max(j), i.min(j));
        points.swap_remove(hi);
        points.swap_remove(lo);
    }
    Some(links.into_iter().collect())
}
