//! The server connection driven by hand-written client frames; every assertion is on the
//! exact frames the server wrote (parsed back with [`frame::parse`]).
#![allow(clippy::unwrap_used)]

use bytes::BytesMut;

use super::*;
use crate::frame::{flag, kind};
use crate::hpack::{encode_literal, encode_str};

/// A frame the server wrote, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    Settings(Vec<(u16, u32)>),
    SettingsAck,
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
    Window(u32, u32),
    Rst(u32, u32),
    GoAway(u32, u32),
    /// A whole header block in one HEADERS (stream, END_STREAM, block): every block the
    /// server sends here fits one frame.
    Headers(u32, bool, Vec<u8>),
    Data(u32, bool, Vec<u8>),
}

/// The server's output as frames; it must be whole frames, nothing left over.
fn parse_out(mut bytes: &[u8]) -> Vec<Out> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (f, used) = frame::parse(bytes, (1 << 24) - 1).unwrap().unwrap();
        out.push(match f {
            Frame::Settings { ack: true, .. } => Out::SettingsAck,
            Frame::Settings { params, .. } => Out::Settings(frame::settings(params).collect()),
            Frame::Ping { ack, payload } => Out::Ping { ack, payload },
            Frame::WindowUpdate { stream, increment } => Out::Window(stream, increment),
            Frame::RstStream { stream, code } => Out::Rst(stream, code),
            Frame::GoAway {
                last_stream, code, ..
            } => Out::GoAway(last_stream, code),
            Frame::Headers {
                stream,
                end_stream,
                end_headers: true,
                block,
            } => Out::Headers(stream, end_stream, block.to_vec()),
            Frame::Data {
                stream,
                end_stream,
                data,
                ..
            } => Out::Data(stream, end_stream, data.to_vec()),
            other => panic!("the server wrote {other:?}"),
        });
        bytes = &bytes[used..];
    }
    out
}

/// A client peer: the connection under test and the bytes not yet consumed.
struct Peer {
    conn: Connection,
    input: BytesMut,
}

impl Peer {
    /// A connection before the client's preface.
    fn bare(settings: Settings) -> Self {
        Self {
            conn: Connection::new(settings),
            input: BytesMut::new(),
        }
    }

    /// A connection past the preface and an empty client SETTINGS, its output taken.
    fn new(settings: Settings) -> Self {
        Self::with(settings, &[])
    }

    /// The same with the client's SETTINGS parameters `params` (and its ACK of the
    /// server's).
    fn with(settings: Settings, params: &[(u16, u32)]) -> Self {
        let mut p = Self::bare(settings);
        let mut wire = PREFACE.to_vec();
        wire.extend(settings_frame(params));
        wire.extend(raw(kind::SETTINGS, flag::ACK, 0, &[]));
        assert_eq!(p.ok(&wire), []);
        assert_eq!(p.take().last(), Some(&Out::SettingsAck));
        p
    }

    /// Feeds `bytes` and polls until no whole frame is left or the connection fails.
    fn feed(&mut self, bytes: &[u8]) -> (Vec<Event>, Result<(), ConnError>) {
        self.input.extend_from_slice(bytes);
        let mut events = Vec::new();
        loop {
            match self.conn.poll_event(&mut self.input) {
                Ok(Some(e)) => events.push(e),
                Ok(None) => return (events, Ok(())),
                Err(e) => return (events, Err(e)),
            }
        }
    }

    fn ok(&mut self, bytes: &[u8]) -> Vec<Event> {
        let (events, r) = self.feed(bytes);
        r.unwrap();
        events
    }

    /// Feeds `bytes`, which must end the connection: the error, and the GOAWAY's
    /// (last stream, code), which must be the last frame written.
    fn fail(&mut self, bytes: &[u8]) -> (ConnError, (u32, u32)) {
        let (_, r) = self.feed(bytes);
        let e = r.unwrap_err();
        let out = self.take();
        let Some(&Out::GoAway(last, code)) = out.last() else {
            panic!("no GOAWAY at the end of {out:?}")
        };
        assert_eq!(code, e.code());
        assert!(self.conn.is_done());
        (e, (last, code))
    }

    fn take(&mut self) -> Vec<Out> {
        parse_out(&std::mem::take(self.conn.output()))
    }
}

/// The default settings, changed by `f`.
fn set(f: impl FnOnce(&mut Settings)) -> Settings {
    let mut s = Settings::default();
    f(&mut s);
    s
}

