//! The load generator's gRPC client: `ShouldRateLimit` as HTTP/2 POSTs (what gRPC is on the
//! wire) on its own small HTTP/2 client, each key's request encoded once.
//!
//! Why its own: tonic's client hands every call to a buffer task over a queue and encodes
//! through its codec stack, and even `h2` alone (HPACK both ways, its stream store, frames
//! moved through its queues) left `sluice bench` spending more CPU per call than h2load,
//! so its figures measured itself. Here each connection is one task ([`conn`]) that reads
//! everything the socket has, answers the calls whose streams ended, opens streams for the
//! queued calls with a header block HPACK-encoded once per connection and the call's
//! pre-encoded gRPC frame as DATA, and writes all of it in one `write`. Answers are read as
//! tonic reads them: the `grpc-status` of the trailers (or of the headers of a
//! trailers-only answer), then the protobuf `RateLimitResponse`. The frames themselves are
//! `sluice_http2`'s
//! [`frame`](sluice_http2::frame)s and [`hpack`] decoder.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use parking_lot::Mutex;
use prost::Message as _;

use super::{LoadError, Outcome};

mod conn;

use sluice_http2::hpack;

use conn::{ConnError, Driver, Shared, State};

/// The method's path.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Where gRPC calls go: `host:port` to connect to, and the header block of every call.
#[derive(Debug, Clone)]
pub(super) struct GrpcTarget {
    authority: String,
    block: Vec<u8>,
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
        let block = request_block(&authority, PATH);
        Ok(Self { authority, block })
    }

    /// Opens one HTTP/2 connection (the server's SETTINGS read); its task runs on the
    /// current runtime until every clone of the returned handle is dropped.
    pub(super) async fn connect(&self, timeout: Duration) -> Result<GrpcConn, String> {
        let connecting = async {
            let stream = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(|e| e.to_string())?;
            // Tiny requests: don't let Nagle hold them back.
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let shared = Arc::new(Mutex::new(Shared::default()));
            let mut driver = Driver::new(stream, State::new(self.block.clone()), shared);
            let handshake = async {
                driver.write_all().await?;
                while !driver.state.ready() {
                    driver.read_some().await?;
                    if let Some(e) = driver.state.failed() {
                        return Err(e.clone());
                    }
                }
                Ok::<_, ConnError>(())
            };
            handshake
                .await
                .map_err(|e| format!("no HTTP/2 connection: {e}"))?;
            let shared = Arc::clone(&driver.shared);
            tokio::spawn(driver);
            Ok::<_, String>(shared)
        };
        let shared = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| format!("no connection within {timeout:?}"))??;
        Ok(GrpcConn {
            handle: Arc::new(Handle { shared }),
        })
    }
}

/// One HTTP/2 connection (cloned, it is the same connection: calls are its streams).
#[derive(Debug, Clone)]
pub(super) struct GrpcConn {
    handle: Arc<Handle>,
}

/// The connection's calls; when the last handle goes, the connection's task closes it.
struct Handle {
    shared: Arc<Mutex<Shared>>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handle")
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let task = self.shared.lock().close();
        if let Some(t) = task {
            t.wake();
        }
    }
}

impl GrpcConn {
    /// One `ShouldRateLimit` call with `body`, a gRPC frame ([`frame`]). Dropped before its
    /// answer (a timeout), the call's stream is reset (RST_STREAM CANCEL).
    pub(super) async fn call(&mut self, body: Bytes) -> Outcome {
        Call {
            shared: &self.handle.shared,
            body: Some(body),
            slot: None,
        }
        .await
    }
}

/// A call in flight: its slot in the connection's [`Shared`].
struct Call<'a> {
    shared: &'a Mutex<Shared>,
    body: Option<Bytes>,
    slot: Option<usize>,
}

