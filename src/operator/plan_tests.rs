use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::exception::{ApproverTrust, sign};

const APPROVER_KEY: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-ed25519.pem");
const APPROVER_JWKS: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-jwks.json");

fn at(t: &str) -> Timestamp {
    t.parse().unwrap()
}

fn policy(name: &str, created: &str, app: &str) -> Arc<McpServerPolicy> {
    let mut p: McpServerPolicy = serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "McpServerPolicy",
        "metadata": {"name": name, "namespace": "team-a", "generation": 2},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "resource": "https://mcp.example.com/mcp",
            "identity": {"issuers": [{
                "issuer": "https://idp.example.com",
                "audiences": ["https://mcp.example.com/mcp"],
                "jwksUri": "https://idp.example.com/jwks"
            }]},
            "tasks": {"enabled": true},
            "capabilities": {"sampling": "exception"}
        }
    }))
    .unwrap();
    p.metadata.creation_timestamp = Some(Time(at(created)));
    Arc::new(p)
}

fn pod(name: &str, app: &str) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team-a", "labels": {"app": app}}
        }))
        .unwrap(),
    )
}

fn revocation(name: &str, issuer: &str, expires: Option<&str>) -> Arc<PrincipalRevocation> {
    let mut spec = json!({
        "issuer": issuer, "subject": "alice", "revokedBefore": "2026-12-01T00:00:00Z",
        "reason": "sessionRevoked", "source": {"kind": "manual"}
    });
    if let Some(e) = expires {
        spec["expiresAt"] = json!(e);
    }
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap(),
    )
}

fn exception(policy: &str, not_before: &str, expires: &str) -> Arc<CapabilityException> {
    let mut e: CapabilityException = serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
        "metadata": {"name": "ex", "namespace": "team-a", "generation": 1},
        "spec": {
            "policyRef": {"name": policy}, "capability": "sampling", "clients": ["console"],
            "purpose": "summaries", "modelRoute": "gateway/summaries",
            "limits": {"maxTokens": 500, "maxIterationsPerTask": 2, "maxRequestsPerMinute": 10},
            "notBefore": not_before, "expiresAt": expires, "approvalId": "CHG-1",
            "signature": "placeholder"
        }
    }))
    .unwrap();
    e.spec.signature = sign(&e.spec, "team-a", APPROVER_KEY, "test-ed-1").unwrap();
    Arc::new(e)
}

fn loaded_keys() -> ApproverKeys {
    ApproverKeys::Loaded {
        trust: Arc::new(ApproverTrust::from_json(APPROVER_JWKS).unwrap()),
        document: Arc::from(
            serde_json::value::to_raw_value(
                &serde_json::from_slice::<serde_json::Value>(APPROVER_JWKS).unwrap(),
            )
            .unwrap(),
        ),
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: "team-a".into(),
        name: name.into(),
    }
}

struct Inputs {
    policies: Vec<Arc<McpServerPolicy>>,
    exceptions: Vec<Arc<CapabilityException>>,
    revocations: Vec<Arc<PrincipalRevocation>>,
    pods: Vec<Arc<Pod>>,
    keys: ApproverKeys,
}

impl Inputs {
    fn plan(&self, now: &str) -> Plan {
        self.plan_traced(now, &BTreeMap::new())
    }

    fn plan_traced(&self, now: &str, revocation_traces: &BTreeMap<String, String>) -> Plan {
        plan(World {
            policies: &self.policies,
            exceptions: &self.exceptions,
            revocations: &self.revocations,
            pods: &self.pods,
            approver_keys: &self.keys,
            now: at(now),
            revocation_traces,
        })
    }
}

