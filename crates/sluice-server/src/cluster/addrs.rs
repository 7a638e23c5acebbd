//! Where the peers are: `--peers` entries, and the table of addresses the driver sends to.
//!
//! An entry given as an IP literal is its address for good. An entry given by host name is
//! resolved in the background, at start and then every [`RESOLVE_EVERY`]: on Kubernetes a
//! StatefulSet's pods start before their peers' DNS records exist, and a pod that restarts
//! comes back with a new IP under the same name. A name that does not resolve yet does not
//! stop the node: messages to that peer are not sent (counted, like losses, they only delay)
//! until it does, and `/v1/cluster` and `/metrics` show it as unresolved. Once resolved, the
//! last address found is kept through failed lookups (a datagram to a stale address is lost
//! at worst, and is authenticated anyway).
//!
//! Lookups go through a [`Resolver`], so tests can move a name without real DNS.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use sluice_coord::wire::NodeId;

use super::{ClusterError, PeerSpec};

/// How often the entries given by name are looked up again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// A peer's address as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAddr {
    /// An IP literal: used as given, never looked up.
    Ip(SocketAddr),
    /// A host name, re-resolved every [`RESOLVE_EVERY`].
    Name {
        /// The host name.
        host: String,
        /// The peer port.
        port: u16,
    },
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> Self {
        Self::Ip(addr)
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(a) => write!(f, "{a}"),
            Self::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// Turns a host name into addresses. Called on a blocking thread, never on the driver's task.
pub trait Resolver: Send + Sync + fmt::Debug + 'static {
    /// The addresses of `host` with `port`; an error or nothing if it does not resolve.
    ///
    /// # Errors
    /// The lookup's error.
    fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>>;
}

/// The system's resolver (`getaddrinfo`: /etc/hosts, then DNS).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        std::net::ToSocketAddrs::to_socket_addrs(&(host, port)).map(Iterator::collect)
    }
}

/// Parses `ID=HOST:PORT[,ID=HOST:PORT…]` (`--peers`), weight 1 each; `ID=HOST:PORT@W` sets a
/// weight. Nothing is looked up here: a host name is resolved by the running driver.
///
/// # Errors
/// [`ClusterError::Invalid`] naming the bad entry (no `=`, a bad id, host, port or weight).
pub fn parse_peers(text: &str) -> Result<Vec<PeerSpec>, ClusterError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |why: &str| {
            ClusterError::Invalid(format!(
                "--peers entry `{item}`: {why} (expected ID=HOST:PORT[@WEIGHT])"
            ))
        };
        let (id, rest) = item.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| bad("the id must be an integer"))?;
        let (addr, weight) = match rest.rsplit_once('@') {
            Some((a, w)) => (a, w.trim().parse::<f64>().map_err(|_| bad("bad weight"))?),
            None => (rest, 1.0),
        };
        if !(weight.is_finite() && weight > 0.0) {
            return Err(bad("the weight must be positive"));
        }
        let addr = parse_addr(addr).map_err(bad)?;
        out.push(PeerSpec { id, addr, weight });
    }
    Ok(out)
}

/// Parses `HOST:PORT` (an IP literal, `[v6]:port`, or a host name looked up later); the
/// error says what is wrong.
pub fn parse_addr(addr: &str) -> Result<PeerAddr, &'static str> {
    let addr = addr.trim();
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(PeerAddr::Ip(a));
    }
    let (host, port) = addr.rsplit_once(':').ok_or("no port")?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or("bad port")?;
    // An IP without a port number it parses, or an unbracketed IPv6 address.
    if host.is_empty() || host.contains([':', '[', ']', '/', ' ']) {
        return Err("bad host");
    }
    Ok(match host.parse::<IpAddr>() {
        Ok(ip) => PeerAddr::Ip(SocketAddr::new(ip, port)),
        Err(_) => PeerAddr::Name {
            host: host.to_owned(),
            port,
        },
    })
}

/// One peer's entry in the table.
#[derive(Debug)]
struct Entry {
    given: PeerAddr,
    /// Where messages go; `None` until a name first resolves.
    current: Option<SocketAddr>,
    /// The last lookup's failure, while it keeps failing.
    error: Option<String>,
    /// Where it was found: `peers` (configured), or how it was discovered at run time.
    source: String,
}

/// What the status page shows of one peer's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddrView {
    pub(crate) current: Option<SocketAddr>,
    pub(crate) host: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) source: Option<String>,
}

/// The peers' current addresses: read by the driver for every message, written by the
/// background lookups.
#[derive(Debug)]
pub(crate) struct Addrs {
    entries: RwLock<BTreeMap<NodeId, Entry>>,
    /// Prefer IPv4 answers: the peer socket is bound to an IPv4 address (it cannot send to
    /// IPv6 ones), as `localhost` may answer `::1` first.
    prefer_v4: bool,
}

