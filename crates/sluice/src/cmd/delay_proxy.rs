//! `sluice delay-proxy`: a TCP proxy adding a fixed one-way delay in each direction, to put
//! a service (Redis) at an emulated network distance in benchmarks. The proxy is
//! `sluice_loadgen::delay_proxy`; this reads the arguments.

use std::time::Duration;

use anyhow::Context;
use sluice_limits::limit::parse_duration;
use sluice_loadgen::delay_proxy::DelayProxy;

/// Arguments of `sluice delay-proxy`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where to listen (host:port).
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// Where to relay every connection (host:port).
    #[arg(long, value_name = "ADDR")]
    upstream: String,
    /// Added to each direction (e.g. 250us, 1ms; 0 relays without delay).
    #[arg(long, value_parser = delay)]
    delay: Duration,
}

fn delay(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
        .map(Duration::from_nanos)
        .ok_or_else(|| format!("cannot parse delay {s:?} (e.g. 0, 100us, 250us, 1ms)"))
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    // One thread: the proxy's own CPU stays on one core, and its timers are its own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let proxy = DelayProxy::bind(&args.listen, &args.upstream, args.delay).await?;
        eprintln!(
            "sluice delay-proxy: {} -> {}, {:?} added each way",
            proxy.local_addr()?,
            args.upstream,
            args.delay
        );
        proxy
            .run(|peer, end| {
                if let Err(e) = end {
                    eprintln!("sluice delay-proxy: connection from {peer}: {e}");
                }
            })
            .await?;
        Ok(())
    })
}
