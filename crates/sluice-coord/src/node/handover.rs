//! Ward handovers (docs/PROTOCOL.md, settlement rule 9): the ledger of a dead ward goes to the heir that
//! settled its dead heir.

use super::*;

impl Node {
    /// Our open ward handovers to `to` (the heir that settled their dead incarnation).
    pub(super) fn handovers_to(
        &self,
        to: NodeId,
    ) -> impl Iterator<Item = (&(u64, NodeId, u64), &Handed)> {
        self.handovers
            .iter()
            .filter(move |(k, _)| self.estate_heirs.get(&k.0) == Some(&to))
    }

    /// A ward handover from `from` (see `Node::drop_settlements`): the dead ward is ours to
    /// settle if we settled the sender's dead incarnation and no incarnation of ours ever
    /// held a record of the ward's incarnation. Safe because nobody else can settle it: it
    /// named the sender's dead incarnation its heir, which never told anyone of a settlement
    /// of it (or our ledger of the sender would list it as settled, and we decline). After
    /// that heir died the ward could name only the sender's next incarnation (which then
    /// keeps no candidate of it), another heir if that incarnation leaves (it then drops
    /// every candidate), or us, as the dead heir's successor, and from us it moves only to
    /// our successors: so if it never adopted us, the sender's ledger of it is its
    /// last. A version without the `adopted` check went over L (6-ring at 20 % loss, L +
    /// 2.6 %): the ward had adopted our earlier incarnation and moved on to its successors,
    /// one of which settled it with a fresher ledger while we settled it with the handed one.
    /// Acknowledged either way.
    pub(super) fn take_handover(&mut self, now: Nanos, from: NodeId, h: &Handover) {
        let (w, wi) = (h.ward, h.ward_incarnation);
        let ours = self.settled_with.contains_key(&(from, h.incarnation));
        let known = self.knows_ward(w, wi);
        if ours && !known && self.lifecycle != Lifecycle::Leaving {
            let ward = Ward {
                inc: wi,
                last_recv: now,
                ledger: h.ledger.clone(),
                leaving: h.leaving,
            };
            let origin = (h.kind == wire::HandoverKind::Inherited).then_some((from, h.incarnation));
            self.settle(w, ward, origin);
        }
        let ack = HandoverAck {
            incarnation: h.incarnation,
            ward: w,
            ward_incarnation: wi,
        };
        let link = self.link_entry(from, 0, false);
        let acks = &mut link.mail().handover_acks;
        if !acks.contains(&ack) {
            acks.push(ack);
        }
    }

    /// Whether an incarnation of ours ever held a record of ward `w`'s incarnation `wi` (or
    /// it is us): a handed-over ledger of it is then declined (see `take_handover`).
    pub(super) fn knows_ward(&self, w: NodeId, wi: u64) -> bool {
        w == self.cfg.id
            || self.adopted.contains(&(w, wi))
            || self.wards.get(&w).is_some_and(|x| x.inc == wi)
            || self.settling.contains_key(&(w, wi))
            || self.settled_with.contains_key(&(w, wi))
            || self.settled.get(&w).is_some_and(|&s| s >= wi)
    }

    /// `n`'s incarnation `inc` is alive: every earlier one is dead for certain. The ledgers
    /// our dead incarnations held of those (`ward_candidates`) go to the heirs that settled
    /// them (see `Node::drop_settlements`), and those incarnations are dead to us from now on
    /// (a late message must not make us adopt one we handed over). A ward that was alive
    /// when we were declared dead is revived by our heir's succession notice; one that died
    /// before adopting anyone left its ledger with us only: a 6-node graph at 21 % loss lost
    /// 0.23 L when a false suspicion of node 1 coincided with the crash of its ward.
    pub(super) fn ward_died(&mut self, n: NodeId, inc: u64) {
        if matches!(self.lifecycle, Lifecycle::Leaving | Lifecycle::Left) {
            return;
        }
        let dead: Vec<(NodeId, u64)> = self
            .ward_candidates
            .range((n, 0)..(n, inc))
            .map(|(&k, _)| k)
            .collect();
        for k in dead {
            if let Some((old, ledger)) = self.ward_candidates.remove(&k) {
                let handed = Handed {
                    ledger,
                    kind: wire::HandoverKind::Unfinished,
                    leaving: false,
                };
                self.handovers.insert((old, k.0, k.1), handed);
                let floor = self.dead_floor.entry(k.0).or_insert(0);
                *floor = (*floor).max(k.1);
            }
        }
    }
}
