//! Peer transport: `sluice-coord` messages in authenticated UDP datagrams.
//!
//! Why UDP (docs/PROTOCOL.md "Peer transport"): every coordination message carries the
//! sender's *whole* monotone counters, so it is idempotent and a lost one only delays
//! (seed 003 §IV). The protocol wants the newest message, not every message in order: a
//! stream would add head-of-line blocking and reconnects for nothing.
//!
//! A datagram is `"SLC1" · from (u32 BE) · to (u32 BE) · payload · tag`, where the tag is
//! HMAC-SHA256 over everything before it, truncated to 16 bytes (RFC 2104 §5), under a key
//! the cluster shares. The receiver drops, and counts, any datagram whose tag does not
//! verify or whose `to` is not itself (a directory may go to "whoever is there", see
//! [`open_any`]) — a message for another node replayed here would credit this node with
//! gifts made to someone else.
//! A replayed authentic datagram changes nothing: its counters are stale by then.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The datagram socket the cluster driver sends and receives through (chitchat's
/// `Transport`, reduced to what a datagram needs): the tokio UDP socket in production, a
/// simulated network's socket in the partition tests (`tests/partition.rs`), so those tests
/// run the very driver `sluice serve` runs.
///
/// The driver is generic over it, so production calls the tokio socket directly (no boxing,
/// no dynamic dispatch).
pub trait Transport: Send + Sync + std::fmt::Debug + 'static {
    /// Sends one datagram to `to`; returns the bytes sent.
    fn send_to(
        &self,
        datagram: &[u8],
        to: SocketAddr,
    ) -> impl Future<Output = io::Result<usize>> + Send;

    /// Receives one datagram into `buf`; returns its length and sender. Must be cancel safe:
    /// the driver races it against its timers in `select!`, and a datagram must not be lost
    /// because a timer fired first.
    fn recv_from(
        &self,
        buf: &mut [u8],
    ) -> impl Future<Output = io::Result<(usize, SocketAddr)>> + Send;

    /// Receives one datagram already queued, without waiting: `WouldBlock` when none is.
    /// The driver takes what queued up behind a datagram in one batch. The default never
    /// has one (one datagram at a time).
    ///
    /// # Errors
    /// `WouldBlock` when nothing is queued; otherwise as the socket's own.
    fn try_recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let _ = buf;
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// The address this transport receives on.
    ///
    /// # Errors
    /// As the socket's own.
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

impl Transport for tokio::net::UdpSocket {
    fn send_to(
        &self,
        datagram: &[u8],
        to: SocketAddr,
    ) -> impl Future<Output = io::Result<usize>> + Send {
        tokio::net::UdpSocket::send_to(self, datagram, to)
    }

    fn recv_from(
        &self,
        buf: &mut [u8],
    ) -> impl Future<Output = io::Result<(usize, SocketAddr)>> + Send {
        // Cancel safe (tokio documents it).
        tokio::net::UdpSocket::recv_from(self, buf)
    }

    fn try_recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        tokio::net::UdpSocket::try_recv_from(self, buf)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        tokio::net::UdpSocket::local_addr(self)
    }
}

/// The magic and version at the start of every datagram.
pub const MAGIC: &[u8; 4] = b"SLC1";
/// Header bytes: magic, from, to.
pub const HEADER: usize = 12;
/// Tag bytes (HMAC-SHA256 truncated).
pub const TAG: usize = 16;
/// Largest datagram sent or accepted (IPv4 UDP payload limit).
pub const MAX_DATAGRAM: usize = 65_507;

/// The cluster's shared key.
#[derive(Clone)]
pub struct PeerKey(Vec<u8>);

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.write_str("PeerKey(..)")
    }
}

/// Why a key or a datagram was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The key is too short to be a secret.
    #[error(
        "peer key must be at least 16 bytes (got {0}); generate one with e.g. `openssl rand -hex 32`"
    )]
    ShortKey(usize),
    /// Shorter than a header and a tag, or not our magic.
    #[error("not a sluice peer datagram")]
    NotOurs,
    /// The tag does not verify: not from a holder of the cluster key, or altered.
    #[error("authentication failed")]
    BadTag,
    /// Authentic, but addressed to another node.
    #[error("addressed to node {0}")]
    WrongRecipient(u32),
    /// The message does not fit in one datagram.
    #[error("message of {0} bytes does not fit in one datagram ({MAX_DATAGRAM} bytes)")]
    TooLarge(usize),
}

