//! One HTTP/2 connection of `sluice bench`'s gRPC client.
//!
//! The workers' calls meet the connection in [`Shared`] (behind a mutex): a call takes a
//! slot, queues it and wakes the connection's task; the task ([`Driver`]) owns the socket
//! and the protocol state ([`State`]). Each time it is woken it reads everything the
//! socket has, answers the calls whose streams ended, opens streams for the queued calls
//! (the header block encoded once per connection, the body the call's pre-encoded gRPC
//! frame), resets the streams of calls given up (timeouts: RST_STREAM CANCEL), and writes
//! everything that is ready in one `write`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::net::TcpStream;

use crate::Outcome;
use sluice_http2::frame::{self as wire, Frame, WireError, code, setting};
use sluice_http2::hpack;

/// What the client advertises: the stream receive window (given back as answers arrive)
/// and the connection's (given back once half of it is used).
pub(super) const STREAM_WINDOW: u32 = 1 << 20;
pub(super) const CONN_WINDOW: u32 = 8 << 20;
/// The largest gRPC message taken in an answer (tonic's default), plus its 5-byte prefix.
pub(super) const MAX_ANSWER: usize = (4 << 20) + 5;

/// Why a connection can take no more calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("connection lost: {0}")]
    Io(String),
    #[error("the server closed the connection")]
    Closed,
    #[error("the load generator closed the connection")]
    Finished,
    #[error("HTTP/2 protocol error from the server: {0}")]
    Wire(#[from] WireError),
    #[error("HTTP/2 protocol error from the server: {0}")]
    Protocol(&'static str),
    #[error("HTTP/2 flow control error from the server: {0}")]
    FlowControl(&'static str),
    #[error("undecodable header block from the server (HPACK): {0}")]
    Hpack(String),
    #[error("the server closed the connection (GOAWAY {code}{debug})")]
    GoAway { code: String, debug: String },
    #[error("stream ids used up: 2^30 calls on one connection")]
    StreamIds,
}

impl ConnError {
    /// The code of the GOAWAY the client sends for it, if any.
    fn goaway_code(&self) -> Option<u32> {
        match self {
            Self::Wire(e) => Some(e.code()),
            Self::Protocol(_) => Some(code::PROTOCOL_ERROR),
            Self::FlowControl(_) => Some(code::FLOW_CONTROL_ERROR),
            Self::Hpack(_) => Some(code::COMPRESSION_ERROR),
            Self::StreamIds => Some(code::NO_ERROR),
            Self::Io(_) | Self::Closed | Self::Finished | Self::GoAway { .. } => None,
        }
    }
}

/// Where a call is.
pub(super) enum SlotState {
    Free,
    /// Waiting for a stream.
    Queued,
    /// On this stream.
    Sent(u32),
    /// Given up by its caller (on this stream, if it had one): to be reset and freed.
    Cancelled(Option<u32>),
    /// Answered; the caller takes the outcome and frees the slot.
    Done(Outcome),
}

pub(super) struct Slot {
    body: Bytes,
    state: SlotState,
    waker: Option<Waker>,
}

/// The calls between the workers and the connection's task.
#[derive(Default)]
pub(super) struct Shared {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Calls waiting for a stream, oldest first.
    queue: VecDeque<usize>,
    /// Slots of calls given up, to be cleaned up by the task.
    cancelled: Vec<usize>,
    /// The connection task's waker while it waits; taken by whoever wakes it.
    task: Option<Waker>,
    /// Why no more calls are taken.
    failed: Option<String>,
    /// Every handle is gone: the task closes the connection.
    closed: bool,
}

impl Shared {
    /// Queues a call of `body`; returns its slot and the task's waker to wake, or why the
    /// connection takes no calls.
    pub(super) fn submit(
        &mut self,
        body: Bytes,
        waker: &Waker,
    ) -> Result<(usize, Option<Waker>), String> {
        if let Some(reason) = &self.failed {
            return Err(reason.clone());
        }
        let slot = Slot {
            body,
            state: SlotState::Queued,
            waker: Some(waker.clone()),
        };
        let idx = match self.free.pop() {
            Some(i) => {
                if let Some(s) = self.slots.get_mut(i) {
                    *s = slot;
                }
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        self.queue.push_back(idx);
        Ok((idx, self.task.take()))
    }

    /// The outcome of the call in `idx` if it is answered (the slot is then free).
    pub(super) fn poll_done(&mut self, idx: usize, waker: &Waker) -> Option<Outcome> {
        let Some(slot) = self.slots.get_mut(idx) else {
            return Some(Outcome::Error("gRPC client: lost call (a bug)".to_owned()));
        };
        if let SlotState::Done(_) = slot.state {
            let SlotState::Done(o) = std::mem::replace(&mut slot.state, SlotState::Free) else {
                return None;
            };
            slot.waker = None;
            self.free.push(idx);
            return Some(o);
        }
        match &slot.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => slot.waker = Some(waker.clone()),
        }
        None
    }

    /// The caller of `idx` gave up; returns the task's waker to wake.
    pub(super) fn cancel(&mut self, idx: usize) -> Option<Waker> {
        let slot = self.slots.get_mut(idx)?;
        slot.waker = None;
        match slot.state {
            SlotState::Done(_) => {
                slot.state = SlotState::Free;
                self.free.push(idx);
                None
            }
            SlotState::Queued => {
                slot.state = SlotState::Cancelled(None);
                self.cancelled.push(idx);
                self.task.take()
            }
            SlotState::Sent(id) => {
                slot.state = SlotState::Cancelled(Some(id));
                self.cancelled.push(idx);
                self.task.take()
            }
            SlotState::Free | SlotState::Cancelled(_) => None,
        }
    }

    /// Every handle is gone.
    pub(super) fn close(&mut self) -> Option<Waker> {
        self.closed = true;
        self.task.take()
    }

    fn free_slot(&mut self, idx: usize) {
        if let Some(slot) = self.slots.get_mut(idx) {
            slot.state = SlotState::Free;
            slot.body = Bytes::new();
            self.free.push(idx);
        }
    }
}

/// The grpc-status of an answer.
enum Grpc {
    Ok,
    Err { code: Vec<u8>, message: Vec<u8> },
}

/// One stream's answer so far.
struct Stream {
    slot: usize,
    /// The answer's (non-informational) headers arrived.
    head: bool,
    grpc: Option<Grpc>,
    body: Vec<u8>,
    /// Received DATA not given back to the stream's window yet.
    unacked: u32,
}

/// A header block waiting for its CONTINUATION frames.
struct Pending {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

type Map<V> = HashMap<u32, V, foldhash::fast::RandomState>;

/// The connection's protocol state; no I/O (frames in through [`State::on_bytes`], frames
/// out appended to `out`), so that tests drive it directly.
pub(super) struct State {
    decoder: hpack::Decoder,
    /// The request's header block ([`wire::request_block`]).
    block: Vec<u8>,
    streams: Map<Stream>,
    next_id: u32,
    /// The server's SETTINGS.
    max_streams: u32,
    peer_window: u32,
    peer_max_frame: u32,
    seen_settings: bool,
    /// Connection-level windows: what the client may send, what the server may send.
    send_window: i64,
    recv_window: i64,
    recv_unacked: u32,
    continuation: Option<Pending>,
    /// Why no new streams open (the server's GOAWAY, the stream ids used up): the streams
    /// in flight finish, then the connection closes.
    goaway: Option<ConnError>,
    failed: Option<ConnError>,
    /// Answered calls, to be handed over in [`State::sync`].
    done: Vec<(usize, Outcome)>,
    /// Frames to write.
    pub(super) out: Vec<u8>,
}

impl State {
    /// A connection's state, with the client's preface, SETTINGS and first WINDOW_UPDATE in
    /// `out`.
    pub(super) fn new(block: Vec<u8>) -> Self {
        // The client keeps SETTINGS_HEADER_TABLE_SIZE at its default.
        let decoder = hpack::Decoder::new(4096);
        let mut out = Vec::with_capacity(64 << 10);
        out.extend_from_slice(wire::PREFACE);
        wire::put_settings(
            &mut out,
            &[
                (setting::ENABLE_PUSH, 0),
                (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            ],
        );
        wire::put_window_update(&mut out, 0, CONN_WINDOW - 65_535);
        Self {
            decoder,
            block,
            streams: Map::default(),
            next_id: 1,
            max_streams: u32::MAX,
            peer_window: 65_535,
            peer_max_frame: wire::DEFAULT_MAX_FRAME,
            seen_settings: false,
            send_window: 65_535,
            recv_window: i64::from(CONN_WINDOW),
            recv_unacked: 0,
            continuation: None,
            goaway: None,
            failed: None,
            done: Vec::new(),
            out,
        }
    }

    /// The server's first SETTINGS arrived.
    pub(super) fn ready(&self) -> bool {
        self.seen_settings
    }

    pub(super) fn failed(&self) -> Option<&ConnError> {
        self.failed.as_ref()
    }

    /// Reads the whole frames at the front of `buf`; returns the bytes taken. After an
    /// error the connection is failed (see [`State::fail`]).
    pub(super) fn on_bytes(&mut self, buf: &[u8]) -> usize {
        let mut at = 0;
        while self.failed.is_none() {
            let rest = buf.get(at..).unwrap_or_default();
            match wire::parse(rest, wire::DEFAULT_MAX_FRAME) {
                Ok(Some((frame, used))) => {
                    at += used;
                    if let Err(e) = self.on_frame(frame) {
                        self.fail(e);
                    }
                }
                Ok(None) => break,
                Err(e) => self.fail(e.into()),
            }
        }
        at
    }

    /// No more calls: every one in flight fails with `e`; GOAWAY goes out if the server
    /// broke the protocol.
    pub(super) fn fail(&mut self, e: ConnError) {
        if self.failed.is_some() {
            return;
        }
        // Closed after the server's GOAWAY: the GOAWAY says why.
        let e = match (&e, &self.goaway) {
            (ConnError::Closed | ConnError::Io(_), Some(g)) => g.clone(),
            _ => e,
        };
        if let Some(c) = e.goaway_code() {
            wire::put_goaway(&mut self.out, 0, c);
        }
        let reason = e.to_string();
        for (_, s) in self.streams.drain() {
            self.done.push((s.slot, Outcome::Error(reason.clone())));
        }
        self.failed = Some(e);
    }

    fn on_frame(&mut self, frame: Frame<'_>) -> Result<(), ConnError> {
        if !self.seen_settings && !matches!(frame, Frame::Settings { ack: false, .. }) {
            return Err(ConnError::Protocol(
                "its first frame is not SETTINGS (not an HTTP/2 server?)",
            ));
        }
        if let Some(p) = &self.continuation
            && !matches!(frame, Frame::Continuation { stream, .. } if stream == p.stream)
        {
            return Err(ConnError::Protocol(
                "a header block without its CONTINUATION",
            ));
        }
        match frame {
            Frame::Data {
                stream,
                end_stream,
                data,
                flow,
            } => self.on_data(stream, end_stream, data, flow)?,
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                block,
            } => {
                if end_headers {
                    self.on_headers(stream, end_stream, block)?;
                } else {
                    self.continuation = Some(Pending {
                        stream,
                        end_stream,
                        block: block.to_vec(),
                    });
                }
            }
            Frame::Continuation {
                end_headers, block, ..
            } => {
                let Some(p) = &mut self.continuation else {
                    return Err(ConnError::Protocol("CONTINUATION without HEADERS"));
                };
                if p.block.len() + block.len() > MAX_ANSWER {
                    return Err(ConnError::Protocol("a header block over 4 MiB"));
                }
                p.block.extend_from_slice(block);
                if end_headers && let Some(p) = self.continuation.take() {
                    self.on_headers(p.stream, p.end_stream, &p.block)?;
                }
            }
            Frame::RstStream { stream, code } => {
                if let Some(s) = self.streams.remove(&stream) {
                    let reason = format!("stream reset by the server: {}", wire::code_name(code));
                    self.done.push((s.slot, Outcome::Error(reason)));
                }
            }
            Frame::Settings { ack: true, .. } => {}
            Frame::Settings { ack: false, params } => {
                for (id, value) in wire::settings(params) {
                    match id {
                        setting::MAX_CONCURRENT_STREAMS => self.max_streams = value,
                        setting::INITIAL_WINDOW_SIZE if value > wire::MAX_31 => {
                            return Err(ConnError::FlowControl("INITIAL_WINDOW_SIZE over 2^31-1"));
                        }
                        setting::INITIAL_WINDOW_SIZE => self.peer_window = value,
                        setting::MAX_FRAME_SIZE if !(16_384..=16_777_215).contains(&value) => {
                            return Err(ConnError::Protocol("MAX_FRAME_SIZE out of range"));
                        }
                        setting::MAX_FRAME_SIZE => self.peer_max_frame = value,
                        setting::ENABLE_PUSH if value > 1 => {
                            return Err(ConnError::Protocol("ENABLE_PUSH neither 0 nor 1"));
                        }
                        // The client's header block uses no dynamic table; unknown
                        // parameters are ignored (RFC 9113 §6.5.2).
                        _ => {}
                    }
                }
                self.seen_settings = true;
                wire::put_settings_ack(&mut self.out);
            }
            Frame::Ping { ack, payload } => {
                if !ack {
                    wire::put_ping_ack(&mut self.out, payload);
                }
            }
            Frame::GoAway {
                last_stream,
                code,
                debug,
            } => self.on_goaway(last_stream, code, debug),
            Frame::WindowUpdate {
                stream: 0,
                increment,
            } => {
                if increment == 0 {
                    return Err(ConnError::Protocol("WINDOW_UPDATE of 0 on the connection"));
                }
                self.send_window += i64::from(increment);
                if self.send_window > i64::from(wire::MAX_31) {
                    return Err(ConnError::FlowControl("connection window over 2^31-1"));
                }
            }
            // Every request body is sent whole when its stream opens (it fits the window).
            Frame::WindowUpdate { .. } | Frame::Ignored { .. } => {}
            Frame::PushPromise { .. } => {
                return Err(ConnError::Protocol("PUSH_PROMISE, push being disabled"));
            }
        }
        Ok(())
    }

    fn on_goaway(&mut self, last_stream: u32, code: u32, debug: &[u8]) {
        let debug = if debug.is_empty() {
            String::new()
        } else {
            format!(": {}", String::from_utf8_lossy(debug))
        };
        let e = ConnError::GoAway {
            code: wire::code_name(code),
            debug,
        };
        let reason = format!("stream not processed: {e}");
        let lost: Vec<u32> = self
            .streams
            .keys()
            .copied()
            .filter(|&id| id > last_stream)
            .collect();
        for id in lost {
            if let Some(s) = self.streams.remove(&id) {
                self.done.push((s.slot, Outcome::Error(reason.clone())));
            }
        }
        self.goaway = Some(e);
    }

    fn on_data(&mut self, id: u32, end: bool, data: &[u8], flow: u32) -> Result<(), ConnError> {
        self.recv_window -= i64::from(flow);
        if self.recv_window < 0 {
            return Err(ConnError::FlowControl("DATA beyond the connection window"));
        }
        self.recv_unacked += flow;
        if self.recv_unacked >= CONN_WINDOW / 2 {
            wire::put_window_update(&mut self.out, 0, self.recv_unacked);
            self.recv_window += i64::from(self.recv_unacked);
            self.recv_unacked = 0;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return Ok(()); // a stream reset or answered already
        };
        let error = if !s.head {
            Some("DATA before the answer's headers")
        } else if s.body.len() + data.len() > MAX_ANSWER {
            Some("gRPC answer over 4 MiB")
        } else {
            None
        };
        if let Some(e) = error {
            self.reset(id, code::CANCEL, e.to_owned());
            return Ok(());
        }
        s.body.extend_from_slice(data);
        if end {
            self.finish(id);
        } else {
            s.unacked += flow;
            if s.unacked >= STREAM_WINDOW / 2 {
                wire::put_window_update(&mut self.out, id, s.unacked);
                s.unacked = 0;
            }
        }
        Ok(())
    }

    fn on_headers(&mut self, id: u32, end: bool, block: &[u8]) -> Result<(), ConnError> {
        // Every block is decoded, a stream's or not: the decoder's table follows them all.
        let (mut status, mut grpc) = (None::<u16>, None);
        let mut message = Vec::new();
        self.decoder
            .decode(block, |name, value| match name {
                b":status" => {
                    status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
                }
                b"grpc-status" if value == b"0" => grpc = Some(Grpc::Ok),
                b"grpc-status" => {
                    grpc = Some(Grpc::Err {
                        code: value.to_vec(),
                        message: Vec::new(),
                    });
                }
                b"grpc-message" => message = value.to_vec(),
                _ => {}
            })
            .map_err(|e| ConnError::Hpack(e.to_string()))?;
        if let Some(Grpc::Err { message: m, .. }) = &mut grpc {
            *m = message;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        if !s.head {
            match status {
                Some(100..=199) if !end => return Ok(()), // informational
                Some(200) => s.head = true,
                Some(other) => {
                    let reason = match http::StatusCode::from_u16(other) {
                        Ok(c) => format!("HTTP {c}"),
                        Err(_) => format!("HTTP {other}"),
                    };
                    self.close_stream(id, end, reason);
                    return Ok(());
                }
                None => {
                    self.close_stream(id, end, "HTTP answer without :status".to_owned());
                    return Ok(());
                }
            }
        } else if !end {
            self.reset(
                id,
                code::PROTOCOL_ERROR,
                "HTTP/2 trailers without END_STREAM".to_owned(),
            );
            return Ok(());
        }
        // Trailers (or the headers of a trailers-only answer) say the status.
        if grpc.is_some() {
            s.grpc = grpc;
        }
        if end {
            self.finish(id);
        }
        Ok(())
    }

    /// Ends stream `id` with an error; resets it unless the server ended it.
    fn close_stream(&mut self, id: u32, ended: bool, reason: String) {
        if ended {
            if let Some(s) = self.streams.remove(&id) {
                self.done.push((s.slot, Outcome::Error(reason)));
            }
        } else {
            self.reset(id, code::CANCEL, reason);
        }
    }

    /// Resets stream `id`; its call fails with `reason`.
    fn reset(&mut self, id: u32, code: u32, reason: String) {
        if let Some(s) = self.streams.remove(&id) {
            wire::put_rst_stream(&mut self.out, id, code);
            self.done.push((s.slot, Outcome::Error(reason)));
        }
    }

    /// The server ended stream `id`: its call's outcome.
    fn finish(&mut self, id: u32) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        let outcome = match s.grpc {
            None => Outcome::Error("gRPC answer without grpc-status".to_owned()),
            Some(Grpc::Ok) => super::outcome(&s.body),
            Some(Grpc::Err { code, message }) => super::status_error(&code, &message),
        };
        self.done.push((s.slot, outcome));
    }

    /// Hands the answers over, cleans up the calls given up, opens streams for the queued
    /// calls; returns the wakers of the calls answered.
    pub(super) fn sync(&mut self, shared: &mut Shared) -> Vec<Waker> {
        let mut wakers = Vec::new();
        for (idx, outcome) in self.done.drain(..) {
            if let Some(slot) = shared.slots.get_mut(idx)
                && matches!(slot.state, SlotState::Sent(_) | SlotState::Queued)
            {
                slot.state = SlotState::Done(outcome);
                slot.body = Bytes::new();
                wakers.extend(slot.waker.take());
            }
        }
        for idx in std::mem::take(&mut shared.cancelled) {
            let Some(slot) = shared.slots.get(idx) else {
                continue;
            };
            match slot.state {
                SlotState::Cancelled(Some(id)) => {
                    if self.streams.remove(&id).is_some() && self.failed.is_none() {
                        wire::put_rst_stream(&mut self.out, id, code::CANCEL);
                    }
                }
                SlotState::Cancelled(None) => shared.queue.retain(|&q| q != idx),
                _ => continue,
            }
            shared.free_slot(idx);
        }
        if self.failed.is_none() && shared.closed {
            wire::put_goaway(&mut self.out, 0, code::NO_ERROR);
            self.fail(ConnError::Finished);
        }
        if self.failed.is_none()
            && let Some(g) = &self.goaway
            && self.streams.is_empty()
        {
            let g = g.clone();
            self.fail(g);
        }
        let refuse = self
            .failed
            .as_ref()
            .or(self.goaway.as_ref())
            .map(ToString::to_string);
        if let Some(reason) = refuse {
            while let Some(idx) = shared.queue.pop_front() {
                self.done.push((idx, Outcome::Error(reason.clone())));
            }
            shared.failed = Some(reason);
        }
        while let Some(&idx) = shared.queue.front() {
            if self.failed.is_some() || self.streams.len() >= self.max_streams as usize {
                break;
            }
            let Some(slot) = shared.slots.get_mut(idx) else {
                shared.queue.pop_front();
                continue;
            };
            let len = slot.body.len();
            if len > self.peer_window as usize {
                shared.queue.pop_front();
                let reason = format!(
                    "request of {len} bytes, over the server's stream window ({} bytes)",
                    self.peer_window
                );
                self.done.push((idx, Outcome::Error(reason)));
                continue;
            }
            if i64::try_from(len).unwrap_or(i64::MAX) > self.send_window {
                break; // until the server's WINDOW_UPDATE
            }
            if self.next_id > wire::MAX_31 {
                // No new streams; those in flight finish, then the connection closes.
                self.goaway = Some(ConnError::StreamIds);
                break;
            }
            shared.queue.pop_front();
            let id = self.next_id;
            self.next_id += 2;
            self.send_window -= i64::try_from(len).unwrap_or(0);
            let frame = self.peer_max_frame as usize;
            wire::put_headers(&mut self.out, id, &self.block, frame, false);
            wire::put_data(&mut self.out, id, &slot.body, frame);
            slot.body = Bytes::new();
            slot.state = SlotState::Sent(id);
            self.streams.insert(
                id,
                Stream {
                    slot: idx,
                    head: false,
                    grpc: None,
                    body: Vec::new(),
                    unacked: 0,
                },
            );
        }
        // Answers made above (refusals) go out now, not at the next wakeup.
        if !self.done.is_empty() || (self.goaway.is_some() && shared.failed.is_none()) {
            wakers.extend(self.sync(shared));
        }
        wakers
    }

    #[cfg(test)]
    pub(super) fn set_next_id(&mut self, id: u32) {
        self.next_id = id;
    }
}

/// Reads at most this many times per wakeup before letting the queued calls go out.
const READS_PER_WAKEUP: usize = 16;
/// The read buffer: room for several frames of the largest size the client accepts.
const READ_BUF: usize = 64 << 10;

/// The connection's task: owns the socket, reads, answers, writes.
pub(super) struct Driver {
    pub(super) io: TcpStream,
    pub(super) state: State,
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) rbuf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    written: usize,
}

impl Driver {
    pub(super) fn new(io: TcpStream, state: State, shared: Arc<Mutex<Shared>>) -> Self {
        Self {
            io,
            state,
            shared,
            rbuf: vec![0; READ_BUF],
            start: 0,
            end: 0,
            written: 0,
        }
    }

    /// Reads once (waiting for the socket); takes the frames read. For the handshake.
    pub(super) async fn read_some(&mut self) -> Result<(), ConnError> {
        self.io
            .readable()
            .await
            .map_err(|e| ConnError::Io(e.to_string()))?;
        match self.io.try_read(&mut self.rbuf[self.end..]) {
            Ok(0) => Err(ConnError::Closed),
            Ok(n) => {
                self.took(n);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(ConnError::Io(e.to_string())),
        }
    }

    /// `n` more bytes are in the buffer: parse them.
    fn took(&mut self, n: usize) {
        self.end += n;
        let used = self.state.on_bytes(&self.rbuf[self.start..self.end]);
        self.start += used;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.rbuf.len() - self.end < (wire::DEFAULT_MAX_FRAME as usize) + wire::HEADER_LEN
        {
            self.rbuf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
    }

    /// Writes `out` whole, waiting as needed. For the handshake.
    pub(super) async fn write_all(&mut self) -> Result<(), ConnError> {
        use tokio::io::AsyncWriteExt as _;
        self.io
            .write_all(&self.state.out)
            .await
            .map_err(|e| ConnError::Io(e.to_string()))?;
        self.state.out.clear();
        Ok(())
    }

    fn read(&mut self, cx: &mut Context<'_>) {
        for _ in 0..READS_PER_WAKEUP {
            if self.state.failed().is_some() {
                return;
            }
            match self.io.poll_read_ready(cx) {
                Poll::Pending => return,
                Poll::Ready(Err(e)) => return self.state.fail(ConnError::Io(e.to_string())),
                Poll::Ready(Ok(())) => {}
            }
            match self.io.try_read(&mut self.rbuf[self.end..]) {
                Ok(0) => return self.state.fail(ConnError::Closed),
                Ok(n) => self.took(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return self.state.fail(ConnError::Io(e.to_string())),
            }
        }
        // More to read: come back after the calls queued meanwhile go out.
        cx.waker().wake_by_ref();
    }

    /// Writes what is ready; `false` if the socket failed.
    fn write(&mut self, cx: &mut Context<'_>) -> bool {
        while self.written < self.state.out.len() {
            match self.io.poll_write_ready(cx) {
                Poll::Pending => return true,
                Poll::Ready(Err(_)) => return false,
                Poll::Ready(Ok(())) => {}
            }
            match self.io.try_write(&self.state.out[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        self.state.out.clear();
        self.written = 0;
        true
    }
}

impl Future for Driver {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.read(cx);
        let wakers = {
            let mut shared = this.shared.lock();
            let wakers = this.state.sync(&mut shared);
            if this.state.failed().is_none() {
                match &shared.task {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => shared.task = Some(cx.waker().clone()),
                }
            }
            wakers
        };
        for w in wakers {
            w.wake();
        }
        let wrote = this.write(cx);
        if this.state.failed().is_some() {
            if wrote && !this.state.out.is_empty() {
                return Poll::Pending; // the last GOAWAY still going out
            }
            return Poll::Ready(());
        }
        if !wrote {
            this.state.fail(ConnError::Io("write failed".to_owned()));
            let wakers = this.state.sync(&mut this.shared.lock());
            for w in wakers {
                w.wake();
            }
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
