//! Real `sluice serve` processes on 127.0.0.1 and a client that counts what they admit.
//!
//! A [`Cluster`] starts `n` nodes sharing one `coordination: cluster` rule (GCRA, `LIMIT`
//! per second, burst `BURST`), with or without state files, and can kill -9, restart,
//! SIGSTOP and SIGCONT them. A [`Load`] sends requests to chosen nodes at chosen rates, each
//! node through a few keep-alive HTTP connections, and records the instant of every answer;
//! [`Record`] turns that into what an SRE measures: admitted per sliding 1 s window against
//! `L + burst`, over-throttling, and the longest time the cluster admitted (nearly) nothing.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The rule: `LIMIT` requests per second across the cluster, GCRA with `BURST`.
pub(crate) const LIMIT: u64 = 1_000;
pub(crate) const BURST: u64 = 100;
pub(crate) const CYCLE_MS: u64 = 100;
pub(crate) const LEASE_MS: u64 = 1_000;

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: chaos\r\nContent-Type: application/json\r\n\
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

/// A keep-alive HTTP/1.1 connection that posts the same request again and again.
struct Conn {
    addr: SocketAddr,
    stream: Option<BufReader<TcpStream>>,
}

impl Conn {
    fn new(addr: SocketAddr) -> Self {
        Self { addr, stream: None }
    }

    /// Posts `body` to `/json`; the status, or `None` if the node did not answer.
    fn post(&mut self, body: &str, timeout: Duration) -> Option<u16> {
        for _ in 0..2 {
            if self.stream.is_none() {
                let s = TcpStream::connect_timeout(&self.addr, Duration::from_millis(300)).ok()?;
                s.set_nodelay(true).ok()?;
                s.set_read_timeout(Some(timeout)).ok()?;
                self.stream = Some(BufReader::new(s));
            }
            let r = self.exchange(body);
            if r.is_some() {
                return r;
            }
            self.stream = None; // closed by the server, or broken: once more on a new one
        }
        None
    }

    fn exchange(&mut self, body: &str) -> Option<u16> {
        let s = self.stream.as_mut()?;
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
}

/// How a node is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// With `--state-file`.
    StateFile,
    /// The same command line every time, no state file.
    Plain,
}

/// A running node's process.
pub(crate) struct Node {
    child: Child,
}

pub(crate) struct Cluster {
    pub(crate) dir: PathBuf,
    peers: Vec<SocketAddr>,
    /// Each node's (HTTP, gRPC) addresses, kept across restarts so its clients find it.
    addrs: Vec<(SocketAddr, SocketAddr)>,
    nodes: Vec<Option<Node>>,
    start: Start,
    /// Each node's clock rate against real time (1: its own clock; otherwise it runs under
    /// libfaketime at that rate).
    rates: Vec<f64>,
    /// The founding members (started with `--node-id i --peers` every other one of them);
    /// the nodes after them are joiners, started with `joiners[i − founding]`'s flags.
    founding: usize,
    joiners: Vec<Vec<String>>,
    /// Each node's extra `sluice serve` arguments (e.g. an older wire version).
    args: Vec<Vec<String>>,
}

/// How a joiner finds the running cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Find {
    /// `--peers HOST:PORT` of one running node (a seed, its id unknown).
    Seed(usize),
    /// `--peers-file` listing every founding node's address.
    File,
    /// `--peers-dns localhost:PORT` of one running node.
    Dns(usize),
    /// Founding node `n`'s own `--node-id` and `--peers` (an operator's mistake: two
    /// processes with one configured id).
    Same(usize),
}

impl Cluster {
    /// `n` nodes, every one started and healthy.
    pub(crate) fn new(name: &str, n: usize, start: Start) -> Self {
        Self::with_rules(name, n, start, &rule_yaml(), &[])
    }

    pub(crate) fn with_rules(
        name: &str,
        n: usize,
        start: Start,
        yaml: &str,
        rates: &[f64],
    ) -> Self {
        Self::with_args(name, n, start, yaml, rates, &[])
    }

