//! Partition tests of the real cluster driver (issue 4): the [`Cluster`] that `sluice serve`
//! runs — its engine, [`Shares`](sluice_server::shares::Shares), leases, fallback and the
//! HMAC-framed datagrams of `peer` — on a simulated network (turmoil: seeded, deterministic,
//! virtual time, one thread), through the driver's [`Transport`] seam.
//!
//! Every node is a simulated host running the driver, an engine fed with requests as the
//! daemon's gRPC and HTTP shells feed it (one `should_rate_limit` per request, so demand
//! reaches the driver through the engine's hit counts), and a status probe. Between two
//! steps of 1 ms of simulated time the test reads what every engine enforces for the key
//! (its share in capacity units, [`SCALE`] = the whole limit) and checks the guarantees:
//!
//! * strict fallbacks (`none`, `reserved:F`): the sum of enforced shares never exceeds the
//!   limit `L`, at every step, through partitions, asymmetric loss, crashes and restarts
//!   (seed 003 §IV conservation, carried by `sluice-coord`'s leases: the holder stops before
//!   a quorum fences it and an audit mints its share again);
//! * a node cut off from a quorum enforces its fallback within a lease; the quorum's side
//!   holds the cut-off node's share (less its reservation) once its audit minted it again
//!   (`lease·(1+ρ)²` and ten cycles: [`reclaim_bound`]);
//! * after healing, the sum is back at `L` within a lease and a few cycles, and the shares
//!   follow demand again (seed 003 §III-A: indicators equalise);
//! * `last-share` trades the limit for availability: the cut-off node keeps enforcing its
//!   share while the quorum's side mints it again, so the sum exceeds `L` by at most that
//!   share, until the partition heals;
//! * a crashed node's capacity is back with the survivors within [`reclaim_bound`], and
//!   `gamma: auto` follows the membership: on a complete graph the survivors recompute γ* for
//!   K_{n−1} (seed 000 Thm 2, capped by seed 003 eq. 15);
//! * after every node restarts at once, the cluster takes its whole limit back (the audit,
//!   once the restarted nodes' quarantine is over);
//! * keys busy when a node crashed are reclaimed once idle, like any other: every driver
//!   drops them (node state and engine share table), and a key that comes back starts from
//!   the static split, as a key never seen does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, UNIX_EPOCH};

use sluice_coord::node::Fallback;
use sluice_coord::stability::max_gain;
use sluice_graph::{Topology, auto_gamma};
use sluice_server::cluster::{Cluster, ClusterSpec, PeerSpec};
use sluice_server::config::Fairness;
use sluice_server::peer::{PeerKey, Transport};
use sluice_server::shares::{SCALE, cluster_key};
use sluice_server::status::{ClusterInfo, ClusterStatus};
use sluice_server::{Code, Config, Descriptor, Engine, Request};

const PORT: u16 = 8082;
/// The rule's limit, requests per second.
const LIMIT: u64 = 1_000;
const CYCLE: Duration = Duration::from_millis(50);
const LEASE: Duration = Duration::from_millis(500);
/// One step of simulated time: the sampling period of the checks.
const STEP: Duration = Duration::from_millis(1);

/// How long the survivors take to hold a dead or cut-off node's share again
/// (docs/PROTOCOL.md, "Liveness"): `lease·(1+ρ)²` until every member votes, ten cycles for
/// the votes and the audit's two waves, and a few datagrams of 1–3 ms.
fn reclaim_bound() -> Duration {
    LEASE.mul_f64(1.001 * 1.001) + CYCLE * 10 + Duration::from_millis(15)
}

fn config() -> Config {
    Config::from_yaml(
        "partition.yaml",
        &format!(
            "
domain: api
descriptors:
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: {LIMIT}
      algorithm: gcra
      burst: 50
      coordination: cluster
      # The shares these tests predict are seed 000 Case I's (`equalised`).
      fairness: throttled
"
        ),
    )
    .unwrap()
}

fn key() -> u64 {
    Fairness::Throttled.key(cluster_key("api", [("tenant", "acme")]))
}

/// Loss per direction `(from, to)`, drawn from one seeded generator (splitmix64), so a run
/// is the same for the same seed.
#[derive(Debug, Default)]
struct Loss {
    p: BTreeMap<(IpAddr, IpAddr), f64>,
    state: u64,
}

