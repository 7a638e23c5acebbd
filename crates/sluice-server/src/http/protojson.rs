//! protojson: `RateLimitRequest` in, `RateLimitResponse` out, as envoyproxy/ratelimit's
//! `/json` speaks them (see the HTTP module's documentation for what is accepted).

use std::fmt;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use envoy_types::pb::google::protobuf::UInt64Value;
use rls::rate_limit_response::rate_limit::Unit as PbUnit;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};
use sluice_limits::Nanos;

use super::NS_PER_S;
use crate::config::Unit;
use crate::engine::{Code, DescriptorStatus, Request, Response};

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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse {
    overall_code: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<JsonStatus>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    /// The rule's `name` (first: protojson writes fields in the proto's order).
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    unit: &'static str,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

fn unit_name(unit: Unit) -> &'static str {
    match unit {
        Unit::Second => "SECOND",
        Unit::Minute => "MINUTE",
        Unit::Hour => "HOUR",
        Unit::Day => "DAY",
        Unit::Week => "WEEK",
        Unit::Month => "MONTH",
        Unit::Year => "YEAR",
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

fn status_json(s: &DescriptorStatus, subsecond: bool) -> JsonStatus {
    // envoyproxy/ratelimit: the time left in the window, rounded up to a whole second.
    let reset = |ns: Nanos| {
        if subsecond {
            proto_duration(ns)
        } else {
            proto_duration(ns.div_ceil(NS_PER_S).saturating_mul(NS_PER_S))
        }
    };
    JsonStatus {
        code: code_name(s.code),
        current_limit: s.current_limit.map(|l| JsonLimit {
            name: s.limit_name.as_deref().map(str::to_owned),
            requests_per_unit: l.requests_per_unit,
            unit: unit_name(l.unit),
        }),
        limit_remaining: s.limit_remaining,
        duration_until_reset: s.duration_until_reset.map(reset),
    }
}

/// The protojson form of `response` (`RateLimitResponse`), as `/json` answers it;
/// `durationUntilReset` in whole seconds (rounded up) unless `subsecond`.
#[must_use]
pub fn response_json(response: &Response, subsecond: bool) -> String {
    let json = JsonResponse {
        overall_code: code_name(response.overall_code),
        statuses: response
            .statuses
            .iter()
            .map(|st| status_json(st, subsecond))
            .collect(),
    };
    // Plain structs of strings and integers: serialising cannot fail.
    serde_json::to_string(&json).unwrap_or_default()
}
