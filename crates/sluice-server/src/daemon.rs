//! One Sluice node, assembled: the engine, its gRPC and HTTP servers, the cluster driver
//! and the configuration watcher, started together and stopped together. `sluice serve`
//! runs one; `sluice demo` runs five in one process (each with its own sockets).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::{Cluster, ClusterError, ClusterSpec};
use crate::config::{ConfigError, ConfigSource};
use crate::engine::Engine;
use crate::status::{ClusterInfo, ClusterStatus};

/// What to start.
#[derive(Debug, Clone)]
pub struct DaemonSpec {
    /// Where the rate limit configuration comes from.
    pub source: ConfigSource,
    /// The Envoy RLS v3 gRPC address.
    pub grpc_addr: SocketAddr,
    /// The HTTP address (`None`: no HTTP server).
    pub http_addr: Option<SocketAddr>,
    /// The cluster, with the peer transport's address (`None`: a single node).
    pub cluster: Option<(ClusterSpec, SocketAddr)>,
    /// How often to look for changed configuration files (`None`: never).
    pub watch: Option<Duration>,
    /// Redis for `coordination: redis` rules (`None`: such rules decide locally with the
    /// whole limit).
    pub redis: Option<RedisSpec>,
}

/// How a node uses Redis for `coordination: redis` rules ([`crate::central::connect`]).
#[derive(Debug, Clone)]
pub struct RedisSpec {
    /// `redis://HOST:PORT[/DB]`, or several comma-separated URLs for a Redis Cluster.
    pub url: String,
    /// Exact or batched.
    pub mode: crate::central::RedisMode,
    /// How long a decision waits for Redis before deciding locally.
    pub timeout: Duration,
    /// Nodes sharing the rules: the fallback decides with `1/nodes` of each limit (`None`:
    /// the cluster's size, else 1: [`fallback_nodes`]).
    pub nodes: Option<u64>,
}

/// `coordination: token-server`: the token servers this node asks and, when it is one of
/// them, the server it runs ([`Daemon::start_with`]).
#[derive(Debug, Clone)]
pub struct TokenSpec {
    /// How this node reaches the token servers (primary first).
    pub client: crate::token_server::ClientSpec,
    /// This node's own token server and its listener's address, if it is one.
    pub server: Option<(crate::token_server::ServerSpec, SocketAddr)>,
}

/// What [`Daemon::start_with`] starts besides a [`DaemonSpec`].
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Token servers for `coordination: token-server` rules (`None`: such rules decide
    /// locally with the whole limit).
    pub token: Option<TokenSpec>,
    /// How `POST /v1/lease` hands out capacity to clients (seed 000 §7): the policy and
    /// duration of every rule that does not set its own `leases`, and the table bounds.
    pub leases: crate::lease::LeaseConfig,
    /// Where to answer differently from envoyproxy/ratelimit (by default, nowhere).
    pub compat: Compat,
    /// envoyproxy/ratelimit's global `SHADOW_MODE`, over gRPC and `/json`
    /// ([`crate::grpc::GrpcOptions::shadow_mode`]).
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's global `QUOTA_MODE`, over gRPC and `/json`
    /// ([`crate::grpc::GrpcOptions::quota_mode`]).
    pub quota_mode: bool,
    /// envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`, over gRPC and `/json`
    /// ([`crate::grpc::GrpcOptions::response_dynamic_metadata`]).
    pub response_dynamic_metadata: bool,
    /// envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED` and header names
    /// ([`crate::grpc::GrpcOptions::response_headers`]).
    pub response_headers: Option<crate::grpc::ResponseHeaders>,
    /// Most keys held per algorithm for the rules this node decides itself
    /// ([`Engine::with_max_keys`]; `None`: no cap).
    pub max_keys: Option<usize>,
    /// Serve gRPC on this many worker threads, each with its own current-thread runtime
    /// ([`crate::grpc::run_on_workers`]: answers batched into fewer writes); `None`: on the
    /// caller's runtime, as the other servers.
    pub grpc_workers: Option<std::num::NonZeroUsize>,
    /// Whose HTTP/2 the gRPC worker threads speak ([`crate::grpc::GrpcOptions::http2`]).
    pub grpc_http2: crate::grpc::Http2Stack,
}

