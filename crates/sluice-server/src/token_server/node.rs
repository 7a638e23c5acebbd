//! The token server's shell: `POST /v1/token` over HTTP and the rounds of the serving lease.
//! It reads the clocks and calls the pure core ([`TokenServer`]); it decides nothing itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use sluice_limits::{AlgorithmKind, Limit, Nanos};

use super::core::{Now, ServerStatus, ServingState, TokenServer};
use super::grants::GrantConfig;
use super::serving::ServingLease;
use super::transport::{Pool, wall_now};
use super::{Envelope, MAX_MESSAGE, Message, PATH, Reply, ServerAddr, TokenError};
use crate::config::{Coordination, Policy};
use crate::peer::{PeerKey, open, seal};

/// Where a token server takes each key's algorithm and limit from: its own configuration,
/// never the request.
pub trait RuleLimits: Send + Sync {
    /// The algorithm and limit of the `coordination: token-server` rule governing `key`
    /// (a descriptor's key as the engine names it: domain, then `|key=value` per entry).
    fn token_limit(&self, key: &str) -> Option<(AlgorithmKind, Limit)>;
}

/// The node's engine (weakly: the engine shows the server's state, the server reads the
/// engine's configuration, and neither keeps the other alive).
impl RuleLimits for std::sync::Weak<crate::Engine> {
    fn token_limit(&self, key: &str) -> Option<(AlgorithmKind, Limit)> {
        let (domain, entries) = split_key(key)?;
        let config = self.upgrade()?.config();
        let lookup = config
            .domain(&domain)?
            .lookup(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        match &lookup.rule.policy {
            Policy::Limited(l) if l.coordination == Coordination::TokenServer => {
                Some((l.algorithm, l.limit?))
            }
            _ => None,
        }
    }
}

type Entries = Vec<(String, String)>;

/// The inverse of the engine's central key (`\\` escapes `\\`, `|` and `=`).
fn split_key(key: &str) -> Option<(String, Entries)> {
    let mut domain = String::new();
    let mut entries: Vec<(String, Option<String>)> = Vec::new();
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        let ch = match c {
            '\\' => chars.next()?,
            '|' => {
                entries.push((String::new(), None));
                continue;
            }
            '=' => {
                let e = entries.last_mut()?;
                if e.1.is_some() {
                    return None;
                }
                e.1 = Some(String::new());
                continue;
            }
            c => c,
        };
        match entries.last_mut() {
            None => domain.push(ch),
            Some((k, None)) => k.push(ch),
            Some((_, Some(v))) => v.push(ch),
        }
    }
    let entries = entries
        .into_iter()
        .map(|(k, v)| v.map(|v| (k, v)))
        .collect::<Option<Vec<_>>>()?;
    Some((domain, entries))
}

/// How a node serves tokens.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The ordered servers (this one among them): primary first.
    pub servers: Vec<ServerAddr>,
    /// This server's id.
    pub id: u32,
    /// The shared key.
    pub key: PeerKey,
    /// Grant sizing and the grants' lease.
    pub grants: GrantConfig,
    /// The serving lease.
    pub serving: ServingLease,
    /// Deadline of a renewal (the clients' timeout, default 50 ms).
    pub timeout: Duration,
}

impl ServerSpec {
    /// Defaults for server `id` of `servers`.
    #[must_use]
    pub fn new(servers: Vec<ServerAddr>, id: u32, key: PeerKey) -> Self {
        Self {
            servers,
            id,
            key,
            grants: GrantConfig::default(),
            serving: ServingLease::default(),
            timeout: Duration::from_millis(50),
        }
    }

    /// The longest a grant-less gap lasts when the holder stops: the successor asks
    /// `promise() + renew_every` after it last heard the holder, and serves
    /// `grant lease·(1+ρ)²` after it won.
    #[must_use]
    pub fn takeover_delay(&self) -> Nanos {
        let s = &self.serving;
        s.promise()
            .saturating_add(2 * s.renew_every)
            .saturating_add(s.stretch(self.grants.lease))
    }
}

