//! envoyproxy/ratelimit's documented examples (its README, "Configuration → Examples" 1–9)
//! as tables, shared by the engine test (`envoy_examples.rs`) and the gRPC test (`grpc.rs`):
//! each config unchanged, the requests to send, and the answers that README says its service
//! gives.
#![allow(dead_code)] // each test target uses its own part

use sluice_server::{Code, Unit};

/// Start of a unix day (so also of a second, minute and hour), in nanoseconds.
pub(crate) const T0: u64 = 1_700_006_400 * 1_000_000_000;
pub(crate) const SEC: u64 = 1_000_000_000;

/// What one descriptor status must be.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Want {
    /// No rule applies: OK, no limit.
    NoLimit,
    /// `unlimited`: OK, remaining `u32::MAX`.
    Unlimited,
    /// A limit: code, requests per unit, unit, remaining.
    Limit(Code, u32, Unit, u32),
}

pub(crate) struct Step {
    /// Descriptors of the request.
    pub(crate) send: &'static [&'static [(&'static str, &'static str)]],
    /// How many times it is sent (at `T0 + at`); only the last answer is checked.
    pub(crate) times: u32,
    pub(crate) at: u64,
    pub(crate) overall: Code,
    pub(crate) last: &'static [Want],
}

pub(crate) struct Example {
    pub(crate) name: &'static str,
    pub(crate) yaml: &'static str,
    pub(crate) domain: &'static str,
    pub(crate) steps: &'static [Step],
}

pub(crate) use Code::{Ok as OK, OverLimit as OVER};
use Unit::{Day, Minute, Second};
pub(crate) use Want::{Limit, NoLimit, Unlimited};

