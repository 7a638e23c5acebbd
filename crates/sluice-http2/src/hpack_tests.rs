//! The decoder against RFC 7541's examples, `loona-hpack` as an oracle, and arbitrary input.

use super::{Decoder, HpackError, huffman_decode, huffman_encode};
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn fields(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
    let mut out = Vec::new();
    d.decode(block, |n, v| {
        out.push((
            String::from_utf8_lossy(n).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    })?;
    Ok(out)
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

/// RFC 7541 C.4: three requests with Huffman-coded literals on one connection (the second
/// and third use the dynamic table the first filled).
#[test]
fn rfc7541_c4_requests_with_huffman() {
    let mut d = Decoder::new(4096);
    let first = fields(&mut d, &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff")).unwrap();
    assert_eq!(
        first,
        pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com")
        ])
    );
    let second = fields(&mut d, &hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
    assert_eq!(
        second,
        pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache")
        ])
    );
    let third = fields(
        &mut d,
        &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    )
    .unwrap();
    assert_eq!(
        third,
        pairs(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value")
        ])
    );
    // Three entries, 164 bytes (C.4.3's table).
    assert_eq!((d.table.len(), d.size), (3, 164));
}

/// RFC 7541 C.4.1's string, both ways.
#[test]
fn huffman_codes_the_rfc_example() {
    let mut out = Vec::new();
    huffman_encode(b"www.example.com", &mut out);
    assert_eq!(out, hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff"));
    let mut back = Vec::new();
    huffman_decode(&out, &mut back).unwrap();
    assert_eq!(back, b"www.example.com");
}

/// What §5.2 makes an error: the end-of-string symbol inside a string, padding longer than
/// 7 bits, padding that is not all 1 bits.
#[test]
fn bad_huffman_is_refused() {
    let mut code = Vec::new();
    huffman_encode(b"a", &mut code); // 00011 + 111 padding
    assert_eq!(code, [0x1f]);
    let mut out = Vec::new();
    assert_eq!(
        huffman_decode(&[0x1f, 0xff], &mut out),
        Err(HpackError::Huffman)
    );
    assert_eq!(huffman_decode(&[0x1e], &mut out), Err(HpackError::Huffman));
    assert_eq!(
        huffman_decode(&[0xff, 0xff, 0xff, 0xfc], &mut out),
        Err(HpackError::Huffman)
    );
}

#[test]
fn malformed_blocks_are_refused() {
    let mut d = Decoder::new(4096);
    assert_eq!(fields(&mut d, &[0x80]), Err(HpackError::Index(0)));
    assert_eq!(fields(&mut d, &[0xbe]), Err(HpackError::Index(62)));
    assert_eq!(
        fields(&mut d, &[0x40, 0x05, b'a']),
        Err(HpackError::Truncated)
    );
    assert_eq!(fields(&mut d, &[0xff]), Err(HpackError::Truncated));
    assert_eq!(
        fields(&mut d, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
        Err(HpackError::Overflow)
    );
    // A size update above what we allow, and one after a field.
    assert_eq!(
        fields(&mut d, &[0x3f, 0xe2, 0x1f]),
        Err(HpackError::TableSize(4097, 4096))
    );
    assert_eq!(
        fields(&mut d, &[0x82, 0x20]),
        Err(HpackError::LateSizeUpdate)
    );
}

/// A size update evicts; an entry larger than the table empties it and is not added.
#[test]
fn size_updates_and_large_entries_evict() {
    let mut d = Decoder::new(4096);
    // custom-key: custom-header, added to the table (55 bytes).
    let add = hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572");
    fields(&mut d, &add).unwrap();
    assert_eq!((d.table.len(), d.size), (1, 55));
    // To 0 and back to 4,096 (two updates in one block, then a field).
    fields(&mut d, &[0x20, 0x3f, 0xe1, 0x1f, 0x82]).unwrap();
    assert_eq!((d.table.len(), d.size), (0, 0));
    fields(&mut d, &add).unwrap();
    // A table of 60 bytes holds one such entry; a second evicts the first.
    fields(&mut d, &[0x3f, 0x1d]).unwrap();
    assert_eq!((d.table.len(), d.max), (1, 60));
    fields(&mut d, &add).unwrap();
    assert_eq!(d.table.len(), 1);
    // A 61-byte entry does not fit at all: the table empties.
    let big =
        hex("400a 6375 7374 6f6d 2d6b 6579 1363 7573 746f 6d2d 6865 6164 6572 2121 2121 2121");
    assert_eq!(
        fields(&mut d, &big).unwrap(),
        pairs(&[("custom-key", "custom-header!!!!!!")])
    );
    assert_eq!((d.table.len(), d.size), (0, 0));
}

fn header() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (
        prop_oneof![
            Just(b":status".to_vec()),
            Just(b"grpc-status".to_vec()),
            Just(b"content-type".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..40),
        ],
        proptest::collection::vec(any::<u8>(), 0..300),
    )
}

proptest! {
    #[test]
    fn huffman_round_trips(s in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut code = Vec::new();
        huffman_encode(&s, &mut code);
        let mut back = Vec::new();
        huffman_decode(&code, &mut back).unwrap();
        prop_assert_eq!(back, s);
    }

    /// Blocks from `loona-hpack`'s encoder (every field added to the table, so entries are
    /// evicted once the 4,096 bytes fill): this decoder reads what its decoder reads.
    #[test]
    fn decodes_what_an_encoder_writes(blocks in proptest::collection::vec(
        proptest::collection::vec(header(), 0..12), 1..12)) {
        let mut encoder = loona_hpack::Encoder::new();
        let mut oracle = loona_hpack::Decoder::new();
        let mut ours = Decoder::new(4096);
        for block in &blocks {
            let bytes = encoder.encode(block.iter().map(|(n, v)| (&n[..], &v[..])));
            let want = oracle.decode(&bytes).unwrap();
            let mut got = Vec::new();
            ours.decode(&bytes, |n, v| got.push((n.to_vec(), v.to_vec()))).unwrap();
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(&got, block);
        }
    }

    /// Arbitrary bytes: an error or fields, never a panic, and the table within its size.
    #[test]
    fn arbitrary_blocks_never_panic(blocks in proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..64), 1..8)) {
        let mut d = Decoder::new(256);
        for block in &blocks {
            if d.decode(block, |_, _| {}).is_err() {
                break;
            }
            prop_assert!(d.size <= d.max && d.max <= 256);
        }
    }
}

