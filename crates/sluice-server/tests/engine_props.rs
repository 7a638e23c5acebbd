//! Properties of the engine on random requests: no panic, malformed requests and
//! non-consuming checks change no state, a non-consuming check answers what the
//! consuming one then does, and `hits_addend` semantics.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_server::{
    Code, Config, Descriptor, Engine, Entry, RateLimit, Request, RequestError, Response, Unit,
};

/// Every algorithm, nesting, wildcard, unlimited, shadow mode, replaces and a block rule.
const CONFIG: &str = "
domain: d
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: k
    value: v1
    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: sliding-window, name: k1 }
  - key: k
    value: val*
    rate_limit: { unit: second, requests_per_unit: 2, algorithm: sliding-log }
  - key: a
    rate_limit: { unit: second, requests_per_unit: 4, algorithm: token-bucket, burst: 2 }
    descriptors:
      - key: b
        rate_limit: { unit: second, requests_per_unit: 2, algorithm: gcra, replaces: [{ name: k1 }] }
      - key: b
        value: v2
        shadow_mode: true
        rate_limit: { unit: second, requests_per_unit: 1, algorithm: leaky-bucket }
  - key: b
    rate_limit: { unit: hour, requests_per_unit: 6, algorithm: fixed-window-first }
  - key: x
    value: v1
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: x
    rate_limit: { unlimited: true }
  - key: w
    rate_limit: { unit: second, requests_per_unit: 3, algorithm: warm-up }
";

fn engine() -> Engine {
    Engine::new(Config::from_yaml("props.yaml", CONFIG).unwrap())
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        prop::sample::select(vec!["k", "a", "b", "x", "w", "zz", ""]),
        prop::sample::select(vec!["v1", "v2", "value_9", "val", "1", ""]),
    )
        .prop_map(|(k, v)| Entry {
            key: k.into(),
            value: v.into(),
        })
}

fn request() -> impl Strategy<Value = Request> {
    let limit = prop::option::weighted(
        0.1,
        (
            0u32..4,
            prop::sample::select(vec![Unit::Second, Unit::Minute]),
        )
            .prop_map(|(requests_per_unit, unit)| RateLimit {
                requests_per_unit,
                unit,
            }),
    );
    let descriptor = (
        prop::collection::vec(entry(), 0..4),
        prop::option::weighted(0.2, 0u64..4),
        limit,
    )
        .prop_map(|(entries, hits_addend, limit)| Descriptor {
            entries,
            hits_addend,
            limit,
        });
    (
        prop::sample::select(vec!["d", "d", "d", "", "other"]),
        prop::collection::vec(descriptor, 0..4),
        0u32..4,
    )
        .prop_map(|(domain, descriptors, hits_addend)| Request {
            domain: domain.into(),
            descriptors,
            hits_addend,
        })
}

#[derive(Debug, Clone)]
enum Op {
    Check(Request),
    Look(Request),
}

fn ops() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let op = prop_oneof![request().prop_map(Op::Check), request().prop_map(Op::Look),];
    // Time steps of 0 to 1.5 s, so windows both fill and roll over.
    prop::collection::vec((0u64..1_500_000_000, op), 1..60)
}

fn well_formed(r: &Request, resp: &Result<Response, RequestError>) {
    match resp {
        Err(RequestError::EmptyDomain) => assert!(r.domain.is_empty()),
        Err(RequestError::NoDescriptors) => {
            assert!(!r.domain.is_empty() && r.descriptors.is_empty())
        }
        Ok(resp) => {
            assert_eq!(resp.statuses.len(), r.descriptors.len());
            let over = resp.statuses.iter().any(|s| s.code == Code::OverLimit);
            assert_eq!(resp.overall_code == Code::OverLimit, over);
            for s in &resp.statuses {
                assert_eq!(s.current_limit.is_some(), s.duration_until_reset.is_some());
            }
        }
    }
}

