//! `sluice serve`: the node daemon, a drop-in Envoy rate limit service (gRPC, RLS v3).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use sluice_server::{ConfigSource, Engine};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// envoyproxy/ratelimit configuration: a YAML file, or a directory of `*.yaml` files.
    /// Without it, the built-in example (domain `example`, 10/s per `remote_address`).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Address of the Envoy RLS v3 gRPC service (envoyproxy/ratelimit's default port).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let (source, described) = match args.config {
        Some(path) => {
            let d = path.display().to_string();
            (ConfigSource::Path(path), d)
        }
        None => (ConfigSource::Example, "the built-in example".to_owned()),
    };
    // Validate before listening: a bad file stops the daemon with file, line and reason.
    // The error already names file, line and reason (not as a context chain: its source
    // would repeat the reason).
    let config = source
        .load()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let domains = config.domains().count();
    let engine = Arc::new(Engine::new(config));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.grpc_addr)
            .await
            .with_context(|| format!("cannot listen on {}", args.grpc_addr))?;
        let addr = listener.local_addr().unwrap_or(args.grpc_addr);
        eprintln!(
            "sluice serve: Envoy RLS v3 gRPC on {addr}, {domains} domain(s) from {described}"
        );
        sluice_server::grpc::run(listener, engine, shutdown_signal()).await?;
        eprintln!("sluice serve: stopped");
        Ok(())
    })
}

/// Completes on Ctrl-C, or on SIGTERM (how orchestrators stop a daemon) where there is one.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            // Without the handler, serve until killed rather than stop at once.
            eprintln!("sluice serve: cannot watch for Ctrl-C: {e}");
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
                eprintln!("sluice serve: cannot watch for SIGTERM: {e}");
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
    eprintln!("sluice serve: shutting down, finishing calls in flight");
}
