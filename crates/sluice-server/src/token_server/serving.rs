//! The serving lease: which token server may grant (pure; every time is the server's
//! monotonic clock, an argument).
//!
//! Every server is a voter. A server asking for the lease (a *round*, sent at `s`) gets a
//! voter's vote unless the voter promised another holder within `promise()` =
//! `lease·(1+ρ)²` on its own clock; a vote is a promise to that holder from the instant it
//! is cast. With a majority of votes for the round, the holder holds until `s + lease` on its
//! clock. Two majorities share a voter, whose promise to the first holder (cast after `s` in
//! real time) keeps the second waiting until real time `≥ s + lease·(1+ρ)`, when the first
//! has stopped: clock rates within `[1/(1+ρ), 1+ρ]`, no clock sync. A voter that starts has
//! forgotten its promises and votes for nobody during `promise()`.
//!
//! Who asks: the holder renews every `renew_every`; a server that does not hold asks once
//! no server ranked before it has asked this server for `promise() + rank·renew_every`
//! (so the order of the list decides who takes over, one at a time). The holder keeps the
//! lease while a majority renews it: a server ranked earlier that comes back stands by.

use sluice_limits::Nanos;

/// How the serving lease is held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServingLease {
    /// A holder serves at most this long after it sent the round a majority voted for
    /// (default 300 ms).
    pub lease: Nanos,
    /// How often the holder renews, and a standing-by server checks (default 100 ms).
    pub renew_every: Nanos,
    /// Bound `ρ` on clock-rate drift: rates within `[1/(1+ρ), 1+ρ]` (default 10⁻³, as the
    /// cluster's).
    pub max_drift: f64,
}

impl Default for ServingLease {
    fn default() -> Self {
        Self {
            lease: 300_000_000,
            renew_every: 100_000_000,
            max_drift: 1e-3,
        }
    }
}

/// Why a serving lease's timing was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServingLeaseError {
    /// A zero lease or renewal interval.
    #[error("the serving lease and its renewal interval must be positive")]
    Zero,
    /// A renewal (sent every `renew_every`, answered within `timeout`) would not come back
    /// before the lease ends: the holder would lose it between renewals.
    #[error(
        "the serving lease ({lease_ms} ms) must be longer than a renewal interval ({renew_ms} ms) plus the call timeout ({timeout_ms} ms), or the holder loses it between renewals"
    )]
    TooShort {
        /// The lease, ms.
        lease_ms: u64,
        /// The renewal interval, ms.
        renew_ms: u64,
        /// The timeout of a renewal, ms.
        timeout_ms: u64,
    },
    /// A drift bound that is not a small non-negative number.
    #[error("the clock drift bound must be within [0, 0.1], got {0}")]
    Drift(f64),
}

impl ServingLease {
    /// Checks that a holder renewing every `renew_every`, each renewal answered within
    /// `timeout`, keeps the lease between renewals.
    ///
    /// # Errors
    /// [`ServingLeaseError`].
    pub fn validate(&self, timeout: Nanos) -> Result<(), ServingLeaseError> {
        if self.lease == 0 || self.renew_every == 0 {
            return Err(ServingLeaseError::Zero);
        }
        if !(0.0..=0.1).contains(&self.max_drift) {
            return Err(ServingLeaseError::Drift(self.max_drift));
        }
        if self.renew_every.saturating_add(timeout) >= self.lease {
            return Err(ServingLeaseError::TooShort {
                lease_ms: self.lease / 1_000_000,
                renew_ms: self.renew_every / 1_000_000,
                timeout_ms: timeout / 1_000_000,
            });
        }
        Ok(())
    }

    /// `d·(1+ρ)²`, rounded up: what waits out `d` of another clock.
    #[must_use]
    pub fn stretch(&self, d: Nanos) -> Nanos {
        let r = 1.0 + self.max_drift.max(0.0);
        (d as f64 * r * r).ceil() as Nanos
    }

    /// How long a vote binds its voter: `lease·(1+ρ)²`.
    #[must_use]
    pub fn promise(&self) -> Nanos {
        self.stretch(self.lease)
    }
}

/// A voter's answer to a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Vote {
    /// Whether the voter promised itself to the asker.
    pub granted: bool,
    /// Whom the voter's running promise is for (the asker when granted).
    pub holder: Option<u32>,
    /// When granted: how long ago (voter's clock) it last voted for another holder (another
    /// id, or the same id in an earlier incarnation), if it remembers one.
    pub predecessor_ago: Option<Nanos>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Promise {
    id: u32,
    incarnation: u64,
    at: Nanos,
}

