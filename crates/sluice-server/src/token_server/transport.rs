//! Sealed calls to token servers over keep-alive HTTP/1.1 connections.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_limits::Nanos;

use super::replay::Sequence;
use super::{Envelope, Message, PATH, Reply, ServerAddr};
use crate::peer::{PeerKey, open, seal};

/// The process's sequence numbers: one counter for every message it sends (its client's
/// and its server's share a sender id), so no number is used twice.
static SEQUENCE: Sequence = Sequence::new();

/// Why a call did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No answer within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Connecting, sending or reading failed.
    #[error("{0}")]
    Io(String),
    /// The answer was not a sealed reply from that server.
    #[error("bad answer: {0}")]
    Bad(String),
}

/// Keep-alive connections to the token servers, one pool per server.
#[derive(Debug)]
pub(super) struct Pool {
    conns: Vec<parking_lot::Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl Pool {
    pub(super) fn new(n: usize) -> Self {
        Self {
            conns: (0..n)
                .map(|_| parking_lot::Mutex::new(Vec::new()))
                .collect(),
        }
    }

    async fn connect(authority: &str) -> Result<SendRequest<Full<Bytes>>, CallError> {
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| CallError::Io(format!("connect {authority}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| CallError::Io(e.to_string()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// One sealed message to `server` (index `i`) and its sealed answer.
    async fn call(
        &self,
        i: usize,
        server: &ServerAddr,
        key: &PeerKey,
        me: u32,
        message: &Message,
    ) -> Result<Reply, CallError> {
        let seq = SEQUENCE.next(wall_now());
        let envelope = Envelope { seq, body: message };
        let payload = serde_json::to_vec(&envelope).map_err(|e| CallError::Bad(e.to_string()))?;
        let body = seal(key, me, server.id, &payload).map_err(|e| CallError::Bad(e.to_string()))?;
        let pooled = self.conns.get(i).and_then(|m| m.lock().pop());
        let mut sender = match pooled {
            Some(s) => s,
            None => Self::connect(&server.authority).await?,
        };
        sender
            .ready()
            .await
            .map_err(|e| CallError::Io(e.to_string()))?;
        let request = http::Request::post(PATH)
            .header(http::header::HOST, server.authority.as_str())
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CallError::Bad(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| CallError::Io(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| CallError::Io(e.to_string()))?
            .to_bytes();
        // Only a connection whose answer was read whole can carry the next call.
        if let Some(m) = self.conns.get(i) {
            m.lock().push(sender);
        }
        if status != http::StatusCode::OK {
            return Err(CallError::Bad(format!("HTTP {status}")));
        }
        let (from, payload) = open(key, me, &bytes).map_err(|e| CallError::Bad(e.to_string()))?;
        if from != server.id {
            return Err(CallError::Bad(format!(
                "answered by {from}, not {}",
                server.id
            )));
        }
        let answer: Envelope<Reply> =
            serde_json::from_slice(payload).map_err(|e| CallError::Bad(e.to_string()))?;
        // An answer is for one request: an old one replayed cannot pass for this one's.
        if answer.seq != seq {
            return Err(CallError::Bad(format!(
                "answer to message {}, not {seq}",
                answer.seq
            )));
        }
        Ok(answer.body)
    }

    /// [`Pool::call`] within `timeout`.
    pub(super) async fn call_within(
        &self,
        timeout: Duration,
        i: usize,
        server: &ServerAddr,
        key: &PeerKey,
        me: u32,
        message: &Message,
    ) -> Result<Reply, CallError> {
        tokio::time::timeout(timeout, self.call(i, server, key, me, message))
            .await
            .unwrap_or(Err(CallError::Timeout(timeout)))
    }
}

/// The wall clock, ns since the unix epoch.
pub(super) fn wall_now() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, sluice_limits::clock::nanos)
}