    /// [`Cluster::with_rules`] with more `sluice serve` flags for every node.
    pub(crate) fn with_args(
        name: &str,
        n: usize,
        start: Start,
        yaml: &str,
        rates: &[f64],
        args: &[&str],
    ) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-chaos-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("limits.yaml"), yaml).unwrap();
        // Every port is held until all are chosen: a port given back at once may be handed
        // out again by the next request for a free one.
        let local = |p| SocketAddr::from(([127, 0, 0, 1], p));
        let udp: Vec<_> = (0..n)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let tcp: Vec<_> = (0..2 * n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let port = |a: std::io::Result<SocketAddr>| a.unwrap().port();
        let peers = udp.iter().map(|s| local(port(s.local_addr()))).collect();
        let addrs = (0..n)
            .map(|i| {
                (
                    local(port(tcp[2 * i].local_addr())),
                    local(port(tcp[2 * i + 1].local_addr())),
                )
            })
            .collect();
        drop((udp, tcp));
        let mut c = Self {
            dir,
            peers,
            addrs,
            nodes: (0..n).map(|_| None).collect(),
            start,
            rates: (0..n)
                .map(|i| rates.get(i).copied().unwrap_or(1.0))
                .collect(),
            founding: n,
            joiners: Vec::new(),
            args: vec![args.iter().map(|a| (*a).to_owned()).collect(); n],
        };
        for i in 0..n {
            c.start(i);
        }
        for i in 0..n {
            c.wait_healthy(i);
        }
        c
    }

    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Adds a node that joins the running cluster (no id of its own: a random one; its
    /// voters from the cluster it finds), starts it and waits until it answers.
    pub(crate) fn add_joiner(&mut self, find: Find) -> usize {
        self.add_joiner_with(find, &[])
    }

    /// [`Cluster::add_joiner`] with more arguments for the joiner.
    pub(crate) fn add_joiner_with(&mut self, find: Find, extra: &[&str]) -> usize {
        let free = |tcp: bool| {
            if tcp {
                std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
            } else {
                std::net::UdpSocket::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
            }
        };
        let id = self.nodes.len();
        let mut flags = match find {
            Find::Seed(n) => vec!["--peers".into(), self.peers[n].to_string()],
            Find::Dns(n) => vec![
                "--peers-dns".into(),
                format!("localhost:{}", self.peers[n].port()),
            ],
            Find::Same(n) => vec![
                "--node-id".into(),
                n.to_string(),
                "--peers".into(),
                (0..self.founding)
                    .filter(|&j| j != n)
                    .map(|j| format!("{j}={}", self.peers[j]))
                    .collect::<Vec<_>>()
                    .join(","),
            ],
            Find::File => {
                let path = self.dir.join("peers.txt");
                let list: Vec<String> = self.peers[..self.founding]
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                std::fs::write(&path, format!("# founding members\n{}\n", list.join("\n")))
                    .unwrap();
                vec!["--peers-file".into(), path.display().to_string()]
            }
        };
        flags.extend(extra.iter().map(|a| (*a).to_owned()));
        self.peers.push(free(false));
        self.addrs.push((free(true), free(true)));
        self.nodes.push(None);
        self.rates.push(1.0);
        self.joiners.push(flags);
        // A joiner runs what the founding nodes run.
        self.args
            .push(self.args.first().cloned().unwrap_or_default());
        self.start(id);
        self.wait_healthy(id);
        id
    }

    /// The extra arguments of node `id`'s next starts.
    pub(crate) fn set_args(&mut self, id: usize, args: &[&str]) {
        self.args[id] = args.iter().map(|a| (*a).to_owned()).collect();
    }

    pub(crate) fn start(&mut self, id: usize) {
        let (http, grpc) = self.addrs[id];
        let peers: Vec<String> = (0..self.founding)
            .filter(|&j| j != id)
            .map(|j| format!("{j}={}", self.peers[j]))
            .collect();
        let membership: Vec<String> = match id.checked_sub(self.founding) {
            Some(j) => self.joiners[j].clone(),
            None => vec![
                "--node-id".into(),
                id.to_string(),
                "--peers".into(),
                peers.join(","),
            ],
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node{id}.log")))
            .unwrap();
        let bin = env!("CARGO_BIN_EXE_sluice");
        let mut cmd = if self.rates[id] == 1.0 {
            Command::new(bin)
        } else {
            // Every clock the process reads (monotonic included) runs at that rate.
            let mut c = Command::new("faketime");
            c.args(["-m", "-f", &format!("+0 x{}", self.rates[id]), bin]);
            c
        };
        cmd.args(["serve", "--config"])
            .arg(self.dir.join("limits.yaml"))
            .args(["--grpc-addr", &grpc.to_string()])
            .args(["--http-addr", &http.to_string()])
            .args(["--peer-addr", &self.peers[id].to_string()])
            .args(&membership)
            .args(["--cycle", &format!("{CYCLE_MS}ms")])
            .args(["--lease", &format!("{LEASE_MS}ms")])
            .args(["--fallback", "none", "--watch", "off"])
            .args(&self.args[id])
            // Extra flags for every daemon, e.g. `--grpc-http2 h2` to compare stacks.
            .args(
                std::env::var("CHAOS_SERVE_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .env("SLUICE_PEER_KEY", "chaos-test-key-0123456789abcdef")
            .stdout(Stdio::null())
            .stderr(log);
        if self.start == Start::StateFile {
            cmd.arg("--state-file")
                .arg(self.dir.join(format!("node{id}.incarnation")));
        }
        // Its own process group: `faketime` runs the daemon as its child, and a signal to the
        // group reaches both (killing `faketime` alone left the daemon running).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        self.nodes[id] = Some(Node {
            child: cmd.spawn().unwrap(),
        });
    }

    pub(crate) fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("node is running")
    }

    pub(crate) fn running(&self, id: usize) -> bool {
        self.nodes[id].is_some()
    }

    /// The node's HTTP address (the same across its restarts).
    pub(crate) fn addr(&self, id: usize) -> SocketAddr {
        self.addrs[id].0
    }

    /// Waits for `/readyz` (a lease, out of a restart's quarantine), as a Kubernetes rolling
    /// update does before it restarts the next pod.
    pub(crate) fn wait_ready(&self, id: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http(self.addr(id), "GET", "/readyz", "").is_some_and(|r| r.0 == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("node {id} did not become ready; its log:\n{}", self.log(id));
    }

    pub(crate) fn wait_healthy(&self, id: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http(self.addr(id), "GET", "/healthz", "").is_some_and(|r| r.0 == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "node {id} did not become healthy; its log:\n{}",
            self.log(id)
        );
    }

    /// kill -9: no goodbye, no handover.
    pub(crate) fn kill(&mut self, id: usize) {
        let mut n = self.nodes[id].take().expect("node is running");
        kill_group(&n.child, "KILL");
        let _ = n.child.wait();
    }

    /// SIGTERM, as Kubernetes stops a pod: the node hands its capacity over and exits (kill
    /// -9 after ten seconds, which fails the scenario's own checks).
    pub(crate) fn terminate(&mut self, id: usize) {
        self.signal(id, "TERM");
        let mut n = self.nodes[id].take().expect("node is running");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = n.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_group(&n.child, "KILL");
        let _ = n.child.wait();
        panic!("node {id} did not exit within 10 s of SIGTERM");
    }

    pub(crate) fn signal(&self, id: usize, sig: &str) {
        let child = &self.node(id).child;
        assert!(kill_group(child, sig), "kill -{sig} -{}", child.id());
    }

    pub(crate) fn log(&self, id: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("node{id}.log"))).unwrap_or_default()
    }

    /// `/v1/cluster` of a running node.
    pub(crate) fn status(&self, id: usize) -> Option<serde_json::Value> {
        let (code, body) = http(self.addr(id), "GET", "/v1/cluster", "")?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// Every running node's `/v1/cluster`, a line each (for a failure's message).
    pub(crate) fn statuses(&self) -> String {
        (0..self.len())
            .filter(|&i| self.running(i))
            .map(|i| {
                let v = self.status(i).map(|v| v.to_string()).unwrap_or_default();
                format!("node {i}: {v}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The node's share of the rule's key (its default share if it has no state for it).
    pub(crate) fn share(&self, id: usize) -> Option<f64> {
        let v = self.status(id)?;
        v["keys"]
            .as_array()
            .and_then(|k| {
                k.iter()
                    .find(|k| k["rule"].is_string() || k["share"].is_number())
            })
            .and_then(|k| k["share"].as_f64())
            .or_else(|| v["default_share"].as_f64())
    }

    /// A number of node `id`'s `/v1/cluster` at `path` (`["peer", "oversized"]`); 0 when it
    /// does not answer or has no such number.
    pub(crate) fn status_u64(&self, id: usize, path: &[&str]) -> u64 {
        self.status(id)
            .and_then(|s| path.iter().try_fold(s, |v, k| v.get(*k).cloned())?.as_u64())
            .unwrap_or(0)
    }

    pub(crate) fn incarnation(&self, id: usize) -> Option<u64> {
        self.status(id)?["incarnation"].as_u64()
    }

    /// Σ shares over the running nodes (`None` if one does not answer): the least of five
    /// readings 100 ms apart. The nodes are read one after the other while capacity moves, so
    /// a gift read at its receiver but not yet at its giver counts twice in one reading (CI
    /// once read 1.0011 L that way); an excess the nodes really hold shows in every reading.
    pub(crate) fn total_share(&self) -> Option<f64> {
        let mut least: Option<f64> = None;
        for _ in 0..5 {
            let sum: f64 = (0..self.len())
                .filter(|&i| self.running(i))
                .map(|i| self.share(i))
                .sum::<Option<f64>>()?;
            least = Some(least.map_or(sum, |l| l.min(sum)));
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        least
    }

    /// Resident memory of a running node, bytes.
    pub(crate) fn rss(&self, id: usize) -> Option<u64> {
        let pid = self.node(id).child.id();
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kb: u64 = s
            .lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kb * 1024)
    }
}

/// `kill -SIG -- -PGID`: the node's process group (the daemon, and `faketime` when it runs
/// one); whether the signal was sent.
fn kill_group(child: &std::process::Child, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{}", child.id())])
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.nodes.iter_mut().flatten() {
            kill_group(&n.child, "CONT");
            kill_group(&n.child, "KILL");
            let _ = n.child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("logs kept in {}", self.dir.display());
        }
    }
}

/// The rule every scenario uses, per `tenant` value.
pub(crate) fn rule_yaml() -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: second\n      \
         requests_per_unit: {LIMIT}\n      algorithm: gcra\n      burst: {BURST}\n      \
         coordination: cluster\n"
    )
}

pub(crate) fn body(tenant: &str) -> String {
    format!(
        r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"tenant","value":"{tenant}"}}]}}]}}"#
    )
}