#[test]
fn the_older_of_two_overlapping_policies_wins_the_pod_and_the_newer_is_told() {
    let inputs = Inputs {
        policies: vec![
            policy("newer", "2026-11-02T00:00:00Z", "reports"),
            policy("older", "2026-11-01T00:00:00Z", "reports"),
        ],
        exceptions: vec![],
        revocations: vec![],
        pods: vec![pod("reports-0", "reports"), pod("other-0", "other")],
        keys: ApproverKeys::Missing,
    };
    let plan = inputs.plan("2026-12-05T00:00:00Z");
    assert_eq!(plan.pods.get(&key("reports-0")), Some(&key("older")));
    assert_eq!(plan.pods.get(&key("other-0")), None);
    assert_eq!(plan.policies[&key("newer")].shadowed_by, Some(key("older")));
    assert_eq!(plan.policies[&key("older")].shadowed_by, None);
    assert_eq!(plan.policies[&key("older")].matched_pods, 1);
    assert_eq!(plan.policies[&key("newer")].matched_pods, 1);
    let (_, compiled) = plan.policy_for(&key("reports-0")).unwrap();
    assert_eq!(compiled.unwrap().effective.policy, key("older"));
}

#[test]
fn only_revocations_in_force_for_the_policys_issuers_reach_its_snapshot() {
    let inputs = Inputs {
        policies: vec![policy("reports", "2026-11-01T00:00:00Z", "reports")],
        exceptions: vec![],
        revocations: vec![
            revocation("trusted", "https://idp.example.com", None),
            revocation("foreign", "https://other-idp.example.com", None),
            revocation(
                "expired",
                "https://idp.example.com",
                Some("2026-12-02T00:00:00Z"),
            ),
        ],
        pods: vec![],
        keys: ApproverKeys::Missing,
    };
    let plan = inputs.plan("2026-12-05T00:00:00Z");
    let compiled = plan.policies[&key("reports")].compiled.clone().unwrap();
    assert_eq!(
        compiled.revocations.iter().collect::<Vec<_>>(),
        vec!["trusted"]
    );
}

