//! Cluster shares under windowed algorithms: when the shares move within a window, the
//! nodes together still admit at most the limit per window (fixed window) and in every
//! trailing window (sliding log). Two engines share one rule through their `Shares`, as two
//! daemons do; a "driver" moves capacity between them at random instants, the units always
//! adding up to `SCALE` (what `sluice-coord` guarantees, seed 003 §IV), and both take
//! random load. Without the windowed share (`shares` module documentation) the node that
//! got capacity uses it again in the window where the giver already used it.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::Arc;

use proptest::prelude::*;
use sluice_server::config::Fairness;
use sluice_server::shares::{SCALE, Shares, cluster_key};
use sluice_server::{Code, Config, Descriptor, Engine, Request};

const LIMIT: u64 = 100;
const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000 * MS;
/// A start on a second boundary, as wall time would be.
const T0: u64 = 1_700_000_000 * SECOND;

fn engine(algorithm: &str, shares: &Arc<Shares>) -> Engine {
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: second, requests_per_unit: {LIMIT}, algorithm: {algorithm}, coordination: cluster }}\n"
    );
    let e = Engine::new(Config::from_yaml("t.yaml", &yaml).unwrap());
    assert!(e.attach_cluster(shares.clone()));
    e
}

/// Runs 4 s: every 50 ms the driver gives node 0 a random fraction of the units (node 1 the
/// rest); every ms each node gets 0–3 requests. Returns the admission times.
fn run(algorithm: &str, fractions: &[u8], loads: &[(u8, u8)]) -> Vec<u64> {
    // The engine's key: the rule's fairness (the default) names its measure class.
    let key = Fairness::default().key(cluster_key("d", [("k", "v")]));
    let shares = [
        Arc::new(Shares::new(SCALE / 2)),
        Arc::new(Shares::new(SCALE / 2)),
    ];
    let engines = [engine(algorithm, &shares[0]), engine(algorithm, &shares[1])];
    let request = Request::new("d", [Descriptor::new([("k", "v")])]);
    let mut admitted = Vec::new();
    for ms in 0..4_000u64 {
        let now = T0 + ms * MS;
        if ms % 50 == 0 {
            let f = u64::from(fractions[(ms / 50) as usize % fractions.len()]);
            let u0 = SCALE * f / 255;
            // The driver's clock: any monotone clock; the engine's is wall time.
            shares[0].set(key, u0, now);
            shares[1].set(key, SCALE - u0, now);
            shares[0].refresh(now);
            shares[1].refresh(now);
        }
        let (a, b) = loads[ms as usize % loads.len()];
        for (node, n) in [(0, a % 4), (1, b % 4)] {
            for _ in 0..n {
                let r = engines[node].should_rate_limit(now, &request).unwrap();
                if r.overall_code == Code::Ok {
                    admitted.push(now);
                }
            }
        }
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Epoch-aligned fixed window (envoyproxy/ratelimit's): at most L per window in total.
    #[test]
    fn fixed_window_never_admits_more_than_the_limit_per_window(
        fractions in prop::collection::vec(any::<u8>(), 1..40),
        loads in prop::collection::vec((any::<u8>(), any::<u8>()), 1..50),
    ) {
        let admitted = run("fixed-window", &fractions, &loads);
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for t in admitted {
            *per_window.entry(t / SECOND).or_default() += 1;
        }
        for (w, n) in per_window {
            prop_assert!(n <= LIMIT, "window {w}: {n} admitted > {LIMIT}");
        }
    }

    /// Sliding log: at most L in every trailing second, over both nodes.
    #[test]
    fn sliding_log_never_admits_more_than_the_limit_in_any_window(
        fractions in prop::collection::vec(any::<u8>(), 1..40),
        loads in prop::collection::vec((any::<u8>(), any::<u8>()), 1..50),
    ) {
        let admitted = run("sliding-log", &fractions, &loads);
        let mut window = VecDeque::new();
        for t in admitted {
            window.push_back(t);
            while window.front().is_some_and(|&f| f + SECOND <= t) {
                window.pop_front();
            }
            prop_assert!(window.len() as u64 <= LIMIT, "{} in the second before {t}", window.len());
        }
    }
}

/// The shares still move: after a raise has been in force for a full window, the node that
/// got it admits it (the windowed share is a delay, not a loss).
#[test]
fn a_raise_is_usable_after_a_full_window() {
    // Node 0 holds 90% from the start and all the load is at node 0.
    let admitted = run("fixed-window", &[229], &[(3, 0)]);
    let last_window = admitted.iter().filter(|&&t| t >= T0 + 3 * SECOND).count() as u64;
    assert!(
        last_window >= LIMIT * 85 / 100,
        "{last_window} admitted in the last window"
    );
}
