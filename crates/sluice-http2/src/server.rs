//! A server's side of one HTTP/2 connection (RFC 9113) without I/O: the caller feeds the
//! bytes it reads to [`Connection::poll_event`], which hands out requests' headers, data
//! and resets as [`Event`]s, and the caller answers with [`Connection::send_headers`],
//! [`Connection::send_data`] and [`Connection::send_trailers`]; everything to write
//! collects in [`Connection::output`], written when the caller likes (once per batch).
//!
//! What it keeps for the caller:
//! - **Flow control both ways.** Received data is taken as delivered: its window goes back
//!   to the peer once half of it is used. Data to send beyond the peer's windows is queued
//!   on its stream and sent as WINDOW_UPDATEs arrive, the trailers after it.
//! - **Stream states** (§5.1): ids only rise and are odd; frames on idle streams, HEADERS
//!   or DATA after a request's end, and trailers without END_STREAM are errors; frames on
//!   streams this side reset are ignored. A stream is forgotten once both sides ended it.
//!   A response that ends before its request does resets the stream with NO_ERROR (§8.1).
//! - **Requests checked as §8.3 says**: the four request pseudo-headers once each and
//!   first, `:method`, `:scheme` and a non-empty `:path` present, no uppercase or
//!   connection-specific fields, `te` only `trailers`, `content-length` matched by the data.
//!   A malformed request is reset (PROTOCOL_ERROR); one whose fields exceed
//!   SETTINGS_MAX_HEADER_LIST_SIZE is answered 431.
//! - **Bounds on what a peer can make it do**: at most SETTINGS_MAX_CONCURRENT_STREAMS
//!   streams (others refused); a header block at most twice the header list limit, however
//!   many CONTINUATIONs it spans; streams the peer resets before their answer (the "rapid
//!   reset" of CVE-2023-44487) and streams this side must reset for errors are counted, and
//!   past [`PREMATURE_RESETS`] or [`LOCAL_RESETS`] the connection ends with
//!   ENHANCE_YOUR_CALM.
//! - **Graceful close**: [`Connection::go_away`] sends GOAWAY; streams already opened are
//!   answered, later ones ignored, and [`Connection::is_done`] says when nothing is left.
//!   After the peer's GOAWAY, streams it opens anyway are refused (REFUSED_STREAM).
//!
//! A connection error ends the connection: [`Connection::poll_event`] returns it after
//! queueing the GOAWAY that names it, and the caller writes the output and closes.
//!
//! Header blocks are sent as the caller encodes them ([`crate::hpack::encode_literal`]):
//! this side never adds to the peer's HPACK table, so a block encoded once serves every
//! stream. Server push is not used.

use std::collections::{HashMap, VecDeque};

use bytes::{Buf as _, Bytes, BytesMut};

use crate::frame::{self, Frame, WireError, code, setting};
use crate::hpack::{Decoder, HpackError};

mod request;
use request::{Check, Fields};
pub use request::{OwnedRequestHead, RequestHead};

/// What a client sends first (§3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams the peer resets before their answer is sent, beyond which the connection ends
/// when they are more than half of the streams opened (Envoy's rule against rapid reset:
/// `premature_reset_total_stream_count`).
pub const PREMATURE_RESETS: u64 = 500;

/// Streams this side resets because the peer broke a rule on them, beyond which the
/// connection ends (h2's `max_local_error_reset_streams`, as hyper sets it).
pub const LOCAL_RESETS: u64 = 1024;

/// What this side advertises (§6.5.2). The defaults are what hyper gives tonic's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Streams the peer may have open at once.
    pub max_concurrent_streams: u32,
    /// Each stream's receive window.
    pub initial_window_size: u32,
    /// The connection's receive window.
    pub connection_window_size: u32,
    /// The largest frame payload accepted.
    pub max_frame_size: u32,
    /// The largest header list accepted (names, values and 32 bytes per field, §6.5.2).
    pub max_header_list_size: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 200,
            initial_window_size: 1 << 20,
            connection_window_size: 1 << 20,
            max_frame_size: 16 << 10,
            max_header_list_size: 16 << 10,
        }
    }
}

