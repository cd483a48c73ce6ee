//! Gauges about individual objects: how many sidecars each McpServerPolicy selects and how many
//! enforce its current snapshot, when each usable CapabilityException expires, and since when
//! each PrincipalRevocation has been waiting for its sidecars.
//!
//! They are computed at scrape time from what the operator already holds (the published plan,
//! the merged acknowledgement view, the propagation tracker), so no series outlives its object
//! and nothing has to be pruned. Only the leader exports them: it is the replica that writes the
//! objects' status, so the gauges and `kubectl get` never disagree, and a query needs no
//! `max by` over replicas. A replica that loses the Lease stops exporting at its next scrape;
//! during a hand-over the series are briefly absent, never doubled.
//!
//! Their labels name objects (`namespace`, `policy`, `exception`, `revocation`): bounded by what
//! platform teams create, unlike subjects or task IDs, which no metric carries.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::watch;

use crate::api::ExceptionCapability;
use crate::exception::gate::capability_key;
use crate::policy::ObjectKey;

use super::cluster_acks::ClusterAcks;
use super::plan::{Plan, PodKey};
use super::propagation::PropagationTracker;
use super::status::PolicySidecars;
use super::stream::Distribution;

/// For every planned policy, the sidecars it wins in `plan` and how many of them `in_sync` says
/// acknowledged its current snapshot (none while it does not compile). One pass over the pods.
pub fn policy_sidecars(
    plan: &Plan,
    in_sync: impl Fn(&PodKey, &str) -> bool,
) -> BTreeMap<ObjectKey, PolicySidecars> {
    let mut policies: BTreeMap<ObjectKey, PolicySidecars> = plan
        .policies
        .keys()
        .map(|key| (key.clone(), PolicySidecars::default()))
        .collect();
    for (pod, owner) in &plan.pods {
        let hash = plan
            .policies
            .get(owner)
            .and_then(|p| p.compiled.as_ref())
            .map(|c| c.hash.as_str());
        if let Some(counts) = policies.get_mut(owner) {
            counts.assigned = counts.assigned.saturating_add(1);
            if hash.is_some_and(|h| in_sync(pod, h)) {
                counts.in_sync = counts.in_sync.saturating_add(1);
            }
        }
    }
    policies
}

/// [`policy_sidecars`] of one policy (zeros when it is not planned).
pub fn sidecars_of(
    plan: &Plan,
    policy: &ObjectKey,
    in_sync: impl Fn(&PodKey, &str) -> bool,
) -> PolicySidecars {
    policy_sidecars(plan, in_sync)
        .remove(policy)
        .unwrap_or_default()
}

/// One usable exception's expiry.
#[derive(Clone, Debug, PartialEq)]
pub struct ExceptionExpiry {
    pub exception: ObjectKey,
    pub capability: ExceptionCapability,
    pub expires_at: Timestamp,
}

/// What the gauges say at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObjectState {
    /// Every planned policy, with zeros when it selects nothing.
    pub policies: BTreeMap<ObjectKey, PolicySidecars>,
    /// Exceptions whose signature verified and whose window has not ended at `now` (an
    /// expired or invalid exception opens nothing, so it has no expiry to warn about).
    pub exceptions: Vec<ExceptionExpiry>,
    /// Revocations not yet acknowledged by every targeted sidecar, with the instant the
    /// propagation clock started.
    pub pending_revocations: Vec<(String, Timestamp)>,
}

/// The gauges for `plan`, the sidecars `in_sync` describes and the `pending` revocations.
pub fn object_state(
    plan: &Plan,
    in_sync: impl Fn(&PodKey, &str) -> bool,
    pending: Vec<(String, Timestamp)>,
    now: Timestamp,
) -> ObjectState {
    let policies = policy_sidecars(plan, in_sync);
    let exceptions = plan
        .exceptions
        .iter()
        .filter(|(_, e)| e.signature_verified && now < e.expires_at)
        .map(|(key, e)| ExceptionExpiry {
            exception: key.clone(),
            capability: e.capability,
            expires_at: e.expires_at,
        })
        .collect();
    let mut pending_revocations = pending;
    pending_revocations.sort();
    ObjectState {
        policies,
        exceptions,
        pending_revocations,
    }
}

fn seconds(at: Timestamp) -> f64 {
    at.as_millisecond() as f64 / 1000.0
}

impl ObjectState {
    /// Writes the gauges. Each family's descriptor is written even without series, so the
    /// names are visible (and checkable) before any object exists.
    pub fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        type Gauge<'a> = (&'a ObjectKey, i64);
        let sidecar_families: [(&str, &str, Vec<Gauge>); 2] = [
            (
                "policy_sidecars_selected",
                "Pods whose sidecar enforces this McpServerPolicy (it selects them and wins them)",
                self.policies
                    .iter()
                    .map(|(k, s)| (k, i64::from(s.assigned)))
                    .collect(),
            ),
            (
                "policy_sidecars_in_sync",
                "Of those, sidecars whose open stream acknowledged the policy's current snapshot",
                self.policies
                    .iter()
                    .map(|(k, s)| (k, i64::from(s.in_sync)))
                    .collect(),
            ),
        ];
        for (name, help, gauges) in sidecar_families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (key, value) in gauges {
                let labels = [
                    ("namespace", key.namespace.as_str()),
                    ("policy", key.name.as_str()),
                ];
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "exception_expiry_timestamp_seconds",
            "End of the validity window of each CapabilityException whose signature verified and \
             that has not expired (Unix seconds)",
            None,
            MetricType::Gauge,
        )?;
        for e in &self.exceptions {
            let labels = [
                ("namespace", e.exception.namespace.as_str()),
                ("exception", e.exception.name.as_str()),
                ("capability", capability_key(e.capability)),
            ];
            ConstGauge::new(seconds(e.expires_at)).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "revocation_pending_since_timestamp_seconds",
            "Start of the propagation clock of each PrincipalRevocation that some targeted \
             sidecar has not acknowledged yet (Unix seconds)",
            None,
            MetricType::Gauge,
        )?;
        for (name, since) in &self.pending_revocations {
            let labels = [("revocation", name.as_str())];
            ConstGauge::new(seconds(*since)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// What the collector reads at each scrape.
pub struct ObjectSources {
    pub distribution: watch::Receiver<Arc<Distribution>>,
    pub acks: Arc<ClusterAcks>,
    pub tracker: Arc<Mutex<PropagationTracker>>,
    pub leading: watch::Receiver<bool>,
}

impl ObjectSources {
    /// The state now, or `None` while this replica does not lead.
    pub fn state(&self, now: Timestamp) -> Option<ObjectState> {
        if !*self.leading.borrow() {
            return None;
        }
        let distribution = self.distribution.borrow().clone();
        let view = self.acks.view();
        let pending = super::conventions::locked(&self.tracker).pending();
        Some(object_state(
            &distribution.plan,
            |pod, hash| view.in_sync(pod, hash),
            pending,
            now,
        ))
    }
}

impl std::fmt::Debug for ObjectSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSources").finish_non_exhaustive()
    }
}

impl Collector for ObjectSources {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.state(Timestamp::now())
            .unwrap_or_default()
            .encode(encoder)
    }
}
