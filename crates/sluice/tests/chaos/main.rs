//! The chaos suite: real `sluice serve` processes on 127.0.0.1 (one GCRA rule of 1,000/s,
//! burst 100, lease 1 s, cycle 100 ms, `--fallback none`), a client that counts what they
//! admit in sliding 1 s windows, and the operations an SRE performs: kill -9 and restart
//! with and without a state file, crashes after earlier restarts, SIGSTOP/SIGCONT around
//! the lease, rolling restarts and a rolling upgrade across wire versions.
//!
//! Every scenario asserts the guarantees, not that code ran: no 1 s window admits more than
//! `L + burst`, and the cluster is back at its whole limit within the stated bound after the
//! last failure (no outage). The short scenarios run with the rest of the tests;
//! `scripts/chaos.sh` runs them all and prints their figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

mod elastic;
mod harness;
mod heavy_flood;

use std::time::Duration;

use harness::{BURST, Cluster, LEASE_MS, LIMIT, Load, Record, Start, report};

pub(crate) const SEC: Duration = Duration::from_secs(1);

/// One scenario at a time: each runs three daemons and a client that must keep its pace.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `scripts/chaos.sh` sets `CHAOS_LONG=1`: longer scenarios, more keys.
fn long() -> bool {
    std::env::var_os("CHAOS_LONG").is_some()
}

/// Demand per node: 1.6 L in all, skewed 50/30/20 so that shares must move.
fn skewed(c: &Cluster) -> Vec<(usize, std::net::SocketAddr, f64)> {
    let l = LIMIT as f64;
    [0.5, 0.3, 0.2]
        .iter()
        .enumerate()
        .filter(|&(i, _)| c.running(i))
        .map(|(i, f)| (i, c.addr(i), 1.6 * l * f))
        .collect()
}

/// The most any 1 s window may admit: the limit's rate plus the rule's burst (each node's
/// part of the burst is rounded up to at least 1).
fn window_bound(nodes: usize) -> u64 {
    LIMIT + BURST + nodes as u64
}

/// 90 % of what the cluster should admit once `victim` is gone: the demand left (1.6 L split
/// by `fractions`, less the victim's), up to the limit.
fn floor_without(fractions: &[f64], victim: usize) -> u64 {
    let left: f64 = fractions
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != victim)
        .map(|(_, f)| 1.6 * f)
        .sum();
    (0.9 * left.min(1.0) * LIMIT as f64) as u64
}

/// Asserts the nodes' shares, read at the end, add up to the whole limit (and no more).
fn assert_whole(name: &str, shares: Option<f64>, who: &str) {
    let s = shares.unwrap_or_else(|| panic!("{name}: not {who}"));
    assert!(
        (0.99..=1.0 + 1e-9).contains(&s),
        "{name}: shares add up to {s}"
    );
}

/// Asserts no 1 s window of `r` admitted more than `L + burst`.
pub(crate) fn assert_no_overshoot(name: &str, r: &Record, nodes: usize) -> u64 {
    let (most, at) = r.max_window(SEC, Duration::ZERO, r.end);
    assert!(
        most <= window_bound(nodes),
        "{name}: {most} admitted in the 1 s window from {at:?} (bound {})",
        window_bound(nodes)
    );
    most
}

/// The busy key's least 1 s `window` (admitted, start; from [`Record::min_window`]) is at
/// least `floor`; the message says what was sent in it and where it was refused.
pub(crate) fn assert_window_floor(
    name: &str,
    r: &Record,
    (least, at): (u64, Duration),
    floor: u64,
    when: &str,
) {
    assert!(
        least >= floor,
        "{name}: the busy key fell to {least} in the 1 s from {at:?} {when} ({})",
        r.sent_in(at, Duration::from_secs(1))
    );
}

/// 3 nodes with state files. kill -9 node 0 and restart it; later kill -9 node 1. The
/// cluster must come back to admitting its whole limit and stay there.
#[test]
fn restart_then_crash_recovers() {
    if long() {
        // Every order: which node restarts, which one crashes later.
        let orders = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (0, 0)];
        every(orders.into_iter().flat_map(|(restarted, crashed)| {
            [Start::StateFile, Start::Plain].map(|start| {
                (
                    format!("restart {restarted}, crash {crashed}, {start:?}"),
                    move || {
                        restart_then_crash(start, restarted, crashed);
                    },
                )
            })
        }));
    } else {
        restart_then_crash(Start::StateFile, 0, 1);
    }
}

