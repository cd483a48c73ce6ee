//! Nearest-rank percentiles (exact for the samples taken), and the tally of errors a run saw.
//! Each benchmark summarizes its samples in its own unit: durations in ms
//! (`operator_bench/stats.rs`), nanoseconds (`sidecar_bench/stats.rs`).

/// Nearest-rank percentile of sorted samples: the smallest sample with at least `q` of all
/// samples at or below it (the default value, zero, when there are none).
pub fn percentile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Errors seen during a run: counted, the first `KEEP` kept verbatim; with `ECHO`, each is
/// also printed to stderr as it is recorded. Each benchmark names its choice in a type alias.
#[derive(Clone, Debug, Default)]
pub struct Errors<const KEEP: usize, const ECHO: bool> {
    pub count: u64,
    pub examples: Vec<String>,
}

impl<const KEEP: usize, const ECHO: bool> Errors<KEEP, ECHO> {
    pub fn record(&mut self, what: impl Into<String>) {
        let what = what.into();
        if ECHO {
            eprintln!("{}: error: {what}", super::cli::NAME);
        }
        self.count += 1;
        if self.examples.len() < KEEP {
            self.examples.push(what);
        }
    }

    /// Adds `other`'s count, and its examples while there is room.
    pub fn merge(&mut self, other: Self) {
        self.count += other.count;
        for e in other.examples {
            if self.examples.len() < KEEP {
                self.examples.push(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 500);
        assert_eq!(percentile(&v, 0.999), 999);
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile::<u64>(&[], 0.5), 0);
        assert_eq!(percentile::<Duration>(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn errors_keep_the_first_few() {
        let mut errors = Errors::<2, false>::default();
        errors.record("a");
        errors.record("b");
        let mut more = Errors::<2, false>::default();
        more.record("c");
        errors.merge(more);
        assert_eq!(
            (errors.count, errors.examples),
            (3, vec!["a".into(), "b".into()])
        );
    }
}
