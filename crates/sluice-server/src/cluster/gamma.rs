//! `gamma: auto`: γ* of the graph over the members this node hears, recomputed when they
//! change (seed 000 Thm 2, capped by seed 003 eq. 15).

use std::collections::{BTreeMap, BTreeSet};

use sluice_coord::law::Measure;
use sluice_coord::node::{LinkState, Node};
use sluice_coord::stability::max_gain;
use sluice_coord::wire::NodeId;
use sluice_graph::{Topology, auto_gamma};

use super::{ClusterError, ClusterSpec, Gamma};

/// What `gamma: auto` needs to recompute γ* when membership changes.
#[derive(Debug, Clone)]
pub(super) struct AutoGamma {
    /// The communication graph over every member (node ids).
    pub(super) edges: Vec<(NodeId, NodeId, f64)>,
    pub(super) measure: Measure,
}

/// The communication graph `gamma: auto` works on: the configured topology, or every
/// member linked to every other with weight 1.
pub(super) fn auto_edges(spec: &ClusterSpec) -> Vec<(NodeId, NodeId, f64)> {
    match &spec.topology {
        Some(t) => t.clone(),
        None => {
            let mut ids: BTreeSet<NodeId> = spec.peers.iter().map(|p| p.id).collect();
            ids.insert(spec.node_id);
            complete_edges(&ids)
        }
    }
}

/// Every node of `ids` linked to every other with weight 1.
pub(super) fn complete_edges(ids: &BTreeSet<NodeId>) -> Vec<(NodeId, NodeId, f64)> {
    let ids: Vec<NodeId> = ids.iter().copied().collect();
    let mut e = Vec::new();
    for (i, &a) in ids.iter().enumerate() {
        for &b in &ids[i + 1..] {
            e.push((a, b, 1.0));
        }
    }
    e
}

/// γ* = 2/(λ₂+λₙ) (seed 000 Thm 2) of the graph `edges` induced on `live`, restricted to the
/// component of `me`, scaled by the measure's slope and capped by seed 003 eq. 15 for
/// `degree` (this node's weighted degree to the live neighbours). `None` when `me` has no
/// live neighbour: there is no graph to speak of, and no one to give to.
///
/// With `whole`, every node of `edges` must be live and connected (the start: a
/// disconnected configured topology is an error, not a smaller cluster).
pub(super) fn auto_gain(
    me: NodeId,
    live: &BTreeSet<NodeId>,
    auto: &AutoGamma,
    degree: f64,
    whole: bool,
) -> Result<Option<f64>, ClusterError> {
    let edges: Vec<(NodeId, NodeId, f64)> = auto
        .edges
        .iter()
        .copied()
        .filter(|&(a, b, _)| whole || (live.contains(&a) && live.contains(&b)))
        .collect();
    // The component of `me` (whole: every node the graph names, so the spectrum sees a
    // disconnection instead of hiding it).
    let mut ids: BTreeSet<NodeId> = BTreeSet::from([me]);
    if whole {
        ids.extend(live.iter().copied());
        ids.extend(edges.iter().flat_map(|&(a, b, _)| [a, b]));
    } else {
        let mut frontier = vec![me];
        while let Some(x) = frontier.pop() {
            for &(a, b, _) in &edges {
                let next = if a == x {
                    b
                } else if b == x {
                    a
                } else {
                    continue;
                };
                if ids.insert(next) {
                    frontier.push(next);
                }
            }
        }
    }
    if ids.len() < 2 {
        return Ok(None);
    }
    let index: BTreeMap<NodeId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let local: Vec<(usize, usize, f64)> = edges
        .iter()
        .filter_map(|&(a, b, w)| Some((*index.get(&a)?, *index.get(&b)?, w)))
        .collect();
    let topo = Topology::from_edges(ids.len(), local)?;
    let stable = max_gain(&auto.measure, degree);
    Ok(Some(
        (auto_gamma(&topo)? * auto.measure.min_slope()).min(stable),
    ))
}

/// The gain for `spec` at start: see [`Gamma`].
pub(super) fn gain(spec: &ClusterSpec, measure: &Measure) -> Result<f64, ClusterError> {
    // A node that starts with no configured peer (a joiner) gives first to one neighbour;
    // the law caps γ by the live degree at every tick as more link with it.
    let degree: f64 = spec.peers.iter().map(|p| p.weight).sum::<f64>().max(1.0);
    let stable = max_gain(measure, degree);
    match spec.gamma {
        Gamma::Fixed(g) => Ok(g),
        Gamma::Auto => {
            let auto = AutoGamma {
                edges: auto_edges(spec),
                measure: *measure,
            };
            let mut all: BTreeSet<NodeId> = spec.peers.iter().map(|p| p.id).collect();
            all.insert(spec.node_id);
            Ok(auto_gain(spec.node_id, &all, &auto, degree, true)?.unwrap_or(stable))
        }
    }
}

/// Applies a recomputed gain to the node; returns whether the node now uses it
/// ([`Node::set_gamma`] checks it against the stability bound of the neighbours it hears at
/// `now`, and refuses — keeping the old γ — otherwise).
pub(super) fn apply_gamma(node: &mut Node, gamma: f64, now: u64) -> bool {
    node.set_gamma(gamma, now).is_ok()
}

impl<T: crate::peer::Transport> super::Cluster<T> {
    /// `gamma: auto`: recomputes γ* when the set of members heard within a lease changed
    /// (see the module documentation). Runs right before `tick`, with its `now`, so the law
    /// never gives with a gain computed for fewer neighbours than it gives to.
    pub(super) fn follow_membership(&self, d: &mut super::Driven, now: u64) {
        let Some(auto) = &self.auto else { return };
        // Nobody is declared dead before a lease has passed; until then the configured
        // members are the membership (and peers not heard from yet are not missing).
        if now < d.node.config().lease {
            return;
        }
        let mut live = BTreeSet::from([self.me()]);
        let mut degree = 0.0;
        // The configured peers, and (every node linking every other, no topology given)
        // the nodes that joined at run time.
        let joined = self
            .spec
            .topology
            .is_none()
            .then(|| d.node.membership().live);
        let candidates = self
            .peers
            .values()
            .map(|p| (p.id, p.weight))
            .chain(joined.iter().flatten().map(|&(id, _)| (id, 1.0)));
        for (id, weight) in candidates {
            if id != self.me()
                && !live.contains(&id)
                && matches!(
                    d.node.link_state(id, now),
                    Some(LinkState::Up | LinkState::Suspect)
                )
            {
                live.insert(id);
                degree += weight;
            }
        }
        if live == d.live {
            return;
        }
        let old = d.gamma_auto;
        let complete;
        let auto = if self.spec.topology.is_none() {
            complete = AutoGamma {
                edges: complete_edges(&live),
                measure: auto.measure,
            };
            &complete
        } else {
            auto
        };
        match auto_gain(self.me(), &live, auto, degree, false) {
            Ok(Some(g)) => {
                d.gamma_auto = Some(g);
                let applied = apply_gamma(&mut d.node, g, now);
                tracing::info!(
                    node = self.me(),
                    live = ?live,
                    gamma_auto = g,
                    previous = ?old,
                    in_use = d.node.config().gamma,
                    applied,
                    "membership changed: recomputed gamma"
                );
            }
            // Alone: nobody to give to, γ is moot; keep the last value.
            Ok(None) => {
                tracing::info!(node = self.me(), live = ?live, "membership changed: no live neighbour");
            }
            Err(e) => {
                tracing::warn!(node = self.me(), live = ?live, error = %e, "cannot recompute gamma");
            }
        }
        d.live = live;
    }
}