/// The same with the same command line on every start and no state file.
#[test]
fn restart_then_crash_recovers_without_state_file() {
    restart_then_crash(Start::Plain, 0, 1);
}

fn restart_then_crash(start: Start, restarted: usize, victim: usize) {
    let _one = serial();
    let name = &format!("restart-{restarted}-then-crash-{victim}-{start:?}").to_lowercase();
    let mut c = Cluster::new(name, 3, start);
    let load = Load::start(&skewed(&c), 4, "acme");
    std::thread::sleep(3 * SEC);
    c.kill(restarted);
    std::thread::sleep(Duration::from_millis(500));
    c.start(restarted);
    c.wait_healthy(restarted);
    let restarted_at = load.elapsed();
    std::thread::sleep(4 * SEC);
    // The victim dies; its clients are gone, the others' go on.
    let inc0 = c.incarnation(restarted);
    c.kill(victim);
    let crashed = load.elapsed();
    std::thread::sleep(8 * SEC);
    let shares = c.total_share();
    let statuses = c.statuses();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 3);
    // The demand left (the crashed node's clients are gone), up to the limit.
    let bound = Duration::from_millis(LEASE_MS * 3);
    let floor = floor_without(&[0.5, 0.3, 0.2], victim);
    let back = r.recovered_at(crashed, r.end, floor);
    let (least, least_at) = r.min_window(SEC, crashed + bound, r.end);
    report(
        name,
        &[
            ("incarnation_after_restart", format!("{inc0:?}")),
            ("max_1s_window", most.to_string()),
            ("restart_at", format!("{restarted_at:.1?}")),
            (
                "recovered_after_crash",
                format!("{:?}", back.map(|b| b.saturating_sub(crashed))),
            ),
            ("least_1s_window_after_bound", least.to_string()),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        back.is_some_and(|b| b <= crashed + bound),
        "{name}: not back at {floor}/s within {bound:?} of the crash \
         (least window {least} at {least_at:?}); status:\n{}",
        statuses
    );
    assert_whole(name, shares, "both survivors answer");
}

/// A rolling restart as Kubernetes does it: each node in turn gets SIGTERM (it hands its
/// shares to its peers and exits), starts again with the same command line (no state file,
/// as a pod without a volume), and once it is ready (out of its quarantine) the next one
/// goes. No 1 s window may admit more than `L + burst`, and the cluster must serve 90 % of
/// its limit again within three leases of the last start.
#[test]
fn a_rolling_restart_by_sigterm_keeps_the_limit() {
    let _one = serial();
    let name = "rolling-restart";
    let mut c = Cluster::new(name, 3, Start::Plain);
    let load = Load::start(&skewed(&c), 4, "acme");
    std::thread::sleep(3 * SEC);
    let began = load.elapsed();
    for i in 0..3 {
        c.terminate(i);
        c.start(i);
        c.wait_ready(i);
    }
    let last = load.elapsed();
    std::thread::sleep(4 * SEC);
    let shares = c.total_share();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 3);
    let bound = Duration::from_millis(LEASE_MS * 3);
    let back = r.recovered_at(last, r.end, LIMIT * 9 / 10);
    let (least, least_at) = r.min_window(SEC, began, last);
    report(
        name,
        &[
            ("max_1s_window", most.to_string()),
            (
                "least_1s_window_during_restarts",
                format!("{least} at {least_at:.1?}"),
            ),
            (
                "serving_limit_after_last_ready",
                format!("{:?}", back.map(|b| b.saturating_sub(last))),
            ),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        back.is_some_and(|b| b <= last + bound),
        "{name}: not back at 90 % of the limit within {bound:?} of the last start"
    );
    assert_whole(name, shares, "every node answers");
}

