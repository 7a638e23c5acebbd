//! A plain call's protobuf without prost: its request read straight into the engine's
//! [`Request`], its answer's gRPC frame encoded straight from the engine's statuses.
//!
//! Requests: Envoy's have one shape (a domain, descriptors of key/value entries, maybe a
//! `hits_addend`), and prost's decoding plus the move into the engine's request cost about
//! a fifteenth of the server's work per call. [`plain_request`] reads that shape and
//! nothing else; any other message is left to prost, as before.
//!
//! Answers: for an answer of two dozen bytes, building the `RateLimitResponse` and
//! encoding it with prost (which sizes every nested message twice and writes each varint a
//! byte at a time through `BufMut`) cost about a twentieth of the server's work per call.
//! The bytes are prost's, field for field: the fields in tag order, defaults left out,
//! a present message written even when empty (the tests compare both encodings).
//!
//! Only answers without `response_headers_to_add` and `dynamic_metadata` are encoded here;
//! [`super::RateLimitGrpc::decide_local_framed`] gives the others to prost.

use sluice_limits::Nanos;

use super::{code_to_proto, duration_to_proto, unit_to_proto};
use crate::engine::{Code, Descriptor, DescriptorStatus, Entry, Request};

/// `message` in a gRPC frame: a 0 byte (not compressed), its length (4 bytes, big-endian),
/// the protobuf. The buffer is of the exact size, so `Bytes::from` takes it over as is.
pub(super) fn framed_message(message: &impl prost::Message) -> Vec<u8> {
    let len = message.encoded_len();
    let mut frame = Vec::with_capacity(5 + len);
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    // Cannot fail: the buffer holds `len` more bytes.
    let _ = message.encode(&mut frame);
    frame
}

/// The frame of the `RateLimitResponse` of `overall` and `statuses` (as
/// [`super::response_to_proto_with`] builds it without headers or metadata, its overall
/// code replaced by `overall`), `duration_until_reset` to the nanosecond when `subsecond`.
pub(super) fn framed_response(
    overall: Code,
    statuses: &[DescriptorStatus],
    subsecond: bool,
) -> Vec<u8> {
    let overall = enum_value(code_to_proto(overall).into());
    let len = field_len(overall)
        + statuses
            .iter()
            .map(|s| message_len(status_len(s, subsecond)))
            .sum::<usize>();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    put_field(&mut out, 1, overall);
    for s in statuses {
        put_key(&mut out, 2, LEN);
        put_varint(&mut out, status_len(s, subsecond) as u64);
        put_status(&mut out, s, subsecond);
    }
    out
}

/// Wire types.
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// An enum or `int32` as protobuf writes it: sign-extended to 64 bits.
fn enum_value(v: i32) -> u64 {
    i64::from(v) as u64
}

/// `rate_limit_response.DescriptorStatus`: code (1), current_limit (2), limit_remaining (3),
/// duration_until_reset (4); quota (5) is never set.
fn put_status(out: &mut Vec<u8>, s: &DescriptorStatus, subsecond: bool) {
    put_field(out, 1, enum_value(code_to_proto(s.code).into()));
    if let Some(l) = &s.current_limit {
        let name = s.limit_name.as_deref().unwrap_or_default();
        put_key(out, 2, LEN);
        put_varint(out, limit_len(l, name) as u64);
        // RateLimit: requests_per_unit (1), unit (2), name (3).
        put_field(out, 1, u64::from(l.requests_per_unit));
        put_field(out, 2, enum_value(unit_to_proto(l.unit).into()));
        if !name.is_empty() {
            put_key(out, 3, LEN);
            put_varint(out, name.len() as u64);
            out.extend_from_slice(name.as_bytes());
        }
    }
    put_field(out, 3, u64::from(s.limit_remaining));
    if let Some(d) = s.duration_until_reset {
        let (seconds, nanos) = duration(d, subsecond);
        put_key(out, 4, LEN);
        put_varint(out, (field_len(seconds) + field_len(nanos)) as u64);
        put_field(out, 1, seconds);
        put_field(out, 2, nanos);
    }
}

fn status_len(s: &DescriptorStatus, subsecond: bool) -> usize {
    let limit = s.current_limit.as_ref().map_or(0, |l| {
        message_len(limit_len(l, s.limit_name.as_deref().unwrap_or_default()))
    });
    let reset = s.duration_until_reset.map_or(0, |d| {
        let (seconds, nanos) = duration(d, subsecond);
        message_len(field_len(seconds) + field_len(nanos))
    });
    field_len(enum_value(code_to_proto(s.code).into()))
        + limit
        + field_len(u64::from(s.limit_remaining))
        + reset
}

fn limit_len(l: &crate::config::RateLimit, name: &str) -> usize {
    let name = if name.is_empty() {
        0
    } else {
        message_len(name.len())
    };
    field_len(u64::from(l.requests_per_unit))
        + field_len(enum_value(unit_to_proto(l.unit).into()))
        + name
}

