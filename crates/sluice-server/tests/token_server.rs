//! `coordination: token-server` on 127.0.0.1 (seed 002 §4.4(3) with the batching of
//! §4.4(5)): two nodes drawing leases from one token server never admit more than the limit
//! in a window under concurrent load; with the server killed every decision still comes
//! within the timeout, locally (seed 002 §4.4(4)); a successor serves only once the dead
//! server's leases have expired, and the permits given out from leases stay within the limit
//! across the takeover.
//!
//! Each token server runs in a runtime of its own, so killing it (shutting that runtime
//! down) closes its sockets and stops every task of it at once, as a crash would.
#![allow(clippy::unwrap_used)]

mod view;
use view::{cluster_view, unix_now};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_center::Source;
use sluice_limits::{AlgorithmKind, Limit};
use sluice_server::metrics::Metrics;
use sluice_server::peer::PeerKey;
use sluice_server::token_server::{
    self, ClientSpec, RuleLimits, ServerAddr, ServerSpec, ServingState, TokenClient, TokenMode,
    TokenServerNode,
};
use sluice_server::{Code, Config, Descriptor, Engine, Request};

const SECOND: u64 = 1_000_000_000;
const LIMIT: u64 = 100;

/// 100 per second, fixed windows aligned to the epoch: a run spans several windows.
const RULES: &str = "
domain: d
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 100
      coordination: token-server
";

fn key() -> PeerKey {
    PeerKey::from_text("token-server-test-key-0123456789").unwrap()
}

/// The servers' configuration: every key is 100 per second, fixed windows (what `RULES`
/// says of `d|user=…`; the client-level tests ask for other keys under the same limit).
struct Rules;

impl RuleLimits for Rules {
    fn token_limit(&self, _key: &str) -> Option<(AlgorithmKind, Limit)> {
        Some((
            AlgorithmKind::FixedWindow,
            Limit::from_nanos(LIMIT, SECOND).unwrap(),
        ))
    }
}

/// A token server in a runtime of its own.
struct Server {
    rt: Option<tokio::runtime::Runtime>,
    node: Arc<TokenServerNode>,
}

