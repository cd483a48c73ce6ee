//! Test objects and a reconcile [`Context`] over a mock client.

use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::api::{CapabilityException, McpServerPolicy, PrincipalRevocation};
use crate::distribution::{Ack, PodIdentity, RevocationApplied};
use crate::exception::{ApproverTrust, sign};
use crate::operator::cluster_acks::ClusterAcks;
use crate::operator::config::BypassPrevention;
use crate::operator::controllers::Context;
use crate::operator::metrics::OperatorMetrics;
use crate::operator::object_metrics::ObjectSources;
use crate::operator::plan::{ApproverKeys, Plan, World, plan};
use crate::operator::propagation::PropagationTracker;
use crate::operator::sessions::{SentSnapshot, Sessions};
use crate::operator::stream::Distribution;
use crate::policy::ObjectKey;

use super::api_server::{ANY, NOW};

pub const NS: &str = "team-a";
pub const REPLICA: &str = "replica-0";
pub const ISSUER: &str = "https://idp.example.com";
pub const APPROVER_KID: &str = "test-ed-1";
pub const APPROVER_KEY: &[u8] = include_bytes!("../../../tests/fixtures/keys/issuer-ed25519.pem");
const APPROVER_JWKS: &[u8] = include_bytes!("../../../tests/fixtures/keys/issuer-jwks.json");

pub fn at(t: &str) -> Timestamp {
    t.parse()
        .unwrap_or_else(|e| panic!("test timestamp {t}: {e}"))
}

pub fn key(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: NS.into(),
        name: name.into(),
    }
}

/// An McpServerPolicy selecting `app: reports`, generation 3.
pub fn policy(name: &str) -> McpServerPolicy {
    serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "McpServerPolicy",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "resourceVersion": "41", "generation": 3,
            "creationTimestamp": "2026-11-01T00:00:00Z"
        },
        "spec": {
            "selector": {"matchLabels": {"app": "reports"}},
            "resource": "https://mcp.example.com/mcp",
            "identity": {"issuers": [{
                "issuer": ISSUER,
                "audiences": ["https://mcp.example.com/mcp"],
                "jwksUri": "https://idp.example.com/jwks"
            }]},
            "tasks": {"enabled": true},
            "capabilities": {"sampling": "exception"}
        }
    }))
    .unwrap_or_else(|e| panic!("test policy: {e}"))
}

/// A pod labelled `app: reports`, running as service account `reports`.
pub fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "labels": {"app": "reports"}
        },
        "spec": {"containers": [], "serviceAccountName": "reports"}
    }))
    .unwrap_or_else(|e| panic!("test pod: {e}"))
}

pub fn identity(pod: &str) -> PodIdentity {
    PodIdentity {
        namespace: NS.into(),
        name: pod.into(),
        uid: format!("uid-{pod}"),
        service_account: "reports".into(),
    }
}

/// A CapabilityException `ex` for `policy`, signed by [`APPROVER_KID`], generation 2.
pub fn exception(policy: &str, not_before: &str, expires: &str) -> CapabilityException {
    let mut e: CapabilityException = serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
        "metadata": {
            "name": "ex", "namespace": NS, "uid": "uid-ex", "resourceVersion": "7",
            "generation": 2
        },
        "spec": {
            "policyRef": {"name": policy}, "capability": "sampling", "clients": ["console"],
            "purpose": "summaries", "modelRoute": "gateway/summaries",
            "limits": {"maxTokens": 500, "maxIterationsPerTask": 2, "maxRequestsPerMinute": 10},
            "notBefore": not_before, "expiresAt": expires, "approvalId": "CHG-1",
            "signature": "placeholder"
        }
    }))
    .unwrap_or_else(|e| panic!("test exception: {e}"));
    e.spec.signature = sign(&e.spec, NS, APPROVER_KEY, APPROVER_KID)
        .unwrap_or_else(|e| panic!("signing the test exception: {e}"));
    e
}

/// The approver keys that verify [`exception`].
pub fn approver_keys() -> ApproverKeys {
    let document: Value =
        serde_json::from_slice(APPROVER_JWKS).unwrap_or_else(|e| panic!("test JWKS: {e}"));
    ApproverKeys::Loaded {
        trust: Arc::new(
            ApproverTrust::from_json(APPROVER_JWKS).unwrap_or_else(|e| panic!("test JWKS: {e}")),
        ),
        document: Arc::from(
            serde_json::value::to_raw_value(&document).unwrap_or_else(|e| panic!("{e}")),
        ),
    }
}

/// A cluster-scoped PrincipalRevocation of `alice` at [`ISSUER`], generation 1.
pub fn revocation(name: &str, expires: Option<&str>) -> PrincipalRevocation {
    let mut spec = json!({
        "issuer": ISSUER, "subject": "alice", "revokedBefore": "2026-12-01T00:00:00Z",
        "reason": "sessionRevoked", "source": {"kind": "manual"}
    });
    if let Some(e) = expires {
        spec["expiresAt"] = json!(e);
    }
    serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
        "metadata": {
            "name": name, "uid": format!("uid-{name}"), "resourceVersion": "12",
            "generation": 1
        },
        "spec": spec
    }))
    .unwrap_or_else(|e| panic!("test revocation: {e}"))
}