/// `google.protobuf.Duration`'s seconds and nanos as varints, as [`duration_to_proto`] gives
/// them.
fn duration(d: Nanos, subsecond: bool) -> (u64, u64) {
    let pb = duration_to_proto(d, subsecond);
    (pb.seconds as u64, enum_value(pb.nanos))
}

/// The bytes of a varint field (its key is one byte), 0 when it is the default (left out).
fn field_len(v: u64) -> usize {
    if v == 0 { 0 } else { 1 + varint_len(v) }
}

/// The bytes of a length-delimited field of `len` bytes (key, length, contents).
fn message_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// 1 to 10: seven bits a byte.
fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// A varint field, left out when it is the default.
fn put_field(out: &mut Vec<u8>, tag: u8, v: u64) {
    if v != 0 {
        put_key(out, tag, VARINT);
        put_varint(out, v);
    }
}

/// Every tag here is below 16: the key is one byte.
fn put_key(out: &mut Vec<u8>, tag: u8, wire_type: u8) {
    out.push(tag << 3 | wire_type);
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The engine's request for the protobuf `RateLimitRequest` in `b` when it has the shape
/// Envoy sends: a domain, descriptors of `key`/`value` entries and nothing else, a
/// `hits_addend`, each field once (in any order). `None` for anything else — another field,
/// a field twice, bytes that are not UTF-8, a truncated message: prost decodes those, as
/// before. For what it reads, the request is the one [`super::request_from_proto`] makes of
/// prost's decoding (the tests compare both).
pub(super) fn plain_request(mut b: &[u8]) -> Option<Request> {
    let (mut domain, mut hits_addend) = (None, None);
    let mut descriptors = Vec::new();
    while !b.is_empty() {
        match take_byte(&mut b)? {
            0x0A if domain.is_none() => domain = Some(take_str(&mut b)?),
            0x12 => descriptors.push(descriptor(take_len(&mut b)?)?),
            0x18 if hits_addend.is_none() => {
                hits_addend = Some(u32::try_from(take_varint(&mut b)?).ok()?);
            }
            _ => return None,
        }
    }
    Some(Request {
        domain: domain.unwrap_or_default(),
        descriptors,
        hits_addend: hits_addend.unwrap_or(0),
    })
}

/// A `RateLimitDescriptor` of entries only.
fn descriptor(mut b: &[u8]) -> Option<Descriptor> {
    let mut entries = Vec::new();
    while !b.is_empty() {
        if take_byte(&mut b)? != 0x0A {
            return None;
        }
        let mut e = take_len(&mut b)?;
        let (mut key, mut value) = (None, None);
        while !e.is_empty() {
            match take_byte(&mut e)? {
                0x0A if key.is_none() => key = Some(take_str(&mut e)?),
                0x12 if value.is_none() => value = Some(take_str(&mut e)?),
                _ => return None,
            }
        }
        entries.push(Entry {
            key: key.unwrap_or_default(),
            value: value.unwrap_or_default(),
        });
    }
    Some(Descriptor {
        entries,
        hits_addend: None,
        limit: None,
    })
}

fn take_byte(b: &mut &[u8]) -> Option<u8> {
    let (&first, rest) = b.split_first()?;
    *b = rest;
    Some(first)
}

/// A varint of at most 5 bytes (32 bits; longer ones go to prost).
fn take_varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0_u64;
    for i in 0..5 {
        let byte = take_byte(b)?;
        v |= u64::from(byte & 0x7F) << (7 * i);
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// A length-delimited field's contents.
fn take_len<'b>(b: &mut &'b [u8]) -> Option<&'b [u8]> {
    let len = usize::try_from(take_varint(b)?).ok()?;
    let (field, rest) = (b.get(..len)?, b.get(len..)?);
    *b = rest;
    Some(field)
}

