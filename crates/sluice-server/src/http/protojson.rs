//! protojson: `RateLimitRequest` in, `RateLimitResponse` out, as envoyproxy/ratelimit's
//! `/json` speaks them (see the HTTP module's documentation for what is accepted).

use std::fmt;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use envoy_types::pb::google::protobuf::{self as pb_struct, UInt64Value};
use rls::rate_limit_response::rate_limit::Unit as PbUnit;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use sluice_limits::Nanos;

use super::NS_PER_S;
use crate::engine::{Request, Response};

/// The engine's request for the protojson form of a `RateLimitRequest` (see the module
/// documentation for what is accepted).
///
/// # Errors
/// A one-line reason: malformed JSON, a field of the wrong type, an unknown field, negative
/// hits or an unknown override unit. (An empty domain or descriptor list is the engine's to
/// refuse.)
pub fn request_from_json(body: &[u8]) -> Result<Request, String> {
    let request: JsonRequest = serde_json::from_slice(body)
        .map_err(|e| format!("malformed RateLimitRequest JSON: {e}"))?;
    crate::grpc::request_from_proto(request.into_proto())
        .map_err(|status| status.message().to_owned())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    domain: Option<String>,
    descriptors: Option<Vec<JsonDescriptor>>,
    #[serde(alias = "hitsAddend")]
    hits_addend: Option<ProtoInt<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    entries: Option<Vec<JsonEntry>>,
    limit: Option<JsonOverride>,
    #[serde(alias = "hitsAddend")]
    hits_addend: Option<ProtoInt<u64>>,
    #[serde(alias = "isNegativeHits")]
    is_negative_hits: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: Option<String>,
    value: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(alias = "requestsPerUnit")]
    requests_per_unit: Option<ProtoInt<u32>>,
    unit: Option<ProtoEnum>,
}

impl JsonRequest {
    fn into_proto(self) -> rls::RateLimitRequest {
        rls::RateLimitRequest {
            domain: self.domain.unwrap_or_default(),
            descriptors: self
                .descriptors
                .unwrap_or_default()
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .unwrap_or_default()
                        .into_iter()
                        .map(|e| rate_limit_descriptor::Entry {
                            key: e.key.unwrap_or_default(),
                            value: e.value.unwrap_or_default(),
                        })
                        .collect(),
                    limit: d.limit.map(|o| rate_limit_descriptor::RateLimitOverride {
                        requests_per_unit: o.requests_per_unit.map_or(0, |n| n.0),
                        unit: o.unit.map_or(0, |u| u.0),
                    }),
                    hits_addend: d.hits_addend.map(|h| UInt64Value { value: h.0 }),
                    is_negative_hits: d.is_negative_hits.unwrap_or(false),
                })
                .collect(),
            hits_addend: self.hits_addend.map_or(0, |h| h.0),
        }
    }
}

/// A protojson integer: a JSON number (integral) or a string of digits.
struct ProtoInt<T>(T);

