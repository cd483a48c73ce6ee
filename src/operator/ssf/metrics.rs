//! Counters of the receiver. Labels are bounded: delivery method, result and error code.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of `ssf_sets_received_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetLabels {
    /// `push` or `poll`.
    pub delivery: &'static str,
    /// `accepted`, `duplicate`, `refused` (the transmitter was told `err`) or `deferred`
    /// (not processed now, the transmitter will deliver again).
    pub result: &'static str,
    /// The RFC 8935 error code of a refusal, why a SET was deferred (`keys_unavailable`,
    /// `secret_unavailable`, `sink_failed`, `rate_limited`, `revocation_limit`), or `none`.
    pub err: &'static str,
}

/// The receiver's metrics.
#[derive(Clone, Debug, Default)]
pub struct SsfMetrics {
    pub sets_received: Family<SetLabels, Counter>,
}

impl SsfMetrics {
    /// Registers the metrics (as `<prefix>_ssf_sets_received_total`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ssf_sets_received",
            "Security event tokens received, by delivery method, result and error code",
            self.sets_received.clone(),
        );
    }

    pub fn count(&self, delivery: &'static str, result: &'static str, err: &'static str) {
        self.sets_received
            .get_or_create(&SetLabels {
                delivery,
                result,
                err,
            })
            .inc();
    }

    /// The current count of one label combination (for tests and diagnostics).
    pub fn get(&self, delivery: &'static str, result: &'static str, err: &'static str) -> u64 {
        self.sets_received
            .get_or_create(&SetLabels {
                delivery,
                result,
                err,
            })
            .get()
    }
}
