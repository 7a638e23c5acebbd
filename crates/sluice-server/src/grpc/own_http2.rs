//! One gRPC connection on Sluice's own HTTP/2 ([`sluice_http2::server::Connection`], a
//! state machine without I/O): the same answers as [`super::connection`] (h2), with less
//! of the server's CPU per call.
//!
//! Why its own: with h2, a profile of the daemon under pipelined load put about 12 % of the
//! samples in Sluice's code and 13 % in copies of h2's frames alone, and a floor that only
//! frames the same answers used a fifth of the CPU per call (docs/BENCHMARKS.md, "The floor
//! under HTTP/2"). Here the connection's task reads everything the socket has into one
//! buffer, takes the requests out of it where they lie, writes each answer's frames straight
//! into one output buffer, and writes that once per turn.
//!
//! A plain call (see [`super::connection`]) whose message follows its headers is decided as
//! soon as its last DATA frame is read. Any other call is handed to tonic's routes with its
//! headers and its body (buffered: every method served takes one message), and tonic's
//! answer is sent back through the send windows: health checks, compressed or malformed
//! messages, calls with trailers, and every call of an engine with a Redis or token-server
//! center.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::BodyExt as _;
use sluice_http2::frame::code;
use sluice_http2::hpack;
use sluice_http2::server::{Connection, Event, OwnedRequestHead, RequestHead, Settings};
use sluice_limits::Clock;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tonic::service::Routes;
use tower::ServiceExt as _;

use super::RateLimitGrpc;

/// The method answered here.
const SHOULD_RATE_LIMIT: &[u8] = b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// tonic's default limit on a received message: a larger one goes to tonic, which refuses
/// it with its own status.
const MAX_MESSAGE: usize = 4 << 20;

/// Output not yet written beyond which the connection reads no more requests: a peer that
/// sends but does not read cannot grow it without bound.
const MAX_UNWRITTEN: usize = 1 << 20;

/// Input read in one turn at most, so that answers go out while a peer keeps sending.
const MAX_READ: usize = 256 << 10;

/// Turns in one wakeup at most (each reads up to [`MAX_READ`]).
const MAX_TURNS: usize = 16;

/// A tonic answer's body is polled again only while less than this waits for window.
const MAX_QUEUED: usize = 64 << 10;

/// Request bodies buffered for tonic on one connection at most: past it the stream that
/// would exceed it is refused.
const MAX_BUFFERED: usize = 2 * (MAX_MESSAGE + 5);

/// `:status 200`, `content-type: application/grpc`: the headers of every answer here.
static ANSWER_HEAD: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let mut b = vec![0x88];
    hpack::encode_literal(&mut b, 31, b"", b"application/grpc");
    b
});

/// `grpc-status: 0`: the trailers of every answer here.
static ANSWER_TRAILERS: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let mut b = Vec::new();
    hpack::encode_literal(&mut b, 0, b"grpc-status", b"0");
    b
});

/// Serves one connection until the peer closes it, or until `stop` completes: then a
/// GOAWAY, and the calls in flight end before this returns.
pub(super) async fn serve<C: Clock + 'static>(
    io: TcpStream,
    service: Arc<RateLimitGrpc<Arc<C>>>,
    routes: Routes,
    stop: impl Future<Output = ()>,
) {
    let mut shell = Shell {
        conn: Connection::new(Settings::default()),
        input: BytesMut::with_capacity(64 << 10),
        unwritten: Vec::with_capacity(16 << 10),
        written: 0,
        calls: Map::default(),
        buffered: 0,
        service,
        routes,
        tonic: FuturesUnordered::new(),
        bodies: FuturesUnordered::new(),
        parked: Vec::new(),
        deferred: None,
        eof: false,
    };
    tokio::pin!(stop);
    let mut stopping = false;
    std::future::poll_fn(|cx| {
        if !stopping && stop.as_mut().poll(cx).is_ready() {
            shell.conn.go_away();
            stopping = true;
        }
        shell.poll(cx, &io)
    })
    .await;
    // The connection is gone: what is left cannot be answered, but a center's call must not
    // be dropped half-way.
    while shell.tonic.next().await.is_some() {}
}

