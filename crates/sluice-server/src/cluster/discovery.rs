//! Discovery: addresses where other key holders may listen, whose node ids are not known
//! (`--peers HOST:PORT` seeds, `--peers-dns NAME:PORT`, `--peers-file PATH`).
//!
//! Discovery only proposes: the driver sends each candidate a directory addressed to
//! [`super::directory::ANY`], and a node that holds the cluster's key answers with its own,
//! which names it. Authentication decides who is a member, never discovery. Names are looked
//! up again, and the file read again, every [`super::RESOLVE_EVERY`] (a Kubernetes headless
//! Service's records follow its pods; a file follows whatever writes it).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use super::addrs::{PeerAddr, Resolver, parse_addr};

/// Where to look for other nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoverySpec {
    /// Seeds: addresses (or names) without a node id (`--peers HOST:PORT`).
    pub seeds: Vec<PeerAddr>,
    /// Names whose every A/AAAA record is a candidate (`--peers-dns NAME:PORT`).
    pub dns: Vec<(String, u16)>,
    /// A file of `HOST:PORT` entries (or `ID=HOST:PORT`, the id ignored), one per line or
    /// comma-separated, `#` comments (`--peers-file PATH`).
    pub file: Option<PathBuf>,
}

impl DiscoverySpec {
    /// Whether anything is to be discovered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.seeds.is_empty() && self.dns.is_empty() && self.file.is_none()
    }
}

/// The candidates found by the latest round, with where each came from.
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    found: RwLock<BTreeMap<SocketAddr, String>>,
    /// The latest round's problems (a name that does not resolve, an unreadable file).
    errors: RwLock<Vec<String>>,
}

impl Candidates {
    pub(crate) fn list(&self) -> Vec<(SocketAddr, String)> {
        self.found
            .read()
            .iter()
            .map(|(a, s)| (*a, s.clone()))
            .collect()
    }

    pub(crate) fn source(&self, addr: SocketAddr) -> Option<String> {
        self.found.read().get(&addr).cloned()
    }

    pub(crate) fn errors(&self) -> Vec<String> {
        self.errors.read().clone()
    }
}

/// Parses the text of a `--peers-file`: entries separated by commas or lines, `#` starts a
/// comment, an `ID=` prefix is allowed (and ignored: the directory says who is there).
///
/// # Errors
/// The bad entry and why.
pub fn parse_peers_file(text: &str) -> Result<Vec<PeerAddr>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        for item in line.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let addr = item.split_once('=').map_or(item, |(_, a)| a);
            let addr = addr.rsplit_once('@').map_or(addr, |(a, _)| a);
            out.push(parse_addr(addr).map_err(|why| format!("`{item}`: {why}"))?);
        }
    }
    Ok(out)
}

/// One round: every seed, name and file entry looked up (on blocking threads).
pub(crate) async fn refresh(
    spec: &DiscoverySpec,
    resolver: &Arc<dyn Resolver>,
    into: &Candidates,
    prefer_v4: bool,
) {
    let mut wanted: Vec<(PeerAddr, String)> = spec
        .seeds
        .iter()
        .map(|a| (a.clone(), "peers".to_owned()))
        .collect();
    wanted.extend(spec.dns.iter().map(|(host, port)| {
        (
            PeerAddr::Name {
                host: host.clone(),
                port: *port,
            },
            format!("dns:{host}"),
        )
    }));
    let mut errors = Vec::new();
    if let Some(path) = &spec.file {
        let p = path.clone();
        let text = tokio::task::spawn_blocking(move || std::fs::read_to_string(p))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        match text
            .map_err(|e| e.to_string())
            .and_then(|t| parse_peers_file(&t))
        {
            Ok(list) => wanted.extend(
                list.into_iter()
                    .map(|a| (a, format!("file:{}", path.display()))),
            ),
            Err(e) => errors.push(format!("--peers-file {}: {e}", path.display())),
        }
    }
    let mut found = BTreeMap::new();
    for (addr, source) in wanted {
        match addr {
            PeerAddr::Ip(a) => {
                found.insert(a, source);
            }
            PeerAddr::Name { host, port } => {
                let r = resolver.clone();
                let h = host.clone();
                let got = tokio::task::spawn_blocking(move || r.resolve(&h, port))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
                match got {
                    Ok(list) => {
                        // An IPv4 socket cannot send to IPv6 addresses (and the reverse).
                        for a in list.into_iter().filter(|a| a.is_ipv4() == prefer_v4) {
                            found.entry(a).or_insert_with(|| source.clone());
                        }
                    }
                    Err(e) => errors.push(format!("{host}:{port}: {e}")),
                }
            }
        }
    }
    if *into.errors.read() != errors {
        for e in &errors {
            tracing::warn!(error = %e, "discovery: cannot look up peers (yet)");
        }
    }
    *into.found.write() = found;
    *into.errors.write() = errors;
}

