#![allow(clippy::unwrap_used)]
//! Property tests: conservation under random networks and failures; the wire decoder.

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use sluice_coord::law::jfi;
use sluice_coord::node::{Config, Fallback};
use sluice_coord::testing::{Cluster, NetConfig, Step, complete, ring};
use sluice_coord::wire::{
    self, Holding, KeyEntry, Ledger, Lifecycle, Message, NodeId, Part, SettleReply,
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
    /// indicators equalise (JFI ≥ 0.99, seed 003 eq. 16, steady demand, C = 1.1 Λ, §III-A).
    #[test]
    fn conservation_under_network_faults(
        n in 3u32..7, dense in any::<bool>(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(event(false, false), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, dense, loss, dup, delay, reserved, seed, events, &shape, true)?;
    }

    /// Issue item 5, strict modes: with crashes and restarts on top of the network faults,
    /// Σ enforced ≤ L at every event (safety). Exactness afterwards is not asserted: a node
    /// that crashes before its heir ever heard from it, or a settlement whose replier lost its
    /// memory, loses capacity (never counts it twice); see docs/PROTOCOL.md.
    #[test]
    fn safety_under_crashes(
        n in 3u32..7, dense in any::<bool>(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(event(true, false), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, dense, loss, dup, delay, reserved, seed, events, &shape, false)?;
    }

    /// The same with one node cut off at a time (partitions: pitfalls (b) and (c)).
    #[test]
    fn safety_under_partitions(
        n in 3u32..7, dense in any::<bool>(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(event(false, true), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, dense, loss, dup, delay, reserved, seed, events, &shape, false)?;
    }

    /// Several nodes cut off together (a group on one side, heirs inside and outside it):
    /// Σ enforced ≤ L at every event (strict modes), Σ own ≤ L at the end (seed 003 §IV:
    /// "no local limiter gains or loses extra capacity"). This found the chained-settlement
    /// deadlock across a multi-node cut (regression case in `properties.proptest-regressions`,
    /// minimal scenario `chained_settlement_across_a_group_cut_counts_nothing_twice` in
    /// `scenarios.rs`, explanation in docs/PROTOCOL.md).
    #[test]
    fn safety_under_group_partitions(
        n in 4u32..7, dense in any::<bool>(), loss in 0.0f64..0.5, dup in 0.0f64..0.3,
        delay in 0u64..3, reserved in any::<bool>(), seed in any::<u64>(),
        events in prop::collection::vec(group_event(), 1..8),
        shape in prop::collection::vec(0.5f64..1.5, 6),
    ) {
        run_scenario(n, dense, loss, dup, delay, reserved, seed, events, &shape, false)?;
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
    /// busy at random nodes and go quiet again, under loss, duplication and reordering: Σ own
    /// ≤ L and Σ enforced ≤ L for every key after every cycle (seed 003 §IV). Once every key
    /// has been idle long enough, every node holds no key state at all, and every key is back
    /// at its static split exactly (nothing lost, nothing counted twice).
    /// A random seed found a 3-ring without loss, one wave at node 0, where node 0 dropped
    /// the key before telling its neighbours it was idle and they kept it for ever; fixed by
    /// `Message::all_keys` (saved in `properties.proptest-regressions`).
    #[test]
    fn idle_keys_are_reclaimed_and_conserve(
        n in 3u32..6, dense in any::<bool>(), loss in 0.0f64..0.3, dup in 0.0f64..0.2,
        delay in 0u64..2, seed in any::<u64>(), relay in any::<bool>(),
        waves in prop::collection::vec((0u64..6, 0u32..6, 0.0f64..600_000.0, 1u64..12), 1..10),
    ) {
        let edges = if dense { complete(n) } else { ring(n) };
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
        let check = |c: &Cluster| -> Result<(), TestCaseError> {
            for &k in &keys {
                prop_assert!(c.sum_own(k) <= LIMIT, "key {} Σ own {} at t={}", k, c.sum_own(k), c.now());
            }
            prop_assert!(c.violations.is_empty(), "{:?}", c.violations);
            Ok(())
        };
        let busy = waves.iter().any(|w| w.2 >= 1_000.0);
        let mut max_held = 0;
        for (k, i, rate, dur) in waves {
            c.apply(Step::SetDemand(i % n, keys[k as usize], rate));
            for _ in 0..dur {
                c.apply(Step::Run(1));
                check(&c)?;
                let held: usize = (0..n).map(|i| c.node(i).unwrap().active_keys().count()).sum();
                max_held = max_held.max(held);
            }
            // The key goes quiet again, at random later or at once.
            if rate > 300_000.0 {
                c.apply(Step::SetDemand(i % n, keys[k as usize], 0.0));
            }
        }
        prop_assert!(max_held > 0 || !busy, "the waves created key state");
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
        false,
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
/// ≤ L at every event (strict modes). `PROPTEST_CASES` scales it like the others.
#[test]
fn safety_under_mixed_failures() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let mut runner = proptest::test_runner::TestRunner::new(config(cases));
    let strategy = (
        (
            3u32..7,
            any::<bool>(),
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
        |((n, dense, loss, dup, delay, reserved, seed), events, shape)| {
            run_scenario(
                n, dense, loss, dup, delay, reserved, seed, events, &shape, false,
            )
        },
    );
    assert!(result.is_ok(), "{result:?}");
}

#[allow(clippy::too_many_arguments)]
fn run_scenario(
    n: u32,
    dense: bool,
    loss: f64,
    dup: f64,
    delay: u64,
    reserved: bool,
    seed: u64,
    events: Vec<Event>,
    shape: &[f64],
    exact: bool,
) -> Result<(), TestCaseError> {
    let edges = if dense { complete(n) } else { ring(n) };
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
    Ok(())
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
        Just(Part::ShareOnly)
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
    )
        .prop_map(|(holdings, bases, neighbours, wards, settled)| Ledger {
            version: bases.len() as u64 * 7,
            holdings,
            bases,
            neighbours,
            wards,
            folded: settled.clone(),
            settled,
        });
    let reply = (
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        (prop::option::of(any::<u64>()), any::<bool>()),
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..3),
    )
        .prop_map(
            |(dead, incarnation, replier_incarnation, (prior, in_estate), entries)| SettleReply {
                dead,
                incarnation,
                replier_incarnation,
                prior,
                in_estate,
                entries,
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
        (any::<bool>(), any::<bool>()),
        prop::option::of(ledger),
        prop::collection::vec(entry, 0..6),
        prop::collection::vec((any::<u32>(), any::<u64>()), 0..3),
        prop::collection::vec(reply, 0..2),
        prop::option::of((any::<u32>(), any::<u64>())),
        any::<u64>(),
        (
            prop::collection::vec((any::<u64>(), any::<u64>()), 0..3),
            prop::collection::vec((any::<u64>(), any::<u64>()), 0..3),
            prop::collection::vec(any::<u64>(), 0..3),
        ),
    )
        .prop_map(
            |(
                (from_inc, to_inc, sent_at, echo, dead_verdict, verdict_version),
                lifecycle,
                (to_heir, all_keys),
                ledger,
                keys,
                settle_requests,
                settle_replies,
                succession,
                ledger_ack,
                (retire, retired, confirm),
            )| {
                Message {
                    from_inc,
                    to_inc,
                    sent_at,
                    echo,
                    lifecycle,
                    to_heir,
                    all_keys,
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
                }
            },
        )
}

/// Regression (found by `safety_under_mixed_failures` with a random seed): 6 nodes, complete
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
        true,
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

/// Found by `safety_under_group_partitions` with a random seed (6-ring, 30 % loss, three
/// group cuts in a row): nodes 5 and 0 each froze their link with the other after the last
/// ledger their heirs held, both were settled and reincarnated, and each answered the other's
/// heir. With those answers counted as empty on both sides (an intermediate version of the
/// fix for `mixed_failures_node_restarted_twice`) node 0's estate came out negative,
/// −17,896 units, was clamped to zero, and Σ enforced reached L + 17,895. Now such answers
/// say they are not in the replier's estate (`SettleReply::in_estate`), the heirs wait, and
/// nothing is counted twice (seed 003 §IV).
#[test]
fn group_cuts_chain_of_three() {
    let r = run_scenario(
        6,
        false,
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
        false,
    );
    assert!(r.is_ok(), "{r:?}");
}
