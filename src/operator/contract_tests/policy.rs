//! `reconcile_policy`: one server-side apply of `.status`, an Event when Ready changes, and
//! nothing at all when the status is already right or this replica does not lead.

use std::sync::Arc;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::api::McpServerPolicy;
use crate::operator::config::{BYPASS_PREVENTION_ANNOTATION, BypassPrevention, NetworkPolicyMode};
use crate::operator::controllers::reconcile_policy_at;
use crate::operator::network_policy;

use super::api_server::{Exchange, SSA_QUERY, mock_client};
use super::fixtures::{
    Cluster, NS, Setup, acknowledged, at, compiled_hash, event, events_url, pod, policy,
};

const NOW: &str = "2026-12-05T00:00:00Z";
const EARLIER: &str = "2026-12-04T00:00:00Z";

fn status_url(name: &str) -> String {
    format!(
        "/apis/lifeguard.dev/v1alpha1/namespaces/{NS}/mcpserverpolicies/{name}/status{SSA_QUERY}"
    )
}

/// One condition as written for generation 3.
fn condition(type_: &str, status: &str, reason: &str, message: &str, since: &str) -> Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "observedGeneration": 3, "lastTransitionTime": since
    })
}

/// The status of policy `reports` with `in_sync` of its one pod's sidecars running `hash`.
fn status(hash: &str, in_sync: i32, since: &str) -> Value {
    let sync = format!("{in_sync} of 1 sidecars run this policy");
    let (ok, ready_reason, sync_reason) = if in_sync == 1 {
        ("True", "Programmed", "AllInSync")
    } else {
        ("False", "Pending", "Pending")
    };
    json!({
        "observedGeneration": 3,
        "conditions": [
            condition("Ready", ok, ready_reason, &sync, since),
            condition(
                "Compiled", "True", "Programmed",
                "compiled with 0 exception(s) and 0 revocation(s) in force", since
            ),
            condition("SidecarsInSync", ok, sync_reason, &sync, since),
            condition("Conflict", "False", "NoConflict", "", since),
            // kstatus: Reconciling while sidecars catch up (with Ready's reason and message).
            if in_sync == 1 {
                condition("Reconciling", "False", ready_reason, "", since)
            } else {
                condition("Reconciling", "True", ready_reason, &sync, since)
            },
            condition("Stalled", "False", ready_reason, "", since),
        ],
        "matchedPods": 1,
        "sidecarsInSync": in_sync,
        "policyHash": hash
    })
}

fn apply_body(status: Value) -> Value {
    json!({"apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy", "status": status})
}

fn with_status(policy: &McpServerPolicy, status: &Value) -> McpServerPolicy {
    let mut object = policy.clone();
    object.status = Some(serde_json::from_value(status.clone()).unwrap_or_else(|e| panic!("{e}")));
    object
}

fn object_json(policy: &McpServerPolicy) -> Value {
    serde_json::to_value(policy).unwrap_or_else(|e| panic!("{e}"))
}

fn regarding() -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
        "name": "reports", "namespace": NS, "uid": "uid-reports"
    })
}

struct Fixture {
    policy: McpServerPolicy,
    hash: String,
    setup: Setup,
}

/// Policy `reports` selecting pod `reports-0`, whose sidecar acknowledged the current hash
/// when `in_sync`.
fn fixture(leading: bool, in_sync: bool) -> Fixture {
    let policy = policy("reports");
    let cluster = Cluster {
        policies: vec![policy.clone()],
        pods: vec![pod("reports-0")],
        ..Default::default()
    };
    let plan = cluster.plan(at(NOW));
    let hash = compiled_hash(&plan, "reports");
    let setup = Setup::new(plan, leading);
    if in_sync {
        acknowledged(&setup.sessions, "reports-0", Some(&hash), &[]);
    }
    Fixture {
        policy,
        hash,
        setup,
    }
}