/// The objects a plan is computed from.
#[derive(Default)]
pub struct Cluster {
    pub policies: Vec<McpServerPolicy>,
    pub exceptions: Vec<CapabilityException>,
    pub revocations: Vec<PrincipalRevocation>,
    pub pods: Vec<Pod>,
    pub keys: ApproverKeys,
}

impl Cluster {
    pub fn plan(&self, now: Timestamp) -> Plan {
        fn shared<T: Clone>(items: &[T]) -> Vec<Arc<T>> {
            items.iter().cloned().map(Arc::new).collect()
        }
        plan(World {
            policies: &shared(&self.policies),
            exceptions: &shared(&self.exceptions),
            revocations: &shared(&self.revocations),
            pods: &shared(&self.pods),
            approver_keys: &self.keys,
            now,
            revocation_traces: &Default::default(),
        })
    }
}

/// The snapshot hash of the test policy `name` in `plan` (it must compile).
pub fn compiled_hash(plan: &Plan, name: &str) -> String {
    plan.policies[&key(name)]
        .compiled
        .as_ref()
        .map(|c| c.hash.clone())
        .unwrap_or_else(|| panic!("the test policy does not compile"))
}

/// A watch cache holding `pods`.
pub fn pod_store(pods: &[Pod]) -> Store<Pod> {
    let (store, mut writer) = reflector::store();
    for pod in pods {
        writer.apply_watcher_event(&watcher::Event::Apply(pod.clone()));
    }
    store
}

/// Connects `pod` (session `s-POD`) and records its acknowledgement of `hash` and of
/// `revocations` (name, tasks cancelled, streams closed).
pub fn acknowledged(
    sessions: &Sessions,
    pod: &str,
    hash: Option<&str>,
    revocations: &[(&str, u64, u64)],
) {
    let session = format!("s-{pod}");
    sessions.connect(identity(pod), session.clone(), None);
    sessions.record_sent(
        &identity(pod),
        &session,
        SentSnapshot {
            version: 1,
            policy_hash: hash.map(str::to_owned),
            revocations: revocations.iter().map(|r| r.0.to_owned()).collect(),
        },
    );
    let ack = Ack {
        session,
        version: 1,
        policy_hash: hash.map(str::to_owned),
        revocations: revocations
            .iter()
            .map(|(name, tasks, streams)| RevocationApplied {
                name: (*name).to_owned(),
                tasks_cancelled: *tasks,
                streams_closed: *streams,
            })
            .collect(),
    };
    sessions
        .acknowledge(&identity(pod), &ack)
        .unwrap_or_else(|e| panic!("test ack of {pod}: {e}"));
}

/// What a reconcile [`Context`] is made of, apart from the client.
pub struct Setup {
    pub plan: Plan,
    pub leading: bool,
    pub sessions: Sessions,
    pub tracker: PropagationTracker,
    pub pods: Vec<Pod>,
    pub bypass: BypassPrevention,
}

impl Setup {
    pub fn new(plan: Plan, leading: bool) -> Self {
        Self {
            plan,
            leading,
            sessions: Sessions::new().0,
            tracker: PropagationTracker::new(at("2026-01-01T00:00:00Z")),
            pods: Vec::new(),
            bypass: BypassPrevention::default(),
        }
    }

    /// The context; its client and Event recorder both talk to `client`.
    pub fn context(self, client: Client) -> Arc<Context> {
        // The receivers keep the last value after the senders are dropped, which is all a
        // single reconcile reads.
        let (_, distribution) = watch::channel(Arc::new(Distribution {
            version: 1,
            plan: Arc::new(self.plan),
            approver_keys: None,
            approver_keys_hash: None,
        }));
        let (_, leading) = watch::channel(self.leading);
        let sessions = Arc::new(self.sessions);
        let acks = Arc::new(ClusterAcks::new(sessions.clone(), REPLICA.into()));
        let tracker = Arc::new(Mutex::new(self.tracker));
        let metrics = Arc::new(OperatorMetrics::new());
        metrics.objects.attach(Box::new(ObjectSources {
            distribution: distribution.clone(),
            acks: acks.clone(),
            tracker: tracker.clone(),
            leading: leading.clone(),
        }));
        Arc::new(Context {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "lifeguard-operator".into(),
                    instance: Some(REPLICA.into()),
                },
            ),
            client,
            distribution,
            acks,
            sessions,
            tracker,
            leading,
            pods: pod_store(&self.pods),
            metrics,
            bypass: self.bypass,
            network_policies: Default::default(),
        })
    }
}

/// The Event the recorder creates about `regarding` (an object reference as JSON); it lives in
/// the object's namespace (for a cluster-scoped object the URL says `default` and the body
/// names none).
pub fn event(regarding: Value, type_: &str, reason: &str, note: &str) -> Value {
    let mut metadata = json!({"name": ANY});
    if let Some(ns) = regarding.get("namespace") {
        metadata["namespace"] = ns.clone();
    }
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": metadata,
        "action": "Reconcile",
        "eventTime": NOW,
        "note": note,
        "reason": reason,
        "regarding": regarding,
        "reportingController": "lifeguard-operator",
        "reportingInstance": REPLICA,
        "type": type_
    })
}

/// The Events URL of `namespace`.
pub fn events_url(namespace: &str) -> String {
    format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events?")
}
