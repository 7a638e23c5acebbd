//! HTTP/2 frames (RFC 9113 §4 and §6): a parser of one frame at a time from the front of a
//! buffer (`None` until the frame is whole, so bytes may arrive split anywhere), and writers
//! of every frame either side sends. The parser checks what a frame's own bytes can break
//! (lengths, padding, the stream a type may be sent on); what depends on the connection's
//! state is the caller's.

/// What a client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Every frame starts with 9 bytes: length (24 bits), type, flags, stream id (31 bits).
pub const HEADER_LEN: usize = 9;
/// The frame size every peer accepts; the client advertises no other.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;
/// Largest stream id and window (2^31 - 1).
pub const MAX_31: u32 = (1 << 31) - 1;

/// Frame types.
pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS parameters.
pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7).
pub mod code {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const INTERNAL_ERROR: u32 = 0x2;
    pub const STREAM_CLOSED: u32 = 0x5;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// An error code's name, or its number.
pub fn code_name(code: u32) -> String {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|c| NAMES.get(c))
        .map_or_else(|| format!("error code {code:#x}"), |n| (*n).to_owned())
}

/// A frame that breaks the protocol: the connection cannot go on (a connection error of
/// RFC 9113 §5.4.1, with the code to send in GOAWAY).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Longer than the client's SETTINGS_MAX_FRAME_SIZE.
    #[error("a frame of {len} bytes, above the {max} the client accepts")]
    FrameTooLarge {
        /// The frame's payload length.
        len: u32,
        /// What the client advertised.
        max: u32,
    },
    /// A frame whose length its type does not allow.
    #[error("a {kind} frame of {len} bytes")]
    BadLength {
        /// The frame type's name.
        kind: &'static str,
        /// Its payload length.
        len: u32,
    },
    /// A frame on a stream its type may not be sent on.
    #[error("a {kind} frame on stream {stream}")]
    BadStream {
        /// The frame type's name.
        kind: &'static str,
        /// Its stream id.
        stream: u32,
    },
    /// Padding as long as the frame or longer.
    #[error("a {kind} frame whose padding is longer than its payload")]
    BadPadding {
        /// The frame type's name.
        kind: &'static str,
    },
}

impl WireError {
    /// The code to send in GOAWAY.
    pub fn code(&self) -> u32 {
        match self {
            Self::FrameTooLarge { .. } | Self::BadLength { .. } => code::FRAME_SIZE_ERROR,
            Self::BadStream { .. } | Self::BadPadding { .. } => code::PROTOCOL_ERROR,
        }
    }
}

/// One frame, borrowed from the buffer it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// DATA without its padding; `flow` is the length flow control counts (all of it).
    Data {
        stream: u32,
        end_stream: bool,
        data: &'a [u8],
        flow: u32,
    },
    /// HEADERS without padding and priority: the start of a header block.
    Headers {
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        block: &'a [u8],
    },
    /// The rest of a header block.
    Continuation {
        stream: u32,
        end_headers: bool,
        block: &'a [u8],
    },
    RstStream {
        stream: u32,
        code: u32,
    },
    /// Non-ACK SETTINGS carry parameters (read them with [`settings`]).
    Settings {
        ack: bool,
        params: &'a [u8],
    },
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        code: u32,
        debug: &'a [u8],
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    /// The client disables push; a server that pushes anyway breaks the protocol.
    PushPromise {
        stream: u32,
    },
    /// PRIORITY and unknown types, ignored (RFC 9113 §4.1, §5.5).
    Ignored {
        kind: u8,
        stream: u32,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        x.copy_from_slice(s);
    }
    u32::from_be_bytes(x)
}

