//! `coordination: token-server` against real `sluice serve` processes on 127.0.0.1: three
//! nodes, each one of the three token servers, a client per node counting every answer.
//! Faults in turn: the serving token server SIGSTOPped for 1 s, 3.3 s and 5 s (whichever
//! serves at the time), each SIGCONTed 0.6 s into a window; a captured grant request resent
//! 50 times a second and a request naming another limit; a cut between servers 0 and 1 (both
//! reach server 2 and their own node) for 3 s.
//! Bound (docs/PROTOCOL.md, "Token server"): in every window of the rule, at most
//! `L + N·L/token_nodes` admitted over all nodes — `L` from leases, and each node's fallback
//! share on top at most once.
//!
//! The cut goes through TCP relays in this process (servers 0 and 1 are given each other's
//! address as a relay), so it needs neither root nor iptables.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_server::peer::{PeerKey, seal};

const L: u64 = 200;
const N: usize = 3;
/// `--token-nodes`: the fallback share is `L/100` per node.
const TOKEN_NODES: u64 = 100;
const KEY: &str = "token-chaos-key-0123456789abcdef";
const SECOND: u64 = 1_000_000_000;

fn wall() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `n` free ports, all held until every one is chosen.
fn ports(n: usize) -> Vec<u16> {
    let held: Vec<_> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: chaos\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .ok()?;
    s.write_all(body).ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let head_end = out.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&out[..head_end]).to_string();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, out[head_end + 4..].to_vec()))
}

/// A TCP relay to `target` that can cut every connection through it and refuse new ones.
struct Relay {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (c, o) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { continue };
                if c.load(Ordering::Relaxed) {
                    continue; // dropped: the connection closes
                }
                let Ok(outbound) = TcpStream::connect(target) else {
                    continue;
                };
                let mut list = o.lock().unwrap();
                list.push(inbound.try_clone().unwrap());
                list.push(outbound.try_clone().unwrap());
                for (mut from, mut to) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Self { port, cut, open }
    }

    fn cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
        if cut {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

struct Node {
    child: Child,
    http: SocketAddr,
    token: SocketAddr,
}

struct Cluster {
    dir: std::path::PathBuf,
    nodes: Vec<Node>,
    relays: Vec<Relay>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = Command::new("kill")
                .args(["-CONT", &n.child.id().to_string()])
                .status();
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
    }
}

