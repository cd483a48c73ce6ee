//! The status reconcilers: one kube-runtime `Controller` per kind. Each reconcile is fetch →
//! pure desired status (`status`) → server-side apply of `.status` with one field manager when
//! it differs from what the object has. Only the leader writes; followers keep their caches warm
//! and reconcile everything when they take over.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::api::{
    API_VERSION, CapabilityException, ExceptionState, McpServerPolicy, PrincipalRevocation,
};
use crate::policy::ObjectKey;
use crate::telemetry::revocation_spans;

use super::cluster_acks::ClusterAcks;
use super::config::BypassPrevention;
use super::conventions::FIELD_MANAGER;
use super::metrics::OperatorMetrics;
use super::network_policy;
use super::object_metrics::sidecars_of;
use super::plan::window_condition;
use super::propagation::PropagationTracker;
use super::revocation_traces::trace_of;
use super::sessions::Sessions;
use super::status::{exception_status, policy_status, revocation_status};
use super::stream::Distribution;

/// Reconciles each controller runs at once (kube-runtime's default is unbounded). Every plan
/// publish reconciles every object of every kind, so with 1,000 policies an unbounded
/// controller would have 1,000 status patches, Events and NetworkPolicy applies in flight
/// together; eight per kind (24 for the three controllers) keeps the operator well inside the
/// API server's default in-flight budget (200 mutating requests), while a round over 1,000
/// objects is still only 125 successive waves of requests per controller. A controller never
/// runs two reconciles of the same object at once, whatever this number.
pub const RECONCILE_CONCURRENCY: u16 = 8;
// kube-runtime reads 0 as "unbounded".
const _: () = assert!(RECONCILE_CONCURRENCY > 0);

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub distribution: watch::Receiver<Arc<Distribution>>,
    pub sessions: Arc<Sessions>,
    /// Every replica's sidecars (this one's live, the others' from their ack tables).
    pub acks: Arc<ClusterAcks>,
    pub tracker: Arc<Mutex<PropagationTracker>>,
    pub leading: watch::Receiver<bool>,
    pub pods: Store<Pod>,
    pub metrics: Arc<OperatorMetrics>,
    pub recorder: Recorder,
    pub bypass: BypassPrevention,
    /// What each policy's NetworkPolicy was last reconciled to (see `network_policy`).
    pub network_policies: Mutex<std::collections::HashMap<ObjectKey, String>>,
}

