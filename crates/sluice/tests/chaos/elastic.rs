//! Elastic clusters on the real stack (docs/PROTOCOL.md, "Membership"): nodes that nobody
//! configured join a running cluster (found through a seed, a peers file or DNS) and leave
//! it by SIGTERM, as an autoscaled Deployment's pods do, under skewed load.

use std::time::{Duration, Instant};

use crate::harness::{
    BURST, CYCLE_MS, Cluster, Find, LEASE_MS, LIMIT, Load, Record, Start, report,
};
use crate::{SEC, assert_no_overshoot, serial};

/// What a joiner must reach within `lease + 3 cycles` of a change.
fn bound() -> Duration {
    Duration::from_millis(LEASE_MS + 3 * CYCLE_MS)
}

/// `rate` requests per second to node `id`, for tenant `acme`, timed from `origin`.
fn load(origin: Instant, c: &Cluster, id: usize, rate: f64) -> Load {
    let body = crate::harness::body("acme");
    Load::start_from(origin, &[(id, c.addr(id), rate)], 1, move |_| body.clone())
}

/// Three voters, ready, under skewed demand (0.3, 0.1 and 0.05 L), timed from the returned
/// origin.
fn voters_under_load(name: &str) -> (Cluster, Instant, Vec<Load>) {
    let c = Cluster::new(name, 3, Start::Plain);
    for i in 0..3 {
        c.wait_ready(i);
    }
    let origin = Instant::now();
    let loads = vec![
        load(origin, &c, 0, 0.3 * LIMIT as f64),
        load(origin, &c, 1, 0.1 * LIMIT as f64),
        load(origin, &c, 2, 0.05 * LIMIT as f64),
    ];
    (c, origin, loads)
}

/// Refused answers within `[from, to)`, at node `node` if given.
fn refused(r: &Record, node: Option<usize>, from: Duration, to: Duration) -> Vec<Duration> {
    r.answers
        .iter()
        .filter(|a| !a.ok && a.sent >= from && a.at < to && node.is_none_or(|n| a.node == n))
        .map(|a| a.sent)
        .collect()
}

