//! The server farm of seed 001 §II: load balancers B, servers S with capacities c_s, and for
//! every balancer b the set S_b of servers it may route to.

use crate::BalanceError;

/// A server farm: capacities c_s and reachable sets S_b (0-based server indices).
#[derive(Debug, Clone, PartialEq)]
pub struct Farm {
    capacities: Vec<f64>,
    reach: Vec<Vec<usize>>,
}

impl Farm {
    /// A farm with the given server capacities and, per balancer, its reachable servers
    /// (0-based). Duplicates are removed; every S_b must be non-empty.
    pub fn new(capacities: Vec<f64>, reach: Vec<Vec<usize>>) -> Result<Self, BalanceError> {
        if capacities.is_empty() || reach.is_empty() {
            return Err(BalanceError::EmptyFarm);
        }
        for (server, &value) in capacities.iter().enumerate() {
            if !(value.is_finite() && value > 0.0) {
                return Err(BalanceError::BadCapacity { server, value });
            }
        }
        let servers = capacities.len();
        let mut clean = Vec::with_capacity(reach.len());
        for (balancer, mut set) in reach.into_iter().enumerate() {
            set.sort_unstable();
            set.dedup();
            if set.is_empty() || set.iter().any(|&s| s >= servers) {
                return Err(BalanceError::BadReach { balancer, servers });
            }
            clean.push(set);
        }
        Ok(Self {
            capacities,
            reach: clean,
        })
    }

    /// A farm where each of `balancers` balancers reaches every server.
    pub fn fully_connected(capacities: Vec<f64>, balancers: usize) -> Result<Self, BalanceError> {
        let all: Vec<usize> = (0..capacities.len()).collect();
        Self::new(capacities, vec![all; balancers])
    }

    /// Parses reachable sets written with 1-based server numbers, balancers separated by `;`
    /// and servers by `,` — e.g. `"1;1,2"` is S_1 = {1}, S_2 = {1, 2} (seed 001 §V-C).
    pub fn parse_reach(text: &str, servers: usize) -> Result<Vec<Vec<usize>>, BalanceError> {
        text.split(';')
            .enumerate()
            .map(|(balancer, part)| {
                part.split(',')
                    .map(|tok| match tok.trim().parse::<usize>() {
                        Ok(n) if (1..=servers).contains(&n) => Ok(n - 1),
                        _ => Err(BalanceError::BadReach { balancer, servers }),
                    })
                    .collect()
            })
            .collect()
    }

    /// Number of servers |S|.
    #[must_use]
    pub fn servers(&self) -> usize {
        self.capacities.len()
    }

    /// Number of load balancers |B|.
    #[must_use]
    pub fn balancers(&self) -> usize {
        self.reach.len()
    }

    /// Server capacities c_s.
    #[must_use]
    pub fn capacities(&self) -> &[f64] {
        &self.capacities
    }

    /// The reachable set S_b (sorted, 0-based).
    #[must_use]
    pub fn reach(&self, balancer: usize) -> &[usize] {
        self.reach.get(balancer).map_or(&[], Vec::as_slice)
    }

    /// Whether balancer `b` may route to server `s` (b ∈ B_s).
    #[must_use]
    pub fn reaches(&self, balancer: usize, server: usize) -> bool {
        self.reach(balancer).binary_search(&server).is_ok()
    }

    /// B_max = max_s |B_s|, the most balancers that can feed one server (seed 001 §IV-A
    /// remark c).
    #[must_use]
    pub fn max_in_degree(&self) -> usize {
        (0..self.servers())
            .map(|s| {
                (0..self.balancers())
                    .filter(|&b| self.reaches(b, s))
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// Checks a demand vector (w_b ≥ 0, one per balancer).
    pub fn check_demand(&self, demand: &[f64]) -> Result<(), BalanceError> {
        if demand.len() != self.balancers() || demand.iter().any(|w| !(w.is_finite() && *w >= 0.0))
        {
            return Err(BalanceError::BadDemand {
                balancers: self.balancers(),
                got: demand.to_vec(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reach_is_one_based_and_validated() {
        assert_eq!(Farm::parse_reach("1;1,2", 2), Ok(vec![vec![0], vec![0, 1]]));
        assert!(Farm::parse_reach("1;3", 2).is_err());
        assert!(Farm::parse_reach("0", 2).is_err());
        assert!(Farm::parse_reach("x", 2).is_err());
    }

    #[test]
    fn rejects_bad_farms() {
        assert!(Farm::new(vec![], vec![vec![0]]).is_err());
        assert!(Farm::new(vec![1.0], vec![]).is_err());
        assert!(Farm::new(vec![-1.0], vec![vec![0]]).is_err());
        assert!(Farm::new(vec![1.0], vec![vec![]]).is_err());
        assert!(Farm::new(vec![1.0], vec![vec![1]]).is_err());
        let f = Farm::new(vec![1.0, 1.0], vec![vec![0], vec![1, 0, 0]]).unwrap();
        assert_eq!(f.reach(1), &[0, 1]);
        assert_eq!(f.max_in_degree(), 2);
        assert!(f.check_demand(&[1.0]).is_err());
        assert!(f.check_demand(&[1.0, f64::NAN]).is_err());
    }
}