impl Addrs {
    pub(crate) fn new<'a>(peers: impl IntoIterator<Item = &'a PeerSpec>, prefer_v4: bool) -> Self {
        let entries = peers
            .into_iter()
            .map(|p| {
                let current = match p.addr {
                    PeerAddr::Ip(a) => Some(a),
                    PeerAddr::Name { .. } => None,
                };
                let entry = Entry {
                    given: p.addr.clone(),
                    current,
                    error: None,
                    source: "peers".into(),
                };
                (p.id, entry)
            })
            .collect();
        Self {
            entries: RwLock::new(entries),
            prefer_v4,
        }
    }

    /// Where messages to `id` go now.
    pub(crate) fn get(&self, id: NodeId) -> Option<SocketAddr> {
        self.entries.read().get(&id).and_then(|e| e.current)
    }

    pub(crate) fn view(&self, id: NodeId) -> AddrView {
        let entries = self.entries.read();
        let Some(e) = entries.get(&id) else {
            return AddrView {
                current: None,
                host: None,
                error: None,
                source: None,
            };
        };
        AddrView {
            current: e.current,
            host: matches!(e.given, PeerAddr::Name { .. }).then(|| e.given.to_string()),
            error: e.error.clone(),
            source: Some(e.source.clone()),
        }
    }

    /// Records where node `id` is, learned at run time (`source`: how). A configured entry
    /// keeps its configured address (a name follows its lookups); a learned one follows the
    /// latest authenticated sender address or directory. At most `cap` entries. Returns
    /// whether `id` was new.
    pub(crate) fn learn(&self, id: NodeId, addr: SocketAddr, source: &str, cap: usize) -> bool {
        let mut entries = self.entries.write();
        if let Some(e) = entries.get_mut(&id) {
            if e.source != "peers" && e.current != Some(addr) {
                tracing::info!(peer = id, addr = %addr, previous = ?e.current, source, "peer moved");
                e.current = Some(addr);
                e.given = PeerAddr::Ip(addr);
            }
            return false;
        }
        if entries.len() >= cap {
            return false;
        }
        entries.insert(
            id,
            Entry {
                given: PeerAddr::Ip(addr),
                current: Some(addr),
                error: None,
                source: source.to_owned(),
            },
        );
        true
    }

    /// Forgets a learned entry (a joiner that is gone); configured ones stay.
    pub(crate) fn forget(&self, id: NodeId) {
        let mut entries = self.entries.write();
        if entries.get(&id).is_some_and(|e| e.source != "peers") {
            entries.remove(&id);
        }
    }

    /// Every node with an entry, and where messages to it go.
    pub(crate) fn all(&self) -> Vec<(NodeId, Option<SocketAddr>)> {
        self.entries
            .read()
            .iter()
            .map(|(&id, e)| (id, e.current))
            .collect()
    }

    /// Peers given by name that have not resolved yet.
    pub(crate) fn unresolved(&self) -> usize {
        self.entries
            .read()
            .values()
            .filter(|e| e.current.is_none())
            .count()
    }

    /// The entries to look up: `(id, host, port)`.
    pub(crate) fn names(&self) -> Vec<(NodeId, String, u16)> {
        self.entries
            .read()
            .iter()
            .filter_map(|(&id, e)| match &e.given {
                PeerAddr::Name { host, port } => Some((id, host.clone(), *port)),
                PeerAddr::Ip(_) => None,
            })
            .collect()
    }

    /// Applies one lookup of `id`'s name. Logs a change of address, and a failure once per
    /// run of failures (a lookup every few seconds would flood the log otherwise).
    pub(crate) fn update(&self, id: NodeId, found: std::io::Result<Vec<SocketAddr>>) {
        let mut entries = self.entries.write();
        let Some(e) = entries.get_mut(&id) else {
            return;
        };
        let found = match found {
            Ok(list) if !list.is_empty() => Ok(list),
            Ok(_) => Err("no address".to_owned()),
            Err(err) => Err(err.to_string()),
        };
        match found {
            Ok(list) => {
                e.error = None;
                // Keep the address in use while the name still has it (a name with several
                // records must not make the link hop between them).
                if e.current.is_some_and(|c| list.contains(&c)) {
                    return;
                }
                let pick = list
                    .iter()
                    .find(|a| a.is_ipv4() == self.prefer_v4)
                    .or_else(|| list.first())
                    .copied();
                tracing::info!(
                    peer = id,
                    name = %e.given,
                    addr = ?pick,
                    previous = ?e.current,
                    "peer name resolved"
                );
                e.current = pick;
            }
            Err(why) => {
                if e.error.is_none() {
                    tracing::warn!(
                        peer = id,
                        name = %e.given,
                        error = %why,
                        kept = ?e.current,
                        retry_every = ?RESOLVE_EVERY,
                        "peer name does not resolve (yet); messages to it wait until it does"
                    );
                }
                e.error = Some(why);
            }
        }
    }
}

