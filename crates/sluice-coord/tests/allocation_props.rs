//! Client allocation inside a node (seed 000 §7, Alg. 1 and 2) and capacity leases.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sluice_coord::allocation::{
    AllocationError, AllocationPolicy, ClientLeases, Units, allocate_max_min,
    allocate_proportional, units_floor,
};

fn wants() -> impl Strategy<Value = Vec<Units>> {
    prop_oneof![
        4 => prop::collection::vec(0u64..1_000, 0..30),
        1 => prop::collection::vec(prop_oneof![Just(0u64), 0u64..10, Just(u64::MAX), any::<u64>()], 0..8),
    ]
}

fn share() -> impl Strategy<Value = Units> {
    prop_oneof![4 => 0u64..20_000, 1 => any::<u64>()]
}

fn sum(xs: &[Units]) -> u128 {
    xs.iter().map(|&x| u128::from(x)).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Seed 000 Alg. 2 (water-filling): exact total min(share, Σw), nobody above its want,
    /// and max-min fairness in whole units: a client that got less than it asked has at
    /// least everyone else's allocation minus one. (So raising it by a unit means lowering
    /// someone who has at least as much as it would then have — continuous max-min fairness
    /// up to the indivisible unit.)
    #[test]
    fn max_min_is_exact_capped_and_fair(share in share(), wants in wants()) {
        let x = allocate_max_min(share, &wants);
        prop_assert_eq!(x.len(), wants.len());
        prop_assert_eq!(sum(&x), sum(&wants).min(u128::from(share)));
        for (i, (&xi, &wi)) in x.iter().zip(&wants).enumerate() {
            prop_assert!(xi <= wi);
            if xi < wi {
                for &xj in &x {
                    prop_assert!(xj <= xi + 1, "client {} has {} < want {}, another has {}", i, xi, wi, xj);
                }
            }
        }
    }

    /// Seed 000 Alg. 1: everything asked when it fits; otherwise the exact proportional
    /// share·w_i/Σw rounded to a neighbouring integer, adding up to exactly the share.
    #[test]
    fn proportional_is_exact_and_within_one_unit_of_the_ratio(share in share(), wants in wants()) {
        let x = allocate_proportional(share, &wants);
        prop_assert_eq!(x.len(), wants.len());
        let total = sum(&wants);
        if total <= u128::from(share) {
            prop_assert_eq!(&x, &wants);
        } else {
            prop_assert_eq!(sum(&x), u128::from(share));
            for (&xi, &wi) in x.iter().zip(&wants) {
                prop_assert!(xi <= wi);
                // |x_i − share·w_i/Σw| < 1, i.e. x_i is the floor or the ceiling.
                let exact = u128::from(share) * u128::from(wi);
                let scaled = u128::from(xi) * total;
                prop_assert!(scaled.abs_diff(exact) < total);
            }
        }
    }
}

#[test]
fn paper_examples() {
    // Not oversubscribed: both algorithms hand out what was asked (lines 2–5).
    assert_eq!(allocate_proportional(100, &[10, 20, 30]), vec![10, 20, 30]);
    assert_eq!(allocate_max_min(100, &[10, 20, 30]), vec![10, 20, 30]);
    // Oversubscribed 2×: uniform ratio 1/2 vs. level l = 35 on the two large clients.
    assert_eq!(allocate_proportional(100, &[20, 80, 100]), vec![10, 40, 50]);
    assert_eq!(allocate_max_min(100, &[20, 80, 100]), vec![20, 40, 40]);
    // Indivisible units: 10 among 3 equal wants; the total stays exact.
    assert_eq!(allocate_max_min(10, &[9, 9, 9]).iter().sum::<u64>(), 10);
    assert_eq!(
        allocate_proportional(10, &[9, 9, 9]).iter().sum::<u64>(),
        10
    );
    assert_eq!(units_floor(2.9), 2);
    assert_eq!(units_floor(f64::NAN), 0);
    assert_eq!(units_floor(-1.0), 0);
}

const L: u64 = 100;

#[derive(Debug, Clone, Copy)]
enum Op {
    Request { client: u64, wants: Units },
    SetShare(Units),
    Expire,
    Release(u64),
}

fn ops() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let op = prop_oneof![
        6 => (0u64..6, 0u64..300).prop_map(|(client, wants)| Op::Request { client, wants }),
        2 => (0u64..600).prop_map(Op::SetShare),
        1 => Just(Op::Expire),
        1 => (0u64..6).prop_map(Op::Release),
    ];
    let gap = prop_oneof![2 => Just(0u64), 3 => 0..L / 4, 2 => 0..2 * L];
    prop::collection::vec((gap, op), 1..80)
}

