//! Prometheus metrics of the sidecar. Labels are bounded (method, decision, reason, status, and
//! the name of the CapabilityException that allowed a request): never subjects, clients or
//! task IDs.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;

use super::striped::StripedHistogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: &'static str,
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminalLabels {
    pub status: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapabilityLabels {
    pub capability: &'static str,
    pub decision: &'static str,
    pub reason: &'static str,
    /// The CapabilityException that allowed the request (its name: it lives in the pod's
    /// namespace); empty for a denial.
    pub exception: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectDecisionLabels {
    /// `allow`, `deny` or `error`.
    pub decision: &'static str,
    /// `authorizer`, `cache`, or `unknown_object` (a task without a recorded object).
    pub source: &'static str,
}

/// A request-rate refusal: which scope's bucket was empty and which family of limits it was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RateLimitedLabels {
    /// `principal`, `tenant`, `client` or `server`.
    pub scope: &'static str,
    /// The family of the limit: `all`, `tools_call`, `task_reads`, `listen_opens` or `tool`
    /// (never a tool's name).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Every metric the sidecar exports.
pub struct SidecarMetrics {
    pub registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    /// The `requests` counters of the labels the pipeline uses, resolved once: counting a
    /// request is then one atomic addition, without the family's lock and hash lookup.
    request_counters: RequestCounters,
    pub denials: Family<ReasonLabels, Counter>,
    /// Requests refused by a request-rate limit (`lifeguard_rate_limited_total`).
    pub rate_limited: Family<RateLimitedLabels, Counter>,
    pub tasks_created: Counter,
    pub tasks_terminal: Family<TerminalLabels, Counter>,
    pub policy_reloads: Family<ResultLabels, Counter>,
    pub policy_loaded: Gauge,
    pub ledger_write_seconds: StripedHistogram,
    pub upstream_seconds: StripedHistogram,
    pub anomalies: Family<ReasonLabels, Counter>,
    pub listen_streams: Gauge,
    pub listen_closed: Family<ReasonLabels, Counter>,
    pub capability_decisions: Family<CapabilityLabels, Counter>,
    pub errors: Family<ReasonLabels, Counter>,
    /// Requests about tasks homed on another replica, forwarded there, by outcome.
    pub hop_forwarded: Family<ReasonLabels, Counter>,
    /// Requests other replicas forwarded here and that passed the hop's authentication.
    pub hop_received: Counter,
    /// Tasks failed because their home replica stopped beating.
    pub tasks_orphaned: Counter,
    /// Requests about tasks homed here authorized from the home replica's memory of a recent
    /// read instead of a ledger read.
    pub home_memory_answers: Counter,
    /// Object-level permission decisions (`tasks.objects`), by decision and source.
    pub object_decisions: Family<ObjectDecisionLabels, Counter>,
    /// Time the object authorizer took to answer (cache hits not included).
    pub authorizer_seconds: StripedHistogram,
}

/// Methods whose request counters are resolved once (the pipeline's method labels).
const COUNTED_METHODS: [&str; 8] = [
    "tools/call",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "subscriptions/listen",
    "server/discover",
    "tools/list",
    "other",
];

#[derive(Default)]
struct RequestCounters {
    /// `[method][allow, deny]`
    slots: [[std::sync::OnceLock<Counter>; 2]; COUNTED_METHODS.len()],
}

impl RequestCounters {
    fn slot(&self, method: &str, decision: &str) -> Option<&std::sync::OnceLock<Counter>> {
        let m = COUNTED_METHODS.iter().position(|c| *c == method)?;
        let d = match decision {
            "allow" => 0,
            "deny" => 1,
            _ => return None,
        };
        Some(&self.slots[m][d])
    }
}

impl Default for SidecarMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl SidecarMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lifeguard");
        let requests = Family::<RequestLabels, Counter>::default();
        let denials = Family::<ReasonLabels, Counter>::default();
        let rate_limited = Family::<RateLimitedLabels, Counter>::default();
        let tasks_created = Counter::default();
        let tasks_terminal = Family::<TerminalLabels, Counter>::default();
        let policy_reloads = Family::<ResultLabels, Counter>::default();
        let policy_loaded = Gauge::default();
        let ledger_write_seconds = StripedHistogram::new(exponential_buckets(0.0001, 2.0, 16));
        let upstream_seconds = StripedHistogram::new(exponential_buckets(0.0001, 2.0, 20));
        let anomalies = Family::<ReasonLabels, Counter>::default();
        let listen_streams = Gauge::default();
        let listen_closed = Family::<ReasonLabels, Counter>::default();
        let capability_decisions = Family::<CapabilityLabels, Counter>::default();
        let errors = Family::<ReasonLabels, Counter>::default();
        let hop_forwarded = Family::<ReasonLabels, Counter>::default();
        let hop_received = Counter::default();
        let tasks_orphaned = Counter::default();
        let home_memory_answers = Counter::default();
        let object_decisions = Family::<ObjectDecisionLabels, Counter>::default();
        let authorizer_seconds = StripedHistogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "object_decisions",
            "Object-level permission decisions (tasks.objects), by decision (allow, deny, error) and source (authorizer, cache, unknown_object)",
            object_decisions.clone(),
        );
        registry.register(
            "authorizer_request_seconds",
            "Time the object authorizer took to answer one evaluation",
            authorizer_seconds.clone(),
        );
        registry.register(
            "home_memory_answers",
            "Requests about tasks homed here authorized from a read of the last second instead of a ledger read",
            home_memory_answers.clone(),
        );
        registry.register(
            "hop_forwarded",
            "Requests about tasks homed on another replica, forwarded there, by outcome (answered, unreachable, home_gone)",
            hop_forwarded.clone(),
        );
        registry.register(
            "hop_received",
            "Requests forwarded here by other replicas that passed the hop's authentication",
            hop_received.clone(),
        );
        registry.register(
            "tasks_orphaned",
            "Unfinished tasks failed because their home replica stopped beating",
            tasks_orphaned.clone(),
        );
        registry.register(
            "requests",
            "MCP requests by method and decision",
            requests.clone(),
        );
        registry.register("denials", "Requests refused, by reason", denials.clone());
        registry.register(
            "rate_limited",
            "Requests refused by a request-rate limit, by the bucket's scope and the limit's family",
            rate_limited.clone(),
        );
        registry.register(
            "tasks_created",
            "Tasks committed to the ledger",
            tasks_created.clone(),
        );
        registry.register(
            "tasks_terminal",
            "Tasks that reached a terminal state, by status and cause",
            tasks_terminal.clone(),
        );
        registry.register(
            "policy_reloads",
            "Policy loads by result",
            policy_reloads.clone(),
        );
        registry.register(
            "policy_loaded",
            "1 when a policy is in force",
            policy_loaded.clone(),
        );
        registry.register(
            "ledger_write_seconds",
            "Durable ledger writes (reserve, confirm, finish)",
            ledger_write_seconds.clone(),
        );
        registry.register(
            "upstream_request_seconds",
            "Time to the upstream's response headers",
            upstream_seconds.clone(),
        );
        registry.register(
            "anomalies",
            "Upstream behaviour Lifeguard overrode (e.g. a changed terminal state)",
            anomalies.clone(),
        );
        registry.register(
            "listen_streams",
            "subscriptions/listen streams open now",
            listen_streams.clone(),
        );
        registry.register(
            "listen_closed",
            "Listen streams ended, by reason",
            listen_closed.clone(),
        );
        registry.register(
            "capability_decisions",
            "Server-to-client input requests for deprecated capabilities, by capability, decision, reason and the exception that allowed them",
            capability_decisions.clone(),
        );
        registry.register(
            "errors",
            "Failures while serving requests (ledger, upstream), by kind",
            errors.clone(),
        );
        Self {
            registry,
            request_counters: RequestCounters::default(),
            requests,
            denials,
            rate_limited,
            tasks_created,
            tasks_terminal,
            policy_reloads,
            policy_loaded,
            ledger_write_seconds,
            upstream_seconds,
            anomalies,
            listen_streams,
            listen_closed,
            capability_decisions,
            errors,
            hop_forwarded,
            hop_received,
            tasks_orphaned,
            home_memory_answers,
            object_decisions,
            authorizer_seconds,
        }
    }

    /// Counts one anomaly: upstream behaviour Lifeguard overrode or refused.
    pub fn anomaly(&self, reason: &'static str) {
        self.anomalies.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts one refused request.
    /// Counts one MCP request in `lifeguard_requests_total`.
    pub fn request(&self, method: &'static str, decision: &'static str) {
        let labels = RequestLabels { method, decision };
        match self.request_counters.slot(method, decision) {
            Some(slot) => slot
                .get_or_init(|| self.requests.get_or_create(&labels).clone())
                .inc(),
            None => self.requests.get_or_create(&labels).inc(),
        };
    }

    pub fn denial(&self, reason: &'static str) {
        self.denials.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Metrics of a sidecar fed by the control plane (cluster mode only; a standalone sidecar does
/// not export them).
#[derive(Clone, Default)]
pub struct ControlPlaneMetrics {
    /// `lifeguard_control_plane_connected`: 1 while the distribution stream is open.
    pub connected: Gauge,
    /// `lifeguard_control_plane_reconnects_total`: dials after the first.
    pub reconnects: Counter,
    /// `lifeguard_policy_snapshot_version`: version of the snapshot in force (0: none).
    pub snapshot_version: Gauge,
}

impl ControlPlaneMetrics {
    /// New metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "control_plane_connected",
            "1 while the policy distribution stream from the operator is open",
            metrics.connected.clone(),
        );
        registry.register(
            "control_plane_reconnects",
            "Connections to the operator's distribution stream after the first",
            metrics.reconnects.clone(),
        );
        registry.register(
            "policy_snapshot_version",
            "Version of the policy snapshot in force (0 until one is)",
            metrics.snapshot_version.clone(),
        );
        metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_per_label_through_the_resolved_counters() {
        let metrics = SidecarMetrics::new();
        for _ in 0..3 {
            metrics.request("tasks/get", "allow");
        }
        metrics.request("tasks/get", "deny");
        // A label outside the resolved set still counts.
        metrics.request("tasks/get", "other-decision");
        let text = metrics.encode();
        let line = |labels: &str| {
            text.lines()
                .find(|l| l.starts_with("lifeguard_requests_total{") && l.contains(labels))
                .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
        };
        assert_eq!(
            line(r#"method="tasks/get",decision="allow""#).as_deref(),
            Some("3")
        );
        assert_eq!(
            line(r#"method="tasks/get",decision="deny""#).as_deref(),
            Some("1")
        );
        assert_eq!(line(r#"decision="other-decision""#).as_deref(), Some("1"));
    }
}