type Map<V> = std::collections::HashMap<u32, V, foldhash::fast::RandomState>;

/// A call not answered at once: its request is being read.
#[derive(Debug)]
struct Pending {
    head: OwnedRequestHead,
    body: BytesMut,
    /// The plain call's path: decided here if its message turns out plain.
    plain: bool,
    /// Counted in [`Shell::buffered`].
    counted: usize,
}

#[derive(Debug)]
enum Call {
    Reading(Box<Pending>),
    /// With tonic; dropping `_cancel` ends its answer early (the stream was reset).
    Tonic {
        _cancel: oneshot::Sender<()>,
    },
}

/// tonic's answer to a stream's call (`None`: the stream was reset meanwhile).
type Answer = (
    u32,
    Option<(http::Response<tonic::body::Body>, oneshot::Receiver<()>)>,
);
type TonicCall = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// The next frame of an answer's body (`None` for the frame: the body ended; `None` for
/// all: the stream was reset meanwhile).
type BodyStep = (
    u32,
    Option<(
        tonic::body::Body,
        oneshot::Receiver<()>,
        Option<Result<hyper::body::Frame<Bytes>, tonic::Status>>,
    )>,
);
type BodyNext = Pin<Box<dyn Future<Output = BodyStep> + Send>>;

struct Shell<C: Clock + 'static> {
    conn: Connection,
    input: BytesMut,
    /// What the last turn's output still has unwritten (from `written`).
    unwritten: Vec<u8>,
    written: usize,
    calls: Map<Call>,
    buffered: usize,
    service: Arc<RateLimitGrpc<Arc<C>>>,
    routes: Routes,
    tonic: FuturesUnordered<TonicCall>,
    bodies: FuturesUnordered<BodyNext>,
    /// An event read while a stream's headers were at hand, handled next.
    deferred: Option<Event>,
    /// Answers' bodies waiting for window before they are polled again.
    parked: Vec<(u32, tonic::body::Body, oneshot::Receiver<()>)>,
    eof: bool,
}

