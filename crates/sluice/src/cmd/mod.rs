//! One module per subcommand; each parses its arguments and calls a library.

pub(crate) mod analyze;
pub(crate) mod bench;
pub(crate) mod demo;
pub(crate) mod incarnation;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod settings;
pub(crate) mod sim;
pub(crate) mod upstream_env;

/// Structured logs on stderr; `RUST_LOG` filters them (default `info`).
pub(crate) fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // `try_init`: a second call (tests, the demo's nested nodes) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