fn settings_frame(params: &[(u16, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::put_settings(&mut out, params);
    out
}

fn headers(stream: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let mut out = Vec::new();
    frame::put_headers(&mut out, stream, block, 16_384, end_stream);
    out
}

fn data(stream: u32, body: &[u8], end_stream: bool) -> Vec<u8> {
    let mut out = Vec::new();
    frame::put_data_frames(&mut out, stream, body, 16_384, end_stream);
    out
}

fn raw(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::head(&mut out, payload.len(), ty, flags, stream);
    out.extend_from_slice(payload);
    out
}

fn rst(stream: u32, code: u32) -> Vec<u8> {
    raw(kind::RST_STREAM, 0, stream, &code.to_be_bytes())
}

fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    raw(kind::WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

/// `:method POST`, `:scheme http`, `:path` `path`.
fn post(path: &[u8]) -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    encode_literal(&mut b, 4, b":path", path);
    b
}

/// `block` with the field `name: value` appended as a literal without indexing.
fn with(mut block: Vec<u8>, name: &[u8], value: &[u8]) -> Vec<u8> {
    encode_literal(&mut block, 0, name, value);
    block
}

/// A literal with incremental indexing (RFC 7541 §6.2.1): it enters the peer's table.
fn indexed_literal(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    block.push(0x40);
    encode_str(block, name);
    encode_str(block, value);
}

fn reset(stream: u32, code: u32) -> Event {
    Event::Reset { stream, code }
}

fn request(stream: u32, end_stream: bool) -> Event {
    Event::Request { stream, end_stream }
}

const GET_ROOT: &[u8] = &[0x82, 0x86, 0x84]; // GET http /
const STATUS_200: &[u8] = &[0x88];

fn trailer_block() -> Vec<u8> {
    let mut b = Vec::new();
    encode_literal(&mut b, 0, b"grpc-status", b"0");
    b
}

/// The DATA payloads in `out`, joined, and whether the last had END_STREAM.
fn data_of(out: &[Out], stream: u32) -> (Vec<u8>, bool) {
    let (mut body, mut end) = (Vec::new(), false);
    for f in out {
        match f {
            Out::Data(s, e, d) if *s == stream => {
                body.extend_from_slice(d);
                end = *e;
            }
            Out::Data(..) | Out::Window(..) => {}
            other => panic!("not DATA: {other:?}"),
        }
    }
    (body, end)
}

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

// §3.4: the preface.

#[test]
fn bad_preface_bytes_are_goaway_protocol_error() {
    let mut c = Connection::new(Settings::default());
    let mut input = BytesMut::from(&PREFACE[..10]);
    assert_eq!(c.poll_event(&mut input), Ok(None), "a prefix waits");
    input.extend_from_slice(b"HTTP/1.1\r\n");
    assert_eq!(c.poll_event(&mut input), Err(ConnError::Preface));
    let out = parse_out(c.output());
    assert_eq!(out.last(), Some(&Out::GoAway(0, code::PROTOCOL_ERROR)));
    assert!(c.is_done());
    assert_eq!(
        c.poll_event(&mut input),
        Ok(None),
        "a failed connection reads no more"
    );
}

#[test]
fn preface_must_be_followed_by_settings() {
    let ping = raw(kind::PING, 0, 0, &[0; 8]);
    let settings_ack = raw(kind::SETTINGS, flag::ACK, 0, &[]);
    for first in [ping, settings_ack, headers(1, GET_ROOT, true)] {
        let mut c = Connection::new(Settings::default());
        let mut input = BytesMut::from(PREFACE);
        input.extend_from_slice(&first);
        assert_eq!(c.poll_event(&mut input), Err(ConnError::Preface));
        let out = parse_out(c.output());
        assert_eq!(out.last(), Some(&Out::GoAway(0, code::PROTOCOL_ERROR)));
    }
}

#[test]
fn settings_are_advertised_and_acked() {
    let s = set(|s| s.max_concurrent_streams = 7);
    let mut c = Connection::new(s);
    assert_eq!(
        parse_out(&std::mem::take(c.output())),
        [
            Out::Settings(vec![
                (setting::ENABLE_PUSH, 0),
                (setting::MAX_CONCURRENT_STREAMS, 7),
                (setting::INITIAL_WINDOW_SIZE, 1 << 20),
                (setting::MAX_FRAME_SIZE, 16_384),
                (setting::MAX_HEADER_LIST_SIZE, 16 << 10),
            ]),
            // The connection's window grown to 1 MiB (§6.9.2: SETTINGS cannot).
            Out::Window(0, (1 << 20) - 65_535),
        ]
    );
    let mut input = BytesMut::from(PREFACE);
    input.extend_from_slice(&settings_frame(&[(setting::HEADER_TABLE_SIZE, 0)]));
    assert_eq!(c.poll_event(&mut input), Ok(None));
    assert_eq!(parse_out(c.output()), [Out::SettingsAck]);
}

#[test]
fn ping_is_echoed_and_ping_ack_is_not() {
    let mut p = Peer::new(Settings::default());
    p.ok(&raw(kind::PING, 0, 0, b"abcdefgh"));
    p.ok(&raw(kind::PING, flag::ACK, 0, b"ijklmnop"));
    assert_eq!(
        p.take(),
        [Out::Ping {
            ack: true,
            payload: *b"abcdefgh"
        }]
    );
}

// §8.3: requests.

#[test]
fn request_fields_are_read() {
    let mut p = Peer::new(Settings::default());
    let mut block = vec![0x83, 0x87]; // POST https
    encode_literal(&mut block, 1, b":authority", b"example.com");
    encode_literal(&mut block, 4, b":path", b"/sluice.v1/Check?x=1");
    encode_literal(&mut block, 31, b"content-type", b"application/grpc");
    encode_literal(&mut block, 0, b"te", b"trailers");
    encode_literal(&mut block, 0, b"x-custom", b"");
    p.input.extend_from_slice(&headers(1, &block, false));
    let e = p.conn.poll_event(&mut p.input).unwrap();
    assert_eq!(e, Some(request(1, false)));
    let r = p.conn.request();
    assert_eq!(r.method(), b"POST");
    assert_eq!(r.scheme(), b"https");
    assert_eq!(r.authority(), Some(&b"example.com"[..]));
    assert_eq!(r.path(), b"/sluice.v1/Check?x=1");
    assert_eq!(
        r.fields().collect::<Vec<_>>(),
        [
            (&b"content-type"[..], &b"application/grpc"[..]),
            (b"te", b"trailers"),
            (b"x-custom", b""),
        ]
    );
    assert_eq!(r.get(b"te"), Some(&b"trailers"[..]));
    assert_eq!(r.get(b"x-missing"), None);
    assert_eq!(p.take(), []);
}

/// A request with a body in several DATA frames (one padded) and trailers.
fn request_with_body() -> Vec<u8> {
    let mut wire = PREFACE.to_vec();
    wire.extend(settings_frame(&[]));
    wire.extend(headers(1, &post(b"/"), false));
    wire.extend(data(1, &body(40_000), false)); // 3 frames
    wire.extend(raw(kind::DATA, flag::PADDED, 1, b"\x02xyz\0\0"));
    wire.extend(headers(1, &with(Vec::new(), b"x-trailer", b"t"), true));
    wire
}

#[test]
fn body_and_trailers_arrive_in_order() {
    let mut p = Peer::bare(Settings::default());
    let events = p.ok(&request_with_body());
    let mut got = Vec::new();
    for e in &events[1..events.len() - 1] {
        let Event::Data {
            stream: 1,
            data,
            end_stream: false,
        } = e
        else {
            panic!("{e:?}")
        };
        got.extend_from_slice(data);
    }
    let mut want = body(40_000);
    want.extend_from_slice(b"xyz");
    assert_eq!(got, want);
    assert_eq!(events.len(), 6, "request, 4 DATA, trailers");
    assert_eq!(events[5], Event::Trailers { stream: 1 });
    assert_eq!(p.conn.request().get(b"x-trailer"), Some(&b"t"[..]));
    assert_eq!(p.conn.request().path(), b"");
}

#[test]
fn bytes_fed_one_at_a_time_give_the_same_events() {
    let wire = request_with_body();
    let mut whole = Peer::bare(Settings::default());
    let want = whole.ok(&wire);
    let mut split = Peer::bare(Settings::default());
    let mut got = Vec::new();
    for b in &wire {
        got.extend(split.ok(&[*b]));
    }
    assert_eq!(got, want);
    assert_eq!(split.take(), whole.take());
}

// §6.9: flow control, receiving.

#[test]
fn window_updates_once_half_the_default_windows_are_used() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, &post(b"/"), false));
    let half = 1 << 19;
    p.ok(&data(1, &vec![0; half - 1], false));
    assert_eq!(p.take(), []);
    p.ok(&data(1, &[0], false));
    assert_eq!(
        p.take(),
        [Out::Window(0, half as u32), Out::Window(1, 1 << 19)]
    );
    p.ok(&data(1, &vec![0; half - 1], false));
    assert_eq!(p.take(), [], "given back once, not per frame");
}

