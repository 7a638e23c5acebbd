//! The membership series of `/metrics` (docs/PROTOCOL.md, "Membership").

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

use super::gauge;
use crate::status::ClusterStatus;

/// Who the members are and how they changed (docs/PROTOCOL.md, "Membership").
pub(super) fn encode(encoder: &mut DescriptorEncoder<'_>, s: &ClusterStatus) -> fmt::Result {
    let ms = &s.membership;
    let counter = ConstCounter::new(0u64);
    {
        let mut m = encoder.encode_descriptor(
            "sluice_cluster_membership_changes",
            "Membership changes seen: links made at run time (join), incarnations that left, \
             incarnations fenced, joiners refused for want of room",
            None,
            counter.metric_type(),
        )?;
        for (change, v) in [
            ("join", ms.joins),
            ("leave", ms.leaves),
            ("fence", ms.fences),
            ("refused", ms.refused),
        ] {
            ConstCounter::new(v).encode(m.encode_family(&[("change", change)])?)?;
        }
    }
    {
        let mut m = encoder.encode_descriptor(
            "sluice_peer_directories",
            "Directories (who is in the cluster, where) sent and received",
            None,
            counter.metric_type(),
        )?;
        let p = &s.peer;
        for (direction, v) in [
            ("sent", p.directories_sent),
            ("received", p.directories_received),
        ] {
            ConstCounter::new(v).encode(m.encode_family(&[("direction", direction)])?)?;
        }
    }
    gauge(
        encoder,
        "sluice_cluster_voters",
        "Voting members (they make the quorums)",
        ms.voters.len() as f64,
    )?;
    gauge(
        encoder,
        "sluice_cluster_members",
        "Nodes this node knows: configured, discovered or linked with (itself excluded)",
        s.members.len() as f64,
    )?;
    gauge(
        encoder,
        "sluice_cluster_discovery_candidates",
        "Addresses discovery proposes now (seeds, DNS records, a peers file)",
        ms.candidates as f64,
    )
}
