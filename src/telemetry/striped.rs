//! A Prometheus histogram that every worker thread can observe into without waiting for the
//! others.
//!
//! `prometheus_client`'s `Histogram` takes a mutex on every observation. On the sidecar's
//! request path (one observation per forwarded request) that mutex is a point where all
//! workers meet, and on a many-core node the cache line it lives on bounces between every
//! core at the request rate. [`StripedHistogram`] keeps [`STRIPES`] copies of the counters,
//! each on its own cache lines; a thread always writes the stripe it was given the first time
//! it observed (round robin), with relaxed atomic additions and no lock. A scrape adds the
//! stripes up. A scrape that races observations may see an observation's bucket count before
//! its sum (each counter is exact; the set of them is not one snapshot), which Prometheus
//! tolerates the same way it tolerates scraping a busy process at any moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Copies of the counters; a power of two at least the worker count of most nodes.
pub const STRIPES: usize = 16;

/// One copy of the counters, alone on its cache lines (128 bytes: adjacent-line prefetch).
#[repr(align(128))]
#[derive(Debug)]
struct Stripe {
    /// Non-cumulative count per bucket; the last one is `+Inf`.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    /// Sum of the observations in nanounits (the value × 10⁹), so it adds without a CAS loop.
    sum_nanos: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    /// Upper bounds, ascending, ending with `+Inf`.
    bounds: Box<[f64]>,
    stripes: Box<[Stripe]>,
}

/// A lock-free histogram of non-negative values (durations in seconds); cheap to clone, and
/// every clone observes into the same counters.
#[derive(Clone, Debug)]
pub struct StripedHistogram {
    inner: Arc<Inner>,
}

fn stripe_of_this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

impl StripedHistogram {
    /// A histogram with these upper bounds (ascending) and a `+Inf` bucket after them.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Box<[f64]> = bounds
            .into_iter()
            .chain(std::iter::once(f64::INFINITY))
            .collect();
        let stripes = (0..STRIPES)
            .map(|_| Stripe {
                buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
                count: AtomicU64::new(0),
                sum_nanos: AtomicU64::new(0),
            })
            .collect();
        Self {
            inner: Arc::new(Inner { bounds, stripes }),
        }
    }

    /// Records one value (negative and NaN values count as 0).
    pub fn observe(&self, value: f64) {
        let value = if value.is_nan() { 0.0 } else { value.max(0.0) };
        let inner = &*self.inner;
        let bucket = inner
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(inner.bounds.len() - 1);
        let stripe = &inner.stripes[stripe_of_this_thread()];
        stripe.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        stripe.count.fetch_add(1, Ordering::Relaxed);
        // Saturates at about 584 years of summed seconds.
        let nanos = (value * 1e9).round().min(u64::MAX as f64) as u64;
        stripe.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Sum, count and non-cumulative bucket counts over all stripes.
    fn totals(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let mut buckets: Vec<(f64, u64)> = inner.bounds.iter().map(|b| (*b, 0)).collect();
        let mut count = 0u64;
        let mut sum_nanos = 0u128;
        for stripe in inner.stripes.iter() {
            for (total, bucket) in buckets.iter_mut().zip(stripe.buckets.iter()) {
                total.1 += bucket.load(Ordering::Relaxed);
            }
            count += stripe.count.load(Ordering::Relaxed);
            sum_nanos += u128::from(stripe.sum_nanos.load(Ordering::Relaxed));
        }
        (sum_nanos as f64 / 1e9, count, buckets)
    }
}

impl TypedMetric for StripedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for StripedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.totals();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
    use prometheus_client::registry::Registry;

    use super::*;

    fn text(name: &str, metric: impl prometheus_client::registry::Metric) -> String {
        let mut registry = Registry::default();
        registry.register(name, "help", metric);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn encodes_exactly_like_the_locking_histogram() {
        let striped = StripedHistogram::new(exponential_buckets(0.001, 2.0, 6));
        let plain = Histogram::new(exponential_buckets(0.001, 2.0, 6));
        for v in [0.0005, 0.001, 0.0015, 0.004, 0.02, 7.0, 0.25] {
            striped.observe(v);
            plain.observe(v);
        }
        // Same buckets, count and sum (the sum to the nanosecond it is kept in).
        let lines = |text: String| -> Vec<String> {
            text.lines()
                .filter(|l| !l.starts_with("d_sum"))
                .map(str::to_owned)
                .collect()
        };
        let (sum, _, _) = striped.totals();
        assert_eq!(lines(text("d", striped)), lines(text("d", plain)));
        assert!((sum - 7.2770).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn observations_from_many_threads_all_count() {
        let histogram = StripedHistogram::new([0.5, 1.0]);
        std::thread::scope(|scope| {
            for t in 0..(STRIPES + 3) {
                let histogram = histogram.clone();
                scope.spawn(move || {
                    for i in 0..1000 {
                        histogram.observe(if (i + t) % 2 == 0 { 0.25 } else { 2.0 });
                    }
                });
            }
        });
        let (sum, count, buckets) = histogram.totals();
        let observations = (STRIPES as u64 + 3) * 1000;
        assert_eq!(count, observations);
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), observations);
        assert_eq!(buckets[1].1, 0, "nothing fell between 0.5 and 1");
        let expected = buckets[0].1 as f64 * 0.25 + buckets[2].1 as f64 * 2.0;
        assert!((sum - expected).abs() < 1e-6, "{sum} vs {expected}");
    }

    #[test]
    fn odd_values_land_in_the_first_bucket() {
        let histogram = StripedHistogram::new([1.0]);
        histogram.observe(f64::NAN);
        histogram.observe(-3.0);
        let (sum, count, buckets) = histogram.totals();
        assert_eq!((sum, count), (0.0, 2));
        assert_eq!(buckets, vec![(1.0, 2), (f64::INFINITY, 0)]);
    }
}
