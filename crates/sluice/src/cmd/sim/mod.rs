//! `sluice sim NAME`: simulation experiments.

mod cluster;
mod jsqt;

/// Arguments of `sluice sim`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    experiment: Experiment,
}

#[derive(Debug, clap::Subcommand)]
enum Experiment {
    /// Real `sluice-coord` nodes in a seeded in-memory network (seeds 000, 003, 004).
    Cluster(cluster::Args),
    /// JSQ / JSQT overload balancing on a server farm (seed 001).
    Jsqt(jsqt::Args),
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.experiment {
        Experiment::Cluster(a) => cluster::run(a),
        Experiment::Jsqt(a) => jsqt::run(a),
    }
}
