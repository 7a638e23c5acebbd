//! Wire compatibility with the previous version (docs/PROTOCOL.md, "Versions"): messages
//! recorded by the version-13 encoder (`tests/fixtures/wire-v13.hex`, never regenerated)
//! must decode with today's code to exactly the values below, and encode back to the same
//! bytes when spoken as version 13. So a node of this build reads and answers a node of the
//! previous one, which a rolling upgrade needs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

use sluice_coord::wire::{
    self, Audit, AuditReport, KeyEntry, LEVEL_REQUEST, Lifecycle, Message, Wave,
};

const FIXTURE: &str = include_str!("fixtures/wire-v13.hex");

fn entry(key: u64, given: u64, seen: u64, indicator: f32) -> KeyEntry {
    KeyEntry {
        key,
        given,
        seen,
        indicator,
        saturated: false,
        relay: 0.0,
        relay_hops: 0,
        idle: false,
    }
}

fn header(lifecycle: Lifecycle) -> Message {
    Message {
        from_inc: 3,
        to_inc: 1_700_000_000_123,
        sent_at: 5_000_000_017,
        echo: 4_999_000_001,
        lifecycle,
        ..Message::default()
    }
}

/// What each recorded message is, by its name in the fixture.
fn expected(name: &str) -> Message {
    match name {
        "empty" => Message::default(),
        "joining" => header(Lifecycle::Joining),
        "active" => Message {
            all_keys: true,
            ..header(Lifecycle::Active)
        },
        "leaving" => Message {
            keys: vec![entry(42, 900, 0, -0.25)],
            ..header(Lifecycle::Leaving)
        },
        "left" => header(Lifecycle::Left),
        "keys" => Message {
            all_keys: true,
            keys: vec![
                entry(1, 0, 0, 0.0),
                KeyEntry {
                    saturated: true,
                    ..entry(2, 1_048_576, 524_288, -0.5)
                },
                KeyEntry {
                    idle: true,
                    ..entry(3, 7, 9, 1.5)
                },
                // A relay request carrying a neighbour's unmet demand three hops away.
                KeyEntry {
                    relay: 40.5,
                    relay_hops: 3,
                    ..entry(0x0123_4567_89ab_cdef, 300, 200, -2.0)
                },
                // A quiet key's level request (bit 6 of the hops), idle and saturated.
                KeyEntry {
                    saturated: true,
                    idle: true,
                    relay: 1.0,
                    relay_hops: LEVEL_REQUEST | 2,
                    ..entry(u64::MAX, u64::MAX, u64::MAX - 1, f32::MIN_POSITIVE)
                },
            ],
            ..header(Lifecycle::Active)
        },
        "retirement" => Message {
            all_keys: true,
            keys: vec![KeyEntry {
                idle: true,
                ..entry(9, 10, 12, 0.0)
            }],
            retire: vec![(9, 10, 12), (11, 0, 5)],
            retired: vec![(13, 4_999_000_000)],
            confirm: vec![14, 15],
            ..header(Lifecycle::Active)
        },
        "fences" => Message {
            votes: vec![(0, 2, 1_700_000_000_000), (1, 2, 1_700_000_000_000)],
            dead: vec![(2, 1_699_999_999_999), (4, 7)],
            ..header(Lifecycle::Active)
        },
        "audit-gather" => Message {
            audit: Some(Box::new(Audit {
                wave: Wave {
                    root: 0,
                    root_inc: 1,
                    round: 17,
                    confirm: false,
                },
                child: true,
                ack: true,
                done: false,
                report: Some(AuditReport {
                    ok: true,
                    defaults: 3_145_728,
                    devs: vec![(5, -40), (6, 12), (7, i64::MIN), (8, i64::MAX)],
                    incs: vec![(1, 3), (3, 2)],
                    members: vec![0b1010_1011, 0b1],
                    dead: vec![(2, 1_699_999_999_999)],
                }),
                part: None,
                fence: Vec::new(),
            })),
            ..header(Lifecycle::Active)
        },
        "audit-gather-failed" => Message {
            audit: Some(Box::new(Audit {
                wave: Wave {
                    root: 0,
                    root_inc: 1,
                    round: 18,
                    confirm: false,
                },
                child: true,
                ack: false,
                done: false,
                report: Some(AuditReport::default()),
                part: None,
                fence: Vec::new(),
            })),
            ..header(Lifecycle::Active)
        },
        "audit-confirm" => Message {
            audit: Some(Box::new(Audit {
                wave: Wave {
                    root: 0,
                    root_inc: 1,
                    round: 17,
                    confirm: true,
                },
                child: true,
                ack: true,
                done: true,
                report: Some(AuditReport {
                    ok: true,
                    ..AuditReport::default()
                }),
                part: None,
                fence: vec![(2, 1_699_999_999_999), (4, 7)],
            })),
            ..header(Lifecycle::Active)
        },
        "audit-wave" => Message {
            audit: Some(Box::new(Audit {
                wave: Wave {
                    root: 1,
                    root_inc: 1_700_000_000_456,
                    round: 2,
                    confirm: true,
                },
                child: false,
                ack: true,
                done: false,
                report: None,
                part: None,
                fence: vec![(3, 9)],
            })),
            ..header(Lifecycle::Active)
        },
        "split-first" => Message {
            keys: vec![entry(20, 1, 2, 0.5), entry(21, 3, 4, 0.5)],
            confirm: vec![30],
            votes: vec![(0, 4, 8)],
            dead: vec![(4, 7)],
            ..header(Lifecycle::Active)
        },
        "split-rest" => Message {
            rest: true,
            keys: vec![entry(22, 5, 6, 0.5), entry(23, 7, 8, 0.5)],
            ..header(Lifecycle::Active)
        },
        "everything" => Message {
            all_keys: true,
            keys: vec![
                KeyEntry {
                    relay: 2.5,
                    relay_hops: 1,
                    ..entry(1, 2, 3, -1.0)
                },
                KeyEntry {
                    idle: true,
                    ..entry(4, 5, 6, 0.0)
                },
            ],
            retire: vec![(4, 5, 6)],
            retired: vec![(7, 8)],
            confirm: vec![10],
            votes: vec![(1, 2, 3)],
            dead: vec![(2, 2)],
            audit: Some(Box::new(Audit {
                wave: Wave {
                    root: 0,
                    root_inc: 4,
                    round: 1,
                    confirm: false,
                },
                child: false,
                ack: true,
                done: true,
                report: None,
                part: None,
                fence: Vec::new(),
            })),
            ..header(Lifecycle::Leaving)
        },
        "members" => Message {
            members: wire::members_digest(&[0, 1, 2, 7]),
            keys: vec![entry(77, 5, 4, 0.125)],
            ..header(Lifecycle::Active)
        },
        other => panic!("fixture line `{other}` has no expected value in this test"),
    }
}

