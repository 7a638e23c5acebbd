//! `sluice sim NAME`: simulation experiments.

mod cluster;
mod jsqt;
mod token_account;

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
    /// Token accounts vs proactive gossip at equal message count (seed 004 §4).
    TokenAccount(Box<token_account::Args>),
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.experiment {
        Experiment::Cluster(a) => cluster::run(a),
        Experiment::Jsqt(a) => jsqt::run(a),
        Experiment::TokenAccount(a) => token_account::run(*a),
    }
}
