//! `sluice serve`: the node daemon, a drop-in Envoy rate limit service (gRPC RLS v3 and
//! HTTP), alone or in a cluster that divides `coordination: cluster` limits.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use sluice_server::ConfigSource;
use sluice_server::config::RuleLeases;
use sluice_server::daemon::{Compat, Daemon, DaemonSpec, Extras, RedisSpec};
use sluice_server::lease::LeaseConfig;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Settings file (YAML): any of these flags as `flag_name: value` (lists for --peers and
    /// --redis-url). A flag on the command line wins over the file. See the README.
    #[arg(long, value_name = "PATH")]
    settings: Option<PathBuf>,
    /// envoyproxy/ratelimit configuration: a YAML file, or a directory of `*.yaml` files
    /// (reloaded when they change). Without it, the built-in example (domain `example`,
    /// 10/s per `remote_address`).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Address of the Envoy RLS v3 gRPC service (envoyproxy/ratelimit's default port).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Address of the HTTP service: /json, /v1/check, /metrics, /healthz, /readyz,
    /// /v1/cluster (envoyproxy/ratelimit's default port).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Address of the peer transport (UDP), in a cluster.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8082")]
    pub(super) peer_addr: SocketAddr,
    /// This node's id in the cluster (an integer below 4294967295). Default, with discovery
    /// (--peers HOST:PORT, --peers-dns, --peers-file): a random id, unique without
    /// coordination.
    #[arg(long, value_name = "ID")]
    pub(super) node_id: Option<u32>,
    /// Testing: start with this id as if it had been drawn at random (given up, as a drawn
    /// one is, when another process turns out to hold it), to rehearse two nodes drawing
    /// the same random id.
    #[arg(long, value_name = "ID", hide = true, conflicts_with = "node_id")]
    pub(super) test_random_node_id: Option<u32>,
    /// The peers: ID=HOST:PORT[@WEIGHT],… (their peer addresses; this node's own entry, if
    /// listed, is skipped, so every node can take the same list), or HOST:PORT seeds whose
    /// ids are learned (a running cluster to join). Starts a cluster. A HOST given by name
    /// need not resolve yet: it is looked up every few seconds and followed.
    #[arg(long, value_name = "LIST")]
    pub(super) peers: Option<String>,
    /// The voting members' ids, ID,… (they make the quorums and split the limit at a first
    /// start). Default: this node and every ID of --peers (the founding members), or, for a
    /// node with no ID in --peers, the voters of the running cluster it finds (a joiner).
    #[arg(long, value_name = "IDS")]
    pub(super) members: Option<String>,
    /// Peers from DNS: NAME:PORT, every A/AAAA record of NAME looked up again every few
    /// seconds (a Kubernetes headless Service). Proposes candidates; the key decides.
    #[arg(long, value_name = "NAME:PORT")]
    pub(super) peers_dns: Option<String>,
    /// Peers from a file of HOST:PORT entries (one per line or comma-separated, `#`
    /// comments), read again every few seconds.
    #[arg(long, value_name = "PATH")]
    pub(super) peers_file: Option<PathBuf>,
    /// File holding the cluster's shared key (at least 16 bytes; e.g. `openssl rand -hex 32`).
    /// Or set SLUICE_PEER_KEY. Peer datagrams are authenticated with it (HMAC-SHA256).
    #[arg(long, value_name = "PATH")]
    pub(super) peer_key_file: Option<PathBuf>,
    /// The gain γ: `auto` (fastest stable gain of the topology, seed 000 Thm 2) or a number.
    #[arg(long, default_value = "auto")]
    pub(super) gamma: String,
    /// Edge list of the cluster's communication graph (`a b [weight]` per line, as written
    /// by `sluice analyze --weights-out`), for `--gamma auto`; default: every member links
    /// every other.
    #[arg(long, value_name = "PATH")]
    pub(super) topology: Option<PathBuf>,
    /// The update cycle.
    #[arg(long, default_value = "100ms")]
    pub(super) cycle: String,
    /// The lease on shared capacity (at least four cycles).
    #[arg(long, default_value = "1s")]
    pub(super) lease: String,
    /// How long a node keeps the dead floor of a joiner that left or was fenced (refusing its
    /// old incarnations), telling its peers for the first half: churn of joiners' ids leaves
    /// no growing state. At least 6 × --lease + 64 × --cycle.
    #[arg(long, default_value = "10m", value_name = "DURATION")]
    pub(super) forget_departed: String,
    /// What a node enforces without a lease (cut off from a quorum): `none` (strict), `reserved:F`
    /// (strict, keeps fraction F of its initial share), `last-share` (available, not strict).
    #[arg(long, default_value = "none")]
    pub(super) fallback: String,
    /// File where the node keeps its incarnation across restarts: the first start (no file
    /// yet) is incarnation 1 and holds the node's initial share; every later start the next
    /// number, holding only its reservation until peers give it more. Without it, every
    /// start takes its incarnation from the clock (see --incarnation).
    #[arg(long, value_name = "PATH")]
    pub(super) state_file: Option<PathBuf>,
    /// Incarnation when there is no --state-file. Default: the wall clock in milliseconds
    /// since 1970, which only grows across restarts, so the same command line restarts a node
    /// safely: it comes back as a new incarnation holding only its reservation, and the
    /// cluster's capacity audit mints what no node holds (a cluster whose nodes all start
    /// this way begins at its whole limit once its first audit completes). `1` claims a
    /// first start (the initial share): give it only to a node that never ran before.
    #[arg(long)]
    pub(super) incarnation: Option<u64>,
    /// Testing: speak and accept at most this peer wire version, as a node of the build
    /// that introduced it would (to rehearse a rolling upgrade). Default: this build's.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(
        i64::from(sluice_coord::wire::MIN_VERSION)..=i64::from(sluice_coord::wire::VERSION)))]
    pub(super) wire_version: Option<u8>,
    /// How often to look for changed configuration files (`off` to never reload).
    #[arg(long, default_value = "1s")]
    watch: String,
    /// Redis for `coordination: redis` rules: redis://HOST:PORT[/DB], or several
    /// comma-separated URLs for a Redis Cluster.
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// `exact` (one script call per decision) or `batched` (quota taken in batches).
    #[arg(long, default_value = "exact")]
    redis_mode: String,
    /// How long a client lease (`POST /v1/lease`) is valid, for rules without their own
    /// `leases: { duration }`; clients are told to refresh after 30 % of it.
    #[arg(long, default_value = "10s")]
    client_lease: String,
    /// How a rule's capacity is divided among its lease clients, for rules without their own
    /// `leases: { policy }`: `max-min` (seed 000 §7 Alg. 2) or `proportional` (Alg. 1).
    #[arg(long, default_value = "max-min")]
    client_lease_policy: String,
    /// How long a decision waits for Redis before the node decides locally with its share.
    #[arg(long, default_value = "50ms")]
    redis_timeout: String,
    /// Nodes sharing the Redis rules: the fallback share is 1/N of each limit (default: the
    /// cluster's size, else 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    redis_nodes: Option<u64>,
    /// `duration_until_reset` (gRPC, `/json`) to the nanosecond (envoyproxy/ratelimit, and
    /// Sluice by default, give whole seconds, rounded up).
    #[arg(long)]
    subsecond_reset: bool,
    /// Do not count refused requests, so their permits stay for smaller ones
    /// (envoyproxy/ratelimit, and Sluice by default, count every hit; its
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true does the same as this flag).
    #[arg(long)]
    stop_increment_when_over_limit: bool,
    /// Most keys a node holds for the rules it decides itself, per algorithm (0: no cap).
    /// A new key at a full table evicts idle keys first (their state is a fresh key's: no
    /// decision changes), then the least recently used, each of which may then admit one
    /// more burst than it would have (counted in /metrics as forced evictions).
    #[arg(long, value_name = "N", default_value = "1000000")]
    max_keys: usize,
    /// Most keys with coordinated state per node, in a cluster. At the cap a new heavy key
    /// stays on the static split (1/N of its limit here, which is safe), and idle keys are
    /// retired at once to make room (docs/PROTOCOL.md "Many keys"). Every coordinated key
    /// costs work each cycle, so the cap bounds CPU as well as memory: see docs/BENCHMARKS.md
    /// ("Heavy-key flood") before raising it.
    #[arg(long, value_name = "N", default_value = "10000",
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub(super) max_cluster_keys: u64,
    /// Peer bytes per cycle per link, in a cluster: a burst of changed keys goes out over
    /// several cycles, so a receiver's socket buffer never overflows.
    #[arg(long, value_name = "BYTES", default_value = "60000",
          value_parser = clap::value_parser!(u64).range(1_000..=100_000_000))]
    pub(super) peer_budget: u64,
    /// gRPC worker threads, each with its own single-threaded runtime; connections are
    /// handed to them in turn [default: the cores this process may use].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..1025))]
    workers: Option<u64>,
    /// Whose HTTP/2 the gRPC connections speak: `own` (Sluice's) or `h2` (tonic's, as
    /// before): the same answers, `own` for about half the CPU per call (docs/BENCHMARKS.md).
    #[arg(long, value_enum, value_name = "STACK", default_value = "own")]
    grpc_http2: GrpcHttp2,
    /// Log lines as `text` or `json` (default: envoyproxy/ratelimit's LOG_FORMAT, else
    /// text). RUST_LOG filters them (else LOG_LEVEL, else info).
    #[arg(long, value_enum)]
    log_format: Option<super::LogFormat>,
    /// `coordination: token-server` (boxed: the flags are many, the command enum stays small).
    #[command(flatten)]
    token: Box<super::token::TokenArgs>,
}