/// A rolling upgrade onto the next wire version: 5 nodes of the previous build (emulated by
/// `--wire-version`, which makes a node speak and accept only that version, as the old
/// build does) each in turn get SIGTERM and start again as this build, the next once it is
/// ready. Each link speaks the lower version until both ends are new, so the cluster never
/// splits into an old and a new part: no 1 s window admits more than `L + burst`, and the
/// over-throttling while rolling stays within 5 %. Demand is 1.6 L spread evenly, so any four
/// nodes ask for more than `L`. The long version rolls back to the old build as well.
#[test]
fn a_rolling_upgrade_onto_the_next_wire_version_keeps_the_limit() {
    let _one = serial();
    let name = "rolling-upgrade";
    let version = sluice_coord::wire::MIN_VERSION.to_string();
    let old = ["--wire-version", version.as_str()];
    // State files: the first start holds the initial shares, so the cluster is at its limit
    // before the roll begins; every restart holds nothing until its quarantine is over.
    let mut c = Cluster::with_args(name, 5, Start::StateFile, &harness::rule_yaml(), &[], &old);
    for i in 0..5 {
        c.wait_ready(i);
    }
    let l = LIMIT as f64;
    let rates: Vec<_> = (0..5).map(|i| (i, c.addr(i), 1.6 * l / 5.0)).collect();
    let load = Load::start(&rates, 4, "acme");
    std::thread::sleep(3 * SEC);
    let settled = load.elapsed();
    let mut refused = 0;
    let mut rolls = vec![("upgrade", Vec::new(), sluice_coord::wire::VERSION)];
    if long() {
        rolls.push(("rollback", old.to_vec(), sluice_coord::wire::MIN_VERSION));
    }
    let mut fields = Vec::new();
    let mut last = load.elapsed();
    for (roll, args, version) in &rolls {
        let began = load.elapsed();
        for i in 0..5 {
            refused += c
                .status(i)
                .map_or(0, |v| v["peer"]["rejected_version"].as_u64().unwrap_or(0));
            c.terminate(i);
            c.set_args(i, args);
            c.start(i);
            c.wait_ready(i);
        }
        last = load.elapsed();
        fields.push((*roll, began, last, *version));
        // Every link comes to speak the version both ends now have.
        let speaks = |i: usize| {
            let v = c.status(i).unwrap_or_default();
            v["members"].as_array().is_some_and(|m| {
                m.iter()
                    .all(|m| m["wire_version"].as_u64() == Some(u64::from(*version)))
            })
        };
        let deadline = std::time::Instant::now() + 5 * SEC;
        while !(0..5).all(speaks) {
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: after the {roll}, not every link speaks {version}:\n{}",
                c.statuses()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::sleep(3 * SEC);
    let shares = c.total_share();
    refused += (0..5)
        .filter_map(|i| c.status(i)?["peer"]["rejected_version"].as_u64())
        .sum::<u64>();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 5);
    let mut line = vec![
        ("max_1s_window".to_owned(), most.to_string()),
        (
            "over_throttling_before".to_owned(),
            format!("{:.1}%", r.over_throttling(SEC, settled, l) * 100.0),
        ),
    ];
    let mut worst = 0.0f64;
    for &(roll, began, ended, _) in &fields {
        let over = r.over_throttling(began, ended, l);
        worst = worst.max(over);
        let (least, at) = r.min_window(SEC, began, ended);
        line.push((format!("{roll}_took"), format!("{:.1?}", ended - began)));
        line.push((
            format!("{roll}_over_throttling"),
            format!("{:.1}%", over * 100.0),
        ));
        line.push((
            format!("{roll}_least_1s_window"),
            format!("{least} at {at:.1?}"),
        ));
    }
    let back = r.recovered_at(last, r.end, LIMIT * 9 / 10);
    line.push((
        "serving_limit_after_last_ready".to_owned(),
        format!("{:?}", back.map(|b| b.saturating_sub(last))),
    ));
    // Every process's count, the stopped ones' read before they stopped.
    line.push(("rejected_version".to_owned(), refused.to_string()));
    line.push(("shares_at_end".to_owned(), format!("{shares:?}")));
    let line: Vec<(&str, String)> = line.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    report(name, &line);
    assert!(
        worst <= 0.05,
        "{name}: over-throttling {:.1}% while rolling (bound 5 %)",
        worst * 100.0
    );
    assert_whole(name, shares, "every node answers");
}

/// Max-min, the default fairness of cluster rules: node 0 takes a flood of its clients (2 L)
/// and a lease client there claims `wants: 1e308`; nodes 1 and 2 ask 0.2 L each. After the
/// law converged (3 s), each of them admits at least 95 % of its demand in every 1 s window:
/// another node's demand, real or claimed, never pushes it below its max-min fair share.
/// The long version runs the same flood under `fairness: throttled` and `ratio` and reports
/// each one's over-throttling, the reason max-min is the default (docs/BENCHMARKS.md).
#[test]
fn a_flood_at_one_node_does_not_starve_the_others() {
    let measures: &[&str] = if long() {
        &["max-min", "throttled", "ratio"]
    } else {
        &["max-min"]
    };
    for &fairness in measures {
        let (l1, l2) = flood_one_node(fairness);
        if fairness == "max-min" {
            let floor = (0.95 * 0.2 * LIMIT as f64) as usize;
            assert!(
                l1 >= floor && l2 >= floor,
                "flood-one-node: nodes 1 and 2 admitted as little as {l1} and {l2} per second \
                 of the {} they ask",
                0.2 * LIMIT as f64
            );
        }
    }
}

/// One run of the flood under `fairness`; reports it and returns the least nodes 1 and 2
/// admitted in a 1 s window after the law converged.
fn flood_one_node(fairness: &str) -> (usize, usize) {
    let _one = serial();
    let name = "flood-one-node";
    let yaml = format!("{}      fairness: {fairness}\n", harness::rule_yaml());
    let c = Cluster::with_rules(name, 3, Start::StateFile, &yaml, &[]);
    let l = LIMIT as f64;
    let lease = r#"{"domain":"api","descriptor":{"entries":[{"key":"tenant","value":"acme"}]},"client_id":"greedy","wants":1e308}"#;
    let claim = || {
        let r = harness::http(c.addr(0), "POST", "/v1/lease", lease);
        assert!(r.as_ref().is_some_and(|(s, _)| *s == 200), "lease: {r:?}");
    };
    claim();
    let rates = [
        (0, c.addr(0), 2.0 * l),
        (1, c.addr(1), 0.2 * l),
        (2, c.addr(2), 0.2 * l),
    ];
    let load = Load::start(&rates, 4, "acme");
    for _ in 0..4 {
        std::thread::sleep(2 * SEC);
        claim();
    }
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 3);
    let admitted = |node: usize, s: u32| {
        let (from, to) = (s * SEC, (s + 1) * SEC);
        r.answers
            .iter()
            .filter(|a| a.node == node && a.ok && a.sent >= from && a.at < to)
            .count()
    };
    let least = |node: usize| (3..7).map(|s| admitted(node, s)).min().unwrap_or(0);
    let (l1, l2) = (least(1), least(2));
    // Over-throttling (seed 000 §6) of the whole cluster, and against each node's max-min
    // fair share (0.6 L, 0.2 L, 0.2 L): what the nodes lost below it.
    let cluster = r.over_throttling(3 * SEC, 7 * SEC, l);
    let fair = [0.6 * l, 0.2 * l, 0.2 * l];
    let lost: f64 = (3..7)
        .flat_map(|s| (0..3).map(move |n| (n, s)))
        .map(|(n, s)| (fair[n] - admitted(n, s) as f64).max(0.0))
        .sum();
    let below_fair = lost / (4.0 * l);
    report(
        name,
        &[
            ("fairness", fairness.to_owned()),
            ("max_1s_window", most.to_string()),
            ("least_1s_admitted_node_1", l1.to_string()),
            ("least_1s_admitted_node_2", l2.to_string()),
            ("over_throttling", format!("{:.1}%", cluster * 100.0)),
            ("below_max_min_share", format!("{:.1}%", below_fair * 100.0)),
        ],
    );
    (l1, l2)
}

