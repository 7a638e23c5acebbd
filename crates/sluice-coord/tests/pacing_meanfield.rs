//! Seed 004 §4.3: the mean-field number of tokens, and §1's promise that reactive sends let
//! news cross the graph in hops rather than periods.
#![allow(clippy::unwrap_used)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use sluice_coord::pacing::{Strategy, TokenAccount};

/// SplitMix64: a small seeded generator, so the test needs no RNG crate.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A node's period ends.
    Tick(usize),
    /// A message arrives at a node.
    Arrive(usize),
}

/// Gossip learning in the failure-free scenario of seed 004 §4.1–4.3: every message a node
/// receives is useful (u = 1) and is answered reactively; proactive messages go to a random
/// peer. Returns the average balance over nodes, sampled once per period in the second half.
fn gossip_learning_average_tokens(
    strategy: Strategy,
    nodes: usize,
    periods: u64,
    seed: u64,
) -> f64 {
    const DELTA: u64 = 172_800; // Δ = 172.8 s in ms units (§4.1); only ratios matter
    const TRANSFER: u64 = DELTA / 100; // 1.728 s (§4.1)
    let mut rng = SplitMix(seed);
    let mut queue = BinaryHeap::new();
    let mut accounts: Vec<TokenAccount> = (0..nodes)
        .map(|i| {
            // Unsynchronised rounds: each node starts at a random phase.
            let start = rng.below(DELTA as usize) as u64;
            let acc = TokenAccount::new(strategy, DELTA, start).unwrap();
            queue.push(Reverse((acc.next_tick(), Event::Tick(i))));
            acc
        })
        .collect();
    let end = periods * DELTA;
    let mut next_sample = end / 2;
    let (mut sum, mut samples) = (0.0, 0u64);
    while let Some(Reverse((now, event))) = queue.pop() {
        if now >= end {
            break;
        }
        while next_sample <= now {
            sum += accounts.iter().map(|a| f64::from(a.tokens())).sum::<f64>() / nodes as f64;
            samples += 1;
            next_sample += DELTA;
        }
        let (node, sends) = match event {
            Event::Tick(i) => {
                let sent = accounts[i].on_tick(now, rng.unit());
                queue.push(Reverse((accounts[i].next_tick(), Event::Tick(i))));
                (i, u32::from(sent))
            }
            Event::Arrive(i) => (i, accounts[i].on_news(now, rng.unit())),
        };
        for _ in 0..sends {
            let mut peer = rng.below(nodes - 1);
            if peer >= node {
                peer += 1;
            }
            queue.push(Reverse((now + TRANSFER, Event::Arrive(peer))));
        }
    }
    sum / samples as f64
}

/// Seed 004 §4.3 eq. 10: with u = 1 the randomized account settles where
/// `reactive(a) + proactive(a) = 1`, i.e. `a = A·C/(C + 1)`.
#[test]
fn randomized_mean_field_token_count() {
    for (a, c) in [(5u32, 10u32), (2, 10), (10, 20)] {
        let strategy = Strategy::randomized(a, c).unwrap();
        let measured = gossip_learning_average_tokens(strategy, 1000, 400, 0x5EED + u64::from(a));
        let predicted = f64::from(a) * f64::from(c) / f64::from(c + 1);
        eprintln!("A={a} C={c}: measured {measured:.3}, mean-field {predicted:.3}");
        assert!(
            (measured - predicted).abs() <= 0.05 * predicted,
            "A={a} C={c}: measured {measured}, predicted {predicted}"
        );
    }
}

/// How long news injected at node 0 of a line of `hops + 1` nodes takes to reach the end,
/// when every link is paced by a fresh account of `strategy` that had `warmup` quiet
/// periods. A message carries the news if its sender had it when sending.
fn line_propagation_delay(strategy: Strategy, hops: usize, warmup: u64, seed: u64) -> u64 {
    const DELTA: u64 = 1_000_000;
    const LATENCY: u64 = 1_000; // Δ/1000: hops are cheap, waiting for a period is not
    let mut rng = SplitMix(seed);
    let mut queue = BinaryHeap::new();
    let mut links: Vec<TokenAccount> = (0..hops)
        .map(|i| {
            let start = rng.below(DELTA as usize) as u64;
            let acc = TokenAccount::new(strategy, DELTA, start).unwrap();
            queue.push(Reverse((acc.next_tick(), Event::Tick(i))));
            acc
        })
        .collect();
    let inject = (warmup + 1) * DELTA + DELTA / 2;
    let mut informed = vec![false; hops + 1];
    queue.push(Reverse((inject, Event::Arrive(0))));
    while let Some(Reverse((now, event))) = queue.pop() {
        let (node, sends) = match event {
            Event::Tick(i) => {
                let sent = links[i].on_tick(now, rng.unit());
                queue.push(Reverse((links[i].next_tick(), Event::Tick(i))));
                (i, u32::from(sent))
            }
            Event::Arrive(i) if !informed[i] => {
                informed[i] = true;
                if i == hops {
                    return now - inject;
                }
                (i, links[i].on_news(now, rng.unit()))
            }
            Event::Arrive(_) => continue,
        };
        if informed[node] && sends > 0 {
            queue.push(Reverse((now + LATENCY, Event::Arrive(node + 1))));
        }
    }
    unreachable!("the proactive component always delivers eventually")
}

/// Seed 004 §1/§3: reactive sends go out at once while tokens last, so news crosses a
/// 10-hop line in 10 transfer latencies (here 1% of one period in total), while the purely
/// proactive baseline waits for each link's next period boundary.
#[test]
fn hotspot_crosses_line_in_hops_not_periods() {
    const DELTA: u64 = 1_000_000;
    let hops = 10;
    for strategy in [
        Strategy::simple(2),
        Strategy::generalized(1, 4).unwrap(),
        Strategy::randomized(2, 4).unwrap(),
    ] {
        // After 5 quiet periods every account is full (C ≤ 4), so each hop reacts at once.
        let delay = line_propagation_delay(strategy, hops, 5, 7);
        assert_eq!(delay, hops as u64 * 1_000, "{strategy:?}");
    }
    let proactive = line_propagation_delay(Strategy::Proactive, hops, 5, 7);
    // Each hop waits for its link's next period end, uniform in [0, Δ): about 5Δ in total.
    assert!(proactive > 2 * DELTA, "proactive took {proactive} ns");
}