fn policy() -> impl Strategy<Value = AllocationPolicy> {
    prop_oneof![
        Just(AllocationPolicy::Proportional),
        Just(AllocationPolicy::MaxMin)
    ]
}

/// Every grant the test has seen, as the client holds it.
struct Held {
    client: u64,
    rate: Units,
    issued: u64,
    expires: u64,
    released: u64,
}

/// What clients may be using at `τ` (after every operation at `τ`): per client, the largest
/// rate among its grants issued by then, not yet expired, not released.
fn committed_at(ledger: &[Held], tau: u64) -> u128 {
    let mut per_client = std::collections::BTreeMap::<u64, Units>::new();
    for h in ledger {
        if h.issued <= tau && tau < h.expires.min(h.released) {
            let e = per_client.entry(h.client).or_default();
            *e = (*e).max(h.rate);
        }
    }
    per_client.values().map(|&r| u128::from(r)).sum()
}

/// The largest share in effect at any instant of `(τ − L, τ]`.
fn max_share_over_last_lease(history: &[(u64, Units)], tau: u64) -> Units {
    let start = i128::from(tau) - i128::from(L);
    let mut best = 0;
    for (k, &(t, s)) in history.iter().enumerate() {
        let next = history.get(k + 1).map_or(i128::MAX, |h| i128::from(h.0));
        let (t, tau) = (i128::from(t), i128::from(tau));
        // In effect on [t, next), and at the instant t even if replaced at that same
        // instant (a grant may have been cut under it); intersect with (start, tau].
        if t <= tau && (next > start || t > start) {
            best = best.max(s);
        }
    }
    best
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// `ClientLeases` guarantees 1–4 over random request / set_share / expire / release
    /// sequences. Guarantee 1 is checked at every instant where either side can change: each
    /// operation, each grant expiry, and each instant a share leaves the (τ − L, τ] window.
    #[test]
    fn leases_never_commit_more_than_recent_share(
        policy in policy(),
        initial in 0u64..600,
        ops in ops(),
    ) {
        let mut table = ClientLeases::new(policy, L, initial, 0).unwrap();
        let mut history = vec![(0u64, initial)];
        let mut ledger: Vec<Held> = Vec::new();
        let mut demand = std::collections::BTreeMap::new();
        let mut now = 0;
        for (gap, op) in ops {
            now += gap;
            match op {
                Op::Request { client, wants } => {
                    demand.insert(client, wants);
                    let g = table.request(now, client, wants);
                    prop_assert!(g.rate <= wants, "granted {} > asked {}", g.rate, wants);
                    prop_assert!(g.rate <= table.target(client).unwrap());
                    prop_assert_eq!(g.expires_at, now + L);
                    ledger.push(Held { client, rate: g.rate, issued: now, expires: g.expires_at, released: u64::MAX });
                }
                Op::SetShare(s) => {
                    table.set_share(now, s);
                    history.push((now, s));
                }
                Op::Expire => table.expire(now),
                Op::Release(client) => {
                    table.release(now, client);
                    for h in ledger.iter_mut().filter(|h| h.client == client) {
                        h.released = h.released.min(now);
                    }
                    prop_assert!(table.target(client).is_none());
                }
            }
            // Guarantee 2: targets fit the share as soon as any call returns; they are the
            // policy's division of it among the live clients' latest demands.
            prop_assert!(table.total_target() <= table.share());
            let live: Vec<(u64, Units)> = demand
                .iter()
                .filter(|(c, _)| table.target(**c).is_some())
                .map(|(&c, &w)| (c, w))
                .collect();
            let wants: Vec<Units> = live.iter().map(|&(_, w)| w).collect();
            let expected = policy.allocate(table.share(), &wants);
            for (&(c, _), &x) in live.iter().zip(&expected) {
                prop_assert_eq!(table.target(c), Some(x));
            }
            // The table's own count is exactly what clients may be using.
            prop_assert_eq!(u128::from(table.outstanding()), committed_at(&ledger, now));
            // Guarantee 4: a client is live iff it holds an unexpired, unreleased grant.
            for client in 0..6 {
                let live = ledger.iter().any(|h| h.client == client && h.issued <= now && now < h.expires.min(h.released));
                prop_assert_eq!(table.target(client).is_some(), live);
            }
        }
        // Guarantee 1 at every instant where the committed sum rises (operations) or the
        // bound drops (a share leaving the window); between those the sum only falls.
        let mut instants: Vec<u64> = ledger.iter().flat_map(|h| [h.issued, h.expires]).collect();
        instants.extend(history.iter().flat_map(|&(t, _)| [t, t + L]));
        instants.sort_unstable();
        instants.dedup();
        let last_change = history.last().unwrap().0;
        for tau in instants {
            let committed = committed_at(&ledger, tau);
            let bound = max_share_over_last_lease(&history, tau);
            prop_assert!(committed <= u128::from(bound), "at {}: committed {} > {}", tau, committed, bound);
            if tau >= last_change + L {
                // A lease after the last change, only the current share counts.
                prop_assert!(committed <= u128::from(table.share()));
            }
        }
    }

    /// Guarantee 3: after the last change of share and demands, grants older than it drain
    /// within one lease, and then every refreshing client receives exactly its target — the
    /// policy's division of the share.
    #[test]
    fn refreshed_grants_converge_to_the_policy_within_one_lease(
        policy in policy(),
        share in 0u64..600,
        before in ops(),
        wants in prop::collection::vec(0u64..300, 1..6),
    ) {
        let mut table = ClientLeases::new(policy, L, 300, 0).unwrap();
        let mut now = 0;
        for (gap, op) in before {
            now += gap;
            match op {
                Op::Request { client, wants } => { table.request(now, client + 100, wants); }
                Op::SetShare(s) => table.set_share(now, s),
                Op::Expire => table.expire(now),
                Op::Release(c) => table.release(now, c + 100),
            }
        }
        // Let the old clients' grants lapse, then change share and demands once.
        let t_c = now + L;
        table.set_share(t_c, share);
        for (j, &w) in wants.iter().enumerate() {
            table.request(t_c, j as u64, w);
        }
        // A refresh without change keeps everyone live; the round-1 grants may exceed the
        // final targets (computed before the later clients arrived) until they expire.
        for (j, &w) in wants.iter().enumerate() {
            table.request(t_c + 1, j as u64, w);
        }
        let expected = policy.allocate(share, &wants);
        for (j, &w) in wants.iter().enumerate() {
            let g = table.request(t_c + L, j as u64, w);
            prop_assert_eq!(g.rate, expected[j]);
        }
    }
}