impl<'de, T: TryFrom<u64>> Deserialize<'de> for ProtoInt<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<T: TryFrom<u64>> Visitor<'_> for V<T> {
            type Value = ProtoInt<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative whole number (a JSON number or a string of digits)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                T::try_from(v)
                    .map(ProtoInt)
                    .map_err(|_| E::custom(format!("{v} is out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                let v = u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative")))?;
                self.visit_u64(v)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                // protojson accepts `5.0` and `1e3` for integers. In range and whole, so the
                // cast is exact.
                if v.is_finite()
                    && v.fract() == 0.0
                    && (0.0..18_446_744_073_709_551_616.0).contains(&v)
                {
                    return self.visit_u64(v as u64);
                }
                Err(E::custom(format!("{v} is not a non-negative whole number")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let n = v
                    .parse::<u64>()
                    .map_err(|_| E::custom(format!("{v:?} is not a whole number")))?;
                self.visit_u64(n)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A protojson enum value of `RateLimitResponse.RateLimit.Unit`: its name or its number.
struct ProtoEnum(i32);

impl<'de> Deserialize<'de> for ProtoEnum {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ProtoEnum;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a unit name (SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR) or number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i32::try_from(v)
                    .map(ProtoEnum)
                    .map_err(|_| E::custom(format!("unit {v} is out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                i32::try_from(v)
                    .map(ProtoEnum)
                    .map_err(|_| E::custom(format!("unit {v} is out of range")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                PbUnit::from_str_name(v)
                    .map(|u| ProtoEnum(u.into()))
                    .ok_or_else(|| E::custom(format!("unknown unit {v:?}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A protojson `google.protobuf.Duration`: seconds with 0, 3, 6 or 9 fractional digits and
/// an `s` (`"1s"`, `"0.250s"`, `"1.000000001s"`), as Go's `protojson` writes it.
#[must_use]
pub fn proto_duration(ns: Nanos) -> String {
    let (secs, frac) = (ns / NS_PER_S, ns % NS_PER_S);
    if frac == 0 {
        format!("{secs}s")
    } else if frac % 1_000_000 == 0 {
        format!("{secs}.{:03}s", frac / 1_000_000)
    } else if frac % 1_000 == 0 {
        format!("{secs}.{:06}s", frac / 1_000)
    } else {
        format!("{secs}.{frac:09}s")
    }
}

/// The protojson form of `response` (`RateLimitResponse`) as the plain check answers it:
/// the engine's answer alone (no service options but `subsecond`), `durationUntilReset` in
/// whole seconds (rounded up) unless `subsecond`. `/json` answers [`proto_response_json`]
/// of the service's whole answer.
#[must_use]
pub fn response_json(response: &Response, subsecond: bool) -> String {
    let options = crate::grpc::GrpcOptions {
        subsecond_reset: subsecond,
        ..Default::default()
    };
    proto_response_json(&crate::grpc::response_to_proto_with(response, &options))
}

/// `response` as Go's `protojson.Marshal` writes it, which is what envoyproxy/ratelimit's
/// `/json` answers (`NewJsonHandler` in its `src/server/server_impl.go` marshals the whole
/// `RateLimitResponse`): fields in the order the `.proto` declares them, lowerCamelCase
/// names, zero values and empty lists left out, enums by name, `Duration` as a string
/// (`"1s"`), `google.protobuf.Struct` as a plain object with its keys sorted and its numbers
/// as Go writes a `float64` (`1`, `0.5`, `1e+21`). (Go's writer also puts a space after
/// some separators at random, to stop byte comparisons; this one never does.)
#[must_use]
pub fn proto_response_json(response: &rls::RateLimitResponse) -> String {
    let mut o = Obj::default();
    if let Some(code) = code_name(response.overall_code) {
        o.raw("overallCode", &quoted(code));
    }
    if !response.statuses.is_empty() {
        let items: Vec<String> = response.statuses.iter().map(status_json).collect();
        o.raw("statuses", &format!("[{}]", items.join(",")));
    }
    for (name, headers) in [
        ("responseHeadersToAdd", &response.response_headers_to_add),
        ("requestHeadersToAdd", &response.request_headers_to_add),
    ] {
        if !headers.is_empty() {
            let items: Vec<String> = headers.iter().map(header_json).collect();
            o.raw(name, &format!("[{}]", items.join(",")));
        }
    }
    if !response.raw_body.is_empty() {
        o.raw("rawBody", &quoted(&base64(&response.raw_body)));
    }
    if let Some(m) = &response.dynamic_metadata {
        o.raw("dynamicMetadata", &struct_json(m));
    }
    o.finish()
}

/// A JSON object written field by field, in the order given.
#[derive(Default)]
struct Obj(Vec<String>);

impl Obj {
    fn raw(&mut self, name: &str, json: &str) {
        self.0.push(format!("{}:{json}", quoted(name)));
    }

    fn finish(self) -> String {
        format!("{{{}}}", self.0.join(","))
    }
}

fn quoted(s: &str) -> String {
    // Escaping a string cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

fn code_name(code: i32) -> Option<&'static str> {
    match rls::rate_limit_response::Code::try_from(code).ok()? {
        rls::rate_limit_response::Code::Unknown => None,
        c => Some(c.as_str_name()),
    }
}

fn status_json(s: &rls::rate_limit_response::DescriptorStatus) -> String {
    let mut o = Obj::default();
    if let Some(code) = code_name(s.code) {
        o.raw("code", &quoted(code));
    }
    if let Some(l) = &s.current_limit {
        // Declared in this order in rls.proto: `name` (3) first.
        let mut limit = Obj::default();
        if !l.name.is_empty() {
            limit.raw("name", &quoted(&l.name));
        }
        if l.requests_per_unit != 0 {
            limit.raw("requestsPerUnit", &l.requests_per_unit.to_string());
        }
        match PbUnit::try_from(l.unit) {
            Ok(PbUnit::Unknown) => {}
            Ok(u) => limit.raw("unit", &quoted(u.as_str_name())),
            Err(_) => limit.raw("unit", &l.unit.to_string()),
        }
        o.raw("currentLimit", &limit.finish());
    }
    if s.limit_remaining != 0 {
        o.raw("limitRemaining", &s.limit_remaining.to_string());
    }
    if let Some(d) = &s.duration_until_reset {
        let ns = u64::try_from(d.seconds)
            .unwrap_or(0)
            .saturating_mul(NS_PER_S)
            .saturating_add(u64::try_from(d.nanos).unwrap_or(0));
        o.raw("durationUntilReset", &quoted(&proto_duration(ns)));
    }
    o.finish()
}

fn header_json(h: &HeaderValue) -> String {
    let mut o = Obj::default();
    if !h.key.is_empty() {
        o.raw("key", &quoted(&h.key));
    }
    if !h.value.is_empty() {
        o.raw("value", &quoted(&h.value));
    }
    if !h.raw_value.is_empty() {
        o.raw("rawValue", &quoted(&base64(&h.raw_value)));
    }
    o.finish()
}

/// `bytes` as protojson writes them: standard base64, padded.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A `google.protobuf.Struct` as protojson writes it: an object, keys sorted.
fn struct_json(s: &pb_struct::Struct) -> String {
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    let mut o = Obj::default();
    for k in keys {
        o.raw(k, &value_json(&s.fields[k]));
    }
    o.finish()
}

fn value_json(v: &pb_struct::Value) -> String {
    use pb_struct::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => "null".to_owned(),
        Some(Kind::NumberValue(n)) => go_float(*n),
        Some(Kind::StringValue(s)) => quoted(s),
        Some(Kind::BoolValue(b)) => b.to_string(),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => {
            let items: Vec<String> = l.values.iter().map(value_json).collect();
            format!("[{}]", items.join(","))
        }
    }
}

/// A `float64` as Go's protojson writes it: the shortest decimal that reads back as the
/// same number, without exponent from 1e-6 to 1e21 (`1`, `0.5`, `123456`), else with one
/// (`1e+21`, `1.5e-7`); NaN and the infinities as the strings protojson uses.
#[must_use]
pub fn go_float(n: f64) -> String {
    if n.is_nan() {
        return "\"NaN\"".to_owned();
    }
    if n.is_infinite() {
        return if n > 0.0 {
            "\"Infinity\""
        } else {
            "\"-Infinity\""
        }
        .to_owned();
    }
    let abs = n.abs();
    if abs == 0.0 || (1e-6..1e21).contains(&abs) {
        // Rust's `Display` is the shortest round-trip form, never with an exponent.
        return format!("{n}");
    }
    // `{:e}` is the shortest mantissa with a bare exponent (`1.5e-7`); Go signs a positive
    // exponent (`1e+21`) and, in protojson, keeps a negative one without leading zero.
    let e = format!("{n:e}");
    match e.split_once('e') {
        Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
        _ => e,
    }
}