impl Loss {
    fn lost(&mut self, from: IpAddr, to: IpAddr) -> bool {
        let Some(&p) = self.p.get(&(from, to)) else {
            return false;
        };
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// The simulated network's socket behind the driver's transport seam, with per-direction
/// loss (turmoil's own loss model flaps whole links; asymmetric loss needs directions).
#[derive(Debug)]
struct SimUdp {
    socket: turmoil::net::UdpSocket,
    me: IpAddr,
    loss: Arc<Mutex<Loss>>,
}

impl Transport for SimUdp {
    async fn send_to(&self, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
        if self.loss.lock().unwrap().lost(self.me, to.ip()) {
            // Lost in the network: the sender cannot tell.
            return Ok(datagram.len());
        }
        self.socket.send_to(datagram, to).await
    }

    async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.socket.recv_from(buf).await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }
}

/// What the test sets and reads on one node (shared with its host's tasks).
#[derive(Debug, Default)]
struct Ctl {
    /// Offered requests per second (tenant `acme`, the key most tests watch).
    rate: Cell<f64>,
    /// Offered requests per second of other tenants of the same rule (other keys).
    tenants: RefCell<BTreeMap<String, f64>>,
    /// Weak: only the host's own tasks keep the driver (and its socket) alive, so a crash
    /// drops them inside the simulation, which unbinds the port for the restart.
    cluster: RefCell<Weak<Cluster<SimUdp>>>,
    /// The node's `/v1/cluster`, refreshed every 10 ms inside its host (its clock is the
    /// host's).
    status: RefCell<Option<ClusterStatus>>,
    admitted: Cell<u64>,
    refused: Cell<u64>,
    /// Starts of the host: a restart is a new incarnation, as `--state-file` makes it.
    starts: Cell<u64>,
}

struct Net<'a> {
    sim: turmoil::Sim<'a>,
    names: Vec<String>,
    ips: Vec<IpAddr>,
    ctl: Vec<Rc<Ctl>>,
    loss: Arc<Mutex<Loss>>,
    crashed: BTreeSet<usize>,
    /// Each node's state file (`--state-file`): the daemon records reincarnations there.
    state_dir: std::path::PathBuf,
}

impl Drop for Net<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// What every running engine enforces for the key now, capacity units (`None`: crashed).
#[derive(Debug, Clone)]
struct Sample {
    t: Duration,
    units: Vec<Option<u64>>,
}

impl Sample {
    fn sum(&self) -> u64 {
        self.units.iter().flatten().sum()
    }

    fn of(&self, i: usize) -> u64 {
        self.units[i].unwrap_or(0)
    }
}

/// The key of tenant `t` (a descriptor value of the rule).
fn tenant_key(t: &str) -> u64 {
    Fairness::Throttled.key(cluster_key("api", [("tenant", t)]))
}

fn request(tenant: &str) -> Request {
    Request::new("api", [Descriptor::new([("tenant", tenant)])])
}

/// Decides `owed` requests of `req` (whole ones; the fraction stays owed).
fn decide(engine: &Engine, ctl: &Ctl, req: &Request, owed: &mut f64) {
    while *owed >= 1.0 {
        *owed -= 1.0;
        let now = turmoil::since_epoch().unwrap().as_nanos() as u64;
        match engine.should_rate_limit(now, req).unwrap().overall_code {
            Code::Ok => ctl.admitted.set(ctl.admitted.get() + 1),
            Code::OverLimit => ctl.refused.set(ctl.refused.get() + 1),
        }
    }
}

async fn offer(engine: &Engine, ctl: &Ctl) {
    let req = request("acme");
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut owed = 0.0;
    let mut others: BTreeMap<String, (Request, f64)> = BTreeMap::new();
    loop {
        tick.tick().await;
        owed += ctl.rate.get() * 0.005;
        decide(engine, ctl, &req, &mut owed);
        for (t, &rate) in ctl.tenants.borrow().iter() {
            let (req, owed) = others.entry(t.clone()).or_insert_with(|| (request(t), 0.0));
            *owed += rate * 0.005;
            decide(engine, ctl, req, owed);
        }
    }
}

impl<'a> Net<'a> {
    /// `n` nodes, every one linked to every other (the default topology), `gamma: auto`.
    fn new(n: usize, fallback: Fallback, seed: u64) -> Self {
        Self::with_spec(n, fallback, seed, |_| {})
    }

