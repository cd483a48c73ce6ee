//! The loop that turns the watch caches into the [`Distribution`] every sidecar stream sends:
//! recompute the plan when anything it depends on changes (an object, a pod, the approver
//! Secret, leadership) or when an exception reaches `notBefore`/`expiresAt` (from the plan
//! published last, so only the policies the change touched are compiled again), publish it, and
//! fix the target of revocations seen for the first time. While it leads and spans are
//! exported, it also starts the trace of each revocation that arrives without one
//! ([`super::revocation_traces`]), in time for the plan that first carries it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::runtime::reflector::{ObjectRef, Store};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::api::{CapabilityException, McpServerPolicy, PrincipalRevocation, SecretKeyRef};

use super::ack_table::SidecarView;
use super::cluster_acks::ClusterAcks;
use super::metrics::OperatorMetrics;
use super::plan::{ApproverKeys, Plan, PodKey, World, plan_from};
use super::propagation::{FirstSight, PropagationTracker};
use super::revocation_traces::{StartedTraces, start_traces};
use super::stream::Distribution;

/// Changes that arrive within this window are planned together.
const COALESCE: Duration = Duration::from_millis(15);

/// The watch caches the plan reads.
#[derive(Clone)]
pub struct Caches {
    pub policies: Store<McpServerPolicy>,
    pub exceptions: Store<CapabilityException>,
    pub revocations: Store<PrincipalRevocation>,
    pub pods: Store<Pod>,
    pub secrets: Store<Secret>,
}

/// Reads the approver keys from the configured Secret in the cache.
pub fn approver_keys(
    secrets: &Store<Secret>,
    reference: Option<&SecretKeyRef>,
    namespace: &str,
) -> ApproverKeys {
    let Some(reference) = reference else {
        return ApproverKeys::Missing;
    };
    let Some(secret) = secrets.get(&ObjectRef::new(&reference.secret_name).within(namespace))
    else {
        return ApproverKeys::Missing;
    };
    ApproverKeys::from_secret(&secret, &reference.key)
}

/// Connected pods (on any replica) whose snapshot carries `revocation`.
pub fn revocation_targets(
    plan: &Plan,
    sidecars: &SidecarView,
    revocation: &str,
) -> BTreeSet<PodKey> {
    sidecars
        .connected()
        .into_iter()
        .filter(|pod| {
            plan.policy_for(pod)
                .and_then(|(_, c)| c)
                .is_some_and(|c| c.revocations.contains(revocation))
        })
        .collect()
}

/// Everything the loop needs.
pub struct Distributor {
    pub caches: Caches,
    pub approver_keys: Option<SecretKeyRef>,
    pub namespace: String,
    pub changes: Arc<Notify>,
    pub publish: watch::Sender<Arc<Distribution>>,
    pub tracker: Arc<Mutex<PropagationTracker>>,
    pub acks: Arc<ClusterAcks>,
    pub metrics: Arc<OperatorMetrics>,
    /// Writes the trace annotation of revocations whose trace this replica starts.
    pub client: kube::Client,
    /// Whether this replica leads (only the leader starts revocation traces).
    pub leading: watch::Receiver<bool>,
    pub started_traces: Mutex<StartedTraces>,
}

impl Distributor {
    /// Recomputes and publishes once; returns the instant of the next self-driven change.
    pub fn step(&self, version: u64) -> Option<Timestamp> {
        let started = std::time::Instant::now();
        let policies = self.caches.policies.state();
        let exceptions = self.caches.exceptions.state();
        let revocations = self.caches.revocations.state();
        let pods = self.caches.pods.state();
        let keys = approver_keys(
            &self.caches.secrets,
            self.approver_keys.as_ref(),
            &self.namespace,
        );
        let now = Timestamp::now();
        let revocation_traces = {
            let mut started = super::conventions::locked(&self.started_traces);
            started.settle(&revocations, now);
            if *self.leading.borrow() {
                start_traces(&mut started, &revocations, now, &self.client);
            }
            started.traces(&revocations, now)
        };
        // The plan published last: policies whose inputs did not change keep its compilation.
        let previous = self.publish.borrow().plan.clone();
        let plan = Arc::new(plan_from(
            Some(&*previous),
            World {
                policies: &policies,
                exceptions: &exceptions,
                revocations: &revocations,
                pods: &pods,
                approver_keys: &keys,
                now,
                revocation_traces: &revocation_traces,
            },
        ));
        drop(previous);
        let (document, hash) = match &keys {
            ApproverKeys::Loaded { document, .. } => (
                Some(document.clone()),
                Some(hex::encode(Sha256::digest(document.get().as_bytes()))),
            ),
            _ => (None, None),
        };
        let next = plan.next_change;
        tracing::debug!(
            version,
            policies = policies.len(),
            revocations = revocations.len(),
            pods = pods.len(),
            compiled_afresh = plan.compiled_afresh,
            revocations_only = plan.revocations_only,
            compiled = ?plan.policies.values().map(|p| p.compiled.as_ref().map(|c| (c.revocations.len(), c.hash.clone()))).collect::<Vec<_>>(),
            "plan computed"
        );
        self.publish.send_replace(Arc::new(Distribution {
            version,
            plan: plan.clone(),
            approver_keys: document,
            approver_keys_hash: hash,
        }));
        self.metrics.plan_version.set(version as i64);
        self.metrics
            .plan_seconds
            .observe(started.elapsed().as_secs_f64());

        // Revocations seen for the first time get their target now, against the plan just
        // published (pods connecting from here on receive them in their first snapshot).
        let sidecars = self.acks.view();
        let mut tracker = super::conventions::locked(&self.tracker);
        for revocation in &revocations {
            let name = revocation.metadata.name.clone().unwrap_or_default();
            let status = revocation.status.as_ref();
            let first = FirstSight {
                created: revocation.metadata.creation_timestamp.as_ref().map(|t| t.0),
                recorded_completion: status.and_then(|s| {
                    Some((
                        s.completed_at.as_ref()?.0,
                        s.propagation_millis?,
                        s.target_sidecars?,
                        s.acknowledged_sidecars?,
                    ))
                }),
            };
            tracker.observe(&name, &first, now, || {
                revocation_targets(&plan, &sidecars, &name)
            });
        }
        // A revocation deleted before it expired is no longer waited for.
        let existing: std::collections::HashSet<&str> = revocations
            .iter()
            .filter_map(|r| r.metadata.name.as_deref())
            .collect();
        tracker.retain(|name| existing.contains(name));
        tracker.fix_deferred_targets(now, |name| revocation_targets(&plan, &sidecars, name));
        let grace = tracker.waiting_for_grace();
        [next, grace].into_iter().flatten().min()
    }

    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        // Versions start from the wall clock so a restarted operator keeps counting upward.
        let mut version = u64::try_from(Timestamp::now().as_millisecond()).unwrap_or(1);
        let mut leading = self.leading.clone();
        loop {
            let next = self.step(version);
            version += 1;
            let sleep = match next {
                Some(at) => {
                    let wait = at.duration_since(Timestamp::now());
                    Duration::try_from(wait).unwrap_or_default() + Duration::from_millis(1)
                }
                None => Duration::from_secs(3600),
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.changes.notified() => {}
                // A new leader starts the traces the previous one had not.
                Ok(()) = leading.changed() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
            tokio::time::sleep(COALESCE).await;
        }
    }
}
