//! `sluice serve` as real processes on 127.0.0.1: three nodes sharing one `coordination:
//! cluster` limit over UDP, driven through the HTTP API (`POST /json`, `GET /v1/cluster`).
//! Kill -9 one node: the survivors take its capacity over within lease + 2 cycles (seed 003
//! §IV best friend) without ever holding more than the limit; restarted, it rejoins as a new
//! incarnation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: u64 = 400;
const CYCLE_MS: u64 = 100;
const LEASE_MS: u64 = 1_000;

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |b| b.1).to_owned();
    Some((status, body))
}

struct Node {
    http: SocketAddr,
    child: Child,
}

struct Cluster {
    dir: PathBuf,
    peers: Vec<SocketAddr>,
    nodes: Vec<Option<Node>>,
}

impl Cluster {
    fn new(n: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-cluster-cli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("limits.yaml"),
            format!(
                "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: second\n      \
                 requests_per_unit: {LIMIT}\n      algorithm: gcra\n      burst: 40\n      \
                 coordination: cluster\n"
            ),
        )
        .unwrap();
        let peers = (0..n)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let mut c = Self {
            dir,
            peers,
            nodes: (0..n).map(|_| None).collect(),
        };
        for i in 0..n {
            c.start(i);
        }
        for i in 0..n {
            c.wait_healthy(i);
        }
        c
    }

    fn start(&mut self, id: usize) {
        let http = SocketAddr::from(([127, 0, 0, 1], free_tcp()));
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_tcp()));
        let peers: Vec<String> = (0..self.peers.len())
            .filter(|&j| j != id)
            .map(|j| format!("{j}={}", self.peers[j]))
            .collect();
        let log = std::fs::File::create(self.dir.join(format!("node{id}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--config"])
            .arg(self.dir.join("limits.yaml"))
            .args([
                "--grpc-addr",
                &grpc.to_string(),
                "--http-addr",
                &http.to_string(),
            ])
            .args(["--peer-addr", &self.peers[id].to_string()])
            .args(["--node-id", &id.to_string(), "--peers", &peers.join(",")])
            .args([
                "--cycle",
                &format!("{CYCLE_MS}ms"),
                "--lease",
                &format!("{LEASE_MS}ms"),
            ])
            .arg("--state-file")
            .arg(self.dir.join(format!("node{id}.incarnation")))
            .args(["--watch", "off"])
            .env("SLUICE_PEER_KEY", "cluster-cli-test-key-0123456789")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes[id] = Some(Node { http, child });
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().unwrap()
    }

    fn wait_healthy(&self, id: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http(self.node(id).http, "GET", "/healthz", "").is_some_and(|r| r.0 == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log =
            std::fs::read_to_string(self.dir.join(format!("node{id}.log"))).unwrap_or_default();
        panic!("node {id} did not become healthy; its log:\n{log}");
    }

    fn kill(&mut self, id: usize) {
        let mut n = self.nodes[id].take().unwrap();
        n.child.kill().unwrap(); // SIGKILL: no goodbye, no handover
        let _ = n.child.wait();
    }

    /// (incarnation, share of the key, default share) of a live node.
    fn status(&self, id: usize) -> Option<(u64, f64)> {
        let (code, body) = http(self.node(id).http, "GET", "/v1/cluster", "")?;
        if code != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let share = v["keys"]
            .as_array()
            .and_then(|k| k.first())
            .and_then(|k| k["share"].as_f64())
            .or_else(|| v["default_share"].as_f64())?;
        Some((v["incarnation"].as_u64()?, share))
    }

    /// Sends `per_node[i]` requests to node i spread over `secs`; returns admitted per node.
    fn load(&self, per_node: &[(usize, u64)], secs: f64) -> Vec<u64> {
        let body =
            r#"{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]}"#;
        std::thread::scope(|s| {
            let handles: Vec<_> = per_node
                .iter()
                .map(|&(id, count)| {
                    let addr = self.node(id).http;
                    s.spawn(move || {
                        let start = Instant::now();
                        let mut ok = 0;
                        for k in 0..count {
                            let due = Duration::from_secs_f64(secs * k as f64 / count as f64);
                            if let Some(wait) = due.checked_sub(start.elapsed()) {
                                std::thread::sleep(wait);
                            }
                            if http(addr, "POST", "/json", body).is_some_and(|r| r.0 == 200) {
                                ok += 1;
                            }
                        }
                        ok
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.nodes.iter_mut().flatten() {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn log_of(dir: &Path, id: usize) -> String {
    std::fs::read_to_string(dir.join(format!("node{id}.log"))).unwrap_or_default()
}

#[test]
fn three_processes_share_the_limit_survive_kill_and_rejoin() {
    let mut c = Cluster::new(3);
    let l = LIMIT as f64;

    // 1. Uneven overload (1.5 L: 40/30/30%): warm up 3 s, then measure 3 s. Case I gives
    // node 2 about 0.28 of the limit, so its death below really leaves capacity to take over.
    let plan = |secs: f64| -> Vec<(usize, u64)> {
        [0.4, 0.3, 0.3]
            .iter()
            .enumerate()
            .map(|(i, f)| (i, (1.5 * l * f * secs) as u64))
            .collect()
    };
    c.load(&plan(3.0), 3.0);
    let admitted: u64 = c.load(&plan(3.0), 3.0).iter().sum();
    let err = (admitted as f64 - 3.0 * l) / (3.0 * l);
    eprintln!(
        "converged: admitted {admitted} in 3 s vs {} ({:+.2}%)",
        3.0 * l,
        err * 100.0
    );
    assert!(err.abs() <= 0.02, "admitted {admitted} vs {} ± 2%", 3.0 * l);

    // 2. kill -9 node 2 (node 1 is its heir: the next id). The survivors' shares never add up
    // to more than the limit, and reach all of it within lease + 2 cycles.
    let shares = |c: &Cluster| -> Option<f64> { Some(c.status(0)?.1 + c.status(1)?.1) };
    let before = shares(&c).unwrap();
    let dead_share = c.status(2).unwrap().1;
    assert!(
        dead_share >= 0.15,
        "node 2 holds {dead_share} before it dies"
    );
    c.kill(2);
    let killed = Instant::now();
    let mut regained = None;
    while killed.elapsed() < Duration::from_millis(LEASE_MS * 4) {
        // Keep the survivors' demand up so the law moves the estate to whoever needs it.
        c.load(&[(0, 10), (1, 8)], 0.05);
        if let Some(s) = shares(&c) {
            assert!(s <= 1.0 + 1e-9, "survivors hold {s} of the limit");
            if regained.is_none() && s >= 0.999 {
                regained = Some(killed.elapsed());
            }
        }
        if regained.is_some() {
            break;
        }
    }
    let bound = Duration::from_millis(LEASE_MS + 2 * CYCLE_MS);
    let took = regained.unwrap_or_else(|| {
        panic!(
            "survivors never regained the capacity (held {before} before); node 1 log:\n{}",
            log_of(&c.dir, 1)
        )
    });
    eprintln!(
        "survivors regained the dead node's share in {took:?} (bound lease + 2 cycles = {bound:?}, plus polling)"
    );
    // Polling an HTTP endpoint of a process on a shared machine adds its own delay: allow one
    // more cycle for that, on top of the protocol's bound.
    assert!(
        took <= bound + Duration::from_millis(CYCLE_MS + 150),
        "took {took:?}"
    );

    // 3. Restart node 2 with its state file: a new incarnation that rejoins and, with demand,
    // gets capacity back, while the total never exceeds the limit.
    c.start(2);
    c.wait_healthy(2);
    let mut rejoined = false;
    for _ in 0..40 {
        c.load(&[(0, 20), (1, 5), (2, 20)], 0.1);
        if let (Some(a), Some(b), Some(d)) = (c.status(0), c.status(1), c.status(2)) {
            assert!(d.0 >= 2, "restarted node runs incarnation {}", d.0);
            assert!(
                a.1 + b.1 + d.1 <= 1.0 + 1e-9,
                "total share {}",
                a.1 + b.1 + d.1
            );
            if d.1 > 0.05 {
                rejoined = true;
                break;
            }
        }
    }
    assert!(
        rejoined,
        "node 2 never got capacity back; its log:\n{}",
        log_of(&c.dir, 2)
    );
}
