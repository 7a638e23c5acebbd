//! Re-minting after a whole-cluster restart (docs/PROTOCOL.md, "Re-minting after a whole-cluster
//! restart"). A restarted member holds only its reservation; its initial share comes back only
//! as an inheritance. When every node restarts at once, nobody is left to inherit from and the
//! cluster would enforce its reservations for ever. A node that holds nothing else and keeps
//! nothing of any other incarnation is *pristine*; when every node says so (learnt hop by hop,
//! each pair of neighbours seeing each other's current incarnation), no capacity is left
//! anywhere but in reservations, and each member takes its own initial share back, once.

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
            // Its `settled` list names incarnations whose estates went into some incarnation
            // of the ward (kept across reincarnations, so they are never settled twice): what
            // this one holds is in its holdings and bases alone.
            l.settling.is_empty()
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
            && self
                .late_folds
                .values()
                .all(|&st| st != LateFoldState::Offered)
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
    /// A neighbour's claim counts if it came from the incarnation our link is with and was
    /// addressed to ours (each side sees the other's current incarnation, so neither takes
    /// anything from a dead incarnation of the other). Pristine, we claim level `1 + min` of
    /// our neighbours' latest levels (0 for one without a claim that counts; a re-minted one counts
    /// as the top): level `k` says every node within `k − 1` hops is pristine. A member
    /// holding exactly its reservation takes its initial share back, once per incarnation,
    /// at level `N` (the number of members: no member is further away than `N − 1` hops), or
    /// when a neighbour claims it re-minted (that neighbour saw every node pristine, us
    /// included: what we received since can only come from re-minted shares). A node with a
    /// neighbour that is not a member claims nothing: joiners are not counted in `N`.
    ///
    /// A claim is worked out here, once a tick, and may go out after a gift came in: still
    /// safe. What a node receives after its claim comes from a node that held it after its
    /// own claim; following gifts back, every unit comes from a re-mint, since no claim is
    /// made while holding anything and nothing of a dead incarnation can come back.
    pub(super) fn take_census(&mut self, now: Nanos) {
        // With audits on, the audit mints what a whole-cluster restart lost: both would
        // count the same shares as missing (see docs/PROTOCOL.md, "The capacity audit").
        if self.cfg.audit_every.is_some() || (self.reminted.is_none() && !self.bare_holdings()) {
            // Nothing to claim (every first incarnation of a member): no work per tick.
            self.census = None;
            return;
        }
        if let Some(v) = self.reminted {
            // Vouch while our links are with the incarnations they were with at the re-mint:
            // members that missed the round re-mint from this.
            self.census = (self.view_digest() == Some(v)).then_some(Census {
                level: 0,
                reminted: true,
            });
            return;
        }
        let id = self.cfg.id;
        let members = &self.cfg.members;
        let top = u16::try_from(members.len()).unwrap_or(u16::MAX);
        let lease = self.cfg.lease;
        let mut vouched = false;
        let mut level = top;
        let mut any = false;
        for (&p, l) in self.links.iter().filter(|(_, l)| l.neighbour) {
            any = true;
            if !members.contains(&p) {
                self.census = None;
                return;
            }
            let heard = self
                .census_heard
                .get(&p)
                .filter(|&&(inc, to_me, _)| inc == l.inc && to_me)
                .map(|&(_, _, c)| c);
            let theirs = match heard {
                Some(c) if c.reminted => {
                    vouched = true;
                    top
                }
                // The latest claim counts while the neighbour is not down (heard within a
                // lease): requiring one from the last two cycles stalled the count under
                // loss (one silent link anywhere set every node back), and a dead neighbour
                // must hold the count until it is back, or its share would never return.
                Some(c) if l.last_recv.is_some_and(|t| now.saturating_sub(t) <= lease) => c.level,
                _ => 0,
            };
            level = level.min(theirs);
        }
        let own_reserve = self.holdings.as_slice()
            == [Holding {
                node: id,
                part: Part::ReserveOnly,
            }];
        // Every neighbour's incarnation known (what `view_digest` needs), without hashing.
        let known = self.links.values().all(|l| !l.neighbour || l.inc != 0);
        let pristine = any && known && self.is_pristine();
        let level = if pristine {
            level.saturating_add(1).min(top)
        } else {
            0
        };
        if own_reserve && (vouched || level >= top) {
            self.remint();
            return;
        }
        self.census = pristine.then_some(Census {
            level,
            reminted: false,
        });
    }

    /// Takes our initial share back: every node held only its reservation (see
    /// `take_census`), so each member's initial share less its reservation exists nowhere,
    /// and only the member takes it back, once.
    fn remint(&mut self) {
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
        self.reminted = self.view_digest();
        self.census = self.reminted.map(|_| Census {
            level: 0,
            reminted: true,
        });
    }
}
