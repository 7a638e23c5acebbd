//! Deterministic simulation that drives Sluice's production state machines.

pub mod chart;
pub mod cluster;
pub mod jsqt;
pub mod replay;
pub mod showcase;
pub mod token_account;