/// Rounds now and then every `every`, for as long as it runs (the driver aborts it).
pub(crate) async fn follow(
    spec: DiscoverySpec,
    resolver: Arc<dyn Resolver>,
    into: Arc<Candidates>,
    prefer_v4: bool,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        refresh(&spec, &resolver, &into, prefer_v4).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_file_takes_lines_commas_comments_and_ids() {
        let list = parse_peers_file(
            "# the cluster\n10.0.0.1:8082, 10.0.0.2:8082\n3=peer-3:8082@2 # old\n\n",
        )
        .unwrap();
        assert_eq!(
            list,
            vec![
                PeerAddr::Ip("10.0.0.1:8082".parse().unwrap()),
                PeerAddr::Ip("10.0.0.2:8082".parse().unwrap()),
                PeerAddr::Name {
                    host: "peer-3".into(),
                    port: 8082
                },
            ]
        );
        let e = parse_peers_file("10.0.0.1:8082\nnot-an-address\n").unwrap_err();
        assert!(e.contains("not-an-address") && e.contains("no port"), "{e}");
    }

    #[derive(Debug)]
    struct Fixed;
    impl Resolver for Fixed {
        fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
            match host {
                "sluice-peers" => Ok(vec![
                    SocketAddr::from(([10, 0, 0, 5], port)),
                    SocketAddr::from(([10, 0, 0, 6], port)),
                    "[fd00::7]:1".parse().unwrap(),
                ]),
                _ => Err(std::io::Error::other("no such host")),
            }
        }
    }

    #[tokio::test]
    async fn every_record_of_a_name_is_a_candidate() {
        let dir = std::env::temp_dir().join(format!("sluice-disc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("peers");
        std::fs::write(&file, "10.0.0.9:8082\n").unwrap();
        let spec = DiscoverySpec {
            seeds: vec![PeerAddr::Ip("10.0.0.1:8082".parse().unwrap())],
            dns: vec![("sluice-peers".into(), 8082), ("missing".into(), 8082)],
            file: Some(file.clone()),
        };
        let into = Candidates::default();
        let resolver: Arc<dyn Resolver> = Arc::new(Fixed);
        refresh(&spec, &resolver, &into, true).await;
        let found: Vec<String> = into
            .list()
            .iter()
            .map(|(a, s)| format!("{a} {s}"))
            .collect();
        assert_eq!(
            found,
            vec![
                "10.0.0.1:8082 peers",
                "10.0.0.5:8082 dns:sluice-peers",
                "10.0.0.6:8082 dns:sluice-peers",
                format!("10.0.0.9:8082 file:{}", file.display()).as_str(),
            ]
        );
        assert_eq!(into.errors().len(), 1, "{:?}", into.errors());
        // The file is read again: a node it drops is no candidate any more.
        std::fs::write(&file, "").unwrap();
        refresh(&spec, &resolver, &into, true).await;
        assert_eq!(into.list().len(), 3);
        std::fs::remove_dir_all(&dir).ok();
    }
}
