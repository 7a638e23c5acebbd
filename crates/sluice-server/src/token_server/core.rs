//! One token server as a pure state machine: the serving lease ([`Serving`]), the grants
//! ([`Grants`]), the replay window ([`ReplayWindow`]) and what it refused. Time is an
//! argument ([`Now`]); the shell (`node`) reads the clocks — at every grant, under the lock
//! that holds this state — and does the I/O.

use std::collections::BTreeMap;

use sluice_limits::{AlgorithmKind, Limit, Nanos};

use super::grants::{GrantConfig, Grants};
use super::replay::{ReplayError, ReplayWindow};
use super::serving::{Serving, ServingLease, Vote};
use super::{GrantRequest, Message, Refusal, Reply, Report};

/// The two clocks a server reads: the wall clock (ns since the unix epoch: fixed windows
/// are aligned to it, sequence numbers are taken from it) and a monotonic one (the serving
/// lease: a wall clock stepped back must not lengthen it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Wall clock, ns since the unix epoch.
    pub wall: Nanos,
    /// Monotonic clock, ns since any fixed origin.
    pub mono: Nanos,
}

impl Now {
    /// Both clocks at `t` (a simulation).
    #[must_use]
    pub fn at(t: Nanos) -> Self {
        Self { wall: t, mono: t }
    }
}

/// What a token server refused, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Refusals {
    /// Grant requests while it did not hold the serving lease, or was still waiting out a
    /// predecessor's grants.
    pub not_serving: u64,
    /// Messages whose sequence number was seen already or is out of the window (replays).
    pub replays: u64,
    /// Grant requests naming another limit than the server's configuration.
    pub wrong_limit: u64,
    /// Grant requests held back because the key's allowance beyond the last report a
    /// majority received was used (until the next renewal).
    #[serde(default)]
    pub unreported: u64,
}

/// Where a token server stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServingState {
    /// Holds the serving lease and grants.
    Active,
    /// Holds the lease, waiting out a predecessor's grants.
    Starting,
    /// Does not hold the lease: refuses grants.
    Standby,
}

/// A token server's state now (for `/v1/cluster` and `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ServerStatus {
    /// This server's id.
    pub id: u32,
    /// Active, starting or standing by.
    pub state: ServingState,
    /// Who holds the serving lease, as far as this server knows.
    pub holder: Option<u32>,
    /// How long its serving lease still runs (ns), if it holds it.
    pub lease_left: Option<Nanos>,
    /// Times it acquired the serving lease.
    pub acquisitions: u64,
    /// Permits granted since start.
    pub granted: u64,
    /// Refused, by reason.
    pub refused: Refusals,
    /// Requests refused as unauthenticated or malformed (counted by the shell).
    pub rejected: u64,
}

/// One token server (see the module documentation of `token_server`).
#[derive(Debug)]
pub struct TokenServer {
    me: u32,
    serving: Serving,
    grants: Grants,
    replay: ReplayWindow,
    serving_from: Nanos,
    refused: Refusals,
    /// As a voter: the latest report of each holder it voted for.
    reports: BTreeMap<u32, Report>,
    /// As a candidate: the reports its voters kept, in the current round.
    round_reports: BTreeMap<u32, Report>,
}

impl TokenServer {
    /// Server `me` of `ids` (primary first), started at `now` as `incarnation`; `None` when
    /// `me` is not listed.
    #[must_use]
    pub fn new(
        grants: GrantConfig,
        lease: ServingLease,
        me: u32,
        ids: Vec<u32>,
        incarnation: u64,
        now: Now,
    ) -> Option<Self> {
        let mut grants = Grants::new(grants);
        // A holder grants until `lease` after its last renewal a majority voted for, whose
        // report a voter of any later majority kept (a renewal more for the wall clocks).
        grants.set_timing(
            lease.renew_every,
            lease.stretch(lease.lease).saturating_add(lease.renew_every),
        );
        Some(Self {
            me,
            serving: Serving::new(lease, me, ids, incarnation, now.mono)?,
            grants,
            replay: ReplayWindow::default(),
            serving_from: Nanos::MAX,
            refused: Refusals::default(),
            reports: BTreeMap::new(),
            round_reports: BTreeMap::new(),
        })
    }