/// [`rule_yaml`] and a per-`remote_address` cluster rule of `per_unit` per `unit`, burst 5.
pub(crate) fn address_rule_yaml(unit: &str, per_unit: u64) -> String {
    format!(
        "{}  - key: remote_address\n    rate_limit:\n      unit: {unit}\n      \
         requests_per_unit: {per_unit}\n      algorithm: gcra\n      burst: 5\n      \
         coordination: cluster\n",
        rule_yaml()
    )
}

/// A request for `remote_address` number `k` (`10.x.y.z`).
pub(crate) fn address_body(k: u64) -> String {
    format!(
        r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"remote_address","value":"10.{}.{}.{}"}}]}}]}}"#,
        (k >> 16) & 255,
        (k >> 8) & 255,
        k & 255
    )
}

/// One answer: when it came (since the load's start), from which node, and whether it
/// admitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    /// When the request was sent: the node decided it between `sent` and `at`.
    pub(crate) sent: Duration,
    /// When the answer came.
    pub(crate) at: Duration,
    pub(crate) node: usize,
    pub(crate) ok: bool,
}

/// Requests sent at fixed rates to chosen nodes until stopped, each node through `conns`
/// keep-alive connections (open loop per connection: a late request is sent at once, one at
/// a time, so a frozen node sees its clients' requests queue up as a real one would).
pub(crate) struct Load {
    pub(crate) origin: Instant,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `rates[i] = (node, address, requests per second)`, every request for `tenant`.
    pub(crate) fn start(rates: &[(usize, SocketAddr, f64)], conns: usize, tenant: &str) -> Self {
        let body = body(tenant);
        Self::start_with(rates, conns, move |_| body.clone())
    }

