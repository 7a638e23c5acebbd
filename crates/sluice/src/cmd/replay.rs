//! `sluice replay`: a recorded trace through one limiting algorithm, one decision per request.
//! The logic is `sluice_sim::replay`; this only reads the arguments. `--backend redis://…`
//! sends every decision through the `sluice-redis` scripts with the trace's timestamps: the
//! output is byte-identical to the in-memory one.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use sluice_limits::limit::parse_duration;
use sluice_limits::{AlgorithmKind, AnyAlgorithm, Limit, Nanos, Options, SlidingWindow, WarmUp};
use sluice_sim::replay::redis::replay_redis;
use sluice_sim::replay::{OutputFormat, Replay, replay};

/// Arguments of `sluice replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// fixed-window, fixed-window-first, sliding-window, sliding-log, leaky-bucket,
    /// token-bucket, gcra or warm-up.
    #[arg(long)]
    algorithm: AlgorithmKind,
    /// The limit, N/DURATION (e.g. 100/1s, 10/100ms, 5000/1m); the same for every key.
    #[arg(long)]
    limit: Limit,
    /// Bucket size for leaky-bucket, token-bucket, gcra and warm-up (default: N).
    #[arg(long)]
    burst: Option<u64>,
    /// Sub-windows of sliding-window.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=i64::from(SlidingWindow::MAX_SUB_WINDOWS)))]
    sub_windows: u32,
    /// Warm-up period of warm-up (e.g. 10s).
    #[arg(long, default_value = "1s", value_parser = duration)]
    warm_up: Nanos,
    /// The trace: CSV with header time_ns,key,cost; `-` reads standard input.
    #[arg(long)]
    trace: PathBuf,
    /// Output format: csv or jsonl.
    #[arg(long, default_value = "csv", value_parser = format)]
    format: OutputFormat,
    /// Write decisions to this file instead of standard output.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Print totals (requests, admitted, keys) to standard error at the end.
    #[arg(long)]
    summary: bool,
    /// Who decides: `memory` (sluice-limits in this process) or `redis://HOST:PORT[/DB]`
    /// (the sluice-redis scripts on that server, with the trace's timestamps; every
    /// algorithm).
    #[arg(long, default_value = "memory", value_parser = backend)]
    backend: Backend,
    /// With a Redis backend: the prefix of every key it writes (default: one of its own per
    /// run, `sluice-replay:PID.NANOS:`, so runs never share state). Keys expire a day
    /// after their last use.
    #[arg(long)]
    redis_prefix: Option<String>,
}

/// Where decisions are made.
#[derive(Debug, Clone)]
enum Backend {
    Memory,
    Redis(String),
}

fn backend(s: &str) -> Result<Backend, String> {
    if s == "memory" {
        Ok(Backend::Memory)
    } else if s.starts_with("redis://") || s.starts_with("rediss://") {
        Ok(Backend::Redis(s.to_string()))
    } else {
        Err(format!(
            "unknown backend {s:?} (expected memory or redis://HOST:PORT)"
        ))
    }
}

fn duration(s: &str) -> Result<Nanos, String> {
    parse_duration(s).ok_or_else(|| format!("cannot parse duration {s:?} (e.g. 500ms, 10s, 1m)"))
}

fn format(s: &str) -> Result<OutputFormat, String> {
    s.parse().map_err(|e| format!("{e}"))
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let mut limit = args.limit;
    if let Some(b) = args.burst {
        limit = limit.with_burst(b).context("--burst")?;
    }
    let options = Options {
        sub_windows: args.sub_windows,
        warm_up: WarmUp::guava(args.warm_up),
    };
    let config = Replay {
        algorithm: AnyAlgorithm::new(args.algorithm, options),
        limit,
        format: args.format,
    };
    let input: Box<dyn Read> = if args.trace.as_os_str() == "-" {
        Box::new(io::stdin().lock())
    } else {
        let f = File::open(&args.trace)
            .with_context(|| format!("cannot open the trace {}", args.trace.display()))?;
        Box::new(f)
    };
    let output: Box<dyn Write> = match &args.output {
        Some(p) => {
            Box::new(File::create(p).with_context(|| format!("cannot create {}", p.display()))?)
        }
        None => Box::new(io::stdout().lock()),
    };
    let trace = args.trace.display();
    let summary = match &args.backend {
        Backend::Memory => replay(&config, input, output),
        Backend::Redis(url) => {
            let prefix = args.redis_prefix.clone().unwrap_or_else(unique_prefix);
            replay_redis(&config, url, &prefix, input, output)
        }
    }
    .with_context(|| format!("replaying {trace}"))?;
    if args.summary {
        eprintln!(
            "{} requests, {} admitted ({} permits), {} keys",
            summary.requests, summary.allowed, summary.allowed_cost, summary.keys
        );
    }
    Ok(())
}

/// A key prefix no other run uses: the process id and the wall clock (the binary may read
/// it; the replay itself only uses the trace's time).
fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("sluice-replay:{}.{nanos}:", std::process::id())
}
