//! HPACK (RFC 7541) decoding of the answers' header blocks, and Huffman coding.
//!
//! Why its own: a decoder must Huffman-decode every literal a peer sends, and peers send
//! some in every message (nghttp2 never indexes `:path`; servers put varying `grpc-message`
//! values in trailers). `loona-hpack`'s Huffman decoder looks a map up for every bit: on
//! h2load's 56-byte request block (a 43-byte Huffman-coded path, five indexed fields) it
//! took about 40 µs, `httlib-hpack` about 2.5 µs, this decoder 0.39 µs (one trial run, side
//! by side). Here the code is decoded a nibble at a time through a table of 256 states
//! built once from the code (as nghttp2 and h2 do), and fields reach the caller as borrowed
//! slices: no allocation per field.

use std::collections::VecDeque;
use std::sync::LazyLock;

/// The dynamic table's fields, newest first: index 62 is the front.
type Table = VecDeque<(Box<[u8]>, Box<[u8]>)>;

/// Why a header block could not be decoded. Every one is a connection error
/// (`COMPRESSION_ERROR`): the decoder's table may no longer match the peer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("the header block ends inside a field")]
    Truncated,
    #[error("an integer above 2^28")]
    Overflow,
    #[error("index {0} is in neither table")]
    Index(usize),
    #[error("an invalid Huffman code (the end-of-string symbol, or bad padding)")]
    Huffman,
    #[error("a table size update to {0} bytes, above the {1} allowed")]
    TableSize(usize, usize),
    #[error("a table size update after the block's first field")]
    LateSizeUpdate,
}

/// A decoder: the dynamic table, which follows every block the peer sends on the
/// connection, in order.
#[derive(Debug)]
pub struct Decoder {
    table: Table,
    /// Σ (32 + name + value) over the table (RFC 7541 §4.1).
    size: usize,
    /// The table's size limit, as the peer last set it.
    max: usize,
    /// What the peer may set it to: our SETTINGS_HEADER_TABLE_SIZE.
    allowed: usize,
    /// Huffman-decoded names and values.
    name: Memo,
    value: Memo,
}

impl Decoder {
    /// A decoder for a connection on which we advertise SETTINGS_HEADER_TABLE_SIZE `allowed`
    /// (4,096 unless we send another).
    pub fn new(allowed: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max: allowed,
            allowed,
            name: Memo::default(),
            value: Memo::default(),
        }
    }

    /// Decodes one whole header block (HEADERS and its CONTINUATIONs, joined), calling `field`
    /// with each name and value in order.
    ///
    /// # Errors
    /// [`HpackError`]: the block is malformed; the table must not be used again.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut at = 0;
        let mut first = true;
        while at < block.len() {
            let b = block[at];
            if b & 0x80 != 0 {
                // Indexed field (§6.1).
                let i = integer(block, &mut at, 7)?;
                let (n, v) = get(&self.table, i)?;
                field(n, v);
            } else if b & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3): only before the first field.
                if !first {
                    return Err(HpackError::LateSizeUpdate);
                }
                let max = integer(block, &mut at, 5)?;
                if max > self.allowed {
                    return Err(HpackError::TableSize(max, self.allowed));
                }
                self.max = max;
                self.evict(0);
                continue;
            } else {
                // Literals (§6.2): with incremental indexing (01), without (0000), never (0001).
                let (prefix, index) = if b & 0x40 != 0 { (6, true) } else { (4, false) };
                let i = integer(block, &mut at, prefix)?;
                let (name, value): (&[u8], &[u8]) = if i == 0 {
                    let name = string(block, &mut at, &mut self.name)?;
                    (name, string(block, &mut at, &mut self.value)?)
                } else {
                    let value = string(block, &mut at, &mut self.value)?;
                    (get(&self.table, i)?.0, value)
                };
                field(name, value);
                if index {
                    let (name, value) = (Box::from(name), Box::from(value));
                    self.insert(name, value);
                }
            }
            first = false;
        }
        Ok(())
    }

    /// Adds a field at the front, evicting from the back (§4.4).
    fn insert(&mut self, name: Box<[u8]>, value: Box<[u8]>) {
        let size = 32 + name.len() + value.len();
        self.evict(size);
        if size <= self.max {
            self.size += size;
            self.table.push_front((name, value));
        }
    }

    /// Evicts until `room` more bytes fit (all of it if they cannot).
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= 32 + n.len() + v.len();
        }
    }
}

