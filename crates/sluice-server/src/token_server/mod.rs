//! `coordination: token-server`: one Sluice node hands out a rule's permits to the others
//! in leased batches (seed 002 §4.4(3), the token server, with the batching rule of seed 002
//! §4.4(5)); it serves only while it holds a lease from a majority of the listed token
//! servers, so two servers never serve at once.
//!
//! # The pieces
//!
//! - [`TokenServer`] (`core`), the pure state machine of one server (time is an argument,
//!   [`Now`]): the serving lease ([`serving`]: votes, renewals, the takeover), the grants
//!   ([`grants`]: per rule and descriptor a central state of the rule's `sluice-limits`
//!   algorithm; a grant of `n` permits is a decision of cost `n` on it) and the replay
//!   window ([`replay`]).
//! - [`LeaseBook`] (`book`), the pure client side: per key the permits of the current lease,
//!   the measured consumption rate and the size to ask for next.
//! - [`TokenClient`] (`client`), the async client a node's engine calls
//!   ([`crate::Engine::attach_token_server`]): the token servers as a
//!   [`sluice_center::Center`] (answers from its lease, asks the server when the lease runs
//!   out) behind the fallback every center shares ([`sluice_center::FallbackLimiter`], as
//!   `coordination: redis` does): while no server grants within the timeout it decides
//!   locally — from its lease alone while the lease lasts, then with `1/N` of the limit on a
//!   state that already counts what the node took from leases (seed 002 §4.4(4)) — probing
//!   one request per 100 ms. What the share admits is owed: the key's next grant request
//!   carries it ([`GrantRequest::charge`]) and the server counts it before it grants.
//! - [`TokenServerNode`] (`node`), the HTTP shell: `POST /v1/token` ([`router`]) and the
//!   renewal loop; it reads the clocks and calls the core.
//!
//! # Serving is a lease (docs/PROTOCOL.md, "Token server")
//!
//! A server serves only while it holds a lease granted by a majority of the listed servers
//! (itself included): every `renew_every` it sends a renewal to every server and, when a
//! majority granted the round sent at `s` (its monotonic clock), it holds until `s + lease`.
//! A server that granted a renewal to one holder grants no other for `lease·(1+ρ)²` on its
//! own clock after it last granted that holder (and for `lease·(1+ρ)²` after its own start,
//! having forgotten its promises). With clock rates within `[1/(1+ρ), 1+ρ]` the holder stops
//! (real time ≤ `s + lease·(1+ρ)`) before any member of the intersecting majority can vote for
//! another one, so two servers never hold at once, whatever freezes, cuts or restarts. The
//! holder checks its lease against the clock read at every grant: a frozen holder that
//! resumes grants nothing from stale state. A new holder serves `grant_lease·(1+ρ)²` after it
//! acquired (every permit of a predecessor's grant has expired by then) and, when a voter of
//! its majority reports a predecessor, counts the predecessor's possible grants as spent.
//!
//! # Transport
//!
//! `POST /v1/token` on the server's own listener, the body a JSON [`Envelope`] sealed exactly
//! like a peer datagram ([`crate::peer::seal`]: HMAC-SHA256 under the cluster's shared key,
//! with sender and recipient ids), and so is the answer, which echoes the request's sequence
//! number: a node without the key can neither take permits nor fake a grant, and a captured
//! message or answer replayed is refused ([`replay`]).

mod book;
mod client;
mod core;
pub mod grants;
mod node;
pub mod replay;
pub mod serving;
mod transport;

pub use book::{LeaseBook, Local, RequestSizing};
pub use client::{ClientSpec, NotServed, TokenClient, TokenMode, TokenStatus};
pub use core::{Now, Refusals, ServerStatus, ServingState, TokenServer};
pub use grants::GrantConfig;
pub use node::{RuleLimits, ServerSpec, TokenServerNode, bind, router, run};
pub use serving::{ServingLease, ServingLeaseError, Vote};
pub use transport::CallError;

use sluice_limits::Nanos;

/// The endpoint on a token server's listener.
pub const PATH: &str = "/v1/token";

/// Largest message accepted (a key is at most a few hundred bytes).
const MAX_MESSAGE: usize = 64 * 1024;

/// A node asks for permits of one key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GrantRequest {
    /// The descriptor's key (domain and entries, as `coordination: redis` names it).
    pub key: String,
    /// The rule's algorithm, by name.
    pub algorithm: String,
    /// The rule's limit: count per period (ns), burst.
    pub count: u64,
    /// The period, ns.
    pub period: Nanos,
    /// The burst.
    pub burst: u64,
    /// How many permits the node would like (its rate over the horizon).
    pub want: u64,
    /// The request that needs them (the grant is at least this when it fits).
    pub cost: u64,
    /// Permits the node admitted on its own (its fallback share) since its last grant that
    /// still weigh (the current window, the last period, a bucket's drain): the server counts
    /// them before it grants. Absent (0) from nodes that predate it.
    #[serde(default)]
    pub charge: u64,
}

