//! The heir (seed 003's best friend) and the lease it grants: who holds our ledger, when our
//! lease is void, when we are orphaned.

use super::*;

/// Leases a lease may stay out while the heir is up before we start again (see
/// `Node::lease_stalled`): a heir that settled us sends its verdict well within this once
/// its own heir holds the settlement, and that path keeps what rule 10 hears again.
const STALL_LEASES: u64 = 5;

impl Node {
    /// A heir that leaves gracefully settles nobody, so naming another one is safe.
    pub(super) fn replace_leaving_heir(&mut self, now: Nanos) {
        let Some(h) = self.heir else { return };
        let leaving = self
            .links
            .get(&h)
            .is_some_and(|l| matches!(l.lifecycle, Lifecycle::Leaving | Lifecycle::Left));
        if !leaving {
            return;
        }
        let next = self
            .links
            .iter()
            .filter(|(p, l)| {
                **p != h
                    && l.neighbour
                    && l.lifecycle == Lifecycle::Active
                    && self.link_state(**p, now) == Some(LinkState::Up)
            })
            .map(|(p, _)| *p)
            .next();
        if next.is_some() {
            self.heir = next;
        }
    }

    /// After being our own heir (our heir died and we were its heir), name the configured
    /// heir again once it is back. Nobody holds a ward record of us, so a lease is safe.
    pub(super) fn restore_heir(&mut self, now: Nanos) {
        let Some(c) = self.cfg.heir else { return };
        if self.heir.is_some() {
            return;
        }
        let back = self
            .links
            .get(&c)
            .is_some_and(|l| l.inc != 0 && l.lifecycle == Lifecycle::Active)
            && self.link_state(c, now) == Some(LinkState::Up);
        if back {
            self.heir = Some(c);
            self.lease_until = self.lease_until.max(now + self.cfg.lease);
            self.lease_inc = self.links.get(&c).map_or(0, |l| l.inc);
            self.orphaned_at = None;
        }
    }

    /// Our lease has been out for `STALL_LEASES` leases although our heir is up (we hear it): it will
    /// not renew it (it froze us, and waits to announce our settlement to an heir of its own
    /// that froze it in turn), and no verdict will come. We start again, as an orphan does,
    /// which only drops capacity (our estate goes to whoever settles us, or the capacity
    /// audit mints it back). Found at 48 % loss on a random graph of 4
    /// (`a_cycle_of_heirs_that_froze_each_other_starts_again`): after a cut, nodes 0, 1 and
    /// 2 each held the next in their heir cycle dead, all three leases ran out and stayed
    /// out, and the cluster enforced 0.23 L for good. Only while the heir is up: a node cut
    /// off waits for its heir's verdict as before, and a heir that is up gets five leases to
    /// send one: starting again two leases after the lease ran out, before the verdict came,
    /// lost a ward's share that the verdict path hears again (rule 10,
    /// `a_ward_settled_unannounced_is_heard_again_after_its_settler_dies`: 0.9 L).
    pub(super) fn lease_stalled(&self, now: Nanos) -> bool {
        let Some(h) = self.heir else {
            return false;
        };
        self.lifecycle == Lifecycle::Active
            && self.lease_until > 0
            && now >= self.lease_until + STALL_LEASES * self.cfg.lease
            && self.link_state(h, now) == Some(LinkState::Up)
    }

    /// Our lease has run out and the heir incarnation that granted it is dead to us (we froze
    /// our link with it: it restarted, or its own heir settled it). That incarnation may have
    /// declared us dead and inherited our share first — only after the lease had run out
    /// (the holder stops first) — and we cannot tell whether it did: its successor tells its
    /// wards, not the nodes it had settled, and is not always our neighbour. So while
    /// orphaned we take no lease from another incarnation of our heir and give it no ledger
    /// (it would adopt us and, once we die, settle our share a second time). A succession
    /// notice from the dead incarnation's successor ends it (its ledger still listed us as a
    /// ward, so it had not settled us; and we gave the later incarnation no ledger, so it
    /// holds no record of us); two leases after we learned of the death we come back as a
    /// new incarnation instead, which only drops capacity. Whether we are orphaned is decided
    /// when we learn of the death (`Node::heir_death_noted`): deciding at the next renewal
    /// once let a lease run out after we had handed the later incarnation our ledger, and a
    /// seeded run went over L. Found with overlapping failures: a 4-ring without loss, node 3
    /// cut off and settled by node 0, node 0 crashed and restarted before its verdict got
    /// through, and node 3 took a lease from node 0's new incarnation: Σ enforced = L +
    /// 10,750.
    pub(super) fn orphaned(&self, now: Nanos) -> bool {
        self.lifecycle == Lifecycle::Active
            && self.lease_state(now) == LeaseState::Expired
            && self.lease_heir_gone()
    }

    /// The heir incarnation that granted our lease — or, before any did, the one we sent our
    /// ledger to (it may hold a ward record of us, and declare us dead) — is no longer the one
    /// our heir's link is with (we froze it, or our heir changed). Found by the counting sweep
    /// (`SWEEP_SEED=15`, overlapping failures): a node came back from a verdict while cut off,
    /// sent its ledger once to its heir and was declared dead by it before any lease; the heir
    /// crashed, its own heir took the settlement over, and the node, never leased, took a
    /// lease from the heir's restarted incarnation and lived on, its estate counted and its
    /// other neighbours holding it dead for good (0.96 L; the capacity audit's waves could
    /// not complete around it).
    pub(super) fn lease_heir_gone(&self) -> bool {
        let inc = if self.lease_inc != 0 {
            self.lease_inc
        } else {
            self.ledger_inc
        };
        inc != 0
            && self
                .heir
                .and_then(|h| self.links.get(&h))
                .is_none_or(|l| l.inc != inc)
    }

    /// We just froze our link with the heir incarnation that granted our lease (it restarted,
    /// or its own heir is settling it). If the lease is still valid, that incarnation died
    /// before it could have declared us dead (it may only after the lease runs out): trust
    /// its next one. Otherwise we are orphaned (see `Node::orphaned`). Deciding now, not at
    /// the next renewal, matters: a lease that runs out while the new incarnation's first
    /// answers are lost must not make us orphaned.
    pub(super) fn heir_death_noted(&mut self, now: Nanos) {
        let dead = self.lease_heir_gone();
        if dead && self.lease_state(now) != LeaseState::Expired {
            self.lease_inc = 0;
            self.ledger_inc = 0;
            self.orphaned_at = None;
        } else if dead && self.orphaned_at.is_none() {
            self.orphaned_at = Some(now);
        }
    }

    /// Whether our heir holds our ledger version `v` (or we have no heir).
    ///
    /// A settlement acts on others — settle requests that make the dead node's neighbours
    /// freeze it, succession notices that move its wards to us — only once our heir holds
    /// a ledger recording it. Otherwise, if we die before our next report, our heir settles
    /// us with a ledger that still lists the dead node as our ward and sends it a succession
    /// notice: a node already declared dead gets a fresh lease, and with it the power to
    /// settle its own stale wards, which our notices have moved to us (capacity counted
    /// twice; docs/PROTOCOL.md, "Settlements across a multi-node cut").
    pub(super) fn announced(&self, v: u64) -> bool {
        self.heir.is_none() || self.ledger_acked >= v
    }
}