#[test]
fn a_snapshot_carries_the_traces_of_its_own_revocations_outside_the_hashed_policy() {
    let inputs = Inputs {
        policies: vec![policy("reports", "2026-11-01T00:00:00Z", "reports")],
        exceptions: vec![],
        revocations: vec![
            revocation("traced", "https://idp.example.com", None),
            revocation("untraced", "https://idp.example.com", None),
            revocation("foreign", "https://other-idp.example.com", None),
        ],
        pods: vec![],
        keys: ApproverKeys::Missing,
    };
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traces = BTreeMap::from([
        ("traced".to_owned(), traceparent.to_owned()),
        ("foreign".to_owned(), traceparent.to_owned()),
    ]);
    let traced = inputs.plan_traced("2026-12-05T00:00:00Z", &traces);
    let compiled = traced.policies[&key("reports")].compiled.clone().unwrap();
    // Only revocations the snapshot carries; the foreign one is the plan's, not this policy's.
    assert_eq!(
        compiled.revocation_traces,
        BTreeMap::from([("traced".to_owned(), traceparent.to_owned())])
    );
    assert_eq!(
        compiled.revocation_traces_json.as_ref().unwrap().get(),
        format!(r#"{{"traced":"{traceparent}"}}"#)
    );
    assert_eq!(traced.revocation_traces, traces);
    // Traces never change what is enforced, so the hash sidecars acknowledge stays the same.
    let plain = inputs.plan("2026-12-05T00:00:00Z");
    let untraced = plain.policies[&key("reports")].compiled.clone().unwrap();
    assert_eq!(compiled.hash, untraced.hash);
    assert!(untraced.revocation_traces_json.is_none());
}

#[test]
fn an_exception_is_active_only_inside_its_window_and_the_plan_names_the_next_flip() {
    let inputs = Inputs {
        policies: vec![policy("reports", "2026-11-01T00:00:00Z", "reports")],
        exceptions: vec![exception(
            "reports",
            "2026-12-01T00:00:00Z",
            "2026-12-15T00:00:00Z",
        )],
        revocations: vec![],
        pods: vec![],
        keys: loaded_keys(),
    };
    let before = inputs.plan("2026-11-30T00:00:00Z");
    assert_eq!(
        before.exceptions[&key("ex")].state,
        ExceptionState::NotYetValid
    );
    assert_eq!(before.next_change, Some(at("2026-12-01T00:00:00Z")));
    let compiled = before.policies[&key("reports")].compiled.clone().unwrap();
    assert!(compiled.effective.exceptions.is_empty());

    let during = inputs.plan("2026-12-05T00:00:00Z");
    let e = &during.exceptions[&key("ex")];
    assert_eq!((e.state, e.reason), (ExceptionState::Active, "Active"));
    assert_eq!(e.approver.as_deref(), Some("test-ed-1"));
    assert_eq!(during.next_change, Some(at("2026-12-15T00:00:00Z")));
    let compiled = during.policies[&key("reports")].compiled.clone().unwrap();
    assert_eq!(compiled.effective.exceptions.len(), 1);

    let after = inputs.plan("2026-12-15T00:00:00Z");
    assert_eq!(after.exceptions[&key("ex")].state, ExceptionState::Expired);
    assert_eq!(after.next_change, None);
    assert_ne!(
        after.policies[&key("reports")]
            .compiled
            .as_ref()
            .unwrap()
            .hash,
        compiled.hash
    );
}

#[test]
fn an_exception_without_its_policy_or_without_approver_keys_is_invalid_with_the_reason() {
    let mut inputs = Inputs {
        policies: vec![],
        exceptions: vec![exception(
            "reports",
            "2026-12-01T00:00:00Z",
            "2026-12-15T00:00:00Z",
        )],
        revocations: vec![],
        pods: vec![],
        keys: loaded_keys(),
    };
    let e = inputs.plan("2026-12-05T00:00:00Z").exceptions[&key("ex")].clone();
    assert_eq!(
        (e.state, e.reason),
        (ExceptionState::Invalid, "PolicyNotFound")
    );

    inputs.policies = vec![policy("reports", "2026-11-01T00:00:00Z", "reports")];
    inputs.keys = ApproverKeys::Missing;
    let e = inputs.plan("2026-12-05T00:00:00Z").exceptions[&key("ex")].clone();
    assert_eq!(
        (e.state, e.reason),
        (ExceptionState::Invalid, "NoTrustedKeys")
    );
}

#[test]
fn a_tampered_exception_is_invalid_and_never_reaches_the_snapshot() {
    let mut tampered = exception("reports", "2026-12-01T00:00:00Z", "2026-12-15T00:00:00Z")
        .as_ref()
        .clone();
    tampered.spec.limits.max_tokens = 100_000;
    let inputs = Inputs {
        policies: vec![policy("reports", "2026-11-01T00:00:00Z", "reports")],
        exceptions: vec![Arc::new(tampered)],
        revocations: vec![],
        pods: vec![],
        keys: loaded_keys(),
    };
    let plan = inputs.plan("2026-12-05T00:00:00Z");
    let e = &plan.exceptions[&key("ex")];
    assert_eq!(
        (e.state, e.reason),
        (ExceptionState::Invalid, "BadSignature")
    );
    assert_eq!(plan.next_change, None);
    let compiled = plan.policies[&key("reports")].compiled.clone().unwrap();
    assert!(compiled.effective.exceptions.is_empty());
}

#[test]
fn a_policy_that_does_not_compile_has_errors_and_no_snapshot() {
    let mut broken = policy("reports", "2026-11-01T00:00:00Z", "reports")
        .as_ref()
        .clone();
    broken.spec.resource = "not a url".into();
    let inputs = Inputs {
        policies: vec![Arc::new(broken)],
        exceptions: vec![],
        revocations: vec![],
        pods: vec![pod("reports-0", "reports")],
        keys: ApproverKeys::Missing,
    };
    let plan = inputs.plan("2026-12-05T00:00:00Z");
    let p = &plan.policies[&key("reports")];
    assert!(p.compiled.is_none());
    assert!(!p.errors.is_empty());
    let (winner, compiled) = plan.policy_for(&key("reports-0")).unwrap();
    assert_eq!(winner, &key("reports"));
    assert!(compiled.is_none());
}