    /// As [`Load::start`], the `k`-th request of a connection carrying `make(k · conns +
    /// connection index)` (e.g. a new key every time).
    pub(crate) fn start_with(
        rates: &[(usize, SocketAddr, f64)],
        conns: usize,
        make: impl Fn(u64) -> String + Send + Sync + 'static,
    ) -> Self {
        Self::start_from(Instant::now(), rates, conns, make)
    }

    /// As [`Load::start_with`], its times counted from `origin` (another load's, so that
    /// their records can be merged).
    pub(crate) fn start_from(
        origin: Instant,
        rates: &[(usize, SocketAddr, f64)],
        conns: usize,
        make: impl Fn(u64) -> String + Send + Sync + 'static,
    ) -> Self {
        let make = Arc::new(make);
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for &(node, addr, rate) in rates {
            if rate <= 0.0 {
                continue;
            }
            for c in 0..conns {
                let (stop, answers, make) = (stop.clone(), answers.clone(), make.clone());
                let salt = (node * conns + c) as u64;
                let stride = (rates.len() * conns) as u64;
                let gap = Duration::from_secs_f64(conns as f64 / rate);
                // Spread the connections' schedules over one gap.
                let offset = gap.mul_f64(c as f64 / conns as f64);
                threads.push(std::thread::spawn(move || {
                    let mut conn = Conn::new(addr);
                    let mut due = Instant::now().max(origin) + offset;
                    let mut mine = Vec::new();
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let body = make(k * stride + salt);
                        k += 1;
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        due += gap;
                        let sent = origin.elapsed();
                        let status = conn.post(&body, Duration::from_secs(10));
                        let at = origin.elapsed();
                        if let Some(s) = status {
                            mine.push(Answer {
                                sent,
                                at,
                                node,
                                ok: s == 200,
                            });
                        } else {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        if mine.len() >= 256 {
                            answers.lock().unwrap().append(&mut mine);
                        }
                    }
                    answers.lock().unwrap().append(&mut mine);
                }));
            }
        }
        Self {
            origin,
            stop,
            answers,
            threads,
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }

    pub(crate) fn finish(self) -> Record {
        // The record ends when sending stops, not when the last thread has been joined: a
        // window reaching past the last send would count as a dip what was never asked.
        let end = self.origin.elapsed();
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let mut answers = std::mem::take(&mut *self.answers.lock().unwrap());
        answers.sort_by_key(|a| a.at);
        Record { answers, end }
    }
}

/// What a load saw.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) answers: Vec<Answer>,
    pub(crate) end: Duration,
}