/// `--grpc-http2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum GrpcHttp2 {
    H2,
    Own,
}

pub(super) fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    sluice_limits::limit::parse_duration(text)
        .map(Duration::from_nanos)
        .with_context(|| format!("{flag}: `{text}` is not a duration (e.g. 100ms, 1s)"))
}

/// `args` again, with the settings file's values applied under the command line's flags
/// (`rest`: the arguments after `serve`).
fn with_settings(file: &Path, rest: impl Iterator<Item = OsString>) -> anyhow::Result<Args> {
    use clap::{Args as _, FromArgMatches as _};
    // A flag given twice takes its last value: the file's come first, so the command line wins.
    let command = Args::augment_args(clap::Command::new("sluice serve")).args_override_self(true);
    let known: Vec<(String, bool)> = command
        .get_arguments()
        .filter_map(|a| {
            a.get_long()
                .map(|l| (l.to_owned(), a.get_action().takes_values()))
        })
        .collect();
    let mut argv = vec![OsString::from("sluice serve")];
    argv.extend(super::settings::flags_from_file(file, &known)?);
    argv.extend(rest);
    let matches = command.try_get_matches_from(argv).map_err(|e| {
        anyhow::anyhow!(
            "{} (with the settings from {})",
            e.render().to_string().trim_end(),
            file.display()
        )
    })?;
    Ok(Args::from_arg_matches(&matches)?)
}