/// Whether two descriptors of `r` count on the same counter (then a look-only check, which
/// lets both see the state before the request, may differ from the consuming one).
fn shares_a_counter(r: &Request) -> bool {
    let keys: Vec<&Vec<Entry>> = r.descriptors.iter().map(|d| &d.entries).collect();
    (0..keys.len()).any(|i| (i + 1..keys.len()).any(|j| keys[i] == keys[j]))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random requests never panic, malformed ones are errors, and look-only checks and
    /// malformed requests change nothing: an engine that also saw them answers every
    /// well-formed consuming check exactly as one that saw only those.
    #[test]
    fn look_only_and_malformed_requests_change_no_state(ops in ops()) {
        let seen_all = engine();
        let checks_only = engine();
        let mut now = 1_700_000_000_000_000_000u64;
        for (dt, op) in &ops {
            now += dt;
            match op {
                Op::Check(r) if r.domain.is_empty() || r.descriptors.is_empty() => {
                    // Malformed: an error, and only `seen_all` sees it.
                    let a = seen_all.should_rate_limit(now, r);
                    well_formed(r, &a);
                    prop_assert!(a.is_err());
                }
                Op::Check(r) => {
                    let a = seen_all.should_rate_limit(now, r);
                    let b = checks_only.should_rate_limit(now, r);
                    well_formed(r, &a);
                    prop_assert_eq!(a, b);
                }
                Op::Look(r) => {
                    let first = seen_all.check_only(now, r);
                    well_formed(r, &first);
                    prop_assert_eq!(&first, &seen_all.check_only(now, r));
                }
            }
        }
        prop_assert_eq!(seen_all.len(), checks_only.len());
    }

    /// A look-only check answers what the consuming check at the same instant answers
    /// (for requests whose descriptors count on distinct counters).
    #[test]
    fn look_only_answers_as_the_check_would(ops in ops()) {
        let e = engine();
        let mut now = 1_700_000_000_000_000_000u64;
        for (dt, op) in &ops {
            now += dt;
            let r = match op { Op::Check(r) | Op::Look(r) => r };
            let look = e.check_only(now, r);
            let check = e.should_rate_limit(now, r);
            if !shares_a_counter(r) {
                prop_assert_eq!(look, check);
            }
        }
    }

    /// Forgetting idle keys changes no answer.
    #[test]
    fn retain_idle_changes_no_answer(ops in ops()) {
        let pruned = engine();
        let kept = engine();
        let mut now = 1_700_000_000_000_000_000u64;
        for (dt, op) in &ops {
            now += dt;
            let r = match op { Op::Check(r) | Op::Look(r) => r };
            pruned.retain_idle(now);
            prop_assert_eq!(pruned.should_rate_limit(now, r), kept.should_rate_limit(now, r));
        }
    }
}

