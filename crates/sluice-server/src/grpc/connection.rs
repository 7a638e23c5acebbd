//! One gRPC connection on `h2` directly: `ShouldRateLimit` answered inside the connection's
//! own task, everything else through tonic's routes.
//!
//! Why not hyper + tonic for every call: with one worker thread under pipelined load, a
//! profile put about a quarter of the server's CPU per call in the layers between HTTP/2 and
//! the decision — hyper's task per stream and its body, tonic's router, layers and codec
//! (an 8 KiB buffer per answer) — for a request that fits one DATA frame and an answer
//! decided without waiting. Here such a call is decoded from the frame as it arrived,
//! decided, and its answer queued on the connection, whose next flush writes it with every
//! other answer of the batch.
//!
//! The answers are tonic's, byte for byte: the same `RateLimitResponse` (the handler is
//! shared: [`RateLimitGrpc::decide_local_framed`] decides as [`RateLimitGrpc::decide_local`]
//! and encodes the bytes prost would), the headers tonic sends (`content-type:
//! application/grpc`; trailers `grpc-status: 0`), errors as tonic's trailers-only answer
//! ([`tonic::Status::into_http`]). A call that is anything but the plain case — another
//! path (health checks, unknown methods), a compressed or split or oversized message, request
//! trailers, a message that does not decode, an engine with a Redis or token-server center
//! (its calls wait, and tonic's `grpc-timeout` handling applies) — goes to tonic's routes
//! with its body replayed, and is answered by tonic exactly as before.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::BodyExt as _;
use sluice_limits::Clock;
use tokio::net::TcpStream;
use tonic::service::Routes;
use tower::ServiceExt as _;

use super::RateLimitGrpc;

/// The method answered here.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The trailer of every answer, named once (not parsed per call).
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// The request header naming its messages' compression, named once.
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// tonic's default limit on a received message (`max_decoding_message_size`): a larger one
/// goes to tonic, which refuses it with its own status.
const MAX_MESSAGE: usize = 4 << 20;

/// The HTTP/2 settings hyper gives tonic's server by default, so that clients see the same
/// connection: windows of 1 MiB, 16 KiB frames, 16 KiB of headers, at most 200 streams at
/// once, a send buffer of 400 KiB per stream, and the resets hyper tolerates.
fn builder() -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 20)
        .max_frame_size(16 << 10)
        .max_header_list_size(16 << 10)
        .max_concurrent_streams(200)
        .max_send_buffer_size(400 << 10)
        .max_local_error_reset_streams(Some(1024));
    b
}

/// Serves one connection until the peer closes it, or until `stop` completes: then a
/// GOAWAY, and the calls in flight end before this returns.
pub(super) async fn serve<C: Clock + 'static>(
    io: TcpStream,
    service: Arc<RateLimitGrpc<Arc<C>>>,
    routes: Routes,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut conn = match builder().handshake::<_, Bytes>(io).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "gRPC: HTTP/2 handshake failed");
            return;
        }
    };
    // Each turn takes every request the connection has read, then answers them: a plain
    // call whose message has arrived at once, any other as a call polled by this task
    // (`calls`). Answers queue on the connection, and the next turn's first `poll_accept`
    // writes them all with one flush. (Answering inside the accept loop would flush per
    // call: each `poll_accept` flushes what is queued.)
    let mut accepted = Vec::new();
    let mut calls = FuturesUnordered::new();
    tokio::pin!(stop);
    let mut stopping = false;
    std::future::poll_fn(|cx| {
        if !stopping && stop.as_mut().poll(cx).is_ready() {
            conn.graceful_shutdown();
            stopping = true;
        }
        loop {
            loop {
                match conn.poll_accept(cx) {
                    Poll::Ready(Some(Ok(accept))) => accepted.push(accept),
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(error = %e, "gRPC: connection ended");
                        return Poll::Ready(());
                    }
                    Poll::Ready(None) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
            let mut answered = !accepted.is_empty();
            for (request, respond) in accepted.drain(..) {
                if let Some(call) = answer_at_once(&service, &routes, request, respond, cx) {
                    calls.push(call);
                }
            }
            while let Poll::Ready(Some(())) = calls.poll_next_unpin(cx) {
                answered = true;
            }
            if !answered {
                return Poll::Pending;
            }
        }
    })
    .await;
    // The connection is gone: what is left cannot be answered, but must not be dropped
    // half-way through a center's call either.
    while calls.next().await.is_some() {}
}

