//! The server connection fed what a hostile or broken peer might send: raw bytes, and
//! random frames that are nearly right, split at random points, with a caller answering
//! at random. It must never panic, every error must leave a GOAWAY naming it at the end of
//! the output, and the output must always be whole, well-formed frames.
#![allow(clippy::unwrap_used)]

use bytes::BytesMut;
use proptest::collection::vec;
use proptest::prelude::*;
use sluice_http2::frame::{self, Frame, code, kind, setting};
use sluice_http2::hpack;
use sluice_http2::server::{Connection, Event, PREFACE, Settings};

/// How the caller answers requests, in turn.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// Headers, `n` bytes of data, END_STREAM on the data.
    Body(u16),
    /// Headers, `n` bytes of data, trailers.
    Trailers(u16),
    /// A trailers-only answer.
    HeadersOnly,
    /// Reset by the caller.
    Reset,
    /// Not answered (yet).
    Nothing,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        any::<u16>().prop_map(Answer::Body),
        any::<u16>().prop_map(Answer::Trailers),
        Just(Answer::HeadersOnly),
        Just(Answer::Reset),
        Just(Answer::Nothing),
    ]
}

/// Feeds `bytes` in the pieces `cuts` makes, answering requests as `answers` say, and
/// checks the invariants. `max_frame`: the largest frame the server may write.
fn run(
    settings: Settings,
    bytes: &[u8],
    cuts: &[usize],
    answers: &[Answer],
    go_away_at: Option<usize>,
    max_frame: u32,
) {
    let mut conn = Connection::new(settings);
    let mut input = BytesMut::new();
    let mut out = Vec::new();
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(bytes.len())).collect();
    cuts.push(bytes.len());
    cuts.sort_unstable();
    let (mut from, mut events, mut failed) = (0, 0usize, None);
    let mut next_answer = answers.iter().copied().cycle();
    for cut in cuts {
        input.extend_from_slice(&bytes[from..cut]);
        from = cut;
        loop {
            match conn.poll_event(&mut input) {
                Ok(None) => break,
                Ok(Some(e)) => {
                    events += 1;
                    if go_away_at == Some(events) {
                        conn.go_away();
                    }
                    if let Event::Request { stream, .. } = e {
                        let _ = (conn.request().path(), conn.request().fields().count());
                        respond(&mut conn, stream, next_answer.next());
                    }
                }
                Err(e) => {
                    assert!(conn.is_done());
                    failed = Some(e.code());
                    break;
                }
            }
        }
        out.append(conn.output());
        if failed.is_some() {
            break;
        }
    }
    // After an error nothing more is read or written.
    if failed.is_some() {
        input.extend_from_slice(&bytes[from..]);
        assert_eq!(conn.poll_event(&mut input), Ok(None));
        assert!(conn.output().is_empty());
    }
    let frames = parse_all(&out, max_frame);
    if let Some(code) = failed {
        let last = frames.last().unwrap();
        assert!(
            matches!(last, Frame::GoAway { code: c, .. } if *c == code),
            "{last:?} for {}",
            frame::code_name(code)
        );
    }
}

fn respond(conn: &mut Connection, stream: u32, answer: Option<Answer>) {
    let trailers = {
        let mut b = Vec::new();
        hpack::encode_literal(&mut b, 0, b"grpc-status", b"0");
        b
    };
    match answer.unwrap_or(Answer::Nothing) {
        Answer::Body(n) => {
            conn.send_headers(stream, &[0x88], false);
            conn.send_data(stream, &vec![b'b'; usize::from(n) * 2], true);
        }
        Answer::Trailers(n) => {
            conn.send_headers(stream, &[0x88], false);
            conn.send_data(stream, &vec![b't'; usize::from(n)], false);
            conn.send_trailers(stream, &trailers);
        }
        Answer::HeadersOnly => conn.send_headers(stream, &trailers, true),
        Answer::Reset => conn.reset_stream(stream, code::CANCEL),
        Answer::Nothing => {}
    }
}

/// Every frame in `out`, which must be whole and valid.
fn parse_all(mut out: &[u8], max_frame: u32) -> Vec<Frame<'_>> {
    let mut frames = Vec::new();
    while !out.is_empty() {
        let (f, used) = frame::parse(out, max_frame)
            .unwrap_or_else(|e| panic!("the server wrote a bad frame: {e}"))
            .unwrap_or_else(|| panic!("the server wrote half a frame: {out:?}"));
        frames.push(f);
        out = &out[used..];
    }
    frames
}

fn start(params: &[(u16, u32)]) -> Vec<u8> {
    let mut wire = PREFACE.to_vec();
    frame::put_settings(&mut wire, params);
    wire
}

fn raw(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::head(&mut out, payload.len(), ty, flags, stream);
    out.extend_from_slice(payload);
    out
}