impl Record {
    /// Both records' answers (counted from one origin: see [`Load::start_from`]).
    pub(crate) fn merge(mut self, other: Record) -> Record {
        self.answers.extend(other.answers);
        self.answers.sort_by_key(|a| a.at);
        self.end = self.end.max(other.end);
        self
    }

    /// The admitted instants (sorted).
    fn admitted(&self) -> Vec<Duration> {
        self.answers.iter().filter(|a| a.ok).map(|a| a.at).collect()
    }

    /// The most admitted in any sliding window of `width` within `[from, to)`, and where
    /// that window starts. An admission counts in a window only when the node must have
    /// decided it there: sent and answered inside it (on loopback that is ~0.1 ms either
    /// way; a client or machine stall would otherwise move answers into a later window and
    /// count, at the client, more than any node admitted in one).
    pub(crate) fn max_window(
        &self,
        width: Duration,
        from: Duration,
        to: Duration,
    ) -> (u64, Duration) {
        let mut t: Vec<(Duration, Duration)> = self
            .answers
            .iter()
            .filter(|a| a.ok && a.sent >= from && a.at < to)
            .map(|a| (a.sent, a.at))
            .collect();
        t.sort_unstable();
        let (mut best, mut at) = (0u64, from);
        for (i, &(start, _)) in t.iter().enumerate() {
            let end = start + width;
            let n = t[i..]
                .iter()
                .take_while(|&&(sent, _)| sent < end)
                .filter(|&&(_, answered)| answered < end)
                .count() as u64;
            if n > best {
                best = n;
                at = start;
            }
        }
        (best, at)
    }