/// A node frozen with SIGSTOP for twice its lease while its clients' requests queue up, then
/// SIGCONT. The others fence it after `lease·(1+ρ)²` and mint its share again; the frozen
/// node, woken, must decide its queued requests on the lease it no longer holds: the
/// fallback (none). It used to admit them all on its old share, on top of what the others
/// admitted with it.
#[test]
fn a_frozen_node_admits_nothing_on_its_expired_lease() {
    let _one = serial();
    let name = "sigstop";
    let c = Cluster::new(name, 3, Start::StateFile);
    let l = LIMIT as f64;
    // Node 0 holds most of the limit (its demand is most of it), the others keep the rest busy.
    let rates = [
        (0, c.addr(0), 0.7 * l),
        (1, c.addr(1), 0.3 * l),
        (2, c.addr(2), 0.3 * l),
    ];
    let load = Load::start(&rates, 16, "acme");
    std::thread::sleep(4 * SEC);
    let share0 = c.share(0);
    c.signal(0, "STOP");
    let stopped = load.elapsed();
    std::thread::sleep(Duration::from_millis(LEASE_MS * 2));
    c.signal(0, "CONT");
    let resumed = load.elapsed();
    std::thread::sleep(4 * SEC);
    let r = load.finish();
    // What node 0 answered in the first 100 ms after it woke: its queued requests.
    let woke = resumed + Duration::from_millis(100);
    let queued: Vec<_> = r
        .answers
        .iter()
        .filter(|a| a.node == 0 && a.at >= resumed && a.at < woke)
        .collect();
    let queued_ok = queued.iter().filter(|a| a.ok).count();
    let most = assert_no_overshoot(name, &r, 3);
    report(
        name,
        &[
            ("share_before", format!("{share0:?}")),
            ("stopped_at", format!("{stopped:.1?}")),
            ("queued_answers", queued.len().to_string()),
            ("queued_admitted", queued_ok.to_string()),
            ("max_1s_window", most.to_string()),
        ],
    );
    assert!(
        queued.len() >= 8,
        "{name}: only {} requests were queued at the frozen node",
        queued.len()
    );
    assert_eq!(
        queued_ok,
        0,
        "{name}: the frozen node admitted {queued_ok} of {} queued requests on its expired lease",
        queued.len()
    );
}