/// What a round that won the lease says about the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The latest instant (this server's clock, an upper bound) at which another holder may
    /// have granted, if a voter of the majority remembers one.
    pub predecessor_until: Option<Nanos>,
}

/// One server's side of the serving lease: its voter and its rounds.
#[derive(Debug, Clone)]
pub struct Serving {
    cfg: ServingLease,
    me: u32,
    rank: usize,
    ids: Vec<u32>,
    incarnation: u64,
    started: Nanos,
    promise: Option<Promise>,
    previous: Option<Promise>,
    quiet_until: Nanos,
    round: u64,
    round_sent: Nanos,
    round_votes: Vec<u32>,
    round_predecessor: Option<Nanos>,
    held_until: Nanos,
    acquisitions: u64,
    /// The last round a majority voted for.
    acked: u64,
    /// The holder a refusing voter named, and when (a hint for clients).
    named: Option<(u32, Nanos)>,
}

impl Serving {
    /// Server `me` of `ids` (in order of succession), started at `now` as `incarnation`.
    /// `None` when `me` is not listed.
    #[must_use]
    pub fn new(
        cfg: ServingLease,
        me: u32,
        ids: Vec<u32>,
        incarnation: u64,
        now: Nanos,
    ) -> Option<Self> {
        let rank = ids.iter().position(|&i| i == me)?;
        Some(Self {
            cfg,
            me,
            rank,
            ids,
            incarnation,
            started: now,
            promise: None,
            previous: None,
            quiet_until: now.saturating_add(Self::backoff(&cfg, rank)),
            round: 0,
            round_sent: 0,
            round_votes: Vec::new(),
            round_predecessor: None,
            held_until: 0,
            acquisitions: 0,
            acked: 0,
            named: None,
        })
    }

