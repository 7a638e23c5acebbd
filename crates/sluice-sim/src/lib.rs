//! Deterministic simulation that drives Sluice's production state machines.

pub mod baselines;
pub mod chart;
pub mod cluster;
pub mod dispersion;
pub mod dst_example2;
pub mod gdrl;
pub mod jsqt;
pub mod replay;
pub mod showcase;
pub mod token_account;
