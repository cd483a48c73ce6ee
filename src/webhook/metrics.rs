//! Prometheus metrics of the webhook. Labels are bounded (endpoint, outcome, reason, kind):
//! never pod, namespace or object names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InjectionLabels {
    /// injected, skipped, denied, ignored, invalid
    pub outcome: &'static str,
    /// the skip reason (empty when injected)
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ValidationLabels {
    pub kind: &'static str,
    /// allowed, denied
    pub outcome: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BodyRefusalLabels {
    pub endpoint: &'static str,
    /// too_large, timed_out, unreadable, busy
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: &'static str,
}

/// Every metric the webhook exports.
pub struct WebhookMetrics {
    pub registry: Registry,
    pub injections: Family<InjectionLabels, Counter>,
    pub validations: Family<ValidationLabels, Counter>,
    pub warnings: Family<EndpointLabels, Counter>,
    pub duration: Family<EndpointLabels, Histogram>,
    /// AdmissionReview bodies not read, by endpoint and reason.
    pub bodies_refused: Family<BodyRefusalLabels, Counter>,
    /// Bytes of `--review-buffer-bytes` reserved by review bodies being read.
    pub review_buffer_reserved: prometheus_client::metrics::gauge::Gauge,
    /// Connections of the `--listen` port: open, refused by a cap, timed out.
    pub connections: crate::runtime::http::ConnectionMetrics,
}

impl WebhookMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lifeguard_webhook");
        let injections = Family::<InjectionLabels, Counter>::default();
        registry.register(
            "injections",
            "Pod admissions at /inject by outcome and skip reason",
            injections.clone(),
        );
        let validations = Family::<ValidationLabels, Counter>::default();
        registry.register(
            "validations",
            "Custom resource admissions at /validate by kind, outcome and reason",
            validations.clone(),
        );
        let warnings = Family::<EndpointLabels, Counter>::default();
        registry.register(
            "admission_warnings",
            "Admission warnings returned, by endpoint",
            warnings.clone(),
        );
        let duration = Family::<EndpointLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 14))
        });
        registry.register(
            "admission_duration_seconds",
            "Time to answer one AdmissionReview, by endpoint",
            duration.clone(),
        );
        let bodies_refused = Family::<BodyRefusalLabels, Counter>::default();
        registry.register(
            "bodies_refused",
            "AdmissionReview bodies not read: too_large (over --max-review-bytes), timed_out \
             (over --body-read-timeout), unreadable, busy (no room in --review-buffer-bytes)",
            bodies_refused.clone(),
        );
        let review_buffer_reserved = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "review_buffer_reserved_bytes",
            "Bytes of --review-buffer-bytes reserved by AdmissionReview bodies being read",
            review_buffer_reserved.clone(),
        );
        let connections = crate::runtime::http::ConnectionMetrics::default();
        connections.register(&mut registry);
        Self {
            registry,
            review_buffer_reserved,
            bodies_refused,
            connections,
            injections,
            validations,
            warnings,
            duration,
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self::new()
    }
}
