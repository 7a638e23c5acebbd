//! `sluice bench`: a load generator for rate limit services over gRPC or HTTP. The load, the
//! measurement and the comparison are `sluice_loadgen`; this reads the arguments and
//! prints.

use std::time::Duration;

use anyhow::Context;
use sluice_limits::limit::parse_duration;
use sluice_loadgen::{
    self as loadgen, Comparison, KEY_PLACEHOLDER, LoadSpec, Mode, Report, Stop, Target,
};

/// Arguments of `sluice bench`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["grpc", "http"])))]
pub(crate) struct Args {
    /// Envoy RLS v3 gRPC services (host:port), comma-separated; requests go round robin.
    #[arg(long, value_delimiter = ',', value_name = "ADDR[,ADDR..]")]
    grpc: Vec<String>,
    /// HTTP services taking POST /json (http://host:port[/prefix]), comma-separated; round
    /// robin.
    #[arg(long, value_delimiter = ',', value_name = "URL[,URL..]")]
    http: Vec<String>,
    /// Send for this long (e.g. 10s, 500ms, 1m) [default: 10s].
    #[arg(long, value_parser = duration, conflicts_with = "requests")]
    duration: Option<Duration>,
    /// Send exactly this many requests instead of for a duration.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    requests: Option<u64>,
    /// Requests in flight at most (closed loop: always).
    #[arg(long, default_value_t = 32, value_parser = positive)]
    concurrency: usize,
    /// gRPC connections per address, shared by the workers [default: one per worker].
    #[arg(long, value_parser = positive)]
    connections: Option<usize>,
    /// Open loop: send on a fixed schedule of this many requests per second, latency
    /// measured from each request's scheduled time (no coordinated omission). Without it:
    /// closed loop (each worker sends when answered), which measures throughput.
    #[arg(long, value_parser = rate)]
    rate: Option<f64>,
    /// The rate limit domain of every request.
    #[arg(long, default_value = "example")]
    domain: String,
    /// One descriptor, key=value[,key=value..]; repeat for several descriptors per request.
    /// `{i}` is replaced by the key index (request number mod --keys)
    /// [default: remote_address=client-{i}].
    #[arg(long = "descriptor", value_name = "KEY=VALUE[,KEY=VALUE..]", value_parser = descriptor)]
    descriptors: Vec<DescriptorArg>,
    /// How many values `{i}` takes (0..K, round robin).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// A call not answered within this (or an address not connecting) is an error.
    #[arg(long, default_value = "5s", value_parser = duration)]
    timeout: Duration,
    /// Print the report as JSON on standard output (progress stays on standard error).
    #[arg(long)]
    json: bool,
    /// Also run the same load against these gRPC addresses (a baseline, e.g. a node asking
    /// Redis on every request) and report the ratios.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "ADDR[,ADDR..]",
        conflicts_with = "vs_http"
    )]
    vs_grpc: Vec<String>,
    /// Threads of the generator. One (the default) runs everything on a single-threaded
    /// runtime, which batches the calls of a connection into few writes, as h2load does;
    /// more use a multi-threaded runtime.
    #[arg(long, default_value_t = 1, value_parser = positive)]
    threads: usize,
    /// Also run the same load against these HTTP base URLs and report the ratios.
    #[arg(long, value_delimiter = ',', value_name = "URL[,URL..]")]
    vs_http: Vec<String>,
}

/// One `--descriptor`: its entries in order.
#[derive(Debug, Clone)]
struct DescriptorArg(Vec<(String, String)>);

fn duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s) {
        Some(0) => Err("the duration must be positive".to_owned()),
        Some(ns) => Ok(Duration::from_nanos(ns)),
        None => Err(format!("cannot parse duration {s:?} (e.g. 500ms, 10s, 1m)")),
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
}

fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a positive number of requests per second"
        )),
    }
}