/// Pieces of header blocks: valid fields, fields a request may not have, and junk.
fn block() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        6 => prop_oneof![
            Just(vec![0x82]),
            Just(vec![0x83]),
            Just(vec![0x84]),
            Just(vec![0x86]),
            Just(vec![0x87]),
            Just(vec![0x88]),
        ],
        1 => Just(vec![0xbe]), // the dynamic table's newest field, if any
        4 => "[a-zA-Z:-]{0,8}".prop_map(|v| {
            let mut b = Vec::new();
            hpack::encode_literal(&mut b, 0, v.as_bytes(), b"v");
            b
        }),
        4 => ("[a-z]{1,6}", vec(any::<u8>(), 0..40)).prop_map(|(n, v)| {
            // With incremental indexing: it enters the table.
            let mut b = vec![0x40];
            hpack::encode_str(&mut b, n.as_bytes());
            hpack::encode_str(&mut b, &v);
            b
        }),
        2 => prop_oneof![Just("0"), Just("3"), Just("x")].prop_map(|v| {
            let mut b = Vec::new();
            hpack::encode_literal(&mut b, 28, b"content-length", v.as_bytes());
            b
        }),
    ];
    // Now and then junk last.
    let junk = prop_oneof![19 => Just(vec![]), 1 => vec(any::<u8>(), 1..6)];
    (vec(piece, 0..8), junk).prop_map(|(p, j)| [p.concat(), j].concat())
}

/// A request's block: mostly valid, with random fields (some a request may not have).
fn request_block() -> impl Strategy<Value = Vec<u8>> {
    let size_update = prop_oneof![9 => Just(vec![]), 1 => Just(vec![0x3f, 0xe1, 0x1f])];
    // Regular fields a request may have, some entering the table, and the field the
    // table holds newest (after the first indexed one, anyway).
    let field = prop_oneof![
        4 => ("[a-z][a-z-]{0,6}", "[ -~]{0,20}").prop_map(|(n, v)| {
            let mut b = Vec::new();
            hpack::encode_literal(&mut b, 0, format!("x-{n}").as_bytes(), v.as_bytes());
            b
        }),
        2 => ("[a-z]{1,6}", vec(any::<u8>(), 0..40)).prop_map(|(n, v)| {
            let mut b = vec![0x40];
            hpack::encode_str(&mut b, format!("x-{n}").as_bytes());
            hpack::encode_str(&mut b, &v);
            b
        }),
        1 => Just(vec![0x40, 0x04, b'x', b'-', b'i', b'x', 0x01, b'1']),
        1 => Just(vec![0x40, 0x04, b'x', b'-', b'i', b'y', 0x01, b'2', 0xbe]),
    ];
    let fields = prop_oneof![
        6 => vec(field, 0..4).prop_map(|f| f.concat()),
        1 => block(),
    ];
    let pseudo = prop_oneof![6 => Just(vec![0x83, 0x86, 0x84]), 1 => Just(vec![])];
    (size_update, pseudo, fields).prop_map(|(s, p, b)| [s, p, b].concat())
}