/// A failed reconcile (retried with a short delay).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Retry delay after a failed reconcile.
pub fn retry<K>(_object: Arc<K>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

fn key_of(meta: &kube::api::ObjectMeta) -> ObjectKey {
    ObjectKey {
        namespace: meta
            .namespace
            .clone()
            .unwrap_or_else(|| crate::policy::compile::defaults::NAMESPACE.to_owned()),
        name: meta.name.clone().unwrap_or_default(),
    }
}

fn leading(ctx: &Context) -> bool {
    *ctx.leading.borrow()
}

fn ready_status(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == crate::api::conditions::READY)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn apply_status<K, S>(
    api: &Api<K>,
    name: &str,
    kind: &'static str,
    status: &S,
    metrics: &OperatorMetrics,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let patch = serde_json::json!({"apiVersion": API_VERSION, "kind": kind, "status": status});
    let result = api
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await;
    metrics.status_written(kind, if result.is_ok() { "ok" } else { "error" });
    result.map(|_| ())
}

/// Publishes an Event when the Ready condition changed; failures are logged, not retried
/// (Events are for people, status is the record).
async fn announce<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    object: &K,
    before: Option<(String, String, String)>,
    after: Option<(String, String, String)>,
) {
    let Some((status, reason, message)) = after else {
        return;
    };
    if before
        .as_ref()
        .is_some_and(|(s, r, _)| *s == status && *r == reason)
    {
        return;
    }
    let event = Event {
        type_: if status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason,
        note: Some(message.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::debug!(%error, "publishing an Event failed");
    }
}

/// McpServerPolicy: compiled, sidecars in sync, conflicts; and its NetworkPolicy.
pub async fn reconcile_policy(
    policy: Arc<McpServerPolicy>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    reconcile_policy_at(policy, ctx, Timestamp::now()).await
}

/// [`reconcile_policy`] at the instant `now` (condition transition times).
pub(crate) async fn reconcile_policy_at(
    policy: Arc<McpServerPolicy>,
    ctx: Arc<Context>,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    ctx.metrics.reconciled("McpServerPolicy", "ok");
    if !leading(&ctx) {
        return Ok(Action::await_change());
    }
    let key = key_of(&policy.metadata);
    let distribution = ctx.distribution.borrow().clone();
    let Some(plan) = distribution.plan.policies.get(&key) else {
        // Not planned yet: the distributor's next publish reconciles everything again.
        return Ok(Action::await_change());
    };
    let view = ctx.acks.view();
    let sidecars = sidecars_of(&distribution.plan, &key, |pod, hash| {
        view.in_sync(pod, hash)
    });
    let previous = policy.status.clone().unwrap_or_default();
    let desired = policy_status(plan, sidecars, &previous, now);
    if policy.status.as_ref() != Some(&desired) {
        let api: Api<McpServerPolicy> = Api::namespaced(ctx.client.clone(), &key.namespace);
        apply_status(&api, &key.name, "McpServerPolicy", &desired, &ctx.metrics).await?;
        announce(
            &ctx,
            policy.as_ref(),
            ready_status(&previous.conditions),
            ready_status(&desired.conditions),
        )
        .await;
    }
    // Applied only when what this policy needs changed since the last successful write (every
    // plan publish reconciles every policy; the API server need not hear about it each time).
    let wanted = network_policy::fingerprint(&policy, &ctx.bypass);
    let done = ctx
        .network_policies
        .lock()
        .map(|m| m.get(&key) == Some(&wanted))
        .unwrap_or(false);
    if !done {
        network_policy::reconcile(&ctx.client, &policy, &ctx.bypass).await?;
        if let Ok(mut m) = ctx.network_policies.lock() {
            m.insert(key, wanted);
        }
    }
    Ok(Action::await_change())
}

/// CapabilityException: state, approver, conditions; requeued at its next flip.
pub async fn reconcile_exception(
    exception: Arc<CapabilityException>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    reconcile_exception_at(exception, ctx, Timestamp::now()).await
}

/// [`reconcile_exception`] at the instant `now`.
pub(crate) async fn reconcile_exception_at(
    exception: Arc<CapabilityException>,
    ctx: Arc<Context>,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    ctx.metrics.reconciled("CapabilityException", "ok");
    // The flip instant is requeued whether or not we lead, so a new leader is not late.
    let next_flip = [exception.spec.not_before.0, exception.spec.expires_at.0]
        .into_iter()
        .filter(|t| *t > now)
        .min();
    let action = match next_flip {
        Some(at) => Action::requeue(
            Duration::try_from(at.duration_since(now)).unwrap_or_default()
                + Duration::from_millis(5),
        ),
        None => Action::await_change(),
    };
    if !leading(&ctx) {
        return Ok(action);
    }
    let key = key_of(&exception.metadata);
    let distribution = ctx.distribution.borrow().clone();
    let Some(plan) = distribution.plan.exceptions.get(&key) else {
        return Ok(action);
    };
    // The plan may predate the flip by a few milliseconds: trust the clock for the window.
    let mut plan = plan.clone();
    if plan.signature_verified {
        plan.state = if now < exception.spec.not_before.0 {
            ExceptionState::NotYetValid
        } else if now >= exception.spec.expires_at.0 {
            ExceptionState::Expired
        } else {
            ExceptionState::Active
        };
        (plan.reason, plan.message) = window_condition(plan.state, &exception.spec);
    }
    let previous = exception.status.clone().unwrap_or_default();
    let desired = exception_status(&plan, &previous, now);
    if exception.status.as_ref() != Some(&desired) {
        let api: Api<CapabilityException> = Api::namespaced(ctx.client.clone(), &key.namespace);
        apply_status(
            &api,
            &key.name,
            "CapabilityException",
            &desired,
            &ctx.metrics,
        )
        .await?;
        announce(
            &ctx,
            exception.as_ref(),
            ready_status(&previous.conditions),
            ready_status(&desired.conditions),
        )
        .await;
    }
    Ok(action)
}

/// PrincipalRevocation: propagation; deleted once expired.
pub async fn reconcile_revocation(
    revocation: Arc<PrincipalRevocation>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    reconcile_revocation_at(revocation, ctx, Timestamp::now()).await
}

/// [`reconcile_revocation`] at the instant `now`.
pub(crate) async fn reconcile_revocation_at(
    revocation: Arc<PrincipalRevocation>,
    ctx: Arc<Context>,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    ctx.metrics.reconciled("PrincipalRevocation", "ok");
    let name = revocation.name_any();
    if let Some(expires) = &revocation.spec.expires_at
        && expires.0 <= now
    {
        if leading(&ctx) {
            let api: Api<PrincipalRevocation> = Api::all(ctx.client.clone());
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(revocation = %name, "expired revocation deleted"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        lock(&ctx.tracker).forget(&name);
        ctx.sessions.forget_revocation(&name);
        return Ok(Action::await_change());
    }
    let expiry = revocation.spec.expires_at.as_ref().map(|e| {
        Action::requeue(
            Duration::try_from(e.0.duration_since(now)).unwrap_or_default()
                + Duration::from_millis(5),
        )
    });
    let view = ctx.acks.view();
    let reported: HashSet<ObjectKey> = view.reported(&name).into_iter().collect();
    let pods: HashSet<ObjectKey> = ctx
        .pods
        .state()
        .iter()
        .map(|p| key_of(&p.metadata))
        .collect();
    let totals = view.totals(&name);
    let progress = lock(&ctx.tracker).progress(
        &name,
        &reported,
        &pods,
        totals.tasks_cancelled,
        totals.streams_closed,
        now,
    );
    let Some(progress) = progress else {
        // Not observed yet, or waiting for sidecars to reconnect after a restart.
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    if !leading(&ctx) {
        return Ok(expiry.unwrap_or_else(Action::await_change));
    }
    let previous = revocation.status.clone().unwrap_or_default();
    let desired = revocation_status(revocation.metadata.generation, &progress, &previous, now);
    if revocation.status.as_ref() != Some(&desired) {
        let api: Api<PrincipalRevocation> = Api::all(ctx.client.clone());
        apply_status(&api, &name, "PrincipalRevocation", &desired, &ctx.metrics).await?;
        if previous.completed_at.is_none()
            && let Some(millis) = desired.propagation_millis
        {
            ctx.metrics
                .revocation_propagation_seconds
                .observe(millis as f64 / 1000.0);
            tracing::info!(revocation = %name, millis, tasks_cancelled = progress.tasks_cancelled, "revocation propagated");
            let traces = ctx.distribution.borrow().plan.revocation_traces.clone();
            if let Some(traceparent) = trace_of(&revocation, &traces) {
                revocation_spans::propagated(
                    &name,
                    &traceparent,
                    revocation_spans::Propagated {
                        propagation_millis: millis,
                        target_sidecars: i64::from(progress.target),
                        acknowledged_sidecars: i64::from(progress.acknowledged),
                        tasks_cancelled: progress.tasks_cancelled,
                    },
                );
            }
        }
        announce(
            &ctx,
            revocation.as_ref(),
            ready_status(&previous.conditions),
            ready_status(&desired.conditions),
        )
        .await;
    }
    Ok(expiry.unwrap_or_else(Action::await_change))
}

fn lock(tracker: &Mutex<PropagationTracker>) -> std::sync::MutexGuard<'_, PropagationTracker> {
    super::conventions::locked(tracker)
}

/// A stream that yields once per change of `receiver`.
pub fn changes<T: Send + Sync + 'static>(
    receiver: watch::Receiver<T>,
) -> impl Stream<Item = ()> + Send + 'static {
    futures_util::stream::unfold(receiver, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// A stream of the items sent on `receiver`.
pub fn received<T: Send + 'static>(
    receiver: mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(receiver, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item, rx))
    })
}

/// Pods whose acknowledgement changed ⇒ the policies that own them.
pub fn policies_of_pods(
    pods: mpsc::UnboundedReceiver<ObjectKey>,
    distribution: watch::Receiver<Arc<Distribution>>,
) -> impl Stream<Item = ObjectRef<McpServerPolicy>> + Send + 'static {
    received(pods).filter_map(move |pod| {
        let policy = distribution.borrow().plan.pods.get(&pod).cloned();
        async move { policy.map(|p| ObjectRef::new(&p.name).within(&p.namespace)) }
    })
}