    /// Accepts a sealed message's sequence number once ([`ReplayWindow`]); counts refusals.
    ///
    /// # Errors
    /// [`ReplayError`].
    pub fn admit(&mut self, from: u32, seq: u64, now: Now) -> Result<(), ReplayError> {
        let r = self.replay.admit(from, seq, now.wall);
        if r.is_err() {
            self.refused.replays += 1;
        }
        r
    }

    /// Answers a grant request at `now`, with `configured` the algorithm and limit this
    /// server's own configuration gives the request's key (`None`: no such
    /// `coordination: token-server` rule).
    pub fn grant(
        &mut self,
        request: &GrantRequest,
        configured: Option<(AlgorithmKind, Limit)>,
        now: Now,
    ) -> Reply {
        let Some((kind, limit)) = configured.filter(|(kind, limit)| {
            kind.name() == request.algorithm
                && (limit.count(), limit.period(), limit.burst())
                    == (request.count, request.period, request.burst)
        }) else {
            // The limit is the server's: a request naming another one (a stale
            // configuration, or a forged "2⁶⁴−1 per 1 ns") gets nothing.
            self.refused.wrong_limit += 1;
            return Reply::Refused {
                reason: Refusal::WrongLimit,
            };
        };
        // The lease is checked against the clock read for this grant: a server frozen and
        // resumed finds it over and grants nothing from its old state.
        if !self.serving.holds(now.mono) {
            self.refused.not_serving += 1;
            return Reply::Standby {
                holder: self.serving.holder(now.mono),
            };
        }
        if now.mono < self.serving_from {
            self.refused.not_serving += 1;
            return Reply::Starting {
                serving_in: self.serving_from - now.mono,
            };
        }
        self.grants.grant(
            &request.key,
            kind,
            &limit,
            request.want,
            request.cost,
            request.charge,
            now.wall,
        )
    }

    /// Votes on `from`'s round `round` (incarnation `incarnation`), keeping the report it
    /// sent; a vote granted hands over the reports of every holder this voter kept.
    pub fn vote(
        &mut self,
        from: u32,
        round: u64,
        incarnation: u64,
        report: Option<Report>,
        now: Now,
    ) -> Reply {
        let vote = self.serving.vote(from, incarnation, now.mono);
        if !vote.granted {
            return Reply::Vote {
                round,
                vote,
                reports: Vec::new(),
            };
        }
        if let Some(r) = report {
            keep(&mut self.reports, r);
        }
        Reply::Vote {
            round,
            vote,
            reports: self.reports.values().cloned().collect(),
        }
    }

    /// Starts a round of the serving lease if this server should ask: the message to send
    /// every other server (with its report, if it holds the lease).
    pub fn start_round(&mut self, now: Now) -> Option<Message> {
        let holding = self.serving.holds(now.mono);
        let (round, won) = self.serving.start_round(now.mono)?;
        let report = holding.then(|| self.grants.report(self.me, round, now.wall));
        if let Some(r) = &report {
            keep(&mut self.reports, r.clone());
        }
        // Its own vote counts with the reports it kept.
        self.round_reports = self.reports.iter().map(|(&h, r)| (h, r.clone())).collect();
        // Its own vote is the majority of a single server.
        self.after_vote(won, now);
        self.after_majority(round);
        Some(Message::Renew {
            round,
            incarnation: self.serving.incarnation(),
            report,
        })
    }

