//! The parts of a scenario given on the command line: the gain, message pacing, crashes and
//! partitions, with their parsing.

use super::*;

/// The gain `γ`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gain {
    /// The largest stable gain, `min_slope/(2·max d)` (seed 003 eq. 9, 15).
    Stable,
    /// Seed 000 Thm 2's optimal `γ* = 2/(λ2 + λn)` (times the measure's slope), capped at
    /// the stable gain.
    Auto,
    /// This value.
    Fixed(f64),
}

impl FromStr for Gain {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self, ClusterError> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        match s.parse::<f64>() {
            Ok(g) if g.is_finite() && g > 0.0 => Ok(Self::Fixed(g)),
            _ => Err(ClusterError::Invalid(format!(
                "gamma `{s}`: expected a positive number or `auto`"
            ))),
        }
    }
}

/// Message pacing of the nodes' links of the law (seed 004): `none` (a message every cycle,
/// never reactive), `proactive`, `simple:C`, `generalized:A:C` or `randomized:A:C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing(pub Option<PacingStrategy>);

impl Pacing {
    /// Sluice's default in the simulator: a simple token account of capacity 2 (seed 004
    /// eq. 1–2). On average still one message per link and cycle, but news (a demand jump, a
    /// relay request, a relay gift) goes out at once, paid for by skipping the next
    /// proactive message.
    pub const DEFAULT: Self = Self(Some(PacingStrategy::Simple { c: 2 }));
}

impl FromStr for Pacing {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self, ClusterError> {
        let bad = || {
            ClusterError::Invalid(format!(
                "pacing `{s}`: expected none, proactive, simple:C, generalized:A:C or \
                 randomized:A:C"
            ))
        };
        let parts: Vec<&str> = s.split(':').collect();
        let num = |i: usize| -> Result<u32, ClusterError> {
            parts
                .get(i)
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(bad)
        };
        let strategy = match (parts.first().copied(), parts.len()) {
            (Some("none"), 1) => return Ok(Self(None)),
            (Some("proactive"), 1) => PacingStrategy::Proactive,
            (Some("simple"), 2) => PacingStrategy::simple(num(1)?),
            (Some("generalized"), 3) => {
                PacingStrategy::generalized(num(1)?, num(2)?).map_err(|e| bad_pacing(s, &e))?
            }
            (Some("randomized"), 3) => {
                PacingStrategy::randomized(num(1)?, num(2)?).map_err(|e| bad_pacing(s, &e))?
            }
            _ => return Err(bad()),
        };
        Ok(Self(Some(strategy)))
    }
}

fn bad_pacing(s: &str, e: &dyn fmt::Display) -> ClusterError {
    ClusterError::Invalid(format!("pacing `{s}`: {e}"))
}

impl fmt::Display for Pacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("none"),
            Some(PacingStrategy::Proactive) => f.write_str("proactive"),
            Some(PacingStrategy::Simple { c }) => write!(f, "simple:{c}"),
            Some(PacingStrategy::Generalized { a, c }) => write!(f, "generalized:{a}:{c}"),
            Some(PacingStrategy::Randomized { a, c }) => write!(f, "randomized:{a}:{c}"),
        }
    }
}

impl Serialize for Pacing {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `T:NODE[:RESTART_T]`: node `NODE` crashes at cycle `T` (and restarts at `RESTART_T`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crash {
    /// Cycle of the crash.
    pub at: u64,
    /// The node.
    pub node: u32,
    /// Cycle of the restart, if any.
    pub restart: Option<u64>,
}

impl FromStr for Crash {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self, ClusterError> {
        let bad = || ClusterError::Invalid(format!("crash `{s}`: expected T:NODE[:RESTART_T]"));
        let parts: Vec<&str> = s.split(':').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(bad());
        }
        let at = parts[0].trim().parse().map_err(|_| bad())?;
        let node = parts[1].trim().parse().map_err(|_| bad())?;
        let restart = match parts.get(2) {
            Some(r) => Some(r.trim().parse().map_err(|_| bad())?),
            None => None,
        };
        if restart.is_some_and(|r| r <= at) {
            return Err(ClusterError::Invalid(format!(
                "crash `{s}`: the restart must come after the crash"
            )));
        }
        Ok(Self { at, node, restart })
    }
}

/// `T1-T2:NODES`: these nodes are cut off from the others from cycle `T1` to `T2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// First cycle of the cut.
    pub from: u64,
    /// Cycle the cut heals.
    pub to: u64,
    /// The nodes on one side.
    pub nodes: Vec<u32>,
}

impl FromStr for Partition {
    type Err = ClusterError;
    fn from_str(s: &str) -> Result<Self, ClusterError> {
        let bad = || ClusterError::Invalid(format!("partition `{s}`: expected T1-T2:N1,N2,..."));
        let (times, nodes) = s.split_once(':').ok_or_else(bad)?;
        let (a, b) = times.split_once('-').ok_or_else(bad)?;
        let from: u64 = a.trim().parse().map_err(|_| bad())?;
        let to: u64 = b.trim().parse().map_err(|_| bad())?;
        let nodes = nodes
            .split(',')
            .map(|n| n.trim().parse::<u32>().map_err(|_| bad()))
            .collect::<Result<Vec<_>, _>>()?;
        if to <= from {
            return Err(ClusterError::Invalid(format!(
                "partition `{s}`: T2 must be after T1"
            )));
        }
        Ok(Self { from, to, nodes })
    }
}
