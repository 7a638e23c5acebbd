//! `sluice serve`'s cluster flags: the cluster spec from them (peers, seeds and discovery,
//! voters, node id, timing, incarnation).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use sluice_server::cluster::{
    ClusterSpec, DiscoverySpec, Gamma, draw_node_id, parse_addr, parse_fallback, parse_peers,
};
use sluice_server::peer::PeerKey;

use super::serve::{Args, duration};

pub(super) fn peer_key(file: Option<&Path>) -> anyhow::Result<PeerKey> {
    let text = match file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the peer key file {}", f.display()))?,
        None => std::env::var("SLUICE_PEER_KEY").map_err(|_| {
            anyhow::anyhow!(
                "a cluster needs a shared key: give --peer-key-file or set SLUICE_PEER_KEY"
            )
        })?,
    };
    Ok(PeerKey::from_text(&text)?)
}

/// The cluster spec of `args`, and the peer socket's address; `None` without peers.
pub(super) fn cluster_spec(args: &Args) -> anyhow::Result<Option<(ClusterSpec, SocketAddr)>> {
    let mut discovery = DiscoverySpec::default();
    let mut listed = String::new();
    for item in args.peers.iter().flat_map(|p| p.split(',')) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        if item.contains('=') {
            listed.push_str(item);
            listed.push(',');
        } else {
            // A seed: an address to introduce ourselves to; its id comes back with its
            // directory.
            let addr = parse_addr(item).map_err(|why| {
                anyhow::anyhow!(
                    "--peers entry `{item}`: {why} (expected ID=HOST:PORT[@WEIGHT] or HOST:PORT)"
                )
            })?;
            discovery.seeds.push(addr);
        }
    }
    if let Some(dns) = &args.peers_dns {
        let (host, port) = dns
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok().filter(|&p| p != 0)?)))
            .filter(|(h, _)| !h.is_empty() && !h.contains(['/', ' ']))
            .with_context(|| format!("--peers-dns: `{dns}` is not NAME:PORT"))?;
        discovery.dns.push((host.to_owned(), port));
    }
    discovery.file = args.peers_file.clone();
    if listed.is_empty() && discovery.is_empty() {
        anyhow::ensure!(
            args.node_id.is_none() && args.members.is_none(),
            "--node-id and --members need peers: --peers, --peers-dns or --peers-file"
        );
        return Ok(None);
    }
    let mut peers = parse_peers(&listed)?;
    let id = match args.node_id {
        Some(id) => {
            anyhow::ensure!(id != u32::MAX, "--node-id: {id} is reserved");
            id
        }
        None => {
            anyhow::ensure!(
                peers.is_empty(),
                "--node-id is needed with ID=HOST:PORT peers (ids are given, so this one must be)"
            );
            // Nobody else picks it without coordination, and if someone does, one of the two
            // draws again (`ClusterSpec::random_id`).
            args.test_random_node_id
                .unwrap_or_else(|| draw_node_id(rand::random, |_| false))
        }
    };
    // One list for every member (e.g. a StatefulSet's pods share their arguments).
    peers.retain(|p| p.id != id);
    anyhow::ensure!(
        !peers.is_empty() || !discovery.is_empty(),
        "--peers: no peer other than this node given"
    );
    let mut spec = ClusterSpec::new(id, peers, peer_key(args.peer_key_file.as_deref())?);
    spec.random_id = args.node_id.is_none();
    spec.discovery = discovery;
    if let Some(list) = &args.members {
        let mut members = Vec::new();
        for m in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            members.push(
                m.parse::<u32>()
                    .ok()
                    .filter(|&m| m != u32::MAX)
                    .with_context(|| format!("--members: `{m}` is not a node id"))?,
            );
        }
        anyhow::ensure!(!members.is_empty(), "--members: no id given");
        spec.members = Some(members);
    }
    spec.gamma = match args.gamma.as_str() {
        "auto" => Gamma::Auto,
        g => Gamma::Fixed(
            g.parse()
                .ok()
                .filter(|g: &f64| *g > 0.0 && g.is_finite())
                .with_context(|| {
                    format!("--gamma: expected `auto` or a positive number, got `{g}`")
                })?,
        ),
    };
    if let Some(path) = &args.topology {
        let topo = sluice_graph::Topology::read_edge_list(path)
            .with_context(|| format!("--topology {}", path.display()))?;
        spec.topology = Some(
            topo.edges()
                .iter()
                .map(|e| (e.a as u32, e.b as u32, e.weight))
                .collect(),
        );
    }
    spec.cycle = duration("--cycle", &args.cycle)?;
    spec.lease = duration("--lease", &args.lease)?;
    spec.forget_departed = duration("--forget-departed", &args.forget_departed)?;
    let least = spec.least_forget_departed();
    anyhow::ensure!(
        spec.forget_departed >= least,
        "--forget-departed ({:?}) must be at least 6 × --lease + 64 × --cycle ({least:?})",
        spec.forget_departed
    );
    spec.fallback = parse_fallback(&args.fallback)?;
    if let Some(v) = args.wire_version {
        spec.wire_version = v;
    }
    spec.max_keys = usize::try_from(args.max_cluster_keys)?;
    spec.link_budget = usize::try_from(args.peer_budget)?;
    // The daemon rewrites the file when the node reincarnates while running.
    spec.state_file = args.state_file.clone();
    let start = super::incarnation::at_start(args.state_file.as_deref(), args.incarnation)?;
    spec.incarnation = start.incarnation;
    Ok(Some((spec, args.peer_addr)))
}