    /// [`Net::new`], with `tweak` applied to every node's spec.
    fn with_spec(
        n: usize,
        fallback: Fallback,
        seed: u64,
        tweak: impl Fn(&mut ClusterSpec),
    ) -> Self {
        let mut sim = turmoil::Builder::new()
            .simulation_duration(Duration::from_secs(600))
            .tick_duration(STEP)
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(3))
            .epoch(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
            .rng_seed(seed)
            .build();
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let ips: Vec<IpAddr> = names.iter().map(|h| sim.lookup(h.clone())).collect();
        let loss = Arc::new(Mutex::new(Loss {
            p: BTreeMap::new(),
            state: seed,
        }));
        let peer_key = PeerKey::from_text("partition-test-key-0123456789abcdef").unwrap();
        let mut ctl = Vec::new();
        static NETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let state_dir = std::env::temp_dir().join(format!(
            "sluice-partition-{}-{}",
            std::process::id(),
            NETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&state_dir).unwrap();
        for i in 0..n {
            let peers = (0..n)
                .filter(|&j| j != i)
                .map(|j| PeerSpec {
                    id: j as u32,
                    addr: SocketAddr::new(ips[j], PORT).into(),
                    weight: 1.0,
                })
                .collect();
            let mut spec = ClusterSpec::new(i as u32, peers, peer_key.clone());
            spec.cycle = CYCLE;
            spec.lease = LEASE;
            spec.fallback = fallback;
            spec.state_file = Some(state_dir.join(format!("node{i}")));
            tweak(&mut spec);
            let c = Rc::new(Ctl::default());
            ctl.push(c.clone());
            let (me, loss) = (ips[i], loss.clone());
            sim.host(names[i].clone(), move || {
                let (c, loss, mut spec) = (c.clone(), loss.clone(), spec.clone());
                async move {
                    c.starts.set(c.starts.get() + 1);
                    spec.incarnation = c.starts.get();
                    let socket = turmoil::net::UdpSocket::bind(SocketAddr::new(
                        Ipv4Addr::UNSPECIFIED.into(),
                        PORT,
                    ))
                    .await?;
                    let engine = Arc::new(Engine::new(config()));
                    let cluster = Cluster::new(&spec, SimUdp { socket, me, loss }, &engine)?;
                    *c.cluster.borrow_mut() = Arc::downgrade(&cluster);
                    let probe = async {
                        loop {
                            *c.status.borrow_mut() = Some(cluster.status(usize::MAX));
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    };
                    tokio::select! {
                        biased;
                        r = cluster.clone().run(std::future::pending()) => r?,
                        () = offer(&engine, &c) => {}
                        () = probe => {}
                    }
                    Ok(())
                }
            });
        }
        Self {
            sim,
            names,
            ips,
            ctl,
            loss,
            crashed: BTreeSet::new(),
            state_dir,
        }
    }

    /// The incarnation node `i` last recorded in its state file.
    fn persisted(&self, i: usize) -> Option<u64> {
        std::fs::read_to_string(self.state_dir.join(format!("node{i}")))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    fn set_rates(&self, rates: &[f64]) {
        for (c, r) in self.ctl.iter().zip(rates) {
            c.rate.set(r * LIMIT as f64);
        }
    }

    /// Sets the offered rates of other tenants at node `i`, fractions of the limit.
    fn set_tenant_rates(&self, i: usize, rates: &[(&str, f64)]) {
        let mut t = self.ctl[i].tenants.borrow_mut();
        for &(name, r) in rates {
            t.insert(name.to_string(), r * LIMIT as f64);
        }
    }

    /// Stops every node's traffic, on every key.
    fn stop_traffic(&self) {
        for c in &self.ctl {
            c.rate.set(0.0);
            for r in c.tenants.borrow_mut().values_mut() {
                *r = 0.0;
            }
        }
    }

    /// What every running engine enforces for `key` now.
    fn sample_key(&self, key: u64) -> Sample {
        let units = self
            .ctl
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if self.crashed.contains(&i) {
                    return None;
                }
                c.cluster
                    .borrow()
                    .upgrade()
                    .map(|cl| cl.shares().units(key))
            })
            .collect();
        Sample {
            t: self.sim.elapsed(),
            units,
        }
    }

    /// Runs for `d`, checking `check` after every step; returns the samples.
    fn run(&mut self, d: Duration, mut check: impl FnMut(&Sample)) -> Vec<Sample> {
        let mut out = Vec::new();
        self.run_keys(d, &[key()], |_, s| {
            check(&s[0]);
            out.push(s[0].clone());
            false
        });
        out
    }

    /// Runs for at most `d`, calling `check` after every step with a sample of each of `keys`
    /// (in order), until it returns `true`; returns when it did.
    fn run_keys(
        &mut self,
        d: Duration,
        keys: &[u64],
        mut check: impl FnMut(&Self, &[Sample]) -> bool,
    ) -> Option<Duration> {
        let end = self.sim.elapsed() + d;
        while self.sim.elapsed() < end {
            self.sim.step().unwrap();
            let s: Vec<Sample> = keys.iter().map(|&k| self.sample_key(k)).collect();
            if check(self, &s) {
                return Some(self.sim.elapsed());
            }
        }
        None
    }

    /// How many keys node `i` holds state for: (in its `sluice-coord` node, as `/v1/cluster`
    /// lists them; in its engine's share table). `None` while it is down.
    fn keys_held(&self, i: usize) -> Option<(usize, usize)> {
        if self.crashed.contains(&i) {
            return None;
        }
        let status = self.ctl[i].status.borrow().as_ref()?.keys.len();
        let shares = self.ctl[i].cluster.borrow().upgrade()?.shares().len();
        Some((status, shares))
    }

    /// The units node `i`'s engine enforces for a key it holds no state for (its static
    /// split; the fallback once its lease expired).
    fn default_units(&self, i: usize) -> u64 {
        self.ctl[i]
            .cluster
            .borrow()
            .upgrade()
            .unwrap()
            .shares()
            .default_units()
    }

    fn status(&self, i: usize) -> ClusterStatus {
        self.ctl[i].status.borrow().clone().unwrap()
    }

    /// Cuts `a` from `b` in both directions.
    fn partition(&self, a: &[usize], b: &[usize]) {
        for &x in a {
            for &y in b {
                self.sim
                    .partition(self.names[x].clone(), self.names[y].clone());
            }
        }
    }

    fn repair(&self, a: &[usize], b: &[usize]) {
        for &x in a {
            for &y in b {
                self.sim
                    .repair(self.names[x].clone(), self.names[y].clone());
            }
        }
    }

    fn set_loss(&self, from: usize, to: usize, p: f64) {
        self.loss
            .lock()
            .unwrap()
            .p
            .insert((self.ips[from], self.ips[to]), p);
    }

    fn crash(&mut self, i: usize) {
        self.sim.crash(self.names[i].clone());
        self.crashed.insert(i);
        self.ctl[i].status.borrow_mut().take();
    }

    fn restart(&mut self, i: usize) {
        self.sim.bounce(self.names[i].clone());
        self.crashed.remove(&i);
    }
}

/// The sum never exceeds the limit (a check for every step).
fn strict(s: &Sample) {
    assert!(
        s.sum() <= SCALE,
        "at {:?} the engines enforce {} > {SCALE} units: {:?}",
        s.t,
        s.sum(),
        s.units
    );
}

/// How long after `from` the sum is back at the limit to stay: the end of the last cycle
/// (a window of [`CYCLE`] from `from` on) in which no sample reached `frac` of the limit.
///
/// Per cycle, not per sample: a gift travels for a few milliseconds, and while it does
/// the giver no longer holds it and the receiver not yet (seed 003 §IV: Σ own = L − the
/// capacity in flight), so single samples dip by the size of the gifts in flight even in a
/// converged cluster. `None` if the last window is still short of it.
fn settles(samples: &[Sample], from: Duration, frac: f64) -> Option<Duration> {
    let floor = (SCALE as f64 * frac) as u64;
    let mut windows: BTreeMap<u128, u64> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.t > from) {
        let w = (s.t - from).as_nanos() / CYCLE.as_nanos();
        let e = windows.entry(w).or_insert(0);
        *e = (*e).max(s.sum());
    }
    let (_, &best) = windows.iter().next_back()?;
    if best < floor {
        return None;
    }
    let short = windows
        .iter()
        .rev()
        .find(|(_, m)| **m < floor)
        .map(|(w, _)| *w);
    Some(match short {
        None => Duration::ZERO,
        Some(w) => CYCLE * (u32::try_from(w).unwrap() + 1),
    })
}