impl Cluster {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-token-chaos-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = format!(
            "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: second\n      \
             requests_per_unit: {L}\n      coordination: token-server\n"
        );
        std::fs::write(dir.join("limits.yaml"), yaml).unwrap();
        let p = ports(3 * N);
        let token = |i: usize| local(p[3 * i + 2]);
        // Servers 0 and 1 reach each other through relays that can cut.
        let relays = vec![Relay::start(token(1)), Relay::start(token(0))];
        let mut nodes = Vec::new();
        for i in 0..N {
            let list: Vec<String> = (0..N)
                .map(|j| {
                    let addr = match (i, j) {
                        (0, 1) => local(relays[0].port),
                        (1, 0) => local(relays[1].port),
                        _ => token(j),
                    };
                    format!("{j}={addr}")
                })
                .collect();
            let log = std::fs::File::create(dir.join(format!("node{i}.log"))).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
                .args(["serve", "--config"])
                .arg(dir.join("limits.yaml"))
                .args(["--grpc-addr", &local(p[3 * i]).to_string()])
                .args(["--http-addr", &local(p[3 * i + 1]).to_string()])
                .args(["--token-servers", &list.join(",")])
                .args(["--token-server-id", &i.to_string()])
                .args(["--token-addr", &token(i).to_string()])
                .args(["--token-nodes", &TOKEN_NODES.to_string()])
                .args(["--watch", "off"])
                .env("SLUICE_PEER_KEY", KEY)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            nodes.push(Node {
                child,
                http: local(p[3 * i + 1]),
                token: token(i),
            });
        }
        let c = Self { dir, nodes, relays };
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.holder().is_none() {
            assert!(
                Instant::now() < deadline,
                "no token server serves:\n{}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    fn logs(&self) -> String {
        (0..N)
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.join(format!("node{i}.log")))
                    .unwrap_or_default();
                format!("node {i}:\n{log}")
            })
            .collect()
    }

    /// `/v1/cluster`'s `token_server_node` of node `i`.
    fn server(&self, i: usize) -> Option<serde_json::Value> {
        let (code, body) = http(self.nodes[i].http, "GET", "/v1/cluster", b"")?;
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        (code == 200).then(|| v["token_server_node"].clone())
    }

    /// The node whose token server is active.
    fn holder(&self) -> Option<usize> {
        (0..N).find(|&i| self.server(i).is_some_and(|s| s["state"] == "active"))
    }

    fn signal(&self, i: usize, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.nodes[i].child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// A counter of node `i`'s `/metrics` (the sum of its lines matching `name`).
    fn metric(&self, i: usize, name: &str) -> u64 {
        let (_, body) = http(self.nodes[i].http, "GET", "/metrics", b"").unwrap();
        String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

/// (sent, answered, admitted), wall clock ns.
type Answers = Arc<Mutex<Vec<(u64, u64, bool)>>>;

/// One keep-alive client per node posting to `/json` at `rate` per second until `stop`.
fn load(
    c: &Cluster,
    rate: f64,
    stop: &Arc<AtomicBool>,
    answers: &Answers,
) -> Vec<std::thread::JoinHandle<()>> {
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"t"}]}]}"#;
    c.nodes
        .iter()
        .map(|n| {
            let (addr, stop, answers) = (n.http, stop.clone(), answers.clone());
            std::thread::spawn(move || {
                let gap = Duration::from_secs_f64(1.0 / rate);
                let mut due = Instant::now();
                let mut conn: Option<BufReader<TcpStream>> = None;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(w) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(w);
                    }
                    due += gap;
                    if conn.is_none() {
                        conn = TcpStream::connect_timeout(&addr, Duration::from_millis(300))
                            .ok()
                            .map(|s| {
                                let _ = s.set_nodelay(true);
                                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                                BufReader::new(s)
                            });
                    }
                    let Some(s) = conn.as_mut() else { continue };
                    let sent = wall();
                    match exchange(s, body) {
                        Some(status) => answers.lock().unwrap().push((sent, wall(), status == 200)),
                        None => conn = None,
                    }
                }
            })
        })
        .collect()
}

fn exchange(s: &mut BufReader<TcpStream>, body: &str) -> Option<u16> {
    write!(
        s.get_mut(),
        "POST /json HTTP/1.1\r\nHost: chaos\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut line = String::new();
    s.read_line(&mut line).ok()?;
    let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
    let mut len = 0usize;
    loop {
        line.clear();
        if s.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().ok()?;
        }
    }
    let mut rest = vec![0u8; len];
    s.read_exact(&mut rest).ok()?;
    Some(status)
}

/// A sealed grant request from node 50 to token server `to`, as a node holding the key
/// would send it (the test captures its bytes and resends them).
fn grant_request(to: u32, count: u64, period: u64) -> Vec<u8> {
    let message = serde_json::json!({
        "seq": wall(),
        "body": {
            "kind": "grant", "key": "api|tenant=t", "algorithm": "fixed-window",
            "count": count, "period": period, "burst": count, "want": 1, "cost": 1,
        }
    });
    let key = PeerKey::from_text(KEY).unwrap();
    seal(&key, 50, to, &serde_json::to_vec(&message).unwrap()).unwrap()
}

/// Sleeps until `ms` ms into the next window.
fn into_next_window(ms: u64) {
    let t = wall();
    let target = (t / SECOND + 1) * SECOND + ms * 1_000_000;
    std::thread::sleep(Duration::from_nanos(target - t));
}

