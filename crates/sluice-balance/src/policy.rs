//! The routing policies: JSQ (the baseline) and JSQ with job tagging, JSQT (seed 001 §IV-A).
//!
//! A policy owns the per-server counters and answers one question per arrival batch: which
//! server, and is the batch tagged. The caller reports arrivals, departures and slot ends, so
//! the same code drives the slotted simulation and the tower balancer.

use crate::{BalanceError, DriftParams, Farm, Penalty};

/// Whether a job counts as overflow. Tagged jobs may be shed or served last by a backend;
/// untagged jobs have strict priority (seed 001 §IV-A step 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tag {
    /// Counted in N_s: the server is expected to serve it.
    #[default]
    Untagged,
    /// Counted in the virtual queue Y_s: overflow the server may shed first.
    Tagged,
}

/// A routing decision: the server and the tag of the jobs sent there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Server index (0-based), always in the balancer's S_b.
    pub server: usize,
    /// Tag applied to the jobs.
    pub tag: Tag,
}

/// A snapshot of one server's queues, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ServerQueues {
    /// N_s: untagged jobs at the server (for JSQ: all jobs at the server).
    pub untagged: u64,
    /// Y_s: the virtual queue (0 for JSQ).
    pub virtual_queue: f64,
    /// y_s of the last slot: the virtual queue's service (0 for JSQ).
    pub virtual_service: f64,
}

/// A load-balancing policy over a farm.
pub trait Policy {
    /// The farm it balances.
    fn farm(&self) -> &Farm;
    /// Where balancer `balancer` sends jobs arriving now, and with which tag. Never a server
    /// outside S_b.
    fn route(&self, balancer: usize) -> Result<Route, BalanceError>;
    /// The tag server `server` gives to jobs arriving now.
    fn tag_at(&self, server: usize) -> Tag;
    /// `jobs` jobs with `tag` joined `server`.
    fn on_arrival(&mut self, server: usize, jobs: u64, tag: Tag);
    /// `jobs` jobs left `server`, served first-in-first-out: the head-of-line jobs count as
    /// untagged (seed 001 §IV-A remark d).
    fn on_departure(&mut self, server: usize, jobs: u64);
    /// One job whose tag is known finished at `server` (e.g. an HTTP response).
    fn on_complete(&mut self, server: usize, tag: Tag);
    /// The end of a slot: update the virtual queues, eq. (21).
    fn end_slot(&mut self);
    /// Queue snapshot per server.
    fn queues(&self) -> Vec<ServerQueues>;
}

fn argmin_in_reach(
    farm: &Farm,
    balancer: usize,
    key: impl Fn(usize) -> f64,
) -> Result<usize, BalanceError> {
    let reach = farm.reach(balancer);
    let mut best: Option<(usize, f64)> = None;
    for &s in reach {
        let k = key(s);
        // Ties go to the first server of S_b ("ties are broken arbitrarily", §IV-A step 1).
        if best.is_none_or(|(_, bk)| k < bk) {
            best = Some((s, k));
        }
    }
    best.map(|(s, _)| s).ok_or(BalanceError::OutOfRange {
        what: "balancer",
        index: balancer,
        len: farm.balancers(),
    })
}

/// Join-the-shortest-queue: each balancer sends to the reachable server holding the fewest
/// jobs; nothing is tagged (seed 001 §IV, the baseline of §V).
#[derive(Debug, Clone)]
pub struct Jsq {
    farm: Farm,
    jobs: Vec<u64>,
}

impl Jsq {
    /// JSQ over `farm`, all queues empty.
    #[must_use]
    pub fn new(farm: Farm) -> Self {
        let jobs = vec![0; farm.servers()];
        Self { farm, jobs }
    }
}

impl Policy for Jsq {
    fn farm(&self) -> &Farm {
        &self.farm
    }

    fn route(&self, balancer: usize) -> Result<Route, BalanceError> {
        let server = argmin_in_reach(&self.farm, balancer, |s| self.jobs[s] as f64)?;
        Ok(Route {
            server,
            tag: Tag::Untagged,
        })
    }

    fn tag_at(&self, _server: usize) -> Tag {
        Tag::Untagged
    }

    fn on_arrival(&mut self, server: usize, jobs: u64, _tag: Tag) {
        if let Some(n) = self.jobs.get_mut(server) {
            *n += jobs;
        }
    }

    fn on_departure(&mut self, server: usize, jobs: u64) {
        if let Some(n) = self.jobs.get_mut(server) {
            *n = n.saturating_sub(jobs);
        }
    }

