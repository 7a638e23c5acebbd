#![allow(clippy::unwrap_used)]
//! Property tests: conservation under random networks and failures; the wire decoder.

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use sluice_coord::law::jfi;
use sluice_coord::node::{Config, Fallback};
use sluice_coord::testing::{Cluster, NetConfig, Rng, Step, complete, random_connected, ring};
use sluice_coord::wire::{
    self, Audit, AuditReport, Census, Handover, HandoverAck, HandoverKind, Holding, KeyEntry,
    LateAck, LateFold, Ledger, Lifecycle, Message, NodeId, Part, PendingFold, SettleReply,
    Settling, Wave,
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

/// Overlapping failures: a node cut off, then a crash (often of its heir) before the cut
/// heals, mixed with the other events.
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
/// L, JFI ≥ 0.99). Settlements alone lost capacity in about 1 run in 1,400 at 30–50 % loss
/// and 1 in 9 with overlapping failures; the capacity audit mints what they lose (see
/// docs/PROTOCOL.md, "The capacity audit" and "Counting sweep").
const EXACT_LOSS: f64 = 0.5;

thread_local! {
    /// Scenarios on this thread run without the capacity audit (to show what settlements
    /// alone lose).
    static AUDIT_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Up to this loss, settlements alone (no capacity audit) were seen to end exact after
/// single failures; the counting sweep splits its two loss bands here.
const SETTLEMENTS_EXACT_LOSS: f64 = 0.3;

/// The cases of every property here come from a fixed seed, so CI runs the same cases
/// each time; `PROPTEST_RNG_SEED=N` explores others (and `PROPTEST_CASES=N` runs more).
/// Why: the exactness checks are not guaranteed after multiple failures (capacity can be
/// lost, never counted twice; see docs/PROTOCOL.md), and a case found at random belongs in a
/// named regression test, not in a red CI run nobody can reproduce. Every failure these
/// properties found is one below.
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
    /// up to `EXACT_LOSS` loss (a heir falsely suspected right after it inherited loses a
    /// share to settlements, `false_suspicions_of_a_fresh_heir_stay_safe`; the capacity audit
    /// mints it back).
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

    /// Several nodes cut off together (a group on one side, heirs inside and outside it):
    /// Σ enforced ≤ L at every event (strict modes); once healed Σ = L exactly up to
    /// `EXACT_LOSS` loss (seed 003 §IV: "no local limiter gains or loses extra capacity").
    /// This found the chained-settlement deadlock across a multi-node cut (regression case
    /// in `properties.proptest-regressions`, minimal scenario
    /// `chained_settlement_across_a_group_cut_counts_nothing_twice` in `scenarios.rs`) and,
    /// made exact, the crossed settlements behind late folds
    /// (`two_by_two_cut_of_a_complete_graph_is_settled_exactly`); explanations in
    /// docs/PROTOCOL.md.
    #[test]
    fn conservation_under_group_partitions(
        n in 4u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(group_event(), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// Overlapping failures (a node cut off, then a crash before the cut heals; the crashed
    /// node is often the cut one's heir): Σ enforced ≤ L at every event (strict modes).
    /// Once healed Σ = L exactly and JFI ≥ 0.99 up to `EXACT_LOSS` loss: settlements alone
    /// lost capacity in about one run in nine here, which the capacity audit mints back.
    /// Before `Node::orphaned` this found Σ enforced = L + 16.9 %, then the stale succession
    /// (`stale_succession_after_two_crashes_of_the_heir`).
    #[test]
    fn safety_under_overlapping_failures(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(overlap_event(), 1..6),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= EXACT_LOSS)?;
    }

    /// `Config::forget_after`, far shorter than a daemon's ten minutes (three leases): a
    /// node drops its side of a link with a dead incarnation once nobody asked for it that
    /// long, and never answers for it again. Whatever is forgotten, and when, Σ enforced ≤ L
    /// at every event (strict modes): a settlement that would have needed a forgotten side
    /// waits instead (capacity lost to it, never counted twice; seed 003 §IV's guarantee
    /// kept on the safe side), and the capacity audit mints it back: exact once healed up to
    /// `EXACT_LOSS` loss. Crashes, single and group cuts and overlapping failures.
    #[test]
    fn safety_when_old_links_are_forgotten(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(
            prop_oneof![event(true, true), group_event(), overlap_event()], 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        let net = (loss, dup, delay);
        run_scenario_with(
            n, topology, net, reserved, seed, events, &shape, loss <= EXACT_LOSS, Some(30 * CYCLE),
        )?;
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

    /// The same without audits (`Config::audit_every: None`): the census gives each member
    /// its initial share back ("Re-minting after a whole-cluster restart"). Settlements alone
    /// may lose capacity above 30 % loss, so exactness is asserted up to 30 % here.
    #[test]
    fn whole_cluster_restarts_remint_by_census_without_audits(
        n in 3u32..7, topology in topology(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(restart_all_event(), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        AUDIT_OFF.with(|a| a.set(true));
        let r = run_scenario(n, topology, loss, dup, delay, reserved, seed, events, &shape, loss <= SETTLEMENTS_EXACT_LOSS);
        AUDIT_OFF.with(|a| a.set(false));
        r?;
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

    /// Encoding round-trips.
    #[test]
    fn encode_decode_round_trip(m in message()) {
        let bytes = wire::encode(&m);
        prop_assert_eq!(wire::encoded_len(&m), bytes.len());
        prop_assert_eq!(wire::decode(&bytes).unwrap(), m);
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
    /// twice) — after a crash too, where the heir's and the neighbours' bases end off the
    /// split (level requests and folds bring them back; docs/PROTOCOL.md, "Idle keys").
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
        // Σ own: a node falsely suspected (its lease ran out, its heir inherited) still holds
        // its share until it learns it was declared dead, but enforces its fallback
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
        // With a crash to come, every heir first hears a ledger of its ward that names its
        // links (as `run_scenario` does: a node that crashes before its heir holds one
        // loses its share, a known limit; under loss that can take a while).
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

/// Formerly a known liveness gap, found by `conservation_under_network_faults`: under 47 %
/// loss node 0 declares its ward 5 dead (a false suspicion: nothing crashed) before 5's
/// ledger ever listed node 4, which names 5 its heir. Node 0 asks 4 for its counters with 5;
/// 4 freezes its link with its own heir and holds the answer until that heir acknowledges its
/// folded ledger, which a dead heir never did, and no succession notice reached 4. Now a heir
/// tells a dead incarnation it is dead as soon as it starts settling it (not once the estate
/// is in), so node 5 reincarnates, node 4's heir answers again, and the run ends exact.
#[test]
fn ward_unknown_to_its_dead_heir_is_settled_exactly() {
    let r = run_scenario(
        6,
        Topology::Ring,
        0.469_717_196_691_569_8,
        0.053_787_698_107_222_746,
        2,
        false,
        4_763_440_675_387_436_351,
        vec![Event::Run(1)],
        &[0.5; 6],
        false,
    );
    assert!(r.is_ok(), "{r:?}");
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
    run_scenario_with(n, topology, net, reserved, seed, events, shape, exact, None)
}

/// [`run_scenario`] with `Config::forget_after` set to `forget`.
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
    forget: Option<u64>,
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
        c.forget_after = forget;
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
        if AUDIT_OFF.with(std::cell::Cell::get) {
            c.audit_every = None;
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
    // Every heir has heard from its ward once (a node that crashes before its heir ever
    // heard from it loses its initial share: documented, never counted twice).
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
        // Failures do not overlap: each one is settled before the next.
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
    let part = prop_oneof![
        Just(Part::Full),
        Just(Part::ReserveOnly),
        Just(Part::ShareOnly),
        any::<u64>().prop_map(Part::Minted)
    ];
    let ledger = (
        prop::collection::vec(
            (any::<u32>(), part).prop_map(|(node, part)| Holding { node, part }),
            0..4,
        ),
        prop::collection::vec((any::<u64>(), any::<i64>()), 0..4),
        prop::collection::vec((any::<u32>(), any::<u64>()), 0..4),
        prop::collection::vec(any::<u32>(), 0..4),
        prop::collection::vec((any::<u32>(), any::<u64>()), 0..3),
        prop::collection::vec(
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
            ),
            0..2,
        ),
    )
        .prop_map(
            |(holdings, bases, neighbours, wards, settled, pending)| Ledger {
                version: bases.len() as u64 * 7,
                holdings,
                bases,
                neighbours,
                wards,
                folded: settled.clone(),
                settled,
                received_folds: pending
                    .iter()
                    .map(|&(peer, inc, key, seen, _)| (peer, inc, key, seen))
                    .collect(),
                pending_folds: pending
                    .into_iter()
                    .map(|(peer, peer_incarnation, key, seen, net)| PendingFold {
                        peer,
                        peer_incarnation,
                        key,
                        seen,
                        net,
                    })
                    .collect(),
                settling: Vec::new(),
            },
        );
    // Settlements under way, one level deep (a nested ledger lists none).
    let side = prop::option::of((
        any::<u64>(),
        prop::option::of(any::<u64>()),
        any::<bool>(),
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..3),
    ));
    let ledger = (
        ledger.clone(),
        prop::collection::vec(
            (any::<u32>(), any::<u64>(), any::<bool>(), ledger, side),
            0..2,
        ),
    )
        .prop_map(|(mut l, settling)| {
            l.settling = settling
                .into_iter()
                .map(|(ward, incarnation, leaving, ledger, side)| Settling {
                    ward,
                    incarnation,
                    leaving,
                    ledger,
                    side: side.map(|(replier_incarnation, prior, in_estate, entries)| {
                        SettleReply {
                            dead: ward,
                            incarnation,
                            replier_incarnation,
                            prior,
                            first: in_estate && prior.is_none(),
                            later_empty: in_estate,
                            in_estate,
                            pending: entries.iter().rev().copied().collect(),
                            entries,
                        }
                    }),
                })
                .collect();
            l
        });
    let reply = (
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        (
            prop::option::of(any::<u64>()),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..3),
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..2),
    )
        .prop_map(
            |(
                dead,
                incarnation,
                replier_incarnation,
                (prior, in_estate, first, later_empty),
                entries,
                pending,
            )| {
                SettleReply {
                    dead,
                    incarnation,
                    replier_incarnation,
                    prior,
                    first,
                    later_empty,
                    in_estate,
                    entries,
                    pending,
                }
            },
        );
    let late_fold = (
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..3),
    )
        .prop_map(|(incarnation, peer, peer_incarnation, entries)| LateFold {
            incarnation,
            peer,
            peer_incarnation,
            entries,
        });
    let late_ack = (any::<u64>(), any::<u32>(), any::<u64>(), any::<bool>()).prop_map(
        |(incarnation, peer, peer_incarnation, accepted)| LateAck {
            incarnation,
            peer,
            peer_incarnation,
            accepted,
        },
    );
    let handover = (
        (any::<u64>(), any::<u32>(), any::<u64>()),
        ledger.clone(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |((incarnation, ward, ward_incarnation), ledger, inherited, leaving)| Handover {
                incarnation,
                ward,
                ward_incarnation,
                ledger,
                kind: if inherited {
                    HandoverKind::Inherited
                } else {
                    HandoverKind::Unfinished
                },
                leaving,
            },
        );
    let handover_ack = (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(
        |(incarnation, ward, ward_incarnation)| HandoverAck {
            incarnation,
            ward,
            ward_incarnation,
        },
    );
    let audit_report = (
        (any::<bool>(), any::<bool>(), any::<u64>()),
        prop::collection::vec((any::<u64>(), any::<i64>()), 0..3),
        (
            prop::collection::vec((any::<u32>(), any::<u64>()), 0..3),
            prop::collection::vec(any::<u8>(), 0..3),
        ),
        prop::collection::vec((any::<u32>(), any::<u64>()), 0..3),
    )
        .prop_map(
            |((ok, busy, defaults), devs, (incs, members), excluded)| AuditReport {
                ok,
                busy,
                defaults,
                devs,
                incs,
                members,
                excluded,
            },
        );
    let audit = (
        (any::<u64>(), any::<u64>(), any::<bool>()),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        prop::option::of(audit_report),
        prop::collection::vec((any::<u32>(), any::<u64>()), 0..3),
    )
        .prop_map(
            |((root_inc, round, confirm), (child, ack, done), report, fence)| Audit {
                wave: Wave {
                    root_inc,
                    round,
                    confirm,
                },
                child,
                ack,
                done,
                // A confirming report is its `ok` and `busy` bits alone.
                report: report.map(|r| {
                    if confirm {
                        AuditReport {
                            ok: r.ok,
                            busy: r.busy,
                            ..AuditReport::default()
                        }
                    } else {
                        r
                    }
                }),
                fence,
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
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            prop::option::of(0..u64::MAX),
        ),
        life,
        (any::<bool>(), any::<bool>(), any::<bool>()),
        prop::option::of(ledger),
        prop::collection::vec(entry, 0..6),
        prop::collection::vec((any::<u32>(), any::<u64>()), 0..3),
        prop::collection::vec(reply, 0..2),
        prop::option::of((any::<u32>(), any::<u64>())),
        any::<u64>(),
        (
            prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..3),
            prop::collection::vec((any::<u64>(), any::<u64>()), 0..3),
            prop::collection::vec(any::<u64>(), 0..3),
            prop::collection::vec(late_fold, 0..2),
            prop::collection::vec(late_ack, 0..2),
        ),
        (
            prop::collection::vec(handover, 0..2),
            prop::collection::vec(handover_ack, 0..2),
            prop::option::of(
                (any::<u16>(), any::<bool>())
                    .prop_map(|(level, reminted)| Census { level, reminted }),
            ),
            prop::option::of(audit.prop_map(Box::new)),
        ),
    )
        .prop_map(
            |(
                (from_inc, to_inc, sent_at, echo, dead_verdict, verdict_version),
                lifecycle,
                (to_heir, all_keys, rest),
                ledger,
                keys,
                settle_requests,
                settle_replies,
                succession,
                ledger_ack,
                (retire, retired, confirm, late_folds, late_acks),
                (handovers, handover_acks, census, audit),
            )| {
                Message {
                    from_inc,
                    to_inc,
                    sent_at,
                    echo,
                    lifecycle,
                    to_heir,
                    all_keys,
                    rest,
                    dead_verdict,
                    verdict_version,
                    ledger,
                    keys,
                    settle_requests,
                    settle_replies,
                    succession,
                    ledger_ack,
                    retire,
                    retired,
                    confirm,
                    late_folds,
                    late_acks,
                    handovers,
                    handover_acks,
                    census,
                    audit,
                }
            },
        )
}

/// Regression (found by `conservation_under_mixed_failures` with a random seed): 6 nodes, complete
/// graph, 47 % loss, node 0 crashed and restarted twice. Node 4 settled node 3 and took node
/// 0's *third* incarnation's answer for node 3's link with the second one; node 3,
/// reincarnated, answered node 0's heir with that link's counters, which its own estate (from
/// an older ledger) did not account for: the link's net (11,970 units) counted twice, Σ
/// enforced 1.2 % over L. Now only the incarnation a ledger names answers for a link, and a
/// reincarnated node's answers say whether its side is in its estate (verdicts name the
/// ledger version they settled: wire `verdict_version`, `SettleReply::in_estate`). Both
/// estates wait instead: safety is asserted, not exactness (seed 003 §IV: nothing counted
/// twice; here capacity is lost).
#[test]
fn mixed_failures_node_restarted_twice() {
    let r = run_scenario(
        6,
        Topology::Complete,
        0.471_968_841_039_191_5,
        0.005_386_314_085_902_379_5,
        2,
        false,
        14_573_706_929_301_887_522,
        vec![
            Event::CrashRestart(0, 4),
            Event::Demand(0, 0, 0.0),
            Event::CrashRestart(0, 1),
        ],
        &[0.5; 6],
        false,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by `conservation_under_group_partitions` with a random seed (6-ring, 30 % loss, three
/// group cuts in a row): nodes 5 and 0 each froze their link with the other after the last
/// ledger their heirs held, both were settled and reincarnated, and each answered the other's
/// heir. With those answers counted as empty on both sides (an intermediate version of the
/// fix for `mixed_failures_node_restarted_twice`) node 0's estate came out negative,
/// −17,896 units, was clamped to zero, and Σ enforced reached L + 17,895. Now such answers
/// say they are not in the replier's estate (`SettleReply::in_estate`) and nothing is
/// counted twice (seed 003 §IV); with late folds (node 0, the lower id, hands its side of
/// the link to its heir) both estates complete and the run ends exact.
#[test]
fn group_cuts_chain_of_three() {
    let r = run_scenario(
        6,
        Topology::Ring,
        0.297_838_027_378_138_7,
        0.092_168_680_195_035_03,
        0,
        false,
        1_574_759_383_353_374_872,
        vec![
            Event::GroupPartitionHeal(4, 3, 11),
            Event::Run(1),
            Event::GroupPartitionHeal(2, 2, 13),
            Event::GroupPartitionHeal(5, 2, 10),
        ],
        &[0.5; 6],
        true,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by `conservation_under_group_partitions` with idle keys reclaimed
/// (`PROPTEST_RNG_SEED=301`, 2,000 cases): a complete graph of 6 at 12 % loss, three group
/// cuts. Node 0 folded a net of 113,443 it had given node 3 (a retirement); node 3 folded
/// too, then {4, 5, 0} were cut off — node 3's heir, node 4, among them — and both were
/// settled: node 3 with a ledger from before its fold, node 0 with one after its own. Node
/// 0's reincarnation answered for the old link with its counters after the fold but without
/// the pending fold, so node 3's estate lacked the net (Σ = 0.887 L). Now an old
/// incarnation's answer carries the folds that stand in its estate, as a live node's does.
#[test]
fn an_old_incarnations_answer_carries_its_pending_folds() {
    let r = run_scenario(
        6,
        Topology::Complete,
        0.121_781_397_027_630_79,
        0.087_698_795_487_508_1,
        1,
        false,
        15_979_378_242_691_218_407,
        vec![
            Event::GroupPartitionHeal(1, 2, 11),
            Event::GroupPartitionHeal(0, 2, 4),
            Event::Demand(0, 0, 103_811.350_872_228_49),
            Event::Demand(4, 1, 3_121.137_705_469_464),
            Event::GroupPartitionHeal(4, 3, 11),
        ],
        &[0.5; 6],
        true,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by `conservation_under_group_partitions` with idle keys (`PROPTEST_RNG_SEED=602`): a
/// complete graph of 6 at 22 % loss. Node 1 folded a net of 50,574 for node 0 (a retirement,
/// "Idle keys"), node 0 folded too; then {0, 1} were cut off and both settled at once, node 0
/// with a ledger from before its fold. Node 0 had dropped its record of the fold on a message
/// of node 1 that no longer acknowledged it — because node 1 had frozen their link (it was
/// asked to settle node 0), not because it had dropped its pending fold — so node 0's side
/// of the link came from after its fold: Σ = 0.949 L. Now the record goes only on a message
/// from the incarnation the fold was with, to ours, and a receiver's side undoes a fold its
/// estate's ledger does not hold.
#[test]
fn a_receivers_fold_its_estate_lacks_is_undone() {
    let r = run_scenario(
        6,
        Topology::Complete,
        0.217_618_390_635_617,
        0.190_699_124_777_894_2,
        2,
        false,
        9_326_126_811_147_664_139,
        vec![
            Event::Demand(4, 1, 256_737.224_546_813_3),
            Event::Run(17),
            Event::Demand(4, 0, 142_408.397_332_800_52),
            Event::Run(3),
            Event::GroupPartitionHeal(0, 2, 16),
            Event::GroupPartitionHeal(4, 3, 10),
            Event::GroupPartitionHeal(0, 2, 11),
        ],
        &[0.5; 6],
        true,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by `conservation_under_group_partitions` (`PROPTEST_RNG_SEED=601`): a random graph of
/// 6 at 26 % loss, {3, 4} then {0, 1} cut off; nodes 1 and 4, linked to each other, are both
/// settled with ledger version 0, and 10 units of key 1 (busy throughout, never folded: the
/// run loses them with unbalanced folds switched off too) end in neither estate. Lost, never
/// counted twice: safety is asserted, and the loss is under 0.001 % (docs/PROTOCOL.md, "Known
/// limits": chained settlements can lose what was in flight).
#[test]
fn two_linked_nodes_settled_at_once_stay_safe() {
    let own = run_scenario(
        6,
        Topology::Random,
        0.263_674_761_770_171_24,
        0.148_158_282_860_422,
        2,
        false,
        4_954_181_811_606_270_011,
        vec![
            Event::GroupPartitionHeal(3, 2, 4),
            Event::Demand(0, 1, 317_286.969_707_188_1),
            Event::Demand(1, 0, 250_622.097_804_106_95),
            Event::Run(4),
            Event::GroupPartitionHeal(0, 2, 14),
        ],
        &[0.5; 6],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        (LIMIT - LIMIT / 100_000..=LIMIT).contains(&own),
        "Σ own {own}"
    );
}

/// Found by `conservation_under_network_faults` with a random seed (`PROPTEST_RNG_SEED=201`,
/// 2,000 cases): no crash and no partition, but 46.5 % loss, 26 % duplicates and two cycles
/// of delay on a complete graph of 5. Node 0 falsely suspects node 4 and settles it; node 0
/// is then falsely suspected by its own heir, node 1, which settles it with node 0's ledger
/// version 2 — from before node 0 finished inheriting node 4 — and node 0 reincarnates: node
/// 4's share was lost (Σ = 0.8 L), never counted twice: the known limit "a heir that
/// inherited after the last ledger its own heir holds and then dies with that inheritance",
/// reached by false suspicions alone. Now node 0's reincarnation hands node 4's ledger to
/// node 1 (settlement rule 10, docs/PROTOCOL.md), and the run ends exact.
#[test]
fn false_suspicions_of_a_fresh_heir_lose_nothing() {
    let own = run_scenario(
        5,
        Topology::Complete,
        0.465_066_007_799_233_07,
        0.263_666_759_441_449_9,
        2,
        false,
        793_758_065_276_642_950,
        vec![Event::Run(1)],
        &[0.5; 6],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(own, LIMIT, "Σ own {own}");
}

/// Found by `conservation_under_group_partitions` with idle keys reclaimed (a random seed): a
/// 5-ring without loss, {0, 1, 2} cut off, then key 2 busy at node 1 only, then {3, 4} cut
/// off. Node 3 folded a net of 583,806 it had given node 4 (a retirement, "Idle keys") just
/// after the cut, so its heir (node 0, across the cut) never held the lowered base; node 3
/// then froze its link with node 4 and was settled with the ledger from before the fold,
/// taking its own side of that link as a late fold — the zeroed counters from after it:
/// Σ enforced reached 1.52 L. Now a late fold gives the counters from before any fold its
/// heir may not hold, and the run ends exact.
#[test]
fn a_fold_the_heir_never_held_is_undone_in_the_late_fold() {
    let r = run_scenario(
        5,
        Topology::Ring,
        0.0,
        0.0,
        0,
        false,
        990_003_424_667_260_278,
        vec![
            Event::GroupPartitionHeal(5, 3, 10),
            Event::Demand(1, 1, 179_476.924_425_050_44),
            Event::GroupPartitionHeal(3, 2, 10),
        ],
        &[0.5; 6],
        true,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by `conservation_under_group_partitions` once made exact: a complete graph of 4
/// without any loss, nodes {0, 1} cut off from {2, 3} for 20 cycles (heir of i is i+1).
/// Node 2 settles node 1 and node 0 settles node 3; meanwhile 1 froze its link with 3 (for
/// node 0's settlement of 3) and 3 its link with 1, each after the last ledger its own heir
/// holds. Reincarnated, each answered "not in my estate" and both heirs waited for ever:
/// Σ own = L/2 after healing (the two estates lost). Now node 1, the lower id, hands its
/// side of the link to its heir as a late fold; the heir takes it (node 3's answer is then
/// ignored), node 1's answer becomes `in_estate` and node 3's estate counts it: exact.
#[test]
fn two_by_two_cut_of_a_complete_graph_is_settled_exactly() {
    for seed in 0..8 {
        let r = run_scenario(
            4,
            Topology::Complete,
            0.0,
            0.0,
            0,
            seed % 2 == 0,
            seed,
            vec![Event::GroupPartitionHeal(0, 2, 20)],
            &[1.0; 6],
            true,
        );
        assert!(r.is_ok(), "seed {seed}: {r:?}");
    }
}

/// Found by the same sweep (6 nodes, complete graph, 9 % loss, nodes {2, 3, 4} cut off for
/// 13 cycles): node 4 reincarnated while its link with node 1's dead incarnation was still
/// live, and its new incarnation's link with it carried nothing. Node 4 could not answer
/// for the old link (its counters were dropped with the old incarnation), so node 1's heir
/// and node 4's heir waited for each other. Now a reincarnating node keeps its side of every
/// live link (`final_sides`), answers for it when no later link with that incarnation
/// carried anything, and offers it as a late fold.
#[test]
fn live_link_of_a_reincarnated_node_is_settled_exactly() {
    for (loss, dup, seed, events) in [
        (
            0.089_754_127_247_561_47,
            0.074_457_947_764_048_78,
            8_114_663_643_163_469_131,
            vec![Event::GroupPartitionHeal(2, 3, 13), Event::Run(7)],
        ),
        (
            0.089_564_829_799_632_64,
            0.097_035_342_138_569_26,
            172_159_996_894_486_451,
            vec![Event::GroupPartitionHeal(0, 3, 12)],
        ),
        // Two incarnations of node 1 each had a live link with node 3's dead one.
        (
            0.203_268_409_204_046_07,
            0.031_425_363_255_293_51,
            9_050_626_950_631_472_116,
            vec![
                Event::GroupPartitionHeal(2, 3, 18),
                Event::Run(7),
                Event::Run(7),
                Event::GroupPartitionHeal(5, 3, 13),
            ],
        ),
    ] {
        let r = run_scenario(
            6,
            Topology::Complete,
            loss,
            dup,
            1,
            false,
            seed,
            events,
            &[1.0; 6],
            true,
        );
        assert!(r.is_ok(), "seed {seed}: {r:?}");
    }
}

/// Found by `conservation_under_partitions` with a random seed (`PROPTEST_RNG_SEED=9101`),
/// and wrong before the late folds too: a 4-ring at 21 % loss (heir of i is i+1), node 1 cut
/// off for 10 cycles. Node 1, cut off, started settling its ward 0 (frozen link, node 0 dead
/// to it) but its own heir never acknowledged the ledger recording it, so nobody heard of
/// that settlement. Node 1 was then settled and reincarnated, still ignoring node 0's first
/// incarnation, which is alive: node 0 lost its lease for good (it enforced nothing for the
/// rest of the run) and held the answer node 1's heir waited for: Σ own = L − 137,502.
/// Now a settlement that dies unannounced with its settler restores its ward's floor.
#[test]
fn unannounced_settlement_dies_with_its_settler() {
    let r = run_scenario(
        4,
        Topology::Ring,
        0.206_092_634_221_210_52,
        0.0,
        0,
        false,
        4_225_202_292_971_456_263,
        vec![
            Event::Run(10),
            Event::Demand(1, 0, 0.0),
            Event::Run(14),
            Event::PartitionHeal(5, 10),
        ],
        &[0.5; 6],
        true,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Safety regressions of an intermediate version of the late folds, found with random
/// seeds (`PROPTEST_RNG_SEED=9102`, `9103`): a later incarnation's answer for a dead
/// node's link was taken as "nobody can vouch for it" although that incarnation's own link
/// with the dead one had carried capacity (53,905 units in the first run); the dead node's
/// estate left those flows out and Σ enforced reached L + 6,427. Such an answer now counts
/// as unvouched only when its link carried nothing.
#[test]
fn a_later_link_that_carried_capacity_blocks_the_late_fold() {
    let runs = [
        (
            5,
            0.465_747_952_416_328_9,
            0.233_205_586_342_332_3,
            2,
            false,
            4_453_141_671_382_861_124,
            vec![
                Event::Demand(0, 0, 0.0),
                Event::Run(7),
                Event::PartitionHeal(3, 23),
            ],
        ),
        (
            6,
            0.412_682_754_804_241_66,
            0.265_890_382_995_633_45,
            0,
            true,
            3_314_144_846_242_350_559,
            vec![Event::CrashRestart(4, 14)],
        ),
    ];
    for (n, loss, dup, delay, reserved, seed, events) in runs {
        let r = run_scenario(
            n,
            Topology::Complete,
            loss,
            dup,
            delay,
            reserved,
            seed,
            events,
            &[0.5; 6],
            false,
        );
        assert!(r.is_ok(), "seed {seed}: {r:?}");
    }
}

/// Found by a random sweep with loss under 30 % (1 run in 20,000): a complete graph of 6 at
/// 26.5 % loss, node 2 crashed and restarted 6 cycles later; meanwhile node 4 was falsely
/// suspected and reincarnated. The link between node 2's and node 4's dead incarnations was
/// in neither estate: node 2 (the lower id) had crashed and could offer nothing, node 4 did
/// not offer (the higher id), and node 2's new incarnation stayed silent when asked (it had
/// no record): both estates waited, Σ own = L − 233,334. Now an incarnation with no record
/// says so, naming itself; the heir then knows the incarnation it waits for is gone and
/// takes node 4's side as a late fold, and node 2's estate counts node 4's answer: exact.
#[test]
fn crashed_lower_end_lets_the_higher_end_fold() {
    let r = run_scenario(
        6,
        Topology::Complete,
        0.265_004_644_279_959_23,
        0.030_153_401_900_941_637,
        0,
        true,
        387_804_039_288_407_020,
        vec![Event::CrashRestart(2, 6)],
        &[1.0; 6],
        true,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by `safety_under_overlapping_failures` with random seeds (`PROPTEST_RNG_SEED=9101`),
/// and wrong on the code before the orphan rule too: a 5-ring without loss, messages delayed
/// up to 2 cycles, three overlapping failures in a row (node 2 cut off, node 4 crashed 16
/// cycles later and restarted 3 cycles after that; then node 3 cut off and node 4 crashed
/// again; then node 0 cut off). Node 0, heir of node 4, had sent node 3 a succession notice
/// after node 4's first crash and kept resending it; node 3 named node 4's second
/// incarnation its heir, was settled by it while cut off, and once healed took the stale
/// notice (its link with node 4, frozen, no longer remembered that incarnation): a fresh
/// lease while node 0 inherited node 3's share, Σ enforced = L + 9.3 %. Now a succession
/// notice about an incarnation older than the latest we know (the dead floor remembers it)
/// is ignored.
#[test]
fn stale_succession_after_two_crashes_of_the_heir() {
    let r = run_scenario(
        5,
        Topology::Ring,
        0.0,
        0.0,
        2,
        true,
        10_071_655_843_632_493_082,
        vec![
            Event::CutThenCrash(2, 4, 16, 3),
            Event::CutThenCrash(3, 4, 19, 18),
            Event::PartitionHeal(0, 14),
        ],
        &[
            1.460_845_564_783_369_4,
            0.793_941_536_697_465_8,
            0.898_495_808_136_221_1,
            0.844_545_299_010_199,
            1.172_636_381_800_642,
            1.288_895_556_172_856_3,
        ],
        false,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by a random sweep of overlapping failures (1 run in 8,000): a 5-ring at 40 % loss
/// with duplicates and delay. Node 0's first incarnation, cut off, had frozen its link with
/// its ward node 4 (a settlement that then died unannounced with it, rule 6); its second
/// incarnation linked with node 4 again, and its ledger still listed that link (same peer
/// incarnation) as folded. Cut off again, node 0 was settled by node 1, which skipped node
/// 4's answer for the live link as "folded by the dead node": node 0's side of it counted
/// twice, Σ enforced = L + 1.6 %. A ledger now lists only its own incarnation's folds (and
/// this run now ends exact).
#[test]
fn ledger_lists_only_its_own_incarnations_folds() {
    let r = run_scenario(
        5,
        Topology::Ring,
        0.399_831_938_901_890_17,
        0.292_599_963_062_742_33,
        2,
        true,
        5_763_998_898_011_037_284,
        vec![
            Event::Demand(1, 0, 367_066.970_787_044_85),
            Event::Demand(4, 0, 184_114.671_361_893_68),
            Event::PartitionHeal(0, 27),
            Event::Demand(4, 0, 332_689.683_774_559_8),
            Event::CutThenCrash(0, 4, 23, 2),
        ],
        &[
            0.907_506_951_514_911_1,
            1.046_764_505_043_753_7,
            0.812_805_834_619_731_8,
            0.863_029_920_600_525_3,
            1.044_600_247_105_870_4,
            0.760_365_141_348_069_4,
        ],
        true,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by a random sweep once ward handovers (rule 9) kept an estate that used to be lost,
/// which had masked it: a 5-node complete graph at 45 % loss, node 0 crashed four times and
/// node 1 cut off. Node 1's first incarnation was settled with a ledger naming its link with
/// node 0's third incarnation; node 0's fourth linked with it, carried capacity and folded
/// that link into its own base; its fifth, after a crash, answered "nothing". That answer
/// was taken as superseding the third (a later incarnation whose link carried nothing), and
/// node 1's side of the link with the fourth was counted nowhere: Σ enforced = L + 3,610. A
/// later incarnation now supersedes only the one it directly follows (`SettleReply::prior`).
#[test]
fn only_the_next_incarnation_supersedes_a_dead_link() {
    let r = run_scenario(
        5,
        Topology::Complete,
        0.447_032_307_204_303_37,
        0.077_576_060_307_594_06,
        0,
        true,
        14_060_501_673_884_895_574,
        vec![
            Event::CutThenCrash(0, 0, 3, 11),
            Event::CrashRestart(5, 10),
            Event::CrashRestart(0, 2),
            Event::CutThenCrash(1, 0, 19, 23),
            Event::PartitionHeal(3, 28),
        ],
        &[
            0.721_050_947_635_203_2,
            1.220_217_172_648_181_4,
            1.344_043_381_177_978_4,
            0.808_332_219_230_873_6,
            1.178_976_619_360_278_6,
            0.827_863_835_156_773,
        ],
        false,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Every single overlap of two failures without loss, exhaustively: 3 to 5 nodes, ring or
/// complete graph, each node cut off while each node (itself included) crashes, with the
/// crash a few cycles into the cut or long after, down briefly or for two leases, with and
/// without reservations. Σ enforced ≤ L after every delivery and tick of all 1,000 runs
/// (seed 003 §IV), and every run ends at L exactly once healed. Before the capacity audit, 20
/// runs ended up to 0.2 % under L, and a 3-node cluster that lost the two other nodes at
/// once (one cut off, one crashed) could lose everything but the reservations (see
/// docs/PROTOCOL.md, "The capacity audit").
#[test]
fn every_single_overlap_without_loss_ends_exact() {
    let mut off = Vec::new();
    for n in 3u32..6 {
        for topology in [Topology::Ring, Topology::Complete] {
            for (a, b) in (0..n).flat_map(|a| (0..n).map(move |b| (a, b))) {
                for (d1, d2) in [(1, 1), (5, 10), (10, 20), (20, 1), (20, 20)] {
                    for reserved in [false, true] {
                        let events = vec![Event::CutThenCrash(a, b, d1, d2)];
                        let r = run_scenario(
                            n, topology, 0.0, 0.0, 0, reserved, 2, events, &[1.0; 6], false,
                        );
                        let case = format!("n {n} {topology:?} cut {a} crash {b} {d1}/{d2}");
                        let own = r.unwrap_or_else(|e| panic!("{case}: {e}"));
                        if own != LIMIT {
                            off.push(format!("{case}: Σ {own}"));
                        }
                    }
                }
            }
        }
    }
    assert!(off.is_empty(), "{off:#?}");
}

/// `PROPTEST_RNG_SEED=9201` of `conservation_under_crashes` (21 % loss, random 6-node graph,
/// one crash): eleven messages in a row from node 1 to its heir were lost while node 1's
/// ward, node 0, crashed. Node 1 was declared dead (a false suspicion) before it could settle
/// node 0, and node 0's first incarnation had adopted nobody else: its ledger died with
/// node 1's incarnation and the run ended at 0.765 L. Node 1 now keeps that ledger as a
/// candidate and hands it to the heir that settled it once it hears node 0's next
/// incarnation (rule 9); the run ends exact.
#[test]
fn a_wards_ledger_is_handed_over_once_the_ward_restarts() {
    let r = run_scenario(
        6,
        Topology::Random,
        0.214_334_946_335_792_6,
        0.064_556_222_281_604_04,
        1,
        false,
        938_905_112_049_435_054,
        vec![
            Event::Demand(0, 0, 0.0),
            Event::Demand(0, 0, 0.0),
            Event::Demand(0, 0, 0.0),
            Event::Run(14),
            Event::CrashRestart(0, 19),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(r.ok(), Some(LIMIT));
}

/// Found by a random sweep while ward candidates (rule 9) had no `adopted` check: a 6-ring
/// at 20 % loss with duplicates, four overlapping cut-and-crash events. Node 0's first
/// incarnation kept node 5's ledger as a candidate when it was declared dead; node 5 was
/// alive, adopted node 1 (the successor) and moved on along node 1's successors. When node
/// 5 restarted many cycles later, node 0 handed its ancient ledger to node 1's new
/// incarnation, which settled node 5's first incarnation while node 3 settled it with its
/// fresh ledger: Σ enforced = L + 2.6 %. A heir now declines a handover of any ward
/// incarnation one of its incarnations ever held.
#[test]
fn a_ward_that_moved_on_is_not_settled_from_a_stale_handover() {
    let r = run_scenario(
        6,
        Topology::Ring,
        0.195_113_105_956_737_06,
        0.253_406_529_680_578_86,
        0,
        true,
        13_930_084_583_070_981_786,
        vec![
            Event::CutThenCrash(0, 4, 21, 3),
            Event::Demand(5, 0, 60_571.069_999_138_95),
            Event::Run(2),
            Event::CutThenCrash(1, 2, 17, 22),
            Event::CutThenCrash(4, 5, 18, 21),
            Event::CutThenCrash(0, 5, 6, 11),
        ],
        &[
            1.478_893_595_518_658_8,
            0.878_250_601_354_566_9,
            0.526_384_510_109_127_7,
            0.808_672_729_974_683_1,
            1.157_356_103_146_059,
            1.369_892_250_272_997,
        ],
        false,
    );
    assert!(r.is_ok(), "{r:?}");
}

/// Found by a random sweep of overlapping failures (almost no loss: 0.01 %, with
/// duplicates and delay): a 4-node graph, node 1 cut off and settled by node 3, node 0 (a
/// neighbour of both) crashed and restarted before the cut healed. Node 0's second
/// incarnation linked with node 1's first and carried capacity; both estates waited for
/// ever on the link between the two dead incarnations (node 0's side died with its crash)
/// and 35 % of the limit was lost. Now the settling heir takes both of node 1's sides (of
/// the link with node 0's first incarnation and of the one with its second) as late folds
/// (`Unvouched::Relinked`), and the run ends within what was in flight.
#[test]
fn a_relinked_peer_lets_both_sides_fold() {
    let own = run_scenario(
        4,
        Topology::Random,
        9.494_874_562_356_674e-5,
        0.093_551_300_155_283_37,
        1,
        true,
        4_792_533_326_125_736_641,
        vec![Event::CutThenCrash(5, 0, 11, 6)],
        &[
            1.246_890_287_570_97,
            0.942_095_974_852_544_1,
            1.160_462_113_708_523_7,
            1.467_566_250_321_245_4,
            1.208_831_940_173_067,
            1.130_049_036_283_374,
        ],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(own >= LIMIT - LIMIT / 1_000, "Σ own {own}");
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
        // [runs, under, over] for loss < SETTLEMENTS_EXACT_LOSS and above.
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
                    let band = usize::from(loss > SETTLEMENTS_EXACT_LOSS);
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

/// Found by the counting sweep (`SWEEP_SEED=2`) in rule 10's first version: a complete
/// graph of 5 at 49 % loss, five group cuts. Node 2 settled node 1, taking node 1's side of
/// its link with node 3 as a late fold (the link is then listed as folded in node 1's
/// ledger); node 2 was then settled with a ledger from before that inheritance and handed
/// node 1's ledger to its settler, node 4 — marked folded, without the side. Node 4 counted
/// 788 units fewer than node 2 had, and node 2's gifts from the inheritance were counted in
/// full: Σ enforced reached L + 519. A handed ledger now holds the sides of the late folds
/// taken in its bases, as if the ward had folded those links itself.
#[test]
fn a_handed_ledger_holds_the_late_folds_taken() {
    let own = run_scenario(
        5,
        Topology::Complete,
        0.493_255_619_608_781_1,
        0.095_430_101_840_661_78,
        2,
        true,
        10_511_649_698_662_291_164,
        vec![
            Event::Demand(0, 0, 184_347.634_895_457_97),
            Event::GroupPartitionHeal(3, 2, 5),
            Event::GroupPartitionHeal(4, 3, 24),
            Event::GroupPartitionHeal(1, 2, 17),
            Event::GroupPartitionHeal(3, 2, 1),
            Event::GroupPartitionHeal(4, 2, 5),
        ],
        &[0.5; 6],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(own <= LIMIT, "Σ own {own}");
}

/// Found by the counting sweep (`SWEEP_SEED=1`, one-node cuts, within `EXACT_LOSS`): a
/// random graph of 5 at 27 % loss whose node 2 hangs off node 0 alone. Node 2 is cut off
/// and settled by node 0; back as a new incarnation, node 0 gives it about 200,000 units.
/// Then node 0 is cut off: node 2 can reach nobody, node 0 (its lease still valid) settles
/// it again — at once, with no other neighbour to ask, so before its heir ever holds that
/// settlement — and node 0's heir, node 1, settles node 0 with the ledger that still lists
/// node 2 as its ward, and revives node 2 with a succession notice. Node 2 held its capacity
/// all along, but node 0's new incarnation still took it for dead and ignored its gifts for
/// ever: Σ = 0.85 L. Now the reincarnated node hears such a ward again (rule 10, as rule 6
/// for unfinished settlements) and the run ends exact.
#[test]
fn a_ward_settled_unannounced_is_heard_again_after_its_settler_dies() {
    let own = run_scenario(
        5,
        Topology::Random,
        0.26855907412472285,
        0.04482429658077332,
        0,
        false,
        17708174465973960191,
        vec![
            Event::PartitionHeal(2, 24),
            Event::Run(15),
            Event::Run(3),
            Event::Demand(1, 1, 320424.22297924187),
            Event::Demand(1, 1, 390025.58043616614),
            Event::Run(6),
            Event::PartitionHeal(5, 24),
        ],
        &[
            0.7724887322315055,
            0.6034366870263321,
            0.9459244110285889,
            1.2646142873052784,
            1.1004499677105628,
            1.471360281246224,
        ],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(own, LIMIT, "Σ own {own}");
}

/// Found by the counting sweep of overlapping failures (`SWEEP_SEED=5`): a random graph of 4
/// at 29 % loss, node 0 cut off and, 12 cycles later, node 1 — its heir — crashed for 22
/// cycles. Node 1 had started settling node 0 (its heir, node 3, held the ledger recording
/// that), then crashed before the estate was in: nobody held node 0's ledger any more, and
/// a quarter of the limit was lost for good. Now a ledger lists the settlements under way,
/// each with the ward's ledger and the settler's own answer for its link with the ward;
/// node 3, settling node 1, takes node 0's settlement over (rule 11), and the run ends
/// exact.
#[test]
fn a_settlement_outlives_its_crashed_settler() {
    let own = run_scenario(
        4,
        Topology::Random,
        0.294_190_516_534_817_37,
        0.129_232_424_925_004,
        2,
        false,
        14_700_036_360_593_143_045,
        vec![Event::CutThenCrash(4, 1, 12, 22)],
        &[
            0.978_582_267_850_709,
            0.650_070_090_910_050_9,
            0.544_033_814_427_099_9,
            1.208_980_574_368_959_7,
            0.796_010_614_690_210_6,
            0.833_284_872_396_706_1,
        ],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(own, LIMIT, "Σ own {own}");
}

/// Found by the counting sweep of overlapping failures (`SWEEP_SEED=7`): a 3-ring at 8 %
/// loss, node 1 cut off while node 0 crashed, then node 0 cut off while node 2 crashed.
/// Every node came back holding only its reservation (0 here), so the census should have
/// given the shares back — but each heir held a ward ledger listing incarnations the ward had
/// settled in an earlier life, and a node kept late folds already refused: nobody was
/// pristine, and the cluster enforced nothing for ever (Σ = 0). Now neither counts (what a
/// ward holds is in its holdings and bases; a refused or accepted late fold is final), and
/// the census takes the limit back.
#[test]
fn a_cluster_that_lost_everything_takes_it_back() {
    let own = run_scenario(
        3,
        Topology::Ring,
        0.082_465_169_455_719_1,
        0.196_349_132_331_544_52,
        1,
        false,
        17_011_525_741_377_437_498,
        vec![
            Event::CutThenCrash(1, 0, 19, 19),
            Event::CutThenCrash(3, 2, 9, 22),
            Event::Run(7),
        ],
        &[
            1.004_844_035_979_254_5,
            1.452_518_904_130_059_2,
            1.213_864_451_167_304_7,
            1.165_527_479_055_523,
            0.921_565_827_991_556_8,
            1.218_416_927_966_604_6,
        ],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(own, LIMIT, "Σ own {own}");
}

/// Found by the counting sweep (`SWEEP_SEED=7`): a 5-ring at 43 % loss, node 3 cut off for 10
/// cycles. False suspicions made node 4 settle node 3 and node 2's second incarnation,
/// whose link crossed the cut; node 2 had come back on its own (orphaned, rule 7) before
/// node 4's verdict on that incarnation could reach it, so it never learnt who held the
/// estate and offered it no late fold (rule 5). Both estates waited for ever: 0.67 L. A
/// settler that still waits now tells the later incarnation which of its incarnations it
/// settles, and that one offers its late folds.
#[test]
fn a_late_verdict_on_an_orphaned_incarnation_lets_its_late_folds_go() {
    let own = run_scenario(
        5,
        Topology::Ring,
        0.429_822_122_291_480_6,
        0.068_064_049_854_400_33,
        1,
        true,
        2_997_599_983_003_688_139,
        vec![
            Event::Run(10),
            Event::Run(19),
            Event::PartitionHeal(3, 10),
            Event::Run(17),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=8`): a complete graph of 4 at 46 % loss, node 3
/// crashed for 20 cycles. Node 3 had settled node 2 (a false suspicion) and become node 1's
/// heir in its place; node 0 settled the crashed node 3 and took over its settlement of node
/// 2 (rule 11), whose older ledger also listed node 1 as a ward. That notice, naming node 2,
/// replaced the one naming node 3; node 1 ignored it (its heir was node 3), came back
/// orphaned, and its estate was lost: 0.475 L. The settler's own notice now stands.
#[test]
fn a_notice_names_the_heir_the_ward_last_adopted() {
    let own = run_scenario(
        4,
        Topology::Complete,
        0.464_536_951_380_249_36,
        0.273_775_338_994_211_14,
        0,
        true,
        2_497_621_255_174_765_958,
        vec![
            Event::Demand(2, 0, 341_403.680_723_582_2),
            Event::Run(1),
            Event::CrashRestart(3, 20),
            Event::Demand(2, 1, 274_055.210_536_129_5),
            Event::Run(7),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=7`): a complete graph of 5 at 46 % loss, a crash
/// of node 0 and a false suspicion of node 1. Node 1's ledger named its link with node 0's
/// first incarnation; node 0's second incarnation answered for its own link with node 1,
/// which carried capacity (rule 5, `Unvouched::Relinked`). The heir refused node 1's side of
/// that later link as a late fold because it came before that answer, and then waited for
/// it for ever: 0.74 L. Taking it then as node 1's own side still lost what node 0 had in
/// flight to node 1 (0.994 L): that link now counts from node 0's answer, `F − S`.
#[test]
fn a_relinked_peers_later_link_counts_from_its_answer() {
    let own = run_scenario(
        5,
        Topology::Complete,
        0.455_275_158_487_966_35,
        0.254_657_834_301_717_1,
        1,
        true,
        9_330_157_323_095_124_557,
        vec![
            Event::Demand(5, 1, 34_362.747_121_052_016),
            Event::Run(9),
            Event::Run(18),
            Event::CrashRestart(5, 9),
            Event::Run(6),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=1`): a random graph of 6 at 49 % loss, node 0
/// crashed for 23 cycles. Just before, node 0 settled node 2 (a false suspicion) and the
/// settlement finished at once; node 0 told node 2 it was dead before its heir held a ledger
/// recording the settlement, then crashed. Its heir revived node 2 from the older ledger
/// with a succession notice that node 2's new incarnation ignored, and node 2's estate, in
/// node 0's unrecorded state only, was lost: 0.67 L. A verdict on a finished settlement now
/// waits, like requests and notices, for the heir to hold its start (rule 3).
#[test]
fn a_finished_settlement_waits_for_its_record_to_tell_the_ward() {
    let own = run_scenario(
        6,
        Topology::Random,
        0.491_314_082_433_754_6,
        0.103_576_156_063_258_1,
        0,
        false,
        11_388_298_048_895_309_867,
        vec![
            Event::CrashRestart(0, 23),
            Event::Demand(2, 1, 104_338.140_164_518_35),
            Event::Demand(0, 1, 226_262.068_178_444_6),
            Event::Run(11),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=1`): a complete graph of 6 at 50 % loss, node 1
/// cut off for 8 cycles. Nodes 0 and 5 had named node 1 their heir; declared dead, it kept
/// running for a while, and the two, orphaned (rule 7), stopped naming it, so it dropped
/// their ward records. Nobody else held them, and when they came back as new incarnations
/// both estates were lost: 0.38 L. An orphan now still names its heir (with no ledger): the
/// records become ward candidates of node 1's dead incarnation, handed to its settler.
#[test]
fn an_orphan_keeps_naming_its_heir() {
    let own = run_scenario(
        6,
        Topology::Complete,
        0.498_566_553_599_018_5,
        0.277_579_941_587_086,
        0,
        false,
        1_162_059_976_402_189_528,
        vec![
            Event::PartitionHeal(1, 8),
            Event::Run(13),
            Event::Demand(0, 0, 88_181.868_133_874_73),
            Event::Run(3),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=8`): a 4-ring at 44 % loss, four group cuts.
/// Node 2's second incarnation was born after node 3's first had died, so its ledger named
/// no live link with node 3 and no folded one; node 3's second incarnation answered for
/// their link, which the prior rule (rule 4) could not take: its previous incarnation's
/// link was not in that ledger. The estate waited for ever: 0.79 L. The answer now says
/// that no earlier incarnation of node 3 ever linked with it (`SettleReply::first`).
#[test]
fn an_answer_from_the_first_incarnation_to_link_is_taken() {
    let own = run_scenario(
        4,
        Topology::Ring,
        0.443_635_712_270_472_27,
        0.238_634_437_208_246_37,
        0,
        false,
        13_661_801_021_963_824_232,
        vec![
            Event::Demand(5, 0, 322_169.532_806_140_14),
            Event::GroupPartitionHeal(0, 3, 22),
            Event::GroupPartitionHeal(3, 3, 22),
            Event::GroupPartitionHeal(0, 3, 6),
            Event::GroupPartitionHeal(4, 2, 28),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the proptests (`PROPTEST_RNG_SEED=903`), without any loss: a complete graph of 6,
/// node 1 idle and cut off for 10 cycles (settled by node 2, it came back as a new
/// incarnation), then node 2 crashed. Node 2's ledger named its link with node 1's second
/// incarnation, which had carried nothing; node 1 answered with its first incarnation's
/// side (its later one had exchanged nothing), which node 2 had folded. The settler waited
/// for the named incarnation's answer for ever: 0.77 L. Such an answer now says that the
/// later incarnations exchanged nothing (`SettleReply::later_empty`), and covers the link.
#[test]
fn an_answer_for_a_folded_link_covers_a_later_empty_one() {
    let own = run_scenario(
        6,
        Topology::Complete,
        0.0,
        0.0,
        0,
        true,
        0,
        vec![
            Event::Demand(1, 0, 0.0),
            Event::PartitionHeal(1, 10),
            Event::CrashRestart(2, 1),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=7`, overlapping failures): a 6-ring at 6 % loss,
/// node 5 cut off for 14 cycles, then its heir node 0 crashed for 12. Node 1 took over node
/// 0's settlement of node 5 (rule 11); it waited for the side of node 5's link with node 4,
/// the lower end, which came back orphaned with no heir to hand it to, and refused node 5's
/// own side: 0.77 L. After a few leases the higher end's side is now taken (only what was in
/// flight between them could be lost). Node 4's own estate, whose record died with node 0,
/// is still lost to settlements (0.88 L without the audit); the capacity audit mints it
/// again, and the run ends at L exactly.
#[test]
fn a_lower_end_that_never_offers_does_not_block_the_higher_end() {
    let run = || {
        run_scenario(
            6,
            Topology::Ring,
            0.058_327_226_408_045_59,
            0.117_588_563_356_604_5,
            2,
            true,
            7_456_585_161_130_651_526,
            vec![Event::CutThenCrash(5, 0, 14, 12)],
            &[0.5; 6],
            false,
        )
        .ok()
    };
    assert_eq!(run(), Some(LIMIT));
    AUDIT_OFF.with(|a| a.set(true));
    let settlements_only = run();
    AUDIT_OFF.with(|a| a.set(false));
    assert!(
        settlements_only.is_some_and(|o| (883_000..LIMIT).contains(&o)),
        "{settlements_only:?}"
    );
}

/// Found by the counting sweep (`SWEEP_SEED=8`): a complete graph of 6 at 42 % loss, group
/// cuts. Node 2 settled node 1 and accepted node 1's side of its link with node 4 as a late
/// fold (rule 5), then was itself settled from a ledger from before that; node 3 took the
/// settlement of node 1 over (rule 11) and waited for that side for ever, since node 1 had
/// had it accepted and offered it no more: 0.88 L. Node 3's verdict now tells node 1 who
/// settles it, and node 1 offers its late folds to node 3 again.
#[test]
fn a_late_fold_goes_to_whoever_took_the_settlement_over() {
    let own = run_scenario(
        6,
        Topology::Complete,
        0.417_423_932_676_396_55,
        0.182_943_019_067_982_02,
        0,
        true,
        5_616_989_668_457_937_186,
        vec![
            Event::GroupPartitionHeal(5, 3, 20),
            Event::Demand(4, 0, 347_881.890_794_705_4),
            Event::Run(14),
            Event::GroupPartitionHeal(4, 2, 26),
            Event::GroupPartitionHeal(1, 2, 25),
            Event::Demand(3, 0, 333_570.334_991_470_5),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by `safety_when_old_links_are_forgotten` and `whole_cluster_restarts_stay_strict`
/// with the first version of the capacity audit, which let a node count a neighbour whose
/// incarnation it had frozen as absent, and did not check that every member read. Here
/// (the shrunk case: a 4-ring with reservations, no loss; node 1 restarted, then node 3 cut
/// off for 26 cycles) node 3 froze its links with its neighbours' incarnations while cut off,
/// and a wave counted it without them, or them without it: Σ enforced 1.075 L. A frozen
/// neighbour may be alive as an incarnation we have not heard of (we may be the one cut
/// off), so only one that *left* may be absent from a wave, and every member must read.
/// Safe at every event and exact once healed (it fails with the old rule).
#[test]
fn an_audit_counts_every_member() {
    let own = run_scenario(
        4,
        Topology::Ring,
        0.0,
        0.0,
        0,
        true,
        0,
        vec![
            Event::Demand(0, 0, 0.0),
            Event::CrashRestart(1, 2),
            Event::PartitionHeal(3, 26),
        ],
        &[0.94, 0.84, 0.69, 0.62, 1.35, 1.36],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// In a cluster that loses nothing, audits run and find nothing missing: every round the
/// root confirms mints 0 (the sum of bases and pending folds is the limit, seed 003 §IV),
/// with demand moving capacity between nodes all along.
#[test]
fn an_audit_of_a_cluster_that_lost_nothing_mints_nothing() {
    for (n, edges) in [(5, ring(5)), (6, complete(6))] {
        let make = move |id: NodeId, links: Vec<(NodeId, f64)>| {
            let d: f64 = links.iter().map(|l| l.1).sum();
            let mut c = Config::new(id, (0..n).collect(), links, LIMIT);
            c.gamma = 1.0 / (2.0 * d);
            c.cycle = CYCLE;
            c.lease = 10 * CYCLE;
            c.audit_every = Some(20 * CYCLE);
            c
        };
        let mut c = Cluster::new(n, &edges, make, NetConfig::perfect(), 3).unwrap();
        for i in 0..n {
            c.apply(Step::SetDemand(i, KEYS[0], 100_000.0 * f64::from(i + 1)));
        }
        c.apply(Step::Run(400));
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        let (rounds, minted) = c.node(0).unwrap().audit_stats();
        assert!(rounds >= 10, "{n} nodes: {rounds} rounds confirmed");
        assert_eq!(minted, 0);
        assert_eq!(c.sum_own(KEYS[0]), LIMIT);
    }
}

/// Found by `conservation_under_group_partitions` with `PROPTEST_RNG_SEED=1002` once
/// exactness was asserted up to 50 % loss: a random graph of 4 at 48 % loss, nodes 1 and 2
/// cut off for 11 cycles. Afterwards nodes 0, 1 and 2 each held the next one in their heir
/// cycle dead (or settled it), so no heir renewed any lease and no verdict could be
/// announced: all three leases ran out and stayed out, Σ own = L but Σ enforced = 0.23 L for
/// good. A node whose lease has been out for two leases while its heir is up (or held dead)
/// now starts again, as an orphan does (`Node::lease_stalled`).
#[test]
fn a_cycle_of_heirs_that_froze_each_other_starts_again() {
    let own = run_scenario(
        4,
        Topology::Random,
        0.478_705_810_279_079_16,
        0.174_922_040_591_040_72,
        1,
        false,
        12_348_279_714_541_028_323,
        vec![
            Event::Demand(5, 1, 10_792.910_429_004_465),
            Event::GroupPartitionHeal(5, 2, 11),
        ],
        &[0.5; 6],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=12`, overlapping failures) with the first
/// version of the capacity audit: a random graph of 6 at 42 % loss, node 4 (whose only
/// neighbour is node 1) cut off and node 1 crashed during a confirm wave. Node 1 had not
/// passed on its subtree's confirm (node 4's said its holdings had moved); its restarted
/// incarnation joined the wave under node 2, and the root, whose only neighbour is node 1,
/// took it for a neighbour already in the wave and minted without that subtree: Σ enforced
/// 1.022 L. A wave now fails at a node one of whose neighbours' incarnations ended since it
/// joined, and a node no longer calls a later incarnation of its parent its parent.
#[test]
fn an_audit_wave_fails_when_a_neighbour_dies_in_it() {
    let own = run_scenario(
        6,
        Topology::Random,
        0.417_254_296_650_874,
        0.187_230_006_832_274_7,
        0,
        false,
        13_257_577_620_871_637_123,
        vec![
            Event::Demand(2, 1, 153_702.976_355_447_4),
            Event::CutThenCrash(1, 0, 21, 14),
            Event::CutThenCrash(4, 1, 4, 11),
            Event::Run(6),
        ],
        &[0.958_9, 1.468_6, 1.114_2, 0.932_2, 0.505_4, 0.661_2],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}

/// Found by the counting sweep (`SWEEP_SEED=15`, overlapping failures): a complete graph of
/// 5 at 48 % loss, node 4 cut off, then its heir node 0 crashed. Node 4 came back from a
/// verdict while cut off, sent its ledger once to node 0 and was declared dead by it before
/// any lease; node 0 crashed, node 1 took that settlement over (rule 11), and node 4, never
/// leased, took a lease from node 0's restarted incarnation and lived on with its estate
/// counted, its other neighbours holding it dead: 0.96 L for good, since the capacity
/// audit's waves could not complete around it. A node that was never leased is now
/// orphaned when the heir incarnation it sent its ledger to dies, as one whose lease came
/// from it is (`Node::lease_heir_gone`).
#[test]
fn a_node_never_leased_is_orphaned_when_the_heir_it_wrote_to_dies() {
    let own = run_scenario(
        5,
        Topology::Complete,
        0.477_709_142_845_487_4,
        0.213_724_241_832_126_18,
        2,
        true,
        8_894_722_974_309_647_081,
        vec![Event::Run(18), Event::CutThenCrash(4, 5, 18, 3)],
        &[1.2556, 1.3602, 0.7954, 0.7597, 0.6868, 0.9286],
        true,
    );
    assert_eq!(own.ok(), Some(LIMIT));
}
