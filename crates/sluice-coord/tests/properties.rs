#![allow(clippy::unwrap_used)]
//! Property tests: conservation under random networks and failures; the wire decoder.

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use sluice_coord::law::jfi;
use sluice_coord::node::{Config, Fallback};
use sluice_coord::testing::{Cluster, NetConfig, Rng, Step, complete, random_connected, ring};
use sluice_coord::wire::{
    self, Audit, AuditReport, KeyEntry, Lifecycle, Message, NodeId, Part, Wave,
};

const CYCLE: u64 = 100_000_000;
const LIMIT: u64 = 1_000_000;
const KEYS: [u64; 2] = [1, 2];

#[derive(Debug, Clone)]
enum Event {
    Run(u64),
    Demand(u32, usize, f64),
    CrashRestart(u32, u64),
    /// One node cut off (see the module docs of `node` for why not groups).
    PartitionHeal(u32, u64),
    /// `size` consecutive nodes from `first` cut off together (at least one stays outside).
    GroupPartitionHeal(u32, u32, u64),
    /// Overlapping failures: node `a` cut off; `d1` cycles later node `b` crashes; `d2`
    /// cycles after that `b` restarts and the cut heals.
    CutThenCrash(u32, u32, u64, u64),
    /// Every node crashes at once; `d` cycles later they restart, `gap` cycles apart.
    RestartAll(u64, u64),
}

/// Whole-cluster restarts among the crashes and cuts.
fn restart_all_event() -> impl Strategy<Value = Event> {
    let all = (1u64..20, 0u64..6).prop_map(|(d, gap)| Event::RestartAll(d, gap));
    prop_oneof![all, event(true, true)]
}

/// Overlapping failures: a node cut off, then a crash (often of a node it needs for its
/// lease) before the cut heals, mixed with the other events.
fn overlap_event() -> impl Strategy<Value = Event> {
    let overlap = (0u32..6, 0u32..6, 1u64..25, 1u64..25)
        .prop_map(|(a, b, d1, d2)| Event::CutThenCrash(a, b, d1, d2));
    prop_oneof![overlap, event(true, true)]
}

/// Events with several nodes cut off together, on top of the network faults.
fn group_event() -> impl Strategy<Value = Event> {
    let run = (1u64..20).prop_map(Event::Run);
    let demand =
        (0u32..6, 0usize..2, 0.0f64..400_000.0).prop_map(|(n, k, r)| Event::Demand(n, k, r));
    let cut = (0u32..6, 2u32..4, 1u64..30)
        .prop_map(|(first, size, d)| Event::GroupPartitionHeal(first, size, d));
    prop_oneof![run, demand, cut]
}

fn event(crashes: bool, partitions: bool) -> impl Strategy<Value = Event> {
    let run = (1u64..20).prop_map(Event::Run);
    let demand =
        (0u32..6, 0usize..2, 0.0f64..400_000.0).prop_map(|(n, k, r)| Event::Demand(n, k, r));
    let crash = (0u32..6, 1u64..25).prop_map(|(n, d)| Event::CrashRestart(n, d));
    let cut = (0u32..6, 1u64..30).prop_map(|(n, d)| Event::PartitionHeal(n, d));
    let crash = if crashes {
        crash.boxed()
    } else {
        run.clone().boxed()
    };
    let cut = if partitions {
        cut.boxed()
    } else {
        run.clone().boxed()
    };
    prop_oneof![run, demand, crash, cut]
}

/// Up to this message loss (every scenario here draws less), a run with crashes and
/// partitions, overlapping ones included, must end exact once healed (Σ own = Σ enforced =
/// L, JFI ≥ 0.99): the audit mints what the dead held (docs/PROTOCOL.md).
const EXACT_LOSS: f64 = 0.5;

