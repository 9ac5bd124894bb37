//! Summaries of per-iteration times.

use serde::{Deserialize, Serialize};

/// Distribution of a set of durations, in ns. Percentiles are nearest-rank
/// (the value below which `p`% of the samples fall, rounded up), as nccl-
/// and ucx_perftest-style tools report them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub min_ns: f64,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub max_ns: f64,
    pub avg_ns: f64,
}

impl Summary {
    /// Summarises `samples` (any order; empty gives all zeros).
    pub fn of(samples: &[f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let rank = |p: f64| v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            n: v.len(),
            min_ns: v[0],
            p50_ns: rank(50.0),
            p99_ns: rank(99.0),
            max_ns: v[v.len() - 1],
            avg_ns: v.iter().sum::<f64>() / v.len() as f64,
        }
    }

    /// The same distribution with every value multiplied by `k` (e.g. ½ for
    /// half round trips).
    pub fn scaled(&self, k: f64) -> Self {
        Self {
            n: self.n,
            min_ns: self.min_ns * k,
            p50_ns: self.p50_ns * k,
            p99_ns: self.p99_ns * k,
            max_ns: self.max_ns * k,
            avg_ns: self.avg_ns * k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        let s = Summary::of(&v);
        assert_eq!(
            (s.min_ns, s.p50_ns, s.p99_ns, s.max_ns),
            (1.0, 50.0, 99.0, 100.0)
        );
        assert_eq!(s.avg_ns, 50.5);
        let one = Summary::of(&[7.0]);
        assert_eq!((one.p50_ns, one.p99_ns), (7.0, 7.0));
    }
}