/// Three nodes started with the same command line and no state file: each takes its
/// incarnation from the clock, holds nothing it cannot prove and starts in quarantine, and
/// the capacity audit mints the whole limit once a quorum is out of it. The cluster must
/// serve its limit within the quarantine and a second, and a node restarted with the same
/// command line comes back as a larger incarnation.
#[test]
fn a_cluster_without_state_files_starts_and_restarts_safely() {
    let _one = serial();
    let name = "plain-start";
    let mut c = Cluster::new(name, 3, Start::Plain);
    let inc = c.incarnation(2).unwrap();
    let load = Load::start(&skewed(&c), 4, "acme");
    std::thread::sleep(6 * SEC);
    c.kill(2);
    c.start(2);
    c.wait_healthy(2);
    let restarted = load.elapsed();
    let inc_after = c.incarnation(2).unwrap();
    std::thread::sleep(5 * SEC);
    let shares = c.total_share();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 3);
    let served = r.recovered_at(Duration::ZERO, restarted, LIMIT * 9 / 10);
    report(
        name,
        &[
            ("incarnations", format!("{inc} -> {inc_after}")),
            ("serving_limit_from", format!("{served:?}")),
            ("max_1s_window", most.to_string()),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        inc > 1 && inc_after > inc,
        "incarnations {inc} -> {inc_after}"
    );
    assert!(
        served.is_some_and(|s| s <= Duration::from_millis(LEASE_MS * 3) + 2 * SEC),
        "{name}: the fresh cluster served 90 % of its limit only from {served:?}"
    );
    assert_whole(name, shares, "every node answers");
}