/// A running token server: the `POST /v1/token` handler's state and its lease rounds.
pub struct TokenServerNode {
    spec: ServerSpec,
    core: parking_lot::Mutex<TokenServer>,
    limits: Arc<dyn RuleLimits>,
    pool: Pool,
    origin: Instant,
    rejected: AtomicU64,
    /// Asks the rounds for a renewal now: a grant waits for its report to reach a majority.
    report_now: tokio::sync::Notify,
    /// Rounds run so far (their votes counted).
    rounds: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for TokenServerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenServerNode")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl TokenServerNode {
    /// Server `spec.id`, taking each key's limit from `limits` (the node's engine); it
    /// serves once it holds the serving lease of a majority (rounds run in [`run`]).
    ///
    /// # Errors
    /// [`TokenError::NotListed`] when `spec.id` is not among `spec.servers`.
    pub fn new(spec: ServerSpec, limits: Arc<dyn RuleLimits>) -> Result<Arc<Self>, TokenError> {
        let origin = Instant::now();
        let now = Now {
            wall: wall_now(),
            mono: 0,
        };
        let ids = spec.servers.iter().map(|s| s.id).collect();
        // A restart is another incarnation: voters do not take it for the old holder.
        let core = TokenServer::new(spec.grants, spec.serving, spec.id, ids, now.wall, now)
            .ok_or(TokenError::NotListed(spec.id))?;
        Ok(Arc::new(Self {
            pool: Pool::new(spec.servers.len()),
            core: parking_lot::Mutex::new(core),
            limits,
            origin,
            rejected: AtomicU64::new(0),
            report_now: tokio::sync::Notify::new(),
            rounds: tokio::sync::watch::Sender::new(0),
            spec,
        }))
    }

    fn now(&self) -> Now {
        Now {
            wall: wall_now(),
            mono: sluice_limits::clock::nanos(self.origin.elapsed()),
        }
    }

    /// Its state now.
    #[must_use]
    pub fn status(&self) -> ServerStatus {
        let core = self.core.lock();
        core.status(self.now(), self.rejected.load(Ordering::Relaxed))
    }

    /// Answers one sealed body (the handler, without HTTP); `None`: refused (403). A grant
    /// held back until the holder's next report reaches a majority asks for that renewal at
    /// once and is decided again after it (within the timeout), rather than refused for a
    /// renewal interval.
    async fn answer(&self, body: &[u8]) -> Option<Vec<u8>> {
        let Ok((from, payload)) = open(&self.spec.key, self.spec.id, body) else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let Ok(message) = serde_json::from_slice::<Envelope<Message>>(payload) else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let configured = match &message.body {
            Message::Grant(g) => self.limits.token_limit(&g.key),
            Message::Renew { .. } => None,
        };
        let decide = |core: &mut TokenServer, now: Now| match &message.body {
            Message::Grant(g) => core.grant(g, configured, now),
            Message::Renew {
                round,
                incarnation,
                report,
            } => core.vote(from, *round, *incarnation, report.clone(), now),
        };
        let (mut reply, held_back) = {
            let mut core = self.core.lock();
            // Read under the lock, right before the decision: never a time from before a
            // freeze.
            let now = self.now();
            if core.admit(from, message.seq, now).is_err() {
                return None;
            }
            let before = core.held_back();
            let reply = decide(&mut core, now);
            (reply, core.held_back() > before)
        };
        // Twice at most: the first round to end may have taken its report before this grant.
        let mut held_back = held_back;
        for _ in 0..2 {
            if !held_back || !self.renewed().await {
                break;
            }
            let mut core = self.core.lock();
            let before = core.held_back();
            reply = decide(&mut core, self.now());
            held_back = core.held_back() > before;
        }
        let answer = Envelope {
            seq: message.seq,
            body: reply,
        };
        let payload = serde_json::to_vec(&answer).ok()?;
        seal(&self.spec.key, self.spec.id, from, &payload).ok()
    }

