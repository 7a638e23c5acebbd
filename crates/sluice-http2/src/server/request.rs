//! A request's header block, decoded and checked (RFC 9113 §8.2, §8.3).

use crate::hpack::{Decoder, HpackError};

/// The last header block received, decoded: its fields' bytes and where each lies.
#[derive(Debug, Clone, Default)]
pub(super) struct Fields {
    bytes: Vec<u8>,
    /// (name start, name end, value end), regular fields only.
    regular: Vec<(usize, usize, usize)>,
    /// `:method`, `:scheme`, `:authority`, `:path`: (start, end) in `bytes`.
    pseudo: [Option<(usize, usize)>; 4],
}

impl Fields {
    /// Decodes `block` into these fields and checks them (§8.2, §8.3): a header list
    /// above `limit` bytes is [`Check::TooLarge`] (its fields are not kept).
    pub(super) fn decode(
        &mut self,
        decoder: &mut Decoder,
        block: &[u8],
        limit: usize,
    ) -> Result<Check, HpackError> {
        let f = self;
        f.bytes.clear();
        f.regular.clear();
        f.pseudo = [None; 4];
        let (mut malformed, mut regular_seen, mut list, mut content_length) =
            (false, false, 0usize, None);
        decoder.decode(block, |name, value| {
            list += 32 + name.len() + value.len();
            if list > limit || malformed {
                return;
            }
            let start = f.bytes.len();
            f.bytes.extend_from_slice(name);
            f.bytes.extend_from_slice(value);
            let (mid, end) = (start + name.len(), f.bytes.len());
            // §8.2.1: no NUL, CR or LF in any value.
            if value.iter().any(|&b| matches!(b, 0 | b'\n' | b'\r')) {
                malformed = true;
            }
            if let Some(pseudo) = name.strip_prefix(b":") {
                let i = match pseudo {
                    b"method" => 0,
                    b"scheme" => 1,
                    b"authority" => 2,
                    b"path" => 3,
                    _ => {
                        malformed = true;
                        return;
                    }
                };
                if regular_seen || f.pseudo[i].is_some() {
                    malformed = true;
                }
                f.pseudo[i] = Some((mid, end));
                return;
            }
            regular_seen = true;
            let bad_name = name.is_empty()
                // §8.2.1: no controls, spaces, uppercase, colons or non-ASCII in names.
                || name
                    .iter()
                    .any(|&b| b <= 0x20 || b >= 0x7f || b == b':' || b.is_ascii_uppercase())
                || matches!(
                    name,
                    b"connection"
                        | b"keep-alive"
                        | b"proxy-connection"
                        | b"transfer-encoding"
                        | b"upgrade"
                )
                || (name == b"te" && value != b"trailers");
            if bad_name {
                malformed = true;
            }
            if name == b"content-length" {
                let parsed = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                if parsed.is_none() || content_length.is_some_and(|l| Some(l) != parsed) {
                    malformed = true;
                }
                content_length = parsed;
            }
            f.regular.push((start, mid, end));
        })?;
        if list > limit {
            return Ok(Check::TooLarge);
        }
        if malformed {
            return Ok(Check::Malformed);
        }
        let p = &f.pseudo;
        if p.iter().all(Option::is_none) {
            return Ok(Check::Trailers);
        }
        let path_empty = p[3].is_none_or(|(a, b)| a == b);
        if p[0].is_none() || p[1].is_none() || path_empty {
            return Ok(Check::Malformed);
        }
        Ok(Check::Request { content_length })
    }
}

/// A request's headers, borrowed from the connection.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    pub(super) fields: &'a Fields,
}

/// A request's headers kept past the next event: a copy of [`RequestHead`]'s.
#[derive(Debug, Clone)]
pub struct OwnedRequestHead {
    fields: Fields,
}

impl OwnedRequestHead {
    /// The headers, to read.
    #[must_use]
    pub fn head(&self) -> RequestHead<'_> {
        RequestHead {
            fields: &self.fields,
        }
    }
}

impl<'a> RequestHead<'a> {
    /// A copy to keep (two allocations: the fields' bytes and where each lies).
    #[must_use]
    pub fn to_owned_head(&self) -> OwnedRequestHead {
        OwnedRequestHead {
            fields: self.fields.clone(),
        }
    }

    fn pseudo(&self, i: usize) -> Option<&'a [u8]> {
        self.fields.pseudo[i].map(|(a, b)| &self.fields.bytes[a..b])
    }

    /// `:method` (empty in trailers).
    #[must_use]
    pub fn method(&self) -> &'a [u8] {
        self.pseudo(0).unwrap_or_default()
    }

    /// `:scheme` (empty in trailers).
    #[must_use]
    pub fn scheme(&self) -> &'a [u8] {
        self.pseudo(1).unwrap_or_default()
    }

    /// `:authority`, if sent.
    #[must_use]
    pub fn authority(&self) -> Option<&'a [u8]> {
        self.pseudo(2)
    }

    /// `:path` (empty in trailers).
    #[must_use]
    pub fn path(&self) -> &'a [u8] {
        self.pseudo(3).unwrap_or_default()
    }

    /// The regular fields, in the order sent.
    pub fn fields(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let f = self.fields;
        f.regular
            .iter()
            .map(move |&(a, b, c)| (&f.bytes[a..b], &f.bytes[b..c]))
    }

    /// The first value of the field `name` (lowercase).
    #[must_use]
    pub fn get(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.fields().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// What a decoded header block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    Request { content_length: Option<u64> },
    Trailers,
    Malformed,
    TooLarge,
}