/// The lowest sum in the samples, as a fraction of the limit (the gifts in flight at worst).
fn lowest(samples: &[Sample]) -> f64 {
    samples.iter().map(Sample::sum).min().unwrap_or(0) as f64 / SCALE as f64
}

/// How long after `from` every node's share is within 0.05 of the limit of what demand
/// says (seed 000 eq. 3 equilibrium) to stay: the time of the last sample off by more.
fn rebalanced(samples: &[Sample], from: Duration, rates: &[f64]) -> Duration {
    let want = equalised(rates);
    let off = |s: &Sample| {
        want.iter()
            .enumerate()
            .any(|(i, w)| (share(s, i) - w).abs() > 0.05)
    };
    samples
        .iter()
        .rev()
        .find(|s| s.t > from && off(s))
        .map_or(Duration::ZERO, |s| s.t + STEP - from)
}

fn share(s: &Sample, i: usize) -> f64 {
    s.of(i) as f64 / SCALE as f64
}

/// Seed 000 eq. 3 in overload (Case I): throttling `r_i − x_i` equalises, so
/// `x_i = r_i − (Σr − 1)/n` (all fractions of the limit; every node above it here).
fn equalised(rates: &[f64]) -> Vec<f64> {
    let excess = (rates.iter().sum::<f64>() - 1.0) / rates.len() as f64;
    rates.iter().map(|r| r - excess).collect()
}

fn assert_follows_demand(s: &Sample, rates: &[f64]) {
    let want = equalised(rates);
    for (i, w) in want.iter().enumerate() {
        let got = share(s, i);
        assert!(
            (got - w).abs() < 0.05,
            "node {i} holds {got:.3} of the limit, demand says {w:.3}: {:?}",
            s.units
        );
    }
}

const RATES: [f64; 3] = [0.6, 0.5, 0.4];

