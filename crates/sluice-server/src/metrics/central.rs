//! The central backends' series of `/metrics`: this node's token server, and the token
//! servers as a client sees them (`coordination: token-server`).

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};

use super::gauge;
use crate::engine::Engine;

/// This node's own token server: whether it serves, its lease, what it granted and refused.
pub(super) fn encode_token_server(
    encoder: &mut DescriptorEncoder<'_>,
    engine: &Engine,
) -> fmt::Result {
    use crate::token_server::ServingState;
    let Some(s) = engine.token_server_node_status() else {
        return Ok(());
    };
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    gauge(
        encoder,
        "sluice_token_server_active",
        "1 while this token server holds the serving lease of a majority and grants, 0 while \
         it stands by (or waits out a predecessor's grants)",
        i64::from(s.state == ServingState::Active),
    )?;
    gauge(
        encoder,
        "sluice_token_server_lease_remaining_ms",
        "How long this token server's serving lease still runs (0: not held)",
        n(s.lease_left.unwrap_or(0) / 1_000_000),
    )?;
    gauge(
        encoder,
        "sluice_token_server_acquisitions",
        "Times this token server acquired the serving lease",
        n(s.acquisitions),
    )?;
    gauge(
        encoder,
        "sluice_token_server_granted",
        "Permits this token server granted",
        n(s.granted),
    )?;
    let counter = Counter::<u64>::default();
    let mut m = encoder.encode_descriptor(
        "sluice_token_server_refused",
        "Requests this token server refused: not_serving (no lease, or waiting out a \
         predecessor), replay (a sequence number seen or out of the window), wrong_limit (a \
         limit other than its configuration's), unreported (the key's allowance beyond its \
         last report to a majority used, until the next renewal), unauthenticated (bad seal \
         or message)",
        None,
        counter.metric_type(),
    )?;
    for (reason, v) in [
        ("not_serving", s.refused.not_serving),
        ("replay", s.refused.replays),
        ("wrong_limit", s.refused.wrong_limit),
        ("unreported", s.refused.unreported),
        ("unauthenticated", s.rejected),
    ] {
        ConstCounter::new(v).encode(m.encode_family(&[("reason", reason)])?)?;
    }
    Ok(())
}

/// `coordination: token-server` rules: leases from a token server, or this node's fallback.
pub(super) fn encode_token(encoder: &mut DescriptorEncoder<'_>, engine: &Engine) -> fmt::Result {
    let Some(t) = engine.token_status() else {
        return Ok(());
    };
    let fallback = matches!(t.mode, crate::token_server::TokenMode::Fallback);
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    gauge(
        encoder,
        "sluice_token_fallback",
        "1 while token-server rules are decided locally (no token server answered within the \
         timeout: what is left of the lease, then this node's share), 0 while leases decide",
        i64::from(fallback),
    )?;
    gauge(
        encoder,
        "sluice_token_transitions",
        "Changes between token-server leases and the local fallback since start",
        n(t.transitions),
    )?;
    gauge(
        encoder,
        "sluice_token_server",
        "Id of the token server this node asks now",
        i64::from(t.server),
    )?;
    gauge(
        encoder,
        "sluice_token_calls",
        "Requests for permits sent to token servers",
        n(t.calls),
    )?;
    gauge(
        encoder,
        "sluice_token_granted",
        "Permits granted to this node by token servers",
        n(t.granted),
    )?;
    gauge(
        encoder,
        "sluice_token_decisions_central",
        "Decisions of token-server rules made from leases (or a server's refusal)",
        n(t.decisions_central),
    )?;
    gauge(
        encoder,
        "sluice_token_decisions_local",
        "Decisions of token-server rules made locally with this node's share (fallback)",
        n(t.decisions_local),
    )
}