/// Field `i` (1-based) of the static table, then of `table`.
fn get(table: &Table, i: usize) -> Result<(&[u8], &[u8]), HpackError> {
    match i {
        0 => Err(HpackError::Index(0)),
        1..=61 => Ok(STATIC[i - 1]),
        _ => table
            .get(i - 62)
            .map(|(n, v)| (&n[..], &v[..]))
            .ok_or(HpackError::Index(i)),
    }
}

/// An integer with an `n`-bit prefix (§5.1), at most 2^28.
fn integer(block: &[u8], at: &mut usize, n: u8) -> Result<usize, HpackError> {
    let max = (1usize << n) - 1;
    let first = usize::from(*block.get(*at).ok_or(HpackError::Truncated)?) & max;
    *at += 1;
    if first < max {
        return Ok(first);
    }
    let mut value = max;
    let mut shift = 0;
    loop {
        let b = *block.get(*at).ok_or(HpackError::Truncated)?;
        *at += 1;
        if shift > 21 {
            return Err(HpackError::Overflow);
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// The last Huffman-coded string decoded in one place (names or values), and its code.
///
/// Why: peers send some literals again and again without indexing them (nghttp2, and so
/// h2load and Envoy, sends `:path` so on every request), and comparing the code with the
/// last one costs a fraction of decoding it again.
#[derive(Debug, Default)]
struct Memo {
    code: Vec<u8>,
    decoded: Vec<u8>,
}

/// A string literal (§5.2): borrowed from the block, or Huffman-decoded into `memo` (unless
/// it holds this code's string already).
fn string<'a>(block: &'a [u8], at: &mut usize, memo: &'a mut Memo) -> Result<&'a [u8], HpackError> {
    let huffman = block.get(*at).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = integer(block, at, 7)?;
    let end = at.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = block.get(*at..end).ok_or(HpackError::Truncated)?;
    *at = end;
    if !huffman {
        return Ok(raw);
    }
    if memo.code != raw {
        memo.code.clear();
        memo.decoded.clear();
        if let Err(e) = huffman_decode(raw, &mut memo.decoded) {
            memo.decoded.clear();
            return Err(e);
        }
        memo.code.extend_from_slice(raw);
    }
    Ok(&memo.decoded)
}

/// The end-of-string symbol's code: thirty 1 bits (RFC 7541 Appendix B). A decoder that
/// meets it fails; its prefix pads a string's last octet.
const EOS: (u32, u8) = (0x3fff_ffff, 30);

/// One step of the Huffman decoder: from a state, one nibble.
#[derive(Debug, Clone, Copy, Default)]
struct Step {
    /// The state after the nibble (a node of the code's tree; 0 is the root).
    next: u8,
    /// The octet the nibble completed, if any (codes are at least 5 bits: at most one).
    symbol: Option<u8>,
    /// The nibble runs into the end-of-string symbol.
    fail: bool,
    /// A string may end in `next`: what was read since the last symbol is at most 7
    /// 1 bits, the end-of-string code's prefix (§5.2).
    end: bool,
}

/// The decoder's table: 256 states (the code tree's inner nodes) by 16 nibbles.
static STEPS: LazyLock<Vec<[Step; 16]>> = LazyLock::new(|| {
    // The tree: each inner node's two children, an inner node's index or LEAF | symbol.
    const LEAF: u16 = 0x8000;
    let mut nodes: Vec<[u16; 2]> = vec![[0; 2]];
    for symbol in 0..=256u16 {
        let (code, len) = CODES.get(usize::from(symbol)).copied().unwrap_or(EOS);
        let mut n = 0;
        for i in (0..len).rev() {
            let bit = ((code >> i) & 1) as usize;
            if i == 0 {
                nodes[n][bit] = LEAF | symbol;
            } else {
                if nodes[n][bit] == 0 {
                    nodes.push([0; 2]);
                    nodes[n][bit] = (nodes.len() - 1) as u16;
                }
                n = usize::from(nodes[n][bit]);
            }
        }
    }
    // A string may end at the root and within 7 bits down the all-ones path.
    let mut end = vec![false; nodes.len()];
    let mut n = 0;
    end[0] = true;
    for _ in 0..7 {
        n = usize::from(nodes[n][1]);
        end[n] = true;
    }
    nodes
        .iter()
        .enumerate()
        .map(|(state, _)| {
            let mut steps = [Step::default(); 16];
            for (nibble, step) in steps.iter_mut().enumerate() {
                let mut at = state;
                for i in (0..4).rev() {
                    let child = nodes[at][(nibble >> i) & 1];
                    if child & LEAF == 0 {
                        at = usize::from(child);
                    } else if child == LEAF | 256 {
                        step.fail = true;
                        break;
                    } else {
                        step.symbol = Some((child & 0xff) as u8);
                        at = 0;
                    }
                }
                step.next = at as u8;
                step.end = end[at];
            }
            steps
        })
        .collect()
});

/// Decodes a Huffman-coded string (§5.2) onto `out`.
///
/// # Errors
/// [`HpackError::Huffman`]: the end-of-string symbol, or padding that is not the start of
/// its code or longer than 7 bits.
pub fn huffman_decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let steps = &*STEPS;
    let (mut state, mut end) = (0u8, true);
    for &b in src {
        for nibble in [b >> 4, b & 0xf] {
            let step = steps[usize::from(state)][usize::from(nibble)];
            if step.fail {
                return Err(HpackError::Huffman);
            }
            if let Some(s) = step.symbol {
                out.push(s);
            }
            (state, end) = (step.next, step.end);
        }
    }
    if end {
        Ok(())
    } else {
        Err(HpackError::Huffman)
    }
}

/// Huffman-codes `src` onto `out`, the last octet padded with 1 bits (§5.2).
pub fn huffman_encode(src: &[u8], out: &mut Vec<u8>) {
    let (mut bits, mut n) = (0u64, 0u32);
    for &b in src {
        let (code, len) = CODES[usize::from(b)];
        bits = (bits << len) | u64::from(code);
        n += u32::from(len);
        while n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
        bits &= (1 << n) - 1;
    }
    if n > 0 {
        out.push(((bits << (8 - n)) | (0xff >> n)) as u8);
    }
}

/// RFC 7541 Appendix B: each octet's code (right-aligned) and its length in bits. The
/// end-of-string symbol (256) is [`EOS`].
#[rustfmt::skip]
const CODES: [(u32, u8); 256] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28),
    (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24),
    (0x3ffffffc, 30), (0xfffffe9, 28), (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28),
    (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28), (0xffffff4, 28),
    (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10), (0xf9, 8),
    (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6), (0x0, 5), (0x1, 5), (0x2, 5),
    (0x19, 6), (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7),
    (0xfb, 8), (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7), (0x63, 7), (0x64, 7),
    (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7),
    (0x6d, 7), (0x6e, 7), (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6), (0x7ffd, 15),
    (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6), (0x27, 6),
    (0x6, 5), (0x74, 7), (0x75, 7), (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6),
    (0x76, 7), (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7), (0x79, 7),
    (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13),
    (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22),
    (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23),
    (0xffffeb, 24), (0x7fffdf, 23), (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22),
    (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23), (0x3fffd9, 22),
    (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23),
    (0x1fffde, 21), (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21),
    (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21), (0x7fffed, 23), (0x3fffe1, 22),
    (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22),
    (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22),
    (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26),
    (0x3ffffe4, 26), (0x7ffffde, 27), (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24),
    (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24), (0x1fffe4, 21),
    (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20),
    (0x1fffe6, 21), (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24),
    (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23), (0x3ffffeb, 26), (0x7ffffe6, 27),
    (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27),
    (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
];

/// RFC 7541 Appendix A: the static table, index 1 first.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Appends an integer (§5.1) with an `n`-bit prefix (1 ≤ n ≤ 8), the first byte's other
/// bits set to `high`.
pub fn encode_int(out: &mut Vec<u8>, n: u32, high: u8, value: usize) {
    let max = (1usize << n.clamp(1, 8)) - 1;
    if value < max {
        // Below 2^n, n ≤ 8.
        out.push(high | u8::try_from(value).unwrap_or(0));
        return;
    }
    out.push(high | u8::try_from(max).unwrap_or(0));
    let mut rest = value - max;
    while rest >= 128 {
        out.push(0x80 | u8::try_from(rest & 0x7f).unwrap_or(0));
        rest >>= 7;
    }
    out.push(u8::try_from(rest).unwrap_or(0));
}

/// Appends a string literal (§5.2), not Huffman-coded.
pub fn encode_str(out: &mut Vec<u8>, s: &[u8]) {
    encode_int(out, 7, 0, s.len());
    out.extend_from_slice(s);
}

/// Appends a field as a literal without indexing (§6.2.2): the name by its static-table
/// index when it has one (`name_index` > 0), else as a literal. A block of such fields
/// leaves the peer's table as it was, so it can be encoded once and sent on every stream.
pub fn encode_literal(out: &mut Vec<u8>, name_index: usize, name: &[u8], value: &[u8]) {
    encode_int(out, 4, 0, name_index);
    if name_index == 0 {
        encode_str(out, name);
    }
    encode_str(out, value);
}

#[cfg(test)]
#[path = "hpack_tests.rs"]
mod tests;