#[test]
fn empty_data_gives_no_window_update_of_zero() {
    // With windows so small that half is 0, an empty DATA frame must not bring a
    // WINDOW_UPDATE of 0, which the peer takes as an error (§6.9).
    let mut p = Peer::new(set(|s| {
        s.initial_window_size = 1;
        s.connection_window_size = 1;
    }));
    p.ok(&headers(1, &post(b"/"), false));
    p.ok(&data(1, b"", false));
    assert_eq!(p.take(), []);
}

#[test]
fn connection_window_update_alone() {
    // Streams' windows far larger: only the connection's comes back.
    let mut p = Peer::new(set(|s| s.initial_window_size = 4 << 20));
    p.ok(&headers(1, &post(b"/"), false));
    p.ok(&data(1, &vec![0; 31 * 16_384], false));
    assert_eq!(p.take(), []);
    p.ok(&data(1, &vec![0; 16_384], false));
    assert_eq!(p.take(), [Out::Window(0, 1 << 19)]);
}

#[test]
fn stream_window_update_alone_counts_padding() {
    let mut p = Peer::new(set(|s| {
        s.initial_window_size = 65_536;
        s.connection_window_size = 4 << 20;
    }));
    p.ok(&headers(1, &post(b"/"), false));
    p.ok(&data(1, &vec![0; 32_765], false));
    assert_eq!(p.take(), []);
    // 3 bytes of frame, 1 of data: padding counts (§6.1).
    p.ok(&raw(kind::DATA, flag::PADDED, 1, b"\x01d\0"));
    assert_eq!(p.take(), [Out::Window(1, 32_768)]);
}

