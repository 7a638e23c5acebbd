//! `sluice`: the one binary. Parses arguments and calls a library; nothing else lives here.
#![allow(clippy::print_stdout)] // a command-line tool prints its results

mod cmd;

// A daemon call allocates often (tonic's 8 KiB codec buffers, h2's frames, tokio's tasks,
// which are over-aligned): glibc's allocator took about a sixth of the server's CPU there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

/// Sluice — a distributed rate limiter that decides every request locally and still keeps
/// the global limit.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A 5-node cluster on loopback sharing one limit (the README's main job); --algorithms
    /// shows the standalone algorithms on a bursty trace.
    Demo(cmd::demo::Args),
    /// Replay a recorded trace through a limiting algorithm: one decision per request.
    Replay(cmd::replay::Args),
    /// Run a simulation experiment.
    Sim(cmd::sim::Args),
    /// Analyse a topology: convergence, robustness, optimal update cycle and weights.
    Analyze(cmd::analyze::Args),
    /// Run the node daemon: a drop-in Envoy rate limit service (gRPC, RLS v3).
    // Boxed: its flags make it much larger than the other commands' (clippy's
    // large_enum_variant).
    Serve(Box<cmd::serve::Args>),
    /// Load-test rate limit services (gRPC or HTTP): throughput and latency percentiles.
    Bench(cmd::bench::Args),
    /// A TCP proxy adding a fixed delay each way (benchmarks: Redis at a network distance).
    DelayProxy(cmd::delay_proxy::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Analyze(a) => cmd::analyze::run(a),
        Command::Serve(a) => cmd::serve::run(*a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::DelayProxy(a) => cmd::delay_proxy::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
