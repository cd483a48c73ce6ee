//! `network_policy::reconcile`: a server-side apply of `lifeguard-NAME` owned by the
//! McpServerPolicy when bypass prevention covers the policy, and otherwise a DELETE only of a
//! NetworkPolicy Lifeguard manages (never of someone else's object of the same name).

use serde_json::{Value, json};

use crate::api::McpServerPolicy;
use crate::operator::config::{BYPASS_PREVENTION_ANNOTATION, BypassPrevention, NetworkPolicyMode};
use crate::operator::network_policy::reconcile;

use super::api_server::{Exchange, SSA_QUERY, mock_client};
use super::fixtures::{NS, policy};

fn url() -> String {
    format!("/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/lifeguard-reports")
}

fn opted(annotation: Option<&str>) -> McpServerPolicy {
    let mut p = policy("reports");
    if let Some(value) = annotation {
        p.metadata.annotations =
            Some([(BYPASS_PREVENTION_ANNOTATION.to_owned(), value.to_owned())].into());
    }
    p
}

fn config(mode: NetworkPolicyMode) -> BypassPrevention {
    BypassPrevention {
        network_policy: mode,
        ..Default::default()
    }
}

/// The NetworkPolicy as applied for policy `reports` with the default sidecar port `mcp`.
fn applied() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {
            "name": "lifeguard-reports",
            "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "lifeguard"},
            // kube's controller reference: no blockOwnerDeletion (which would need the
            // right to set finalizers on the McpServerPolicy).
            "ownerReferences": [{
                "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
                "name": "reports", "uid": "uid-reports", "controller": true
            }]
        },
        "spec": {
            "podSelector": {"matchLabels": {"app": "reports"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": "mcp", "protocol": "TCP"}]}]
        }
    })
}

/// An existing NetworkPolicy named `lifeguard-reports` with `labels`.
fn existing(labels: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "lifeguard-reports", "namespace": NS, "labels": labels},
        "spec": {"podSelector": {}}
    })
}

async fn run(
    policy: McpServerPolicy,
    mode: NetworkPolicyMode,
    script: Vec<Exchange>,
) -> Result<(), String> {
    let (client, server) = mock_client();
    let served = server.serve(script);
    let result = reconcile(&client, &policy, &config(mode)).await;
    drop(client);
    served.verify().await;
    result.map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_opted_in_policy_gets_its_network_policy_applied_and_owned() {
    let script = vec![Exchange::apply(format!("{}{SSA_QUERY}", url()), applied()).ok(applied())];
    let result = run(opted(Some("enabled")), NetworkPolicyMode::OptIn, script).await;
    assert_eq!(result, Ok(()));
}

#[tokio::test]
async fn mode_all_covers_policies_without_the_annotation() {
    let script = vec![Exchange::apply(format!("{}{SSA_QUERY}", url()), applied()).ok(applied())];
    let result = run(opted(None), NetworkPolicyMode::All, script).await;
    assert_eq!(result, Ok(()));
}

#[tokio::test]
async fn without_the_annotation_a_managed_network_policy_is_deleted() {
    let managed = existing(json!({"app.kubernetes.io/managed-by": "lifeguard"}));
    let script = vec![
        Exchange::get(url()).ok(managed.clone()),
        Exchange::delete(format!("{}?", url())).ok(managed),
    ];
    // Any value but `enabled` opts out.
    let result = run(opted(Some("disabled")), NetworkPolicyMode::OptIn, script).await;
    assert_eq!(result, Ok(()));
}

#[tokio::test]
async fn without_the_annotation_someone_elses_network_policy_is_left_alone() {
    let foreign = existing(json!({"app.kubernetes.io/managed-by": "helm"}));
    let script = vec![Exchange::get(url()).ok(foreign)];
    let result = run(opted(None), NetworkPolicyMode::OptIn, script).await;
    assert_eq!(result, Ok(()));
}

#[tokio::test]
async fn without_the_annotation_and_without_an_object_nothing_is_written() {
    let script = vec![Exchange::get(url()).not_found()];
    let result = run(opted(None), NetworkPolicyMode::OptIn, script).await;
    assert_eq!(result, Ok(()));
}

#[tokio::test]
async fn disabled_touches_nothing() {
    let result = run(opted(Some("enabled")), NetworkPolicyMode::Disabled, vec![]).await;
    assert_eq!(result, Ok(()));
}

#[tokio::test]
async fn a_refused_apply_is_an_error() {
    let script =
        vec![Exchange::apply(format!("{}{SSA_QUERY}", url()), applied()).fail(403, "Forbidden")];
    let result = run(opted(Some("enabled")), NetworkPolicyMode::OptIn, script).await;
    assert!(result.is_err(), "{result:?}");
}