#[test]
fn data_beyond_the_connection_window_is_flow_control_error() {
    let s = set(|s| {
        s.connection_window_size = 65_535;
        s.max_frame_size = 1 << 20;
    });
    let mut p = Peer::new(s);
    p.ok(&headers(1, &post(b"/"), false));
    p.ok(&raw(kind::DATA, 0, 1, &vec![0; 65_535]));
    assert_eq!(p.take(), [Out::Window(0, 65_535)]);

    let mut p = Peer::new(s);
    p.ok(&headers(1, &post(b"/"), false));
    let (e, goaway) = p.fail(&raw(kind::DATA, 0, 1, &vec![0; 65_536]));
    assert!(matches!(e, ConnError::FlowControl(_)));
    assert_eq!(goaway, (1, code::FLOW_CONTROL_ERROR));
}

#[test]
fn data_beyond_a_stream_window_resets_it() {
    let mut p = Peer::new(set(|s| s.initial_window_size = 1_000));
    p.ok(&headers(1, &post(b"/"), false));
    p.ok(&headers(3, &post(b"/"), false));
    assert_eq!(p.ok(&data(1, &[0; 1_000], false)).len(), 1);
    assert_eq!(p.take(), [Out::Window(1, 1_000)]);
    let events = p.ok(&data(3, &[0; 1_001], false));
    assert_eq!(events, [reset(3, code::FLOW_CONTROL_ERROR)]);
    assert_eq!(p.take(), [Out::Rst(3, code::FLOW_CONTROL_ERROR)]);
    // What the peer sent before it saw the reset is ignored (§5.4.2).
    assert_eq!(p.ok(&data(3, b"late", true)), []);
    assert_eq!(p.take(), []);
}

// §6.9: flow control, sending.

#[test]
fn response_beyond_the_peer_windows_waits_for_window_updates() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, GET_ROOT, true));
    let want = body(100_000);
    p.conn.send_headers(1, STATUS_200, false);
    p.conn.send_data(1, &want, false);
    p.conn.send_trailers(1, &trailer_block());
    let out = p.take();
    assert_eq!(out[0], Out::Headers(1, false, STATUS_200.to_vec()));
    let (mut sent, end) = data_of(&out[1..], 1);
    assert_eq!((sent.len(), end), (65_535, false), "the default window");
    assert!(
        out[1..]
            .iter()
            .all(|f| matches!(f, Out::Data(1, false, d) if d.len() <= 16_384))
    );
    assert_eq!(p.conn.queued(1), 100_000 - 65_535);

    // The stream's window alone does not do: the connection's is spent too.
    p.ok(&window_update(1, 40_000));
    assert_eq!(p.take(), []);
    p.ok(&window_update(0, 20_000));
    let (more, end) = data_of(&p.take(), 1);
    assert_eq!((more.len(), end), (20_000, false));
    sent.extend(more);
    p.ok(&window_update(0, 100_000));
    let out = p.take();
    let (last, trailers) = out.split_at(out.len() - 1);
    let (more, end) = data_of(last, 1);
    assert_eq!((more.len(), end), (14_465, false));
    sent.extend(more);
    assert_eq!(sent, want);
    assert_eq!(trailers, [Out::Headers(1, true, trailer_block())]);
    assert_eq!((p.conn.queued(1), p.conn.open_streams()), (0, 0));
}

#[test]
fn response_beyond_a_small_initial_window() {
    let mut p = Peer::with(
        Settings::default(),
        &[(setting::INITIAL_WINDOW_SIZE, 1_000)],
    );
    p.ok(&headers(1, GET_ROOT, true));
    p.conn.send_headers(1, STATUS_200, false);
    p.conn.send_data(1, &body(3_000), true);
    let out = p.take();
    assert_eq!(out[1..], [Out::Data(1, false, body(1_000))]);
    p.ok(&window_update(1, 1_000));
    assert_eq!(
        p.take(),
        [Out::Data(1, false, body(2_000)[1_000..].to_vec())]
    );
    assert_eq!(p.conn.open_streams(), 1);
    p.ok(&window_update(1, 5_000));
    assert_eq!(
        p.take(),
        [Out::Data(1, true, body(3_000)[2_000..].to_vec())]
    );
    assert_eq!(p.conn.open_streams(), 0);
}

