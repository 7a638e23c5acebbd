//! `sluice sim NAME`: simulation experiments.

mod baselines;
mod cluster;
mod dispersion;
mod dst_example2;
mod gdrl;
mod jsqt;
mod progress;
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
    /// Seed 000 §4.2: Monte-Carlo Φ_ss of the stochastic law next to eq. 24 and eq. 20.
    Dispersion(dispersion::Args),
    /// Seed 000 §6 Example 2: tree vs tree with added links, γ = 0.02 and γ* (Table 4).
    DstExample2(dst_example2::Args),
    /// JSQ / JSQT overload balancing on a server farm (seed 001).
    Jsqt(jsqt::Args),
    /// Token accounts vs proactive gossip at equal message count (seed 004 §4).
    TokenAccount(Box<token_account::Args>),
    /// Seed 003 §III-A: GDRL on a ring, q_i(t) and JFI(t) (Figs. 3–4).
    GdrlRing(gdrl::RingArgs),
    /// Seed 003 §III-B: GDRL under abrupt and smooth demand changes (Figs. 5–6).
    GdrlDynamic(gdrl::DynamicArgs),
    /// Seed 003 §III-C: GDRL on random d-regular graphs, N = 10, 100, 1000 (Fig. 7).
    GdrlScale(gdrl::ScaleArgs),
    /// Sluice next to static, GRD, FPS, central, owner forwarding, leases, dst-sync.
    Baselines(baselines::Args),
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match args.experiment {
        Experiment::Cluster(a) => cluster::run(a),
        Experiment::Dispersion(a) => dispersion::run(a),
        Experiment::DstExample2(a) => dst_example2::run(a),
        Experiment::Jsqt(a) => jsqt::run(a),
        Experiment::TokenAccount(a) => token_account::run(*a),
        Experiment::GdrlRing(a) => gdrl::run_ring(a),
        Experiment::GdrlDynamic(a) => gdrl::run_dynamic(a),
        Experiment::GdrlScale(a) => gdrl::run_scale(a),
        Experiment::Baselines(a) => baselines::run(a),
    }
}