/// Sluice's opt-in differences from envoyproxy/ratelimit's answers; the default is
/// upstream's behaviour throughout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compat {
    /// `duration_until_reset` to the nanosecond, not in whole seconds, over gRPC and `/json`
    /// ([`crate::grpc::GrpcOptions::subsecond_reset`], [`crate::http::HttpState::with_subsecond_reset`]).
    pub subsecond_reset: bool,
    /// A refused request is not counted, so its permits stay for smaller requests
    /// ([`Engine::set_count_refused`] `false`; envoyproxy/ratelimit's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    pub stop_increment_when_over_limit: bool,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The configuration is invalid (file, line and reason). The message holds the whole
    /// error, so it is not also the `source`: printed with its causes, it appears once.
    #[error("invalid configuration: {0}")]
    Config(ConfigError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The cluster could not start.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The token server settings are invalid.
    #[error("token server: {0}")]
    Token(#[from] crate::token_server::TokenError),
    /// The Redis settings are invalid.
    #[error("redis: {0}")]
    Redis(#[from] crate::central::CentralError),
    /// The client lease settings are invalid.
    #[error("client leases: {0}")]
    Leases(#[from] crate::lease::LeaseConfigError),
}

impl From<ConfigError> for DaemonError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

/// Nodes sharing a node's central rules (Redis, token servers), whose fallback decides with
/// `1/N` of each limit: the number `given`, else the size of the node's `cluster` (its peers
/// and itself), else 1 (a node alone). The one default of `--redis-nodes` and
/// `--token-nodes`.
#[must_use]
pub fn fallback_nodes(given: Option<u64>, cluster: Option<&ClusterSpec>) -> u64 {
    given.unwrap_or_else(|| cluster.map_or(1, |c| c.peers.len() as u64 + 1))
}

/// A running node.
#[derive(Debug)]
pub struct Daemon {
    /// The decision engine.
    pub engine: Arc<Engine>,
    /// The cluster driver, if clustered.
    pub cluster: Option<Arc<Cluster>>,
    /// Bound gRPC address.
    pub grpc_addr: SocketAddr,
    /// Bound HTTP address.
    pub http_addr: Option<SocketAddr>,
    /// Bound peer address.
    pub peer_addr: Option<SocketAddr>,
    /// Bound token server address, if this node is a token server.
    pub token_addr: Option<SocketAddr>,
    /// This node's token server, if it is one.
    pub token_server: Option<Arc<crate::token_server::TokenServerNode>>,
    http_state: crate::http::HttpState,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

async fn bind_tcp(addr: SocketAddr) -> Result<TcpListener, DaemonError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Bind { addr, source })
}

impl Daemon {
    /// Validates the configuration, binds every address and starts serving.
    ///
    /// # Errors
    /// [`DaemonError`]: nothing is left running then.
    pub async fn start(spec: DaemonSpec) -> Result<Self, DaemonError> {
        Self::start_with(spec, Extras::default()).await
    }

    /// As [`Daemon::start`], with the [`Extras`] (token servers).
    ///
    /// # Errors
    /// [`DaemonError`]: nothing is left running then.
    pub async fn start_with(spec: DaemonSpec, extras: Extras) -> Result<Self, DaemonError> {
        // Taken before the files are read, so the watcher sees a change made meanwhile (taken
        // in its task, one made before the task first ran was lost).
        let files = match (spec.watch, spec.source.path()) {
            (Some(_), Some(path)) => fingerprint(path),
            _ => Vec::new(),
        };
        let config = spec.source.load()?;
        let leases = Arc::new(crate::lease::Leases::new(extras.leases)?);
        if config.domains().next().is_none() {
            tracing::warn!("the configuration defines no domain: every request is answered OK");
        }
        let engine = Arc::new(Engine::with_max_keys(config, extras.max_keys));
        engine.set_count_refused(!extras.compat.stop_increment_when_over_limit);
        if let Some(r) = &spec.redis {
            // Nodes sharing the Redis rules: a fallback share is 1/N of the limit.
            let nodes = fallback_nodes(r.nodes, spec.cluster.as_ref().map(|(c, _)| c));
            let central = crate::central::connect(&r.url, r.mode, r.timeout, nodes)?;
            engine.attach_redis(central);
        }
        let (token_listener, token_node) = match &extras.token {
            Some(t) => {
                engine.attach_token_server(crate::token_server::TokenClient::new(t.client.clone()));
                match &t.server {
                    Some((ss, addr)) => {
                        let listener = bind_tcp(*addr).await?;
                        // The limits come from this node's configuration, never a request.
                        let limits = Arc::new(Arc::downgrade(&engine));
                        let node = crate::token_server::TokenServerNode::new(ss.clone(), limits)?;
                        engine.attach_token_server_node(node.clone());
                        (Some(listener), Some(node))
                    }
                    None => (None, None),
                }
            }
            None => (None, None),
        };
        let token_addr = token_listener.as_ref().and_then(|l| l.local_addr().ok());
        let grpc = bind_tcp(spec.grpc_addr).await?;
        let grpc_addr = grpc.local_addr().unwrap_or(spec.grpc_addr);
        let http = match spec.http_addr {
            Some(a) => Some(bind_tcp(a).await?),
            None => None,
        };
        let http_addr = http.as_ref().and_then(|l| l.local_addr().ok());
        let (cluster, peer_addr) = match &spec.cluster {
            Some((cs, addr)) => {
                let socket = bind_peer(*addr).map_err(|source| DaemonError::Bind {
                    addr: *addr,
                    source,
                })?;
                let c = Cluster::new(cs, socket, &engine)?;
                let a = c.local_addr().ok();
                (Some(c), a)
            }
            None => (None, None),
        };
        let (stop, rx) = watch::channel(false);
        let stopped = move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let info: Option<Arc<dyn ClusterInfo>> = cluster.clone().map(|c| c as Arc<dyn ClusterInfo>);
        // One metrics registry for both APIs, so `/metrics` shows gRPC decisions too.
        // envoyproxy/ratelimit's service options, for gRPC and `/json` alike (its `/json`
        // calls the gRPC service).
        let options = crate::grpc::GrpcOptions {
            subsecond_reset: extras.compat.subsecond_reset,
            shadow_mode: extras.shadow_mode,
            quota_mode: extras.quota_mode,
            response_dynamic_metadata: extras.response_dynamic_metadata,
            response_headers: extras.response_headers.clone(),
            http2: extras.grpc_http2,
        };
        let state = crate::http::HttpState::new(engine.clone(), info)
            .with_leases(leases)
            .with_service_options(options.clone());
        let metrics = state.metrics();
        let mut tasks = Vec::new();
        {
            // Capacity leases: expired ones dropped, leased demand fed to cluster rules every
            // 100 ms (not only when a client refreshes).
            let (leases, engine, done) = (state.leases().clone(), engine.clone(), stopped());
            tasks.push(tokio::spawn(crate::lease::tick_every(
                leases,
                engine,
                crate::grpc::UnixClock,
                std::time::Duration::from_millis(100),
                done,
            )));
        }
        {
            let (engine, metrics, done) = (engine.clone(), metrics.clone(), stopped());
            let workers = extras.grpc_workers;
            tasks.push(tokio::spawn(async move {
                let clock = crate::grpc::UnixClock;
                let metrics = Some(metrics);
                let served = match workers {
                    Some(n) => {
                        crate::grpc::run_on_workers(grpc, n, engine, clock, metrics, options, done)
                            .await
                    }
                    None => {
                        crate::grpc::run_with_options(grpc, engine, clock, metrics, options, done)
                            .await
                    }
                };
                if let Err(e) = served {
                    tracing::error!(error = %e, "gRPC server failed");
                }
            }));
        }
        let http_state = state.clone();
        if let Some(listener) = http {
            let done = stopped();
            tasks.push(tokio::spawn(async move {
                if let Err(e) = crate::http::run(listener, state, done).await {
                    tracing::error!(error = %e, "HTTP server failed");
                }
            }));
        }
        if let Some(c) = &cluster {
            let (c, done) = (c.clone(), stopped());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = c.run(done).await {
                    tracing::error!(error = %e, "cluster driver failed");
                }
            }));
        }
        if let (Some(listener), Some(node)) = (token_listener, &token_node) {
            let (node, done) = (node.clone(), stopped());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = crate::token_server::run(listener, node, done).await {
                    tracing::error!(error = %e, "token server failed");
                }
            }));
        }
        if let (Some(every), Some(_)) = (spec.watch, spec.source.path()) {
            let (engine, source, done) = (engine.clone(), spec.source.clone(), stopped());
            let metrics = metrics.clone();
            tasks.push(tokio::spawn(watch_config(
                engine, source, files, every, metrics, done,
            )));
        }
        Ok(Self {
            engine,
            cluster,
            grpc_addr,
            http_addr,
            peer_addr,
            token_addr,
            token_server: token_node,
            http_state,
            stop,
            tasks,
        })
    }

    /// The node's metrics registry (what `/metrics` shows), for an embedder in the same
    /// process (the demo reads the decision latency from it).
    #[must_use]
    pub fn metrics(&self) -> Arc<crate::metrics::Metrics> {
        self.http_state.metrics()
    }

    /// The cluster as the status page shows it by default (the busiest
    /// [`crate::status::LISTED_KEYS`] keys).
    #[must_use]
    pub fn status(&self) -> ClusterStatus {
        self.cluster
            .as_ref()
            .map_or_else(ClusterStatus::single, |c| {
                c.status(crate::status::LISTED_KEYS)
            })
    }

    /// Stops serving: in-flight calls finish, the node hands its shares to its peers.
    pub async fn shutdown(self) {
        // `/readyz` turns 503 first, so load balancers stop sending before the node leaves.
        self.http_state.set_ready(false);
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// A fingerprint of the configuration files: `(path, modified, length)` of each.
fn fingerprint(path: &Path) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
    let entry = |p: PathBuf| {
        let m = std::fs::metadata(&p).ok();
        let modified = m.as_ref().and_then(|m| m.modified().ok());
        (p, modified, m.map_or(0, |m| m.len()))
    };
    match std::fs::read_dir(path) {
        Ok(dir) => {
            let mut v: Vec<_> = dir
                .filter_map(Result::ok)
                .map(|e| entry(e.path()))
                .collect();
            v.sort();
            v
        }
        Err(_) => vec![entry(path.to_path_buf())],
    }
}