#[test]
fn initial_window_size_change_moves_open_streams_windows() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, GET_ROOT, true));
    p.conn.send_headers(1, STATUS_200, false);
    p.conn.send_data(1, &[1; 10_000], false);
    assert_eq!(p.take().len(), 2);
    // 65,535 → 5,000: the stream's window is 5,000 - 10,000 (§6.9.2).
    p.ok(&settings_frame(&[(setting::INITIAL_WINDOW_SIZE, 5_000)]));
    assert_eq!(p.take(), [Out::SettingsAck]);
    p.conn.send_data(1, &[2; 100], false);
    assert_eq!(p.take(), []);
    p.ok(&window_update(1, 5_000));
    assert_eq!(p.take(), [], "back to 0");
    // Raising the setting by 60 opens the stream's window by 60.
    p.ok(&settings_frame(&[(setting::INITIAL_WINDOW_SIZE, 5_060)]));
    assert_eq!(
        p.take(),
        [Out::SettingsAck, Out::Data(1, false, vec![2; 60])]
    );
    p.ok(&window_update(1, 40));
    assert_eq!(p.take(), [Out::Data(1, false, vec![2; 40])]);
    assert_eq!(p.conn.queued(1), 0);
}

#[test]
fn window_overflows() {
    // §6.9.1: a stream's window past 2^31 - 1 resets it; the connection's ends it.
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, &post(b"/"), false));
    let events = p.ok(&window_update(1, frame::MAX_31));
    assert_eq!(events, [reset(1, code::FLOW_CONTROL_ERROR)]);
    assert_eq!(p.take(), [Out::Rst(1, code::FLOW_CONTROL_ERROR)]);
    let (_, goaway) = p.fail(&window_update(0, frame::MAX_31));
    assert_eq!(goaway, (1, code::FLOW_CONTROL_ERROR));

    let mut p = Peer::new(Settings::default());
    let (_, goaway) = p.fail(&window_update(0, 0));
    assert_eq!(goaway, (0, code::PROTOCOL_ERROR));
}

// §6.5.2: the peer's settings.

#[test]
fn max_frame_size_out_of_range_is_protocol_error() {
    for bad in [16_383, 1 << 24] {
        let mut p = Peer::new(Settings::default());
        let (_, goaway) = p.fail(&settings_frame(&[(setting::MAX_FRAME_SIZE, bad)]));
        assert_eq!(goaway, (0, code::PROTOCOL_ERROR), "{bad}");
    }
    // In range, it is used: a 20,000-byte DATA in one frame.
    let mut p = Peer::with(
        Settings::default(),
        &[
            (setting::MAX_FRAME_SIZE, 20_000),
            (setting::INITIAL_WINDOW_SIZE, 1 << 20),
        ],
    );
    p.ok(&headers(1, GET_ROOT, true));
    p.conn.send_headers(1, STATUS_200, false);
    p.conn.send_data(1, &[7; 20_000], true);
    assert_eq!(p.take()[1..], [Out::Data(1, true, vec![7; 20_000])]);
}

#[test]
fn enable_push_above_1_is_protocol_error() {
    let mut p = Peer::new(Settings::default());
    let (_, goaway) = p.fail(&settings_frame(&[(setting::ENABLE_PUSH, 2)]));
    assert_eq!(goaway, (0, code::PROTOCOL_ERROR));
}

#[test]
fn initial_window_size_above_2_31_is_flow_control_error() {
    let mut p = Peer::new(Settings::default());
    let (_, goaway) = p.fail(&settings_frame(&[(setting::INITIAL_WINDOW_SIZE, 1 << 31)]));
    assert_eq!(goaway, (0, code::FLOW_CONTROL_ERROR));
}

// §5.1: stream states.

#[test]
fn push_promise_from_a_client_is_protocol_error() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, GET_ROOT, false));
    let (_, goaway) = p.fail(&raw(
        kind::PUSH_PROMISE,
        flag::END_HEADERS,
        1,
        &[0, 0, 0, 2],
    ));
    assert_eq!(goaway, (1, code::PROTOCOL_ERROR));
}

#[test]
fn even_stream_id_is_protocol_error() {
    let mut p = Peer::new(Settings::default());
    let (e, goaway) = p.fail(&headers(2, GET_ROOT, true));
    assert_eq!(e, ConnError::Protocol("a client stream with an even id"));
    assert_eq!(goaway, (0, code::PROTOCOL_ERROR));
}