/// Why the connection ended (a connection error, §5.4.1). The GOAWAY naming it is queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The peer did not open with the client preface and a SETTINGS frame.
    #[error("not an HTTP/2 client preface")]
    Preface,
    /// A frame malformed in itself.
    #[error(transparent)]
    Frame(#[from] WireError),
    /// A header block that does not decode: the HPACK tables no longer agree.
    #[error("undecodable header block: {0}")]
    Hpack(#[from] HpackError),
    /// A frame the connection's state does not allow.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// The peer sent beyond a window, or grew one past 2^31 - 1.
    #[error("flow control error: {0}")]
    FlowControl(&'static str),
    /// DATA or HEADERS on a stream that had ended both ways.
    #[error("a frame on a closed stream")]
    StreamClosed,
    /// The peer made this side do too much (see the module documentation).
    #[error("too much asked of the connection: {0}")]
    Calm(&'static str),
}

impl ConnError {
    /// The GOAWAY's error code.
    #[must_use]
    pub fn code(&self) -> u32 {
        match self {
            Self::Preface | Self::Protocol(_) => code::PROTOCOL_ERROR,
            Self::Frame(e) => e.code(),
            Self::Hpack(_) => code::COMPRESSION_ERROR,
            Self::FlowControl(_) => code::FLOW_CONTROL_ERROR,
            Self::StreamClosed => code::STREAM_CLOSED,
            Self::Calm(_) => code::ENHANCE_YOUR_CALM,
        }
    }
}

/// What the peer did, for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A request's headers: [`Connection::request`] reads them until the next call of
    /// [`Connection::poll_event`]. `end_stream`: the request has no body.
    Request { stream: u32, end_stream: bool },
    /// A piece of a request's body; `end_stream`: its last.
    Data {
        stream: u32,
        data: Bytes,
        end_stream: bool,
    },
    /// A request's trailers ([`Connection::request`]'s fields); the request's end.
    Trailers { stream: u32 },
    /// The stream is gone, reset by the peer or by this side (`code`): forget it. What is
    /// sent on it from now on is dropped.
    Reset { stream: u32, code: u32 },
}

/// How a stream's sending side stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    /// Nothing sent yet.
    Idle,
    /// Headers sent; data may follow.
    Open,
    /// The end is queued behind data waiting for window: END_STREAM on the last DATA
    /// (`None`) or trailers (their block in `Stream::trailers`).
    Ending,
    /// END_STREAM sent.
    Done,
}

#[derive(Debug)]
struct Stream {
    /// The peer has not ended its request.
    recv_open: bool,
    send: Send,
    /// What the peer may still send on the stream.
    recv_window: i64,
    /// Received but not yet given back.
    recv_unacked: u32,
    send_window: i64,
    /// Data waiting for window, in order.
    queue: VecDeque<Bytes>,
    queued: usize,
    /// The trailers' block once [`Connection::send_trailers`] queued them.
    trailers: Option<Bytes>,
    /// The request's `content-length` and the data received so far.
    content_length: Option<u64>,
    received: u64,
}

type Map<V> = HashMap<u32, V, foldhash::fast::RandomState>;

/// How many of the latest streams this side reset are remembered: frames the peer sent
/// before it saw the reset are ignored on them (§5.4.2), not taken as errors.
/// (A client may open far more streams than the limit before it sees our SETTINGS; each
/// refused one's DATA may follow. Looked up only for frames on streams not open.)
const RESET_MEMORY: usize = 1024;

/// A header block being received: HEADERS, then CONTINUATION until END_HEADERS.
#[derive(Debug)]
struct Partial {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

/// One server connection's HTTP/2 state. See the [module documentation](self).
#[derive(Debug)]
pub struct Connection {
    settings: Settings,
    decoder: Decoder,
    fields: Fields,
    /// Waiting for the client preface (then its SETTINGS).
    preface: Preface,
    out: Vec<u8>,
    streams: Map<Stream>,
    /// The highest stream id the peer opened (§5.1.1).
    last_stream: u32,
    /// Streams this side reset lately, oldest first.
    reset: VecDeque<u32>,
    partial: Option<Partial>,
    /// The peer's settings.
    peer_max_frame: u32,
    peer_initial_window: i64,
    /// The connection's send window, and what the peer may still send on it.
    send_window: i64,
    recv_window: i64,
    recv_unacked: u32,
    /// Streams with data waiting for window, in the order they queued it.
    blocked: VecDeque<u32>,
    /// GOAWAY sent: streams above this id are ignored.
    going_away: Option<u32>,
    /// The peer sent GOAWAY: it opens no more streams.
    peer_going_away: bool,
    /// The peer acknowledged our SETTINGS: until then it may send on a new stream as far
    /// as the default window (§6.9.3), whatever ours says.
    settings_acked: bool,
    failed: bool,
    opened: u64,
    premature_resets: u64,
    local_resets: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preface {
    Bytes,
    Settings,
    Done,
}

impl Connection {
    /// A connection advertising `settings`: its SETTINGS (and the WINDOW_UPDATE that grows
    /// the connection's window to `settings.connection_window_size`) are already queued.
    #[must_use]
    pub fn new(settings: Settings) -> Self {
        let mut out = Vec::with_capacity(16 << 10);
        frame::put_settings(
            &mut out,
            &[
                (setting::ENABLE_PUSH, 0),
                (
                    setting::MAX_CONCURRENT_STREAMS,
                    settings.max_concurrent_streams,
                ),
                (setting::INITIAL_WINDOW_SIZE, settings.initial_window_size),
                (setting::MAX_FRAME_SIZE, settings.max_frame_size),
                (setting::MAX_HEADER_LIST_SIZE, settings.max_header_list_size),
            ],
        );
        let grow = settings
            .connection_window_size
            .saturating_sub(DEFAULT_WINDOW);
        if grow > 0 {
            frame::put_window_update(&mut out, 0, grow);
        }
        Self {
            settings,
            decoder: Decoder::new(4096),
            fields: Fields::default(),
            preface: Preface::Bytes,
            out,
            streams: Map::default(),
            last_stream: 0,
            reset: VecDeque::with_capacity(RESET_MEMORY),
            partial: None,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            peer_initial_window: i64::from(DEFAULT_WINDOW),
            send_window: i64::from(DEFAULT_WINDOW),
            recv_window: i64::from(settings.connection_window_size.max(DEFAULT_WINDOW)),
            recv_unacked: 0,
            blocked: VecDeque::new(),
            going_away: None,
            peer_going_away: false,
            settings_acked: false,
            failed: false,
            opened: 0,
            premature_resets: 0,
            local_resets: 0,
        }
    }

    /// The bytes to write, in order. The caller takes them (`std::mem::take`, or writes
    /// and clears); the connection only appends.
    pub fn output(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// The headers (or trailers) of the last [`Event::Request`] (or [`Event::Trailers`]).
    #[must_use]
    pub fn request(&self) -> RequestHead<'_> {
        RequestHead {
            fields: &self.fields,
        }
    }

    /// Streams open (not yet ended both ways).
    #[must_use]
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Bytes queued on `stream` for want of window.
    #[must_use]
    pub fn queued(&self, stream: u32) -> usize {
        self.streams.get(&stream).map_or(0, |s| s.queued)
    }

    /// Whether the connection has nothing left to do: it failed, or GOAWAY went one way or
    /// the other and every stream has ended. (The output may still hold bytes to write.)
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.failed
            || ((self.going_away.is_some() || self.peer_going_away) && self.streams.is_empty())
    }

    /// Starts a graceful close: GOAWAY naming the last stream the peer opened. Streams up
    /// to it are still answered; later ones are ignored.
    pub fn go_away(&mut self) {
        if self.going_away.is_none() && !self.failed {
            self.going_away = Some(self.last_stream);
            frame::put_goaway(&mut self.out, self.last_stream, code::NO_ERROR);
        }
    }

    /// Reads the next thing the peer did from the front of `input` (bytes as read, split
    /// anywhere; what a frame used is taken off). `Ok(None)`: `input` holds no whole frame
    /// more.
    ///
    /// # Errors
    /// [`ConnError`]: the connection is over; its GOAWAY is in [`Self::output`].
    pub fn poll_event(&mut self, input: &mut BytesMut) -> Result<Option<Event>, ConnError> {
        if self.failed {
            return Ok(None);
        }
        match self.next(input) {
            Ok(e) => Ok(e),
            Err(e) => {
                self.failed = true;
                frame::put_goaway(&mut self.out, self.last_stream, e.code());
                Err(e)
            }
        }
    }

    fn next(&mut self, input: &mut BytesMut) -> Result<Option<Event>, ConnError> {
        loop {
            if self.local_resets > LOCAL_RESETS {
                return Err(ConnError::Calm("too many streams reset for errors"));
            }
            if self.preface == Preface::Bytes {
                let n = input.len().min(PREFACE.len());
                if input[..n] != PREFACE[..n] {
                    return Err(ConnError::Preface);
                }
                if n < PREFACE.len() {
                    return Ok(None);
                }
                input.advance(n);
                self.preface = Preface::Settings;
            }
            let Some((f, used)) = frame::parse(input, self.settings.max_frame_size)? else {
                return Ok(None);
            };
            if self.preface == Preface::Settings {
                if !matches!(f, Frame::Settings { ack: false, .. }) {
                    return Err(ConnError::Preface);
                }
                self.preface = Preface::Done;
            }
            if let Some(p) = &self.partial
                && !matches!(f, Frame::Continuation { stream, .. } if stream == p.stream)
            {
                return Err(ConnError::Protocol("a header block interrupted"));
            }
            let event = match f {
                Frame::Data {
                    stream,
                    end_stream,
                    data,
                    flow,
                } => {
                    // Where the data lies in the frame, to take it out without a copy.
                    let start = data.as_ptr() as usize - input.as_ptr() as usize;
                    let len = data.len();
                    let event = self.on_data(stream, end_stream, flow, len)?;
                    let mut frame = input.split_to(used);
                    match event {
                        Some(DataTo::Caller) => {
                            frame.advance(start);
                            frame.truncate(len);
                            Some(Event::Data {
                                stream,
                                data: frame.freeze(),
                                end_stream,
                            })
                        }
                        Some(DataTo::Reset(code)) => Some(Event::Reset { stream, code }),
                        None => None,
                    }
                }
                Frame::Headers {
                    stream,
                    end_stream,
                    end_headers,
                    block,
                } => {
                    let event = if end_headers {
                        self.on_headers(stream, end_stream, block)?
                    } else {
                        self.limit_block(block.len())?;
                        self.partial = Some(Partial {
                            stream,
                            end_stream,
                            block: block.to_vec(),
                        });
                        None
                    };
                    input.advance(used);
                    event
                }
                Frame::Continuation {
                    stream,
                    end_headers,
                    block,
                } => {
                    let Some(mut p) = self.partial.take() else {
                        return Err(ConnError::Protocol("CONTINUATION without HEADERS"));
                    };
                    self.limit_block(p.block.len() + block.len())?;
                    p.block.extend_from_slice(block);
                    let event = if end_headers {
                        self.on_headers(stream, p.end_stream, &p.block)?
                    } else {
                        self.partial = Some(p);
                        None
                    };
                    input.advance(used);
                    event
                }
                other => {
                    let event = self.on_control(&other)?;
                    input.advance(used);
                    event
                }
            };
            if event.is_some() {
                return Ok(event);
            }
        }
    }

    /// A header block longer than this is a flood (CONTINUATION without end), not a request.
    fn limit_block(&self, len: usize) -> Result<(), ConnError> {
        if len > 2 * self.settings.max_header_list_size as usize {
            return Err(ConnError::Calm("a header block above twice the list limit"));
        }
        Ok(())
    }

    fn on_control(&mut self, f: &Frame<'_>) -> Result<Option<Event>, ConnError> {
        match *f {
            Frame::Settings { ack: true, .. } => self.settings_acked = true,
            Frame::Ignored { .. } => {}
            Frame::Settings { ack: false, params } => {
                for (id, value) in frame::settings(params) {
                    self.apply(id, value)?;
                }
                frame::put_settings_ack(&mut self.out);
                self.flush_blocked();
            }
            Frame::Ping { ack, payload } => {
                if !ack {
                    frame::put_ping_ack(&mut self.out, payload);
                }
            }
            Frame::GoAway { .. } => self.peer_going_away = true,
            Frame::PushPromise { .. } => {
                return Err(ConnError::Protocol("PUSH_PROMISE from a client"));
            }
            Frame::WindowUpdate { stream, increment } => return self.on_window(stream, increment),
            Frame::RstStream { stream, code } => {
                self.idle_check(stream)?;
                if let Some(s) = self.streams.remove(&stream) {
                    if s.send != Send::Done {
                        self.premature_resets += 1;
                        if self.premature_resets >= PREMATURE_RESETS
                            && self.premature_resets * 2 > self.opened
                        {
                            return Err(ConnError::Calm("most streams reset before their answer"));
                        }
                    }
                    return Ok(Some(Event::Reset { stream, code }));
                }
            }
            // The parser gives these their own variants.
            Frame::Data { .. } | Frame::Headers { .. } | Frame::Continuation { .. } => {}
        }
        Ok(None)
    }

    /// Applies one of the peer's settings (§6.5.2).
    fn apply(&mut self, id: u16, value: u32) -> Result<(), ConnError> {
        match id {
            setting::ENABLE_PUSH if value > 1 => {
                return Err(ConnError::Protocol("SETTINGS_ENABLE_PUSH above 1"));
            }
            setting::INITIAL_WINDOW_SIZE => {
                if value > frame::MAX_31 {
                    return Err(ConnError::FlowControl(
                        "SETTINGS_INITIAL_WINDOW_SIZE above 2^31 - 1",
                    ));
                }
                // §6.9.2: every stream's window moves by the change.
                let delta = i64::from(value) - self.peer_initial_window;
                self.peer_initial_window = i64::from(value);
                for s in self.streams.values_mut() {
                    s.send_window += delta;
                    if s.send_window > i64::from(frame::MAX_31) {
                        return Err(ConnError::FlowControl("a stream's window above 2^31 - 1"));
                    }
                }
            }
            setting::MAX_FRAME_SIZE => {
                if !(frame::DEFAULT_MAX_FRAME..=(1 << 24) - 1).contains(&value) {
                    return Err(ConnError::Protocol("SETTINGS_MAX_FRAME_SIZE out of range"));
                }
                self.peer_max_frame = value;
            }
            // The header table: this side never indexes, so any size serves. The others
            // bound what a server would push, or are advisory.
            _ => {}
        }
        Ok(())
    }

    /// A frame on a stream the peer has not opened yet (§5.1: idle) is a connection error.
    fn idle_check(&self, stream: u32) -> Result<(), ConnError> {
        if stream > self.last_stream {
            return Err(ConnError::Protocol("a frame on an idle stream"));
        }
        Ok(())
    }

    fn on_window(&mut self, stream: u32, increment: u32) -> Result<Option<Event>, ConnError> {
        if stream == 0 {
            if increment == 0 {
                return Err(ConnError::Protocol("a WINDOW_UPDATE of 0"));
            }
            self.send_window += i64::from(increment);
            if self.send_window > i64::from(frame::MAX_31) {
                return Err(ConnError::FlowControl(
                    "the connection's window above 2^31 - 1",
                ));
            }
            self.flush_blocked();
            return Ok(None);
        }
        self.idle_check(stream)?;
        let Some(s) = self.streams.get_mut(&stream) else {
            return Ok(None);
        };
        if increment == 0 {
            return Ok(self.stream_error(stream, code::PROTOCOL_ERROR));
        }
        s.send_window += i64::from(increment);
        if s.send_window > i64::from(frame::MAX_31) {
            return Ok(self.stream_error(stream, code::FLOW_CONTROL_ERROR));
        }
        if s.queued > 0 || s.send == Send::Ending {
            self.flush(stream);
        }
        Ok(None)
    }

    fn on_data(
        &mut self,
        stream: u32,
        end_stream: bool,
        flow: u32,
        len: usize,
    ) -> Result<Option<DataTo>, ConnError> {
        self.recv_window -= i64::from(flow);
        if self.recv_window < 0 {
            return Err(ConnError::FlowControl(
                "DATA beyond the connection's window",
            ));
        }
        // Whatever happens to the data, the connection's window comes back.
        self.recv_unacked += flow;
        // (Never an increment of 0, which the peer would take as an error.)
        if self.recv_unacked > 0 && self.recv_unacked >= self.settings.connection_window_size / 2 {
            frame::put_window_update(&mut self.out, 0, self.recv_unacked);
            self.recv_window += i64::from(self.recv_unacked);
            self.recv_unacked = 0;
        }
        self.idle_check(stream)?;
        let Some(s) = self.streams.get_mut(&stream) else {
            return self.closed_stream(stream).map(|()| None);
        };
        if !s.recv_open {
            return Ok(Some(DataTo::Reset(
                self.reset_for(stream, code::STREAM_CLOSED),
            )));
        }
        s.recv_window -= i64::from(flow);
        if s.recv_window < 0 {
            return Ok(Some(DataTo::Reset(
                self.reset_for(stream, code::FLOW_CONTROL_ERROR),
            )));
        }
        s.received += len as u64;
        let length_ok = s
            .content_length
            .is_none_or(|l| s.received <= l && (!end_stream || s.received == l));
        if !length_ok {
            return Ok(Some(DataTo::Reset(
                self.reset_for(stream, code::PROTOCOL_ERROR),
            )));
        }
        if end_stream {
            s.recv_open = false;
            self.close_if_ended(stream);
        } else {
            s.recv_unacked += flow;
            if s.recv_unacked > 0 && s.recv_unacked >= self.settings.initial_window_size / 2 {
                frame::put_window_update(&mut self.out, stream, s.recv_unacked);
                s.recv_window += i64::from(s.recv_unacked);
                s.recv_unacked = 0;
            }
        }
        Ok(Some(DataTo::Caller))
    }

    /// DATA or HEADERS on a stream no longer in the map: ignored if this side reset it
    /// lately (the peer sent before it knew, §5.4.2), else a connection error.
    fn closed_stream(&self, stream: u32) -> Result<(), ConnError> {
        if self.reset.contains(&stream) || self.going_away.is_some_and(|last| stream > last) {
            Ok(())
        } else {
            Err(ConnError::StreamClosed)
        }
    }

    fn on_headers(
        &mut self,
        stream: u32,
        end_stream: bool,
        block: &[u8],
    ) -> Result<Option<Event>, ConnError> {
        // Decoded whatever becomes of the stream: the table must follow every block.
        let limit = self.settings.max_header_list_size as usize;
        let check = self.fields.decode(&mut self.decoder, block, limit)?;
        if stream <= self.last_stream {
            let Some(s) = self.streams.get_mut(&stream) else {
                return self.closed_stream(stream).map(|()| None);
            };
            if !s.recv_open {
                return Ok(self.stream_error(stream, code::STREAM_CLOSED));
            }
            // Trailers: no pseudo-headers, and the request's end.
            if !end_stream || check != Check::Trailers {
                return Ok(self.stream_error(stream, code::PROTOCOL_ERROR));
            }
            s.recv_open = false;
            if s.content_length.is_some_and(|l| l != s.received) {
                return Ok(self.stream_error(stream, code::PROTOCOL_ERROR));
            }
            self.close_if_ended(stream);
            return Ok(Some(Event::Trailers { stream }));
        }
        if stream.is_multiple_of(2) {
            return Err(ConnError::Protocol("a client stream with an even id"));
        }
        self.last_stream = stream;
        if self.going_away.is_some() {
            // After our GOAWAY, whose last stream id tells the peer it was not answered.
            return Ok(None);
        }
        if self.peer_going_away {
            // After the peer's: refused, which tells it so (it may retry it elsewhere).
            frame::put_rst_stream(&mut self.out, stream, code::REFUSED_STREAM);
            self.remember_reset(stream);
            return Ok(None);
        }
        if self.streams.len() >= self.settings.max_concurrent_streams as usize {
            frame::put_rst_stream(&mut self.out, stream, code::REFUSED_STREAM);
            self.remember_reset(stream);
            return Ok(None);
        }
        // Counted once accepted: refused streams would dilute the rapid-reset ratio.
        self.opened += 1;
        let content_length = match check {
            Check::Request { content_length } => content_length,
            Check::TooLarge => {
                self.insert(stream, !end_stream, None);
                self.send_headers(stream, TOO_LARGE, true);
                return Ok(None);
            }
            Check::Trailers | Check::Malformed => {
                self.local_error_reset(stream, code::PROTOCOL_ERROR);
                return Ok(None);
            }
        };
        if end_stream && content_length.is_some_and(|l| l != 0) {
            self.local_error_reset(stream, code::PROTOCOL_ERROR);
            return Ok(None);
        }
        self.insert(stream, !end_stream, content_length);
        Ok(Some(Event::Request { stream, end_stream }))
    }

    fn insert(&mut self, stream: u32, recv_open: bool, content_length: Option<u64>) {
        let mut recv_window = i64::from(self.settings.initial_window_size);
        if !self.settings_acked {
            recv_window = recv_window.max(i64::from(DEFAULT_WINDOW));
        }
        self.streams.insert(
            stream,
            Stream {
                recv_open,
                send: Send::Idle,
                recv_window,
                recv_unacked: 0,
                send_window: self.peer_initial_window,
                queue: VecDeque::new(),
                queued: 0,
                trailers: None,
                content_length,
                received: 0,
            },
        );
    }

    /// A stream error on a stream the peer had just opened (the caller never saw it).
    fn local_error_reset(&mut self, stream: u32, code: u32) {
        frame::put_rst_stream(&mut self.out, stream, code);
        self.remember_reset(stream);
        self.local_resets += 1;
    }

    /// A stream error on a stream the caller knows: RST_STREAM, and the caller is told.
    fn stream_error(&mut self, stream: u32, code: u32) -> Option<Event> {
        Some(Event::Reset {
            stream,
            code: self.reset_for(stream, code),
        })
    }

    /// Resets a stream for the peer's error on it. Counted (the next frame's check ends
    /// the connection past [`LOCAL_RESETS`], so that this stream's event is not lost).
    fn reset_for(&mut self, stream: u32, code: u32) -> u32 {
        self.local_resets += 1;
        self.drop_stream(stream, code);
        code
    }

    fn drop_stream(&mut self, stream: u32, code: u32) {
        frame::put_rst_stream(&mut self.out, stream, code);
        self.streams.remove(&stream);
        self.remember_reset(stream);
    }

    fn remember_reset(&mut self, stream: u32) {
        if self.reset.len() == RESET_MEMORY {
            self.reset.pop_front();
        }
        self.reset.push_back(stream);
    }

    /// Sends a response's (or trailers-only response's) header block on `stream`, with
    /// END_STREAM if `end_stream`. Nothing is sent on a stream that is gone.
    pub fn send_headers(&mut self, stream: u32, block: &[u8], end_stream: bool) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        if s.send != Send::Idle {
            return;
        }
        frame::put_headers(
            &mut self.out,
            stream,
            block,
            self.peer_max_frame as usize,
            end_stream,
        );
        s.send = if end_stream { Send::Done } else { Send::Open };
        if end_stream {
            self.close_if_ended(stream);
        }
    }

    /// Sends `data` on `stream` after its headers, as far as the windows allow (the rest is
    /// queued), ending the stream if `end_stream`.
    pub fn send_data(&mut self, stream: u32, data: &[u8], end_stream: bool) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        if s.send != Send::Open {
            return;
        }
        let mut data = data;
        if s.queued == 0 {
            let n = window(s.send_window, self.send_window).min(data.len());
            let ends_now = end_stream && n == data.len();
            if n > 0 || ends_now {
                frame::put_data_frames(
                    &mut self.out,
                    stream,
                    &data[..n],
                    self.peer_max_frame as usize,
                    ends_now,
                );
                s.send_window -= n as i64;
                self.send_window -= n as i64;
                data = &data[n..];
                if ends_now {
                    s.send = Send::Done;
                    self.close_if_ended(stream);
                    return;
                }
            }
        }
        if !data.is_empty() {
            if s.queued == 0 {
                self.blocked.push_back(stream);
            }
            s.queued += data.len();
            s.queue.push_back(Bytes::copy_from_slice(data));
        }
        if end_stream {
            s.send = Send::Ending;
        }
    }

    /// Sends trailers on `stream` (END_STREAM), after any data queued on it.
    pub fn send_trailers(&mut self, stream: u32, block: &[u8]) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        if s.send != Send::Open {
            return;
        }
        if s.queued > 0 {
            s.trailers = Some(Bytes::copy_from_slice(block));
            s.send = Send::Ending;
            return;
        }
        frame::put_headers(
            &mut self.out,
            stream,
            block,
            self.peer_max_frame as usize,
            true,
        );
        s.send = Send::Done;
        self.close_if_ended(stream);
    }

    /// Resets `stream` (`code`), e.g. when its answer failed half-way.
    pub fn reset_stream(&mut self, stream: u32, code: u32) {
        if self.streams.contains_key(&stream) {
            self.drop_stream(stream, code);
        }
    }

    /// Forgets a stream both sides ended. One whose answer ended first is reset with
    /// NO_ERROR: the peer need not send the rest of its request (§8.1).
    fn close_if_ended(&mut self, stream: u32) {
        let Some(s) = self.streams.get(&stream) else {
            return;
        };
        if s.send != Send::Done {
            return;
        }
        if s.recv_open {
            frame::put_rst_stream(&mut self.out, stream, code::NO_ERROR);
            self.remember_reset(stream);
        }
        self.streams.remove(&stream);
    }

    /// Sends what the windows now allow of the blocked streams' data, in turn.
    fn flush_blocked(&mut self) {
        for _ in 0..self.blocked.len() {
            if self.send_window <= 0 {
                break;
            }
            let Some(stream) = self.blocked.pop_front() else {
                break;
            };
            self.flush(stream);
        }
    }

    /// Sends what the windows allow of `stream`'s queue, then its end if the queue emptied.
    fn flush(&mut self, stream: u32) {
        let Some(s) = self.streams.get_mut(&stream) else {
            return;
        };
        let max_frame = self.peer_max_frame as usize;
        while let Some(front) = s.queue.front_mut() {
            let n = window(s.send_window, self.send_window).min(front.len());
            if n == 0 {
                break;
            }
            let chunk = front.split_to(n);
            if front.is_empty() {
                s.queue.pop_front();
            }
            s.queued -= n;
            let last = s.queued == 0 && s.send == Send::Ending && s.trailers.is_none();
            frame::put_data_frames(&mut self.out, stream, &chunk, max_frame, last);
            s.send_window -= n as i64;
            self.send_window -= n as i64;
        }
        if s.queued > 0 {
            if !self.blocked.contains(&stream) {
                self.blocked.push_back(stream);
            }
            return;
        }
        if s.send == Send::Ending {
            if let Some(block) = s.trailers.take() {
                frame::put_headers(&mut self.out, stream, &block, max_frame, true);
            }
            s.send = Send::Done;
            self.close_if_ended(stream);
        }
    }
}

/// The 431 answer to a request whose header list is too large (§10.5.1): `:status 431`.
const TOO_LARGE: &[u8] = b"\x08\x03431";

/// The window both a stream and the connection allow.
fn window(stream: i64, connection: i64) -> usize {
    usize::try_from(stream.min(connection)).unwrap_or(0)
}

/// The window every stream and connection start with (§6.9.2).
const DEFAULT_WINDOW: u32 = 65_535;

/// What became of a DATA frame.
enum DataTo {
    Caller,
    Reset(u32),
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