/// Looks every name up once, each on a blocking thread, and applies the answers.
pub(crate) async fn refresh(addrs: &Addrs, resolver: &Arc<dyn Resolver>) {
    for (id, host, port) in addrs.names() {
        let r = resolver.clone();
        let found = tokio::task::spawn_blocking(move || r.resolve(&host, port))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        addrs.update(id, found);
    }
}

/// Looks the names up now and then every `every`, for as long as it runs (the driver aborts
/// it when it stops).
pub(crate) async fn follow(addrs: Arc<Addrs>, resolver: Arc<dyn Resolver>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        refresh(&addrs, &resolver).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> PeerSpec {
        let mut v = parse_peers(text).unwrap();
        assert_eq!(v.len(), 1, "{text}");
        v.remove(0)
    }

    #[test]
    fn ip_literals_and_names_parse_without_a_lookup() {
        assert_eq!(
            one("1=10.0.0.2:8082").addr,
            PeerAddr::Ip("10.0.0.2:8082".parse().unwrap())
        );
        assert_eq!(
            one("2=[::1]:8082@0.5"),
            PeerSpec {
                id: 2,
                addr: PeerAddr::Ip("[::1]:8082".parse().unwrap()),
                weight: 0.5
            }
        );
        // A name that cannot resolve (the .invalid TLD never does) is still a valid entry.
        assert_eq!(
            one("3=sluice-3.sluice-peers.invalid:8082").addr,
            PeerAddr::Name {
                host: "sluice-3.sluice-peers.invalid".into(),
                port: 8082
            }
        );
        let v = parse_peers(" 0=a:1 , 1=b:2@2 ,").unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].weight, 2.0);
    }

    #[test]
    fn malformed_entries_are_refused_with_the_reason() {
        for (text, why) in [
            ("10.0.0.2:8082", "no `=`"),
            ("x=10.0.0.2:8082", "the id must be an integer"),
            ("-1=10.0.0.2:8082", "the id must be an integer"),
            ("1=host", "no port"),
            ("1=host:", "bad port"),
            ("1=host:http", "bad port"),
            ("1=host:70000", "bad port"),
            ("1=host:0", "bad port"),
            ("1=:8082", "bad host"),
            ("1=::1:8082", "bad host"),
            ("1=host:8082@w", "bad weight"),
            ("1=host:8082@0", "the weight must be positive"),
            ("1=host:8082@-1", "the weight must be positive"),
            ("1=host:8082@inf", "the weight must be positive"),
        ] {
            let e = parse_peers(text).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(text), "{text}: {e}");
        }
    }

    #[test]
    fn lookups_update_the_table_and_keep_the_last_address() {
        let peers = parse_peers("1=10.0.0.1:1,2=peer-2:8082").unwrap();
        let addrs = Addrs::new(&peers, true);
        assert_eq!(addrs.get(1), Some("10.0.0.1:1".parse().unwrap()));
        assert_eq!(addrs.get(2), None);
        assert_eq!(addrs.unresolved(), 1);
        assert_eq!(addrs.names(), vec![(2, "peer-2".to_owned(), 8082)]);
        addrs.update(2, Err(std::io::Error::other("not yet")));
        let v = addrs.view(2);
        assert_eq!((v.current, v.host.as_deref()), (None, Some("peer-2:8082")));
        assert_eq!(v.error.as_deref(), Some("not yet"));

        let a: SocketAddr = "10.0.0.2:8082".parse().unwrap();
        let b: SocketAddr = "10.0.0.3:8082".parse().unwrap();
        let v6: SocketAddr = "[fd00::2]:8082".parse().unwrap();
        // An IPv4 socket cannot send to IPv6: the IPv4 answer is taken.
        addrs.update(2, Ok(vec![v6, a]));
        assert_eq!(addrs.get(2), Some(a));
        assert_eq!(addrs.unresolved(), 0);
        // Still among the answers: kept.
        addrs.update(2, Ok(vec![b, a]));
        assert_eq!(addrs.get(2), Some(a));
        // Gone (the pod came back with a new IP): followed.
        addrs.update(2, Ok(vec![b]));
        assert_eq!(addrs.get(2), Some(b));
        // A failed lookup keeps the last address.
        addrs.update(2, Ok(vec![]));
        assert_eq!(addrs.get(2), Some(b));
        assert_eq!(addrs.view(2).error.as_deref(), Some("no address"));
    }

    /// The system resolver answers `localhost` with a loopback address, without DNS.
    #[test]
    fn the_system_resolver_finds_localhost() {
        let found = SystemResolver.resolve("localhost", 8082).unwrap();
        assert!(
            found
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 8082),
            "{found:?}"
        );
        assert!(!found.is_empty());
    }
}