#[test]
fn the_token_servers_keep_every_window_within_the_bound_through_freeze_replay_and_cut() {
    let c = Cluster::start();
    let stop = Arc::new(AtomicBool::new(false));
    let answers: Answers = Arc::default();
    let threads = load(&c, 120.0, &stop, &answers);
    into_next_window(0);
    let start = wall() / SECOND;

    // Freeze the serving server for 1, 3.3 and 5 s in turn (SIGSTOP), each CONTed 0.6 s into
    // a window: every freeze outlasts the serving lease, so another server takes over, and
    // the resumed one must grant nothing from its stale state.
    let mut resumed = Vec::new();
    let mut served_after = Vec::new();
    for freeze_ms in [1_000u64, 3_300, 5_000] {
        into_next_window((1_600 - freeze_ms % 1_000) % 1_000);
        let frozen = c.holder().expect("a server serves");
        c.signal(frozen, "STOP");
        std::thread::sleep(Duration::from_millis(freeze_ms));
        c.signal(frozen, "CONT");
        std::thread::sleep(Duration::from_millis(1_000));
        let after_cont = c.server(frozen).unwrap();
        assert_ne!(
            after_cont["state"], "active",
            "{freeze_ms} ms: {after_cont}"
        );
        let successor = c.holder().expect("a successor serves");
        assert_ne!(successor, frozen, "{freeze_ms} ms");
        let granted = after_cont["granted"].as_u64().unwrap();
        resumed.push((freeze_ms, frozen, granted));
        served_after.push((freeze_ms, wall() / SECOND));
        // The next window whole, served by the successor, before the next fault.
        into_next_window(0);
        into_next_window(0);
        // The resumed server granted nothing more while it stood by.
        let now = c.server(frozen).unwrap();
        assert_eq!(
            now["granted"].as_u64(),
            Some(granted),
            "{freeze_ms} ms: {now}"
        );
    }
    let holder = c.holder().expect("a server serves");

    // Replays: a request granted once, its bytes resent 50 times a second for 1 s; and a
    // request naming another limit (2⁶⁴−1 per 1 ns).
    let to = c.nodes[holder].token;
    let captured = grant_request(u32::try_from(holder).unwrap(), L, SECOND);
    let first = http(to, "POST", "/v1/token", &captured).unwrap();
    assert_eq!(first.0, 200, "the original is answered");
    let mut refused = 0;
    for _ in 0..50 {
        if http(to, "POST", "/v1/token", &captured).unwrap().0 == 403 {
            refused += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(refused, 50, "every replay is refused");
    let forged = grant_request(u32::try_from(holder).unwrap(), u64::MAX, 1);
    assert_eq!(http(to, "POST", "/v1/token", &forged).unwrap().0, 200);
    let metric = |reason: &str| {
        c.metric(
            holder,
            &format!("sluice_token_server_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    assert!(
        metric("replay") >= 50,
        "replays counted: {}",
        metric("replay")
    );
    assert!(metric("wrong_limit") >= 1, "wrong limit counted");

    // A cut between servers 0 and 1 for 3 s (each still reaches server 2).
    c.relays[0].cut(true);
    c.relays[1].cut(true);
    std::thread::sleep(Duration::from_millis(3_000));
    c.relays[0].cut(false);
    c.relays[1].cut(false);
    std::thread::sleep(Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let end = wall() / SECOND;

    // The server resumed last stood by through the replays and the cut: while the holder
    // renews with a majority, nobody takes the lease from it.
    let &(_, frozen, granted) = resumed.last().unwrap();
    let last = c.server(frozen).unwrap();
    assert_eq!(last["granted"].as_u64(), Some(granted), "{last}");
    // Every window of the rule, counted by the clients: an admission counts in a window
    // when it was sent and answered inside it (decided there).
    let answers = answers.lock().unwrap();
    let mut windows = std::collections::BTreeMap::<u64, u64>::new();
    for &(sent, at, ok) in answers.iter() {
        if ok && sent / SECOND == at / SECOND && (start..end).contains(&(sent / SECOND)) {
            *windows.entry(sent / SECOND).or_default() += 1;
        }
    }
    let bound = L + N as u64 * L / TOKEN_NODES;
    eprintln!(
        "token chaos: per window {:?} (bound {bound}); frozen (ms, server, granted): \
         {resumed:?}, then {holder} serves",
        windows.values().collect::<Vec<_>>()
    );
    for (w, n) in &windows {
        assert!(
            *n <= bound,
            "window {}: {n} > {bound}: {windows:?}",
            w - start
        );
    }
    // The successor serves: the full window after each takeover gets most of the limit.
    for (freeze_ms, w) in served_after {
        let served = windows.get(&(w + 1)).copied().unwrap_or(0);
        assert!(
            served >= L * 3 / 4,
            "after the {freeze_ms} ms freeze, window {}: {served}; {windows:?}\n{}",
            w + 1 - start,
            c.logs()
        );
    }
}