/// 3 → 7 → 3 nodes under skewed demand (0.3, 0.1, 0.05 L at the founding nodes, 0.1 L at
/// each joiner: 0.85 L with seven). Joiners find the cluster through a seed, a peers file
/// and DNS; they leave by SIGTERM, their clients gone first (as a load balancer drains a
/// pod). No 1 s window may admit more than `L + burst`; each joiner admits all it is asked
/// within `lease + 3 cycles` of joining; the shares add up to exactly `L` within `lease + 3
/// cycles` of each change; and, demand being under 90 % of `L`, no request is refused
/// outside the first second after a change.
#[test]
fn scale_out_to_seven_and_back_in_to_three() {
    let _one = serial();
    let name = "scale-3-7-3";
    let (mut c, origin, mut loads) = voters_under_load(name);
    std::thread::sleep(2 * SEC);
    let steady = origin.elapsed();
    // Each change: when it happened, and Σ shares `lease + 3 cycles` later.
    let mut changes: Vec<(String, Duration, Option<f64>)> = Vec::new();
    let mut joined = Vec::new();
    for find in [Find::Seed(0), Find::File, Find::Dns(1), Find::Seed(2)] {
        let id = c.add_joiner(find);
        let at = origin.elapsed();
        loads.push(load(origin, &c, id, 0.1 * LIMIT as f64));
        std::thread::sleep(bound());
        changes.push((format!("join {id} ({find:?})"), at, c.total_share()));
        joined.push((id, at));
        std::thread::sleep(3 * SEC - bound());
    }
    let seven = c.statuses();
    let mut records: Vec<Record> = Vec::new();
    for &(id, _) in joined.iter().rev() {
        // Its clients go first (a draining pod), then the pod.
        let l = loads.pop().expect("a joiner's load");
        records.push(l.finish());
        let at = origin.elapsed();
        c.terminate(id);
        std::thread::sleep(bound());
        changes.push((format!("leave {id}"), at, c.total_share()));
        std::thread::sleep(3 * SEC - bound());
    }
    std::thread::sleep(SEC);
    let r = loads
        .into_iter()
        .map(Load::finish)
        .chain(records)
        .reduce(Record::merge)
        .expect("loads");
    let most = assert_no_overshoot(name, &r, 7);
    // Joining: every refusal at a joiner comes within `lease + 3 cycles` of its start (up to
    // the next change; after it, the check below covers every node).
    let mut joiner_ready = Vec::new();
    for &(id, at) in &joined {
        let next = changes
            .iter()
            .map(|c| c.1)
            .find(|&t| t > at)
            .unwrap_or(r.end);
        let late = refused(&r, Some(id), at, next);
        let last = late.last().map_or(Duration::ZERO, |t| t.saturating_sub(at));
        joiner_ready.push(format!("{last:.2?}"));
        assert!(
            last <= bound(),
            "{name}: joiner {id} refused a request {last:?} after it joined (bound {:?}): {late:?}",
            bound()
        );
    }
    // Outside the first second after each change, nothing is refused (demand < 0.9 L); a
    // joiner has `lease + 3 cycles` (checked above).
    let mut quiet: Vec<(Duration, Duration)> = Vec::new();
    let mut from = steady;
    for &(_, at, _) in &changes {
        quiet.push((from, at));
        from = at + SEC;
    }
    quiet.push((from, r.end));
    let outside: Vec<(usize, Duration)> = r
        .answers
        .iter()
        .filter(|a| !a.ok && a.sent >= steady)
        .filter(|a| quiet.iter().any(|&(f, t)| a.sent >= f && a.at < t))
        .filter(|a| {
            !joined
                .iter()
                .any(|&(id, at)| a.node == id && a.sent < at + bound())
        })
        .map(|a| (a.node, a.sent))
        .collect();
    let asked = r.answers.iter().filter(|a| a.sent >= steady).count();
    report(
        name,
        &[
            ("max_1s_window", most.to_string()),
            ("bound", (LIMIT + BURST + 7).to_string()),
            ("joiner_last_refusal_after_join", joiner_ready.join(",")),
            (
                "shares_after_each_change",
                changes
                    .iter()
                    .map(|(_, _, s)| format!("{s:.4?}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            (
                "refused_outside_first_second",
                format!("{} of {asked}", outside.len()),
            ),
        ],
    );
    for (what, _, shares) in &changes {
        let s = shares.unwrap_or_else(|| panic!("{name}: a node did not answer after {what}"));
        assert!(
            (0.999..=1.0 + 1e-9).contains(&s),
            "{name}: shares add up to {s} L {:?} after {what}",
            bound()
        );
    }
    assert!(
        outside.is_empty(),
        "{name}: {} requests refused outside the first second after a change: {:?}\nwith seven nodes:\n{seven}",
        outside.len(),
        &outside[..outside.len().min(20)]
    );
}

/// A join, a leave and a crash at the same time, on real processes: three voters and two
/// joiners under skewed demand (0.3, 0.1, 0.05 L and 0.1 L each); then at once a third
/// joiner starts (found through a seed), one joiner leaves by SIGTERM and the other is
/// killed (kill -9), their clients gone first. No 1 s window over `L + burst`; the newcomer
/// refuses nothing after `lease + 3 cycles`; with demand under 90 % of `L` nothing else is
/// refused after the first second; and once the crashed joiner is fenced and audited the
/// live nodes' shares add up to exactly `L`.
#[test]
fn a_join_a_leave_and_a_crash_at_once() {
    let _one = serial();
    let name = "join-leave-crash";
    let (mut c, origin, mut loads) = voters_under_load(name);
    let crashing = c.add_joiner(Find::Seed(0));
    let crashing_load = load(origin, &c, crashing, 0.1 * LIMIT as f64);
    let leaving = c.add_joiner(Find::Seed(1));
    let leaving_load = load(origin, &c, leaving, 0.1 * LIMIT as f64);
    std::thread::sleep(4 * SEC);
    // At once: the newcomer starts, the leaver gets SIGTERM, the crashing one kill -9.
    let gone = [crashing_load.finish(), leaving_load.finish()];
    let at = origin.elapsed();
    let newcomer = c.add_joiner(Find::Seed(2));
    loads.push(load(origin, &c, newcomer, 0.1 * LIMIT as f64));
    c.terminate(leaving);
    c.kill(crashing);
    // Fenced after lease·(1+ρ)², then audited: well within four seconds.
    std::thread::sleep(4 * SEC);
    let shares = c.total_share();
    let statuses = c.statuses();
    std::thread::sleep(SEC);
    let r = loads
        .into_iter()
        .map(Load::finish)
        .chain(gone)
        .reduce(Record::merge)
        .expect("loads");
    let most = assert_no_overshoot(name, &r, 6);
    let newcomer_late = refused(&r, Some(newcomer), at + bound(), r.end);
    let others_late: Vec<Duration> = [0, 1, 2]
        .iter()
        .flat_map(|&i| refused(&r, Some(i), at + SEC, r.end))
        .collect();
    let before = refused(&r, None, Duration::from_secs(1), at);
    report(
        name,
        &[
            ("max_1s_window", most.to_string()),
            ("bound", (LIMIT + BURST + 6).to_string()),
            ("refused_before_the_changes", before.len().to_string()),
            (
                "newcomer_refused_after_bound",
                newcomer_late.len().to_string(),
            ),
            ("voters_refused_after_1s", others_late.len().to_string()),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        newcomer_late.is_empty(),
        "{name}: the newcomer refused {} requests more than {:?} after it started: {:?}",
        newcomer_late.len(),
        bound(),
        &newcomer_late[..newcomer_late.len().min(10)]
    );
    assert!(
        others_late.is_empty(),
        "{name}: the voters refused {} requests more than 1 s after the changes: {:?}\n{statuses}",
        others_late.len(),
        &others_late[..others_late.len().min(10)]
    );
    let s = shares.unwrap_or_else(|| panic!("{name}: a live node did not answer"));
    assert!(
        (0.999..=1.0 + 1e-9).contains(&s),
        "{name}: the live nodes' shares add up to {s} L\n{statuses}"
    );
}

/// The dead floors node `i` holds for joiners (ids above the voters' 0-2): a voter's own
/// earlier incarnations are members' floors, kept for ever.
fn joiner_floors(c: &Cluster, i: usize) -> Vec<u64> {
    c.status(i)
        .and_then(|s| s["dead"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|f| f["node"].as_u64())
        .filter(|&n| n > 2)
        .collect()
}

/// Churn of joiners' ids on real processes: six joiners with random ids (no `--node-id`),
/// one after the other, each under load for two seconds, then gone (SIGTERM or kill -9, in
/// turn), as pods of an autoscaled Deployment are. Every node keeps a departed joiner's dead
/// floor for `--forget-departed` (15 s here), so the floors stay bounded by the departures
/// of that long: after it, the voters hold none of the joiners' (`/v1/cluster` `dead`, `/metrics`
/// `sluice_cluster_dead_floors`), no 1 s window admitted more than `L + burst`, and the
/// shares add up to exactly `L`.
#[test]
fn churn_of_random_ids_leaves_no_dead_floors_behind() {
    let _one = serial();
    let name = "churn-random-ids";
    let forget = Duration::from_secs(15);
    let c = Cluster::with_args(
        name,
        3,
        Start::Plain,
        &crate::harness::rule_yaml(),
        &[],
        &["--forget-departed", "15s"],
    );
    for i in 0..3 {
        c.wait_ready(i);
    }
    let mut c = c;
    let origin = Instant::now();
    let mut loads = vec![
        load(origin, &c, 0, 0.3 * LIMIT as f64),
        load(origin, &c, 1, 0.1 * LIMIT as f64),
    ];
    let mut records = Vec::new();
    let mut held = Vec::new();
    for j in 0..6 {
        let id = c.add_joiner(Find::Seed(j % 3));
        let l = load(origin, &c, id, 0.1 * LIMIT as f64);
        std::thread::sleep(2 * SEC);
        records.push(l.finish());
        if j % 2 == 0 {
            c.terminate(id);
        } else {
            c.kill(id);
        }
        std::thread::sleep(SEC);
        held.push(joiner_floors(&c, 0).len());
    }
    let departed_at = origin.elapsed();
    // Fenced (the killed ones) within two seconds, then forgotten `forget` later.
    std::thread::sleep(forget + 4 * SEC);
    let left: Vec<(usize, Vec<u64>)> = (0..3)
        .map(|i| (i, joiner_floors(&c, i)))
        .filter(|(_, f)| !f.is_empty())
        .collect();
    let metric = crate::harness::http(c.addr(0), "GET", "/metrics", "")
        .map(|(_, body)| body)
        .unwrap_or_default();
    let floors_metric = metric
        .lines()
        .find(|l| l.starts_with("sluice_cluster_dead_floors"))
        .unwrap_or_default()
        .to_owned();
    let shares = c.total_share();
    let statuses = c.statuses();
    let r = loads
        .drain(..)
        .map(Load::finish)
        .chain(records)
        .reduce(Record::merge)
        .expect("loads");
    let most = assert_no_overshoot(name, &r, 6);
    report(
        name,
        &[
            ("max_1s_window", most.to_string()),
            ("bound", (LIMIT + BURST + 6).to_string()),
            ("floors_held_after_each_departure", format!("{held:?}")),
            (
                "last_departure_s",
                format!("{:.1}", departed_at.as_secs_f64()),
            ),
            ("floors_left_after_forget", left.len().to_string()),
            ("metric", floors_metric.replace(' ', "=")),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        held.iter().max().is_some_and(|&m| m >= 1),
        "{name}: the departures left no dead floor at all: {held:?}"
    );
    assert!(
        left.is_empty(),
        "{name}: dead floors left {forget:?} after the last departure: {left:?}\n{statuses}"
    );
    let floors_now = floors_metric
        .split_whitespace()
        .last()
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        floors_now.is_some_and(|n| n <= 3.0),
        "{name}: /metrics says {floors_metric:?} (at most the three members' own)"
    );
    let s = shares.unwrap_or_else(|| panic!("{name}: a voter did not answer"));
    assert!(
        (0.999..=1.0 + 1e-9).contains(&s),
        "{name}: the voters' shares add up to {s} L\n{statuses}"
    );
}

/// Two joiners draw the same random id (forced: `--test-random-node-id`), the second while
/// the first serves its clients. A random id is never reused by a restart, so the first to
/// hear an incarnation of its id above its own knows another process holds it: it gives the
/// id up and joins again under a new random id (docs/PROTOCOL.md, "Node ids"). Within a few
/// cycles the two run under different ids, both hold a lease and serve their clients, the
/// id conflicts stop, no 1 s window admits more than `L + burst`, and the shares add up to
/// `L`. (Without the redraw the two leapfrog each other's incarnations for as long as they
/// run, each fencing the other in turn.)
#[test]
fn two_joiners_that_draw_one_random_id_end_with_two() {
    let _one = serial();
    let name = "random-id-collision";
    const ID: &str = "3000000000";
    let (mut c, origin, mut loads) = voters_under_load(name);
    let first = c.add_joiner_with(Find::Seed(0), &["--test-random-node-id", ID]);
    loads.push(load(origin, &c, first, 0.1 * LIMIT as f64));
    std::thread::sleep(2 * SEC);
    let at = origin.elapsed();
    let second = c.add_joiner_with(Find::Seed(1), &["--test-random-node-id", ID]);
    loads.push(load(origin, &c, second, 0.1 * LIMIT as f64));
    let id_of = |c: &Cluster, i: usize| c.status(i).and_then(|s| s["node_id"].as_u64());
    let mut distinct = None;
    while origin.elapsed() < at + 10 * SEC {
        if let (Some(a), Some(b)) = (id_of(&c, first), id_of(&c, second))
            && a != b
        {
            distinct = Some(origin.elapsed() - at);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Settled: the newcomer under its own id earns its share within lease + 3 cycles.
    std::thread::sleep(bound() + SEC);
    let settled = origin.elapsed();
    let conflicts =
        |c: &Cluster| [first, second].map(|i| c.status_u64(i, &["incarnation_conflicts"]));
    let conflicts_then = conflicts(&c);
    std::thread::sleep(3 * SEC);
    let conflicts_now = conflicts(&c);
    let redraws = [first, second].map(|i| c.status_u64(i, &["node_id_redraws"]));
    let ids = [first, second].map(|i| id_of(&c, i));
    let leases = [first, second].map(|i| {
        c.status(i)
            .and_then(|s| s["lease"].as_str().map(str::to_owned))
            .unwrap_or_default()
    });
    let shares = c.total_share();
    let statuses = c.statuses();
    let r = loads
        .into_iter()
        .map(Load::finish)
        .reduce(Record::merge)
        .expect("loads");
    let most = assert_no_overshoot(name, &r, 5);
    let late: Vec<Duration> = [first, second]
        .iter()
        .flat_map(|&i| refused(&r, Some(i), settled, r.end))
        .collect();
    report(
        name,
        &[
            ("ids", format!("{ids:?}")),
            (
                "distinct_after_ms",
                format!("{:?}", distinct.map(|d| d.as_millis())),
            ),
            ("node_id_redraws", format!("{redraws:?}")),
            (
                "conflicts_settled_then_3s_later",
                format!("{conflicts_then:?} {conflicts_now:?}"),
            ),
            ("leases", format!("{leases:?}")),
            ("refused_after_settling", late.len().to_string()),
            ("max_1s_window", most.to_string()),
            ("shares_at_end", format!("{shares:?}")),
        ],
    );
    assert!(
        distinct.is_some() && ids[0] != ids[1] && ids.iter().all(Option::is_some),
        "{name}: the two joiners still share an id: {ids:?}\n{statuses}"
    );
    assert_eq!(
        redraws.iter().sum::<u64>(),
        1,
        "{name}: exactly one of the two draws again: {redraws:?}"
    );
    assert_eq!(
        conflicts_then, conflicts_now,
        "{name}: the id conflicts go on after the redraw\n{statuses}"
    );
    assert!(
        leases.iter().all(|l| l == "valid"),
        "{name}: leases {leases:?}\n{statuses}"
    );
    assert!(
        late.is_empty(),
        "{name}: the joiners refused {} requests after settling: {:?}\n{statuses}",
        late.len(),
        &late[..late.len().min(10)]
    );
    let s = shares.unwrap_or_else(|| panic!("{name}: a live node did not answer"));
    assert!(
        (0.999..=1.0 + 1e-9).contains(&s),
        "{name}: the live nodes' shares add up to {s} L\n{statuses}"
    );
}

/// An operator starts a second process with node 1's `--node-id` and `--peers` while node 1
/// runs (a copied command line). The peers take the newcomer for node 1's restart; node 1
/// hears its own id's floor above its incarnation and starts again above the newcomer's;
/// the peers then hold the newcomer's incarnation dead and tell it so with a namesake notice
/// (docs/PROTOCOL.md, "Node ids"). A configured id is not given up: the newcomer logs the
/// conflict as an error, counts it, and stays cut off on its fallback. Node 1 serves its
/// clients again within `lease + 3 cycles`, no 1 s window admits more than `L + burst`, and
/// the three voters' shares add up to `L`.
#[test]
fn a_node_id_given_twice_is_reported_and_keeps_the_limit() {
    let _one = serial();
    let name = "node-id-twice";
    let (mut c, origin, mut loads) = voters_under_load(name);
    let at = origin.elapsed();
    let twin = c.add_joiner_with(Find::Same(1), &[]);
    loads.push(load(origin, &c, twin, 0.1 * LIMIT as f64));
    std::thread::sleep(6 * SEC);
    let twin_status = c.status(twin).unwrap_or_default();
    let conflicts = twin_status["incarnation_conflicts"].as_u64().unwrap_or(0);
    let twin_lease = twin_status["lease"].as_str().unwrap_or("").to_owned();
    let shares: Option<f64> = (0..3).map(|i| c.share(i)).sum();
    let statuses = c.statuses();
    let log = std::fs::read_to_string(c.dir.join(format!("node{twin}.log"))).unwrap_or_default();
    let reported = log.contains("another process runs with this --node-id");
    let r = loads
        .into_iter()
        .map(Load::finish)
        .reduce(Record::merge)
        .expect("loads");
    let most = assert_no_overshoot(name, &r, 4);
    let node1_late = refused(&r, Some(1), at + bound(), r.end);
    report(
        name,
        &[
            ("twin_conflicts", conflicts.to_string()),
            ("twin_lease", twin_lease.clone()),
            ("twin_logged_the_conflict", reported.to_string()),
            ("node_1_refused_after_bound", node1_late.len().to_string()),
            ("max_1s_window", most.to_string()),
            ("voters_shares", format!("{shares:?}")),
        ],
    );
    assert!(
        conflicts >= 1 && reported,
        "{name}: the second process did not report the conflict ({conflicts})\n{statuses}"
    );
    assert_eq!(
        twin_lease, "expired",
        "{name}: the second process holds a lease"
    );
    assert!(
        node1_late.is_empty(),
        "{name}: node 1 refused {} requests after {:?}: {:?}\n{statuses}",
        node1_late.len(),
        bound(),
        &node1_late[..node1_late.len().min(10)]
    );
    let s = shares.unwrap_or_else(|| panic!("{name}: a voter did not answer"));
    assert!(
        (0.999..=1.0 + 1e-9).contains(&s),
        "{name}: the voters' shares add up to {s} L\n{statuses}"
    );
}
