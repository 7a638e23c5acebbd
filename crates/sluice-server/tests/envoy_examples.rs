//! envoyproxy/ratelimit's documented examples (its README, "Configuration → Examples" 1–9),
//! each config loaded unchanged and driven with requests; the expected answers are what
//! that README says its service answers.
#![allow(clippy::unwrap_used)]

mod support;

use sluice_server::{Config, Descriptor, DescriptorStatus, Engine, RateLimit, Request};
use support::{EXAMPLES, Limit, NoLimit, OK, SEC, T0, Unlimited, Want};

fn request(domain: &str, send: &[&[(&str, &str)]]) -> Request {
    Request::new(
        domain,
        send.iter().map(|d| Descriptor::new(d.iter().copied())),
    )
}

fn check_status(
    example: &str,
    step: usize,
    i: usize,
    got: &DescriptorStatus,
    want: Want,
    now: u64,
) {
    let ctx = format!("{example}, step {step}, descriptor {i}: got {got:?}, want {want:?}");
    match want {
        NoLimit => {
            assert_eq!(
                (got.code, got.current_limit, got.limit_remaining),
                (OK, None, 0),
                "{ctx}"
            );
            assert_eq!(got.duration_until_reset, None, "{ctx}");
        }
        Unlimited => {
            assert_eq!(
                (got.code, got.current_limit, got.limit_remaining),
                (OK, None, u32::MAX),
                "{ctx}"
            );
        }
        Limit(code, rpu, unit, remaining) => {
            let limit = Some(RateLimit {
                requests_per_unit: rpu,
                unit,
            });
            assert_eq!(
                (got.code, got.current_limit, got.limit_remaining),
                (code, limit, remaining),
                "{ctx}"
            );
            // Fixed windows aligned to the unix epoch: reset at the end of the unit.
            assert_eq!(
                got.duration_until_reset,
                Some(unit.nanos() - now % unit.nanos()),
                "{ctx}"
            );
        }
    }
}

#[test]
fn documented_examples_answer_as_envoyproxy_ratelimit() {
    for ex in EXAMPLES {
        let config = Config::from_yaml(format!("{}.yaml", ex.domain), ex.yaml)
            .unwrap_or_else(|e| panic!("{}: {e}", ex.name));
        let engine = Engine::new(config);
        for (n, step) in ex.steps.iter().enumerate() {
            let now = T0 + step.at;
            let req = request(ex.domain, step.send);
            let mut last = None;
            for _ in 0..step.times {
                last = Some(engine.should_rate_limit(now, &req).unwrap());
            }
            let resp = last.unwrap();
            assert_eq!(
                resp.overall_code, step.overall,
                "{}, step {n}: {resp:?}",
                ex.name
            );
            assert_eq!(
                resp.statuses.len(),
                step.last.len(),
                "{}, step {n}",
                ex.name
            );
            for (i, (got, want)) in resp.statuses.iter().zip(step.last).enumerate() {
                check_status(ex.name, n, i, got, *want, now);
            }
        }
    }
}

#[test]
fn mid_window_reset_is_time_to_window_end() {
    let engine = Engine::new(Config::from_yaml("a.yaml", EXAMPLES[0].yaml).unwrap());
    let now = T0 + 59 * SEC + 250_000_000; // 0.75 s before the next second
    let r = engine
        .should_rate_limit(now, &request("mongo_cps", &[&[("database", "users")]]))
        .unwrap();
    assert_eq!(r.statuses[0].duration_until_reset, Some(750_000_000));
}

#[test]
fn unknown_domain_is_ok_without_limits() {
    // envoyproxy/ratelimit: GetLimit finds no domain, so every descriptor is OK with no limit.
    let engine = Engine::new(Config::from_yaml("a.yaml", EXAMPLES[0].yaml).unwrap());
    let r = engine
        .should_rate_limit(
            T0,
            &request("nope", &[&[("database", "users")], &[("a", "b")]]),
        )
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 2);
    for s in &r.statuses {
        assert_eq!((s.code, s.current_limit, s.limit_remaining), (OK, None, 0));
    }
}