/// The partition scenario for a strict fallback: {0} | {1, 2} for six leases, then heal.
/// Returns (time for {1,2} to hold what 0 gave up, time for the sum to be back at L after
/// healing).
fn minority_partition_strict(fallback: Fallback, reserved: f64) -> (Duration, Duration) {
    let mut net = Net::new(3, fallback, 7);
    net.set_rates(&RATES);
    let warm = net.run(Duration::from_secs(3), strict);
    let before = warm.last().unwrap().clone();
    assert!(before.sum() as f64 >= 0.99 * SCALE as f64, "{before:?}");
    assert_follows_demand(&before, &RATES);
    // Node 0's reservation, units: what it keeps, and what the audit does not mint.
    let reservation = (reserved * (SCALE / 3) as f64) as u64;

    let cut = net.sim.elapsed();
    net.partition(&[0], &[1, 2]);
    let during = net.run(LEASE * 6, |s| {
        strict(s);
        // Within a lease of the cut, node 0 (no quorum) enforces only its fallback.
        if s.t >= cut + LEASE {
            assert!(
                s.of(0) <= reservation,
                "at {:?} (cut at {cut:?}) node 0 still enforces {} units",
                s.t,
                s.of(0)
            );
        }
    });
    // The majority side holds what node 0 held, less its reservation, minted again.
    let floor = SCALE - reservation - SCALE / 1000;
    let inherited = during
        .iter()
        .find(|s| s.of(1) + s.of(2) >= floor)
        .map(|s| s.t - cut)
        .expect("the majority holds node 0's share again");
    let last = during.last().unwrap();
    assert!(last.of(1) + last.of(2) >= floor, "{last:?}");

    let heal = net.sim.elapsed();
    net.repair(&[0], &[1, 2]);
    let after = net.run(Duration::from_secs(5), strict);
    let back = settles(&after, heal, 0.999).expect("the sum gets back to the limit");
    assert!(
        back <= LEASE + CYCLE * 6,
        "back at the limit {back:?} after healing"
    );
    assert_follows_demand(after.last().unwrap(), &RATES);
    // Node 0 comes back as a new incarnation holding its reservation and earns its share
    // by the law again.
    let follows = rebalanced(&after, heal, &RATES);
    assert!(
        follows <= LEASE * 2,
        "shares follow demand {follows:?} after healing"
    );
    let dip = lowest(&after[after.len() / 2..]);
    // The minority came back as a new incarnation: it was fenced (or long without a lease).
    assert!(net.status(0).incarnation > 1, "{:?}", net.status(0));
    // And recorded it, so a restart comes back above it (`--state-file`).
    assert_eq!(net.persisted(0), Some(net.status(0).incarnation));
    eprintln!(
        "{fallback:?}: majority holds L - reservation {inherited:?} after the cut; sum at L \
         {back:?} and shares following demand {follows:?} after healing (lowest single \
         sample once converged: {dip:.4} L, gifts in flight); final shares {:?}",
        after.last().unwrap().units
    );
    (inherited, back)
}

/// Strict `none`: a node cut off from a quorum admits nothing after a lease; the limit
/// holds at every millisecond, and the cluster comes back to the whole limit, divided by
/// demand.
#[test]
fn minority_partition_fallback_none() {
    let (inherited, _) = minority_partition_strict(Fallback::None, 0.0);
    assert!(inherited <= reclaim_bound(), "{inherited:?}");
}

/// Strict `reserved:F`: the cut-off node keeps its reservation, never minted again by an
/// audit, so the limit still holds.
#[test]
fn minority_partition_fallback_reserved() {
    let (inherited, _) = minority_partition_strict(Fallback::Reserved(0.2), 0.2);
    assert!(inherited <= reclaim_bound(), "{inherited:?}");
}

/// `last-share` trades the limit for availability (documented in `Fallback::LastShare`):
/// the cut-off node keeps enforcing its last share while the majority mints it again, so
/// the sum exceeds the limit — by at most that share — until the partition heals; after
/// healing the node learns it was fenced and the limit holds again.
#[test]
fn minority_partition_last_share_keeps_its_share() {
    let mut net = Net::new(3, Fallback::LastShare, 7);
    net.set_rates(&RATES);
    let warm = net.run(Duration::from_secs(3), strict);
    let at_cut = warm.last().unwrap().clone();
    let cut = net.sim.elapsed();
    net.partition(&[0], &[1, 2]);
    let kept = at_cut.of(0);
    let mut worst = 0u64;
    net.run(LEASE * 6, |s| {
        // Availability: node 0 keeps enforcing (about) what it held.
        if s.t >= cut + CYCLE {
            assert!(
                s.of(0) as f64 >= 0.9 * kept as f64,
                "node 0 dropped to {} units from {kept}",
                s.of(0)
            );
        }
        // The price, bounded: at most node 0's share over the limit.
        assert!(s.sum() <= SCALE + s.of(0), "{s:?}");
        worst = worst.max(s.sum());
    });
    assert!(
        worst > SCALE,
        "last-share is expected to exceed the limit here (its documented trade-off)"
    );
    let heal = net.sim.elapsed();
    net.repair(&[0], &[1, 2]);
    // Once node 0 hears of its fence it is a new incarnation holding nothing shared.
    let after = net.run(Duration::from_secs(5), |s| {
        if s.t >= heal + LEASE {
            strict(s);
        }
    });
    let back = settles(&after, heal, 0.999).expect("the sum gets back to the limit");
    let strict_again = after
        .iter()
        .rev()
        .find(|s| s.sum() > SCALE)
        .map_or(Duration::ZERO, |s| s.t + STEP - heal);
    assert_follows_demand(after.last().unwrap(), &RATES);
    eprintln!(
        "last-share: node 0 kept {kept} units; sum peaked at {:.3} L during the partition; \
         at most L again {strict_again:?} after healing, at L {back:?}",
        worst as f64 / SCALE as f64
    );
}

