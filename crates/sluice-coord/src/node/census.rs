//! Re-minting after a whole-cluster restart (docs/PROTOCOL.md, "Re-minting after a whole-cluster
//! restart"). A restarted member holds only its reservation; its initial share comes back only
//! as an inheritance. When every node restarts at once, nobody is left to inherit from and the
//! cluster would enforce its reservations for ever. A node that holds nothing else and keeps
//! nothing of any other incarnation is *pristine*; when every node it links with says it is
//! pristine and sees the same nodes at the same incarnations, no capacity is left anywhere
//! but in reservations, and each member takes its own initial share back, once.

use super::*;

impl Node {
    /// Nothing but our reservation, nothing that could bring capacity here later: a
    /// restarted member (or a joiner) that never gave nor received, holds no other initial
    /// share, settles nobody and holds no ward with more than its reservation.
    pub(super) fn is_pristine(&self) -> bool {
        if !self.bare_holdings() || self.lifecycle != Lifecycle::Active {
            return false;
        }
        let base = i64::try_from(self.default_base).unwrap_or(i64::MAX);
        let keys_bare = self
            .keys
            .values()
            .all(|ks| ks.base == base && ks.links.values().all(|lk| lk.given == 0 && lk.seen == 0));
        let wards_bare = self.wards.iter().all(|(&w, ward)| {
            let l = &ward.ledger;
            let res = i64::try_from(self.cfg.reservation(w)).unwrap_or(i64::MAX);
            l.settled.is_empty()
                && l.holdings
                    .iter()
                    .all(|h| h.node == w && h.part == Part::ReserveOnly)
                && l.bases.iter().all(|&(_, b)| b == res)
        });
        keys_bare
            && wards_bare
            && self.settling.is_empty()
            && self.successions.is_empty()
            && self.handovers.is_empty()
            && self.ward_candidates.is_empty()
            && self.late_folds.is_empty()
            && self.held.is_empty()
    }

    /// No initial share but our own reservation (or none, for a joiner): the cheap first test
    /// of [`Node::is_pristine`], false for every first incarnation of a member.
    fn bare_holdings(&self) -> bool {
        let id = self.cfg.id;
        match self.holdings.as_slice() {
            [] => !self.cfg.members.contains(&id),
            [h] => h.node == id && h.part == Part::ReserveOnly,
            _ => false,
        }
    }

    /// Our view of the cluster: every neighbour at the incarnation our link is with, and us
    /// (FNV-1a over the sorted pairs). `None` while a neighbour's incarnation is unknown.
    pub(super) fn view_digest(&self) -> Option<u64> {
        let mut pairs: Vec<(NodeId, u64)> = vec![(self.cfg.id, self.inc)];
        for (&p, l) in self.links.iter().filter(|(_, l)| l.neighbour) {
            if l.inc == 0 {
                return None;
            }
            pairs.push((p, l.inc));
        }
        pairs.sort_unstable();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (p, i) in pairs {
            for b in u64::from(p)
                .to_le_bytes()
                .into_iter()
                .chain(i.to_le_bytes())
            {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        Some(h)
    }

    /// At every tick: what our messages claim (`Message::census`), and the re-mint.
    ///
    /// We take our initial share back (once per incarnation, only a member holding exactly
    /// its reservation) when every neighbour, up and at the incarnation we know, claims our
    /// view — pristine or already re-minted in it — while we are pristine; or when one
    /// claims it re-minted in our view (it saw every node of the view pristine, us
    /// included: what we received since can only come from re-minted shares). Only on a
    /// graph where every node links with every other do all views agree (each lists its
    /// own neighbours); elsewhere nothing happens (the capacity stays lost, never counted
    /// twice).
    ///
    /// A claim is worked out here, once a tick, and may go out after a gift came in: still
    /// safe. What a node receives after its claim comes from a node that held it after its
    /// own claim; following gifts back, every unit comes from a re-mint, since no claim is
    /// made while holding anything and nothing of a dead incarnation can come back.
    pub(super) fn take_census(&mut self, now: Nanos) {
        if self.reminted.is_none() && !self.bare_holdings() {
            // Nothing to claim (every first incarnation of a member): no work per tick.
            self.census = None;
            return;
        }
        let view = self.view_digest();
        if let Some(v) = self.reminted {
            // Vouch for the view we re-minted in while it holds: members that missed the
            // round re-mint from this.
            self.census = (view == Some(v)).then_some(Census {
                view: v,
                reminted: true,
            });
            return;
        }
        let Some(view) = view else {
            self.census = None;
            return;
        };
        let id = self.cfg.id;
        let own_reserve = self.holdings.as_slice()
            == [Holding {
                node: id,
                part: Part::ReserveOnly,
            }];
        let up = 2 * self.cfg.cycle;
        let claim = |l: &Link, p: NodeId| {
            self.census_heard
                .get(&p)
                .filter(|(inc, c)| *inc == l.inc && c.view == view)
                .map(|(_, c)| c.reminted)
        };
        let vouched = self
            .links
            .iter()
            .filter(|(_, l)| l.neighbour)
            .any(|(&p, l)| claim(l, p) == Some(true));
        let pristine = self.is_pristine();
        let all_agree = pristine
            && self.links.len() > 0
            && self
                .links
                .iter()
                .filter(|(_, l)| l.neighbour)
                .all(|(&p, l)| Self::link_usable(l, now, up) && claim(l, p).is_some());
        if own_reserve && (vouched || all_agree) {
            self.remint(view);
            return;
        }
        self.census = pristine.then_some(Census {
            view,
            reminted: false,
        });
    }

    /// Takes our initial share back: every node of `view` held only its reservation (see
    /// `take_census`), so each member's initial share less its reservation exists nowhere,
    /// and only the member takes it back, once.
    fn remint(&mut self, view: u64) {
        let id = self.cfg.id;
        let add = self.cfg.initial_share(id) - self.cfg.reservation(id);
        self.holdings = vec![Holding {
            node: id,
            part: Part::Full,
        }];
        self.default_base = self.cfg.initial_share(id);
        let add = i64::try_from(add).unwrap_or(i64::MAX);
        for ks in self.keys.values_mut() {
            ks.base = ks.base.saturating_add(add);
        }
        self.ledger_version += 1;
        self.reminted = Some(view);
        self.census = Some(Census {
            view,
            reminted: true,
        });
    }
}