/// A Huffman-coded literal sent again (as nghttp2 sends `:path`) is taken from the memo of
/// the last one: the same string, also after another string or a failed one in between.
#[test]
fn repeated_huffman_literals_decode_the_same() {
    let literal = |s: &[u8]| {
        let mut code = Vec::new();
        huffman_encode(s, &mut code);
        // Literal without indexing, name `:path` (static 4), a Huffman-coded value.
        let mut block = vec![0x04];
        super::encode_int(&mut block, 7, 0x80, code.len());
        block.extend_from_slice(&code);
        block
    };
    let (a, b) = (literal(b"/envoy.service/Should"), literal(b"/other"));
    let mut d = Decoder::new(4096);
    for block in [&a, &a, &b, &a, &b, &b] {
        let want = if block == &a {
            "/envoy.service/Should"
        } else {
            "/other"
        };
        assert_eq!(fields(&mut d, block).unwrap(), pairs(&[(":path", want)]));
    }
    // A code that fails (the end-of-string symbol) leaves no memo behind: the next
    // block with the earlier code still decodes it.
    let bad = [0x04, 0x84, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(fields(&mut d, &bad), Err(HpackError::Huffman));
    assert_eq!(
        fields(&mut d, &a).unwrap(),
        pairs(&[(":path", "/envoy.service/Should")])
    );
}
