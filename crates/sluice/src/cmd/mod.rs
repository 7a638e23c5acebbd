//! One module per subcommand; each parses its arguments and calls a library.

pub(crate) mod analyze;
pub(crate) mod bench;
pub(crate) mod cluster;
pub(crate) mod delay_proxy;
pub(crate) mod demo;
pub(crate) mod incarnation;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod settings;
pub(crate) mod sim;
pub(crate) mod token;
pub(crate) mod upstream_env;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// One human-readable line per event; colours only on a terminal.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Structured logs on stderr in `format`; `RUST_LOG` filters them, else `level` (default
/// `info`). Colour codes only when stderr is a terminal: a log file or a collector gets
/// plain text.
pub(crate) fn init_logs(format: LogFormat, level: Option<&str>) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.unwrap_or("info")));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // `try_init`: a second call (tests, the demo's nested nodes) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => logs.try_init(),
        LogFormat::Json => logs.json().try_init(),
    };
}
