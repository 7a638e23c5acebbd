//! The gRPC service on worker threads, each with its own single-threaded tokio runtime; one
//! acceptor hands them the connections round robin, and each connection is served by
//! [`own_http2::serve`] (Sluice's own HTTP/2) or, with [`Http2Stack::H2`],
//! [`connection::serve`] (h2 directly); tonic's routes answer all but plain calls.
//!
//! Why not the multi-threaded runtime: an answered stream wakes its connection's task, and
//! the multi-threaded scheduler runs a task woken by the running one next (its "LIFO
//! slot"), so the connection wrote every answer on its own: a `writev` per one or two calls,
//! which cost the server and its clients more CPU than the decisions. On a current-thread
//! runtime a connection never moves between threads, and its task answers a whole batch of
//! requests before it writes.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::service::Routes;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

use super::{
    GrpcOptions, Http2Stack, RateLimitGrpc, RateLimitServiceServer, ServeError, connection,
    own_http2, sweep,
};
use crate::engine::Engine;
use crate::metrics::Metrics;
use sluice_limits::Clock;

/// How long the acceptor waits after a failed `accept` (e.g. out of file descriptors), so
/// that it does not spin while the cause lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// [`super::run_with_options`] on `workers` threads, each running a current-thread runtime
/// (see the [module documentation](self)): the same services (rate limit and health), the
/// same graceful shutdown, the same answers. Must be called within a tokio runtime, which
/// accepts the connections and sweeps idle keys.
///
/// # Errors
/// [`ServeError`] if a worker cannot start or its server fails.
pub async fn run_on_workers<C: Clock + 'static>(
    listener: TcpListener,
    workers: NonZeroUsize,
    engine: Arc<Engine>,
    clock: C,
    metrics: Option<Arc<Metrics>>,
    options: GrpcOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let clock = Arc::new(clock);
    let sweeper = tokio::spawn(sweep(Arc::clone(&engine), Arc::clone(&clock)));
    let mut service = RateLimitGrpc::new(engine, clock).with_options(options);
    if let Some(metrics) = metrics {
        service = service.with_metrics(metrics);
    }
    let service = Arc::new(service);
    let server = RateLimitServiceServer::from_arc(Arc::clone(&service));
    let health = tonic_health::server::HealthReporter::new();
    health
        .set_serving::<RateLimitServiceServer<RateLimitGrpc<Arc<C>>>>()
        .await;
    let health_service = HealthServer::new(HealthService::from_health_reporter(health.clone()));
    let routes = Routes::new(health_service).add_service(server);

    let (stop, stopped) = watch::channel(false);
    let mut senders = Vec::with_capacity(workers.get());
    let mut done = Vec::with_capacity(workers.get());
    for i in 0..workers.get() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (finished, finished_rx) = oneshot::channel();
        let (service, routes, stopped) = (Arc::clone(&service), routes.clone(), stopped.clone());
        let worker = move || {
            let result = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => {
                    runtime.block_on(serve_worker(rx, service, routes, stopped));
                    Ok(())
                }
                Err(e) => Err(ServeError::Worker(e)),
            };
            let _ = finished.send(result);
        };
        std::thread::Builder::new()
            .name(format!("sluice-grpc-{i}"))
            .spawn(worker)
            .map_err(ServeError::Worker)?;
        senders.push(tx);
        done.push(finished_rx);
    }

    accept(&listener, &senders, shutdown).await;
    drop(listener);
    // Load balancers polling health stop sending before the calls in flight end.
    health
        .set_not_serving::<RateLimitServiceServer<RateLimitGrpc<Arc<C>>>>()
        .await;
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    let _ = stop.send(true);
    let mut result = Ok(());
    for finished in done {
        let outcome = finished.await.unwrap_or_else(|_| {
            Err(ServeError::Worker(std::io::Error::other(
                "a gRPC worker thread stopped abnormally",
            )))
        });
        if result.is_ok() {
            result = outcome;
        }
    }
    drop(senders);
    sweeper.abort();
    result
}

/// One worker: serves the connections it is handed ([`connection::serve`]) until `stopped`
/// turns true, then lets each end its calls in flight (a GOAWAY first) and returns.
async fn serve_worker<C: Clock + 'static>(
    mut incoming: mpsc::UnboundedReceiver<std::net::TcpStream>,
    service: Arc<RateLimitGrpc<Arc<C>>>,
    routes: Routes,
    stopped: watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    let mut watching = stopped.clone();
    let stop_all = async move {
        let _ = watching.wait_for(|s| *s).await;
    };
    tokio::pin!(stop_all);
    loop {
        tokio::select! {
            () = &mut stop_all => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            stream = incoming.recv() => {
                let Some(stream) = stream else { break };
                // Registered with this thread's reactor, so the connection stays here.
                let io = match tokio::net::TcpStream::from_std(stream) {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::debug!(error = %e, "gRPC: cannot take a connection over");
                        continue;
                    }
                };
                let mut stop = stopped.clone();
                let stop = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                let service = Arc::clone(&service);
                match service.options.http2 {
                    Http2Stack::H2 => {
                        connections.spawn(connection::serve(io, service, routes.clone(), stop));
                    }
                    Http2Stack::Own => {
                        connections.spawn(own_http2::serve(io, service, routes.clone(), stop));
                    }
                }
            }
        }
    }
    while connections.join_next().await.is_some() {}
}

/// Accepts connections until `shutdown` completes, handing them to the workers in turn.
async fn accept(
    listener: &TcpListener,
    workers: &[mpsc::UnboundedSender<std::net::TcpStream>],
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut next = 0;
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC: cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // Decisions are tiny messages: don't let Nagle hold them back.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "gRPC: cannot set TCP_NODELAY");
        }
        let mut stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "gRPC: cannot hand a connection over");
                continue;
            }
        };
        // A worker whose server failed has closed its channel: try the next ones.
        for _ in 0..workers.len() {
            let worker = &workers[next % workers.len()];
            next = next.wrapping_add(1);
            match worker.send(stream) {
                Ok(()) => break,
                Err(mpsc::error::SendError(back)) => stream = back,
            }
        }
    }
}