    /// Counts `from`'s vote on `round`, with the reports the voter kept.
    pub fn tally(&mut self, round: u64, from: u32, vote: Vote, reports: Vec<Report>, now: Now) {
        if vote.granted {
            for r in reports {
                keep(&mut self.round_reports, r);
            }
        }
        let won = self.serving.tally(round, from, vote, now.mono);
        self.after_vote(won, now);
        self.after_majority(round);
    }

    /// A majority voted for `round`: its report (if any) is known to every later majority.
    fn after_majority(&mut self, round: u64) {
        if self.serving.acked_round() == round {
            self.grants.acked(round);
        }
    }

    fn after_vote(&mut self, won: Option<super::serving::Acquired>, now: Now) {
        let Some(won) = won else { return };
        let cfg = *self.serving.config();
        // Every permit of a predecessor's grants has expired by then (a grant lives
        // `lease` on its client's clock from a request sent before the predecessor stopped).
        self.serving_from = now
            .mono
            .saturating_add(cfg.stretch(self.grants.config().lease));
        let predecessor_wall = won
            .predecessor_until
            .map(|t| now.wall.saturating_sub(now.mono.saturating_sub(t)));
        let reports = self.round_reports.values().cloned().collect();
        self.grants.take_over(predecessor_wall, reports);
        tracing::warn!(
            id = self.me,
            predecessor = predecessor_wall.is_some(),
            serving_in_ms = cfg.stretch(self.grants.config().lease) / 1_000_000,
            "token server holds the serving lease of a majority"
        );
    }

    /// Grants held back so far until a report reaches a majority.
    #[must_use]
    pub fn held_back(&self) -> u64 {
        self.grants.unreported()
    }

    /// Forgets keys whose state is that of a key never seen; returns how many.
    pub fn retain_idle(&mut self, now: Now) -> usize {
        self.grants.retain_idle(now.wall)
    }

    /// Its state at `now`; `rejected` is the shell's count.
    #[must_use]
    pub fn status(&self, now: Now, rejected: u64) -> ServerStatus {
        let holds = self.serving.holds(now.mono);
        ServerStatus {
            id: self.me,
            state: match (holds, now.mono < self.serving_from) {
                (false, _) => ServingState::Standby,
                (true, true) => ServingState::Starting,
                (true, false) => ServingState::Active,
            },
            holder: self.serving.holder(now.mono),
            lease_left: self
                .serving
                .held_until(now.mono)
                .map(|u| u.saturating_sub(now.mono)),
            acquisitions: self.serving.acquisitions(),
            granted: self.grants.granted(),
            refused: Refusals {
                unreported: self.grants.unreported(),
                ..self.refused
            },
            rejected,
        }
    }
}

