//! The encoding's unit tests: round trips, versions, refusals.

use super::*;

fn entry(key: Key, relay: f32) -> KeyEntry {
    KeyEntry {
        key,
        given: key * 1000 + 7,
        seen: key * 3,
        indicator: -1.5,
        saturated: key.is_multiple_of(2),
        relay,
        relay_hops: if relay > 0.0 { 3 } else { 0 },
        idle: key.is_multiple_of(3),
    }
}

fn message(keys: u64, extras: bool) -> Message {
    Message {
        from_inc: 2,
        to_inc: 1,
        sent_at: 1_000_000 + keys,
        echo: 999,
        lifecycle: Lifecycle::Active,
        all_keys: extras,
        keys: (1..=keys)
            .map(|k| entry(k, (k % 2) as f32 * 40.0))
            .collect(),
        retire: if extras { vec![(1, 5, 9)] } else { Vec::new() },
        retired: if extras { vec![(2, 77)] } else { Vec::new() },
        confirm: if extras { vec![3] } else { Vec::new() },
        votes: if extras { vec![(1, 4, 7)] } else { Vec::new() },
        dead: if extras {
            vec![(4, 6), (9, 1)]
        } else {
            Vec::new()
        },
        audit: extras.then(|| {
            Box::new(Audit {
                wave: Wave {
                    root: 1,
                    root_inc: 3,
                    round: 8,
                    confirm: false,
                },
                child: true,
                ack: false,
                done: false,
                report: Some(AuditReport {
                    ok: true,
                    defaults: 900,
                    devs: vec![(5, -40), (6, 12)],
                    incs: vec![(1, 2), (2, 1)],
                    members: vec![0b11],
                    dead: vec![(4, 6)],
                }),
                part: None,
                fence: Vec::new(),
            })
        }),
        ..Message::default()
    }
}

/// Decoding into a reused buffer gives exactly what a fresh decode gives, whatever the
/// buffer held before (more keys, fewer, extras or none, a failed decode).
#[test]
fn decode_into_a_reused_buffer_is_decode() {
    let mut buf = Message::default();
    for m in [
        message(5, true),
        message(1, false),
        message(0, true),
        message(40, false),
        message(2, false),
    ] {
        let bytes = encode(&m);
        assert_eq!(encoded_len(&m), bytes.len());
        // Appending to a buffer that already holds a message appends exactly these bytes.
        let mut two = vec![0xAA];
        encode_into(&m, &mut two);
        assert_eq!(&two[1..], &bytes[..]);
        decode_into(&bytes, &mut buf).unwrap();
        assert_eq!(buf, m);
        assert_eq!(decode(&bytes).unwrap(), m);
        // A failed decode leaves a valid buffer that the next one overwrites whole.
        assert!(decode_into(&bytes[..bytes.len() - 1], &mut buf).is_err());
    }
    let m = message(3, true);
    decode_into(&encode(&m), &mut buf).unwrap();
    assert_eq!(buf, m);
}

/// A message of a version this build does not read is refused by its first byte, not
/// misread; nor is one written.
#[test]
fn another_version_is_refused() {
    let m = message(2, true);
    for v in [MIN_VERSION - 1, VERSION + 1, 0, u8::MAX] {
        let mut bytes = encode(&m);
        bytes[0] = v;
        assert_eq!(decode(&bytes), Err(WireError::Version(v)));
        assert_eq!(encode_as(&m, v), Err(WireError::Version(v)));
    }
}

/// A stated members digest is never 0: a message that writes one is refused.
#[test]
fn a_zero_members_digest_is_refused() {
    let m = Message {
        members: members_digest(&[0, 1, 2]),
        ..message(3, true)
    };
    assert_eq!(decode_versioned(&encode(&m)).unwrap(), (m.clone(), VERSION));
    let mut zero = encode(&m);
    let flags_at = 1 + [m.from_inc, m.to_inc, m.sent_at, m.echo]
        .iter()
        .map(|&x| varint_len(x))
        .sum::<usize>();
    zero[flags_at + 1..flags_at + 9].fill(0);
    assert!(matches!(decode(&zero), Err(WireError::Tag { .. })));
}

/// Version 14 carries a part of a gather report; version 13 cannot say it and sends a
/// report that failed instead (never a part read as the whole report, which would count
/// only the part's keys), and refuses the part's flag bit. Without a part, 14 is 13 but
/// for its first byte.
#[test]
fn a_report_part_is_version_14() {
    let mut m = message(3, true);
    let a = m.audit.as_mut().unwrap();
    a.part = Some(Part { index: 1, count: 3 });
    let (back, v) = decode_versioned(&encode(&m)).unwrap();
    assert_eq!((back, v), (m.clone(), 14));
    let (back, v) = decode_versioned(&encode_as(&m, 13).unwrap()).unwrap();
    assert_eq!(v, 13);
    let a = back.audit.unwrap();
    assert_eq!((a.part, a.report), (None, Some(AuditReport::default())));
    let plain = message(3, true);
    let (a, b) = (encode(&plain), encode_as(&plain, 13).unwrap());
    assert_eq!((a[0], &a[1..]), (14, &b[1..]));
    let mut forged = encode(&m);
    forged[0] = 13;
    assert!(matches!(decode(&forged), Err(WireError::Tag { .. })));
    // Parts out of range: refused.
    for (index, count) in [(0, 1), (3, 3), (0, MAX_PARTS + 1)] {
        m.audit.as_mut().unwrap().part = Some(Part { index, count });
        assert!(decode(&encode(&m)).is_err(), "{index}/{count}");
    }
}

/// Parts are consecutive, cover every entry, and each fits in its budget unless one
/// entry alone does not.
#[test]
fn split_devs_cuts_within_the_budget() {
    let devs: Vec<(Key, i64)> = (0..1_000u64)
        .map(|k| (k.wrapping_mul(0x9e37_79b9_7f4a_7c15), k as i64 - 500))
        .collect();
    for max in [1, 13, 100, 4_000, 1 << 20] {
        let parts = split_devs(&devs, max);
        assert_eq!(parts.first().unwrap().start, 0);
        assert_eq!(parts.last().unwrap().end, devs.len());
        for w in parts.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        for p in &parts {
            assert!(!p.is_empty());
            let bytes: usize = devs[p.clone()]
                .iter()
                .map(|&(k, d)| varint_len(k) + varint_len(zigzag(d)))
                .sum();
            assert!(bytes <= max || p.len() == 1, "{max}: {bytes}");
        }
    }
    assert_eq!(split_devs(&[], 10), vec![0..0]);
}

/// The digest is a fixed function (every build must agree): FNV-1a 64 of the sorted,
/// deduplicated ids as little-endian u32s, never 0.
#[test]
fn the_members_digest_is_stable() {
    assert_eq!(members_digest(&[]), 0xcbf2_9ce4_8422_2325);
    assert_eq!(members_digest(&[2, 0, 1, 1]), members_digest(&[0, 1, 2]));
    assert_ne!(members_digest(&[0, 1, 2]), members_digest(&[0, 1, 3]));
    assert_ne!(members_digest(&[0, 1]), members_digest(&[0, 1, 2]));
    // Written down once: a change of the function would split a cluster mid-upgrade.
    assert_eq!(members_digest(&[0, 1, 2, 3, 4]), 0xeb29_754b_740c_25f1);
}