#[test]
fn decreasing_stream_id_is_a_connection_error() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(5, GET_ROOT, false));
    // Stream 3 was closed when 5 opened (§5.1.1).
    let (e, goaway) = p.fail(&headers(3, GET_ROOT, false));
    assert_eq!(e, ConnError::StreamClosed);
    assert_eq!(goaway, (5, code::STREAM_CLOSED));
}

#[test]
fn frames_on_idle_streams_are_protocol_errors() {
    for f in [
        data(3, b"x", false),
        rst(3, code::CANCEL),
        window_update(3, 1),
    ] {
        let mut p = Peer::new(Settings::default());
        p.ok(&headers(1, &post(b"/"), false));
        let (e, goaway) = p.fail(&f);
        assert_eq!(e, ConnError::Protocol("a frame on an idle stream"));
        assert_eq!(goaway, (1, code::PROTOCOL_ERROR));
    }
    // PRIORITY may be sent on an idle stream (§5.1).
    let mut p = Peer::new(Settings::default());
    assert_eq!(p.ok(&raw(kind::PRIORITY, 0, 9, &[0, 0, 0, 0, 16])), []);
    assert_eq!(p.take(), []);
}

#[test]
fn streams_past_max_concurrent_are_refused() {
    let mut p = Peer::new(set(|s| s.max_concurrent_streams = 2));
    assert_eq!(p.ok(&headers(1, &post(b"/"), false)).len(), 1);
    assert_eq!(p.ok(&headers(3, &post(b"/"), false)).len(), 1);
    assert_eq!(p.ok(&headers(5, &post(b"/"), false)), []);
    assert_eq!(p.take(), [Out::Rst(5, code::REFUSED_STREAM)]);
    // Its body, sent before the client saw the refusal, is ignored.
    assert_eq!(p.ok(&data(5, b"body", true)), []);
    // Once stream 1 ends both ways, there is room again.
    p.ok(&data(1, b"", true));
    p.conn.send_headers(1, STATUS_200, true);
    p.take();
    assert_eq!(p.ok(&headers(7, GET_ROOT, true)), [request(7, true)]);
    assert_eq!(p.take(), []);
}

#[test]
fn a_refused_streams_body_is_ignored_after_many_more_refusals() {
    // A client may open hundreds of streams before it sees the limit; the bodies of the
    // first refused ones still arrive after the last is refused.
    let mut p = Peer::new(set(|s| s.max_concurrent_streams = 1));
    assert_eq!(p.ok(&headers(1, &post(b"/"), false)).len(), 1);
    for id in (3..1000).step_by(2) {
        assert_eq!(p.ok(&headers(id, &post(b"/"), false)), []);
    }
    p.take();
    assert_eq!(p.ok(&data(3, b"body", true)), []);
    assert_eq!(p.take(), [], "ignored, not a connection error");
}

#[test]
fn peer_reset_is_an_event_and_later_answers_are_dropped() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, &post(b"/"), false));
    assert_eq!(p.ok(&rst(1, code::CANCEL)), [reset(1, code::CANCEL)]);
    p.conn.send_headers(1, STATUS_200, false);
    p.conn.send_data(1, b"x", true);
    p.conn.reset_stream(1, code::INTERNAL_ERROR);
    assert_eq!(p.take(), []);
    assert_eq!(p.conn.open_streams(), 0);
}

#[test]
fn data_after_the_request_ended_resets_stream_closed() {
    // §5.1 half-closed (remote): DATA is a stream error STREAM_CLOSED.
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, GET_ROOT, true));
    assert_eq!(p.ok(&data(1, b"x", false)), [reset(1, code::STREAM_CLOSED)]);
    assert_eq!(p.take(), [Out::Rst(1, code::STREAM_CLOSED)]);
}

// §6.10: header blocks.

#[test]
fn a_block_split_over_continuations_decodes() {
    let mut p = Peer::new(Settings::default());
    let block = with(post(b"/split"), b"x-a", b"value");
    let mut wire = Vec::new();
    frame::put_headers(&mut wire, 1, &block, 3, true);
    assert_eq!(p.ok(&wire).len(), 1);
    assert_eq!(p.conn.request().path(), b"/split");
    assert_eq!(p.conn.request().get(b"x-a"), Some(&b"value"[..]));
}

#[test]
fn continuation_flood_is_enhance_your_calm() {
    let s = set(|s| s.max_header_list_size = 100);
    let mut p = Peer::new(s);
    p.ok(&raw(kind::HEADERS, 0, 1, &[0; 50]));
    for _ in 0..3 {
        p.ok(&raw(kind::CONTINUATION, 0, 1, &[0; 50]));
    }
    assert_eq!(p.take(), [], "200 bytes: twice the limit, not past it");
    let (e, goaway) = p.fail(&raw(kind::CONTINUATION, 0, 1, &[0]));
    assert!(matches!(e, ConnError::Calm(_)));
    assert_eq!(goaway, (0, code::ENHANCE_YOUR_CALM));

    let mut p = Peer::new(s);
    let (_, goaway) = p.fail(&raw(kind::HEADERS, 0, 1, &[0; 201]));
    assert_eq!(goaway, (0, code::ENHANCE_YOUR_CALM));
}