    /// Asks for a round now and waits (within the timeout) until one has run.
    async fn renewed(&self) -> bool {
        let mut rounds = self.rounds.subscribe();
        let seen = *rounds.borrow_and_update();
        self.report_now.notify_one();
        tokio::time::timeout(self.spec.timeout, rounds.wait_for(|&r| r > seen))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Runs the serving lease's rounds every `renew_every` (and when a held-back grant asks
    /// for one) until `done` completes: asks every other server for its vote when this one
    /// should ask, and counts the votes.
    pub async fn campaign(self: Arc<Self>, done: impl std::future::Future<Output = ()>) {
        tokio::pin!(done);
        let every = Duration::from_nanos(self.spec.serving.renew_every.max(1));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_prune = self.now().mono;
        let mut was = ServingState::Standby;
        loop {
            tokio::select! {
                () = &mut done => return,
                _ = tick.tick() => {}
                () = self.report_now.notified() => {}
            }
            let now = self.now();
            let message = self.core.lock().start_round(now);
            if let Some(message @ Message::Renew { .. }) = message {
                let mut calls = tokio::task::JoinSet::new();
                for (i, s) in self.spec.servers.iter().enumerate() {
                    if s.id == self.spec.id {
                        continue;
                    }
                    let (node, s, message) = (self.clone(), s.clone(), message.clone());
                    calls.spawn(async move {
                        let r = node
                            .pool
                            .call_within(
                                node.spec.timeout,
                                i,
                                &s,
                                &node.spec.key,
                                node.spec.id,
                                &message,
                            )
                            .await;
                        (s.id, r)
                    });
                }
                // Each vote counts as it comes: the lease runs from the round's send time.
                while let Some(joined) = calls.join_next().await {
                    if let Ok((
                        from,
                        Ok(Reply::Vote {
                            round,
                            vote,
                            reports,
                        }),
                    )) = joined
                    {
                        self.core
                            .lock()
                            .tally(round, from, vote, reports, self.now());
                    }
                }
            }
            self.rounds.send_modify(|r| *r += 1);
            let state = self.core.lock().status(self.now(), 0).state;
            if was != ServingState::Standby && state == ServingState::Standby {
                tracing::warn!(
                    id = self.spec.id,
                    "token server lost the serving lease (no majority renewed it): standing by"
                );
            }
            was = state;
            if now.mono.saturating_sub(last_prune) >= 10_000_000_000 {
                last_prune = now.mono;
                self.core.lock().retain_idle(now);
            }
        }
    }
}

async fn handle(State(node): State<Arc<TokenServerNode>>, body: Bytes) -> axum::response::Response {
    if body.len() > MAX_MESSAGE {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    }
    match node.answer(&body).await {
        Some(reply) => (
            [(http::header::CONTENT_TYPE, "application/octet-stream")],
            reply,
        )
            .into_response(),
        None => StatusCode::FORBIDDEN.into_response(),
    }
}

/// The `POST /v1/token` endpoint over `node`.
pub fn router(node: Arc<TokenServerNode>) -> Router {
    Router::new().route(PATH, post(handle)).with_state(node)
}

/// Serves `node` on `listener` and runs its lease rounds until `done` completes.
///
/// # Errors
/// The listener's error.
pub async fn run(
    listener: tokio::net::TcpListener,
    node: Arc<TokenServerNode>,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop, rx) = tokio::sync::watch::channel(false);
    let rounds = {
        let node = node.clone();
        let mut rx = rx.clone();
        tokio::spawn(async move {
            node.campaign(async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await;
        })
    };
    drop(rx);
    let served = axum::serve(listener, router(node))
        .with_graceful_shutdown(done)
        .await;
    let _ = stop.send(true);
    let _ = rounds.await;
    served
}

/// Binds `addr` for a token server.
///
/// # Errors
/// The bind error.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_back_into_domain_and_entries() {
        let key = crate::central::redis_key("d|x", [("user", "a=b"), ("path", "\\p")]);
        assert_eq!(
            split_key(&key),
            Some((
                "d|x".to_string(),
                vec![
                    ("user".to_string(), "a=b".to_string()),
                    ("path".to_string(), "\\p".to_string())
                ]
            ))
        );
        assert_eq!(split_key("d"), Some(("d".to_string(), vec![])));
        assert_eq!(split_key("d|k"), None);
        assert_eq!(split_key("d=x"), None);
    }
}