/// The client lease settings of `args` (`--client-lease`, `--client-lease-policy`).
fn lease_config(args: &Args) -> anyhow::Result<LeaseConfig> {
    let lease = duration("--client-lease", &args.client_lease)?;
    anyhow::ensure!(
        (RuleLeases::MIN_DURATION..=RuleLeases::MAX_DURATION).contains(&lease),
        "--client-lease: `{}` is out of range (1ms to 1d)",
        args.client_lease
    );
    let policy = RuleLeases::parse_policy(&args.client_lease_policy).with_context(|| {
        format!(
            "--client-lease-policy: expected `max-min` or `proportional`, got `{}`",
            args.client_lease_policy
        )
    })?;
    Ok(LeaseConfig {
        policy,
        lease,
        // The default's proportion (3 s of 10 s): two more tries before the grant expires.
        refresh: lease * 3 / 10,
        ..LeaseConfig::default()
    })
}

/// What `args` start: the daemon's spec and its extras (token servers, client leases).
/// Reads the peer key and, with --state-file, moves the incarnation on.
fn daemon_spec(args: &Args) -> anyhow::Result<(DaemonSpec, Extras)> {
    let source = match &args.config {
        Some(path) => ConfigSource::Path(path.clone()),
        None => ConfigSource::Example,
    };
    let watch = match args.watch.as_str() {
        "off" => None,
        w => Some(duration("--watch", w)?),
    };
    let cluster = super::cluster::cluster_spec(args)?;
    let token = super::token::token_spec(
        &args.token,
        args.node_id,
        cluster.as_ref().map(|(c, _)| c),
        || super::cluster::peer_key(args.peer_key_file.as_deref()),
    )?;
    let spec = DaemonSpec {
        source,
        grpc_addr: args.grpc_addr,
        http_addr: Some(args.http_addr),
        cluster,
        watch,
        redis: match &args.redis_url {
            Some(url) => Some(RedisSpec {
                url: url.clone(),
                mode: args
                    .redis_mode
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--redis-mode: {e}"))?,
                timeout: duration("--redis-timeout", &args.redis_timeout)?,
                nodes: args.redis_nodes,
            }),
            None => None,
        },
    };
    let extras = Extras {
        token,
        leases: lease_config(args)?,
        compat: Compat {
            subsecond_reset: args.subsecond_reset,
            stop_increment_when_over_limit: args.stop_increment_when_over_limit,
        },
        shadow_mode: false,
        quota_mode: false,
        response_dynamic_metadata: false,
        response_headers: None,
        max_keys: (args.max_keys > 0).then_some(args.max_keys),
        grpc_workers: Some(grpc_workers(args.workers)),
        grpc_http2: match args.grpc_http2 {
            GrpcHttp2::H2 => sluice_server::grpc::Http2Stack::H2,
            GrpcHttp2::Own => sluice_server::grpc::Http2Stack::Own,
        },
    };
    Ok((spec, extras))
}