/// Asymmetric failures: node 0's datagrams to node 1 are all lost while node 1's reach it
/// (node 0 still hears a quorum: node 2's echoes keep its lease), then lossy links in both
/// directions with different rates. Strict: the limit holds at every step; with the links
/// back the sum returns to the limit.
#[test]
fn asymmetric_loss_keeps_the_limit() {
    let mut net = Net::new(3, Fallback::Reserved(0.1), 11);
    net.set_rates(&RATES);
    net.run(Duration::from_secs(3), strict);
    // One way: 0 → 1 cut, 1 → 0 fine. Node 1 votes against node 0 (it hears nothing),
    // node 2 does not: no fence, and node 0 keeps its lease from node 2's echoes.
    net.set_loss(0, 1, 1.0);
    let cut = net.sim.elapsed();
    net.run(LEASE * 4, |s| {
        strict(s);
        if s.t >= cut + LEASE {
            assert!(s.of(0) > SCALE / 10, "node 0 enforces only {}", s.of(0));
        }
    });
    // Lossy, asymmetric: 30% of 0 → 1, 10% of 1 → 0, 20% of 2 → 0.
    net.set_loss(0, 1, 0.3);
    net.set_loss(1, 0, 0.1);
    net.set_loss(2, 0, 0.2);
    let lossy = net.run(Duration::from_secs(6), strict);
    let tail = &lossy[lossy.len() / 2..];
    let mean = tail.iter().map(|s| s.sum() as f64).sum::<f64>() / tail.len() as f64 / SCALE as f64;
    assert!(
        mean >= 0.95,
        "under loss the cluster enforces {mean:.3} of the limit"
    );
    net.set_loss(0, 1, 0.0);
    net.set_loss(1, 0, 0.0);
    net.set_loss(2, 0, 0.0);
    let heal = net.sim.elapsed();
    let after = net.run(Duration::from_secs(3), strict);
    let back = settles(&after, heal, 0.999).expect("the sum gets back to the limit");
    assert_follows_demand(after.last().unwrap(), &RATES);
    eprintln!("asymmetric loss: mean sum {mean:.4} L under 10–30% loss; back {back:?} after");
}

/// The gain `gamma: auto` gives a complete graph of `n` nodes (seed 000 Thm 2's
/// 2/(λ₂+λₙ), capped by seed 003 eq. 15 at 1/(2(n−1))).
fn complete_gain(n: usize) -> f64 {
    let g = auto_gamma(&Topology::complete(n).unwrap()).unwrap();
    g.min(max_gain(
        &sluice_coord::law::Measure::Throttled,
        (n - 1) as f64,
    ))
}

/// A node crashes (its host stops): the survivors regain its capacity within
/// [`reclaim_bound`] (a quorum fences it, an audit mints its share again), `gamma: auto` is
/// recomputed for K_{n−1}, and the node restarted as a new incarnation takes part again —
/// the limit holding at every step throughout.
#[test]
fn crash_survivors_regain_capacity_and_gamma_follows() {
    let n = 5;
    let rates = [0.5, 0.4, 0.3, 0.3, 0.2];
    let mut net = Net::new(n, Fallback::None, 3);
    net.set_rates(&rates);
    net.run(Duration::from_secs(3), strict);
    let g5 = complete_gain(5);
    let g4 = complete_gain(4);
    assert_ne!(g5, g4);
    for i in 0..n {
        let s = net.status(i);
        assert!((s.gamma - g5).abs() < 1e-12, "{s:?}");
        assert_eq!(s.gamma_auto, Some(s.gamma));
    }

    let crash = net.sim.elapsed();
    net.crash(4);
    let after = net.run(LEASE * 4, strict);
    let floor = SCALE - SCALE / 1000;
    let regained = after
        .iter()
        .find(|s| s.sum() >= floor)
        .map(|s| s.t - crash)
        .expect("the survivors regain the crashed node's share");
    assert!(
        regained <= reclaim_bound(),
        "survivors back at the limit {regained:?} after the crash"
    );
    for i in 0..n - 1 {
        let s = net.status(i);
        assert_eq!(s.live_members, vec![0, 1, 2, 3], "{s:?}");
        let got = s.gamma_auto.unwrap();
        assert!(
            (got - g4).abs() < 1e-12,
            "node {i}: gamma_auto {got} after the crash, K_4 gives {g4}"
        );
        // And the node gives with it (`Node::set_gamma`, checked on the live degree).
        assert!(
            (s.gamma - g4).abs() < 1e-12,
            "node {i}: gamma in use {} after the crash, K_4 gives {g4}",
            s.gamma
        );
    }

    let restart = net.sim.elapsed();
    net.restart(4);
    let back = net.run(Duration::from_secs(4), strict);
    assert!(net.status(4).incarnation >= 2, "{:?}", net.status(4));
    let last = back.last().unwrap();
    assert!(
        share(last, 4) > 0.05,
        "the restarted node gets capacity back: {last:?}"
    );
    for i in 0..n {
        let s = net.status(i);
        assert_eq!(s.gamma_auto, Some(g5), "node {i} back on K_5: {s:?}");
        assert!(
            (s.gamma - g5).abs() < 1e-12,
            "node {i} gives with K_5's gain: {s:?}"
        );
    }
    let settled = settles(&back, restart, 0.999).expect("the sum gets back to the limit");
    let follows = rebalanced(&back, restart, &rates);
    assert!(
        follows <= LEASE * 3,
        "shares follow demand {follows:?} after the restart"
    );
    eprintln!(
        "crash: survivors at the limit {regained:?} after the crash; gamma_auto {g5} -> {g4}; \
         restart: at L {settled:?}, shares following demand {follows:?} after, shares {:?}",
        last.units
    );
}