    /// The least admitted in any sliding window of `width` that lies within `[from, to)`
    /// (windows stepped every 10 ms). The mirror of [`Record::max_window`]'s rule: an
    /// admission counts in a window when the node may have decided it there, sent before
    /// the window ends and answered after it starts. A stall of the machine or the client
    /// moves answers past a window's end without any node refusing them; counted at the
    /// answer alone, a 60 ms stall read as a 6 % dip in the busy key's admission.
    pub(crate) fn min_window(
        &self,
        width: Duration,
        from: Duration,
        to: Duration,
    ) -> (u64, Duration) {
        let mut t: Vec<(Duration, Duration)> = self
            .answers
            .iter()
            .filter(|a| a.ok)
            .map(|a| (a.sent, a.at))
            .collect();
        // By answer: those answered before a window starts are the prefix to skip; the
        // window's count is then the answered-after-start ones sent before its end.
        t.sort_unstable_by_key(|&(_, at)| at);
        // Only answers within the longest wait of the window's end can have been sent in it.
        let wait = t
            .iter()
            .map(|&(sent, at)| at - sent)
            .max()
            .unwrap_or_default();
        let mut best = (u64::MAX, from);
        let mut s = from;
        while s + width <= to {
            let lo = t.partition_point(|&(_, at)| at < s);
            let hi = t.partition_point(|&(_, at)| at <= s + width + wait);
            let n = t[lo..hi]
                .iter()
                .filter(|&&(sent, _)| sent < s + width)
                .count() as u64;
            if n < best.0 {
                best = (n, s);
            }
            s += Duration::from_millis(10);
        }
        best
    }

    /// What was sent in the `width` from `from`, and of it what was admitted and refused
    /// (per node): tells a dip the nodes made (refusals) from one the client made (fewer
    /// sent).
    pub(crate) fn sent_in(&self, from: Duration, width: Duration) -> String {
        let inside: Vec<&Answer> = self
            .answers
            .iter()
            .filter(|a| a.sent >= from && a.sent < from + width)
            .collect();
        let nodes = inside.iter().map(|a| a.node + 1).max().unwrap_or(0);
        let mut refused = vec![0u64; nodes];
        for a in inside.iter().filter(|a| !a.ok) {
            refused[a.node] += 1;
        }
        let ok = inside.iter().filter(|a| a.ok).count();
        format!("sent {} admitted {ok} refused {refused:?}", inside.len())
    }

    /// Admitted within `[from, to)`.
    pub(crate) fn admitted_in(&self, from: Duration, to: Duration) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.ok && a.at >= from && a.at < to)
            .count() as u64
    }

    /// Answered (admitted or refused) within `[from, to)`.
    pub(crate) fn answered_in(&self, from: Duration, to: Duration) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.at >= from && a.at < to)
            .count() as u64
    }

    /// Over-throttling within `[from, to)` given what was asked: the fraction of
    /// `min(asked, L)` per second that was not admitted (whole seconds from `from`).
    pub(crate) fn over_throttling(&self, from: Duration, to: Duration, limit: f64) -> f64 {
        let (mut missing, mut wanted) = (0.0, 0.0);
        let mut s = from;
        while s + Duration::from_secs(1) <= to {
            let e = s + Duration::from_secs(1);
            let asked = self.answered_in(s, e) as f64;
            let got = self.admitted_in(s, e) as f64;
            let want = asked.min(limit);
            wanted += want;
            missing += (want - got).max(0.0);
            s = e;
        }
        if wanted == 0.0 { 0.0 } else { missing / wanted }
    }

    /// The first instant after `from` from which every sliding 1 s window up to `to`
    /// admits at least `floor`.
    pub(crate) fn recovered_at(
        &self,
        from: Duration,
        to: Duration,
        floor: u64,
    ) -> Option<Duration> {
        let t = self.admitted();
        let w = Duration::from_secs(1);
        let mut s = to.checked_sub(w)?;
        let mut last_ok = None;
        // Walk back from the end while windows hold the floor.
        while s >= from {
            let lo = t.partition_point(|&a| a < s);
            let hi = t.partition_point(|&a| a < s + w);
            if ((hi - lo) as u64) < floor {
                break;
            }
            last_ok = Some(s);
            match s.checked_sub(Duration::from_millis(10)) {
                Some(p) => s = p,
                None => break,
            }
        }
        last_ok
    }
}