impl<C: Clock + 'static> Shell<C> {
    /// One turn after another until nothing moves: read, handle what was read, take in
    /// tonic's answers, write. `Ready` when the connection is over.
    fn poll(&mut self, cx: &mut Context<'_>, io: &TcpStream) -> Poll<()> {
        for _ in 0..MAX_TURNS {
            let mut moved = false;
            if !self.eof && self.unwritten_len() < MAX_UNWRITTEN {
                match self.read(cx, io) {
                    Ok(n) => moved |= n > 0,
                    Err(e) => {
                        tracing::debug!(error = %e, "gRPC: connection lost");
                        return Poll::Ready(());
                    }
                }
            }
            loop {
                if let Some(event) = self.deferred.take() {
                    self.on_event(event);
                    continue;
                }
                match self.conn.poll_event(&mut self.input) {
                    Ok(Some(event)) => {
                        moved = true;
                        self.on_event(event);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "gRPC: connection ended");
                        // Its GOAWAY goes out if the socket takes it at once.
                        let _ = self.write(cx, io);
                        return Poll::Ready(());
                    }
                }
            }
            while let Poll::Ready(Some((stream, answer))) = self.tonic.poll_next_unpin(cx) {
                moved = true;
                if let Some((response, cancel)) = answer {
                    self.start_answer(stream, response, cancel);
                }
            }
            while let Poll::Ready(Some((stream, step))) = self.bodies.poll_next_unpin(cx) {
                moved = true;
                if let Some((body, cancel, frame)) = step {
                    self.answer_frame(stream, body, cancel, frame);
                }
            }
            if !self.parked.is_empty() {
                let conn = &self.conn;
                let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.parked)
                    .into_iter()
                    .partition(|(stream, ..)| conn.queued(*stream) < MAX_QUEUED);
                self.parked = waiting;
                for (stream, body, cancel) in ready {
                    moved = true;
                    self.bodies.push(next_frame(stream, body, cancel));
                }
            }
            match self.write(cx, io) {
                Ok(n) => moved |= n > 0,
                Err(e) => {
                    tracing::debug!(error = %e, "gRPC: connection lost");
                    return Poll::Ready(());
                }
            }
            let flushed = self.unwritten_len() == 0;
            if flushed && (self.conn.is_done() || self.eof) {
                return Poll::Ready(());
            }
            if !moved {
                return Poll::Pending;
            }
        }
        // A peer that keeps sending would keep this task here: the worker's other
        // connections get their turn first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn unwritten_len(&mut self) -> usize {
        self.unwritten.len() - self.written + self.conn.output().len()
    }

    /// Reads what the socket has, up to [`MAX_READ`].
    fn read(&mut self, cx: &mut Context<'_>, io: &TcpStream) -> std::io::Result<usize> {
        let mut total = 0;
        while total < MAX_READ {
            if io.poll_read_ready(cx).is_pending() {
                break;
            }
            self.input.reserve(32 << 10);
            match io.try_read_buf(&mut self.input) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => total += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// Writes what the connection has queued, as far as the socket takes it.
    fn write(&mut self, cx: &mut Context<'_>, io: &TcpStream) -> std::io::Result<usize> {
        let mut total = 0;
        loop {
            if self.written == self.unwritten.len() {
                self.unwritten.clear();
                self.written = 0;
                if self.conn.output().is_empty() {
                    return Ok(total);
                }
                std::mem::swap(&mut self.unwritten, self.conn.output());
            }
            if io.poll_write_ready(cx).is_pending() {
                return Ok(total);
            }
            match io.try_write(&self.unwritten[self.written..]) {
                Ok(n) => {
                    self.written += n;
                    total += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Request { stream, end_stream } => self.on_request(stream, end_stream),
            Event::Data {
                stream,
                data,
                end_stream,
            } => self.on_data(stream, data, end_stream),
            Event::Trailers { stream } => {
                let trailers = header_map(self.conn.request());
                match self.calls.remove(&stream) {
                    Some(Call::Reading(p)) => match trailers {
                        Some(t) => self.hand_to_tonic(stream, *p, Some(t), true),
                        None => {
                            self.release(&p);
                            self.conn.reset_stream(stream, code::PROTOCOL_ERROR);
                        }
                    },
                    Some(tonic @ Call::Tonic { .. }) => {
                        self.calls.insert(stream, tonic);
                    }
                    None => {}
                }
            }
            Event::Reset { stream, .. } => {
                if let Some(Call::Reading(p)) = self.calls.remove(&stream) {
                    self.release(&p);
                }
            }
        }
    }

    fn on_request(&mut self, stream: u32, end_stream: bool) {
        let head = self.conn.request();
        let plain = head.path() == SHOULD_RATE_LIMIT
            && self.service.decides_locally()
            && head.get(b"grpc-encoding").is_none_or(|v| v == b"identity");
        let mut next = None;
        if plain && !end_stream {
            // Usually the message is the next frame, read already: decided while the
            // headers are at hand, without keeping them.
            match self.conn.poll_event(&mut self.input) {
                Ok(Some(Event::Data {
                    stream: s,
                    data,
                    end_stream: true,
                })) if s == stream => {
                    if let Some(answer) = decide_plain(&self.service, &data) {
                        self.answer(stream, answer);
                        return;
                    }
                    // Not plain after all: tonic answers it, headers and all.
                    let pending = Pending {
                        head: self.conn.request().to_owned_head(),
                        body: BytesMut::from(&data[..]),
                        plain: false,
                        counted: 0,
                    };
                    self.hand_to_tonic(stream, pending, None, true);
                    return;
                }
                // Anything else is handled next, once this stream's headers are kept. (A
                // connection error has ended the connection: the turn sees it done.)
                Ok(other) => next = other,
                Err(e) => tracing::debug!(error = %e, "gRPC: connection ended"),
            }
        }
        let pending = Pending {
            head: self.conn.request().to_owned_head(),
            body: BytesMut::new(),
            plain,
            counted: 0,
        };
        if end_stream {
            self.hand_to_tonic(stream, pending, None, true);
        } else {
            self.calls.insert(stream, Call::Reading(Box::new(pending)));
        }
        self.deferred = next;
    }

    fn on_data(&mut self, stream: u32, data: Bytes, end_stream: bool) {
        let Some(Call::Reading(p)) = self.calls.get_mut(&stream) else {
            // With tonic already (its message was whole, or too large): the rest is dropped.
            return;
        };
        if self.buffered + data.len() > MAX_BUFFERED {
            if let Some(Call::Reading(p)) = self.calls.remove(&stream) {
                self.release(&p);
            }
            self.conn.reset_stream(stream, code::REFUSED_STREAM);
            return;
        }
        p.body.extend_from_slice(&data);
        p.counted += data.len();
        self.buffered += data.len();
        let oversized = p.body.len() > MAX_MESSAGE + 5;
        if !end_stream && !oversized {
            return;
        }
        let Some(Call::Reading(p)) = self.calls.remove(&stream) else {
            return;
        };
        if end_stream
            && p.plain
            && let Some(answer) = decide_plain(&self.service, &p.body)
        {
            self.release(&p);
            self.answer(stream, answer);
            return;
        }
        self.hand_to_tonic(stream, *p, None, end_stream);
    }

    /// Forgets a buffered body's bytes.
    fn release(&mut self, p: &Pending) {
        self.buffered -= p.counted;
    }

    /// Hands a call to tonic's routes: its headers, its body as read, then its trailers, or
    /// (`ended` false: the message is too large, and tonic refuses it from its prefix) no
    /// end at all.
    fn hand_to_tonic(&mut self, stream: u32, p: Pending, trailers: Option<HeaderMap>, ended: bool) {
        self.release(&p);
        let Some(head) = request_parts(p.head.head()) else {
            self.calls.remove(&stream);
            self.conn.reset_stream(stream, code::PROTOCOL_ERROR);
            return;
        };
        let body = Buffered {
            data: (!p.body.is_empty()).then(|| p.body.freeze()),
            trailers,
            ended,
        };
        let request = http::Request::from_parts(head, tonic::body::Body::new(body));
        let (cancel, cancelled) = oneshot::channel();
        self.calls.insert(stream, Call::Tonic { _cancel: cancel });
        let routes = self.routes.clone();
        self.tonic.push(Box::pin(async move {
            let mut cancelled = cancelled;
            let Ok(response) = routes.oneshot(request).await;
            // A stream reset meanwhile drops the answer.
            if cancelled.try_recv() == Err(oneshot::error::TryRecvError::Closed) {
                return (stream, None);
            }
            (stream, Some((response, cancelled)))
        }));
    }

    /// Sends a plain call's answer as tonic would: the message's frame and `grpc-status:
    /// 0`, or an error status alone (trailers-only).
    fn answer(&mut self, stream: u32, answer: Result<Vec<u8>, tonic::Status>) {
        match answer {
            Ok(frame) => {
                self.conn.send_headers(stream, &ANSWER_HEAD, false);
                self.conn.send_data(stream, &frame, false);
                self.conn.send_trailers(stream, &ANSWER_TRAILERS);
            }
            Err(status) => {
                let (head, ()) = status.into_http::<()>().into_parts();
                let block = encode_head(head.status, &head.headers);
                self.conn.send_headers(stream, &block, true);
            }
        }
    }

    /// Sends tonic's answer's headers, and starts on its body.
    fn start_answer(
        &mut self,
        stream: u32,
        response: http::Response<tonic::body::Body>,
        cancel: oneshot::Receiver<()>,
    ) {
        let (head, body) = response.into_parts();
        let end = hyper::body::Body::is_end_stream(&body);
        let block = encode_head(head.status, &head.headers);
        self.conn.send_headers(stream, &block, end);
        if end {
            self.calls.remove(&stream);
        } else {
            self.bodies.push(next_frame(stream, body, cancel));
        }
    }

    /// Sends one frame of tonic's answer's body, and asks for the next unless the body
    /// ended or must wait for window.
    fn answer_frame(
        &mut self,
        stream: u32,
        body: tonic::body::Body,
        cancel: oneshot::Receiver<()>,
        frame: Option<Result<hyper::body::Frame<Bytes>, tonic::Status>>,
    ) {
        match frame {
            None => {
                self.conn.send_data(stream, &[], true);
                self.calls.remove(&stream);
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "gRPC: an answer's body failed");
                self.conn.reset_stream(stream, code::INTERNAL_ERROR);
                self.calls.remove(&stream);
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    self.conn.send_data(stream, &data, false);
                    if self.conn.queued(stream) < MAX_QUEUED {
                        self.bodies.push(next_frame(stream, body, cancel));
                    } else {
                        self.parked.push((stream, body, cancel));
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let block = encode_fields(&trailers, Vec::new());
                        self.conn.send_trailers(stream, &block);
                    }
                    self.calls.remove(&stream);
                }
            },
        }
    }
}

/// The next frame of `body`, unless the stream is reset first.
fn next_frame(
    stream: u32,
    mut body: tonic::body::Body,
    mut cancel: oneshot::Receiver<()>,
) -> BodyNext {
    Box::pin(async move {
        tokio::select! {
            frame = body.frame() => (stream, Some((body, cancel, frame))),
            _ = &mut cancel => (stream, None),
        }
    })
}

/// The framed answer to `message` when it is one uncompressed gRPC message within
/// [`MAX_MESSAGE`] that decodes; `None`: tonic answers it.
fn decide_plain<C: Clock + 'static>(
    service: &RateLimitGrpc<Arc<C>>,
    message: &[u8],
) -> Option<Result<Vec<u8>, tonic::Status>> {
    let (&[0, a, b, c, d], m) = message.split_first_chunk::<5>()? else {
        return None;
    };
    let len = usize::try_from(u32::from_be_bytes([a, b, c, d])).ok()?;
    if len > MAX_MESSAGE || m.len() != len {
        return None;
    }
    service.decide_message_framed(m)
}