/// What a client does next; compiled to frames against the streams it opened.
#[derive(Debug, Clone)]
enum Op {
    /// A new stream (the next odd id, or a random one) with this block.
    Open {
        block: Vec<u8>,
        end_stream: bool,
        max_frame: usize,
        skip: u32,
    },
    /// On the `k`-th stream opened lately.
    Data {
        k: usize,
        len: usize,
        end: bool,
    },
    Trailers {
        k: usize,
        block: Vec<u8>,
    },
    Rst {
        k: usize,
        code: u32,
    },
    Window {
        k: Option<usize>,
        increment: u32,
    },
    Settings(Vec<(u16, u32)>),
    Ping([u8; 8]),
    /// Anything at all.
    Junk {
        ty: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let k = || 0usize..4;
    let setting = prop_oneof![
        (Just(setting::INITIAL_WINDOW_SIZE), 0u32..200_000),
        (Just(setting::MAX_FRAME_SIZE), 16_384u32..40_000),
        (Just(setting::HEADER_TABLE_SIZE), 0u32..8_192),
        (Just(setting::ENABLE_PUSH), 0u32..2),
        (10u16..12, any::<u32>()),
        (0u16..10, any::<u32>()).prop_filter("rare", |(_, v)| v % 4 == 0),
    ];
    prop_oneof![
        12 => (request_block(), any::<bool>(), 1usize..64, prop_oneof![9 => Just(0u32), 1 => 0u32..4])
            .prop_map(|(block, end_stream, max_frame, skip)| Op::Open { block, end_stream, max_frame, skip }),
        12 => (k(), prop_oneof![0usize..100, 0usize..70_000], any::<bool>())
            .prop_map(|(k, len, end)| Op::Data { k, len, end }),
        2 => (k(), block()).prop_map(|(k, block)| Op::Trailers { k, block }),
        2 => (k(), 0u32..14).prop_map(|(k, code)| Op::Rst { k, code }),
        8 => (proptest::option::of(k()), prop_oneof![9 => 1u32..100_000, 1 => any::<u32>()])
            .prop_map(|(k, increment)| Op::Window { k, increment }),
        2 => vec(setting, 0..3).prop_map(Op::Settings),
        2 => any::<[u8; 8]>().prop_map(Op::Ping),
        1 => (0u8..12, any::<u8>(), 0u32..20, vec(any::<u8>(), 0..24))
            .prop_map(|(ty, flags, stream, payload)| Op::Junk { ty, flags, stream, payload }),
    ]
}

/// `ops` as the bytes a client would write: frames on streams only while the client has
/// them open (a stream ends with END_STREAM or RST_STREAM), unless junk says otherwise.
fn compile(ops: &[Op]) -> Vec<u8> {
    let (mut out, mut open, mut next) = (Vec::new(), Vec::<u32>::new(), 1u32);
    // The `k`-th stream open, newest first; with `end`, no longer open.
    let on = |open: &mut Vec<u32>, k: usize, end: bool| {
        let i = open.len().checked_sub(1 + k % open.len().max(1))?;
        Some(if end { open.remove(i) } else { open[i] })
    };
    for op in ops {
        match op {
            Op::Open {
                block,
                end_stream,
                max_frame,
                skip,
            } => {
                next += 2 * skip;
                frame::put_headers(&mut out, next, block, *max_frame, *end_stream);
                if !end_stream {
                    open.push(next);
                }
                next += 2;
            }
            Op::Data { k, len, end } => {
                if let Some(s) = on(&mut open, *k, *end) {
                    frame::put_data_frames(&mut out, s, &vec![b'd'; *len], 16_384, *end);
                }
            }
            Op::Trailers { k, block } => {
                if let Some(s) = on(&mut open, *k, true) {
                    frame::put_headers(&mut out, s, block, 16_384, true);
                }
            }
            Op::Rst { k, code } => {
                if let Some(s) = on(&mut open, *k, true) {
                    frame::put_rst_stream(&mut out, s, *code);
                }
            }
            Op::Window { k: None, increment } => {
                frame::put_window_update(&mut out, 0, *increment);
            }
            Op::Window {
                k: Some(k),
                increment,
            } => {
                if let Some(s) = on(&mut open, *k, false) {
                    frame::put_window_update(&mut out, s, *increment);
                }
            }
            Op::Settings(p) => frame::put_settings(&mut out, p),
            Op::Ping(p) => out.extend(raw(kind::PING, 0, 0, p)),
            Op::Junk {
                ty,
                flags,
                stream,
                payload,
            } => out.extend(raw(*ty, *flags, *stream, payload)),
        }
    }
    out
}

/// The largest SETTINGS_MAX_FRAME_SIZE in `bytes` (frames after the preface), so the
/// largest frame the server may write.
fn max_frame_in(mut bytes: &[u8]) -> u32 {
    let mut max = frame::DEFAULT_MAX_FRAME;
    while let Ok(Some((f, used))) = frame::parse(bytes, (1 << 24) - 1) {
        if let Frame::Settings { ack: false, params } = f {
            for (id, v) in frame::settings(params) {
                if id == setting::MAX_FRAME_SIZE && v < 1 << 24 {
                    max = max.max(v);
                }
            }
        }
        bytes = &bytes[used..];
    }
    max
}

fn small_settings() -> impl Strategy<Value = Settings> {
    (1u32..6, 0u32..4, 0u32..3, 50u32..2_000).prop_map(|(streams, w, cw, list)| Settings {
        max_concurrent_streams: streams,
        initial_window_size: [1 << 20, 65_535, 1_000, 20_000][w as usize],
        connection_window_size: [1 << 20, 65_535, 100_000][cw as usize],
        max_frame_size: 16_384,
        max_header_list_size: list,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn raw_bytes_never_panic(
        bytes in vec(any::<u8>(), 0..600),
        cuts in vec(0usize..600, 0..8),
        preface in 0u8..3,
    ) {
        // Raw; after a valid preface and SETTINGS; after the preface only.
        let wire = match preface {
            0 => bytes,
            1 => [start(&[]), bytes].concat(),
            _ => [PREFACE.to_vec(), bytes].concat(),
        };
        run(Settings::default(), &wire, &cuts, &[Answer::Body(100)], None, 16_384);
    }

    #[test]
    fn random_frames_never_panic_and_output_parses(
        params in vec((prop_oneof![Just(1u16), Just(3), Just(4), Just(6)], 0u32..70_000), 0..3),
        ops in vec(op(), 0..40),
        cuts in vec(0usize..200_000, 0..12),
        answers in vec(answer(), 1..6),
        go_away_at in proptest::option::of(1usize..30),
        settings in prop_oneof![Just(Settings::default()), small_settings()],
    ) {
        let wire = [start(&params), compile(&ops)].concat();
        let max_frame = max_frame_in(&wire[PREFACE.len()..]);
        run(settings, &wire, &cuts, &answers, go_away_at, max_frame);
    }
}