/// An operator adds `--state-file` to a node that ran without one: its new file starts it at
/// incarnation 1, below the clock incarnation its peers fenced (A3 broken). The node must hear
/// their dead floor above it, start again above that (counted in `incarnation_conflicts`),
/// get a lease, and serve its clients again within three leases of its start; no 1 s window
/// over `L + burst`. (It used to creep up one incarnation per two leases, ignored by every
/// peer: its clients refused for good.)
#[test]
fn a_state_file_added_later_is_heard_again() {
    let _one = serial();
    let name = "state-file-added";
    let mut c = Cluster::new(name, 3, Start::Plain);
    let clock_inc = c.incarnation(2).unwrap();
    let load = Load::start(&skewed(&c), 4, "acme");
    std::thread::sleep(3 * SEC);
    c.kill(2);
    // Fenced by the others: lease·(1+ρ)² and a few cycles.
    std::thread::sleep(2 * SEC);
    let file = c.dir.join("node2.added.incarnation");
    c.set_args(2, &["--state-file", file.to_str().unwrap()]);
    c.start(2);
    c.wait_healthy(2);
    let restarted = load.elapsed();
    std::thread::sleep(5 * SEC);
    let status = c.status(2).unwrap();
    let inc_after = status["incarnation"].as_u64().unwrap_or(0);
    let conflicts = status["incarnation_conflicts"].as_u64().unwrap_or(0);
    let lease = status["lease"].as_str().unwrap_or("").to_owned();
    let recorded: u64 = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let shares = c.total_share();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 3);
    // Node 2's own clients (0.2 · 1.6 L = 320/s, below its max-min share): served again.
    let bound = Duration::from_millis(LEASE_MS * 3);
    let node2 = |from: Duration, to: Duration| {
        r.answers
            .iter()
            .filter(|a| a.node == 2 && a.ok && a.at >= from && a.at < to)
            .count()
    };
    let served_last_2s = node2(restarted + 3 * SEC, restarted + 5 * SEC);
    report(
        name,
        &[
            ("incarnations", format!("{clock_inc} -> 1 -> {inc_after}")),
            ("recorded_in_state_file", recorded.to_string()),
            ("incarnation_conflicts", conflicts.to_string()),
            ("lease", lease.clone()),
            ("node_2_admitted_last_2s", served_last_2s.to_string()),
            ("max_1s_window", most.to_string()),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        inc_after > clock_inc,
        "{name}: incarnations {clock_inc} -> {inc_after}"
    );
    assert_eq!(
        recorded, inc_after,
        "{name}: the state file records the new incarnation"
    );
    assert_eq!(conflicts, 1, "{name}: counted");
    assert_eq!(lease, "valid", "{name}: node 2 holds a lease");
    assert!(
        served_last_2s >= 500,
        "{name}: node 2 admitted {served_last_2s} of its clients' 640 in the 2 s from \
         {:?} (bound {bound:?} after its start)",
        restarted + 3 * SEC
    );
    assert_whole(name, shares, "every node answers");
}

/// A busy tenant key next to a flood of new `remote_address` keys (a new key at every
/// request) on a per-address cluster rule. The busy key must keep its fair admission (its
/// demand is above the limit: the whole limit) during and after the flood, no datagram may
/// be dropped, and no node may restart itself.
///
/// The short version floods 1,200 new keys/s across the cluster: the test command runs debug
/// daemons, and at 2,100/s on two cores the busy key's own client fell behind its schedule
/// (1,489 of 1,600 sent in a second) and the per-node arrivals swung faster than the
/// shares follow demand. The long one (`scripts/chaos.sh`, release) floods 5,000/s.
#[test]
fn a_key_flood_leaves_a_busy_key_alone() {
    if long() {
        // 1,000,000 keys at 5,000 new keys/s.
        key_flood("key-flood-long", 200, 5_000.0 / 3.0);
    } else {
        key_flood("key-flood", 6, 400.0);
    }
}

fn key_flood(name: &str, secs: u64, per_node: f64) {
    let _one = serial();
    let yaml = harness::address_rule_yaml("second", 20);
    let c = Cluster::with_rules(name, 3, Start::StateFile, &yaml, &[]);
    let incs: Vec<_> = (0..3).map(|i| c.incarnation(i)).collect();
    let busy = Load::start(&skewed(&c), 4, "acme");
    std::thread::sleep(3 * SEC);
    let flood_from = busy.elapsed();
    let rates: Vec<_> = (0..3).map(|i| (i, c.addr(i), per_node)).collect();
    let flood = Load::start_with(&rates, 4, harness::address_body);
    std::thread::sleep(SEC * secs as u32);
    let flooded = flood.finish();
    let flood_to = busy.elapsed();
    let rss: Vec<_> = (0..3).map(|i| c.rss(i).unwrap_or(0) / 1024).collect();
    std::thread::sleep(4 * SEC);
    let r = busy.finish();
    let drops: u64 = (0..3)
        .filter_map(|i| harness::udp_drops(c.peer_port(i)))
        .sum();
    let incs_after: Vec<_> = (0..3).map(|i| c.incarnation(i)).collect();
    let keys = flooded.answers.len();
    let floor = LIMIT * 95 / 100;
    let (least_during, at) = r.min_window(SEC, flood_from, flood_to);
    let (least_after, at_after) = r.min_window(SEC, flood_to, r.end);
    let most = assert_no_overshoot(name, &r, 3);
    report(
        name,
        &[
            ("flood_keys", keys.to_string()),
            ("busy_least_1s_during", least_during.to_string()),
            ("least_window", r.sent_in(at, SEC)),
            ("busy_least_1s_after", least_after.to_string()),
            ("least_window_after", r.sent_in(at_after, SEC)),
            ("busy_max_1s", most.to_string()),
            ("udp_drops", drops.to_string()),
            ("rss_kib", format!("{rss:?}")),
            ("incarnations", format!("{incs:?} -> {incs_after:?}")),
        ],
    );
    assert_eq!(incs, incs_after, "{name}: a node restarted itself");
    assert_eq!(
        drops, 0,
        "{name}: the kernel dropped {drops} peer datagrams"
    );
    assert_window_floor(name, &r, (least_during, at), floor, "during the flood");
    assert_window_floor(name, &r, (least_after, at_after), floor, "after the flood");
}