impl Server {
    fn start(listener: std::net::TcpListener, spec: ServerSpec) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let node = TokenServerNode::new(spec, Arc::new(Rules)).unwrap();
        let n = node.clone();
        listener.set_nonblocking(true).unwrap();
        rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            token_server::run(l, n, std::future::pending())
                .await
                .unwrap();
        });
        Self { rt: Some(rt), node }
    }

    /// Kills it: every task and socket of its runtime is gone when this returns.
    async fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(2)))
                .await
                .unwrap();
        }
    }

    /// Waits until it serves.
    async fn serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.node.status();
            if s.state == ServingState::Active {
                return;
            }
            assert!(Instant::now() < deadline, "server never serves: {s:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// `n` listeners on 127.0.0.1 and the ordered server list over them (ids 0, 1, ...).
fn listeners(n: usize) -> (Vec<std::net::TcpListener>, Vec<ServerAddr>) {
    let ls: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls
        .iter()
        .enumerate()
        .map(|(i, l)| ServerAddr {
            id: u32::try_from(i).unwrap(),
            authority: l.local_addr().unwrap().to_string(),
        })
        .collect();
    (ls, addrs)
}

fn server_spec(servers: &[ServerAddr], id: u32) -> ServerSpec {
    let mut s = ServerSpec::new(servers.to_vec(), id, key());
    s.serving.renew_every = 20_000_000;
    s.timeout = Duration::from_millis(50);
    s
}

fn client(servers: &[ServerAddr], node: u32, timeout: Duration) -> TokenClient {
    let mut c = ClientSpec::new(servers.to_vec(), 100 + node, key(), 2);
    c.timeout = timeout;
    TokenClient::new(c)
}

fn engine(c: impl Into<Arc<TokenClient>>) -> Arc<Engine> {
    let e = Engine::new(Config::from_yaml("rules.yaml", RULES).unwrap());
    assert!(e.attach_token_server(c));
    Arc::new(e)
}

/// Waits for the start of the next second.
async fn next_window() {
    let t = unix_now();
    tokio::time::sleep(Duration::from_nanos(SECOND - t % SECOND + 1_000_000)).await;
}

/// Decisions of one load run: (time, admitted, decided from a lease, how long it took).
type Log = Vec<(u64, bool, bool, Duration)>;

/// `tasks` callers per node, one request each `every`, until `until`.
async fn load_engines(
    engines: &[Arc<Engine>],
    tasks: usize,
    every: Duration,
    until: Instant,
) -> Log {
    let mut handles = Vec::new();
    for e in engines {
        for _ in 0..tasks {
            let e = e.clone();
            handles.push(tokio::spawn(async move {
                let r = Request::new("d", [Descriptor::new([("user", "u")])]);
                let mut log = Log::new();
                while Instant::now() < until {
                    let (t, start) = (unix_now(), Instant::now());
                    let resp = e.should_rate_limit_async(t, &r).await.unwrap();
                    log.push((t, resp.overall_code == Code::Ok, true, start.elapsed()));
                    tokio::time::sleep(every).await;
                }
                log
            }));
        }
    }
    let mut all = Log::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    all
}

/// Admissions per window, each counted when its answer came back: a request that waits for
/// a grant is admitted when the grant arrives (in the server's window), not when it was
/// sent — counting it at the send time would move it to the window before whenever the call
/// spans a window's end.
fn per_window(log: &Log, only_leases: bool) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for &(t, ok, lease, took) in log {
        if ok && (lease || !only_leases) {
            let done = t + u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            *m.entry(done / SECOND).or_default() += 1;
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_admit_more_than_the_limit_per_window() {
    let (mut ls, servers) = listeners(1);
    let server = Server::start(ls.remove(0), server_spec(&servers, 0));
    // A generous timeout: this test is about the limit, not the fallback.
    let nodes = [
        engine(client(&servers, 0, Duration::from_secs(2))),
        engine(client(&servers, 1, Duration::from_secs(2))),
    ];
    server.serving().await;
    // The window in progress when the server started counts as given out (it cannot know
    // what a predecessor granted): start in the next one.
    next_window().await;
    let until = Instant::now() + Duration::from_millis(2_500);
    let log = load_engines(&nodes, 3, Duration::from_millis(1), until).await;
    let windows = per_window(&log, false);
    assert!(windows.len() >= 2, "{windows:?}");
    for (w, n) in &windows {
        assert!(
            *n <= LIMIT,
            "window {w}: {n} admitted > {LIMIT}: {windows:?}"
        );
    }
    // Offered ≈ 6,000/s: the two full windows are (nearly) used, not just safe.
    let full: Vec<u64> = windows.values().copied().take(2).collect();
    assert!(full.iter().all(|&n| n >= LIMIT / 2), "{windows:?}");
    for e in &nodes {
        let s = e.token_status().unwrap();
        assert_eq!(s.mode, TokenMode::Central, "{s:?}");
        assert_eq!(s.transitions, 0, "{s:?}");
        assert!(
            s.calls < s.decisions_central,
            "batches, not one call per decision: {s:?}"
        );
    }
}

/// What one node's client decided: (node, the time it was asked to decide at, admitted,
/// who decided, how long it took — so when the answer came back).
type Decided = Vec<(usize, u64, bool, Source, Duration)>;

/// `tasks` callers per client, one request each `every`, until `until`, straight to the
/// clients (to see who decided each request).
async fn load_clients(
    clients: &[Arc<TokenClient>],
    tasks: usize,
    every: Duration,
    until: Instant,
) -> Decided {
    let limit = Limit::from_nanos(LIMIT, SECOND).unwrap();
    let mut handles = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        for _ in 0..tasks {
            let c = c.clone();
            handles.push(tokio::spawn(async move {
                let mut log = Decided::new();
                while Instant::now() < until {
                    let (t, start) = (unix_now(), Instant::now());
                    let (d, source) = c.check(AlgorithmKind::FixedWindow, "k", &limit, t, 1).await;
                    log.push((i, t, d.allowed, source, start.elapsed()));
                    tokio::time::sleep(every).await;
                }
                log
            }));
        }
    }
    let mut all = Decided::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_means_local_decisions_within_the_timeout() {
    const TIMEOUT: Duration = Duration::from_millis(50);
    const NODES: u64 = 2;
    let (mut ls, servers) = listeners(1);
    let mut server = Server::start(ls.remove(0), server_spec(&servers, 0));
    let clients: Vec<Arc<TokenClient>> = (0..2)
        .map(|i| Arc::new(client(&servers, i, TIMEOUT)))
        .collect();
    let nodes: Vec<Arc<Engine>> = clients.iter().map(|c| engine(c.clone())).collect();
    server.serving().await;
    next_window().await;
    let until = Instant::now() + Duration::from_millis(2_200);
    let load = {
        let clients = clients.clone();
        tokio::spawn(
            async move { load_clients(&clients, 2, Duration::from_millis(2), until).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    for e in &nodes {
        let v = cluster_view(e).await;
        assert_eq!(v["token_server"]["mode"], "central", "{v}");
    }
    let killing = unix_now();
    server.kill().await;
    let killed = unix_now();
    let log = load.await.unwrap();
    // Every decision came back, and none waited much past the timeout (slack for a busy
    // machine).
    let slowest = log.iter().map(|l| l.4).max().unwrap();
    assert!(
        slowest <= TIMEOUT + Duration::from_millis(150),
        "a decision took {slowest:?}"
    );
    // Every admission, from leases and local, per window: at most Σ max(leases of node i,
    // L/N) (docs/PROTOCOL.md, token server fallback) — a node's share counts what it took
    // from leases in the window, and it never uses its share while its lease lasts.
    let mut windows: BTreeMap<u64, (u64, [u64; 2])> = BTreeMap::new();
    for &(node, t, ok, source, took) in &log {
        if ok {
            // Counted when the answer came back (as `per_window` does).
            let done = t + u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            let w = windows.entry(done / SECOND).or_default();
            w.0 += 1;
            if source == Source::Central {
                w.1[node] += 1;
            }
        }
    }
    let share = LIMIT / NODES;
    let kill_window = killed / SECOND;
    assert!(windows.contains_key(&kill_window), "{windows:?}");
    for (w, (total, leased)) in &windows {
        let bound: u64 = leased.iter().map(|&a| a.max(share)).sum();
        assert!(
            leased.iter().sum::<u64>() <= LIMIT && *total <= bound,
            "window {w}: {total} admitted, {leased:?} from leases, bound {bound}: {windows:?}"
        );
        // The closed form: never more than L + (N − 1)·L/N.
        assert!(*total <= LIMIT + (NODES - 1) * share, "{windows:?}");
    }
    // After the kill and the last lease, each node decides with half the limit.
    let after = windows
        .iter()
        .filter(|(w, _)| **w > kill_window && **w * SECOND >= killed + 200_000_000)
        .map(|(_, (n, _))| *n)
        .max()
        .unwrap_or(0);
    assert!(
        after <= LIMIT,
        "{after} admitted in a window on the fallback shares"
    );
    assert!(after >= LIMIT / 2, "the fallback admits its share: {after}");
    for e in &nodes {
        let s = e.token_status().unwrap();
        assert_eq!(s.mode, TokenMode::Fallback, "{s:?}");
        assert_eq!(s.transitions, 1, "one switch, logged once: {s:?}");
        assert!(s.decisions_local > 0, "{s:?}");
        let text = Metrics::new(e.clone(), None).encode().unwrap();
        assert!(text.contains("sluice_token_fallback 1"), "{text}");
        assert!(text.contains("sluice_token_transitions 1"), "{text}");
        // And operators see it on /v1/cluster.
        let v = cluster_view(e).await;
        let t = &v["token_server"];
        assert_eq!(t["mode"], "fallback", "{v}");
        assert_eq!(t["transitions"], 1, "{v}");
        assert_eq!(t["nodes"], NODES, "{v}");
        assert!(t["since"].as_u64().is_some_and(|s| s >= killing), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_serves_after_the_old_leases_and_the_limit_holds_across() {
    const TIMEOUT: Duration = Duration::from_millis(50);
    // Three servers: the successor and the third are a majority without the primary.
    let (mut ls, servers) = listeners(3);
    let (l2, l1) = (ls.remove(2), ls.remove(1));
    let mut primary = Server::start(ls.remove(0), server_spec(&servers, 0));
    let successor = Server::start(l1, server_spec(&servers, 1));
    let _third = Server::start(l2, server_spec(&servers, 2));
    let clients: Vec<Arc<TokenClient>> = (0..2)
        .map(|i| Arc::new(client(&servers, i, TIMEOUT)))
        .collect();
    // The same clients in engines, for their `/v1/cluster`.
    let views: Vec<Arc<Engine>> = clients.iter().map(|c| engine(c.clone())).collect();
    primary.serving().await;
    // The successor sees the primary and stands by.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        successor.node.status().state,
        ServingState::Standby,
        "{:?}",
        successor.node.status()
    );
    next_window().await;
    let limit = Limit::from_nanos(LIMIT, SECOND).unwrap();
    let until = Instant::now() + Duration::from_millis(3_300);
    let mut handles = Vec::new();
    for c in &clients {
        for _ in 0..2 {
            let c = c.clone();
            handles.push(tokio::spawn(async move {
                let mut log = Log::new();
                while Instant::now() < until {
                    let (t, start) = (unix_now(), Instant::now());
                    let (d, source) = c.check(AlgorithmKind::FixedWindow, "k", &limit, t, 1).await;
                    log.push((t, d.allowed, source == Source::Central, start.elapsed()));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                log
            }));
        }
    }
    // Kill the primary in the middle of a window.
    tokio::time::sleep(Duration::from_millis(1_400)).await;
    primary.kill().await;
    let killed = unix_now();
    // Until the successor serves, the clients decide locally, and say so.
    let mut seen = [false; 2];
    let deadline = Instant::now() + Duration::from_secs(2);
    while !seen.iter().all(|s| *s) && Instant::now() < deadline {
        for (i, e) in views.iter().enumerate() {
            let v = cluster_view(e).await;
            seen[i] |= v["token_server"]["mode"] == "fallback";
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(seen, [true; 2], "/v1/cluster never showed the fallback");
    let mut log = Log::new();
    for h in handles {
        log.extend(h.await.unwrap());
    }
    let s = successor.node.status();
    assert_eq!(s.state, ServingState::Active, "{s:?}");
    assert_eq!(s.acquisitions, 1, "{s:?}");
    // The successor waits out the primary's serving lease and then its grants.
    let from = killed + server_spec(&servers, 1).takeover_delay();
    // Permits given out from leases, whichever server granted them: within the limit in every
    // window, the window of the kill included.
    let leased = per_window(&log, true);
    for (w, n) in &leased {
        assert!(
            *n <= LIMIT,
            "window {w}: {n} admitted from leases > {LIMIT}: {leased:?}"
        );
    }
    // The successor serves: the clients take leases from it again.
    let after: u64 = log
        .iter()
        .filter(|l| l.1 && l.2 && l.0 >= from + SECOND)
        .count() as u64;
    assert!(after > 0, "no lease from the successor: {leased:?}");
    let slowest = log.iter().map(|l| l.3).max().unwrap();
    assert!(
        slowest <= TIMEOUT + Duration::from_millis(150),
        "a decision took {slowest:?}"
    );
    for c in &clients {
        let st = c.status();
        assert_eq!(st.mode, TokenMode::Central, "{st:?}");
        assert_eq!(st.server, 1, "{st:?}");
        assert_eq!(st.transitions, 2, "to the fallback and back: {st:?}");
    }
    for e in &views {
        let v = cluster_view(e).await;
        let t = &v["token_server"];
        assert_eq!(t["mode"], "central", "{v}");
        assert_eq!(t["server"], 1, "{v}");
        assert_eq!(t["transitions"], 2, "{v}");
    }
}

/// A TCP relay to `target` that can cut every connection through it (and refuse new ones)
/// and heal: a partition between nodes and a token server that keeps its state.
struct Relay {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut rx = rx.clone();
                if *rx.borrow() {
                    continue;
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Self { addr, cut }
    }

    fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Both nodes cut off from a token server (which keeps its state) 30 ms into a window, back
/// 300 ms into the second window after: every admission counted per window, by node and
/// source. Bounds (docs/PROTOCOL.md, 2 nodes, L = 100): node i admits at most
/// max(leases, 50) in the window of the cut, the nodes 100 in the window spent in fallback,
/// and in the window of the return L plus the local permits of at most one node — the one
/// that had not charged the server when it made its last grant (without the charge:
/// L + both nodes' local permits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_from_the_server_and_back_keeps_every_window_within_the_bounds() {
    // Long enough that a stalled machine does not time a call out (an extra transition) while
    // the relay passes; a cut fails the calls at once anyway.
    const TIMEOUT: Duration = Duration::from_millis(250);
    let (mut ls, servers) = listeners(1);
    let server = Server::start(ls.remove(0), server_spec(&servers, 0));
    let relay = Relay::start(servers[0].authority.clone()).await;
    let through = [ServerAddr {
        id: 0,
        authority: relay.addr.to_string(),
    }];
    let clients: Vec<Arc<TokenClient>> = (0..2)
        .map(|i| {
            let mut c = ClientSpec::new(through.to_vec(), 100 + i, key(), 2);
            c.timeout = TIMEOUT;
            c.probe_every = Duration::from_millis(20);
            Arc::new(TokenClient::new(c))
        })
        .collect();
    server.serving().await;
    // Start in a window after the one the server started in (counted as given out).
    next_window().await;
    next_window().await;
    let until = Instant::now() + Duration::from_millis(4_600);
    let load = {
        let clients = clients.clone();
        tokio::spawn(
            async move { load_clients(&clients, 2, Duration::from_millis(1), until).await },
        )
    };
    // 30 ms into the next window: cut; 300 ms into the second window after: heal.
    next_window().await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    relay.cut(true);
    let cut = unix_now() / SECOND;
    next_window().await;
    next_window().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.cut(false);
    let healed = unix_now() / SECOND;
    let log = load.await.unwrap();

    // Per window: admissions by node, from leases and local, each counted when its answer
    // came back. Not at the time asked for: a grant's permits are decided at its arrival
    // (`TokenClient::check` adds the call's duration), so a request sent just before a
    // window ends can admit from the next window's lease.
    let mut windows: BTreeMap<u64, [[u64; 2]; 2]> = BTreeMap::new();
    for &(node, t, ok, source, took) in &log {
        if ok {
            let done = t + u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            let w = windows.entry(done / SECOND).or_default();
            w[node][usize::from(source == Source::Local)] += 1;
        }
    }
    let share = LIMIT / 2;
    assert!(healed == cut + 2, "cut in {cut}, healed in {healed}");
    for (w, n) in &windows {
        let leased = n[0][0] + n[1][0];
        let local = [n[0][1], n[1][1]];
        let total = leased + local[0] + local[1];
        assert!(leased <= LIMIT, "window {w}: {windows:?}");
        if *w == cut {
            for (node, [a, l]) in n.iter().enumerate() {
                assert!(a + l <= (*a).max(share), "node {node} in {w}: {windows:?}");
            }
        } else if *w == cut + 1 {
            assert!(leased == 0 && total <= LIMIT, "window {w}: {windows:?}");
        } else if *w == healed {
            // Both nodes decided locally, then took leases again.
            assert!(local[0] > 0 && local[1] > 0 && leased > 0, "{windows:?}");
            let bound = LIMIT + local[0].max(local[1]);
            assert!(
                total <= bound,
                "window {w}: {total} admitted, bound {bound}: {windows:?}"
            );
        } else {
            assert!(total <= LIMIT, "window {w}: {windows:?}");
        }
    }
    let slowest = log.iter().map(|l| l.4).max().unwrap();
    // The timeout plus slack for a loaded 2-core machine.
    assert!(
        slowest <= TIMEOUT + Duration::from_millis(500),
        "a decision took {slowest:?}"
    );
    for c in &clients {
        let s = c.status();
        assert_eq!(s.mode, TokenMode::Central, "{s:?}");
        assert_eq!(s.transitions, 2, "to the fallback and back: {s:?}");
    }
    drop(server);
}