/// What a node sends a token server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    /// Permits, please.
    Grant(GrantRequest),
    /// A server asks for (or renews) the serving lease: round `round` of incarnation
    /// `incarnation` (its start, ns since the epoch: a restarted server is another holder).
    Renew {
        /// The sender's round (a vote answers one round).
        round: u64,
        /// The sender's incarnation.
        incarnation: u64,
        /// What its grants spent, when it holds the lease (docs/PROTOCOL.md, "Token
        /// server"): voters keep it and hand it to the next holder.
        #[serde(default)]
        report: Option<Report>,
    },
}

/// What a holder's state had spent per key at `at`, sent with its renewals: a successor
/// counts this (and the holder's bounded allowance beyond it, [`grants::Grants`]) as spent
/// instead of the whole window.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The holder's id.
    pub holder: u32,
    /// When (the holder's wall clock, ns since the epoch).
    pub at: Nanos,
    /// Whether every key with permits spent is listed (else the most spent
    /// [`grants::REPORT_KEYS`], and the others count as wholly spent).
    pub complete: bool,
    /// The keys.
    pub keys: Vec<Spent>,
}

/// One key of a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Spent {
    /// The key, as in [`GrantRequest::key`].
    pub key: String,
    /// The rule's algorithm, by name.
    pub algorithm: String,
    /// Permits the key's state counted at the report's time (granted, charged, or inherited
    /// from a predecessor), as what a fresh state would admit less what it admits.
    pub used: u64,
}

/// Why a server refused a request it could read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The request names another limit or algorithm than the server's configuration for the
    /// key (or the server has no `coordination: token-server` rule for it).
    WrongLimit,
}

/// A token server's answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// Permits granted (possibly 0).
    Grant {
        /// Permits given to the node.
        granted: u64,
        /// What the rule still allows after this grant.
        remaining: u64,
        /// The permits may be used for this long after the request was sent (ns).
        valid_for: Nanos,
        /// With nothing granted: when asking again may succeed (ns).
        retry_after: Option<Nanos>,
    },
    /// Holds the serving lease, but not serving yet: a predecessor's grants may still be in
    /// use (ns to wait).
    Starting {
        /// Time until it serves.
        serving_in: Nanos,
    },
    /// Does not hold the serving lease: ask `holder` (the server this one last voted for,
    /// if its promise still runs).
    Standby {
        /// Who holds the lease, as far as this server knows.
        #[serde(default)]
        holder: Option<u32>,
    },
    /// Refused, and counted.
    Refused {
        /// Why.
        reason: Refusal,
    },
    /// A vote on a renewal.
    Vote {
        /// The round voted on.
        round: u64,
        /// The vote.
        vote: Vote,
        /// With a vote granted: the latest report of every other holder this voter kept.
        #[serde(default)]
        reports: Vec<Report>,
    },
}

/// The sealed body of every message and answer: a per-sender sequence number (an answer
/// echoes its request's), so a captured message replayed is refused and an old answer cannot
/// pass for a new one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Envelope<T> {
    /// The sender's sequence number (its wall clock in ns, strictly increasing).
    pub seq: u64,
    /// The message.
    pub body: T,
}

/// One token server of the ordered list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddr {
    /// Its id (the recipient of sealed messages).
    pub id: u32,
    /// `HOST:PORT` of its token listener.
    pub authority: String,
}

/// Why a token server list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// An entry is not `ID=HOST:PORT`.
    #[error("token server {0:?}: expected ID=HOST:PORT (e.g. 0=10.0.0.1:8083)")]
    Entry(String),
    /// Two entries with one id.
    #[error("token server id {0} is listed twice")]
    Duplicate(u32),
    /// No entry.
    #[error("no token server given")]
    Empty,
    /// This node's id is not in the list.
    #[error("token server id {0} is not in the list")]
    NotListed(u32),
}

/// Parses `ID=HOST:PORT,…` (an optional `http://` is accepted): primary first.
///
/// # Errors
/// [`TokenError`].
pub fn parse_servers(list: &str) -> Result<Vec<ServerAddr>, TokenError> {
    let mut out: Vec<ServerAddr> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| TokenError::Entry(item.to_string()))?;
        let id: u32 = id
            .trim()
            .parse()
            .map_err(|_| TokenError::Entry(item.to_string()))?;
        let addr = addr.trim();
        let addr = addr
            .strip_prefix("http://")
            .unwrap_or(addr)
            .trim_end_matches('/');
        if addr.is_empty() || !addr.contains(':') {
            return Err(TokenError::Entry(item.to_string()));
        }
        if out.iter().any(|s| s.id == id) {
            return Err(TokenError::Duplicate(id));
        }
        out.push(ServerAddr {
            id,
            authority: addr.to_string(),
        });
    }
    if out.is_empty() {
        return Err(TokenError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lists_parse_in_order() {
        let s = parse_servers("0=127.0.0.1:1, 2=http://h:2/").unwrap();
        assert_eq!(
            s[1],
            ServerAddr {
                id: 2,
                authority: "h:2".into()
            }
        );
        assert_eq!(parse_servers("0=a:1,0=b:2"), Err(TokenError::Duplicate(0)));
        assert!(parse_servers("x").is_err());
        assert_eq!(parse_servers(""), Err(TokenError::Empty));
    }
}
