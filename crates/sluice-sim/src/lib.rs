//! Deterministic simulation that drives Sluice's production state machines.