/// Reloads the configuration when its files change (polling: portable, no watcher to lose
/// events on editors' rename-into-place). A bad file is logged with file, line and reason,
/// and the configuration in force stays; both outcomes are counted in `metrics`. `seen`: the
/// fingerprint of the files in force.
async fn watch_config(
    engine: Arc<Engine>,
    source: ConfigSource,
    mut seen: Vec<(PathBuf, Option<SystemTime>, u64)>,
    every: Duration,
    metrics: Arc<crate::metrics::Metrics>,
    done: impl std::future::Future<Output = ()>,
) {
    let Some(path) = source.path().map(Path::to_path_buf) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tokio::pin!(done);
    loop {
        tokio::select! {
            () = &mut done => return,
            _ = tick.tick() => {}
        }
        let now = fingerprint(&path);
        if now == seen {
            continue;
        }
        seen = now;
        let reloaded = engine.reload(&source);
        metrics.record_reload(reloaded.is_ok());
        match reloaded {
            Ok(()) => tracing::info!(path = %path.display(), "configuration reloaded"),
            Err(e) => tracing::error!(
                error = %e,
                "configuration change refused; the previous configuration stays in force"
            ),
        }
    }
}

/// The receive buffer the peer socket asks for. Peers' datagrams arrive in bursts (a cycle's
/// messages, up to the link budget each), and a driver descheduled for a moment on a busy
/// machine must not lose them: the kernel's default (about 200 kB) holds three full
/// datagrams. Linux grants at most `net.core.rmem_max`.
pub const PEER_RECV_BUFFER: usize = 4 << 20;