/// Every node killed at once and restarted as a new incarnation (a power cut, a redeploy
/// that stops every pod; `--state-file` keeps the incarnations): nobody is left to inherit
/// the shares. The restarted nodes hold only their reservations (none here); the capacity
/// audit counts that and its root, node 0, mints the whole limit back (`sluice-coord`'s
/// audit), so the cluster admits its whole limit again — and never more, at every step.
#[test]
fn a_whole_cluster_restart_takes_the_limit_back() {
    let n = 5;
    let rates = [0.5, 0.4, 0.3, 0.3, 0.2];
    let mut net = Net::new(n, Fallback::None, 5);
    net.set_rates(&rates);
    net.run(Duration::from_secs(2), strict);
    for i in 0..n {
        net.crash(i);
    }
    net.run(LEASE, strict);
    let restart = net.sim.elapsed();
    for i in 0..n {
        net.restart(i);
    }
    let back = net.run(Duration::from_secs(4), strict);
    for i in 0..n {
        assert!(net.status(i).incarnation >= 2, "{:?}", net.status(i));
    }
    let settled = settles(&back, restart, 0.999).expect("the sum gets back to the limit");
    let follows = rebalanced(&back, restart, &rates);
    // The root's restarted incarnation minted all of it (its audits before the crash found
    // nothing missing).
    let root = net.status(0);
    assert!(root.audit_rounds >= 1, "{root:?}");
    assert!((root.audit_minted_share - 1.0).abs() < 1e-9, "{root:?}");
    eprintln!(
        "whole restart: at L {settled:?} after the restarts, shares following demand \
         {follows:?}, shares {:?}",
        back.last().unwrap().units
    );
}

/// Node `i`'s initial share of every key, units (`sluice-coord`'s `Config::initial_share`:
/// `L/n`, the remainder to the lowest ids).
fn initial_share(n: usize, i: usize) -> u64 {
    SCALE / n as u64 + u64::from((i as u64) < SCALE % n as u64)
}

/// [`strict`] for every key sampled (a check for [`Net::run_keys`] that never stops).
fn strict_keys(_: &Net<'_>, samples: &[Sample]) -> bool {
    samples.iter().for_each(strict);
    false
}