fn take_str(b: &mut &[u8]) -> Option<String> {
    std::str::from_utf8(take_len(b)?).ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    // Tests: a failed unwrap is a failed test.
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::config::{RateLimit, Unit};
    use crate::engine::Response;
    use crate::grpc::{GrpcOptions, response_to_proto_with};

    fn unit() -> impl Strategy<Value = Unit> {
        prop_oneof![
            Just(Unit::Second),
            Just(Unit::Minute),
            Just(Unit::Hour),
            Just(Unit::Day),
            Just(Unit::Week),
            Just(Unit::Month),
            Just(Unit::Year),
        ]
    }

    fn status() -> impl Strategy<Value = DescriptorStatus> {
        let small = prop_oneof![
            Just(0_u32),
            Just(1),
            Just(127),
            Just(128),
            Just(u32::MAX),
            any::<u32>()
        ];
        let nanos = prop_oneof![
            Just(0_u64),
            Just(999_999_999),
            Just(1_000_000_000),
            any::<u64>()
        ];
        (
            prop_oneof![Just(Code::Ok), Just(Code::OverLimit)],
            proptest::option::of((small.clone(), unit())),
            proptest::option::of(prop_oneof![Just(String::new()), ".{0,200}"]),
            small,
            proptest::option::of(nanos),
        )
            .prop_map(|(code, limit, name, remaining, reset)| DescriptorStatus {
                code,
                current_limit: limit.map(|(requests_per_unit, unit)| RateLimit {
                    requests_per_unit,
                    unit,
                }),
                limit_name: name.map(Arc::from),
                quota_mode: false,
                metadata: None,
                limit_remaining: remaining,
                duration_until_reset: reset,
                retry_after: None,
            })
    }

    proptest! {
        #[test]
        fn the_frame_is_prosts(
            overall in prop_oneof![Just(Code::Ok), Just(Code::OverLimit)],
            shown in prop_oneof![Just(Code::Ok), Just(Code::OverLimit)],
            statuses in proptest::collection::vec(status(), 0..5),
            subsecond in any::<bool>(),
        ) {
            let options = GrpcOptions { subsecond_reset: subsecond, ..Default::default() };
            let response = Response { overall_code: overall, statuses };
            let mut proto = response_to_proto_with(&response, &options);
            proto.overall_code = code_to_proto(shown).into();
            prop_assert_eq!(
                framed_response(shown, &response.statuses, subsecond),
                framed_message(&proto)
            );
        }
    }

    #[test]
    fn a_plain_answer_is_prosts() {
        let status = DescriptorStatus {
            code: Code::Ok,
            current_limit: Some(RateLimit {
                requests_per_unit: 1_000_000_000,
                unit: Unit::Second,
            }),
            limit_name: None,
            quota_mode: false,
            metadata: None,
            limit_remaining: 999_999_999,
            duration_until_reset: Some(250_000_000),
            retry_after: None,
        };
        let response = Response {
            overall_code: Code::Ok,
            statuses: vec![status],
        };
        let proto = response_to_proto_with(&response, &GrpcOptions::default());
        assert_eq!(
            framed_response(Code::Ok, &response.statuses, false),
            framed_message(&proto)
        );
    }

    /// What the prost path makes of `bytes`: `None` where it refuses them.
    fn by_prost(bytes: &[u8]) -> Option<Request> {
        use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
        use prost::Message as _;
        let proto = RateLimitRequest::decode(bytes).ok()?;
        crate::grpc::request_from_proto(proto).ok()
    }

    fn proto_request()
    -> impl Strategy<Value = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest> {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
            Entry as PbEntry, RateLimitOverride,
        };
        let text = prop_oneof![Just(String::new()), ".{0,12}", ".{100,200}"];
        let entry = (text.clone(), text.clone()).prop_map(|(key, value)| PbEntry { key, value });
        let descriptor = (
            proptest::collection::vec(entry, 0..4),
            proptest::option::of(any::<u64>()),
            proptest::option::of((any::<u32>(), 0..9_i32)),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(entries, hits, limit, negative)| RateLimitDescriptor {
                entries,
                limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                    requests_per_unit,
                    unit,
                }),
                hits_addend: hits
                    .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                is_negative_hits: negative,
            });
        (
            text,
            proptest::collection::vec(descriptor, 0..4),
            any::<u32>(),
        )
            .prop_map(|(domain, descriptors, hits_addend)| {
                envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
                    domain,
                    descriptors,
                    hits_addend,
                }
            })
    }

    proptest! {
        /// Every request prost encodes reads as the prost path reads it, or is left to it;
        /// one of descriptors of entries only is always read.
        #[test]
        fn a_request_reads_as_prost_reads_it(proto in proto_request(), twice in any::<bool>()) {
            use prost::Message as _;
            let mut bytes = proto.encode_to_vec();
            if twice {
                // Every field twice: prost merges, the reader leaves it to prost.
                bytes.extend_from_slice(&proto.encode_to_vec());
            }
            let plain = proto.descriptors.iter().all(|d| {
                d.limit.is_none() && d.hits_addend.is_none() && !d.is_negative_hits
            });
            match plain_request(&bytes) {
                Some(r) => prop_assert_eq!(Some(r), by_prost(&bytes)),
                None => prop_assert!(twice || !plain, "a plain request left to prost"),
            }
        }

        /// Any bytes: what the reader reads, prost reads alike.
        #[test]
        fn any_bytes_read_as_prost_reads_them(
            bytes in proptest::collection::vec(
                prop_oneof![Just(0x0A_u8), Just(0x12), Just(0x18), Just(0x80), any::<u8>()],
                0..64,
            ),
        ) {
            if let Some(r) = plain_request(&bytes) {
                prop_assert_eq!(Some(r), by_prost(&bytes));
            }
        }
    }

    #[test]
    fn envoys_request_is_read() {
        // domain "bench", one descriptor {k: hot}: what bench-daemon.sh sends.
        let bytes = [
            0x0A, 5, b'b', b'e', b'n', b'c', b'h', 0x12, 10, 0x0A, 8, 0x0A, 1, b'k', 0x12, 3, b'h',
            b'o', b't',
        ];
        let r = plain_request(&bytes).unwrap();
        assert_eq!(Some(r.clone()), by_prost(&bytes));
        assert_eq!(r.domain, "bench");
        assert_eq!(r.descriptors[0].entries[0].value, "hot");
    }
}