/// The cases of every property here come from a fixed seed, so CI runs the same cases
/// each time; `PROPTEST_RNG_SEED=N` explores others (and `PROPTEST_CASES=N` runs more).
/// Why: a case found at random belongs in a named scenario (`scenarios.rs`), not in a red
/// CI run nobody can reproduce.
fn config(cases: u32) -> ProptestConfig {
    // `PROPTEST_CASES=N` runs more (or fewer) cases of every property here.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let base = ProptestConfig::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_some() {
        base
    } else {
        ProptestConfig {
            rng_seed: RngSeed::Fixed(0x5eed_0003),
            ..base
        }
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Issue item 3 / seed 003 §IV: under loss (≤ 50%), duplication, reordering and delay,
    /// Σ enforced ≤ L at every event; once messages get through Σ = L exactly and the
    /// indicators equalise (JFI ≥ 0.99, seed 003 eq. 16, steady demand, C = 1.1 Λ, §III-A),
    /// up to `EXACT_LOSS` loss (a node falsely suspected and fenced starts again; the audit
    /// mints what it held).
    #[test]
    fn conservation_under_network_faults(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(event(false, false), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// Issue item 5, strict modes: with crashes and restarts on top of the network faults, on
    /// a ring, a complete graph or a random connected graph, Σ enforced ≤ L at every event
    /// (safety); once healed, Σ = L exactly and JFI ≥ 0.99 (seed 003 §IV, eq. 16) up to
    /// `EXACT_LOSS` loss.
    #[test]
    fn conservation_under_crashes(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(event(true, false), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// The same with one node cut off at a time (partitions: pitfalls (b) and (c)).
    #[test]
    fn conservation_under_partitions(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(event(false, true), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// Several nodes cut off together (the quorum on either side, or on neither): Σ enforced
    /// ≤ L at every event (strict modes); once healed Σ = L exactly up to `EXACT_LOSS` loss
    /// (seed 003 §IV: "no local limiter gains or loses extra capacity").
    #[test]
    fn conservation_under_group_partitions(
        n in 4u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(group_event(), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// Overlapping failures (a node cut off, then a crash before the cut heals): Σ enforced
    /// ≤ L at every event (strict modes); once healed Σ = L exactly and JFI ≥ 0.99 up to
    /// `EXACT_LOSS` loss.
    #[test]
    fn safety_under_overlapping_failures(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(overlap_event(), 1..6),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// Whole-cluster restarts (every node killed at once, back as new incarnations, together
    /// or a few cycles apart) among crashes and cuts, on rings, complete and random graphs:
    /// nobody is left to inherit, and the capacity audit mints the shares back (node docs,
    /// "The capacity audit"). Σ enforced ≤ L at every event; once healed Σ = L exactly and
    /// JFI ≥ 0.99 up to `EXACT_LOSS` loss (seed 003 §IV).
    #[test]
    fn whole_cluster_restarts_remint_the_limit(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(restart_all_event(), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        let exact = loss <= EXACT_LOSS;
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, exact)?;
    }

    /// The same with overlapping failures and group cuts among them: whatever the audit
    /// does, Σ enforced ≤ L at every event, and Σ = L exactly once healed.
    #[test]
    fn whole_cluster_restarts_stay_strict(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(
            prop_oneof![restart_all_event(), overlap_event(), group_event()], 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// The decoder never panics on arbitrary bytes.
    #[test]
    fn decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = wire::decode(&bytes);
    }

    /// Mutated valid messages never panic the decoder either.
    #[test]
    fn decoder_survives_mutations(m in message(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
        let mut bytes = wire::encode(&m);
        let i = at.index(bytes.len());
        bytes[i] = b;
        let _ = wire::decode(&bytes);
        let _ = wire::decode(&bytes[..i]);
    }

    /// Encoding round-trips, in every version this build speaks (the previous one without
    /// the fields it lacks).
    #[test]
    fn encode_decode_round_trip(m in message()) {
        let bytes = wire::encode(&m);
        prop_assert_eq!(wire::encoded_len(&m), bytes.len());
        prop_assert_eq!(wire::decode_versioned(&bytes).unwrap(), (m.clone(), wire::VERSION));
        let old = wire::encode_as(&m, wire::MIN_VERSION).unwrap();
        prop_assert!(old.len() <= bytes.len());
        let back = wire::decode_versioned(&old).unwrap();
        // Version 13 cannot say a part of a report: it goes as a report that failed.
        let mut expect = m;
        if let Some(a) = expect.audit.as_mut().filter(|a| a.part.is_some()) {
            a.part = None;
            a.report = Some(AuditReport::default());
        }
        prop_assert_eq!(back, (expect, wire::MIN_VERSION));
    }
}

proptest! {
    #![proptest_config(config(16))]

    /// Issue 3 §7: limits per dynamic key appear and disappear at run time. Random keys get
    /// busy at random nodes and go quiet again, under loss, duplication and reordering, on
    /// rings, complete and random graphs, and in half the cases one node crashes while keys
    /// are busy and restarts later: Σ enforced ≤ L for every key after every cycle (seed 003
    /// §IV). Once every key has been idle long enough, every node holds no key state at all,
    /// and every key is back at its static split exactly (nothing lost, nothing counted
    /// twice) — after a crash too, where the neighbours' bases end off the split (folds of
    /// the dead link, the audit's mint; level requests bring them back).
    /// A random seed found a 3-ring without loss, one wave at node 0, where node 0 dropped
    /// the key before telling its neighbours it was idle and they kept it for ever; fixed by
    /// `Message::all_keys` (saved in `properties.proptest-regressions`). Level gifts once
    /// bounced between two carriers of the same deficit round a 5-ring (now nearest first),
    /// and state a level request created was dropped before it could pass the request on
    /// (now quiet from the start, and kept while a request crosses it).
    #[test]
    fn idle_keys_are_reclaimed_and_conserve(
        n in 3u32..6, topology in topology(), loss in 0.0f64..0.3, dup in 0.0f64..0.2,
        delay in 0u64..2, seed in any::<u64>(), relay in any::<bool>(),
        waves in prop::collection::vec((0u64..6, 0u32..6, 0.0f64..600_000.0, 1u64..12), 1..10),
        crash in prop::option::of((0usize..10, 0u32..6, 5u64..40)),
    ) {
        let edges = topology.edges(n, seed);
        let make = move |id: NodeId, links: Vec<(NodeId, f64)>| {
            let d: f64 = links.iter().map(|l| l.1).sum();
            let mut c = Config::new(id, (0..n).collect(), links, LIMIT);
            c.gamma = 1.0 / (2.0 * d);
            c.cycle = CYCLE;
            c.lease = 10 * CYCLE;
            c.demand_tau = CYCLE;
            c.relay = relay;
            c.idle_after = Some(5 * CYCLE);
            if seed & 1 == 1 {
                c.pacing = Some(sluice_coord::pacing::Strategy::simple(2));
            }
            c
        };
        let net = NetConfig { loss, dup, max_delay: delay * CYCLE };
        let mut c = Cluster::new(n, &edges, make, net, seed).unwrap();
        let keys: Vec<u64> = (0..6).map(|k| 100 + k).collect();
        // Σ enforced ≤ L (the guarantee; `c.violations` has it at every delivery too). Not
        // Σ own: a node falsely suspected (its lease ran out, a quorum fenced it) still holds
        // its share until it learns it was fenced, but enforces its fallback
        // (`PROPTEST_RNG_SEED=77` at 30–50 % loss found Σ own 1.24 L with Σ enforced ≤ L).
        let check = |c: &Cluster| -> Result<(), TestCaseError> {
            for &k in &keys {
                prop_assert!(c.sum_enforced(k) <= LIMIT, "key {} Σ enforced {} at t={}", k, c.sum_enforced(k), c.now());
            }
            prop_assert!(c.violations.is_empty(), "{:?}", c.violations);
            Ok(())
        };
        // Whether some wave made a live node busy (one at a crashed node makes no state).
        let mut busy = false;
        let mut max_held = 0;
        // Leases first (as `run_scenario` does).
        if crash.is_some() {
            c.apply(Step::Run(20));
        }
        // (node, restart at) once crashed.
        let (mut cycle, mut crashed) = (0u64, None);
        for (w, (k, i, rate, dur)) in waves.into_iter().enumerate() {
            if let Some((at, who, down)) = crash
                && crashed.is_none()
                && w >= at
                && cycle >= 5
            {
                c.apply(Step::Crash(who % n));
                crashed = Some((who % n, cycle + down));
            }
            c.apply(Step::SetDemand(i % n, keys[k as usize], rate));
            busy |= rate >= 1_000.0 && c.node(i % n).is_some();
            for _ in 0..dur {
                c.apply(Step::Run(1));
                cycle += 1;
                if let Some((who, at)) = crashed
                    && at == cycle
                {
                    c.apply(Step::Restart(who));
                }
                check(&c)?;
                let held: usize = (0..n).filter_map(|i| c.node(i)).map(|x| x.active_keys().count()).sum();
                max_held = max_held.max(held);
            }
            // The key goes quiet again, at random later or at once.
            if rate > 300_000.0 {
                c.apply(Step::SetDemand(i % n, keys[k as usize], 0.0));
            }
        }
        prop_assert!(max_held > 0 || !busy, "the waves created key state");
        if let Some((who, at)) = crashed
            && at > cycle
        {
            c.apply(Step::Restart(who));
        }
        for &k in &keys {
            for i in 0..n {
                c.apply(Step::SetDemand(i, k, 0.0));
            }
        }
        for _ in 0..150 {
            c.apply(Step::Run(1));
            check(&c)?;
        }
        // The last messages get through.
        c.set_net(NetConfig::perfect());
        for _ in 0..60 {
            c.apply(Step::Run(1));
            check(&c)?;
        }
        for i in 0..n {
            let held = c.node(i).unwrap().active_keys().count();
            prop_assert_eq!(held, 0, "node {} still holds {} keys", i, held);
            let folds = c.node(i).unwrap().fold_records();
            prop_assert_eq!(folds, 0, "node {} still lists {} folds", i, folds);
        }
        for &k in &keys {
            prop_assert_eq!(c.sum_own(k), LIMIT, "key {}", k);
        }
    }
}

/// Crashes, restarts and one-node partitions mixed, on top of the network faults: Σ enforced
/// ≤ L at every event (strict modes), exact once healed up to `EXACT_LOSS` loss.
/// `PROPTEST_CASES` scales it like the others.
#[test]
fn conservation_under_mixed_failures() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut runner = proptest::test_runner::TestRunner::new(config(cases));
    let strategy = (
        (
            3u32..7,
            topology(),
            0.0f64..0.5,
            0.0f64..0.3,
            0u64..3,
            any::<bool>(),
            any::<u64>(),
        ),
        prop::collection::vec(event(true, true), 1..8),
        prop::collection::vec(0.5f64..1.5, 6),
    );
    let result = runner.run(
        &strategy,
        |((n, topology, loss, dup, delay, reserved, seed), events, shape)| {
            run_scenario(
                n,
                topology,
                loss,
                dup,
                delay,
                reserved,
                seed,
                events,
                &shape,
                loss <= EXACT_LOSS,
            )
            .map(|_| ())
        },
    );
    assert!(result.is_ok(), "{result:?}");
}

/// The communication graph of a scenario.
#[derive(Debug, Clone, Copy)]
enum Topology {
    Ring,
    Complete,
    /// A random connected graph (a random tree plus random links), from the scenario seed.
    Random,
}

impl Topology {
    fn edges(self, n: u32, seed: u64) -> Vec<(NodeId, NodeId, f64)> {
        match self {
            Self::Ring => ring(n),
            Self::Complete => complete(n),
            // Drawn from the scenario's seed: a random tree plus random extra links.
            Self::Random => random_connected(n, 0.3, &mut Rng::new(seed ^ 0x7090_1091)),
        }
    }
}

fn topology() -> impl Strategy<Value = Topology> {
    prop_oneof![
        Just(Topology::Ring),
        Just(Topology::Complete),
        Just(Topology::Random)
    ]
}

#[allow(clippy::too_many_arguments)]
fn run_scenario(
    n: u32,
    topology: Topology,
    loss: f64,
    dup: f64,
    delay: u64,
    reserved: bool,
    seed: u64,
    events: Vec<Event>,
    shape: &[f64],
    exact: bool,
) -> Result<u64, TestCaseError> {
    let net = (loss, dup, delay);
    run_scenario_with(n, topology, net, reserved, seed, events, shape, exact)
}

/// [`run_scenario`] with the network's `(loss, dup, delay)` as one argument.
#[allow(clippy::too_many_arguments)]
fn run_scenario_with(
    n: u32,
    topology: Topology,
    (loss, dup, delay): (f64, f64, u64),
    reserved: bool,
    seed: u64,
    events: Vec<Event>,
    shape: &[f64],
    exact: bool,
) -> Result<u64, TestCaseError> {
    let edges = topology.edges(n, seed);
    let make = move |id: NodeId, links: Vec<(NodeId, f64)>| {
        let d: f64 = links.iter().map(|l| l.1).sum();
        let mut c = Config::new(id, (0..n).collect(), links, LIMIT);
        c.gamma = 1.0 / (2.0 * d);
        c.cycle = CYCLE;
        c.lease = 10 * CYCLE;
        c.demand_tau = 2 * CYCLE;
        if reserved {
            c.fallback = Fallback::Reserved(0.3);
        }
        // Half the cases with token accounts (seed 004): the relay then also gives and
        // forwards requests reactively, inside message handling.
        if seed & 1 == 1 {
            c.pacing = Some(sluice_coord::pacing::Strategy::simple(2));
        }
        // Half the cases reclaim idle keys (as the daemon does): keys whose demand a
        // scenario sets to zero go quiet, level, fold and are dropped amid the failures.
        if seed & 2 == 2 {
            c.idle_after = Some(5 * CYCLE);
        }
        c
    };
    let net = NetConfig {
        loss,
        dup,
        max_delay: delay * CYCLE,
    };
    let mut c = Cluster::new(n, &edges, make, net, seed).unwrap();
    for i in 0..n {
        c.apply(Step::SetDemand(i, KEYS[0], 150_000.0));
    }
    // Leases first: the failures below hit a running cluster.
    c.apply(Step::Run(20));
    for e in events {
        match e {
            Event::Run(k) => c.apply(Step::Run(k)),
            Event::Demand(i, k, r) => c.apply(Step::SetDemand(i % n, KEYS[k], r)),
            Event::CrashRestart(i, d) => {
                c.apply(Step::Crash(i % n));
                c.apply(Step::Run(d));
                c.apply(Step::Restart(i % n));
            }
            Event::PartitionHeal(i, d) => {
                c.apply(Step::Partition(vec![i % n]));
                c.apply(Step::Run(d));
                c.apply(Step::Heal);
            }
            Event::CutThenCrash(a, b, d1, d2) => {
                c.apply(Step::Partition(vec![a % n]));
                c.apply(Step::Run(d1));
                c.apply(Step::Crash(b % n));
                c.apply(Step::Run(d2));
                c.apply(Step::Restart(b % n));
                c.apply(Step::Heal);
            }
            Event::RestartAll(d, gap) => {
                for i in 0..n {
                    c.apply(Step::Crash(i));
                }
                c.apply(Step::Run(d));
                for i in 0..n {
                    c.apply(Step::Restart(i));
                    c.apply(Step::Run(gap));
                }
            }
            Event::GroupPartitionHeal(first, size, d) => {
                let group = (0..size.min(n - 1)).map(|j| (first + j) % n).collect();
                c.apply(Step::Partition(group));
                c.apply(Step::Run(d));
                c.apply(Step::Heal);
            }
        }
        // Failures do not overlap: each one is over before the next.
        c.apply(Step::Run(35));
        prop_assert!(c.violations.is_empty(), "{:?}\n{:?}", c.violations, c.log);
    }
    // Heal; steady demands with Σλ = L / 1.1 (seed 003 §III-A).
    c.apply(Step::Heal);
    c.set_net(NetConfig::perfect());
    let total: f64 = shape.iter().take(n as usize).sum();
    for k in KEYS {
        for i in 0..n {
            let r = LIMIT as f64 / 1.1 * shape[i as usize] / total;
            c.apply(Step::SetDemand(i, k, r));
        }
    }
    c.apply(Step::Run(250));
    prop_assert!(c.violations.is_empty(), "{:?}", c.violations);
    for k in KEYS {
        prop_assert!(c.sum_own(k) <= LIMIT);
        if !exact {
            continue;
        }
        prop_assert_eq!(c.sum_own(k), LIMIT, "key {} log {:?}", k, c.log);
        prop_assert_eq!(c.sum_enforced(k), LIMIT, "key {}", k);
        let q = c.indicators(k);
        prop_assert!(jfi(&q) >= 0.99, "JFI {} q {:?}", jfi(&q), q);
    }
    // The least Σ own or Σ enforced over the keys once healed (what the run lost, or
    // keeps from use, if anything).
    Ok(KEYS
        .iter()
        .map(|&k| c.sum_own(k).min(c.sum_enforced(k)))
        .min()
        .unwrap_or(LIMIT))
}

fn message() -> impl Strategy<Value = Message> {
    let entry = (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        -1e6f32..1e6,
        any::<bool>(),
        // A relay request is sent only when positive (0 means none).
        prop_oneof![Just((0.0f32, 0u8)), (1e-3f32..1e9, any::<u8>())],
        any::<bool>(),
    )
        .prop_map(
            |(key, given, seen, indicator, saturated, (relay, relay_hops), idle)| KeyEntry {
                key,
                given,
                seen,
                indicator,
                saturated,
                relay,
                relay_hops,
                idle,
            },
        );
    let pairs = || prop::collection::vec((any::<u32>(), any::<u64>()), 0..3);
    let report = (
        any::<bool>(),
        any::<u64>(),
        prop::collection::vec((any::<u64>(), any::<i64>()), 0..3),
        pairs(),
        prop::collection::vec(any::<u8>(), 0..3),
        pairs(),
    )
        .prop_map(|(ok, defaults, devs, incs, members, dead)| AuditReport {
            ok,
            defaults,
            devs,
            incs,
            members,
            dead,
        });
    let audit = (
        (any::<u32>(), any::<u64>(), any::<u64>(), any::<bool>()),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        prop::option::of(report),
        pairs(),
        prop::option::of((2..=wire::MAX_PARTS).prop_flat_map(|count| (0..count, Just(count)))),
    )
        .prop_map(
            |((root, root_inc, round, confirm), (child, ack, done), report, fence, part)| {
                // Only a gather's report goes in parts.
                let part = part
                    .filter(|_| !confirm && report.is_some())
                    .map(|(index, count)| Part { index, count });
                Audit {
                    wave: Wave {
                        root,
                        root_inc,
                        round,
                        confirm,
                    },
                    child,
                    ack,
                    done,
                    // A confirming report is its `ok` bit alone.
                    report: report.map(|r| {
                        if confirm {
                            AuditReport {
                                ok: r.ok,
                                ..AuditReport::default()
                            }
                        } else {
                            r
                        }
                    }),
                    part,
                    fence,
                }
            },
        );
    let life = prop_oneof![
        Just(Lifecycle::Joining),
        Just(Lifecycle::Active),
        Just(Lifecycle::Leaving),
        Just(Lifecycle::Left)
    ];
    (
        (
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
            prop_oneof![Just(0u64), 1..=u64::MAX],
        ),
        life,
        (any::<bool>(), any::<bool>()),
        prop::collection::vec(entry, 0..6),
        (
            prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..3),
            prop::collection::vec((any::<u64>(), any::<u64>()), 0..3),
            prop::collection::vec(any::<u64>(), 0..3),
        ),
        (
            prop::collection::vec((any::<u32>(), any::<u32>(), any::<u64>()), 0..3),
            pairs(),
            prop::option::of(audit.prop_map(Box::new)),
        ),
    )
        .prop_map(
            |(
                ((from_inc, to_inc, sent_at, echo), members),
                lifecycle,
                (all_keys, rest),
                keys,
                (retire, retired, confirm),
                (votes, dead, audit),
            )| Message {
                from_inc,
                to_inc,
                sent_at,
                echo,
                lifecycle,
                members,
                all_keys,
                rest,
                keys,
                retire,
                retired,
                confirm,
                votes,
                dead,
                audit,
            },
        )
}

/// A counting sweep (not run by CI: minutes per thousand cases). Where the proptests stop
/// at the first failure, this runs `SWEEP_CASES` random cases (default 500) of each failure
/// kind from `SWEEP_SEED` (default 1) and counts, per loss band, the runs that end under L
/// once healed (capacity lost) and the runs that went over L at any event. The numbers in
/// docs/PROTOCOL.md ("What the tests establish") come from it:
/// `SWEEP_CASES=2000 SWEEP_SEED=1 cargo test --release -p sluice-coord --test properties
/// counting_sweep -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: minutes of run time"]
fn counting_sweep() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config as RunnerConfig, TestRng, TestRunner};
    let var = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let cases = var("SWEEP_CASES", 500);
    let seed = var("SWEEP_SEED", 1);
    let kinds: Vec<(&str, BoxedStrategy<Event>, u32)> = vec![
        ("network faults", event(false, false).boxed(), 3),
        ("crashes", event(true, false).boxed(), 3),
        ("one-node cuts", event(false, true).boxed(), 3),
        ("group cuts", group_event().boxed(), 4),
        ("mixed", event(true, true).boxed(), 3),
        ("overlapping", overlap_event().boxed(), 3),
    ];
    println!("seed {seed}, {cases} cases per kind");
    let mut over_total = 0;
    println!("| kind | loss | runs | under L | over L |");
    println!("|---|---|---|---|---|");
    // `SWEEP_KIND=overlapping` (a prefix of a kind's name) runs that kind only.
    let only = std::env::var("SWEEP_KIND").unwrap_or_default();
    for (name, strategy, min_n) in kinds.into_iter().filter(|k| k.0.starts_with(&only)) {
        let case = (
            min_n..7u32,
            topology(),
            0.0f64..0.5,
            0.0f64..0.3,
            0u64..3,
            any::<bool>(),
            any::<u64>(),
            prop::collection::vec(strategy, 1..8),
            prop::collection::vec(0.5f64..1.5, 6),
        );
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8..16].copy_from_slice(&u64::from(min_n).to_le_bytes());
        bytes[16..16 + name.len().min(16)].copy_from_slice(&name.as_bytes()[..name.len().min(16)]);
        let rng = TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &bytes);
        let mut runner = TestRunner::new_with_rng(RunnerConfig::default(), rng);
        let drawn: Vec<_> = (0..cases)
            .filter_map(|_| case.new_tree(&mut runner).ok().map(|t| t.current()))
            .collect();
        // [runs, under, over] for loss < 0.3 and above.
        let tally = std::sync::Mutex::new([[0u64; 3]; 2]);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = std::thread::available_parallelism().map_or(2, |p| p.get());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((n, topology, loss, dup, delay, reserved, seed, events, shape)) =
                        drawn.get(i).cloned()
                    else {
                        break;
                    };
                    let r = run_scenario(
                        n, topology, loss, dup, delay, reserved, seed, events.clone(), &shape,
                        false,
                    );
                    let band = usize::from(loss > 0.3);
                    let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                    t[band][0] += 1;
                    match r {
                        Ok(own) if own < LIMIT => t[band][1] += 1,
                        Ok(_) => {}
                        Err(_) => {
                            t[band][2] += 1;
                            println!(
                                "OVER: n {n} {topology:?} loss {loss} dup {dup} delay {delay} \
                                 reserved {reserved} seed {seed} events {events:?} \
                                 shape {shape:?}: {r:?}"
                            );
                        }
                    }
                    if matches!(r, Ok(own) if own < LIMIT) && std::env::var_os("SWEEP_SHOW").is_some() {
                        println!(
                            "UNDER {:?}: n {n} {topology:?} loss {loss} dup {dup} delay {delay} \
                             reserved {reserved} seed {seed} events {events:?} shape {shape:?}",
                            r
                        );
                    }
                });
            }
        });
        let t = tally.into_inner().unwrap_or_else(|e| e.into_inner());
        for (band, label) in [(0, "[0, 30 %]"), (1, "(30, 50 %)")] {
            let [runs, under, over] = t[band];
            println!("| {name} | {label} | {runs} | {under} | {over} |");
            over_total += over;
        }
    }
    // Counting, not asserting, exactness; but a run over L is a safety failure (each is
    // printed above with its case, for a named regression test).
    assert_eq!(over_total, 0, "runs over L");
}