/// Keys busy when a node crashed are reclaimed once idle, by every driver (docs/PROTOCOL.md
/// "Idle keys": level requests bring every node back to its static split, unbalanced links
/// fold their net into the bases). Twelve tenants of one rule are busy at three nodes each
/// (some keys over their limit, some under) on a complete graph of 5 with `idle_after` 1 s;
/// node 1 crashes while they are busy, the audit mints its share again, node 1 restarts, then all traffic
/// stops. The limit holds for every key at every step; within a deadline every node holds
/// no state for any key (neither its `sluice-coord` node, as `/v1/cluster` lists them, nor
/// its engine's share table: `Ready::reclaimed`); and a reclaimed key that comes back
/// starts from the static split and then moves exactly as a key never seen does, so
/// nothing was lost or counted twice.
///
/// The static split after the crash: the audit's root holds its own initial share and the
/// dead incarnation's, the restarted node only its reservation (none here), the others `L/n`.
#[test]
fn keys_busy_at_a_crash_are_reclaimed_by_every_driver() {
    let n = 5;
    let down = 1;
    let idle_after = Duration::from_secs(1);
    let mut net = Net::with_spec(n, Fallback::None, 13, |s| s.idle_after = idle_after);
    let tenants: Vec<String> = (0..12).map(|j| format!("t{j:02}")).collect();
    // A key never used before the end, to compare a reclaimed key with.
    let fresh = "fresh";
    let keys: Vec<u64> = tenants
        .iter()
        .map(String::as_str)
        .chain([fresh])
        .map(tenant_key)
        .collect();
    // Tenant j at nodes j, j + 2 and j + 3 (mod 5), each offering 0.25–0.55 of the limit:
    // above its static split (0.2), so every node coordinates it (a key its split serves
    // stays off the protocol).
    for (j, t) in tenants.iter().enumerate() {
        let r = 0.25 + 0.1 * (j % 4) as f64;
        for i in [j % n, (j + 2) % n, (j + 3) % n] {
            net.set_tenant_rates(i, &[(t, r)]);
        }
    }
    net.run_keys(Duration::from_secs(2), &keys, strict_keys);
    for i in 0..n {
        let (held, _) = net.keys_held(i).unwrap();
        assert_eq!(held, tenants.len(), "node {i}: {:?}", net.status(i));
    }
    // The busy keys are off the static split at the node about to crash.
    let off = keys[..tenants.len()]
        .iter()
        .filter(|&&k| net.sample_key(k).of(down).abs_diff(initial_share(n, down)) > SCALE / 100)
        .count();
    assert!(
        off >= tenants.len() / 2,
        "only {off} keys off the split at node {down}"
    );
    let crash = net.sim.elapsed();
    net.crash(down);
    net.run_keys(LEASE * 3, &keys, strict_keys);
    // A quorum fenced the dead node and the audit minted its initial share again: what a
    // key without state holds adds up to the whole limit over the survivors.
    let defaults: u64 = (0..n)
        .filter(|&i| i != down)
        .map(|i| net.default_units(i))
        .sum();
    assert_eq!(defaults, SCALE, "node {down}'s initial share minted again");
    net.restart(down);
    net.run_keys(Duration::from_secs(1), &keys, strict_keys);
    assert!(net.status(down).incarnation >= 2, "{:?}", net.status(down));
    let at_stop: Vec<_> = (0..n).map(|i| net.keys_held(i).unwrap()).collect();
    assert!(
        at_stop.iter().all(|&(k, _)| k == tenants.len()),
        "every node holds every busy key when traffic stops: {at_stop:?}"
    );

    let stop = net.sim.elapsed();
    net.stop_traffic();
    // When each node last held some state (None: not since the stop).
    let mut last_held: Vec<Option<Duration>> = vec![None; n];
    let deadline = Duration::from_secs(10);
    let reclaimed = net.run_keys(deadline, &keys, |net, s| {
        strict_keys(net, s);
        let mut done = true;
        for (i, last) in last_held.iter_mut().enumerate() {
            if net.keys_held(i) != Some((0, 0)) {
                *last = Some(s[0].t);
                done = false;
            }
        }
        done
    });
    let Some(reclaimed) = reclaimed else {
        let held: Vec<_> = (0..n)
            .map(|i| {
                let keys = net.status(i).keys.into_iter().map(|k| (k.key, k.share));
                (net.keys_held(i), keys.collect::<Vec<_>>())
            })
            .collect();
        panic!(
            "{deadline:?} after traffic stopped (node {down} crashed at {crash:?}) nodes still \
             hold state; per node (keys in the node, in the share table), the node's keys and \
             shares: {held:?}"
        );
    };
    // Each node's own last moment with state, after the stop.
    let per_node: Vec<Duration> = last_held
        .iter()
        .map(|l| l.map_or(Duration::ZERO, |t| t + STEP - stop))
        .collect();
    // And it stays so: nothing comes back without traffic.
    net.run_keys(Duration::from_secs(1), &keys, |net, s| {
        strict_keys(net, s);
        for i in 0..n {
            assert_eq!(net.keys_held(i), Some((0, 0)), "node {i} at {:?}", s[0].t);
        }
        false
    });

    // The static split, exactly: the initial shares, node `down`'s minted again at the
    // audit's root (the restarted node holds its reservation, none here).
    let split: Vec<u64> = (0..n).map(|i| net.default_units(i)).collect();
    assert_eq!(split[down], 0, "static split after reclamation: {split:?}");
    assert_eq!(split.iter().sum::<u64>(), SCALE, "{split:?}");

    // A reclaimed key that was busy at the crashed node comes back with a fresh key, the same
    // traffic at the same nodes: both start from the static split and stay identical.
    let back = &tenants[1];
    let pair = [tenant_key(back), tenant_key(fresh)];
    for i in [0, down, 3] {
        net.set_tenant_rates(i, &[(back, 0.4), (fresh, 0.4)]);
    }
    let resumed = net.sim.elapsed();
    let mut first: Option<Vec<Sample>> = None;
    let mut sums = Vec::new();
    net.run_keys(Duration::from_secs(2), &pair, |_, s| {
        s.iter().for_each(strict);
        assert_eq!(
            s[0].units, s[1].units,
            "at {:?} the reclaimed key and a fresh one differ",
            s[0].t
        );
        first.get_or_insert_with(|| s.to_vec());
        sums.push(s[0].clone());
        false
    });
    // What the engine's first hits on either key were decided with.
    let first = first.unwrap();
    for s in &first {
        let units: Vec<u64> = s.units.iter().map(|u| u.unwrap()).collect();
        assert_eq!(units, split, "a returning key starts from the static split");
    }
    let settled = settles(&sums, resumed, 0.999).expect("the returning key gets its whole limit");
    eprintln!(
        "busy keys at a crash: node {down} crashed and restarted; keys held \
         (node, share table) when traffic stopped {at_stop:?}; every node without state \
         {:?} after the stop (idle_after {idle_after:?}; per node {per_node:?}); static split \
         after {split:?} units (sum {}); key {back} back from it, identical to a fresh key, \
         Σ at L {settled:?} after, shares after 2 s {:?}",
        reclaimed - stop,
        split.iter().sum::<u64>(),
        sums.last().unwrap().units
    );
}