#[test]
fn hits_addend_zero_counts_as_one_and_descriptors_override() {
    let e = engine();
    let t = 1_700_006_400_000_000_000;
    let desc = |v: &str| Descriptor::new([("k", v)]);
    let mut r = Request::new("d", [desc("p")]);
    r.hits_addend = 0; // counts as 1 (limit 3/s)
    let remaining = |resp: Response| resp.statuses[0].limit_remaining;
    assert_eq!(remaining(e.should_rate_limit(t, &r).unwrap()), 2);
    r.hits_addend = 2;
    assert_eq!(remaining(e.should_rate_limit(t, &r).unwrap()), 0);

    // A descriptor's own addend wins over the request's; 0 there is a check that takes
    // nothing (envoyproxy/ratelimit).
    let mut q = Request::new("d", [desc("q"), desc("s")]);
    q.hits_addend = 1;
    q.descriptors[0].hits_addend = Some(3);
    q.descriptors[1].hits_addend = Some(0);
    let resp = e.should_rate_limit(t, &q).unwrap();
    assert_eq!(
        (
            resp.statuses[0].limit_remaining,
            resp.statuses[1].limit_remaining
        ),
        (0, 3)
    );

    // An addend larger than what is left is refused and counted all the same
    // (envoyproxy/ratelimit): the window is over, and a smaller request is refused too.
    let mut big = Request::new("d", [desc("u")]);
    big.hits_addend = 2;
    assert_eq!(remaining(e.should_rate_limit(t, &big).unwrap()), 1);
    let over = e.should_rate_limit(t, &big).unwrap();
    assert_eq!(over.overall_code, Code::OverLimit);
    assert_eq!(over.statuses[0].limit_remaining, 0);
    big.hits_addend = 1;
    let last = e.should_rate_limit(t, &big).unwrap();
    assert_eq!(
        (last.overall_code, last.statuses[0].limit_remaining),
        (Code::OverLimit, 0)
    );

    // Sluice's opt-in: a refused request is not counted, a smaller one gets the rest.
    let e = engine();
    e.set_count_refused(false);
    let mut big = Request::new("d", [desc("u")]);
    big.hits_addend = 2;
    e.should_rate_limit(t, &big).unwrap();
    assert_eq!(
        e.should_rate_limit(t, &big).unwrap().overall_code,
        Code::OverLimit
    );
    big.hits_addend = 1;
    let last = e.should_rate_limit(t, &big).unwrap();
    assert_eq!(
        (last.overall_code, last.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
}

#[test]
fn malformed_requests_are_errors() {
    let e = engine();
    let empty_domain = Request::new("", [Descriptor::new([("k", "v")])]);
    assert_eq!(
        e.should_rate_limit(0, &empty_domain),
        Err(RequestError::EmptyDomain)
    );
    let no_descriptors = Request::new("d", []);
    assert_eq!(
        e.should_rate_limit(0, &no_descriptors),
        Err(RequestError::NoDescriptors)
    );
    assert!(e.is_empty());
    // A descriptor without entries matches no rule (as in envoyproxy/ratelimit).
    let r = e
        .should_rate_limit(0, &Request::new("d", [Descriptor::default()]))
        .unwrap();
    assert_eq!(
        (r.overall_code, r.statuses[0].current_limit),
        (Code::Ok, None)
    );
}

#[test]
fn a_descriptor_limit_overrides_the_configured_rule() {
    // Envoy's `RateLimitOverride`: applies in a configured domain, as a fixed window
    // (counted apart from the configured rule); ignored in an unknown domain
    // (envoyproxy/ratelimit looks the domain up first).
    let e = engine();
    let t = 1_700_006_400_000_000_000;
    let mut d = Descriptor::new([("k", "p")]); // configured: 3/s
    d.limit = Some(RateLimit {
        requests_per_unit: 1,
        unit: Unit::Minute,
    });
    let r = Request::new("d", [d.clone()]);
    let first = e.should_rate_limit(t, &r).unwrap();
    assert_eq!(first.statuses[0].current_limit, d.limit);
    assert_eq!(first.overall_code, Code::Ok);
    assert_eq!(first.statuses[0].duration_until_reset, Some(60_000_000_000));
    assert_eq!(
        e.should_rate_limit(t, &r).unwrap().overall_code,
        Code::OverLimit
    );
    // Without the override the configured 3/s applies, on a counter of its own.
    let plain = e
        .should_rate_limit(t, &Request::new("d", [Descriptor::new([("k", "p")])]))
        .unwrap();
    assert_eq!(plain.statuses[0].limit_remaining, 2);
    let unknown = e.should_rate_limit(t, &Request::new("other", [d])).unwrap();
    assert_eq!(unknown.statuses[0].current_limit, None);
}

#[test]
fn engine_is_shared_between_threads() {
    // The gRPC shell decides from many tasks at once over one engine.
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
    let e = std::sync::Arc::new(engine());
    let t = 1_700_006_400_000_000_000;
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let e = e.clone();
            std::thread::spawn(move || {
                let r = Request::new("d", [Descriptor::new([("k", "shared")])]);
                (0..10)
                    .filter(|_| e.should_rate_limit(t, &r).unwrap().overall_code == Code::Ok)
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 3, "3 per second, however many threads ask");
}
