//! The connection's protocol state driven by hand: a server's frames in, the client's
//! frames and the calls' outcomes out.
#![allow(clippy::unwrap_used)]

use std::task::Waker;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use prost::Message as _;

use super::*;
use sluice_http2::frame::{self as wire, Frame, flag, kind};

/// A server's side: its HPACK encoder and frame writers.
struct Server {
    hpack: loona_hpack::Encoder<'static>,
}

impl Server {
    fn new() -> Self {
        Self {
            hpack: loona_hpack::Encoder::new(),
        }
    }

    fn settings(params: &[(u16, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        wire::put_settings(&mut out, params);
        out
    }

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        wire::head(&mut out, payload.len(), ty, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    fn headers(&mut self, stream: u32, end: bool, fields: &[(&str, &str)]) -> Vec<u8> {
        let block = self
            .hpack
            .encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
        let flags = flag::END_HEADERS | if end { flag::END_STREAM } else { 0 };
        Self::frame(kind::HEADERS, flags, stream, &block)
    }

    /// A whole OK answer: headers, the message, trailers.
    fn answer(&mut self, stream: u32, code: PbCode) -> Vec<u8> {
        let mut out = self.headers(
            stream,
            false,
            &[(":status", "200"), ("content-type", "application/grpc")],
        );
        out.extend(Self::frame(kind::DATA, 0, stream, &message(code)));
        out.extend(self.headers(stream, true, &[("grpc-status", "0")]));
        out
    }
}

fn message(code: PbCode) -> Vec<u8> {
    let r = RateLimitResponse {
        overall_code: code.into(),
        ..Default::default()
    };
    let mut b = vec![0];
    b.extend_from_slice(&u32::try_from(r.encoded_len()).unwrap().to_be_bytes());
    r.encode(&mut b).unwrap();
    b
}

/// A connection past its handshake (the server's SETTINGS with `params` read), its
/// handshake's frames taken off `out`.
fn ready(params: &[(u16, u32)]) -> (State, Shared) {
    let mut state = State::new(super::super::request_block("h:1", "/p"));
    assert!(state.out.starts_with(wire::PREFACE));
    let s = Server::settings(params);
    assert_eq!(state.on_bytes(&s), s.len());
    assert!(state.ready());
    state.out.clear();
    (state, Shared::default())
}

/// The client's frames in `out` (emptied), as debug strings.
fn sent(state: &mut State) -> Vec<String> {
    let out = std::mem::take(&mut state.out);
    let mut at = 0;
    let mut frames = Vec::new();
    while let Some((f, used)) = wire::parse(&out[at..], 1 << 20).unwrap() {
        frames.push(match f {
            Frame::Headers { stream, .. } => format!("HEADERS {stream}"),
            Frame::Data {
                stream, end_stream, ..
            } => format!("DATA {stream} end={end_stream}"),
            other => format!("{other:?}"),
        });
        at += used;
    }
    assert_eq!(at, out.len());
    frames
}

fn submit(shared: &mut Shared) -> usize {
    shared
        .submit(Bytes::from_static(b"\0\0\0\0\x01x"), Waker::noop())
        .unwrap()
        .0
}

fn outcome(shared: &mut Shared, idx: usize) -> Option<String> {
    shared.poll_done(idx, Waker::noop()).map(|o| match o {
        Outcome::Ok => "OK".to_owned(),
        Outcome::OverLimit => "OVER_LIMIT".to_owned(),
        Outcome::Error(e) => e,
    })
}

#[test]
fn the_handshake_is_answered_and_the_server_settings_kept() {
    let mut state = State::new(super::super::request_block("h:1", "/p"));
    let frames = {
        let out = std::mem::take(&mut state.out);
        let mut at = wire::PREFACE.len();
        let mut v = Vec::new();
        while let Some((f, used)) = wire::parse(&out[at..], 1 << 20).unwrap() {
            v.push(format!("{f:?}"));
            at += used;
        }
        v
    };
    assert_eq!(frames.len(), 2, "{frames:?}"); // SETTINGS, WINDOW_UPDATE
    assert!(frames[1].contains(&format!("increment: {}", CONN_WINDOW - 65_535)));
    // Not an HTTP/2 server: its first frame is not SETTINGS.
    let ping = Server::frame(kind::PING, 0, 0, &[0; 8]);
    state.on_bytes(&ping);
    assert!(matches!(state.failed(), Some(ConnError::Protocol(_))));
}

#[test]
fn max_concurrent_streams_caps_the_streams_in_flight() {
    let (mut state, mut shared) = ready(&[(wire::setting::MAX_CONCURRENT_STREAMS, 1)]);
    let a = submit(&mut shared);
    let b = submit(&mut shared);
    state.sync(&mut shared);
    assert_eq!(sent(&mut state), ["HEADERS 1", "DATA 1 end=true"]);
    assert_eq!(outcome(&mut shared, a), None);
    let mut server = Server::new();
    state.on_bytes(&server.answer(1, PbCode::Ok));
    state.sync(&mut shared);
    assert_eq!(outcome(&mut shared, a).as_deref(), Some("OK"));
    // The second call got the freed stream.
    assert_eq!(sent(&mut state), ["HEADERS 3", "DATA 3 end=true"]);
    state.on_bytes(&server.answer(3, PbCode::OverLimit));
    state.sync(&mut shared);
    assert_eq!(outcome(&mut shared, b).as_deref(), Some("OVER_LIMIT"));
}

#[test]
fn split_padded_and_continued_answers_are_read() {
    let (mut state, mut shared) = ready(&[]);
    let a = submit(&mut shared);
    state.sync(&mut shared);
    sent(&mut state);
    let mut server = Server::new();
    // Headers in HEADERS (padded, with priority) + CONTINUATION; the message padded and
    // split over two DATA frames; trailers; all delivered a byte at a time.
    let block = server.hpack.encode([
        (&b":status"[..], &b"200"[..]),
        (b"content-type", b"application/grpc"),
    ]);
    let (first, rest) = block.split_at(2);
    let mut p = vec![2u8, 0, 0, 0, 0, 16];
    p.extend_from_slice(first);
    p.extend_from_slice(&[0, 0]);
    let mut bytes = Server::frame(kind::HEADERS, flag::PADDED | flag::PRIORITY, 1, &p);
    bytes.extend(Server::frame(
        kind::CONTINUATION,
        flag::END_HEADERS,
        1,
        rest,
    ));
    let m = message(PbCode::OverLimit);
    let (m1, m2) = m.split_at(3);
    let mut padded = vec![4u8];
    padded.extend_from_slice(m1);
    padded.extend_from_slice(&[0; 4]);
    bytes.extend(Server::frame(kind::DATA, flag::PADDED, 1, &padded));
    bytes.extend(Server::frame(kind::DATA, 0, 1, m2));
    bytes.extend(server.headers(1, true, &[("grpc-status", "0")]));
    let mut buf = Vec::new();
    for b in bytes {
        buf.push(b);
        let used = state.on_bytes(&buf);
        buf.drain(..used);
    }
    assert!(buf.is_empty());
    assert!(state.failed().is_none());
    state.sync(&mut shared);
    assert_eq!(outcome(&mut shared, a).as_deref(), Some("OVER_LIMIT"));
}

#[test]
fn statuses_and_http_errors_are_the_calls_outcomes() {
    let (mut state, mut shared) = ready(&[]);
    let calls: Vec<usize> = (0..4).map(|_| submit(&mut shared)).collect();
    state.sync(&mut shared);
    sent(&mut state);
    let mut server = Server::new();
    let mut bytes = server.headers(
        1,
        true,
        &[
            (":status", "200"),
            ("grpc-status", "3"),
            ("grpc-message", "bad%20domain"),
        ],
    );
    bytes.extend(server.headers(3, true, &[(":status", "503")]));
    bytes.extend(server.headers(5, false, &[(":status", "200")]));
    bytes.extend(Server::frame(
        kind::DATA,
        flag::END_STREAM,
        5,
        &message(PbCode::Ok),
    ));
    bytes.extend(server.headers(7, false, &[(":status", "404")]));
    state.on_bytes(&bytes);
    state.sync(&mut shared);
    let got: Vec<_> = calls
        .iter()
        .map(|&c| outcome(&mut shared, c).unwrap())
        .collect();
    assert_eq!(
        got,
        [
            "gRPC InvalidArgument: bad domain",
            "HTTP 503 Service Unavailable",
            "gRPC answer without grpc-status",
            "HTTP 404 Not Found",
        ]
    );
    // The 404 had not ended its stream: it is reset.
    assert_eq!(
        sent(&mut state),
        ["RstStream { stream: 7, code: 8 }".to_owned()]
    );
}

#[test]
fn a_call_given_up_resets_its_stream() {
    let (mut state, mut shared) = ready(&[]);
    let a = submit(&mut shared);
    state.sync(&mut shared);
    sent(&mut state);
    assert!(shared.cancel(a).is_none()); // no task waker registered in this test
    let b = submit(&mut shared);
    shared.cancel(b); // never sent: just dropped
    state.sync(&mut shared);
    assert_eq!(sent(&mut state), ["RstStream { stream: 1, code: 8 }"]);
    // The late answer is read (its headers still decoded) and dropped.
    let mut server = Server::new();
    state.on_bytes(&server.answer(1, PbCode::Ok));
    let c = submit(&mut shared);
    state.sync(&mut shared);
    assert_eq!(sent(&mut state), ["HEADERS 3", "DATA 3 end=true"]);
    state.on_bytes(&server.answer(3, PbCode::Ok));
    state.sync(&mut shared);
    assert_eq!(outcome(&mut shared, c).as_deref(), Some("OK"));
    assert!(state.failed().is_none());
}

#[test]
fn pings_are_answered_and_windows_given_back() {
    let (mut state, mut shared) = ready(&[]);
    state.on_bytes(&Server::frame(kind::PING, 0, 0, b"12345678"));
    assert_eq!(
        sent(&mut state),
        ["Ping { ack: true, payload: [49, 50, 51, 52, 53, 54, 55, 56] }"]
    );
    let a = submit(&mut shared);
    state.sync(&mut shared);
    sent(&mut state);
    let mut server = Server::new();
    state.on_bytes(&server.headers(1, false, &[(":status", "200")]));
    // A large answer, 16 KiB at a time: the stream's window comes back at half of it.
    let chunk = vec![0u8; 16_384];
    let frames = (STREAM_WINDOW / 2 / 16_384) as usize;
    for _ in 0..frames {
        state.on_bytes(&Server::frame(kind::DATA, 0, 1, &chunk));
    }
    let expect = format!(
        "WindowUpdate {{ stream: 1, increment: {} }}",
        STREAM_WINDOW / 2
    );
    assert_eq!(sent(&mut state), [expect]);
    // The connection's at half of its window, across streams.
    let mut conn_update = false;
    for _ in 0..((CONN_WINDOW / 2) as usize / chunk.len()) {
        state.on_bytes(&Server::frame(kind::DATA, 0, 99, &chunk));
        conn_update |= sent(&mut state).iter().any(|f| f.contains("stream: 0"));
    }
    assert!(conn_update);
    assert!(state.failed().is_none());
    drop(outcome(&mut shared, a));
}

#[test]
fn answers_over_4_mib_are_errors() {
    let (mut state, mut shared) = ready(&[]);
    let a = submit(&mut shared);
    state.sync(&mut shared);
    sent(&mut state);
    let mut server = Server::new();
    state.on_bytes(&server.headers(1, false, &[(":status", "200")]));
    let chunk = vec![0u8; 16_384];
    for _ in 0..=(MAX_ANSWER / chunk.len()) {
        state.on_bytes(&Server::frame(kind::DATA, 0, 1, &chunk));
    }
    state.sync(&mut shared);
    assert_eq!(
        outcome(&mut shared, a).as_deref(),
        Some("gRPC answer over 4 MiB")
    );
    assert!(
        sent(&mut state)
            .iter()
            .any(|f| f == "RstStream { stream: 1, code: 8 }")
    );
    assert!(state.failed().is_none());
}

#[test]
fn a_body_over_the_server_stream_window_is_an_error() {
    let (mut state, mut shared) = ready(&[(wire::setting::INITIAL_WINDOW_SIZE, 4)]);
    let a = submit(&mut shared); // 6 bytes
    state.sync(&mut shared);
    let got = outcome(&mut shared, a).unwrap();
    assert!(
        got.contains("over the server's stream window (4 bytes)"),
        "{got}"
    );
    assert!(sent(&mut state).is_empty());
}

#[test]
fn the_connection_window_holds_requests_back() {
    let (mut state, mut shared) = ready(&[]);
    // 65,535 bytes of connection window: 10,000 requests of 6 bytes do not fit.
    let calls: Vec<usize> = (0..12_000).map(|_| submit(&mut shared)).collect();
    state.sync(&mut shared);
    let opened = sent(&mut state).len() / 2;
    assert_eq!(opened, 65_535 / 6);
    let mut update = Vec::new();
    wire::put_window_update(&mut update, 0, 1 << 20);
    state.on_bytes(&update);
    state.sync(&mut shared);
    assert_eq!(sent(&mut state).len() / 2, calls.len() - opened);
}

#[test]
fn stream_ids_run_out_clearly() {
    let (mut state, mut shared) = ready(&[]);
    state.set_next_id(wire::MAX_31);
    let a = submit(&mut shared);
    let b = submit(&mut shared);
    state.sync(&mut shared);
    let last = wire::MAX_31;
    assert_eq!(
        sent(&mut state),
        [format!("HEADERS {last}"), format!("DATA {last} end=true")]
    );
    let used_up = "stream ids used up: 2^30 calls on one connection";
    assert_eq!(outcome(&mut shared, b).as_deref(), Some(used_up));
    assert_eq!(
        shared.submit(Bytes::new(), Waker::noop()).err().as_deref(),
        Some(used_up)
    );
    // The last stream still answers; then the connection closes.
    state.on_bytes(&Server::new().answer(last, PbCode::Ok));
    state.sync(&mut shared);
    assert_eq!(outcome(&mut shared, a).as_deref(), Some("OK"));
    assert_eq!(state.failed(), Some(&ConnError::StreamIds));
}

#[test]
fn goaway_fails_the_unprocessed_streams_and_refuses_new_calls() {
    let (mut state, mut shared) = ready(&[]);
    let calls: Vec<usize> = (0..3).map(|_| submit(&mut shared)).collect();
    state.sync(&mut shared);
    sent(&mut state);
    let mut goaway = Vec::new();
    wire::put_goaway(&mut goaway, 1, wire::code::NO_ERROR);
    state.on_bytes(&goaway);
    state.sync(&mut shared);
    assert_eq!(outcome(&mut shared, calls[0]), None); // stream 1 still answers
    for &c in &calls[1..] {
        let got = outcome(&mut shared, c).unwrap();
        assert!(
            got.starts_with("stream not processed: the server closed"),
            "{got}"
        );
    }
    let refused = shared.submit(Bytes::new(), Waker::noop()).err().unwrap();
    assert!(refused.contains("GOAWAY NO_ERROR"), "{refused}");
    let mut server = Server::new();
    state.on_bytes(&server.answer(1, PbCode::Ok));
    state.sync(&mut shared);
    assert_eq!(outcome(&mut shared, calls[0]).as_deref(), Some("OK"));
    // The last stream answered: the connection is done.
    assert!(matches!(state.failed(), Some(ConnError::GoAway { .. })));
}

#[test]
fn protocol_errors_fail_every_call_and_send_goaway() {
    let (mut state, mut shared) = ready(&[]);
    let a = submit(&mut shared);
    state.sync(&mut shared);
    sent(&mut state);
    state.on_bytes(&Server::frame(
        kind::PUSH_PROMISE,
        flag::END_HEADERS,
        1,
        &[0, 0, 0, 2],
    ));
    state.sync(&mut shared);
    let got = outcome(&mut shared, a).unwrap();
    assert!(got.contains("PUSH_PROMISE"), "{got}");
    assert_eq!(
        sent(&mut state),
        ["GoAway { last_stream: 0, code: 1, debug: [] }"]
    );
    // Further calls fail at once, with the reason.
    assert!(shared.submit(Bytes::new(), Waker::noop()).is_err());
    // A server that resets a stream fails only that call.
    let (mut state, mut shared) = ready(&[]);
    let a = submit(&mut shared);
    state.sync(&mut shared);
    state.on_bytes(&Server::frame(kind::RST_STREAM, 0, 1, &7u32.to_be_bytes()));
    state.sync(&mut shared);
    assert_eq!(
        outcome(&mut shared, a).as_deref(),
        Some("stream reset by the server: REFUSED_STREAM")
    );
    assert!(state.failed().is_none());
}

proptest::proptest! {
    /// Whatever a server sends after its SETTINGS (frame headers of every type with
    /// arbitrary flags, streams and payloads, HPACK garbage included), the connection
    /// neither panics nor loses a call: each call ends answered or failed, or waits.
    #[test]
    fn any_server_bytes_are_survived(
        frames in proptest::collection::vec(
            (0u8..12, proptest::prelude::any::<u8>(), 0u32..8, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24)),
            0..24,
        ),
    ) {
        let (mut state, mut shared) = ready(&[]);
        let calls: Vec<usize> = (0..3).map(|_| submit(&mut shared)).collect();
        state.sync(&mut shared);
        let mut bytes = Vec::new();
        for (ty, flags, stream, payload) in frames {
            bytes.extend(Server::frame(ty, flags, stream, &payload));
        }
        let used = state.on_bytes(&bytes);
        proptest::prop_assert!(used <= bytes.len());
        state.sync(&mut shared);
        if state.failed().is_some() {
            for c in calls {
                proptest::prop_assert!(outcome(&mut shared, c).is_some());
            }
        }
    }
}
