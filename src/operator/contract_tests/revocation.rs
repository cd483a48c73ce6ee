//! `reconcile_revocation`: the propagation status of a cluster-scoped PrincipalRevocation
//! (counts, `completedAt`, `propagationMillis`, `Propagated`), its Event in `default`, and the
//! DELETE of an expired revocation by the leader only.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::api::PrincipalRevocation;
use crate::operator::controllers::{Context, reconcile_revocation_at};
use crate::operator::propagation::FirstSight;

use super::api_server::{Exchange, SSA_QUERY, mock_client};
use super::fixtures::{Setup, acknowledged, at, event, events_url, key, pod, revocation};

const NOW: &str = "2026-12-05T00:00:00Z";
/// When the operator first saw the revocation: 420 ms before [`NOW`].
const OBSERVED: &str = "2026-12-04T23:59:59.58Z";
const URL: &str = "/apis/lifeguard.dev/v1alpha1/principalrevocations/rev";

fn regarding() -> Value {
    // Cluster-scoped: no namespace; the recorder files the Event in `default`.
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
        "name": "rev", "uid": "uid-rev"
    })
}

/// Tracked since [`OBSERVED`] with target pods `reports-0` and `reports-1` (both exist);
/// `acked` lists (pod, tasks cancelled, streams closed) of the sidecars that applied it.
fn setup(leading: bool, acked: &[(&str, u64, u64)]) -> Setup {
    let mut setup = Setup::new(Default::default(), leading);
    setup.pods = vec![pod("reports-0"), pod("reports-1")];
    setup.tracker.observe(
        "rev",
        &FirstSight {
            created: Some(at(OBSERVED)),
            recorded_completion: None,
        },
        at(OBSERVED),
        || [key("reports-0"), key("reports-1")].into(),
    );
    for (pod, tasks, streams) in acked {
        acknowledged(&setup.sessions, pod, None, &[("rev", *tasks, *streams)]);
    }
    setup
}

fn condition(type_: &str, done: bool, message: &str, since: &str) -> Value {
    json!({
        "type": type_,
        "status": if done { "True" } else { "False" },
        "reason": if done { "Applied" } else { "Propagating" },
        "message": message,
        "observedGeneration": 1,
        "lastTransitionTime": since
    })
}

