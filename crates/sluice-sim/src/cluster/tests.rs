#![allow(clippy::unwrap_used)]
use super::*;

fn scenario(topo: &str, strategy: Strategy, workload: Workload, cycles: u64) -> Scenario {
    let mut s = Scenario::new(topo.parse().unwrap(), strategy, workload);
    s.cycles = cycles;
    s.seed = 7;
    s
}

fn report(s: &Scenario) -> Report {
    run(s, &mut |_, _| {}).unwrap().report
}

#[test]
fn same_seed_same_json() {
    let mut s = scenario("random-regular:8:3", Strategy::Sluice, Workload::Skewed, 80);
    s.loss = 0.2;
    s.dup = 0.1;
    s.reorder = true;
    s.crashes = vec!["20:3:50".parse().unwrap()];
    let a = serde_json::to_string(&report(&s)).unwrap();
    let b = serde_json::to_string(&report(&s)).unwrap();
    assert_eq!(a, b);
    s.seed = 8;
    assert_ne!(a, serde_json::to_string(&report(&s)).unwrap());
}

#[test]
fn conservation_under_loss_and_crash() {
    // Seed 003 §IV: no local limiter gains extra capacity, whatever the network does.
    let mut s = scenario("ring:8", Strategy::Sluice, Workload::Skewed, 150);
    s.loss = 0.3;
    s.crashes = vec!["40:2:100".parse().unwrap()];
    s.partitions = vec!["60-90:0,1".parse().unwrap()];
    let r = report(&s);
    assert!(r.max_share_sum_over_limit <= 0.0, "{r:?}");
    assert!(r.overshoot_pct <= 0.0, "{r:?}");
}

#[test]
fn sluice_over_throttles_less_than_static_on_skewed() {
    // Seed 000 §6: moving capacity to the throttled nodes reduces over-throttling.
    let sl = report(&scenario("ring:8", Strategy::Sluice, Workload::Skewed, 200));
    let st = report(&scenario("ring:8", Strategy::Static, Workload::Skewed, 200));
    assert!(
        sl.over_throttling_pct < st.over_throttling_pct / 2.0,
        "sluice {} static {}",
        sl.over_throttling_pct,
        st.over_throttling_pct
    );
}

#[test]
fn hotspot_converges() {
    let r = report(&scenario(
        "ring:6",
        Strategy::Sluice,
        Workload::Hotspot,
        300,
    ));
    assert!(r.converge_cycles.is_some(), "{r:?}");
    let st = report(&scenario(
        "ring:6",
        Strategy::Static,
        Workload::Hotspot,
        300,
    ));
    assert_eq!(st.converge_cycles, None, "{st:?}");
}

#[test]
fn steady_equalises_indicators() {
    // Seed 003 §III-A Fig. 4: JFI(q) → ~1.
    let r = report(&scenario(
        "ring:10",
        Strategy::Sluice,
        Workload::Steady,
        300,
    ));
    assert!(r.jfi_final > 0.99, "{r:?}");
    let d = report(&scenario(
        "ring:10",
        Strategy::DstSync,
        Workload::Steady,
        300,
    ));
    assert!(d.jfi_final > 0.99, "{d:?}");
}

/// `sluice serve`'s units: a small integer limit over a few nodes (10 per node, gifts
/// and relays in whole units) stalls with a unit per request and converges with the
/// daemon's 2²⁰; the units still never add up to more than `K·L`, and a seed still
/// gives one run.
#[test]
fn units_per_request_unstick_a_small_limit_and_keep_it() {
    let mut s = scenario("ring:10", Strategy::Sluice, Workload::Steady, 200);
    s.limit = Some(100);
    let whole = report(&s);
    s.units_per_request = 1 << 20;
    let out = run(&s, &mut |_, _| {}).unwrap();
    let fine = &out.report;
    assert_eq!(fine.units_per_request, 1 << 20);
    assert!(fine.max_share_sum_over_limit <= 0.0, "{fine:?}");
    assert!(fine.overshoot_pct <= 0.0, "{fine:?}");
    // Admissions are whole requests: Σ ⌊u/K⌋ ≤ L every cycle.
    assert!(
        out.trace.iter().all(|r| r.sum_enforced <= 100.0),
        "{fine:?}"
    );
    assert!(
        fine.over_throttling_pct < whole.over_throttling_pct / 4.0,
        "K = 2^20: {} %, K = 1: {} %",
        fine.over_throttling_pct,
        whole.over_throttling_pct
    );
    assert!(
        whole.jfi_final < 0.5 && fine.jfi_final > 0.99,
        "{whole:?} {fine:?}"
    );
    assert_eq!(
        serde_json::to_string(fine).unwrap(),
        serde_json::to_string(&report(&s)).unwrap()
    );
}

#[test]
fn units_per_request_conserve_under_loss_and_crash() {
    let mut s = scenario("ring:8", Strategy::Sluice, Workload::Skewed, 150);
    s.units_per_request = 1000;
    s.loss = 0.3;
    s.dup = 0.1;
    s.reorder = true;
    s.crashes = vec!["40:2:100".parse().unwrap()];
    s.partitions = vec!["60-90:0,1".parse().unwrap()];
    let r = report(&s);
    assert!(r.max_share_sum_over_limit <= 0.0, "{r:?}");
    assert!(r.overshoot_pct <= 0.0, "{r:?}");
    let json = serde_json::to_string(&r).unwrap();
    assert!(
        json.contains(r#""limit":10000,"units_per_request":1000,"#),
        "{json}"
    );
    // One unit per request prints what runs before the option printed.
    s.units_per_request = 1;
    assert!(
        !serde_json::to_string(&report(&s))
            .unwrap()
            .contains("units_per_request")
    );
}

#[test]
fn units_per_request_are_checked() {
    let mut s = scenario("ring:4", Strategy::Sluice, Workload::Steady, 10);
    let err = |s: &Scenario| run(s, &mut |_, _| {}).unwrap_err().to_string();
    s.units_per_request = 0;
    assert!(err(&s).contains("--units-per-request 0"), "{}", err(&s));
    // K·L beyond 2^53 (and beyond u64) is refused, not wrapped.
    s.units_per_request = u64::MAX;
    assert!(err(&s).contains("2^53"), "{}", err(&s));
    s.limit = Some(1);
    s.units_per_request = MAX_UNITS + 1;
    assert!(err(&s).contains("2^53"), "{}", err(&s));
    s.units_per_request = MAX_UNITS;
    assert!(run(&s, &mut |_, _| {}).is_ok());
    s.strategy = Strategy::DstSync;
    assert!(err(&s).contains("dst-sync"), "{}", err(&s));
    s.units_per_request = 1;
    assert!(run(&s, &mut |_, _| {}).is_ok());
}

#[test]
fn bad_input_is_an_error() {
    assert!("x:1".parse::<Crash>().is_err());
    assert!("5:1:3".parse::<Crash>().is_err());
    assert!("9-3:1".parse::<Partition>().is_err());
    assert!("steady-ish".parse::<Workload>().is_err());
    let mut s = scenario("ring:4", Strategy::Sluice, Workload::Steady, 10);
    s.nodes = Some(5);
    assert!(run(&s, &mut |_, _| {}).is_err());
    s.nodes = None;
    s.gain = Gain::Fixed(3.0);
    assert!(matches!(
        run(&s, &mut |_, _| {}),
        Err(ClusterError::Config(_))
    ));
}