/// Binds the peer socket with a receive buffer of [`PEER_RECV_BUFFER`] (or what the kernel
/// allows, said in the log when less).
fn bind_peer(addr: std::net::SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if let Err(e) = socket.set_recv_buffer_size(PEER_RECV_BUFFER) {
        tracing::warn!(error = %e, "cannot enlarge the peer socket's receive buffer");
    }
    // Linux reports twice what it grants (the other half is its bookkeeping).
    let reported = socket.recv_buffer_size().unwrap_or(0);
    let got = if cfg!(target_os = "linux") {
        reported / 2
    } else {
        reported
    };
    if got < PEER_RECV_BUFFER {
        tracing::warn!(
            asked = PEER_RECV_BUFFER,
            got,
            "the peer socket's receive buffer is smaller than asked (raise net.core.rmem_max): \
             bursts of peer datagrams may be dropped on a busy machine"
        );
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::DaemonError;
    use crate::config::Config;

    /// A refused file stops `sluice serve` with the error and its causes printed: the
    /// reason appears once (it was printed three times, each cause repeating the message).
    #[test]
    fn a_config_error_is_said_once_with_its_causes() {
        let Err(e) = Config::from_yaml("bad.yaml", "domain: d\ndescriptors:\n  - valeu: 1\n")
        else {
            panic!("must be refused");
        };
        let e = DaemonError::from(e);
        let mut said = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            said.push_str(&format!(": {c}"));
            cause = c.source();
        }
        assert_eq!(said.matches("unknown field `valeu`").count(), 1, "{said}");
        assert!(
            said.starts_with("invalid configuration: bad.yaml:3:"),
            "{said}"
        );
    }
}
