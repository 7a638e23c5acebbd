//! Topology analysis and synthesis for Sluice clusters (seed 000).
