//! The load generator's gRPC client: `ShouldRateLimit` as HTTP/2 POSTs straight on `h2`
//! (what gRPC is on the wire), each key's request encoded once.
//!
//! Why not tonic's client: its channel hands every call to a buffer task over a queue, and
//! encodes and decodes through its codec stack; `sluice bench` spent more CPU per call than
//! the server it measured (three times h2load's), so its figures measured itself. The
//! answers are read the same way: the `grpc-status` of the trailers (or of the headers of
//! a trailers-only answer) as tonic parses it, then the protobuf `RateLimitResponse`.

use std::time::Duration;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message as _;

use super::{LoadError, Outcome, error_chain};

/// The method's path.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Flow-control windows: far above what 64 small calls in flight need, so that the window
/// updates stay rare.
const WINDOW: u32 = 4 << 20;

/// Where gRPC calls go: `host:port` to connect to, and the request every call clones.
#[derive(Debug, Clone)]
pub(super) struct GrpcTarget {
    authority: String,
    request: http::Request<()>,
}

impl GrpcTarget {
    /// `host:port` or `http://host:port` (no TLS).
    pub(super) fn parse(address: &str) -> Result<Self, LoadError> {
        let bad = |reason: String| LoadError::BadAddress {
            address: address.to_owned(),
            reason,
        };
        let uri = if address.contains("://") {
            if !address.starts_with("http://") {
                return Err(bad(
                    "only http:// (plaintext HTTP/2) is supported, as `sluice serve` speaks"
                        .to_owned(),
                ));
            }
            address.to_owned()
        } else {
            format!("http://{address}")
        };
        let parsed: http::Uri = uri.parse().map_err(|e| bad(format!("{e}")))?;
        let Some(authority) = parsed.authority() else {
            return Err(bad("no host".to_owned()));
        };
        if authority.port_u16().is_none() {
            return Err(bad("a port is needed (host:port)".to_owned()));
        }
        let authority = authority.as_str().to_owned();
        let request = http::Request::post(format!("http://{authority}{PATH}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(())
            .map_err(|e| bad(format!("{e}")))?;
        Ok(Self { authority, request })
    }

    /// Opens one HTTP/2 connection; its driver runs as a task of the current runtime.
    pub(super) async fn connect(&self, timeout: Duration) -> Result<GrpcConn, String> {
        let connecting = async {
            let stream = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(|e| e.to_string())?;
            // Tiny requests: don't let Nagle hold them back.
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let (send, connection) = h2::client::Builder::new()
                .initial_window_size(WINDOW)
                .initial_connection_window_size(WINDOW)
                .handshake::<_, Bytes>(stream)
                .await
                .map_err(|e| error_chain(&e))?;
            // Drives the connection; ends when every sender is dropped or the peer closes.
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok::<_, String>(send)
        };
        let send = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| format!("no connection within {timeout:?}"))??;
        Ok(GrpcConn {
            send,
            request: self.request.clone(),
        })
    }
}

/// One HTTP/2 connection (cloned, it is the same connection: calls are its streams).
#[derive(Debug, Clone)]
pub(super) struct GrpcConn {
    send: h2::client::SendRequest<Bytes>,
    request: http::Request<()>,
}

impl GrpcConn {
    /// One `ShouldRateLimit` call with `body`, a gRPC frame ([`frame`]).
    pub(super) async fn call(&mut self, body: Bytes) -> Outcome {
        match self.exchange(body).await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Error(e),
        }
    }

