//! What the envoyproxy/ratelimit conformance tests share: where upstream's own fixtures are
//! (`../shared/conformance/envoy-ratelimit/` next to the repository checkout, copied
//! unchanged with their provenance), and a Sluice gRPC server called by Envoy's generated
//! RLS v3 client (`envoy-types`), never through Sluice's own request types.
#![allow(dead_code, clippy::unwrap_used)] // each test target uses its own part

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_limits::ManualClock;
use sluice_server::grpc::GrpcOptions;
use sluice_server::{Config, ConfigSource, Engine};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Start of a unix day (so of a second, minute and hour) plus 250 ms, in nanoseconds.
pub(crate) const T0: u64 = 1_700_006_400 * 1_000_000_000 + 250_000_000;
pub(crate) const SEC: u64 = 1_000_000_000;
/// Every test finishes well within this, or fails.
pub(crate) const BOUND: Duration = Duration::from_secs(30);

/// The conformance corpus, or `None` (with a note printed) when it is not next to the
/// checkout.
pub(crate) fn corpus() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/conformance/envoy-ratelimit");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "note: skipped, the envoyproxy/ratelimit conformance corpus is not at {}",
            dir.display()
        );
        None
    }
}

/// `upstream/test/config/<name>` of the corpus.
pub(crate) fn upstream_config(corpus: &std::path::Path, name: &str) -> PathBuf {
    corpus.join("upstream/test/config").join(name)
}

/// The integration test's runtime directory (`upstream/test/integration/runtime/current/
/// ratelimit/config`).
pub(crate) fn integration_config(corpus: &std::path::Path) -> PathBuf {
    corpus.join("upstream/test/integration/runtime/current/ratelimit/config")
}

/// Loads a file or directory as `sluice serve --config` would.
pub(crate) fn load(path: PathBuf) -> Config {
    ConfigSource::Path(path).load().unwrap()
}

pub(crate) struct Server {
    pub(crate) engine: Arc<Engine>,
    pub(crate) client: RateLimitServiceClient<Channel>,
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) clock: Arc<ManualClock>,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), sluice_server::grpc::ServeError>>,
}

impl Server {
    /// A server with upstream's defaults.
    pub(crate) async fn start(config: Config) -> Self {
        Self::start_with(Engine::new(config), GrpcOptions::default()).await
    }

    /// A server deciding with `engine`, answering with `options`, at `T0` until moved.
    pub(crate) async fn start_with(engine: Engine, options: GrpcOptions) -> Self {
        let engine = Arc::new(engine);
        let clock = Arc::new(ManualClock::new(T0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(sluice_server::grpc::run_with_options(
            listener,
            Arc::clone(&engine),
            Arc::clone(&clock),
            None,
            options,
            async {
                let _ = stopped.await;
            },
        ));
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        Self {
            engine,
            client,
            addr,
            clock,
            stop,
            done,
        }
    }

    /// One `ShouldRateLimit` of `hits` (0: the field left out) for these descriptors.
    pub(crate) async fn ask(
        &mut self,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
        hits: u32,
    ) -> RateLimitResponse {
        self.call(request(domain, descriptors, hits)).await
    }

    pub(crate) async fn call(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
            .unwrap()
    }

    /// Graceful shutdown.
    pub(crate) async fn stop(self) {
        drop(self.client);
        self.stop.send(()).unwrap();
        self.done.await.unwrap().unwrap();
    }
}

pub(crate) fn request(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits: u32,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d, None)).collect(),
        hits_addend: hits,
    }
}

/// A descriptor with its own `hits_addend` when given.
pub(crate) fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..Default::default()
    }
}

pub(crate) fn ok() -> i32 {
    Code::Ok.into()
}

pub(crate) fn over() -> i32 {
    Code::OverLimit.into()
}

/// `(code, requests_per_unit, limit_remaining)` of a status, `None` for the limit when it
/// has none.
pub(crate) fn brief(s: &DescriptorStatus) -> (i32, Option<u32>, u32) {
    (
        s.code,
        s.current_limit.as_ref().map(|l| l.requests_per_unit),
        s.limit_remaining,
    )
}

pub(crate) async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(BOUND, test)
        .await
        .expect("test exceeded its time bound");
}