/// The request's head as tonic's routes take it; `None` if a field is not a valid HTTP
/// field (h2 refuses those too).
fn request_parts(head: RequestHead<'_>) -> Option<http::request::Parts> {
    let mut uri = http::Uri::builder()
        .scheme(head.scheme())
        .path_and_query(head.path());
    if let Some(authority) = head.authority() {
        uri = uri.authority(authority);
    }
    let request = http::Request::builder()
        .method(head.method())
        .uri(uri.build().ok()?)
        .version(http::Version::HTTP_2)
        .body(())
        .ok()?;
    let (mut parts, ()) = request.into_parts();
    parts.headers = header_map(head)?;
    Some(parts)
}

/// The regular fields of `head` as a header map; `None` if one is not a valid HTTP field.
fn header_map(head: RequestHead<'_>) -> Option<HeaderMap> {
    let mut map = HeaderMap::new();
    for (name, value) in head.fields() {
        map.append(
            HeaderName::from_bytes(name).ok()?,
            HeaderValue::from_bytes(value).ok()?,
        );
    }
    Some(map)
}

/// A response's header block: `:status`, then its fields.
fn encode_head(status: http::StatusCode, headers: &HeaderMap) -> Vec<u8> {
    let mut block = Vec::with_capacity(64);
    if status == http::StatusCode::OK {
        block.push(0x88);
    } else {
        hpack::encode_literal(&mut block, 8, b"", status.as_str().as_bytes());
    }
    encode_fields(headers, block)
}

/// Appends `fields` to a header block, literals without indexing.
fn encode_fields(fields: &HeaderMap, mut block: Vec<u8>) -> Vec<u8> {
    for (name, value) in fields {
        hpack::encode_literal(&mut block, 0, name.as_str().as_bytes(), value.as_bytes());
    }
    block
}

/// A request body for tonic: what was read, then its trailers and end (or no end).
#[derive(Debug)]
struct Buffered {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    ended: bool,
}

impl hyper::body::Body for Buffered {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(data))));
        }
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::trailers(trailers))));
        }
        if self.ended {
            Poll::Ready(None)
        } else {
            // The rest of a message too large for tonic never comes: tonic has refused it.
            Poll::Pending
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.data.is_none() && self.trailers.is_none()
    }
}