/// Parses the frame at the front of `buf`: `Ok(None)` while it is incomplete, otherwise
/// the frame and the bytes it took. `max_frame` is the client's SETTINGS_MAX_FRAME_SIZE.
pub fn parse(buf: &[u8], max_frame: u32) -> Result<Option<(Frame<'_>, usize)>, WireError> {
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]);
    let (ty, flags) = (head[3], head[4]);
    let stream = u32_at(head, 5) & MAX_31;
    if len > max_frame {
        return Err(WireError::FrameTooLarge {
            len,
            max: max_frame,
        });
    }
    // `len` is at most 2^24 - 1.
    let total = HEADER_LEN + len as usize;
    let Some(payload) = buf.get(HEADER_LEN..total) else {
        return Ok(None);
    };
    let bad_len = |kind| WireError::BadLength { kind, len };
    let on_stream = |kind| {
        if stream == 0 {
            Err(WireError::BadStream { kind, stream })
        } else {
            Ok(())
        }
    };
    let on_zero = |kind| {
        if stream == 0 {
            Ok(())
        } else {
            Err(WireError::BadStream { kind, stream })
        }
    };
    let frame = match ty {
        kind::DATA => {
            on_stream("DATA")?;
            Frame::Data {
                stream,
                end_stream: flags & flag::END_STREAM != 0,
                data: unpad(payload, flags, "DATA")?,
                flow: len,
            }
        }
        kind::HEADERS => {
            on_stream("HEADERS")?;
            let mut block = unpad(payload, flags, "HEADERS")?;
            if flags & flag::PRIORITY != 0 {
                // Stream dependency (4 bytes) and weight (1 byte).
                block = block.get(5..).ok_or(bad_len("HEADERS"))?;
            }
            Frame::Headers {
                stream,
                end_stream: flags & flag::END_STREAM != 0,
                end_headers: flags & flag::END_HEADERS != 0,
                block,
            }
        }
        kind::CONTINUATION => {
            on_stream("CONTINUATION")?;
            Frame::Continuation {
                stream,
                end_headers: flags & flag::END_HEADERS != 0,
                block: payload,
            }
        }
        kind::RST_STREAM => {
            on_stream("RST_STREAM")?;
            if len != 4 {
                return Err(bad_len("RST_STREAM"));
            }
            Frame::RstStream {
                stream,
                code: u32_at(payload, 0),
            }
        }
        kind::SETTINGS => {
            on_zero("SETTINGS")?;
            let ack = flags & flag::ACK != 0;
            if !len.is_multiple_of(6) || (ack && len != 0) {
                return Err(bad_len("SETTINGS"));
            }
            Frame::Settings {
                ack,
                params: payload,
            }
        }
        kind::PING => {
            on_zero("PING")?;
            let mut p = [0u8; 8];
            if len != 8 {
                return Err(bad_len("PING"));
            }
            p.copy_from_slice(payload);
            Frame::Ping {
                ack: flags & flag::ACK != 0,
                payload: p,
            }
        }
        kind::GOAWAY => {
            on_zero("GOAWAY")?;
            if len < 8 {
                return Err(bad_len("GOAWAY"));
            }
            Frame::GoAway {
                last_stream: u32_at(payload, 0) & MAX_31,
                code: u32_at(payload, 4),
                debug: &payload[8..],
            }
        }
        kind::WINDOW_UPDATE => {
            if len != 4 {
                return Err(bad_len("WINDOW_UPDATE"));
            }
            Frame::WindowUpdate {
                stream,
                increment: u32_at(payload, 0) & MAX_31,
            }
        }
        kind::PUSH_PROMISE => Frame::PushPromise { stream },
        kind::PRIORITY => {
            on_stream("PRIORITY")?;
            if len != 5 {
                return Err(bad_len("PRIORITY"));
            }
            Frame::Ignored { kind: ty, stream }
        }
        _ => Frame::Ignored { kind: ty, stream },
    };
    Ok(Some((frame, total)))
}

/// The payload without its padding (PADDED: a length byte first, that many bytes last).
fn unpad<'a>(payload: &'a [u8], flags: u8, kind: &'static str) -> Result<&'a [u8], WireError> {
    if flags & flag::PADDED == 0 {
        return Ok(payload);
    }
    let Some((&pad, rest)) = payload.split_first() else {
        return Err(WireError::BadPadding { kind });
    };
    let pad = usize::from(pad);
    if pad > rest.len() {
        return Err(WireError::BadPadding { kind });
    }
    Ok(&rest[..rest.len() - pad])
}

/// The parameters of a SETTINGS frame's payload (a multiple of 6 bytes: checked by
/// [`parse`]).
pub fn settings(params: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    params
        .chunks_exact(6)
        .map(|p| (u16::from_be_bytes([p[0], p[1]]), u32_at(p, 2)))
}

