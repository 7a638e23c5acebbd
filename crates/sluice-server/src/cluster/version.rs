//! The wire version spoken on each link (docs/PROTOCOL.md, "Versions").
//!
//! The rule: to each peer, speak the version of the *latest* message heard from it, capped
//! at ours; before hearing it, speak ours. A peer of the previous version refuses our first
//! messages (its `rejected_version`) and answers in its own, which we then speak; a peer
//! upgraded later is heard speaking the newer version and we follow; a rollback is followed
//! too (latest, not highest). A peer heard speaking a version above ours is newer and reads
//! ours: we speak ours to it. Every message carries whole monotone counters, so the
//! messages lost while a link finds its version only delay.
//!
//! While speaking below ours, every [`PROBE_EVERY`]th message to the peer goes in ours. Two
//! nodes of this build can otherwise keep each other on the older version for ever: a node
//! restarted onto it may first hear a peer still answering its predecessor in the older
//! version, follow it down, and be followed in turn. A peer of the older build refuses the
//! probe (one message lost in `PROBE_EVERY`: it only delays); one of this build reads it and
//! answers in ours, which we then follow.

use std::collections::BTreeMap;

use parking_lot::Mutex;
use sluice_coord::wire::{self, Message, NodeId, WireError};

use super::ClusterError;

/// While speaking below our version to a peer, one message in this many goes in ours.
pub(crate) const PROBE_EVERY: u32 = 16;

/// The versions this node reads and speaks, and what each peer was last heard speaking.
#[derive(Debug)]
pub(crate) struct Versions {
    /// The highest version we speak and accept: [`wire::VERSION`], or less to behave as a
    /// node of an earlier build (`sluice serve --wire-version`, for upgrade tests).
    ours: u8,
    links: Mutex<BTreeMap<NodeId, Link>>,
}

#[derive(Debug, Clone, Copy)]
struct Link {
    /// What we speak to the peer: the version it was last heard in, at most ours.
    version: u8,
    /// Messages sent to it below ours (for the probes).
    sends: u32,
}

impl Versions {
    /// Speaking and accepting at most `ours`.
    ///
    /// # Errors
    /// [`ClusterError::Invalid`] for a version this build cannot speak (outside
    /// `wire::MIN_VERSION..=wire::VERSION`).
    pub(crate) fn new(ours: u8) -> Result<Self, ClusterError> {
        if !(wire::MIN_VERSION..=wire::VERSION).contains(&ours) {
            return Err(ClusterError::Invalid(format!(
                "wire version {ours}: this build speaks {} to {}",
                wire::MIN_VERSION,
                wire::VERSION
            )));
        }
        Ok(Self {
            ours,
            links: Mutex::new(BTreeMap::new()),
        })
    }

    /// Forgets `peer` (a joiner that is gone): memory follows the live membership.
    pub(crate) fn forget(&self, peer: NodeId) {
        self.links.lock().remove(&peer);
    }

    /// Decodes an authentic message from `from` and notes the version it speaks. A version
    /// above ours is refused as [`WireError::Version`], as a build of ours would refuse it,
    /// and noted too (that peer reads ours).
    ///
    /// # Errors
    /// As [`wire::decode`].
    pub(crate) fn decode(&self, from: NodeId, payload: &[u8]) -> Result<Message, WireError> {
        let (msg, v) = match wire::decode_versioned(payload) {
            Ok((msg, v)) if v <= self.ours => (Ok(msg), v),
            Ok((_, v)) => (Err(WireError::Version(v)), v),
            Err(WireError::Version(v)) => (Err(WireError::Version(v)), v),
            Err(e) => return Err(e),
        };
        // Below the oldest we read: nothing we could answer in.
        if v >= wire::MIN_VERSION {
            let version = v.min(self.ours);
            self.links
                .lock()
                .entry(from)
                .and_modify(|l| l.version = version)
                .or_insert(Link { version, sends: 0 });
        }
        msg
    }

    /// The version we speak to `peer` now (probes aside).
    pub(crate) fn speak(&self, peer: NodeId) -> u8 {
        self.links
            .lock()
            .get(&peer)
            .map_or(self.ours, |l| l.version.min(self.ours))
    }