pub(crate) const EXAMPLES: &[Example] = &[
    Example {
        name: "Example 1: two values of one key, 500/s each",
        yaml: "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
",
        domain: "mongo_cps",
        steps: &[
            Step {
                send: &[&[("database", "users")]],
                times: 500,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 500, Second, 0)],
            },
            Step {
                send: &[&[("database", "users")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 500, Second, 0)],
            },
            Step {
                send: &[&[("database", "default")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 500, Second, 499)],
            },
            // A value not configured, and no key-only rule: no limit.
            Step {
                send: &[&[("database", "orders")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[NoLimit],
            },
            // The next second is a new window.
            Step {
                send: &[&[("database", "users")]],
                times: 1,
                at: SEC,
                overall: OK,
                last: &[Limit(OK, 500, Second, 499)],
            },
        ],
    },
    Example {
        name: "Example 2: nested descriptors, a key without value, two descriptors in one request",
        yaml: "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
",
        domain: "messaging",
        steps: &[
            Step {
                send: &[
                    &[("message_type", "marketing"), ("to_number", "2061111111")],
                    &[("to_number", "2061111111")],
                ],
                times: 5,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 5, Day, 0), Limit(OK, 100, Day, 95)],
            },
            // The 6th marketing message is refused: the logical OR of both decisions.
            Step {
                send: &[
                    &[("message_type", "marketing"), ("to_number", "2061111111")],
                    &[("to_number", "2061111111")],
                ],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 5, Day, 0), Limit(OK, 100, Day, 94)],
            },
            // Another number gets its own 5 (one limit per runtime value).
            Step {
                send: &[&[("message_type", "marketing"), ("to_number", "2062222222")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 5, Day, 4)],
            },
            // The placeholder level alone has no limit; nor has another message type.
            Step {
                send: &[&[("message_type", "marketing")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[NoLimit],
            },
            Step {
                send: &[&[
                    ("message_type", "transactional"),
                    ("to_number", "2061111111"),
                ]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[NoLimit],
            },
            // A day later the window is new.
            Step {
                send: &[&[("message_type", "marketing"), ("to_number", "2061111111")]],
                times: 1,
                at: 86_400 * SEC,
                overall: OK,
                last: &[Limit(OK, 5, Day, 4)],
            },
        ],
    },
    Example {
        name: "Example 3: key/value is matched before key only; 0 per unit blocks",
        yaml: "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
",
        domain: "edge_proxy_per_ip",
        steps: &[
            Step {
                send: &[&[("remote_address", "50.0.0.1")]],
                times: 10,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 10, Second, 0)],
            },
            Step {
                send: &[&[("remote_address", "50.0.0.1")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 10, Second, 0)],
            },
            Step {
                send: &[&[("remote_address", "50.0.0.2")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 10, Second, 9)],
            },
            Step {
                send: &[&[("remote_address", "50.0.0.5")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 0, Second, 0)],
            },
            Step {
                send: &[&[("remote_address", "50.0.0.5")]],
                times: 1,
                at: 5 * SEC,
                overall: OVER,
                last: &[Limit(OVER, 0, Second, 0)],
            },
        ],
    },
    Example {
        name: "Example 4 (first config): a longer descriptor does not match a shorter rule",
        yaml: "
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
",
        domain: "example4",
        steps: &[
            Step {
                send: &[&[("key", "value"), ("subkey", "subvalue")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[NoLimit],
            },
            Step {
                send: &[&[("key", "value")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 300, Second, 299)],
            },
        ],
    },
    Example {
        name: "Example 4 (second config): the rule at the request's depth applies",
        yaml: "
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
",
        domain: "example4",
        steps: &[
            Step {
                send: &[&[("key", "value"), ("subkey", "subvalue")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 300, Second, 299)],
            },
            Step {
                send: &[&[("key", "value")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[NoLimit],
            },
        ],
    },
    Example {
        name: "Example 5: unlimited",
        yaml: "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
",
        domain: "internal",
        steps: &[
            Step {
                send: &[&[("ldap", "x")]],
                times: 1000,
                at: 0,
                overall: OK,
                last: &[Unlimited],
            },
            Step {
                send: &[&[("azure", "x")], &[("ldap", "y")]],
                times: 100,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 100, Minute, 0), Unlimited],
            },
            Step {
                send: &[&[("azure", "x")], &[("ldap", "y")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 100, Minute, 0), Unlimited],
            },
        ],
    },
    Example {
        name: "Example 6: shadow_mode counts but always answers OK",
        yaml: "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
",
        domain: "example6",
        steps: &[
            Step {
                send: &[&[("service", "auth-service"), ("user", "user-a")]],
                times: 10,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 10, Second, 0)],
            },
            Step {
                send: &[&[("service", "auth-service"), ("user", "user-a")]],
                times: 50,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 10, Second, 0)],
            },
            Step {
                send: &[&[("service", "auth-service"), ("user", "user-b")]],
                times: 20,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 20, Second, 0)],
            },
            Step {
                send: &[&[("service", "auth-service"), ("user", "user-b")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 20, Second, 0)],
            },
        ],
    },
    Example {
        name: "Example 7: replaces",
        yaml: "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
",
        domain: "example7",
        steps: &[
            // Both match: only the replacing 10/s applies; the 5/s is neither applied nor counted.
            Step {
                send: &[
                    &[("key_1", "value_1"), ("user", "bkthomps")],
                    &[("key_2", "value_2"), ("user", "bkthomps")],
                ],
                times: 10,
                at: 0,
                overall: OK,
                last: &[NoLimit, Limit(OK, 10, Second, 0)],
            },
            Step {
                send: &[
                    &[("key_1", "value_1"), ("user", "bkthomps")],
                    &[("key_2", "value_2"), ("user", "bkthomps")],
                ],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[NoLimit, Limit(OVER, 10, Second, 0)],
            },
            // Alone, the named rule applies with its 5/s untouched by the above.
            Step {
                send: &[&[("key_1", "value_1"), ("user", "bkthomps")]],
                times: 5,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 5, Second, 0)],
            },
            Step {
                send: &[&[("key_1", "value_1"), ("user", "bkthomps")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 5, Second, 0)],
            },
        ],
    },
    Example {
        name: "Example 8: detailed_metric changes metrics only",
        yaml: "
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
        domain: "example8",
        steps: &[
            Step {
                send: &[&[("key1", "unspecified_value")]],
                times: 10,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 10, Minute, 0)],
            },
            Step {
                send: &[&[("key1", "unspecified_value2")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 10, Minute, 9)],
            },
            Step {
                send: &[&[("key1", "value1")]],
                times: 20,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 20, Minute, 0)],
            },
            Step {
                send: &[&[("key1", "value1")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 20, Minute, 0)],
            },
        ],
    },
    Example {
        name: "Example 9: wildcard values",
        yaml: "
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
        domain: "example9",
        steps: &[
            Step {
                send: &[&[("key1", "value_1")]],
                times: 20,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 20, Minute, 0)],
            },
            Step {
                send: &[&[("key1", "value_1")]],
                times: 1,
                at: 0,
                overall: OVER,
                last: &[Limit(OVER, 20, Minute, 0)],
            },
            Step {
                send: &[&[("key1", "value_2")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[Limit(OK, 20, Minute, 19)],
            },
            Step {
                send: &[&[("key1", "other")]],
                times: 1,
                at: 0,
                overall: OK,
                last: &[NoLimit],
            },
        ],
    },
];