/// Appends a frame header.
pub fn head(out: &mut Vec<u8>, len: usize, ty: u8, flags: u8, stream: u32) {
    // Callers keep `len` within the peer's frame size (below 2^24).
    let len = u32::try_from(len).unwrap_or(0).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], ty, flags]);
    out.extend_from_slice(&(stream & MAX_31).to_be_bytes());
}

/// Appends a SETTINGS frame with `params`.
pub fn put_settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    head(out, params.len() * 6, kind::SETTINGS, 0, 0);
    for (id, value) in params {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Appends a SETTINGS ACK.
pub fn put_settings_ack(out: &mut Vec<u8>) {
    head(out, 0, kind::SETTINGS, flag::ACK, 0);
}

/// Appends a PING ACK echoing `payload`.
pub fn put_ping_ack(out: &mut Vec<u8>, payload: [u8; 8]) {
    head(out, 8, kind::PING, flag::ACK, 0);
    out.extend_from_slice(&payload);
}

/// Appends a WINDOW_UPDATE.
pub fn put_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(increment & MAX_31).to_be_bytes());
}

/// Appends a RST_STREAM.
pub fn put_rst_stream(out: &mut Vec<u8>, stream: u32, code: u32) {
    head(out, 4, kind::RST_STREAM, 0, stream);
    out.extend_from_slice(&code.to_be_bytes());
}

