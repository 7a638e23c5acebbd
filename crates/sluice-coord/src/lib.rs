//! The protocol between Sluice nodes, as a sans-IO state machine (seeds 000, 003, 004).