    fn on_complete(&mut self, server: usize, _tag: Tag) {
        self.on_departure(server, 1);
    }

    fn end_slot(&mut self) {}

    fn queues(&self) -> Vec<ServerQueues> {
        self.jobs
            .iter()
            .map(|&untagged| ServerQueues {
                untagged,
                ..Default::default()
            })
            .collect()
    }
}

/// JSQ with job tagging (seed 001 §IV-A).
///
/// 1. Server selection: balancer b routes to argmin_{s ∈ S_b} min{N_s, Y_s}.
/// 2. Job tagging: jobs sent to s are tagged iff N_s > Y_s.
/// 3. Virtual queues: N_s follows eq. (16); at each slot end Y_s ← max(Y_s − y_s, 0) + tagged
///    arrivals (eq. 21), with y_s the minimiser of (25)–(26) for the server's penalty.
#[derive(Debug, Clone)]
pub struct Jsqt<P> {
    farm: Farm,
    penalties: Vec<P>,
    params: DriftParams,
    untagged: Vec<u64>,
    virtual_queue: Vec<f64>,
    tagged_in_slot: Vec<u64>,
    virtual_service: Vec<f64>,
}

impl<P: Penalty> Jsqt<P> {
    /// JSQT over `farm` with one penalty per server.
    pub fn new(farm: Farm, penalties: Vec<P>, params: DriftParams) -> Result<Self, BalanceError> {
        let n = farm.servers();
        if penalties.len() != n {
            return Err(BalanceError::BadWeights {
                servers: n,
                got: vec![],
            });
        }
        Ok(Self {
            farm,
            penalties,
            params,
            untagged: vec![0; n],
            virtual_queue: vec![0.0; n],
            tagged_in_slot: vec![0; n],
            virtual_service: vec![0.0; n],
        })
    }

    /// The drift parameters V, y_max, E\[X\].
    #[must_use]
    pub fn params(&self) -> &DriftParams {
        &self.params
    }
}

impl<P: Penalty> Policy for Jsqt<P> {
    fn farm(&self) -> &Farm {
        &self.farm
    }

    fn route(&self, balancer: usize) -> Result<Route, BalanceError> {
        let server = argmin_in_reach(&self.farm, balancer, |s| {
            (self.untagged[s] as f64).min(self.virtual_queue[s])
        })?;
        Ok(Route {
            server,
            tag: self.tag_at(server),
        })
    }

    /// Tagged iff N_s > Y_s (§IV-A step 2).
    fn tag_at(&self, server: usize) -> Tag {
        match (self.untagged.get(server), self.virtual_queue.get(server)) {
            (Some(&n), Some(&y)) if n as f64 > y => Tag::Tagged,
            _ => Tag::Untagged,
        }
    }

    fn on_arrival(&mut self, server: usize, jobs: u64, tag: Tag) {
        let counter = match tag {
            Tag::Untagged => self.untagged.get_mut(server),
            Tag::Tagged => self.tagged_in_slot.get_mut(server),
        };
        if let Some(c) = counter {
            *c += jobs;
        }
    }

    fn on_departure(&mut self, server: usize, jobs: u64) {
        if let Some(n) = self.untagged.get_mut(server) {
            *n = n.saturating_sub(jobs);
        }
    }

    fn on_complete(&mut self, server: usize, tag: Tag) {
        // A tagged job already left the books when it entered Y_s; only N_s tracks jobs.
        if tag == Tag::Untagged {
            self.on_departure(server, 1);
        }
    }

    fn end_slot(&mut self) {
        for s in 0..self.untagged.len() {
            let y = self.penalties[s].drift_minimiser(self.virtual_queue[s], &self.params);
            self.virtual_service[s] = y;
            self.virtual_queue[s] =
                (self.virtual_queue[s] - y).max(0.0) + self.tagged_in_slot[s] as f64;
            self.tagged_in_slot[s] = 0;
        }
    }

    fn queues(&self) -> Vec<ServerQueues> {
        (0..self.untagged.len())
            .map(|s| ServerQueues {
                untagged: self.untagged[s],
                virtual_queue: self.virtual_queue[s],
                virtual_service: self.virtual_service[s],
            })
            .collect()
    }
}

/// Which policy to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// JSQ with job tagging (seed 001 §IV-A).
    #[default]
    Jsqt,
    /// Plain join-the-shortest-queue.
    Jsq,
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "jsqt" => Ok(Self::Jsqt),
            "jsq" => Ok(Self::Jsq),
            other => Err(format!("unknown policy {other:?} (expected jsqt or jsq)")),
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Jsqt => "jsqt",
            Self::Jsq => "jsq",
        })
    }
}