    /// `msg` encoded for `to`: in the version we speak to it, or ours for a probe.
    pub(crate) fn encode(&self, to: NodeId, msg: &Message) -> Vec<u8> {
        let v = {
            let mut links = self.links.lock();
            match links.get_mut(&to) {
                Some(l) if l.version < self.ours => {
                    l.sends = l.sends.wrapping_add(1);
                    if l.sends.is_multiple_of(PROBE_EVERY) {
                        self.ours
                    } else {
                        l.version
                    }
                }
                _ => self.ours,
            }
        };
        // `v` is in range by construction (ours checked, heard ones capped); were it not,
        // our own version is the safe answer (a peer that cannot read it says so).
        wire::encode_as(msg, v).unwrap_or_else(|_| wire::encode(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: u8 = wire::MIN_VERSION;
    const NEW: u8 = wire::VERSION;

    fn msg(sent_at: u64) -> Message {
        Message {
            from_inc: 1,
            sent_at,
            members: wire::members_digest(&[0, 1]),
            ..Message::default()
        }
    }

    /// `to` receives `from`'s next message; whether it read it.
    fn deliver(from: (&Versions, NodeId), to: (&Versions, NodeId), t: u64) -> bool {
        let bytes = from.0.encode(to.1, &msg(t));
        match to.0.decode(from.1, &bytes) {
            Ok(m) => {
                assert_eq!(m.sent_at, t);
                true
            }
            Err(e) => {
                assert_eq!(e, WireError::Version(NEW));
                false
            }
        }
    }

    /// How many of `rounds` exchanges got through each way between an old node 0 (speaking
    /// and reading at most `OLD`) and a new node 1 that negotiates or, as the control, always
    /// speaks its own version.
    fn link(rounds: u64, negotiate: bool) -> (u64, u64) {
        let old = Versions::new(OLD).unwrap();
        let new = Versions::new(NEW).unwrap();
        let (mut to_old, mut to_new) = (0, 0);
        for t in 1..=rounds {
            if negotiate {
                to_old += u64::from(deliver((&new, 1), (&old, 0), t));
            } else if old.decode(1, &wire::encode(&msg(t))).is_ok() {
                to_old += 1;
            }
            to_new += u64::from(deliver((&old, 0), (&new, 1), t));
        }
        (to_old, to_new)
    }

    /// With negotiation an old and a new node link after one refused message (and lose one
    /// probe in `PROBE_EVERY` after that); without it (each speaking only its own version)
    /// the old node never reads the new one.
    #[test]
    fn negotiation_links_an_old_and_a_new_node() {
        assert_eq!(link(10, true), (9, 10));
        let n = u64::from(PROBE_EVERY);
        assert_eq!(link(1 + 2 * n, true), (2 * n - 2, 1 + 2 * n));
        assert_eq!(link(10, false), (0, 10));
    }

    /// Latest, not highest: a peer heard in N, then in N−1 (rolled back), then in N again
    /// (upgraded again) is spoken to in each in turn; one heard above ours is spoken ours.
    #[test]
    fn the_latest_version_heard_is_spoken() {
        let v = Versions::new(NEW).unwrap();
        assert_eq!(v.speak(7), NEW, "ours before hearing the peer");
        for heard in [NEW, OLD, NEW, OLD] {
            v.decode(7, &wire::encode_as(&msg(1), heard).unwrap())
                .unwrap();
            assert_eq!(v.speak(7), heard);
            assert_eq!(v.encode(7, &msg(2))[0], heard);
        }
        assert_eq!(v.speak(8), NEW, "per link");
        // A newer build (N+1 reads N): refused, and answered in ours.
        let mut newer = wire::encode(&msg(3));
        newer[0] = NEW + 1;
        assert_eq!(v.decode(7, &newer), Err(WireError::Version(NEW + 1)));
        assert_eq!(v.speak(7), NEW);
        // Two versions below ours: refused, and nothing to answer in.
        let held = Versions::new(OLD).unwrap();
        assert_eq!(
            held.decode(7, &wire::encode(&msg(1))),
            Err(WireError::Version(NEW)),
            "a node held at N−1 refuses N as a build of N−1 does"
        );
        assert_eq!(held.speak(7), OLD);
    }

    /// Two new nodes that heard each other in N−1 (each restarted onto N heard the other
    /// still answering its predecessor) are back on N within a probe period. Without the
    /// probes they would speak N−1 to each other for ever.
    #[test]
    fn two_new_nodes_on_the_old_version_find_the_new_one() {
        let (a, b) = (Versions::new(NEW).unwrap(), Versions::new(NEW).unwrap());
        let old = wire::encode_as(&msg(1), OLD).unwrap();
        a.decode(1, &old).unwrap();
        b.decode(0, &old).unwrap();
        assert_eq!((a.speak(1), b.speak(0)), (OLD, OLD));
        for t in 0..u64::from(PROBE_EVERY) {
            assert!(deliver((&a, 0), (&b, 1), t), "every message is read");
            assert!(deliver((&b, 1), (&a, 0), t));
        }
        assert_eq!((a.speak(1), b.speak(0)), (NEW, NEW));
    }

    #[test]
    fn only_versions_of_this_build() {
        assert!(Versions::new(OLD - 1).is_err());
        assert!(Versions::new(NEW + 1).is_err());
    }
}
