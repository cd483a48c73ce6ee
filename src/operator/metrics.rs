//! Prometheus metrics of the operator. The counters and histograms have bounded labels (kind,
//! result, reason); the per-object gauges (`super::object_metrics`, attached as
//! [`OperatorMetrics::objects`]) name policies, exceptions and revocations (objects platform
//! teams create), never pods, subjects or task IDs.

use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::ReasonLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ViaLabels {
    pub via: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub kind: &'static str,
    pub result: &'static str,
}

/// A collector attached after the registry is built: the per-object gauges read state the
/// operator creates later than its metrics. Encodes nothing until attached.
#[derive(Default)]
pub struct LateCollector(OnceLock<Box<dyn Collector>>);

impl LateCollector {
    /// Attaches `collector` (a second call is ignored: one operator, one set of sources).
    pub fn attach(&self, collector: Box<dyn Collector>) {
        let _ = self.0.set(collector);
    }
}

impl std::fmt::Debug for LateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LateCollector")
            .field(&self.0.get().is_some())
            .finish()
    }
}

impl Collector for LateCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match self.0.get() {
            Some(collector) => collector.encode(encoder),
            None => Ok(()),
        }
    }
}

/// Every metric the operator exports.
pub struct OperatorMetrics {
    pub registry: Registry,
    pub sidecars_connected: Gauge,
    pub snapshots_sent: Counter,
    pub acks: Counter,
    /// How acknowledgements were authenticated: `stream_token` (the token of the pod's open
    /// stream, no review) or `token_review` (a review, or one cached for at most a minute).
    pub ack_authentications: Family<ViaLabels, Counter>,
    /// Streams ended because the life their token gave them was over.
    pub streams_expired: Counter,
    pub auth_refusals: Family<ReasonLabels, Counter>,
    pub ack_refusals: Family<ReasonLabels, Counter>,
    pub reconciles: Family<ReconcileLabels, Counter>,
    pub status_writes: Family<ReconcileLabels, Counter>,
    pub leader: Gauge,
    pub plan_version: Gauge,
    pub plan_seconds: Histogram,
    pub revocation_propagation_seconds: Histogram,
    /// Per-object gauges, computed at scrape time (exported by the leader only).
    pub objects: Arc<LateCollector>,
    /// Connections of the `--listen` port: open, refused by a cap, timed out.
    pub connections: crate::runtime::http::ConnectionMetrics,
}

impl OperatorMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lifeguard_operator");
        let sidecars_connected = Gauge::default();
        registry.register(
            "sidecars_connected",
            "Sidecars with an open policy stream to this replica",
            sidecars_connected.clone(),
        );
        let snapshots_sent = Counter::default();
        registry.register(
            "snapshots_sent",
            "Policy snapshots written to sidecar streams",
            snapshots_sent.clone(),
        );
        let acks = Counter::default();
        registry.register(
            "acknowledgements",
            "Snapshot acknowledgements recorded",
            acks.clone(),
        );
        let ack_authentications = Family::<ViaLabels, Counter>::default();
        registry.register(
            "acknowledgement_authentications",
            "Acknowledgements authenticated, by how: the token of the pod's open stream (stream_token) or a TokenReview, possibly cached (token_review)",
            ack_authentications.clone(),
        );
        let streams_expired = Counter::default();
        registry.register(
            "streams_expired",
            "Policy streams ended when their token expired (at most an hour), so that the sidecar reconnects with its current token",
            streams_expired.clone(),
        );
        let auth_refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "sidecar_auth_refusals",
            "Sidecar connections or acknowledgements refused, by reason",
            auth_refusals.clone(),
        );
        let ack_refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "acknowledgement_refusals",
            "Acknowledgements of authenticated sidecars refused, by reason",
            ack_refusals.clone(),
        );
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciliations by kind and result",
            reconciles.clone(),
        );
        let status_writes = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "status_writes",
            "Status patches sent, by kind and result",
            status_writes.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        let plan_version = Gauge::default();
        registry.register(
            "plan_version",
            "Version of the snapshot set being distributed",
            plan_version.clone(),
        );
        let plan_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "plan_seconds",
            "Time to recompute every policy snapshot after a change",
            plan_seconds.clone(),
        );
        let revocation_propagation_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "revocation_propagation_seconds",
            "Time from first observing a revocation to its last acknowledgement",
            revocation_propagation_seconds.clone(),
        );
        let objects = Arc::new(LateCollector::default());
        registry.register_collector(Box::new(objects.clone()));
        let connections = crate::runtime::http::ConnectionMetrics::default();
        connections.register(&mut registry);
        Self {
            registry,
            sidecars_connected,
            snapshots_sent,
            acks,
            ack_authentications,
            streams_expired,
            auth_refusals,
            ack_refusals,
            reconciles,
            status_writes,
            leader,
            plan_version,
            plan_seconds,
            connections,
            revocation_propagation_seconds,
            objects,
        }
    }

    pub fn auth_refused(&self, reason: &'static str) {
        self.auth_refusals
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts an acknowledgement authenticated `via` (`stream_token` or `token_review`).
    pub fn ack_authenticated(&self, via: &'static str) {
        self.ack_authentications
            .get_or_create(&ViaLabels { via })
            .inc();
    }

    pub fn ack_refused(&self, reason: &'static str) {
        self.ack_refusals
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn reconciled(&self, kind: &'static str, result: &'static str) {
        self.reconciles
            .get_or_create(&ReconcileLabels { kind, result })
            .inc();
    }

    pub fn status_written(&self, kind: &'static str, result: &'static str) {
        self.status_writes
            .get_or_create(&ReconcileLabels { kind, result })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}
