//! What an [`Engine`](super::Engine) is asked and what it answers: a request of
//! descriptors, and a status per descriptor (envoyproxy/ratelimit's `RateLimitRequest` and
//! `RateLimitResponse`, without the protobuf).

use std::sync::Arc;

use sluice_limits::Nanos;

use crate::config::{Metadata, RateLimit};

/// One `key: value` pair of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
}

/// A `RateLimitDescriptor`: entries from the root of the tree downwards.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// The entries.
    pub entries: Vec<Entry>,
    /// The descriptor's own `hits_addend`, overriding the request's when set.
    pub hits_addend: Option<u64>,
    /// The descriptor's own `limit` (Envoy's `RateLimitOverride`): when set, and the domain
    /// is configured, it applies instead of the configured rule.
    pub limit: Option<RateLimit>,
}

impl Descriptor {
    /// A descriptor of these `(key, value)` pairs.
    pub fn new<K: Into<String>, V: Into<String>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            entries: entries
                .into_iter()
                .map(|(k, v)| Entry {
                    key: k.into(),
                    value: v.into(),
                })
                .collect(),
            hits_addend: None,
            limit: None,
        }
    }
}

/// A `RateLimitRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    /// The domain.
    pub domain: String,
    /// The descriptors, each decided on its own.
    pub descriptors: Vec<Descriptor>,
    /// Permits each descriptor takes (0 counts as 1).
    pub hits_addend: u32,
}

impl Request {
    /// A request of one hit for these descriptors.
    pub fn new(
        domain: impl Into<String>,
        descriptors: impl IntoIterator<Item = Descriptor>,
    ) -> Self {
        Self {
            domain: domain.into(),
            descriptors: descriptors.into_iter().collect(),
            hits_addend: 1,
        }
    }
}

/// `RateLimitResponse.Code` (without `UNKNOWN`, which this engine never answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// `OK`.
    Ok,
    /// `OVER_LIMIT`.
    OverLimit,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// The descriptor's code.
    pub code: Code,
    /// The limit applied, if any.
    pub current_limit: Option<RateLimit>,
    /// The `name` of the rule applied, if it has one (`current_limit.name` on the wire).
    pub limit_name: Option<Arc<str>>,
    /// The descriptor is governed by a `quota_mode` rule: when over its quota it is
    /// answered `OVER_LIMIT`, but refuses the request only if every quota-mode descriptor
    /// of the request is over ([`overall_code`]).
    pub quota_mode: bool,
    /// The rule's `metadata`, as envoyproxy/ratelimit's `GetLimit` hands it on: `None` when
    /// the rule has none, and when the rule counts per runtime value (`detailed_metric`, or
    /// `value_to_metric` naming a value), where upstream rebuilds the limit without it.
    pub metadata: Option<Arc<Metadata>>,
    /// Permits left (0 without a limit or when over it, `u32::MAX` for `unlimited`).
    pub limit_remaining: u32,
    /// Time until the limit is back to its full allowance, in nanoseconds (`None` without a
    /// limit). For the default fixed window, the time to the end of the window, like
    /// envoyproxy/ratelimit (which gives it in whole seconds).
    pub duration_until_reset: Option<Nanos>,
    /// When refused, the algorithm's wait after which the same request would be admitted
    /// (`sluice_limits::Decision::retry_after`): exact for every algorithm. `None` when
    /// admitted, without a limit, when it can never be admitted (cost above the burst), or
    /// when no wait is known (a block rule, a cluster node holding nothing): HTTP then
    /// falls back to `duration_until_reset`. Not on Envoy's wire (the proto has no field).
    pub retry_after: Option<Nanos>,
}

impl DescriptorStatus {
    /// Whether this is the answer for an `unlimited: true` rule.
    #[must_use]
    pub fn is_unlimited(&self) -> bool {
        self.current_limit.is_none() && self.limit_remaining == u32::MAX
    }

    /// No rule applies.
    pub(super) const NO_LIMIT: Self = Self {
        code: Code::Ok,
        current_limit: None,
        limit_name: None,
        quota_mode: false,
        metadata: None,
        limit_remaining: 0,
        duration_until_reset: None,
        retry_after: None,
    };

    /// `unlimited: true`.
    pub(super) const UNLIMITED: Self = Self {
        code: Code::Ok,
        current_limit: None,
        limit_name: None,
        quota_mode: false,
        metadata: None,
        limit_remaining: u32::MAX,
        duration_until_reset: None,
        retry_after: None,
    };
}

/// `RateLimitResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// `OVER_LIMIT` if any descriptor is.
    pub overall_code: Code,
    /// One status per descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
}

/// A request the engine refuses to decide (envoyproxy/ratelimit answers these with a gRPC
/// error); nothing is counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `domain` is empty.
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// No descriptor.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
}