impl Future for Call<'_> {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let this = self.get_mut();
        if let Some(idx) = this.slot {
            let done = this.shared.lock().poll_done(idx, cx.waker());
            return match done {
                Some(o) => {
                    this.slot = None;
                    Poll::Ready(o)
                }
                None => Poll::Pending,
            };
        }
        let body = this.body.take().unwrap_or_default();
        let submitted = this.shared.lock().submit(body, cx.waker());
        match submitted {
            Ok((idx, task)) => {
                this.slot = Some(idx);
                if let Some(t) = task {
                    t.wake();
                }
                Poll::Pending
            }
            Err(reason) => Poll::Ready(Outcome::Error(reason)),
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let Some(idx) = self.slot {
            let task = self.shared.lock().cancel(idx);
            if let Some(t) = task {
                t.wake();
            }
        }
    }
}

/// The error a non-zero `grpc-status` says, as tonic reads it (code and decoded message).
fn status_error(code: &[u8], message: &[u8]) -> Outcome {
    let mut map = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_bytes(code) {
        map.insert("grpc-status", v);
    }
    if let Ok(v) = http::HeaderValue::from_bytes(message) {
        map.insert("grpc-message", v);
    }
    match tonic::Status::from_header_map(&map) {
        Some(s) => Outcome::Error(format!("gRPC {:?}: {}", s.code(), s.message())),
        None => Outcome::Error("gRPC answer without grpc-status".to_owned()),
    }
}

/// The outcome an answer's body (one gRPC frame) says.
fn outcome(frame: &[u8]) -> Outcome {
    let Some((&[flag, a, b, c, d], frame)) = frame.split_first_chunk::<5>() else {
        return Outcome::Error("gRPC answer without a message".to_owned());
    };
    if flag != 0 {
        return Outcome::Error("gRPC answer compressed (not asked for)".to_owned());
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
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

/// The header block of a gRPC POST to `path` at `authority` (RFC 7541): `:method POST` and
/// `:scheme http` from the static table, the rest literals without indexing (names from the
/// static table where it has them), so that the same block serves every stream.
fn request_block(authority: &str, path: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + authority.len() + path.len());
    b.push(0x80 | 3); // :method POST
    b.push(0x80 | 6); // :scheme http
    hpack::encode_literal(&mut b, 4, b"", path.as_bytes());
    hpack::encode_literal(&mut b, 1, b"", authority.as_bytes());
    hpack::encode_literal(&mut b, 31, b"", b"application/grpc");
    hpack::encode_literal(&mut b, 0, b"te", b"trailers");
    b
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_request_block_decodes_to_the_grpc_headers() {
        let long = "h".repeat(300); // a length past the 7-bit prefix
        for authority in ["127.0.0.1:8081", long.as_str()] {
            let block = request_block(authority, "/a.B/C");
            let headers = loona_hpack::Decoder::new().decode(&block).unwrap();
            let pairs: Vec<(String, String)> = headers
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            let want = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/a.B/C"),
                (":authority", authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ];
            assert_eq!(pairs.len(), want.len());
            for ((n, v), (wn, wv)) in pairs.iter().zip(want) {
                assert_eq!((n.as_str(), v.as_str()), (wn, wv));
            }
        }
    }

    #[test]
    fn addresses_are_checked() {
        assert!(GrpcTarget::parse("127.0.0.1:8081").is_ok());
        assert!(GrpcTarget::parse("http://127.0.0.1:8081").is_ok());
        assert!(GrpcTarget::parse("https://127.0.0.1:8081").is_err());
        assert!(GrpcTarget::parse("127.0.0.1").is_err());
        assert!(GrpcTarget::parse("not an address").is_err());
        let t = GrpcTarget::parse("localhost:9").unwrap();
        assert_eq!(t.authority, "localhost:9");
        assert_eq!(t.block, request_block("localhost:9", PATH));
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
            b.to_vec()
        };
        assert!(matches!(outcome(&answer(PbCode::Ok)), Outcome::Ok));
        assert!(matches!(
            outcome(&answer(PbCode::OverLimit)),
            Outcome::OverLimit
        ));
        assert!(matches!(
            outcome(&answer(PbCode::Unknown)),
            Outcome::Error(_)
        ));
        assert!(matches!(outcome(b"\0\0"), Outcome::Error(_)));
        assert!(matches!(outcome(b"\0\0\0\0\x09\x08"), Outcome::Error(_)));
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