fn descriptor(s: &str) -> Result<DescriptorArg, String> {
    s.split(',')
        .map(|entry| match entry.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
            _ => Err(format!(
                "{entry:?} is not key=value (a descriptor is key=value[,key=value..])"
            )),
        })
        .collect::<Result<_, _>>()
        .map(DescriptorArg)
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let target = if args.grpc.is_empty() {
        Target::Http(args.http)
    } else {
        Target::Grpc(args.grpc)
    };
    let baseline = match (args.vs_grpc.is_empty(), args.vs_http.is_empty()) {
        (false, _) => Some(Target::Grpc(args.vs_grpc)),
        (true, false) => Some(Target::Http(args.vs_http)),
        (true, true) => None,
    };
    let descriptors: Vec<Vec<(String, String)>> = if args.descriptors.is_empty() {
        vec![vec![(
            "remote_address".to_owned(),
            format!("client-{KEY_PLACEHOLDER}"),
        )]]
    } else {
        args.descriptors.into_iter().map(|d| d.0).collect()
    };
    let templated = descriptors
        .iter()
        .flatten()
        .any(|(k, v)| k.contains(KEY_PLACEHOLDER) || v.contains(KEY_PLACEHOLDER));
    if args.keys > 1 && !templated {
        eprintln!(
            "sluice bench: warning: --keys {} has no effect: no descriptor contains {KEY_PLACEHOLDER}",
            args.keys
        );
    }
    let mut spec = LoadSpec::new(args.domain, descriptors);
    spec.keys = args.keys;
    spec.concurrency = args.concurrency;
    spec.connections = args.connections;
    spec.rate = args.rate;
    spec.timeout = args.timeout;
    spec.stop = match args.requests {
        Some(n) => Stop::Requests(n),
        None => Stop::Duration(args.duration.unwrap_or(Duration::from_secs(10))),
    };

    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    }
    .context("cannot start the async runtime")?;
    let subject = runtime.block_on(load(&target, &spec))?;
    let baseline = match &baseline {
        Some(b) => Some(runtime.block_on(load(b, &spec))?),
        None => None,
    };

    match &baseline {
        None if args.json => println!("{}", serde_json::to_string_pretty(&subject)?),
        None => print_report(&subject),
        Some(b) => {
            let ratios = loadgen::compare(&subject, b);
            if args.json {
                let all = serde_json::json!({"subject": subject, "baseline": b, "ratios": ratios});
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                print_report(&subject);
                println!();
                print_report(b);
                println!();
                print_comparison(&subject, b, &ratios);
            }
        }
    }
    for r in std::iter::once(&subject).chain(&baseline) {
        if r.sent > 0 && r.errors == r.sent {
            anyhow::bail!(
                "every request to {} failed (first reason: {})",
                r.addresses.join(","),
                r.errors_by_reason.keys().next().map_or("?", String::as_str)
            );
        }
    }
    Ok(())
}

async fn load(target: &Target, spec: &LoadSpec) -> anyhow::Result<Report> {
    let mode = match spec.mode() {
        Mode::ClosedLoop => "closed loop".to_owned(),
        Mode::OpenLoop => format!("open loop at {}/s", spec.rate.unwrap_or_default()),
    };
    eprintln!(
        "sluice bench: {} {} — {mode}, {} in flight at most",
        target.protocol(),
        target.addresses().join(","),
        spec.concurrency
    );
    loadgen::run(target, spec, |p| {
        eprintln!(
            "{:>6.1}s  sent {:>10}  ok {:>10}  over_limit {:>10}  errors {:>6}  {:>9.0} calls/s",
            p.elapsed.as_secs_f64(),
            p.sent,
            p.ok,
            p.over_limit,
            p.errors,
            p.interval_throughput
        );
    })
    .await
    .context("the load could not run")
}

fn print_report(r: &Report) {
    let mode = match (r.mode, r.target_rate) {
        (Mode::OpenLoop, Some(rate)) => format!("open loop at {rate}/s"),
        _ => "closed loop".to_owned(),
    };
    println!(
        "{} {}: {mode}, {} in flight at most, {} connection(s) per address, {} key(s)",
        r.protocol,
        r.addresses.join(","),
        r.concurrency,
        r.connections,
        r.keys
    );
    println!("  elapsed      {:>12.3} s", r.elapsed_s);
    println!("  sent         {:>12}", r.sent);
    println!("  ok           {:>12}", r.ok);
    println!("  over_limit   {:>12}", r.over_limit);
    println!("  errors       {:>12}", r.errors);
    for (reason, n) in &r.errors_by_reason {
        println!("    {n:>10}  {reason}");
    }
    println!("  throughput   {:>12.0} calls/s", r.throughput);
    let header = "                 mean       p50       p90       p99     p99.9       max";
    let row = |name: &str, l: &loadgen::Latency| {
        println!(
            "  {name:<12}{:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            l.mean, l.p50, l.p90, l.p99, l.p99_9, l.max
        );
    };
    match (&r.latency_us, &r.service_time_us) {
        (Some(l), Some(s)) => {
            println!("{header}");
            if r.mode == Mode::OpenLoop {
                row("latency µs", l);
                row("service µs", s);
            } else {
                row("latency µs", l);
            }
        }
        _ => println!("  latency      (no call answered)"),
    }
}

fn print_comparison(subject: &Report, baseline: &Report, c: &Comparison) {
    let f = |x: Option<f64>| x.map_or_else(|| "—".to_owned(), |x| format!("{x:.2}"));
    println!(
        "ratio {} ÷ {} (throughput: higher is better; latency: lower is better)",
        subject.addresses.join(","),
        baseline.addresses.join(",")
    );
    println!("  throughput   {:>8}", f(c.throughput));
    println!("  p50          {:>8}", f(c.p50));
    println!("  p90          {:>8}", f(c.p90));
    println!("  p99          {:>8}", f(c.p99));
    println!("  p99.9        {:>8}", f(c.p99_9));
    println!("  max          {:>8}", f(c.max));
}