/// Answers a plain call whose whole message has already arrived (the usual case: the
/// connection reads every frame it can before it hands out a request), without a future
/// of its own: a call in `FuturesUnordered` costs an allocation, a copy of its future and
/// wakers. Any other call is returned as a future that goes on from where this stopped.
fn answer_at_once<C: Clock + 'static>(
    service: &Arc<RateLimitGrpc<Arc<C>>>,
    routes: &Routes,
    request: http::Request<RecvStream>,
    respond: SendResponse<Bytes>,
    cx: &mut Context<'_>,
) -> Option<impl Future<Output = ()> + use<C>> {
    let (head, mut body) = request.into_parts();
    let plain =
        head.uri.path() == SHOULD_RATE_LIMIT && service.decides_locally() && !compressed(&head);
    let first = if plain {
        match body.poll_data(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                // Taken in at once: the window goes back to the client.
                let _ = body.flow_control().release_capacity(chunk.len());
                if body.is_end_stream() {
                    let Some(answer) = decide_plain(service, &chunk, &body) else {
                        return Some(call(
                            service,
                            routes,
                            head,
                            body,
                            respond,
                            Start::Tonic(chunk),
                        ));
                    };
                    send_answer(respond, answer);
                    return None;
                }
                Start::Read(chunk)
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!(error = %e, "gRPC: stream failed");
                return None;
            }
            // No message at all: tonic answers that.
            Poll::Ready(None) => Start::Tonic(Bytes::new()),
            Poll::Pending => Start::Read(Bytes::new()),
        }
    } else {
        Start::Tonic(Bytes::new())
    };
    Some(call(service, routes, head, body, respond, first))
}

/// Where a [`call`] starts: reading the rest of a plain call's message after what was read,
/// or handing the call to tonic with what was read.
enum Start {
    Read(Bytes),
    Tonic(Bytes),
}

/// One call that could not be answered at once: answered here when plain, else by tonic.
fn call<C: Clock + 'static>(
    service: &Arc<RateLimitGrpc<Arc<C>>>,
    routes: &Routes,
    head: http::request::Parts,
    mut body: RecvStream,
    respond: SendResponse<Bytes>,
    start: Start,
) -> impl Future<Output = ()> + use<C> {
    let (service, routes) = (Arc::clone(service), routes.clone());
    async move {
        let read = match start {
            Start::Tonic(read) => {
                return by_tonic(routes, head, Replay::new(read, body), respond).await;
            }
            Start::Read(read) => read,
        };
        let Ok(message) = read_message(&mut body, read).await else {
            return;
        };
        match decide_plain(&service, &message, &body) {
            Some(answer) => send_answer(respond, answer),
            None => by_tonic(routes, head, Replay::new(message, body), respond).await,
        }
    }
}

/// The framed answer to `message` when it is one plain gRPC message ([`plain_message`])
/// that decodes; `None`: tonic answers it.
fn decide_plain<C: Clock + 'static>(
    service: &RateLimitGrpc<Arc<C>>,
    message: &Bytes,
    body: &RecvStream,
) -> Option<Result<Vec<u8>, tonic::Status>> {
    service.decide_message_framed(&plain_message(message, body)?)
}