/// A kstatus condition (`Reconciling`, `Stalled`) with the reason of `Ready`.
fn flag(type_: &str, on: bool, reason: &str, message: &str, since: &str) -> Value {
    json!({
        "type": type_,
        "status": if on { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "observedGeneration": 1,
        "lastTransitionTime": since
    })
}

fn partial_status(since: &str) -> Value {
    let message = "1 of 2 targeted sidecars applied it";
    json!({
        "observedGeneration": 1,
        "conditions": [
            condition("Ready", false, message, since),
            condition("Propagated", false, message, since),
            flag("Reconciling", true, "Propagating", message, since),
            flag("Stalled", false, "Propagating", "", since),
        ],
        "targetSidecars": 2,
        "acknowledgedSidecars": 1,
        "tasksCancelled": 2,
        "streamsClosed": 1
    })
}

fn complete_status() -> Value {
    let message = "2 of 2 targeted sidecars applied it";
    json!({
        "observedGeneration": 1,
        "conditions": [
            condition("Ready", true, message, NOW),
            condition("Propagated", true, message, NOW),
            flag("Reconciling", false, "Applied", "", NOW),
            flag("Stalled", false, "Applied", "", NOW),
        ],
        "targetSidecars": 2,
        "acknowledgedSidecars": 2,
        "tasksCancelled": 5,
        "streamsClosed": 1,
        "completedAt": NOW,
        "propagationMillis": 420
    })
}

fn with_status(object: &PrincipalRevocation, status: &Value) -> PrincipalRevocation {
    let mut object = object.clone();
    object.status = Some(serde_json::from_value(status.clone()).unwrap_or_else(|e| panic!("{e}")));
    object
}

/// The apply of `status` and the Event announcing Ready.
fn writes(object: &PrincipalRevocation, status: Value, type_: &str, reason: &str) -> Vec<Exchange> {
    let note = status["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let answer = serde_json::to_value(with_status(object, &status)).unwrap_or_default();
    vec![
        Exchange::apply(
            format!("{URL}/status{SSA_QUERY}"),
            json!({
                "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
                "status": status
            }),
        )
        .ok(answer),
        Exchange::post(
            events_url("default"),
            event(regarding(), type_, reason, &note),
        )
        .created(),
    ]
}

/// Runs one reconcile; `inspect` sees the context afterwards (before the client is dropped).
async fn reconcile(
    object: PrincipalRevocation,
    setup: Setup,
    script: Vec<Exchange>,
    inspect: impl FnOnce(&Context),
) -> Result<Action, String> {
    let (client, server) = mock_client();
    let served = server.serve(script);
    let ctx = setup.context(client);
    let result = reconcile_revocation_at(Arc::new(object), ctx.clone(), at(NOW)).await;
    inspect(&ctx);
    drop(ctx);
    served.verify().await;
    result.map_err(|e| e.to_string())
}

#[tokio::test]
async fn partial_propagation_is_written_with_a_warning() {
    let object = revocation("rev", None);
    let script = writes(&object, partial_status(NOW), "Warning", "Propagating");
    let action = reconcile(object, setup(true, &[("reports-0", 2, 1)]), script, |_| {}).await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn completion_records_when_and_how_long_and_is_requeued_for_expiry() {
    let object = revocation("rev", Some("2026-12-05T01:00:00Z"));
    let script = writes(&object, complete_status(), "Normal", "Applied");
    let acked = [("reports-0", 2, 1), ("reports-1", 3, 0)];
    let action = reconcile(object, setup(true, &acked), script, |ctx| {
        assert!(
            ctx.metrics
                .encode()
                .contains("lifeguard_operator_revocation_propagation_seconds_count 1"),
            "the propagation time is observed once"
        );
    })
    .await;
    assert_eq!(
        action,
        Ok(Action::requeue(
            Duration::from_secs(3600) + Duration::from_millis(5)
        ))
    );
}

#[tokio::test]
async fn a_status_that_is_already_right_is_not_written() {
    let object = with_status(
        &revocation("rev", None),
        &partial_status("2026-12-04T00:00:00Z"),
    );
    let action = reconcile(object, setup(true, &[("reports-0", 2, 1)]), vec![], |_| {}).await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_follower_writes_nothing() {
    let object = revocation("rev", None);
    let action = reconcile(object, setup(false, &[("reports-0", 2, 1)]), vec![], |_| {}).await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn an_unobserved_revocation_is_retried_without_a_write() {
    let object = revocation("rev", None);
    let mut setup = setup(true, &[]);
    setup.tracker.forget("rev");
    let action = reconcile(object, setup, vec![], |_| {}).await;
    assert_eq!(action, Ok(Action::requeue(Duration::from_secs(1))));
}

fn forgotten(ctx: &Context) {
    let pods: HashSet<_> = [key("reports-0")].into();
    let progress = ctx
        .tracker
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .progress("rev", &pods, &pods, 0, 0, at(NOW));
    assert_eq!(progress, None, "the tracker forgot the revocation");
    assert!(
        ctx.sessions.reported("rev").is_empty(),
        "the sessions forgot it"
    );
}

#[tokio::test]
async fn the_leader_deletes_an_expired_revocation() {
    let object = revocation("rev", Some("2026-12-04T00:00:00Z"));
    let answer = serde_json::to_value(&object).unwrap_or_default();
    let action = reconcile(
        object,
        setup(true, &[("reports-0", 2, 1)]),
        vec![Exchange::delete(format!("{URL}?")).ok(answer)],
        forgotten,
    )
    .await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn an_expired_revocation_already_gone_is_fine() {
    let object = revocation("rev", Some("2026-12-04T00:00:00Z"));
    let action = reconcile(
        object,
        setup(true, &[]),
        vec![Exchange::delete(format!("{URL}?")).not_found()],
        forgotten,
    )
    .await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_follower_does_not_delete_an_expired_revocation() {
    let object = revocation("rev", Some("2026-12-04T00:00:00Z"));
    let action = reconcile(
        object,
        setup(false, &[("reports-0", 2, 1)]),
        vec![],
        forgotten,
    )
    .await;
    assert_eq!(action, Ok(Action::await_change()));
}