/// Demand per node for `n` nodes: 1.6 L in all, node `i` asking twice what node `i + 1` does.
fn skewed_n(c: &Cluster) -> Vec<(usize, std::net::SocketAddr, f64)> {
    let n = c.len();
    let weights: Vec<f64> = (0..n).map(|i| 2f64.powi((n - 1 - i) as i32)).collect();
    let total: f64 = weights.iter().sum();
    (0..n)
        .filter(|&i| c.running(i))
        .map(|i| (i, c.addr(i), 1.6 * LIMIT as f64 * weights[i] / total))
        .collect()
}

/// Four nodes cut 2|2 for three leases, healed, and three seconds later node 1 crashes
/// (every node in the long run). The side with node 0 is the quorum and holds the limit,
/// the other its fallback (never above L in all); the cluster must be back at its whole limit
/// within the bound after the crash.
#[test]
fn a_crash_after_a_healed_partition_recovers() {
    let targets: &[usize] = if long() { &[0, 1, 2, 3] } else { &[1] };
    every(targets.iter().map(|&crashed| {
        (format!("crash {crashed}"), move || {
            partition_then_crash(crashed)
        })
    }));
}

/// Runs every case, even after one failed, and fails if any did (the long suite's orders
/// each say something).
fn every<F: FnOnce() + std::panic::UnwindSafe>(cases: impl Iterator<Item = (String, F)>) {
    let failed: Vec<String> = cases
        .filter_map(|(what, case)| std::panic::catch_unwind(case).is_err().then_some(what))
        .collect();
    assert!(failed.is_empty(), "failed: {failed:?}");
}

fn partition_then_crash(victim: usize) {
    let _one = serial();
    let name = &format!("partition-then-crash-{victim}");
    let Some(cuts) = harness::Cuts::new() else {
        return;
    };
    let mut c = Cluster::new(name, 4, Start::StateFile);
    let load = Load::start(&skewed_n(&c), 4, "acme");
    std::thread::sleep(3 * SEC);
    cuts.cut(&c, &[0, 1], &[2, 3]);
    let cut_at = load.elapsed();
    std::thread::sleep(Duration::from_millis(LEASE_MS * 3));
    cuts.heal();
    let healed = load.elapsed();
    std::thread::sleep(3 * SEC);
    c.kill(victim);
    let crashed = load.elapsed();
    std::thread::sleep(8 * SEC);
    let shares = c.total_share();
    let statuses = c.statuses();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 4);
    let bound = Duration::from_millis(LEASE_MS * 3);
    let floor = floor_without(&[8.0 / 15.0, 4.0 / 15.0, 2.0 / 15.0, 1.0 / 15.0], victim);
    let back = r.recovered_at(crashed, r.end, floor);
    let during =
        r.admitted_in(cut_at + 2 * SEC, healed) as f64 / (healed - cut_at - 2 * SEC).as_secs_f64();
    report(
        name,
        &[
            ("admitted_per_s_during_cut", format!("{during:.0}")),
            ("max_1s_window", most.to_string()),
            (
                "recovered_after_crash",
                format!("{:?}", back.map(|b| b.saturating_sub(crashed))),
            ),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        back.is_some_and(|b| b <= crashed + bound),
        "{name}: not back at {floor}/s within {bound:?} of the crash; status:\n{}",
        statuses
    );
    assert_whole(name, shares, "every survivor answers");
}

