//! The directory: what a node tells other key holders about the cluster, so that nodes can
//! join a running cluster and find each other (docs/PROTOCOL.md, "Membership").
//!
//! A directory travels in an authenticated peer datagram like a coordination message, its
//! payload starting with [`TAG`] (a coordination message starts with its wire version, far
//! below). It says who the sender believes the voting members are, whether it holds a lease,
//! and which nodes it has a live link with and where they are. It carries no capacity: a
//! lost, repeated or replayed directory only proposes addresses and links, and what a link
//! carries is decided by the coordination messages (authenticated, addressed, monotone).
//!
//! Sent to [`ANY`] (the recipient's id unknown: a seed or a discovered address), it asks
//! for a directory back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use sluice_coord::wire::NodeId;

/// First payload byte of a directory.
pub(crate) const TAG: u8 = 0xD1;
/// The recipient of a datagram to an address whose node id is not known yet.
pub(crate) const ANY: NodeId = NodeId::MAX;
/// Most nodes listed in one directory (a directory must fit one datagram, and nobody needs
/// more to find the rest: every listed node lists its own).
pub(crate) const MAX_LISTED: usize = 256;

/// What a directory says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Directory {
    /// The sender holds a lease (it is part of a running cluster).
    pub(crate) leased: bool,
    /// The sender's voting members, sorted.
    pub(crate) voters: Vec<NodeId>,
    /// Nodes the sender has a live link with, and where it sends to them.
    pub(crate) known: Vec<(NodeId, SocketAddr)>,
}

/// Why a directory was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DirectoryError {
    /// Shorter than it says, or a bad tag or address family.
    #[error("malformed directory")]
    Malformed,
}

impl Directory {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let voters = self.voters.len().min(MAX_LISTED);
        let known = self.known.len().min(MAX_LISTED);
        let mut out = Vec::with_capacity(8 + 4 * voters + 23 * known);
        out.push(TAG);
        out.push(u8::from(self.leased));
        out.extend_from_slice(&(voters as u16).to_be_bytes());
        for v in &self.voters[..voters] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&(known as u16).to_be_bytes());
        for (id, addr) in &self.known[..known] {
            out.extend_from_slice(&id.to_be_bytes());
            match addr.ip() {
                IpAddr::V4(ip) => {
                    out.push(4);
                    out.extend_from_slice(&ip.octets());
                }
                IpAddr::V6(ip) => {
                    out.push(6);
                    out.extend_from_slice(&ip.octets());
                }
            }
            out.extend_from_slice(&addr.port().to_be_bytes());
        }
        out
    }

    /// Decodes a directory; never panics on any input.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, DirectoryError> {
        let mut r = Reader(bytes);
        if r.take::<1>()? != [TAG] {
            return Err(DirectoryError::Malformed);
        }
        let leased = match r.take::<1>()? {
            [0] => false,
            [1] => true,
            _ => return Err(DirectoryError::Malformed),
        };
        let n = usize::from(u16::from_be_bytes(r.take::<2>()?));
        if n > MAX_LISTED {
            return Err(DirectoryError::Malformed);
        }
        let mut voters = Vec::with_capacity(n);
        for _ in 0..n {
            voters.push(NodeId::from_be_bytes(r.take::<4>()?));
        }
        voters.sort_unstable();
        voters.dedup();
        let n = usize::from(u16::from_be_bytes(r.take::<2>()?));
        if n > MAX_LISTED {
            return Err(DirectoryError::Malformed);
        }
        let mut known = Vec::with_capacity(n);
        for _ in 0..n {
            let id = NodeId::from_be_bytes(r.take::<4>()?);
            let ip = match r.take::<1>()? {
                [4] => IpAddr::V4(Ipv4Addr::from(r.take::<4>()?)),
                [6] => IpAddr::V6(Ipv6Addr::from(r.take::<16>()?)),
                _ => return Err(DirectoryError::Malformed),
            };
            let port = u16::from_be_bytes(r.take::<2>()?);
            known.push((id, SocketAddr::new(ip, port)));
        }
        if !r.0.is_empty() {
            return Err(DirectoryError::Malformed);
        }
        Ok(Self {
            leased,
            voters,
            known,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DirectoryError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(DirectoryError::Malformed)?;
        self.0 = rest;
        Ok(*head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let d = Directory {
            leased: true,
            voters: vec![0, 1, 2],
            known: vec![
                (1, "127.0.0.1:7001".parse().unwrap()),
                (3_000_000_000, "[::1]:7003".parse().unwrap()),
            ],
        };
        let bytes = d.encode();
        assert_eq!(bytes[0], TAG);
        assert_eq!(Directory::decode(&bytes), Ok(d));
        // Truncated anywhere, or with a byte too many: refused, not misread.
        for cut in 0..bytes.len() {
            assert!(Directory::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Directory::decode(&long).is_err());
    }

    #[test]
    fn the_tag_is_not_a_wire_version() {
        // A coordination payload starts with its version: never mistaken for a directory.
        assert!(u32::from(sluice_coord::wire::VERSION) < u32::from(TAG));
    }

    proptest! {
        /// Any bytes decode to a directory or an error, never a panic.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Directory::decode(&bytes);
            let mut tagged = vec![TAG];
            tagged.extend_from_slice(&bytes);
            let _ = Directory::decode(&tagged);
        }

        /// What is encoded decodes back (voters sorted and unique).
        #[test]
        fn encode_decode(leased in any::<bool>(),
                         mut voters in proptest::collection::vec(any::<u32>(), 0..20),
                         known in proptest::collection::vec((any::<u32>(), any::<[u8; 4]>(), any::<u16>()), 0..20)) {
            voters.sort_unstable();
            voters.dedup();
            let d = Directory {
                leased,
                voters,
                known: known.into_iter().map(|(id, ip, port)| (id, SocketAddr::new(IpAddr::from(ip), port))).collect(),
            };
            prop_assert_eq!(Directory::decode(&d.encode()), Ok(d));
        }
    }
}
