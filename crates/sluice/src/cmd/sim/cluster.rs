//! Placeholder until its issue lands.

/// Arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("this experiment is not available yet")
}