/// Appends a GOAWAY.
pub fn put_goaway(out: &mut Vec<u8>, last_stream: u32, code: u32) {
    head(out, 8, kind::GOAWAY, 0, 0);
    out.extend_from_slice(&(last_stream & MAX_31).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
}

/// Appends a header block as HEADERS (with END_STREAM if `end_stream`) and, if it is longer
/// than `max_frame`, CONTINUATION frames.
pub fn put_headers(
    out: &mut Vec<u8>,
    stream: u32,
    block: &[u8],
    max_frame: usize,
    end_stream: bool,
) {
    let end = if end_stream { flag::END_STREAM } else { 0 };
    let max_frame = max_frame.max(1);
    let mut chunks = block.chunks(max_frame).peekable();
    let mut ty = kind::HEADERS;
    if chunks.peek().is_none() {
        head(out, 0, ty, flag::END_HEADERS | end, stream);
    }
    while let Some(chunk) = chunks.next() {
        let mut flags = if chunks.peek().is_none() {
            flag::END_HEADERS
        } else {
            0
        };
        if ty == kind::HEADERS {
            flags |= end;
        }
        head(out, chunk.len(), ty, flags, stream);
        out.extend_from_slice(chunk);
        ty = kind::CONTINUATION;
    }
}

/// Appends `body` as DATA frames of at most `max_frame` bytes, the last with END_STREAM.
pub fn put_data(out: &mut Vec<u8>, stream: u32, body: &[u8], max_frame: usize) {
    put_data_frames(out, stream, body, max_frame, true);
}

/// Appends `body` as DATA frames of at most `max_frame` bytes, the last with END_STREAM if
/// `end_stream` (an empty body with it is one empty frame; without it, no frame).
pub fn put_data_frames(
    out: &mut Vec<u8>,
    stream: u32,
    body: &[u8],
    max_frame: usize,
    end_stream: bool,
) {
    let max_frame = max_frame.max(1);
    let end = if end_stream { flag::END_STREAM } else { 0 };
    if body.is_empty() {
        if end_stream {
            head(out, 0, kind::DATA, end, stream);
        }
        return;
    }
    let mut chunks = body.chunks(max_frame).peekable();
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() { end } else { 0 };
        head(out, chunk.len(), kind::DATA, flags, stream);
        out.extend_from_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A frame parsed, owned: what the proptest compares.
    fn owned(f: &Frame<'_>) -> String {
        format!("{f:?}")
    }

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        head(&mut out, payload.len(), ty, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn incomplete_frames_wait() {
        let f = frame(kind::PING, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]);
        for cut in 0..f.len() {
            assert_eq!(
                parse(&f[..cut], DEFAULT_MAX_FRAME),
                Ok(None),
                "cut at {cut}"
            );
        }
        let (parsed, used) = parse(&f, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(used, f.len());
        assert_eq!(
            parsed,
            Frame::Ping {
                ack: false,
                payload: [1, 2, 3, 4, 5, 6, 7, 8]
            }
        );
    }

    #[test]
    fn padding_and_priority_are_taken_off() {
        // PADDED DATA: pad length 3, "abc", 3 bytes of padding.
        let f = frame(
            kind::DATA,
            flag::PADDED | flag::END_STREAM,
            5,
            b"\x03abc\0\0\0",
        );
        let (parsed, _) = parse(&f, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            parsed,
            Frame::Data {
                stream: 5,
                end_stream: true,
                data: b"abc",
                flow: 7
            }
        );
        // PADDED | PRIORITY HEADERS: pad 1, dependency 4 bytes, weight, block, padding.
        let f = frame(
            kind::HEADERS,
            flag::PADDED | flag::PRIORITY | flag::END_HEADERS,
            3,
            b"\x01\0\0\0\x01\x10\x88\0",
        );
        let (parsed, _) = parse(&f, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            parsed,
            Frame::Headers {
                stream: 3,
                end_stream: false,
                end_headers: true,
                block: b"\x88"
            }
        );
        // Padding longer than the payload.
        let f = frame(kind::DATA, flag::PADDED, 1, b"\x05ab");
        assert!(matches!(
            parse(&f, DEFAULT_MAX_FRAME),
            Err(WireError::BadPadding { .. })
        ));
        let f = frame(kind::DATA, flag::PADDED, 1, b"");
        assert!(parse(&f, DEFAULT_MAX_FRAME).is_err());
    }

    #[test]
    fn malformed_frames_are_connection_errors() {
        let too_big = frame(kind::DATA, 0, 1, &vec![0; 16_385]);
        assert_eq!(
            parse(&too_big[..HEADER_LEN], DEFAULT_MAX_FRAME),
            Err(WireError::FrameTooLarge {
                len: 16_385,
                max: DEFAULT_MAX_FRAME
            })
        );
        for bad in [
            frame(kind::DATA, 0, 0, b"x"),
            frame(kind::HEADERS, 0, 0, b"x"),
            frame(kind::SETTINGS, 0, 1, b""),
            frame(kind::SETTINGS, 0, 0, b"12345"),
            frame(kind::SETTINGS, flag::ACK, 0, b"123456"),
            frame(kind::PING, 0, 0, b"1234567"),
            frame(kind::PING, 0, 3, b"12345678"),
            frame(kind::GOAWAY, 0, 0, b"1234567"),
            frame(kind::WINDOW_UPDATE, 0, 0, b"123"),
            frame(kind::RST_STREAM, 0, 1, b"123"),
            frame(kind::RST_STREAM, 0, 0, b"1234"),
            frame(kind::HEADERS, flag::PRIORITY, 1, b"1234"),
        ] {
            assert!(parse(&bad, DEFAULT_MAX_FRAME).is_err(), "{bad:?}");
        }
        // Unknown types are skipped whole.
        let f = frame(0xfa, 0xff, 7, b"whatever");
        assert_eq!(
            parse(&f, DEFAULT_MAX_FRAME).unwrap().unwrap(),
            (
                Frame::Ignored {
                    kind: 0xfa,
                    stream: 7
                },
                f.len()
            )
        );
    }

    #[test]
    fn settings_and_goaway_are_read() {
        let mut out = Vec::new();
        put_settings(
            &mut out,
            &[(setting::MAX_CONCURRENT_STREAMS, 2), (0x4, 1 << 20)],
        );
        let (f, _) = parse(&out, DEFAULT_MAX_FRAME).unwrap().unwrap();
        let Frame::Settings { ack: false, params } = f else {
            panic!("{f:?}")
        };
        assert_eq!(
            settings(params).collect::<Vec<_>>(),
            vec![(3, 2), (4, 1 << 20)]
        );
        let mut out = Vec::new();
        put_goaway(&mut out, 7, code::PROTOCOL_ERROR);
        out.truncate(out.len()); // no debug data
        let (f, _) = parse(&out, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(
            f,
            Frame::GoAway {
                last_stream: 7,
                code: 1,
                debug: b""
            }
        );
        assert_eq!(code_name(8), "CANCEL");
        assert_eq!(code_name(0x99), "error code 0x99");
    }

    #[test]
    fn long_blocks_and_bodies_are_split() {
        let block = vec![0x88; 40];
        let mut out = Vec::new();
        put_headers(&mut out, 1, &block, 16, false);
        put_data(&mut out, 1, &[7; 20], 16);
        let mut at = 0;
        let mut got = Vec::new();
        while let Some((f, used)) = parse(&out[at..], DEFAULT_MAX_FRAME).unwrap() {
            got.push(owned(&f));
            at += used;
        }
        assert_eq!(at, out.len());
        assert_eq!(got.len(), 5, "{got:?}"); // HEADERS, 2 CONTINUATION, 2 DATA
        assert!(got[0].starts_with("Headers { stream: 1, end_stream: false, end_headers: false"));
        assert!(got[2].starts_with("Continuation { stream: 1, end_headers: true"));
        assert!(got[3].contains("end_stream: false"));
        assert!(got[4].contains("end_stream: true"));
    }

    /// The frames a server may send, as bytes.
    fn frames() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let payload = || proptest::collection::vec(any::<u8>(), 0..40);
        let one = prop_oneof![
            (1u32..100, any::<bool>(), payload()).prop_map(|(s, end, p)| {
                frame(kind::DATA, if end { flag::END_STREAM } else { 0 }, s, &p)
            }),
            (1u32..100, 0u8..20, payload()).prop_map(|(s, pad, p)| {
                let mut body = vec![pad];
                body.extend_from_slice(&p);
                body.extend(std::iter::repeat_n(0, usize::from(pad)));
                frame(kind::DATA, flag::PADDED, s, &body)
            }),
            (1u32..100, any::<bool>(), payload()).prop_map(|(s, end, p)| {
                let flags = flag::END_HEADERS | if end { flag::END_STREAM } else { 0 };
                frame(kind::HEADERS, flags, s, &p)
            }),
            (1u32..100, payload()).prop_map(|(s, p)| frame(kind::CONTINUATION, 0, s, &p)),
            (1u32..100, any::<u32>())
                .prop_map(|(s, c)| { frame(kind::RST_STREAM, 0, s, &c.to_be_bytes()) }),
            proptest::collection::vec((any::<u16>(), any::<u32>()), 0..4).prop_map(|p| {
                let mut out = Vec::new();
                put_settings(&mut out, &p);
                out
            }),
            any::<[u8; 8]>().prop_map(|p| frame(kind::PING, 0, 0, &p)),
            (0u32..100, any::<u32>()).prop_map(|(s, i)| {
                let mut out = Vec::new();
                put_window_update(&mut out, s, i);
                out
            }),
            (0u32..100, payload()).prop_map(|(last, debug)| {
                let mut p = last.to_be_bytes().to_vec();
                p.extend_from_slice(&[0, 0, 0, 2]);
                p.extend_from_slice(&debug);
                frame(kind::GOAWAY, 0, 0, &p)
            }),
            (0xau8..0xff, 0u32..100, payload()).prop_map(|(t, s, p)| frame(t, 0, s, &p)),
        ];
        proptest::collection::vec(one, 0..12).prop_map(|v| v.concat())
    }

    proptest::proptest! {
        /// Bytes split at arbitrary boundaries, read as they arrive into a buffer that
        /// keeps what is incomplete, give the same frames as the bytes read at once.
        #[test]
        fn frames_split_anywhere_parse_the_same(
            bytes in frames(),
            cuts in proptest::collection::vec(0usize..600, 0..10),
        ) {
            let mut whole = Vec::new();
            let mut at = 0;
            while let Some((f, used)) = parse(&bytes[at..], DEFAULT_MAX_FRAME).unwrap() {
                whole.push(owned(&f));
                at += used;
            }
            proptest::prop_assert_eq!(at, bytes.len());

            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let (mut buf, mut from, mut split) = (Vec::new(), 0, Vec::new());
            for cut in cuts {
                buf.extend_from_slice(&bytes[from..cut]);
                from = cut;
                let mut at = 0;
                while let Some((f, used)) = parse(&buf[at..], DEFAULT_MAX_FRAME).unwrap() {
                    split.push(owned(&f));
                    at += used;
                }
                buf.drain(..at);
            }
            proptest::prop_assert!(buf.is_empty());
            proptest::prop_assert_eq!(whole, split);
        }
    }
}