/// `--workers`, else the cores this process may run on (its CPU affinity: `taskset`).
fn grpc_workers(given: Option<u64>) -> NonZeroUsize {
    given
        .and_then(|n| usize::try_from(n).ok())
        .and_then(NonZeroUsize::new)
        .or_else(|| std::thread::available_parallelism().ok())
        .unwrap_or(NonZeroUsize::MIN)
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let args = match &args.settings {
        // Everything after `sluice serve`, as the user typed it.
        Some(file) => with_settings(file, std::env::args_os().skip(2))?,
        None => args,
    };
    let logs = super::upstream_env::logs(|name| std::env::var(name).ok())?;
    super::init_logs(
        args.log_format
            .or(logs.format)
            .unwrap_or(super::LogFormat::Text),
        logs.level,
    );
    let (mut spec, mut extras) = daemon_spec(&args)?;
    let upstream = super::upstream_env::read(|name| std::env::var(name).ok())?;
    let flags = super::upstream_env::Flags {
        config_given: args.config.is_some(),
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
    };
    upstream.apply(flags, &mut spec, &mut extras);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        // Validated before listening: a bad file stops the daemon with file, line and reason.
        let daemon = Daemon::start_with(spec, extras).await?;
        let s = daemon.status();
        tracing::info!(
            grpc = %daemon.grpc_addr,
            http = ?daemon.http_addr,
            peer = ?daemon.peer_addr,
            token = ?daemon.token_addr,
            node = s.node_id,
            incarnation = s.incarnation,
            members = s.members.len() + 1,
            gamma = s.gamma,
            "sluice serve: listening"
        );
        shutdown_signal().await;
        tracing::info!("shutting down: finishing calls in flight, handing capacity to the peers");
        daemon.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Completes on Ctrl-C, or on SIGTERM (how orchestrators stop a daemon) where there is one.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            // Without the handler, serve until killed rather than stop at once.
            tracing::warn!(error = %e, "cannot watch for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args as _, FromArgMatches as _};
    use sluice_coord::allocation::AllocationPolicy;

    /// `sluice serve ARGV…` as clap parses it.
    fn parse(argv: &[&str]) -> Args {
        let command = Args::augment_args(clap::Command::new("sluice serve"));
        let matches = command
            .try_get_matches_from(std::iter::once("sluice serve").chain(argv.iter().copied()))
            .unwrap();
        Args::from_arg_matches(&matches).unwrap()
    }

    /// `--wire-version`: a version this build speaks, else an error naming the range.
    #[test]
    fn the_wire_version_is_one_this_build_speaks() {
        use sluice_coord::wire::{MIN_VERSION, VERSION};
        let old = MIN_VERSION.to_string();
        assert_eq!(
            parse(&["--wire-version", &old]).wire_version,
            Some(MIN_VERSION)
        );
        for bad in [MIN_VERSION - 1, VERSION + 1].map(|v| v.to_string()) {
            let e = Args::augment_args(clap::Command::new("sluice serve"))
                .try_get_matches_from(["sluice serve", "--wire-version", &bad])
                .unwrap_err();
            let range = format!("{MIN_VERSION}..={VERSION}");
            assert!(e.to_string().contains(&range), "{e}");
        }
    }

    /// A directory of its own for one test, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn file(&self, name: &str, text: &str) -> String {
            let path = self.0.join(name);
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const KEY: &str = "serve-test-key-0123456789abcdef\n";

    #[test]
    fn the_serving_lease_flags_are_checked_and_reach_the_token_server() {
        let dir = TempDir::new("token-serving");
        let key = dir.file("key", KEY);
        let with = |lease: &str, renew: &str| {
            parse(&[
                "--peer-key-file",
                &key,
                "--token-servers",
                "1=127.0.0.1:7001",
                "--token-server-id",
                "1",
                "--token-serving-lease",
                lease,
                "--token-renew-every",
                renew,
            ])
        };
        let (_, extras) = daemon_spec(&with("1s", "250ms")).unwrap();
        let (server, _) = extras.token.unwrap().server.unwrap();
        assert_eq!(server.serving.lease, 1_000_000_000);
        assert_eq!(server.serving.renew_every, 250_000_000);
        // A lease the holder would lose between renewals (100 ms + the 50 ms timeout).
        let e = format!("{:#}", daemon_spec(&with("120ms", "100ms")).unwrap_err());
        assert!(
            e.contains("--token-serving-lease") && e.contains("120 ms"),
            "{e}"
        );
        let e = format!("{:#}", daemon_spec(&with("1s", "1s")).unwrap_err());
        assert!(e.contains("1000 ms"), "{e}");
        let e = format!("{:#}", daemon_spec(&with("soon", "100ms")).unwrap_err());
        assert!(e.contains("not a duration"), "{e}");
    }

    #[test]
    fn token_server_flags_become_the_daemon_spec() {
        let dir = TempDir::new("token-flags");
        let key = dir.file("key", KEY);
        // A node that is also token server 2 of two, with every token flag given.
        let args = parse(&[
            "--peer-key-file",
            &key,
            "--token-servers",
            "1=127.0.0.1:7001,2=127.0.0.1:7002",
            "--token-server-id",
            "2",
            "--token-addr",
            "127.0.0.1:7102",
            "--token-timeout",
            "80ms",
            "--token-lease",
            "250ms",
            "--token-nodes",
            "3",
        ]);
        let (spec, extras) = daemon_spec(&args).unwrap();
        assert!(spec.cluster.is_none());
        assert_eq!(spec.source, ConfigSource::Example);
        let token = extras.token.unwrap();
        let servers: Vec<(u32, &str)> = token
            .client
            .servers
            .iter()
            .map(|s| (s.id, s.authority.as_str()))
            .collect();
        assert_eq!(servers, [(1, "127.0.0.1:7001"), (2, "127.0.0.1:7002")]);
        assert_eq!(token.client.node_id, 2, "no --node-id: the token server id");
        assert_eq!(token.client.timeout, Duration::from_millis(80));
        assert_eq!(token.client.nodes, 3);
        let (server, addr) = token.server.unwrap();
        assert_eq!(server.id, 2);
        assert_eq!(addr, "127.0.0.1:7102".parse().unwrap());
        assert_eq!(server.timeout, Duration::from_millis(80));
        assert_eq!(server.grants.lease, 250_000_000);
        assert_eq!(server.servers.len(), 2);

        // A plain node of a 3-node cluster: its cluster id, 3 nodes, no server of its own,
        // the token server's port as the default address of nothing.
        let args = parse(&[
            "--peer-key-file",
            &key,
            "--node-id",
            "7",
            "--peers",
            "8=127.0.0.1:9008,9=127.0.0.1:9009",
            "--token-servers",
            "1=127.0.0.1:7001",
        ]);
        let (spec, extras) = daemon_spec(&args).unwrap();
        assert!(spec.cluster.is_some());
        let token = extras.token.unwrap();
        assert_eq!(token.client.node_id, 7);
        assert_eq!(token.client.nodes, 3, "the cluster's size");
        // As --redis-nodes: 0 nodes is refused, not read as 1.
        let command = Args::augment_args(clap::Command::new("sluice serve"));
        assert!(
            command
                .try_get_matches_from([
                    "sluice serve",
                    "--token-servers",
                    "1=127.0.0.1:7001",
                    "--token-nodes",
                    "0",
                ])
                .is_err()
        );
        assert_eq!(token.client.timeout, Duration::from_millis(50), "default");
        assert!(token.server.is_none());

        // A token server without --token-addr listens on all interfaces at its entry's port.
        let args = parse(&[
            "--peer-key-file",
            &key,
            "--token-servers",
            "1=127.0.0.1:7001",
            "--token-server-id",
            "1",
        ]);
        let (_, extras) = daemon_spec(&args).unwrap();
        let (_, addr) = extras.token.unwrap().server.unwrap();
        assert_eq!(addr, "0.0.0.0:7001".parse().unwrap());

        // Without --token-servers there is no token spec at all.
        let (_, extras) = daemon_spec(&parse(&[])).unwrap();
        assert!(extras.token.is_none());
    }

    #[test]
    fn bad_token_server_flags_are_refused() {
        let dir = TempDir::new("token-bad");
        let key = dir.file("key", KEY);
        let refused = |extra: &[&str]| {
            let mut argv = vec!["--peer-key-file", key.as_str()];
            argv.extend_from_slice(extra);
            format!("{:#}", daemon_spec(&parse(&argv)).unwrap_err())
        };
        let e = refused(&[
            "--token-servers",
            "1=127.0.0.1:7001",
            "--token-server-id",
            "3",
        ]);
        assert!(
            e.contains("--token-server-id 3 is not in --token-servers"),
            "{e}"
        );
        let e = refused(&[
            "--token-servers",
            "1=127.0.0.1:7001",
            "--token-lease",
            "soon",
        ]);
        assert!(e.contains("--token-lease"), "{e}");
        let e = refused(&[
            "--token-servers",
            "1=127.0.0.1:7001",
            "--token-timeout",
            "0",
        ]);
        assert!(e.contains("--token-timeout"), "{e}");
        let e = refused(&["--token-servers", "one"]);
        assert!(e.contains("--token-servers"), "{e}");
        // No key at all (the variable is not read when a file is given, so give a missing one).
        let e = format!(
            "{:#}",
            daemon_spec(&parse(&[
                "--peer-key-file",
                "/nonexistent/key",
                "--token-servers",
                "1=127.0.0.1:7001"
            ]))
            .unwrap_err()
        );
        assert!(e.contains("peer key file"), "{e}");
        // --token-server-id needs --token-servers (clap refuses it).
        let command = Args::augment_args(clap::Command::new("sluice serve"));
        assert!(
            command
                .try_get_matches_from(["sluice serve", "--token-server-id", "1"])
                .is_err()
        );
    }

    #[test]
    fn token_server_settings_in_a_file_become_the_daemon_spec() {
        let dir = TempDir::new("token-settings");
        let key = dir.file("key", KEY);
        let file = dir.file(
            "sluice.yaml",
            &format!(
                "peer_key_file: {key}\n\
                 token_servers: [1=127.0.0.1:7001, 2=127.0.0.1:7002]\n\
                 token-server-id: 1\n\
                 token_addr: 127.0.0.1:7101\n\
                 token_timeout: 75ms\n\
                 token_lease: 300ms\n\
                 token_nodes: 4\n\
                 client_lease: 2s\n\
                 client_lease_policy: proportional\n"
            ),
        );
        // The command line wins over the file: the timeout is the flag's.
        let rest = ["--settings", file.as_str(), "--token-timeout", "90ms"].map(OsString::from);
        let args = with_settings(Path::new(&file), rest.into_iter()).unwrap();
        let (_, extras) = daemon_spec(&args).unwrap();
        let token = extras.token.unwrap();
        assert_eq!(token.client.servers.len(), 2);
        assert_eq!(token.client.servers[1].authority, "127.0.0.1:7002");
        assert_eq!(token.client.node_id, 1);
        assert_eq!(token.client.nodes, 4);
        assert_eq!(token.client.timeout, Duration::from_millis(90));
        let (server, addr) = token.server.unwrap();
        assert_eq!((server.id, addr), (1, "127.0.0.1:7101".parse().unwrap()));
        assert_eq!(server.grants.lease, 300_000_000);
        assert_eq!(server.timeout, Duration::from_millis(90));
        assert_eq!(extras.leases.policy, AllocationPolicy::Proportional);
        assert_eq!(extras.leases.lease, Duration::from_secs(2));
        assert_eq!(extras.leases.refresh, Duration::from_millis(600));
    }

    /// One HTTP/1.1 exchange on a fresh connection to 127.0.0.1: (status, body).
    fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out.split(' ').nth(1).unwrap().parse().unwrap();
        let body = out.split_once("\r\n\r\n").map_or("", |b| b.1).to_owned();
        (status, body)
    }

    fn unix_nanos() -> u64 {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        u64::try_from(d.as_nanos()).unwrap()
    }

    /// Seed 002 §4.4(3) through the whole command path: a token server and two nodes started
    /// from `sluice serve` command lines (one node from a settings file) on 127.0.0.1. One
    /// node alone takes more than the 1/N share it would have in fallback — the permits come
    /// from the server — and the two together never admit more than the limit in a window.
    #[test]
    fn a_token_server_and_two_nodes_from_command_lines_keep_the_limit() {
        const LIMIT: u64 = 100;
        const SECOND: u64 = 1_000_000_000;
        let dir = TempDir::new("token-loopback");
        let key = dir.file("key", KEY);
        let rules = dir.file(
            "rules.yaml",
            &format!(
                "domain: d\ndescriptors:\n  - key: user\n    rate_limit: \
                 {{ unit: second, requests_per_unit: {LIMIT}, coordination: token-server }}\n"
            ),
        );
        // A free port for the token server, named in every node's --token-servers.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let servers = format!("1=127.0.0.1:{port}");
        let token_addr = format!("127.0.0.1:{port}");
        let common = [
            "--config",
            rules.as_str(),
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--watch",
            "off",
            "--peer-key-file",
            key.as_str(),
            "--token-servers",
            servers.as_str(),
            "--token-nodes",
            "2",
        ];
        let with = |extra: &[&str]| {
            let mut argv = common.to_vec();
            argv.extend_from_slice(extra);
            parse(&argv)
        };
        // Grants valid to the end of their window and a generous timeout: this test is
        // about where decisions are made, not about lease expiry or the fallback.
        let server = with(&[
            "--token-server-id",
            "1",
            "--token-addr",
            &token_addr,
            "--token-lease",
            "1s",
        ]);
        let a = with(&["--token-timeout", "2s"]);
        let settings = dir.file(
            "b.yaml",
            &format!(
                "config: {rules}\ngrpc_addr: 127.0.0.1:0\nhttp_addr: 127.0.0.1:0\nwatch: off\n\
                 peer_key_file: {key}\ntoken_servers: [{servers}]\ntoken_nodes: 2\n\
                 token_timeout: 50ms\n"
            ),
        );
        let b = with_settings(
            Path::new(&settings),
            ["--token-timeout", "2s"].map(OsString::from).into_iter(),
        )
        .unwrap();

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let start = |args: &Args| {
            let (spec, extras) = daemon_spec(args).unwrap();
            rt.block_on(Daemon::start_with(spec, extras)).unwrap()
        };
        let server = start(&server);
        let nodes = [start(&a), start(&b)];
        let node = server.token_server.clone().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while node.status().state != sluice_server::token_server::ServingState::Active {
            assert!(std::time::Instant::now() < deadline, "{:?}", node.status());
            std::thread::sleep(Duration::from_millis(10));
        }
        let http = |i: usize| nodes[i].http_addr.unwrap();
        let check = |i: usize| {
            let (status, _) = http_get(http(i), "/v1/check/d?user=u");
            assert!(status == 200 || status == 429, "{status}");
            status == 200
        };

        // (admitted, completed at) of every decision; counted in the window it completed
        // in (a request waiting for a grant is admitted in the server's window).
        let mut admitted: std::collections::BTreeMap<u64, u64> = Default::default();
        let mut shown = false;
        // Each run starts with a window; one that does not fit in it is tried again in the
        // next.
        for _ in 0..3 {
            let t = unix_nanos();
            std::thread::sleep(Duration::from_nanos(SECOND - t % SECOND + 5_000_000));
            let window = unix_nanos() / SECOND;
            let mut from_a = 0;
            for i in [0, 1] {
                for _ in 0..80 {
                    let ok = check(i);
                    if ok {
                        *admitted.entry(unix_nanos() / SECOND).or_default() += 1;
                        if i == 0 {
                            from_a += 1;
                        }
                    }
                }
            }
            if unix_nanos() / SECOND == window {
                // In fallback node A would have its 1/2 share, 50: it got more from the
                // server, and B the rest at most.
                assert!(from_a > LIMIT / 2, "A admitted {from_a}: {admitted:?}");
                shown = true;
                break;
            }
        }
        assert!(shown, "no run fitted in one window: {admitted:?}");
        for (w, n) in &admitted {
            assert!(
                *n <= LIMIT,
                "window {w}: {n} admitted > {LIMIT}: {admitted:?}"
            );
        }
        for i in [0, 1] {
            let (status, body) = http_get(http(i), "/v1/cluster");
            assert_eq!(status, 200);
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let t = &v["token_server"];
            assert_eq!(t["mode"], "central", "{body}");
            assert_eq!(t["server"], 1, "{body}");
            assert_eq!(t["nodes"], 2, "{body}");
            assert_eq!(t["decisions_local"], 0, "{body}");
            assert!(t["decisions_central"].as_u64().unwrap() >= 80, "{body}");
        }
        assert!(node.status().granted >= LIMIT / 2, "{:?}", node.status());
        rt.block_on(async move {
            for n in nodes {
                n.shutdown().await;
            }
            server.shutdown().await;
        });
    }

    /// `--redis-nodes` (or `redis_nodes` in a settings file) sets the fallback share of a
    /// Redis-only deployment; without it, the cluster's size, else 1.
    #[test]
    fn redis_nodes_set_the_fallback_share() {
        let url = "redis://127.0.0.1:1/";
        let nodes = |argv: &[&str]| daemon_spec(&parse(argv)).unwrap().0.redis.unwrap().nodes;
        assert_eq!(nodes(&["--redis-url", url, "--redis-nodes", "4"]), Some(4));
        assert_eq!(nodes(&["--redis-url", url]), None, "the daemon's default");
        let command = Args::augment_args(clap::Command::new("sluice serve"));
        assert!(
            command
                .try_get_matches_from(["sluice serve", "--redis-nodes", "0"])
                .is_err()
        );
        let dir = TempDir::new("redis-nodes");
        let file = dir.file(
            "sluice.yaml",
            &format!("redis_url: {url}\nredis_nodes: 3\nredis_timeout: 20ms\n"),
        );
        let args = with_settings(Path::new(&file), std::iter::empty()).unwrap();
        let redis = daemon_spec(&args).unwrap().0.redis.unwrap();
        assert_eq!(redis.nodes, Some(3));
        assert_eq!(redis.timeout, Duration::from_millis(20));
    }

    /// A node of a Redis-only deployment started with `--redis-nodes 4`, its Redis down:
    /// every `coordination: redis` rule falls back to a quarter of its limit, and
    /// `/v1/cluster` says so.
    #[test]
    fn a_node_with_redis_nodes_falls_back_to_its_share() {
        let dir = TempDir::new("redis-share");
        let rules = dir.file(
            "rules.yaml",
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: \
             { unit: hour, requests_per_unit: 40, coordination: redis }\n",
        );
        // Nothing listens there: every Redis call fails at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("redis://127.0.0.1:{port}/");
        let args = parse(&[
            "--config",
            &rules,
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--watch",
            "off",
            "--redis-url",
            &url,
            "--redis-nodes",
            "4",
        ]);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (spec, extras) = daemon_spec(&args).unwrap();
        let node = rt.block_on(Daemon::start_with(spec, extras)).unwrap();
        let http = node.http_addr.unwrap();
        let admitted = (0..20)
            .filter(|_| {
                let (status, _) = http_get(http, "/v1/check/d?user=u");
                assert!(status == 200 || status == 429, "{status}");
                status == 200
            })
            .count();
        assert_eq!(admitted, 10, "a quarter of 40");
        let (status, body) = http_get(http, "/v1/cluster");
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["redis"]["mode"], "fallback", "{body}");
        assert_eq!(v["redis"]["nodes"], 4, "{body}");
        assert_eq!(v["redis"]["transitions"], 1, "{body}");
        rt.block_on(node.shutdown());
    }

    #[test]
    fn client_lease_flags() {
        let (_, extras) = daemon_spec(&parse(&[])).unwrap();
        assert_eq!(extras.leases, LeaseConfig::default());
        let (_, extras) = daemon_spec(&parse(&[
            "--client-lease",
            "500ms",
            "--client-lease-policy",
            "max_min",
        ]))
        .unwrap();
        assert_eq!(extras.leases.policy, AllocationPolicy::MaxMin);
        assert_eq!(extras.leases.lease, Duration::from_millis(500));
        assert_eq!(extras.leases.refresh, Duration::from_millis(150));
        for (flag, value) in [
            ("--client-lease-policy", "fair"),
            ("--client-lease", "2d"),
            ("--client-lease", "never"),
        ] {
            let e = format!("{:#}", daemon_spec(&parse(&[flag, value])).unwrap_err());
            assert!(e.contains(flag), "{e}");
        }
    }

    #[test]
    fn the_command_line_wins_over_the_settings_file() {
        let dir = std::env::temp_dir().join(format!("sluice-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sluice.yaml");
        std::fs::write(
            &file,
            "grpc_addr: 127.0.0.1:9081\nhttp-addr: 127.0.0.1:9080\nnode_id: 1\npeers:\n  - 2=127.0.0.1:9002\n  - 3=127.0.0.1:9003@0.5\ncycle: 50ms\n",
        )
        .unwrap();
        let rest = [
            "--settings",
            file.to_str().unwrap(),
            "--http-addr",
            "127.0.0.1:7080",
        ]
        .into_iter()
        .map(OsString::from);
        let args = with_settings(&file, rest).unwrap();
        assert_eq!(args.grpc_addr, "127.0.0.1:9081".parse().unwrap());
        assert_eq!(args.http_addr, "127.0.0.1:7080".parse().unwrap());
        assert_eq!(args.node_id, Some(1));
        assert_eq!(
            args.peers.as_deref(),
            Some("2=127.0.0.1:9002,3=127.0.0.1:9003@0.5")
        );
        assert_eq!(args.cycle, "50ms");
        assert_eq!(
            args.peer_addr,
            "0.0.0.0:8082".parse().unwrap(),
            "default kept"
        );

        std::fs::write(&file, "grpc_addr: not-an-address\n").unwrap();
        let e = with_settings(&file, std::iter::empty())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--grpc-addr") && e.contains("sluice.yaml"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