/// Prints one scenario's line of results.
pub(crate) fn report(name: &str, fields: &[(&str, String)]) {
    let mut line = format!("chaos {name}:");
    for (k, v) in fields {
        line.push_str(&format!(" {k}={v}"));
    }
    eprintln!("{line}");
}

/// Datagrams the kernel dropped at the UDP socket bound to 127.0.0.1:`port` (its receive
/// buffer was full), from `/proc/net/udp`.
pub(crate) fn udp_drops(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    let want = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&want.as_str())).then(|| f.last()?.parse().ok())?
    })
}

impl Cluster {
    /// The peer (UDP) port of node `id`.
    pub(crate) fn peer_port(&self, id: usize) -> u16 {
        self.peers[id].port()
    }
}

/// Cuts between nodes' peer sockets with iptables on loopback: a chain of this process's
/// own, jumped to from INPUT, flushed and removed when dropped.
pub(crate) struct Cuts {
    chain: String,
}

impl Cuts {
    /// `None` (with a note) where iptables cannot be used (not root, no netfilter).
    pub(crate) fn new() -> Option<Self> {
        let chain = format!("SLUICE_CHAOS_{}", std::process::id());
        let ok = |args: &[&str]| {
            Command::new("iptables")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ok(&["-N", &chain]) {
            eprintln!("chaos: iptables is not usable here (install it and run as root): skipped");
            return None;
        }
        if !ok(&["-I", "INPUT", "-j", &chain]) {
            ok(&["-X", &chain]);
            eprintln!("chaos: cannot hook an iptables chain into INPUT: skipped");
            return None;
        }
        Some(Self { chain })
    }

    fn rule(&self, from: u16, to: u16, probability: Option<f64>) {
        let (f, t) = (from.to_string(), to.to_string());
        let mut args = vec!["-A", &self.chain, "-p", "udp", "--sport", &f, "--dport", &t];
        let p = probability.map(|p| format!("{p}"));
        if let Some(p) = &p {
            args.extend(["-m", "statistic", "--mode", "random", "--probability", p]);
        }
        args.extend(["-j", "DROP"]);
        let s = Command::new("iptables").args(&args).status().unwrap();
        assert!(s.success(), "iptables {args:?}");
    }

    /// Drops every datagram between the two groups, both ways.
    pub(crate) fn cut(&self, c: &Cluster, a: &[usize], b: &[usize]) {
        for &i in a {
            for &j in b {
                self.rule(c.peer_port(i), c.peer_port(j), None);
                self.rule(c.peer_port(j), c.peer_port(i), None);
            }
        }
    }

    /// Drops datagrams from `from` to `to` (one way) with probability `p`.
    pub(crate) fn lose(&self, c: &Cluster, from: usize, to: usize, p: f64) {
        self.rule(c.peer_port(from), c.peer_port(to), Some(p));
    }

    /// Removes every cut.
    pub(crate) fn heal(&self) {
        let _ = Command::new("iptables").args(["-F", &self.chain]).status();
    }
}

impl Drop for Cuts {
    fn drop(&mut self) {
        let q = |args: &[&str]| {
            let _ = Command::new("iptables")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        q(&["-F", &self.chain]);
        q(&["-D", "INPUT", "-j", &self.chain]);
        q(&["-X", &self.chain]);
    }
}