    async fn exchange(&mut self, body: Bytes) -> Result<Outcome, String> {
        std::future::poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(|e| error_chain(&e))?;
        let (response, mut stream) = self
            .send
            .send_request(self.request.clone(), false)
            .map_err(|e| error_chain(&e))?;
        stream.send_data(body, true).map_err(|e| error_chain(&e))?;
        let (head, mut body) = response.await.map_err(|e| error_chain(&e))?.into_parts();
        if head.status != http::StatusCode::OK {
            return Ok(Outcome::Error(format!("HTTP {}", head.status)));
        }
        let mut message = Bytes::new();
        let mut more = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| error_chain(&e))?;
            // Consumed at once: give the window back.
            let _ = body.flow_control().release_capacity(chunk.len());
            if message.is_empty() && more.is_empty() {
                message = chunk;
            } else {
                if more.is_empty() {
                    more.extend_from_slice(&message);
                }
                more.extend_from_slice(&chunk);
            }
        }
        if !more.is_empty() {
            message = more.freeze();
        }
        let trailers = body.trailers().await.map_err(|e| error_chain(&e))?;
        // A trailers-only answer (an error) carries its status in the headers.
        let status = tonic::Status::from_header_map(trailers.as_ref().unwrap_or(&head.headers));
        match status {
            Some(s) if s.code() == tonic::Code::Ok => {}
            Some(s) => {
                return Ok(Outcome::Error(format!(
                    "gRPC {:?}: {}",
                    s.code(),
                    s.message()
                )));
            }
            None => return Ok(Outcome::Error("gRPC answer without grpc-status".to_owned())),
        }
        Ok(outcome(message))
    }
}

/// The outcome an answer's body (one gRPC frame) says.
fn outcome(mut frame: Bytes) -> Outcome {
    if frame.len() < 5 {
        return Outcome::Error("gRPC answer without a message".to_owned());
    }
    if frame.get_u8() != 0 {
        return Outcome::Error("gRPC answer compressed (not asked for)".to_owned());
    }
    let len = frame.get_u32() as usize;
    if frame.len() != len {
        return Outcome::Error(format!(
            "gRPC answer of {} bytes, its frame says {len}",
            frame.len()
        ));
    }
    match RateLimitResponse::decode(frame) {
        Ok(r) => match PbCode::try_from(r.overall_code) {
            Ok(PbCode::Ok) => Outcome::Ok,
            Ok(PbCode::OverLimit) => Outcome::OverLimit,
            _ => Outcome::Error(format!(
                "response code {} (neither OK nor OVER_LIMIT)",
                r.overall_code
            )),
        },
        Err(e) => Outcome::Error(format!("undecodable RateLimitResponse: {e}")),
    }
}

/// `request` as a gRPC frame: not compressed, its length (4 bytes, big-endian), the
/// protobuf.
pub(super) fn frame(request: &RateLimitRequest) -> Bytes {
    let len = request.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    // A request is a domain and a few descriptors: far below 4 GiB.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // The buffer has room for the whole message, so encoding cannot fail.
    let _ = request.encode(&mut buf);
    buf.freeze()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn addresses_are_checked() {
        assert!(GrpcTarget::parse("127.0.0.1:8081").is_ok());
        assert!(GrpcTarget::parse("http://127.0.0.1:8081").is_ok());
        assert!(GrpcTarget::parse("https://127.0.0.1:8081").is_err());
        assert!(GrpcTarget::parse("127.0.0.1").is_err());
        assert!(GrpcTarget::parse("not an address").is_err());
        let t = GrpcTarget::parse("localhost:9").unwrap();
        assert_eq!(t.authority, "localhost:9");
        assert_eq!(t.request.uri().path(), PATH);
    }

    #[test]
    fn answers_are_read_from_their_frame() {
        let answer = |code: PbCode| {
            let r = RateLimitResponse {
                overall_code: code.into(),
                ..Default::default()
            };
            let mut b = BytesMut::new();
            b.put_u8(0);
            b.put_u32(u32::try_from(r.encoded_len()).unwrap());
            r.encode(&mut b).unwrap();
            b.freeze()
        };
        assert!(matches!(outcome(answer(PbCode::Ok)), Outcome::Ok));
        assert!(matches!(
            outcome(answer(PbCode::OverLimit)),
            Outcome::OverLimit
        ));
        assert!(matches!(
            outcome(answer(PbCode::Unknown)),
            Outcome::Error(_)
        ));
        assert!(matches!(
            outcome(Bytes::from_static(b"\0\0")),
            Outcome::Error(_)
        ));
        assert!(matches!(
            outcome(Bytes::from_static(b"\0\0\0\0\x09\x08")),
            Outcome::Error(_)
        ));
        // The request frame says its own length.
        let f = frame(&RateLimitRequest {
            domain: "d".into(),
            ..Default::default()
        });
        assert_eq!(&f[..5], &[0, 0, 0, 0, 3]);
        assert_eq!(
            RateLimitRequest::decode(&f[5..]).unwrap().domain,
            "d".to_owned()
        );
    }
}