impl PeerKey {
    /// A key from its bytes (at least 16).
    ///
    /// # Errors
    /// [`PeerError::ShortKey`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, PeerError> {
        let bytes = bytes.into();
        if bytes.len() < 16 {
            return Err(PeerError::ShortKey(bytes.len()));
        }
        Ok(Self(bytes))
    }

    /// A key from the text of a key file or variable: surrounding whitespace is ignored.
    ///
    /// # Errors
    /// [`PeerError::ShortKey`].
    pub fn from_text(text: &str) -> Result<Self, PeerError> {
        Self::new(text.trim().as_bytes().to_vec())
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; this cannot fail.
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"))
    }
}

/// Frames `payload` from `from` to `to`.
///
/// # Errors
/// [`PeerError::TooLarge`] when the datagram would exceed [`MAX_DATAGRAM`].
pub fn seal(key: &PeerKey, from: u32, to: u32, payload: &[u8]) -> Result<Vec<u8>, PeerError> {
    let len = HEADER + payload.len() + TAG;
    if len > MAX_DATAGRAM {
        return Err(PeerError::TooLarge(len));
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&from.to_be_bytes());
    out.extend_from_slice(&to.to_be_bytes());
    out.extend_from_slice(payload);
    let mut mac = key.mac();
    mac.update(&out);
    let tag = mac.finalize().into_bytes();
    out.extend_from_slice(&tag[..TAG]);
    Ok(out)
}

/// Checks a datagram received by node `me`; returns the sender and the payload.
///
/// # Errors
/// [`PeerError::NotOurs`], [`PeerError::BadTag`] or [`PeerError::WrongRecipient`]; the
/// datagram must then be dropped.
pub fn open<'d>(key: &PeerKey, me: u32, datagram: &'d [u8]) -> Result<(u32, &'d [u8]), PeerError> {
    let (from, _, payload) = open_to(key, me, None, datagram)?;
    Ok((from, payload))
}

/// [`open`], also accepting datagrams addressed to `any` (a node whose id the sender did not
/// know yet: a directory to a discovered address); returns the sender, the recipient and the
/// payload. The caller must accept only directories addressed to `any`: a coordination
/// message names its recipient.
///
/// # Errors
/// As [`open`].
pub fn open_any<'d>(
    key: &PeerKey,
    me: u32,
    any: u32,
    datagram: &'d [u8],
) -> Result<(u32, u32, &'d [u8]), PeerError> {
    open_to(key, me, Some(any), datagram)
}

fn open_to<'d>(
    key: &PeerKey,
    me: u32,
    any: Option<u32>,
    datagram: &'d [u8],
) -> Result<(u32, u32, &'d [u8]), PeerError> {
    if datagram.len() < HEADER + TAG || &datagram[..4] != MAGIC {
        return Err(PeerError::NotOurs);
    }
    let (body, tag) = datagram.split_at(datagram.len() - TAG);
    let mut mac = key.mac();
    mac.update(body);
    // Constant time, so the tag cannot be guessed byte by byte.
    mac.verify_truncated_left(tag)
        .map_err(|_| PeerError::BadTag)?;
    let word = |i: usize| u32::from_be_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
    let (from, to) = (word(4), word(8));
    if to != me && Some(to) != any {
        return Err(PeerError::WrongRecipient(to));
    }
    Ok((from, to, &body[HEADER..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> PeerKey {
        PeerKey::from_text("0123456789abcdef0123456789abcdef\n").unwrap()
    }

    #[test]
    fn round_trip() {
        let d = seal(&key(), 3, 7, b"hello").unwrap();
        assert_eq!(open(&key(), 7, &d).unwrap(), (3, &b"hello"[..]));
    }

    #[test]
    fn wrong_key_recipient_or_short_key_refused() {
        let d = seal(&key(), 3, 7, b"hello").unwrap();
        let other = PeerKey::new(b"another key, 16+ bytes".to_vec()).unwrap();
        assert_eq!(open(&other, 7, &d), Err(PeerError::BadTag));
        assert_eq!(open(&key(), 8, &d), Err(PeerError::WrongRecipient(7)));
        assert_eq!(
            PeerKey::new(b"short".to_vec()).unwrap_err(),
            PeerError::ShortKey(5)
        );
        assert!(seal(&key(), 1, 2, &vec![0; MAX_DATAGRAM]).is_err());
    }

    proptest! {
        /// Any change to an authentic datagram (a flipped bit anywhere, header included) is
        /// refused; so is any random input (the decoder never sees it).
        #[test]
        fn tampering_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..300),
                                 bit in any::<prop::sample::Index>()) {
            let mut d = seal(&key(), 1, 2, &payload).unwrap();
            let i = bit.index(d.len() * 8);
            d[i / 8] ^= 1 << (i % 8);
            prop_assert!(open(&key(), 2, &d).is_err());
        }

        #[test]
        fn random_bytes_refused(d in proptest::collection::vec(any::<u8>(), 0..200)) {
            prop_assert!(open(&key(), 2, &d).is_err());
        }
    }
}
