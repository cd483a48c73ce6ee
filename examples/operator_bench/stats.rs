//! Percentiles of the repeated measurements (nearest rank over the runs taken: with 20 runs the
//! p99 is the slowest run, and the table says so by printing the max beside it), in
//! milliseconds; shared with `examples/admission_bench`, which includes this file.

use std::time::Duration;

use serde_json::{Value, json};

use crate::bench_support::stats::percentile;

/// Errors seen during the run: counted, the first 8 kept verbatim, each printed as it comes.
pub type Errors = crate::bench_support::stats::Errors<8, true>;

/// Summary of a set of durations.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub n: usize,
    pub min: Duration,
    pub mean: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Self::default();
        }
        let total: Duration = sorted.iter().sum();
        Self {
            n: sorted.len(),
            min: sorted[0],
            mean: total / u32::try_from(sorted.len()).unwrap_or(u32::MAX),
            p50: percentile(&sorted, 0.50),
            p90: percentile(&sorted, 0.90),
            p99: percentile(&sorted, 0.99),
            max: sorted[sorted.len() - 1],
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "n": self.n, "min_ms": ms(self.min), "mean_ms": ms(self.mean), "p50_ms": ms(self.p50),
            "p90_ms": ms(self.p90), "p99_ms": ms(self.p99), "max_ms": ms(self.max),
        })
    }
}

/// Milliseconds with microsecond precision.
pub fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<Duration> = (1..=20).rev().map(Duration::from_millis).collect();
        let s = Summary::of(&v);
        assert_eq!(s.p50, Duration::from_millis(10));
        assert_eq!(s.p99, Duration::from_millis(20));
        assert_eq!(s.min, Duration::from_millis(1));
        assert_eq!(percentile::<Duration>(&[], 0.5), Duration::ZERO);
    }
}