#[test]
fn a_frame_inside_a_header_block_is_protocol_error() {
    let block = post(b"/");
    let start = raw(kind::HEADERS, 0, 1, &block[..2]);
    for between in [
        raw(kind::PING, 0, 0, &[0; 8]),
        raw(kind::CONTINUATION, flag::END_HEADERS, 3, &block[2..]),
        raw(kind::PRIORITY, 0, 1, &[0, 0, 0, 0, 16]),
        data(1, b"x", false),
    ] {
        let mut p = Peer::new(Settings::default());
        p.ok(&start);
        let (e, goaway) = p.fail(&between);
        assert_eq!(e, ConnError::Protocol("a header block interrupted"));
        assert_eq!(goaway, (0, code::PROTOCOL_ERROR));
    }
    let mut p = Peer::new(Settings::default());
    let (e, _) = p.fail(&raw(kind::CONTINUATION, flag::END_HEADERS, 1, &block));
    assert_eq!(e, ConnError::Protocol("CONTINUATION without HEADERS"));
}

#[test]
fn hpack_table_follows_refused_and_rejected_blocks() {
    let mut p = Peer::new(set(|s| {
        s.max_concurrent_streams = 1;
        s.max_header_list_size = 300;
    }));
    p.ok(&headers(1, &post(b"/"), false));
    // Refused (stream 1 is open): its field still enters the table.
    let mut b = GET_ROOT.to_vec();
    indexed_literal(&mut b, b"x-a", b"1");
    assert_eq!(p.ok(&headers(3, &b, true)), []);
    p.ok(&data(1, b"", true));
    p.conn.send_headers(1, STATUS_200, true);
    // Malformed (no :path): reset, its field indexed.
    let mut b = vec![0x82, 0x86];
    indexed_literal(&mut b, b"x-b", b"2");
    assert_eq!(p.ok(&headers(5, &b, true)), []);
    // Too large: answered 431, its field indexed.
    let mut b = GET_ROOT.to_vec();
    indexed_literal(&mut b, b"x-c", &[b'c'; 300]);
    assert_eq!(p.ok(&headers(7, &b, true)), []);
    assert_eq!(
        p.take(),
        [
            Out::Rst(3, code::REFUSED_STREAM),
            Out::Headers(1, true, STATUS_200.to_vec()),
            Out::Rst(5, code::PROTOCOL_ERROR),
            Out::Headers(7, true, TOO_LARGE.to_vec()),
        ]
    );
    // Dynamic indices 63 and 64: x-b and x-a (62 is x-c, newest).
    assert_eq!(
        p.ok(&headers(9, &[0x82, 0x86, 0x84, 0xbf, 0xc0], true))
            .len(),
        1
    );
    assert_eq!(
        p.conn.request().fields().collect::<Vec<_>>(),
        [(&b"x-b"[..], &b"2"[..]), (b"x-a", b"1")]
    );
}

// CVE-2023-44487 and its kin.

#[test]
fn rapid_reset_is_enhance_your_calm() {
    let mut wire = Vec::new();
    for i in 0..PREMATURE_RESETS as u32 - 1 {
        wire.extend(headers(2 * i + 1, GET_ROOT, false));
        wire.extend(rst(2 * i + 1, code::CANCEL));
    }
    let mut p = Peer::new(Settings::default());
    let events = p.ok(&wire);
    assert_eq!(events.len(), 2 * (PREMATURE_RESETS as usize - 1));
    assert_eq!(p.take(), []);
    let last = 2 * PREMATURE_RESETS as u32 - 1;
    p.ok(&headers(last, GET_ROOT, false));
    let (e, goaway) = p.fail(&rst(last, code::CANCEL));
    assert!(matches!(e, ConnError::Calm(_)));
    assert_eq!(goaway, (last, code::ENHANCE_YOUR_CALM));
}

#[test]
fn streams_reset_after_their_answer_are_not_rapid_reset() {
    let mut p = Peer::new(Settings::default());
    for i in 0..PREMATURE_RESETS as u32 + 10 {
        let id = 2 * i + 1;
        assert_eq!(p.ok(&headers(id, GET_ROOT, true)).len(), 1);
        p.conn.send_headers(id, STATUS_200, true);
        assert_eq!(p.ok(&rst(id, code::CANCEL)), []);
    }
    assert!(p.take().iter().all(|f| matches!(f, Out::Headers { .. })));
}

