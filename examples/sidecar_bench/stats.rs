//! Percentiles from raw nanosecond samples (sorted, nearest rank: exact for the samples taken),
//! and the per-phase records the report is built from; shared with `examples/scale_out_bench`,
//! which includes this file.

use serde_json::{Value, json};

use crate::bench_support::stats::percentile;

/// Errors seen in a phase: failed requests are counted, the first 5 are kept verbatim.
pub type Errors = crate::bench_support::stats::Errors<5, false>;

/// Summary of one set of latency samples, in nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub n: usize,
    pub min: u64,
    pub mean: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Summary {
    /// Sorts `samples` in place and summarizes them.
    pub fn of(samples: &mut [u64]) -> Self {
        samples.sort_unstable();
        if samples.is_empty() {
            return Self::default();
        }
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Self {
            n: samples.len(),
            min: samples[0],
            mean: (sum / samples.len() as u128) as u64,
            p50: percentile(samples, 0.50),
            p90: percentile(samples, 0.90),
            p99: percentile(samples, 0.99),
            p999: percentile(samples, 0.999),
            max: samples[samples.len() - 1],
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "n": self.n, "min_ns": self.min, "mean_ns": self.mean, "p50_ns": self.p50,
            "p90_ns": self.p90, "p99_ns": self.p99, "p99_9_ns": self.p999, "max_ns": self.max,
        })
    }
}

/// Difference of two summaries at each percentile (`through` minus `direct`): the latency the
/// sidecar adds. Signed, since noise can make a difference negative.
#[derive(Clone, Debug, Default)]
pub struct Added {
    pub p50: i64,
    pub p90: i64,
    pub p99: i64,
    pub p999: i64,
    pub mean: i64,
}

impl Added {
    pub fn between(direct: &Summary, through: &Summary) -> Self {
        let d = |a: u64, b: u64| a as i64 - b as i64;
        Self {
            p50: d(through.p50, direct.p50),
            p90: d(through.p90, direct.p90),
            p99: d(through.p99, direct.p99),
            p999: d(through.p999, direct.p999),
            mean: d(through.mean, direct.mean),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "p50_ns": self.p50, "p90_ns": self.p90, "p99_ns": self.p99,
            "p99_9_ns": self.p999, "mean_ns": self.mean,
        })
    }
}

/// Microseconds with one decimal, for tables.
pub fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// Signed microseconds with one decimal.
pub fn us_signed(ns: i64) -> String {
    format!("{:+.1}", ns as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).rev().collect();
        let s = Summary::of(&mut v);
        assert_eq!(
            (s.p50, s.p99, s.p999, s.max, s.min),
            (500, 990, 999, 1000, 1)
        );
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile::<u64>(&[], 0.5), 0);
    }
}