#[test]
fn expired_clients_release_capacity() {
    let mut t = ClientLeases::new(AllocationPolicy::MaxMin, L, 100, 0).unwrap();
    assert_eq!(t.request(0, 1, 100).rate, 100);
    // Client 1 holds everything: client 2's fair part is 50, but none is free yet.
    assert_eq!(t.request(10, 2, 50).rate, 0);
    assert_eq!(t.target(2), Some(50));
    // Client 1 never refreshes: at its expiry it is forgotten and client 2 gets it all.
    t.expire(L);
    assert_eq!(t.target(1), None);
    assert_eq!(t.outstanding(), 0);
    assert_eq!(t.request(L, 2, 80).rate, 80);
    // An explicit release frees capacity at once.
    t.release(L + 1, 2);
    assert!(t.is_empty());
    assert_eq!(t.request(L + 2, 3, 100).rate, 100);
}

#[test]
fn share_decrease_drains_within_one_lease() {
    let mut t = ClientLeases::new(AllocationPolicy::Proportional, L, 100, 0).unwrap();
    assert_eq!(t.request(0, 1, 60).rate, 60);
    assert_eq!(t.request(0, 2, 40).rate, 40);
    t.set_share(10, 50);
    // Targets fit the new share immediately; the grants already out cannot be recalled.
    assert_eq!(t.total_target(), 50);
    assert_eq!(t.outstanding(), 100);
    // A refresh gets min(target, headroom): client 2's old 40 still counts, so client 1
    // gets 10 now, while its old 60 stays committed until it expires at L.
    assert_eq!(t.request(20, 1, 60).rate, 10);
    assert_eq!(t.outstanding(), 100);
    assert_eq!(t.request(30, 2, 40).rate, 0);
    // One lease after the decrease every grant from before it has expired.
    t.expire(L);
    assert!(t.outstanding() <= 50);
    // (Both still hold their small refreshed grants, so both are still live.)
    assert_eq!(t.request(L + 15, 1, 60).rate, 30);
    assert_eq!(t.request(L + 15, 2, 40).rate, 20);
    assert_eq!(t.outstanding(), 50);
    assert_eq!(
        ClientLeases::new(AllocationPolicy::MaxMin, 0, 1, 0).unwrap_err(),
        AllocationError::ZeroLeaseDuration
    );
}