#[test]
fn too_many_local_error_resets_are_enhance_your_calm() {
    let mut wire = Vec::new();
    for i in 0..LOCAL_RESETS as u32 {
        wire.extend(headers(2 * i + 1, &[0x82, 0x86], true));
    }
    let mut p = Peer::new(Settings::default());
    assert_eq!(p.ok(&wire), []);
    assert_eq!(p.take().len(), LOCAL_RESETS as usize);
    let last = 2 * LOCAL_RESETS as u32 + 1;
    let (_, goaway) = p.fail(&headers(last, &[0x82, 0x86], true));
    assert_eq!(goaway, (last, code::ENHANCE_YOUR_CALM));
}

// §8.1: ends.

#[test]
fn answer_before_the_request_ends_resets_no_error() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, &post(b"/"), false));
    p.conn.send_headers(1, STATUS_200, false);
    p.conn.send_data(1, b"early", true);
    assert_eq!(
        p.take(),
        [
            Out::Headers(1, false, STATUS_200.to_vec()),
            Out::Data(1, true, b"early".to_vec()),
            Out::Rst(1, code::NO_ERROR),
        ]
    );
    assert_eq!(p.conn.open_streams(), 0);
    // The rest of the request, in flight: ignored, no error.
    assert_eq!(p.ok(&data(1, b"rest", true)), []);
    assert_eq!(p.ok(&headers(1, &with(Vec::new(), b"x", b"1"), true)), []);
    assert_eq!(p.take(), []);
}

#[test]
fn data_on_a_stream_closed_both_ways_is_stream_closed() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, GET_ROOT, true));
    p.conn.send_headers(1, STATUS_200, true);
    p.take();
    let (e, goaway) = p.fail(&data(1, b"x", false));
    assert_eq!(e, ConnError::StreamClosed);
    assert_eq!(goaway, (1, code::STREAM_CLOSED));
}

// §6.8: GOAWAY.

#[test]
fn go_away_finishes_open_streams_and_ignores_later_ones() {
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, &post(b"/"), false));
    p.conn.go_away();
    p.conn.go_away();
    assert_eq!(p.take(), [Out::GoAway(1, code::NO_ERROR)], "once");
    assert!(!p.conn.is_done());
    // Sent before the client saw GOAWAY: ignored, including their data.
    assert_eq!(p.ok(&headers(3, &post(b"/"), false)), []);
    assert_eq!(p.ok(&data(3, b"x", true)), []);
    assert_eq!(p.take(), []);
    assert_eq!(p.ok(&data(1, b"body", true)).len(), 1);
    assert!(!p.conn.is_done());
    p.conn.send_headers(1, STATUS_200, false);
    p.conn.send_data(1, b"answer", false);
    p.conn.send_trailers(1, &trailer_block());
    assert!(p.conn.is_done());
    assert_eq!(p.take().len(), 3);
}

#[test]
fn peer_go_away_is_done_when_streams_end() {
    let goaway = raw(kind::GOAWAY, 0, 0, &[0; 8]);
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, GET_ROOT, true));
    p.ok(&goaway);
    assert!(!p.conn.is_done());
    p.conn.send_headers(1, STATUS_200, true);
    assert!(p.conn.is_done());

    let mut p = Peer::new(Settings::default());
    assert!(!p.conn.is_done());
    p.ok(&goaway);
    assert!(p.conn.is_done());
}

#[test]
fn smaller_stream_window_applies_once_acked() {
    // §6.9.3: until it has seen the SETTINGS, a client may send up to the default 65,535.
    let s = set(|s| s.initial_window_size = 1_000);
    let mut p = Peer::bare(s);
    let mut wire = PREFACE.to_vec();
    wire.extend(settings_frame(&[]));
    wire.extend(headers(1, &post(b"/"), false));
    wire.extend(data(1, &[0; 16_384], false));
    let events = p.ok(&wire);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(events[1], Event::Data { .. }));
    // Once acked, the 1,000 holds for new streams.
    p.ok(&raw(kind::SETTINGS, flag::ACK, 0, &[]));
    p.take();
    p.ok(&headers(3, &post(b"/"), false));
    assert_eq!(
        p.ok(&data(3, &[0; 1_001], false)),
        [reset(3, code::FLOW_CONTROL_ERROR)]
    );
}

#[test]
fn streams_opened_after_peer_go_away_are_refused() {
    let mut p = Peer::new(Settings::default());
    p.ok(&raw(kind::GOAWAY, 0, 0, &[0; 8]));
    // Not served: refused, so that the client knows it may retry elsewhere (§8.7), and
    // its body, already on the way, ignored.
    assert_eq!(p.ok(&headers(1, &post(b"/"), false)), []);
    assert_eq!(p.take(), [Out::Rst(1, code::REFUSED_STREAM)]);
    assert_eq!(p.ok(&data(1, b"body", true)), []);
    assert_eq!(p.take(), []);
    assert!(p.conn.is_done());
}

// §8.3: malformed requests, their lengths, trailers and size.
#[path = "server_tests/requests.rs"]
mod requests;