async fn reconcile(
    policy: McpServerPolicy,
    setup: Setup,
    script: Vec<Exchange>,
) -> Result<Action, String> {
    let (client, server) = mock_client();
    let served = server.serve(script);
    let result = reconcile_policy_at(Arc::new(policy), setup.context(client), at(NOW)).await;
    served.verify().await;
    result.map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_leader_applies_the_status_once_and_announces_ready() {
    let f = fixture(true, true);
    let desired = status(&f.hash, 1, NOW);
    let answer = object_json(&with_status(&f.policy, &desired));
    let action = reconcile(
        f.policy,
        f.setup,
        vec![
            Exchange::apply(status_url("reports"), apply_body(desired)).ok(answer),
            Exchange::post(
                events_url(NS),
                event(
                    regarding(),
                    "Normal",
                    "Programmed",
                    "1 of 1 sidecars run this policy",
                ),
            )
            .created(),
        ],
    )
    .await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_pending_sidecar_makes_ready_false_with_a_warning() {
    let f = fixture(true, false);
    let desired = status(&f.hash, 0, NOW);
    let answer = object_json(&with_status(&f.policy, &desired));
    let action = reconcile(
        f.policy,
        f.setup,
        vec![
            Exchange::apply(status_url("reports"), apply_body(desired)).ok(answer),
            Exchange::post(
                events_url(NS),
                event(
                    regarding(),
                    "Warning",
                    "Pending",
                    "0 of 1 sidecars run this policy",
                ),
            )
            .created(),
        ],
    )
    .await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_status_that_is_already_right_is_not_written() {
    let f = fixture(true, true);
    // Written a day ago: the transition times stay, so nothing differs.
    let current = with_status(&f.policy, &status(&f.hash, 1, EARLIER));
    let action = reconcile(current, f.setup, vec![]).await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_changed_count_is_written_without_an_event_when_ready_stays() {
    let f = fixture(true, true);
    let mut current = status(&f.hash, 1, EARLIER);
    current["matchedPods"] = json!(2);
    let current = with_status(&f.policy, &current);
    // Only matchedPods moves; every condition keeps its time and Ready did not change.
    let desired = status(&f.hash, 1, EARLIER);
    let answer = object_json(&with_status(&f.policy, &desired));
    let action = reconcile(
        current,
        f.setup,
        vec![Exchange::apply(status_url("reports"), apply_body(desired)).ok(answer)],
    )
    .await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_follower_writes_nothing() {
    let f = fixture(false, true);
    let action = reconcile(f.policy, f.setup, vec![]).await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_policy_missing_from_the_plan_is_left_for_the_next_publish() {
    let f = fixture(true, true);
    let action = reconcile(policy("unplanned"), f.setup, vec![]).await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_refused_status_write_fails_the_reconcile_without_an_event() {
    let f = fixture(true, true);
    let desired = status(&f.hash, 1, NOW);
    let result = reconcile(
        f.policy,
        f.setup,
        vec![Exchange::apply(status_url("reports"), apply_body(desired)).server_error()],
    )
    .await;
    assert!(result.is_err(), "{result:?}");
}

#[tokio::test]
async fn the_leader_reconciles_an_opted_in_network_policy_after_the_status() {
    let mut f = fixture(true, true);
    f.setup.bypass = BypassPrevention {
        network_policy: NetworkPolicyMode::OptIn,
        ..Default::default()
    };
    let mut current = with_status(&f.policy, &status(&f.hash, 1, EARLIER));
    current.metadata.annotations = Some(
        [(
            BYPASS_PREVENTION_ANNOTATION.to_owned(),
            "enabled".to_owned(),
        )]
        .into(),
    );
    // The status is right, so the only request is the NetworkPolicy's apply (its body is
    // covered in the network_policy contract).
    let url = format!(
        "/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/lifeguard-reports{SSA_QUERY}"
    );
    let body = serde_json::to_value(network_policy::desired(&current, &f.setup.bypass))
        .unwrap_or_else(|e| panic!("{e}"));
    let action = reconcile(
        current,
        f.setup,
        vec![Exchange::apply(url, body.clone()).ok(body)],
    )
    .await;
    assert_eq!(action, Ok(Action::await_change()));
}

#[tokio::test]
async fn a_follower_leaves_the_network_policy_alone() {
    let mut f = fixture(false, true);
    f.setup.bypass = BypassPrevention {
        network_policy: NetworkPolicyMode::All,
        ..Default::default()
    };
    let action = reconcile(f.policy, f.setup, vec![]).await;
    assert_eq!(action, Ok(Action::await_change()));
}
