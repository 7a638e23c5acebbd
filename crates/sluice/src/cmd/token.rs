//! `sluice serve`'s flags of `coordination: token-server`, and the daemon's spec from them.

use std::net::SocketAddr;

use anyhow::Context;
use sluice_limits::Nanos;
use sluice_server::cluster::ClusterSpec;
use sluice_server::peer::PeerKey;
use sluice_server::token_server::ServingLease;

use super::serve::duration;

/// Flags of `coordination: token-server`.
#[derive(Debug, clap::Args)]
pub(crate) struct TokenArgs {
    /// Token servers for `coordination: token-server` rules, in order of succession:
    /// ID=HOST:PORT,… (their token listeners; the first is the primary). Messages are
    /// authenticated with the cluster's shared key (--peer-key-file or SLUICE_PEER_KEY).
    #[arg(long, value_name = "LIST")]
    token_servers: Option<String>,
    /// This node is the token server ID of --token-servers and serves it on --token-addr.
    #[arg(long, value_name = "ID", requires = "token_servers")]
    token_server_id: Option<u32>,
    /// Address of this node's token server (default: 0.0.0.0 and the port of its entry).
    #[arg(long, value_name = "ADDR", requires = "token_server_id")]
    token_addr: Option<SocketAddr>,
    /// How long a decision waits for a token server before the node decides locally with
    /// what is left of its lease, then its share.
    #[arg(long, default_value = "50ms")]
    token_timeout: String,
    /// How long a batch of permits stays usable after it was asked for.
    #[arg(long, default_value = "100ms")]
    token_lease: String,
    /// How long a token server serves after a majority of the token servers renewed its
    /// serving lease (longer: fewer takeovers on slow networks; shorter: a quicker
    /// takeover). Must exceed --token-renew-every plus --token-timeout.
    #[arg(long, value_name = "DURATION", default_value = "300ms")]
    token_serving_lease: String,
    /// How often the serving token server renews its serving lease (and a standing-by one
    /// checks whether to take over).
    #[arg(long, value_name = "DURATION", default_value = "100ms")]
    token_renew_every: String,
    /// Nodes sharing the token-server rules: the fallback share is 1/N of each limit
    /// (default: the cluster's size, else 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    token_nodes: Option<u64>,
}

/// The daemon's token-server spec from `args` (`node_id`: `--node-id`; `peer_key` reads the
/// shared key when no cluster gives it).
pub(super) fn token_spec(
    args: &TokenArgs,
    node_id: Option<u32>,
    cluster: Option<&ClusterSpec>,
    peer_key: impl FnOnce() -> anyhow::Result<PeerKey>,
) -> anyhow::Result<Option<sluice_server::daemon::TokenSpec>> {
    use sluice_server::token_server::{ClientSpec, ServerSpec, parse_servers};
    let Some(list) = &args.token_servers else {
        return Ok(None);
    };
    let servers = parse_servers(list).context("--token-servers")?;
    let key = match cluster {
        Some(c) => c.key.clone(),
        None => peer_key()?,
    };
    let timeout = duration("--token-timeout", &args.token_timeout)?;
    let lease = nanos(duration("--token-lease", &args.token_lease)?);
    anyhow::ensure!(lease > 0, "--token-lease must be positive");
    let serving = ServingLease {
        lease: nanos(duration(
            "--token-serving-lease",
            &args.token_serving_lease,
        )?),
        renew_every: nanos(duration("--token-renew-every", &args.token_renew_every)?),
        ..ServingLease::default()
    };
    let nodes = sluice_server::daemon::fallback_nodes(args.token_nodes, cluster);
    let node_id = node_id.or(args.token_server_id).unwrap_or(0);
    let mut client = ClientSpec::new(servers.clone(), node_id, key.clone(), nodes);
    client.timeout = timeout;
    let server = match args.token_server_id {
        Some(id) => {
            let entry = servers
                .iter()
                .find(|s| s.id == id)
                .with_context(|| format!("--token-server-id {id} is not in --token-servers"))?;
            let addr = match args.token_addr {
                Some(a) => a,
                None => {
                    let port = entry
                        .authority
                        .rsplit_once(':')
                        .and_then(|(_, p)| p.parse::<u16>().ok())
                        .with_context(|| {
                            format!("token server {id}: no port in {}", entry.authority)
                        })?;
                    SocketAddr::from(([0, 0, 0, 0], port))
                }
            };
            // Only a token server holds a serving lease (renewed within --token-timeout).
            serving
                .validate(nanos(timeout))
                .context("--token-serving-lease, --token-renew-every and --token-timeout")?;
            let mut spec = ServerSpec::new(servers.clone(), id, key);
            spec.timeout = timeout;
            spec.grants.lease = lease;
            spec.serving = serving;
            Some((spec, addr))
        }
        None => None,
    };
    Ok(Some(sluice_server::daemon::TokenSpec { client, server }))
}

fn nanos(d: std::time::Duration) -> Nanos {
    sluice_limits::clock::nanos(d)
}