/// Every message the fixture must hold, in its order.
const NAMES: &[&str] = &[
    "empty",
    "joining",
    "active",
    "leaving",
    "left",
    "keys",
    "retirement",
    "fences",
    "audit-gather",
    "audit-gather-failed",
    "audit-confirm",
    "audit-wave",
    "split-first",
    "split-rest",
    "everything",
    "members",
];

/// The fixture's messages, `(name, bytes)`, in order.
fn fixture() -> Vec<(&'static str, Vec<u8>)> {
    FIXTURE
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, hex) = l.split_once(' ').expect("NAME HEX");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (name, bytes)
        })
        .collect()
}

/// Every recorded version-13 message decodes to its value, and encodes back to its bytes
/// when spoken as version 13.
#[test]
fn version_13_messages_decode_and_encode_back() {
    let fixture = fixture();
    let names: Vec<&str> = fixture.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, NAMES, "the fixture holds every message, in order");
    for (name, bytes) in fixture {
        assert_eq!(bytes[0], 13, "{name}: recorded as version 13");
        let (m, v) = wire::decode_versioned(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(v, 13, "{name}: read as version 13");
        assert_eq!(m, expected(name), "{name}: decoded value");
        assert_eq!(
            wire::encode_as(&m, 13).unwrap(),
            bytes,
            "{name}: encoded back"
        );
        // The same message in this build's version reads back the same.
        assert_eq!(wire::decode(&wire::encode(&m)).unwrap(), m, "{name}: as 14");
    }
}