/// Node 0 cut off from every peer for three leases: the others take its share over and the
/// cluster admits at most L + burst in every window throughout; after the heal node 0 earns
/// a share again and the cluster is back at its limit.
#[test]
fn a_node_cut_off_and_healed() {
    let _one = serial();
    cut_off_and_healed("one-node-cut", &[]);
}

/// Node 0 (clock rate `rates[0]`, node 1 at `rates[1]`) cut off from every peer for
/// three leases, then healed: at most L + burst in every 1 s window, back at the limit within
/// three leases of the heal, the shares whole.
fn cut_off_and_healed(name: &str, rates: &[f64]) {
    let Some(cuts) = harness::Cuts::new() else {
        return;
    };
    let c = Cluster::with_rules(name, 3, Start::StateFile, &harness::rule_yaml(), rates);
    let load = Load::start(&skewed(&c), 4, "acme");
    std::thread::sleep(3 * SEC);
    cuts.cut(&c, &[0], &[1, 2]);
    std::thread::sleep(Duration::from_millis(LEASE_MS * 3));
    cuts.heal();
    let healed = load.elapsed();
    std::thread::sleep(6 * SEC);
    let shares = c.total_share();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 3);
    let back = r.recovered_at(healed, r.end, LIMIT * 9 / 10);
    report(
        name,
        &[
            ("max_1s_window", most.to_string()),
            (
                "recovered_after_heal",
                format!("{:?}", back.map(|b| b.saturating_sub(healed))),
            ),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        back.is_some_and(|b| b <= healed + Duration::from_millis(LEASE_MS * 3)),
        "{name}: not back at the limit within three leases of the heal"
    );
    assert_whole(name, shares, "every node answers");
}

/// One-way loss: 40 % of node 0's datagrams to node 1 lost, 20 % back, for five seconds.
#[test]
fn one_way_loss_keeps_the_limit() {
    let _one = serial();
    let name = "one-way-loss";
    let Some(cuts) = harness::Cuts::new() else {
        return;
    };
    let c = Cluster::new(name, 3, Start::StateFile);
    let load = Load::start(&skewed(&c), 4, "acme");
    std::thread::sleep(3 * SEC);
    cuts.lose(&c, 0, 1, 0.4);
    cuts.lose(&c, 1, 0, 0.2);
    cuts.lose(&c, 2, 0, 0.2);
    let from = load.elapsed();
    std::thread::sleep(5 * SEC);
    cuts.heal();
    let healed = load.elapsed();
    std::thread::sleep(4 * SEC);
    let shares = c.total_share();
    let r = load.finish();
    let most = assert_no_overshoot(name, &r, 3);
    let lossy = r.over_throttling(from, healed, LIMIT as f64);
    let back = r.recovered_at(healed, r.end, LIMIT * 9 / 10);
    report(
        name,
        &[
            ("max_1s_window", most.to_string()),
            ("over_throttling_lossy", format!("{:.1}%", lossy * 100.0)),
            (
                "recovered_after_heal",
                format!("{:?}", back.map(|b| b.saturating_sub(healed))),
            ),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        back.is_some(),
        "{name}: not back at the limit after the loss ended"
    );
    assert_whole(name, shares, "every node answers");
}

/// Clocks at the edge of the drift bound: node 0 runs slow and node 1 fast, both by 0.09 %
/// (the daemon assumes ρ = 0.1 %), the worst case for the lease (the holder's lease lasts
/// longest in real time while a voter's wait is shortest). Node 0 is cut off for three
/// leases: it must stop enforcing its share before the others fence it and mint it again,
/// so no 1 s window admits more than L + burst, and the cluster is back at its limit after
/// the heal.
#[test]
fn skewed_clocks_keep_the_limit_through_a_cut() {
    let _one = serial();
    if std::process::Command::new("faketime")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("chaos: faketime is not installed (scripts/chaos.sh installs it): skipped");
        return;
    }
    cut_off_and_healed("skewed-clocks", &[0.9991, 1.0009]);
}