    /// How long a server of `rank` waits after it last heard one ranked before it.
    fn backoff(cfg: &ServingLease, rank: usize) -> Nanos {
        if rank == 0 {
            0
        } else {
            cfg.promise()
                .saturating_add(cfg.renew_every.saturating_mul(rank as u64))
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &ServingLease {
        &self.cfg
    }

    /// Whether this server holds the lease at `now`.
    #[must_use]
    pub fn holds(&self, now: Nanos) -> bool {
        now < self.held_until
    }

    /// Until when it holds (its clock), if it does at `now`.
    #[must_use]
    pub fn held_until(&self, now: Nanos) -> Option<Nanos> {
        self.holds(now).then_some(self.held_until)
    }

    /// Times it acquired the lease.
    #[must_use]
    pub fn acquisitions(&self) -> u64 {
        self.acquisitions
    }

    /// Who holds the lease, as far as this server knows at `now`: itself, the other server
    /// its running promise is for, or the one a voter named when it refused this server.
    #[must_use]
    pub fn holder(&self, now: Nanos) -> Option<u32> {
        if self.holds(now) {
            return Some(self.me);
        }
        let running = |at: Nanos| now < at.saturating_add(self.cfg.promise());
        self.promise
            .filter(|p| p.id != self.me && running(p.at))
            .map(|p| p.id)
            .or(self.named.filter(|&(_, at)| running(at)).map(|(id, _)| id))
    }

    /// The voter: answers a round of `from` (incarnation `incarnation`) at `now`.
    pub fn vote(&mut self, from: u32, incarnation: u64, now: Nanos) -> Vote {
        let promise = self.cfg.promise();
        if let Some(r) = self.ids.iter().position(|&i| i == from)
            && r < self.rank
        {
            // A server ranked before this one is alive: do not compete with it.
            self.quiet_until = self
                .quiet_until
                .max(now.saturating_add(Self::backoff(&self.cfg, self.rank)));
        }
        let refuse = |holder| Vote {
            granted: false,
            holder,
            predecessor_ago: None,
        };
        if now < self.started.saturating_add(promise) {
            // Promises made before a restart are forgotten: wait them out.
            return refuse(None);
        }
        let asker = (from, incarnation);
        if let Some(p) = self.promise
            && (p.id, p.incarnation) != asker
            && now < p.at.saturating_add(promise)
        {
            return refuse(Some(p.id));
        }
        if let Some(p) = self.promise.take()
            && (p.id, p.incarnation) != asker
        {
            self.previous = Some(p);
        }
        self.promise = Some(Promise {
            id: from,
            incarnation,
            at: now,
        });
        Vote {
            granted: true,
            holder: Some(from),
            predecessor_ago: self.previous.map(|p| now.saturating_sub(p.at)),
        }
    }

    /// Starts a round at `now` if this server should ask (it holds, or no server ranked
    /// before it was heard lately), with its own vote counted: the round's number to send,
    /// and `Some` if its own vote won (a single server).
    pub fn start_round(&mut self, now: Nanos) -> Option<(u64, Option<Acquired>)> {
        if !self.holds(now) && now < self.quiet_until {
            return None;
        }
        self.round += 1;
        self.round_sent = now;
        self.round_votes.clear();
        self.round_predecessor = None;
        let round = self.round;
        let own = self.vote(self.me, self.incarnation, now);
        let won = self.tally(round, self.me, own, now);
        Some((round, won))
    }

    /// Counts `from`'s vote on `round` at `now`; `Some` when this vote won the lease for a
    /// server that did not hold it.
    pub fn tally(&mut self, round: u64, from: u32, vote: Vote, now: Nanos) -> Option<Acquired> {
        if let (false, Some(h)) = (vote.granted, vote.holder)
            && h != self.me
        {
            self.named = Some((h, now));
        }
        if round != self.round || !vote.granted || self.round_votes.contains(&from) {
            return None;
        }
        if !self.ids.contains(&from) {
            return None;
        }
        self.round_votes.push(from);
        if let Some(ago) = vote.predecessor_ago {
            // The voter heard the predecessor `ago` ago (its clock); the predecessor granted
            // at most `lease` after that (its clock): an upper bound on this clock.
            let r = 1.0 + self.cfg.max_drift.max(0.0);
            let back = (ago as f64 / (r * r)).floor() as Nanos;
            let t = now
                .saturating_sub(back)
                .saturating_add(self.cfg.lease)
                .min(now);
            self.round_predecessor = Some(self.round_predecessor.map_or(t, |p| p.max(t)));
        }
        if self.round_votes.len() < self.ids.len() / 2 + 1 {
            return None;
        }
        self.acked = round;
        let held = self.holds(now);
        self.held_until = self
            .held_until
            .max(self.round_sent.saturating_add(self.cfg.lease));
        if held || !self.holds(now) {
            return None;
        }
        self.acquisitions += 1;
        Some(Acquired {
            predecessor_until: self.round_predecessor,
        })
    }

    /// The last round a majority voted for (0: none yet).
    #[must_use]
    pub fn acked_round(&self) -> u64 {
        self.acked
    }

    /// This server's incarnation.
    #[must_use]
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn three(me: u32, now: Nanos) -> Serving {
        Serving::new(ServingLease::default(), me, vec![0, 1, 2], 7, now).unwrap()
    }

    /// Runs one round of `s` at `now` with the votes of `voters`.
    fn round(s: &mut Serving, voters: &mut [&mut Serving], now: Nanos) -> Option<Acquired> {
        let (r, mut won) = s.start_round(now)?;
        for v in voters.iter_mut() {
            let vote = v.vote(s.me, s.incarnation, now);
            won = won.or(s.tally(r, v.me, vote, now));
        }
        won
    }

    #[test]
    fn a_majority_grants_the_lease_which_ends_a_lease_after_the_round_was_sent() {
        let (mut a, mut b, mut c) = (three(0, 0), three(1, 0), three(2, 0));
        let p = a.config().promise();
        // Voters that just started vote for nobody.
        assert!(round(&mut a, &mut [&mut b, &mut c], 10 * MS).is_none());
        assert!(!a.holds(10 * MS));
        let t = p + MS;
        let won = round(&mut a, &mut [&mut b], t).unwrap();
        assert_eq!(
            won.predecessor_until, None,
            "a fresh cluster has no predecessor"
        );
        assert!(a.holds(t + 299 * MS));
        assert!(
            !a.holds(t + 300 * MS),
            "the lease ends `lease` after the round was sent"
        );
        // One vote of three (its own) renews nothing.
        let mut a2 = a.clone();
        a2.start_round(t + 400 * MS);
        assert!(!a2.holds(t + 400 * MS));
    }

    #[test]
    fn a_voter_promised_to_a_holder_refuses_everyone_else_for_lease_times_drift_squared() {
        let (mut a, mut b, mut c) = (three(0, 0), three(1, 0), three(2, 0));
        let p = a.config().promise();
        let t = p + MS;
        round(&mut a, &mut [&mut b, &mut c], t).unwrap();
        // b asks c right after: refused, c names the holder.
        let v = c.vote(1, 7, t + 1);
        assert!(!v.granted);
        assert_eq!(v.holder, Some(0));
        // Still refused just before the promise ends, granted after, with the predecessor.
        assert!(!c.vote(1, 7, t + p - 1).granted);
        let v = c.vote(1, 7, t + p);
        assert!(v.granted);
        assert_eq!(v.predecessor_ago, Some(p));
    }

    /// The takeover on a simulated clock: the primary freezes (it neither renews nor
    /// answers); the successor takes over only after the primary's lease ended on every
    /// clock, and the primary, resumed, finds its lease over and cannot get it back.
    #[test]
    fn a_frozen_holder_has_stopped_before_its_successor_starts() {
        let (mut a, mut b, mut c) = (three(0, 0), three(1, 0), three(2, 0));
        let cfg = *a.config();
        let mut t = cfg.promise() + MS;
        round(&mut a, &mut [&mut b, &mut c], t).unwrap();
        let last_renewal = t;
        // Frozen from here for 3 s; b and c tick every 100 ms.
        let mut b_from = None;
        for _ in 0..30 {
            t += cfg.renew_every;
            if let Some(won) = round(&mut b, &mut [&mut c], t) {
                b_from.get_or_insert((t, won));
            }
            let _ = round(&mut c, &mut [&mut b], t);
        }
        let (b_at, won) = b_from.expect("the successor takes over");
        assert!(!c.holds(t), "one successor, the one ranked first");
        // The primary's lease ended before the successor's began, with the drift.
        assert!(b_at >= last_renewal + cfg.promise());
        assert!(a.held_until(last_renewal).unwrap() <= b_at);
        // The successor knows it has a predecessor, and when it may last have granted.
        let pred = won.predecessor_until.unwrap();
        assert!(
            pred >= last_renewal + cfg.lease - MS && pred <= b_at,
            "{pred}"
        );
        // The primary resumes: its lease is over; its rounds are refused while b renews.
        assert!(!a.holds(t));
        for _ in 0..10 {
            t += cfg.renew_every;
            assert!(round(&mut a, &mut [&mut b, &mut c], t).is_none());
            assert!(!a.holds(t));
            round(&mut b, &mut [&mut c], t);
            assert!(b.holds(t));
            assert_eq!(a.holder(t), Some(1));
        }
    }

    #[test]
    fn a_server_cut_off_from_the_majority_stops_and_a_successor_starts_after_it() {
        let (mut a, mut b, mut c) = (three(0, 0), three(1, 0), three(2, 0));
        let cfg = *a.config();
        let mut t = cfg.promise() + MS;
        round(&mut a, &mut [&mut b, &mut c], t).unwrap();
        // Cut: a reaches nobody; b and c reach each other.
        let (mut a_until, mut b_start) = (0, None);
        for _ in 0..20 {
            t += cfg.renew_every;
            round(&mut a, &mut [], t);
            if a.holds(t) {
                a_until = t;
            }
            if round(&mut b, &mut [&mut c], t).is_some() {
                b_start = Some(t);
            }
            round(&mut c, &mut [&mut b], t);
        }
        let b_start = b_start.unwrap();
        assert!(a_until < b_start, "{a_until} < {b_start}");
        assert!(!a.holds(t));
    }

    #[test]
    fn a_lease_shorter_than_a_renewal_and_its_timeout_is_refused() {
        let ok = ServingLease::default();
        assert_eq!(ok.validate(50 * MS), Ok(()));
        let short = ServingLease {
            lease: 120 * MS,
            ..ok
        };
        let e = short.validate(50 * MS).unwrap_err();
        assert!(matches!(e, ServingLeaseError::TooShort { .. }));
        assert!(e.to_string().contains("120 ms"), "{e}");
        let zero = ServingLease {
            renew_every: 0,
            ..ok
        };
        assert_eq!(zero.validate(50 * MS), Err(ServingLeaseError::Zero));
    }

    #[test]
    fn a_restarted_voter_votes_for_nobody_until_its_old_promises_have_ended() {
        let mut c = three(2, 5 * MS);
        assert!(!c.vote(1, 7, 5 * MS + c.config().promise() - 1).granted);
        assert!(c.vote(1, 7, 5 * MS + c.config().promise()).granted);
    }

    #[test]
    fn the_same_id_restarted_is_another_holder() {
        let mut c = three(2, 0);
        let p = c.config().promise();
        assert!(c.vote(0, 1, p).granted);
        assert!(!c.vote(0, 2, p + 1).granted, "a new incarnation waits");
        let v = c.vote(0, 2, 2 * p);
        assert!(v.granted);
        assert_eq!(v.predecessor_ago, Some(p));
    }

    #[test]
    fn a_successor_stays_quiet_while_a_server_ranked_before_it_asks() {
        let (mut a, mut b) = (three(0, 0), three(1, 0));
        let cfg = *a.config();
        let mut t = 0;
        for _ in 0..20 {
            t += cfg.renew_every;
            if let Some((r, _)) = a.start_round(t) {
                let v = b.vote(0, 7, t);
                a.tally(r, 1, v, t);
            }
            assert!(b.start_round(t).is_none());
        }
        assert!(a.holds(t));
    }
}