/// Either policy behind one type, so callers pick at run time.
#[derive(Debug, Clone)]
pub enum AnyPolicy<P> {
    /// JSQT.
    Jsqt(Jsqt<P>),
    /// JSQ.
    Jsq(Jsq),
}

macro_rules! delegate {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            AnyPolicy::Jsqt($p) => $e,
            AnyPolicy::Jsq($p) => $e,
        }
    };
}

impl<P: Penalty> Policy for AnyPolicy<P> {
    fn farm(&self) -> &Farm {
        delegate!(self, p => p.farm())
    }
    fn route(&self, balancer: usize) -> Result<Route, BalanceError> {
        delegate!(self, p => p.route(balancer))
    }
    fn tag_at(&self, server: usize) -> Tag {
        delegate!(self, p => p.tag_at(server))
    }
    fn on_arrival(&mut self, server: usize, jobs: u64, tag: Tag) {
        delegate!(self, p => p.on_arrival(server, jobs, tag))
    }
    fn on_departure(&mut self, server: usize, jobs: u64) {
        delegate!(self, p => p.on_departure(server, jobs))
    }
    fn on_complete(&mut self, server: usize, tag: Tag) {
        delegate!(self, p => p.on_complete(server, tag))
    }
    fn end_slot(&mut self) {
        delegate!(self, p => p.end_slot())
    }
    fn queues(&self) -> Vec<ServerQueues> {
        delegate!(self, p => p.queues())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlphaFair;

    fn two_server_jsqt() -> Jsqt<AlphaFair> {
        let farm = Farm::fully_connected(vec![1.0, 2.0], 1).unwrap();
        let pens = AlphaFair::per_server(1.0, &[1.0, 1.0]).unwrap();
        Jsqt::new(farm, pens, DriftParams::new(10.0, 8.0, 1.0).unwrap()).unwrap()
    }

    #[test]
    fn jsqt_selects_min_of_n_and_y_and_tags_when_n_exceeds_y() {
        let mut p = two_server_jsqt();
        // Both empty: tie → first server, untagged (N = Y = 0 is not N > Y).
        assert_eq!(
            p.route(0).unwrap(),
            Route {
                server: 0,
                tag: Tag::Untagged
            }
        );
        p.on_arrival(0, 3, Tag::Untagged);
        // N = (3, 0), Y = (0, 0): min is 0 for both → first server; N_0 > Y_0 → tagged.
        assert_eq!(
            p.route(0).unwrap(),
            Route {
                server: 0,
                tag: Tag::Tagged
            }
        );
        p.on_arrival(0, 2, Tag::Tagged);
        assert_eq!(
            p.queues()[0].untagged,
            3,
            "tagged arrivals do not enter N_s (eq. 16)"
        );
        p.end_slot();
        // Y_0 = max(0 − y, 0) + 2 = 2 (eq. 21); y chosen from Y(t) = 0 is 0.
        assert_eq!(p.queues()[0].virtual_queue, 2.0);
        p.on_arrival(1, 1, Tag::Untagged);
        // min(N,Y) = (2, 0) → server 1; N_1 = 1 > Y_1 = 0 → tagged.
        assert_eq!(
            p.route(0).unwrap(),
            Route {
                server: 1,
                tag: Tag::Tagged
            }
        );
        p.end_slot();
        // y_0 = Y/V = 0.2 under h = q²/2 (§IV-B).
        let q = p.queues()[0];
        assert!((q.virtual_service - 0.2).abs() < 1e-12 && (q.virtual_queue - 1.8).abs() < 1e-12);
        p.on_departure(0, 10);
        assert_eq!(
            p.queues()[0].untagged,
            0,
            "FIFO departures saturate at zero"
        );
    }

    #[test]
    fn never_routes_outside_reach() {
        let farm = Farm::new(vec![1.0, 1.0, 1.0], vec![vec![2], vec![0, 1]]).unwrap();
        let mut jsq = Jsq::new(farm);
        for i in 0..50 {
            let r = jsq.route(i % 2).unwrap();
            assert!(jsq.farm().reaches(i % 2, r.server));
            jsq.on_arrival(r.server, 1, r.tag);
        }
        assert!(jsq.route(2).is_err());
    }

    #[test]
    fn policy_kind_parses() {
        assert_eq!("JSQT".parse::<PolicyKind>(), Ok(PolicyKind::Jsqt));
        assert_eq!("jsq".parse::<PolicyKind>(), Ok(PolicyKind::Jsq));
        assert!("x".parse::<PolicyKind>().is_err());
    }
}