/// Whether the request says its messages are compressed: tonic decides what that means.
fn compressed(head: &http::request::Parts) -> bool {
    head.headers
        .get(GRPC_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity")
}

/// The request's body up to its end, after `read` (what was read already), or up to just
/// over [`MAX_MESSAGE`] (then tonic reads the rest). `Err` when the stream failed: nothing
/// can be answered on it.
async fn read_message(body: &mut RecvStream, read: Bytes) -> Result<Bytes, ()> {
    let mut first = read;
    let mut more = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| tracing::debug!(error = %e, "gRPC: stream failed"))?;
        // Taken in at once: the window goes back to the client.
        let _ = body.flow_control().release_capacity(chunk.len());
        if first.is_empty() && more.is_empty() {
            first = chunk;
        } else {
            if more.is_empty() {
                more.extend_from_slice(&first);
            }
            more.extend_from_slice(&chunk);
        }
        if first.len().max(more.len()) > MAX_MESSAGE + 5 {
            break;
        }
    }
    Ok(if more.is_empty() {
        first
    } else {
        more.freeze()
    })
}

/// The protobuf of `body` when it is exactly one uncompressed gRPC message within
/// [`MAX_MESSAGE`] and the stream ended without trailers; `None` otherwise.
fn plain_message(body: &Bytes, stream: &RecvStream) -> Option<Bytes> {
    if !stream.is_end_stream() || body.len() < 5 || body[0] != 0 {
        return None;
    }
    let len = usize::try_from(u32::from_be_bytes([body[1], body[2], body[3], body[4]])).ok()?;
    (len <= MAX_MESSAGE && body.len() == 5 + len).then(|| body.slice(5..))
}

/// Sends an answer as tonic would: the message's frame and `grpc-status: 0`, or an error
/// status alone (trailers-only).
fn send_answer(mut respond: SendResponse<Bytes>, answer: Result<Vec<u8>, tonic::Status>) {
    let frame = match answer {
        Ok(f) => f,
        Err(status) => {
            let (head, ()) = status.into_http::<()>().into_parts();
            let _ = respond.send_response(http::Response::from_parts(head, ()), true);
            return;
        }
    };
    let mut head = http::Response::new(());
    head.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
    // The frame is of its exact size: `Bytes` takes it over without copying.
    if send.send_data(Bytes::from(frame), false).is_ok() {
        let _ = send.send_trailers(trailers);
    }
}

/// Hands the call to tonic's routes (the body replayed from what was read) and sends
/// tonic's answer, flow-controlled.
async fn by_tonic(
    routes: Routes,
    head: http::request::Parts,
    body: Replay,
    mut respond: SendResponse<Bytes>,
) {
    let request = http::Request::from_parts(head, tonic::body::Body::new(body));
    let Ok(response) = routes.oneshot(request).await;
    let (head, mut body) = response.into_parts();
    let end = hyper::body::Body::is_end_stream(&body);
    let Ok(mut send) = respond.send_response(http::Response::from_parts(head, ()), end) else {
        return;
    };
    if end {
        return;
    }
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            send.send_reset(h2::Reason::INTERNAL_ERROR);
            return;
        };
        match frame.into_data() {
            Ok(mut data) => {
                // Within the client's window: wait for capacity rather than buffer past it.
                while data.has_remaining() {
                    send.reserve_capacity(data.remaining());
                    let Some(Ok(n)) = std::future::poll_fn(|cx| send.poll_capacity(cx)).await
                    else {
                        return;
                    };
                    let n = n.min(data.remaining());
                    if send.send_data(data.split_to(n), false).is_err() {
                        return;
                    }
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = send.send_trailers(trailers);
                }
                return;
            }
        }
    }
    let _ = send.send_data(Bytes::new(), true);
}

/// A request body: what was already read, then the rest of the stream and its trailers.
struct Replay {
    read: Option<Bytes>,
    rest: RecvStream,
    data_done: bool,
}

impl Replay {
    fn new(read: Bytes, rest: RecvStream) -> Self {
        Self {
            read: (!read.is_empty()).then_some(read),
            rest,
            data_done: false,
        }
    }
}

impl hyper::body::Body for Replay {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, h2::Error>>> {
        if let Some(read) = self.read.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(read))));
        }
        if !self.data_done {
            match self.rest.poll_data(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    let _ = self.rest.flow_control().release_capacity(chunk.len());
                    return Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => self.data_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match self.rest.poll_trailers(cx) {
            Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(hyper::body::Frame::trailers(t)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.rest.is_end_stream()
    }
}
