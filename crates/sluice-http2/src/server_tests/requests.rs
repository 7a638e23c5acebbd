//! Requests checked as RFC 9113 §8.3 says: malformed ones reset, `content-length` matched
//! by the data, trailers that end the request, the header list limit.

use super::*;

/// Each block on stream 1 of its own connection: reset PROTOCOL_ERROR, never a request.
fn assert_malformed(block: &[u8], end_stream: bool, why: &str) {
    let mut p = Peer::new(Settings::default());
    assert_eq!(p.ok(&headers(1, block, end_stream)), [], "{why}");
    assert_eq!(p.take(), [Out::Rst(1, code::PROTOCOL_ERROR)], "{why}");
    assert_eq!(p.conn.open_streams(), 0, "{why}");
}

#[test]
fn malformed_requests_are_reset_protocol_error() {
    let lit = |name: &[u8], value: &[u8]| with(post(b"/"), name, value);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![0x83, 0x86], "no :path"),
        (vec![0x86, 0x84], "no :method"),
        (vec![0x83, 0x84], "no :scheme"),
        (post(b""), "empty :path"),
        (vec![0x83, 0x83, 0x86, 0x84], "a pseudo-header twice"),
        (lit(b":foo", b"x"), "an unknown pseudo-header"),
        (lit(b":status", b"200"), "a response pseudo-header"),
        (
            {
                let mut b = with(vec![0x83, 0x86], b"x-a", b"1");
                b.push(0x84);
                b
            },
            "a pseudo-header after a regular field",
        ),
        (lit(b"X-Upper", b"1"), "an uppercase name"),
        (lit(b"connection", b"keep-alive"), "connection"),
        (lit(b"keep-alive", b"1"), "keep-alive"),
        (lit(b"transfer-encoding", b"chunked"), "transfer-encoding"),
        (lit(b"upgrade", b"h2c"), "upgrade"),
        (lit(b"te", b"gzip"), "te other than trailers"),
        (
            lit(b"content-length", b"abc"),
            "content-length not a number",
        ),
        (
            with(lit(b"content-length", b"1"), b"content-length", b"2"),
            "two content-lengths",
        ),
        (Vec::new(), "no fields at all"),
        (lit(b"x-a", b"a\nb"), "LF in a value"),
        (lit(b"x-a", b"a\rb"), "CR in a value"),
        (lit(b"x-a", b"a\0b"), "NUL in a value"),
        (post(b"/a\r\nx: y"), "CR LF in :path"),
        (lit(b"x a", b"1"), "a space in a name"),
        (lit(b"x\xffa", b"1"), "a non-ASCII name"),
        (lit(b"x:a", b"1"), "a colon inside a name"),
    ];
    for (block, why) in &cases {
        assert_malformed(block, false, why);
    }
    assert_malformed(&lit(b"content-length", b"5"), true, "length 5, no body");
}

#[test]
fn content_length_must_match_the_data() {
    let cl = |n: &[u8]| with(post(b"/"), b"content-length", n);
    let reset = reset(1, code::PROTOCOL_ERROR);
    let cases: [(Vec<u8>, Vec<u8>); 3] = [
        (cl(b"5"), data(1, b"abc", true)),
        (cl(b"3"), data(1, b"abcd", false)),
        (
            cl(b"5"),
            [
                data(1, b"abc", false),
                headers(1, &with(Vec::new(), b"x-t", b"1"), true),
            ]
            .concat(),
        ),
    ];
    for (block, rest) in cases {
        let mut p = Peer::new(Settings::default());
        assert_eq!(p.ok(&headers(1, &block, false)).len(), 1);
        let events = p.ok(&rest);
        assert_eq!(events.last(), Some(&reset), "{events:?}");
        assert_eq!(p.take(), [Out::Rst(1, code::PROTOCOL_ERROR)]);
    }
    // Matched: fine.
    let mut p = Peer::new(Settings::default());
    p.ok(&headers(1, &cl(b"3"), false));
    assert_eq!(
        p.ok(&data(1, b"abc", true)),
        [Event::Data {
            stream: 1,
            data: Bytes::from_static(b"abc"),
            end_stream: true
        }]
    );
    assert_eq!(p.take(), []);
}

#[test]
fn bad_trailers_reset_the_stream() {
    let reset = [reset(1, code::PROTOCOL_ERROR)];
    // §8.1: trailers carry no pseudo-headers, and end the stream.
    for (block, end_stream) in [(vec![0x84], true), (with(Vec::new(), b"x-t", b"1"), false)] {
        let mut p = Peer::new(Settings::default());
        p.ok(&headers(1, &post(b"/"), false));
        p.ok(&data(1, b"x", false));
        assert_eq!(p.ok(&headers(1, &block, end_stream)), reset);
        assert_eq!(p.take(), [Out::Rst(1, code::PROTOCOL_ERROR)]);
    }
}

#[test]
fn header_list_above_the_limit_is_answered_431() {
    let mut p = Peer::new(set(|s| s.max_header_list_size = 200));
    let block = with(post(b"/"), b"x-big", &[b'a'; 200]);
    assert_eq!(p.ok(&headers(1, &block, false)), []);
    let out = p.take();
    let Out::Headers(1, true, block) = &out[0] else {
        panic!("{out:?}")
    };
    let mut fields = Vec::new();
    crate::hpack::Decoder::new(4096)
        .decode(block, |n, v| fields.push((n.to_vec(), v.to_vec())))
        .unwrap();
    assert_eq!(fields, [(b":status".to_vec(), b"431".to_vec())]);
    // The request's rest is not wanted (§8.1).
    assert_eq!(out[1..], [Out::Rst(1, code::NO_ERROR)]);
    assert_eq!(p.ok(&data(1, b"ignored", true)), []);
    assert_eq!(p.ok(&headers(3, GET_ROOT, true)).len(), 1);
}