/// Keeps `r` if it is the latest report of its holder.
fn keep(reports: &mut BTreeMap<u32, Report>, r: Report) {
    match reports.get(&r.holder) {
        Some(old) if old.at >= r.at => {}
        _ => {
            reports.insert(r.holder, r);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::token_server::book::{LeaseBook, Local, RequestSizing};

    const MS: Nanos = 1_000_000;
    const S: Nanos = 1_000 * MS;
    const L: u64 = 1000;

    fn limit() -> (AlgorithmKind, Limit) {
        limit_per(S)
    }

    fn limit_per(period: Nanos) -> (AlgorithmKind, Limit) {
        (
            AlgorithmKind::FixedWindow,
            Limit::from_nanos(L, period).unwrap(),
        )
    }

    fn request(want: u64) -> GrantRequest {
        request_per(want, S)
    }

    fn request_per(want: u64, period: Nanos) -> GrantRequest {
        let (kind, l) = limit_per(period);
        GrantRequest {
            key: "d|user=a".into(),
            algorithm: kind.name().into(),
            count: l.count(),
            period: l.period(),
            burst: l.burst(),
            want,
            cost: 1,
            charge: 0,
        }
    }

    /// What happens to the servers in a run.
    #[derive(Clone, Default, Debug)]
    struct Faults {
        /// Server 0 is frozen (answers nothing, asks nothing) in `[from, to)`.
        freeze: Option<(Nanos, Nanos)>,
        /// Servers 0 and 1 cannot reach each other in `[from, to)` (both reach 2; every
        /// client reaches every server).
        cut: Option<(Nanos, Nanos)>,
        /// More freezes `(server, from, to)`, and cuts `(a, b, from, to)` between two servers.
        freezes: Vec<(usize, Nanos, Nanos)>,
        cuts: Vec<(usize, usize, Nanos, Nanos)>,
    }

    /// What a run leaves.
    struct Run {
        /// Permits admitted from leases, per window.
        admitted: BTreeMap<Nanos, u64>,
        servers: Vec<TokenServer>,
        /// Permits server 0 granted after its freeze ended.
        resumed_grants: u64,
    }

    /// Three token servers (clock rates 1+ρ, 1−ρ, 1) and three clients asking for one
    /// permit each per ms (3,000/s for a limit of 1,000/s), on a simulated clock stepped by
    /// 1 ms for `secs` s. Returns the permits admitted from leases per window, and the
    /// servers.
    fn run(faults: Faults, secs: u64) -> (BTreeMap<Nanos, u64>, Vec<TokenServer>) {
        let r = run_with(faults, S, MS, secs);
        (r.admitted, r.servers)
    }

    /// [`run`] with a limit of `L` per `period`, each client asking once per `every`;
    /// admissions per window of `period`.
    fn run_with(faults: Faults, period: Nanos, every: Nanos, secs: u64) -> Run {
        let lease = ServingLease::default();
        let rates = [1.0 + lease.max_drift, 1.0 - lease.max_drift, 1.0];
        let clock = |i: usize, t: Nanos| Now {
            wall: t,
            mono: (t as f64 * rates[i]) as Nanos,
        };
        let mut servers: Vec<TokenServer> = (0..3u32)
            .map(|id| {
                TokenServer::new(
                    GrantConfig::default(),
                    lease,
                    id,
                    vec![0, 1, 2],
                    1,
                    clock(id as usize, 0),
                )
                .unwrap()
            })
            .collect();
        let mut books: Vec<LeaseBook> = (0..3)
            .map(|_| LeaseBook::new(RequestSizing::default()))
            .collect();
        let mut admitted: BTreeMap<Nanos, u64> = BTreeMap::new();
        let mut resumed_grants = 0;
        let within = |w: Option<(Nanos, Nanos)>, t| w.is_some_and(|(a, b)| a <= t && t < b);
        let (kind, l) = limit_per(period);
        let l_per = (kind, l);
        let mut t: Nanos = 0;
        while t < secs * S {
            t += MS;
            let frozen = |i: usize| {
                i == 0 && within(faults.freeze, t)
                    || faults
                        .freezes
                        .iter()
                        .any(|&(s, from, to)| s == i && from <= t && t < to)
            };
            let reach = |a: usize, b: usize| {
                let cut = faults.cuts.iter().any(|&(x, y, from, to)| {
                    ((x, y) == (a, b) || (x, y) == (b, a)) && from <= t && t < to
                });
                !(frozen(a) || frozen(b) || cut || within(faults.cut, t) && a + b == 1)
            };
            // Rounds: every server's clock ticks its own 100 ms.
            if t.is_multiple_of(lease.renew_every) {
                for i in 0..3 {
                    if frozen(i) {
                        continue;
                    }
                    let Some(Message::Renew {
                        round,
                        incarnation,
                        report,
                    }) = servers[i].start_round(clock(i, t))
                    else {
                        continue;
                    };
                    for j in (0..3).filter(|&j| j != i && reach(i, j)) {
                        let vote = servers[j].vote(
                            i as u32,
                            round,
                            incarnation,
                            report.clone(),
                            clock(j, t),
                        );
                        if let Reply::Vote {
                            round,
                            vote,
                            reports,
                        } = vote
                        {
                            servers[i].tally(round, j as u32, vote, reports, clock(i, t));
                        }
                    }
                }
            }
            // At most one server holds the lease at any real instant.
            let holding = (0..3)
                .filter(|&i| servers[i].serving.holds(clock(i, t).mono))
                .count();
            assert!(holding <= 1, "{holding} servers hold the lease at {t}");
            if !t.is_multiple_of(every) {
                continue;
            }
            for book in &mut books {
                let want = match book.try_local("d|user=a", kind, &l, t, 1) {
                    Local::Decided(d) => {
                        if d.allowed {
                            *admitted.entry(t / period).or_default() += 1;
                        }
                        continue;
                    }
                    Local::Ask(want) => want,
                };
                // The client asks every server it reaches, primary first, until one grants.
                for i in (0..3).filter(|&i| !frozen(i)) {
                    if let Reply::Grant {
                        granted,
                        valid_for,
                        retry_after,
                        ..
                    } = servers[i].grant(&request_per(want, period), Some(l_per), clock(i, t))
                    {
                        if i == 0 && faults.freeze.is_some_and(|(_, to)| t >= to) {
                            resumed_grants += granted;
                        }
                        let d = book.apply(
                            "d|user=a",
                            kind,
                            &l,
                            t,
                            t,
                            1,
                            granted,
                            valid_for,
                            retry_after,
                        );
                        if d.allowed {
                            *admitted.entry(t / period).or_default() += 1;
                        }
                        break;
                    }
                }
            }
        }
        Run {
            admitted,
            servers,
            resumed_grants,
        }
    }

    fn assert_within_limit(admitted: &BTreeMap<Nanos, u64>) {
        for (w, n) in admitted {
            assert!(
                *n <= L,
                "window {w}: {n} admitted from leases > {L}: {admitted:?}"
            );
        }
    }

    #[test]
    fn a_fresh_cluster_serves_its_first_window() {
        let (admitted, servers) = run(
            Faults {
                freeze: None,
                cut: None,
                ..Faults::default()
            },
            3,
        );
        assert_within_limit(&admitted);
        // Serving from about 0.5 s: the first window is not counted as spent.
        assert!(admitted[&0] >= L / 4, "{admitted:?}");
        assert_eq!(admitted[&1], L, "{admitted:?}");
        assert_eq!(
            servers[0].status(Now::at(3 * S), 0).state,
            ServingState::Active
        );
    }

    /// The primary is frozen for 3.4 s, from 0.2 s into a window to 0.6 s into another
    /// (SIGSTOP, SIGCONT): the successor takes over with the predecessor's window counted,
    /// and the primary, resumed, grants nothing.
    #[test]
    fn a_frozen_primary_grants_nothing_after_it_resumes_and_no_window_passes_the_limit() {
        let (admitted, servers) = run(
            Faults {
                freeze: Some((2 * S + 200 * MS, 5 * S + 600 * MS)),
                cut: None,
                ..Faults::default()
            },
            8,
        );
        assert_within_limit(&admitted);
        let granted_by_0 = servers[0].grants.granted();
        assert!(granted_by_0 > 0);
        let s0 = servers[0].status(Now::at(8 * S), 0);
        assert_eq!(s0.state, ServingState::Standby);
        assert_eq!(s0.holder, Some(1));
        assert!(s0.refused.not_serving > 0, "{s0:?}");
        let s1 = servers[1].status(Now::at(8 * S), 0);
        assert_eq!(s1.state, ServingState::Active);
        // The successor serves the windows after the takeover in full.
        for w in 3..8 {
            assert_eq!(admitted[&w], L, "window {w}: {admitted:?}");
        }
    }

    /// SIGSTOP of the primary for 1 to 5 s (every half second), frozen early or late in a
    /// window: the successor takes over, the primary resumed grants nothing, and no window
    /// passes the limit.
    #[test]
    fn a_primary_frozen_for_one_to_five_seconds_never_lets_a_window_pass_the_limit() {
        for freeze_ms in (1_000..=5_000).step_by(500) {
            for from in [2 * S + 200 * MS, 2 * S + 850 * MS] {
                let to = from + freeze_ms * MS;
                let r = run_with(
                    Faults {
                        freeze: Some((from, to)),
                        cut: None,
                        ..Faults::default()
                    },
                    S,
                    MS,
                    to / S + 3,
                );
                assert_within_limit(&r.admitted);
                assert_eq!(
                    r.resumed_grants, 0,
                    "frozen {freeze_ms} ms from {from}: the resumed primary granted"
                );
                let end = Now::at((to / S + 3) * S);
                assert_eq!(r.servers[0].status(end, 0).state, ServingState::Standby);
                // The successor serves the last full window in full.
                let last = to / S + 2;
                assert_eq!(r.admitted[&last], L, "frozen {freeze_ms} ms from {from}");
            }
        }
    }

    /// Servers 0 and 1 cut from each other for 1 to 5 s (every half second): never two
    /// serving (asserted at every step of the run), never more than the limit.
    #[test]
    fn a_cut_of_one_to_five_seconds_between_servers_never_lets_a_window_pass_the_limit() {
        for cut_ms in (1_000..=5_000).step_by(500) {
            let from = 2 * S + 300 * MS;
            let to = from + cut_ms * MS;
            let (admitted, _) = run(
                Faults {
                    freeze: None,
                    cut: Some((from, to)),
                    ..Faults::default()
                },
                to / S + 3,
            );
            assert_within_limit(&admitted);
            assert_eq!(admitted[&(to / S + 2)], L, "cut {cut_ms} ms: {admitted:?}");
        }
    }

    /// Servers 0 and 1 cannot reach each other for 3 s while clients reach both: never two
    /// serving, never more than the limit.
    #[test]
    fn a_cut_between_servers_never_makes_two_serve() {
        let (admitted, _) = run(
            Faults {
                freeze: None,
                cut: Some((2 * S + 300 * MS, 5 * S + 300 * MS)),
                ..Faults::default()
            },
            7,
        );
        assert_within_limit(&admitted);
        assert_eq!(admitted[&6], L, "{admitted:?}");
    }

    /// A limit of 1,000 per 10 s, 300 requests/s: the primary is frozen 1.2 s into a window
    /// (about 360 granted) for 4 s. The successor counts what the primary's last report a
    /// majority received said was spent, and the allowance beyond it — not the whole window:
    /// the window admits most of its limit, never more.
    #[test]
    fn a_successor_counts_what_its_predecessor_reported_not_the_whole_window() {
        let period = 10 * S;
        let Run {
            admitted, servers, ..
        } = run_with(
            Faults {
                freeze: Some((11 * S + 200 * MS, 15 * S + 200 * MS)),
                cut: None,
                ..Faults::default()
            },
            period,
            10 * MS,
            22,
        );
        assert_within_limit(&admitted);
        assert_eq!(
            servers[1].status(Now::at(22 * S), 0).state,
            ServingState::Active
        );
        // The window of the takeover: the limit less two allowances (50 each) and what
        // leases lost in the freeze, not the ~400 before it.
        assert!(admitted[&1] >= 750, "{admitted:?}");
    }

    /// Without a report (the predecessor's renewals carried none), the successor counts the
    /// whole window as spent, as before.
    #[test]
    fn without_reports_a_takeover_counts_everything_the_rule_allowed() {
        let mut g = Grants::new(GrantConfig::default());
        let (kind, l) = limit_per(10 * S);
        g.take_over(Some(12 * S), Vec::new());
        assert!(matches!(
            g.grant("k", kind, &l, 5, 1, 0, 12 * S),
            Reply::Grant { granted: 0, .. }
        ));
        // With a report of 300 spent at 11.9 s: 300 and two allowances (50) counted.
        let mut g = Grants::new(GrantConfig::default());
        let report = Report {
            holder: 0,
            at: 11 * S + 900 * MS,
            complete: true,
            keys: vec![super::super::Spent {
                key: "k".into(),
                algorithm: kind.name().into(),
                used: 300,
            }],
        };
        g.take_over(Some(12 * S), vec![report]);
        let mut total = 0;
        while let Reply::Grant { granted, .. } = g.grant("k", kind, &l, 1000, 1, 0, 12 * S) {
            if granted == 0 {
                break;
            }
            total += granted;
            g.acked(0);
            // Each report acknowledged frees the next allowance.
            let r = g.report(1, 1, 12 * S);
            assert!(r.complete);
            g.acked(1);
        }
        // The report, the latest holder's allowance, and the reporting holder's.
        assert_eq!(total, L - 300 - 2 * 50);
    }

    #[test]
    fn a_request_naming_another_limit_is_refused_and_counted() {
        let mut s = TokenServer::new(
            GrantConfig::default(),
            ServingLease::default(),
            0,
            vec![0],
            1,
            Now::at(0),
        )
        .unwrap();
        s.start_round(Now::at(S));
        // Serving from S + 100 ms, the lease until S + 300 ms.
        let t = Now::at(S + 200 * MS);
        assert!(matches!(
            s.grant(&request(5), Some(limit()), t),
            Reply::Grant { granted: 5, .. }
        ));
        let mut forged = request(5);
        forged.count = u64::MAX;
        forged.period = 1;
        assert_eq!(
            s.grant(&forged, Some(limit()), t),
            Reply::Refused {
                reason: Refusal::WrongLimit
            }
        );
        // No such rule in the server's configuration.
        assert!(matches!(
            s.grant(&request(5), None, t),
            Reply::Refused { .. }
        ));
        assert_eq!(s.status(t, 0).refused.wrong_limit, 2);
        assert_eq!(s.status(t, 0).granted, 5);
    }

    #[test]
    fn a_replayed_message_is_refused_and_counted() {
        let mut s = TokenServer::new(
            GrantConfig::default(),
            ServingLease::default(),
            0,
            vec![0],
            1,
            Now::at(0),
        )
        .unwrap();
        let now = Now::at(100 * S);
        assert!(s.admit(7, 100 * S - 5, now).is_ok());
        assert!(s.admit(7, 100 * S - 5, now).is_err());
        assert_eq!(s.status(now, 0).refused.replays, 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 12,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Random schedules of freezes (any server, 0.2–5 s) and cuts (any two servers,
        /// 0.2–5 s), overlapping or not, on the simulated clock with drifting clocks: at most
        /// one server holds the serving lease at any instant (`run_with` asserts it at every
        /// step) and no window admits more than the limit from leases.
        #[test]
        fn random_freezes_and_cuts_never_let_a_window_pass_the_limit(
            freezes in proptest::collection::vec((0usize..3, 500u64..7_000, 200u64..5_000), 0..3),
            cuts in proptest::collection::vec(((0usize..3, 1usize..3), 500u64..7_000, 200u64..5_000), 0..3),
        ) {
            let faults = Faults {
                freezes: freezes
                    .iter()
                    .map(|&(s, at, len)| (s, at * MS, (at + len) * MS))
                    .collect(),
                cuts: cuts
                    .iter()
                    .map(|&((a, d), at, len)| (a, (a + d) % 3, at * MS, (at + len) * MS))
                    .collect(),
                ..Faults::default()
            };
            let r = run_with(faults.clone(), S, MS, 14);
            for (w, n) in &r.admitted {
                proptest::prop_assert!(*n <= L, "window {}: {} admitted, {:?}", w, n, faults);
            }
        }
    }
}
