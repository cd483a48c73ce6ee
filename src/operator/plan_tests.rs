use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::*;
use crate::exception::{ApproverTrust, sign};

const APPROVER_KEY: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-ed25519.pem");
const APPROVER_JWKS: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-jwks.json");

fn at(t: &str) -> Timestamp {
    t.parse().unwrap()
}

fn policy(name: &str, created: &str, app: &str) -> Arc<McpServerPolicy> {
    policy_trusting(name, created, app, "https://idp.example.com")
}

fn policy_trusting(name: &str, created: &str, app: &str, issuer: &str) -> Arc<McpServerPolicy> {
    let mut p: McpServerPolicy = serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "McpServerPolicy",
        "metadata": {"name": name, "namespace": "team-a", "generation": 2},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "resource": "https://mcp.example.com/mcp",
            "identity": {"issuers": [{
                "issuer": issuer,
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
        plan(self.world(now, revocation_traces))
    }

    fn world<'a>(
        &'a self,
        now: &str,
        revocation_traces: &'a BTreeMap<String, String>,
    ) -> World<'a> {
        World {
            policies: &self.policies,
            exceptions: &self.exceptions,
            revocations: &self.revocations,
            pods: &self.pods,
            approver_keys: &self.keys,
            now: at(now),
            revocation_traces,
        }
    }

    /// The plan from `previous`, checked equal to the plan from nothing.
    fn replan(
        &self,
        previous: &Plan,
        now: &str,
        revocation_traces: &BTreeMap<String, String>,
    ) -> Plan {
        let incremental = plan_from(Some(previous), self.world(now, revocation_traces));
        assert_same_plan(&incremental, &plan(self.world(now, revocation_traces)));
        incremental
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

/// A policy with `selector` (any label selector) in `namespace`.
fn policy_selecting(
    name: &str,
    namespace: &str,
    created: &str,
    selector: Value,
) -> Arc<McpServerPolicy> {
    let mut p = policy(name, created, "unused").as_ref().clone();
    p.metadata.namespace = Some(namespace.into());
    p.spec.selector = serde_json::from_value(selector).unwrap();
    Arc::new(p)
}

fn pod_labelled(name: &str, namespace: &str, labels: Value) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "labels": labels}
        }))
        .unwrap(),
    )
}

/// The label index narrows a `matchLabels` policy's candidates; the whole selector still
/// decides, policies without `matchLabels` see every pod of their namespace, and the oldest
/// selecting policy wins whatever kind of selector it has.
#[test]
fn selection_by_label_index_agrees_with_every_kind_of_selector() {
    let ns = |name: &str, namespace: &str| ObjectKey {
        namespace: namespace.into(),
        name: name.into(),
    };
    let inputs = Inputs {
        policies: vec![
            // Oldest: an expression only (no matchLabels), app in (a, b).
            policy_selecting(
                "expr",
                "team-a",
                "2026-11-01T00:00:00Z",
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}),
            ),
            // Two labels: the first narrows, the second must hold too.
            policy_selecting(
                "a-front",
                "team-a",
                "2026-11-02T00:00:00Z",
                json!({"matchLabels": {"app": "a", "tier": "front"}}),
            ),
            // A label and an expression that excludes some of its pods.
            policy_selecting(
                "c-not-canary",
                "team-a",
                "2026-11-03T00:00:00Z",
                json!({"matchLabels": {"app": "c"},
                       "matchExpressions": [{"key": "track", "operator": "NotIn", "values": ["canary"]}]}),
            ),
            // The same label in another namespace.
            policy_selecting(
                "c-elsewhere",
                "team-b",
                "2026-11-04T00:00:00Z",
                json!({"matchLabels": {"app": "c"}}),
            ),
        ],
        exceptions: vec![],
        revocations: vec![],
        pods: vec![
            pod_labelled("a-front-0", "team-a", json!({"app": "a", "tier": "front"})),
            pod_labelled("a-back-0", "team-a", json!({"app": "a", "tier": "back"})),
            pod_labelled("c-0", "team-a", json!({"app": "c"})),
            pod_labelled("c-canary", "team-a", json!({"app": "c", "track": "canary"})),
            pod_labelled("c-b", "team-b", json!({"app": "c"})),
            pod_labelled("bare", "team-a", json!({})),
        ],
        keys: ApproverKeys::Missing,
    };
    let plan = inputs.plan("2026-12-05T00:00:00Z");
    let winner = |pod: &str, namespace: &str| plan.pods.get(&ns(pod, namespace)).cloned();
    assert_eq!(winner("a-front-0", "team-a"), Some(ns("expr", "team-a")));
    assert_eq!(winner("a-back-0", "team-a"), Some(ns("expr", "team-a")));
    assert_eq!(winner("c-0", "team-a"), Some(ns("c-not-canary", "team-a")));
    assert_eq!(winner("c-canary", "team-a"), None);
    assert_eq!(winner("c-b", "team-b"), Some(ns("c-elsewhere", "team-b")));
    assert_eq!(winner("bare", "team-a"), None);
    let status = |name: &str, namespace: &str| &plan.policies[&ns(name, namespace)];
    assert_eq!(status("expr", "team-a").matched_pods, 2);
    assert_eq!(status("a-front", "team-a").matched_pods, 1);
    assert_eq!(
        status("a-front", "team-a").shadowed_by,
        Some(ns("expr", "team-a"))
    );
    assert_eq!(status("c-not-canary", "team-a").matched_pods, 1);
    assert_eq!(status("c-not-canary", "team-a").shadowed_by, None);
    assert_eq!(status("c-elsewhere", "team-b").matched_pods, 1);
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

/// Everything two plans say, compared (the count of compilations aside: that is the point of
/// reusing them).
fn assert_same_plan(incremental: &Plan, full: &Plan) {
    assert_eq!(incremental.pods, full.pods);
    assert_eq!(incremental.exceptions, full.exceptions);
    assert_eq!(incremental.next_change, full.next_change);
    assert_eq!(incremental.revocation_traces, full.revocation_traces);
    assert_eq!(
        incremental.policies.keys().collect::<Vec<_>>(),
        full.policies.keys().collect::<Vec<_>>()
    );
    for (key, a) in &incremental.policies {
        let b = &full.policies[key];
        assert_eq!(
            (a.generation, &a.errors, a.matched_pods, &a.shadowed_by),
            (b.generation, &b.errors, b.matched_pods, &b.shadowed_by),
            "{key}"
        );
        match (&a.compiled, &b.compiled) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                assert_eq!(a.effective, b.effective, "{key}");
                // The hash is of the very bytes sent.
                assert_eq!(a.hash, a.effective.hash(), "{key}");
                assert_eq!(a.hash, b.hash, "{key}");
                assert_eq!(a.json.get(), b.json.get(), "{key}");
                assert_eq!(a.revocations, b.revocations, "{key}");
                assert_eq!(a.revocation_traces, b.revocation_traces, "{key}");
                assert_eq!(
                    a.revocation_traces_json.as_ref().map(|j| j.get()),
                    b.revocation_traces_json.as_ref().map(|j| j.get()),
                    "{key}"
                );
            }
            (a, b) => panic!("{key}: compiled {} vs {}", a.is_some(), b.is_some()),
        }
    }
}

fn compiled(plan: &Plan, name: &str) -> Arc<CompiledPolicy> {
    plan.policies[&key(name)].compiled.clone().unwrap()
}

/// Whether `name` kept the very compilation it had in `before`.
fn kept(before: &Plan, after: &Plan, name: &str) -> bool {
    Arc::ptr_eq(&compiled(before, name), &compiled(after, name))
}

/// A copy of `object` with `edit` applied to its JSON: a new `Arc`, as the watch cache makes
/// for every event.
fn edited<T: serde::Serialize + serde::de::DeserializeOwned>(
    object: &Arc<T>,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Arc<T> {
    let mut value = serde_json::to_value(object.as_ref()).unwrap();
    edit(&mut value);
    Arc::new(serde_json::from_value(value).unwrap())
}

fn broken_policy() -> Arc<McpServerPolicy> {
    edited(&policy("broken", "2026-11-03T00:00:00Z", "broken"), |v| {
        v["spec"]["resource"] = json!("not a url")
    })
}

#[test]
fn an_incremental_plan_equals_the_full_plan_and_recompiles_only_what_a_change_touched() {
    const NOW: &str = "2026-12-05T00:00:00Z";
    let no_traces = BTreeMap::new();
    let mut inputs = Inputs {
        policies: vec![
            policy("reports", "2026-11-01T00:00:00Z", "reports"),
            policy_trusting(
                "billing",
                "2026-11-02T00:00:00Z",
                "billing",
                "https://other-idp.example.com",
            ),
            broken_policy(),
        ],
        exceptions: vec![],
        revocations: vec![revocation("old", "https://idp.example.com", None)],
        pods: vec![pod("reports-0", "reports"), pod("billing-0", "billing")],
        keys: loaded_keys(),
    };
    let first = plan_from(None, inputs.world(NOW, &no_traces));
    assert_same_plan(&first, &inputs.plan(NOW));
    assert_eq!((first.compiled_afresh, first.revocations_only), (3, 0));

    // Nothing the compiler reads changed, though every object is a new `Arc` (a status write
    // replaces it in the cache) and the caches list them in another order: all reused.
    inputs.policies = inputs
        .policies
        .iter()
        .rev()
        .map(|p| edited(p, |_| {}))
        .collect();
    inputs.revocations = inputs
        .revocations
        .iter()
        .map(|r| edited(r, |_| {}))
        .collect();
    inputs.pods.reverse();
    let same = inputs.replan(&first, NOW, &no_traces);
    assert_eq!(same.compiled_afresh, 0);
    assert!(kept(&first, &same, "reports") && kept(&first, &same, "billing"));
    assert_eq!(
        same.policies[&key("broken")].errors,
        first.policies[&key("broken")].errors
    );

    // A policy's spec changes: that policy alone is compiled again.
    inputs.policies[2] = edited(&inputs.policies[2], |v| {
        v["metadata"]["generation"] = json!(3);
        v["spec"]["protocol"] = json!({"allowMissingNameHeader": true});
    });
    assert_eq!(inputs.policies[2].metadata.name.as_deref(), Some("reports"));
    let spec = inputs.replan(&same, NOW, &no_traces);
    assert_eq!((spec.compiled_afresh, spec.revocations_only), (1, 0));
    assert!(!kept(&same, &spec, "reports") && kept(&same, &spec, "billing"));
    assert_ne!(
        compiled(&spec, "reports").hash,
        compiled(&same, "reports").hash
    );
    assert_eq!(compiled(&spec, "reports").effective.generation, Some(3));

    // A pod is relabelled: it changes hands, nothing is compiled.
    inputs.pods = vec![pod("reports-0", "billing"), pod("billing-0", "billing")];
    let relabelled = inputs.replan(&spec, NOW, &no_traces);
    assert_eq!(relabelled.compiled_afresh, 0);
    assert_eq!(
        relabelled.pods.get(&key("reports-0")),
        Some(&key("billing"))
    );
    assert_eq!(relabelled.policies[&key("billing")].matched_pods, 2);
    assert!(kept(&spec, &relabelled, "reports") && kept(&spec, &relabelled, "billing"));

    // A revocation for reports' issuer arrives: reports only.
    inputs
        .revocations
        .push(revocation("new", "https://idp.example.com", None));
    let revoked = inputs.replan(&relabelled, NOW, &no_traces);
    // Only its revocations changed: its compilation is taken with the new rules.
    assert_eq!((revoked.compiled_afresh, revoked.revocations_only), (1, 1));
    assert!(!kept(&relabelled, &revoked, "reports") && kept(&relabelled, &revoked, "billing"));
    assert!(compiled(&revoked, "reports").revocations.contains("new"));

    // Its trace starts: the snapshot that carries it carries the trace.
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traces = BTreeMap::from([("new".to_owned(), traceparent.to_owned())]);
    let traced = inputs.replan(&revoked, NOW, &traces);
    assert_eq!((traced.compiled_afresh, traced.revocations_only), (1, 1));
    assert!(!kept(&revoked, &traced, "reports") && kept(&revoked, &traced, "billing"));
    assert_eq!(compiled(&traced, "reports").revocation_traces, traces);

    // A revocation for billing's issuer arrives: billing only.
    inputs.revocations.push(revocation(
        "elsewhere",
        "https://other-idp.example.com",
        None,
    ));
    let other = inputs.replan(&traced, NOW, &traces);
    assert_eq!((other.compiled_afresh, other.revocations_only), (1, 1));
    assert!(kept(&traced, &other, "reports") && !kept(&traced, &other, "billing"));

    // The first revocation is deleted: reports only.
    inputs
        .revocations
        .retain(|r| r.metadata.name.as_deref() != Some("new"));
    let lifted = inputs.replan(&other, NOW, &no_traces);
    assert_eq!((lifted.compiled_afresh, lifted.revocations_only), (1, 1));
    assert!(!kept(&other, &lifted, "reports") && kept(&other, &lifted, "billing"));
    assert!(!compiled(&lifted, "reports").revocations.contains("new"));

    // An exception for reports is added, in its window: reports only.
    inputs.exceptions = vec![exception(
        "reports",
        "2026-12-01T00:00:00Z",
        "2026-12-15T00:00:00Z",
    )];
    let granted = inputs.replan(&lifted, NOW, &no_traces);
    assert_eq!((granted.compiled_afresh, granted.revocations_only), (1, 0));
    assert!(!kept(&lifted, &granted, "reports") && kept(&lifted, &granted, "billing"));
    assert_eq!(compiled(&granted, "reports").effective.exceptions.len(), 1);

    // Time passes inside the window: nothing is compiled.
    let later = inputs.replan(&granted, "2026-12-10T00:00:00Z", &no_traces);
    assert_eq!(later.compiled_afresh, 0);
    assert!(kept(&granted, &later, "reports"));

    // The exception expires: reports only, without it.
    let expired = inputs.replan(&later, "2026-12-15T00:00:00Z", &no_traces);
    assert_eq!((expired.compiled_afresh, expired.revocations_only), (1, 0));
    assert!(!kept(&later, &expired, "reports") && kept(&later, &expired, "billing"));
    assert!(
        compiled(&expired, "reports")
            .effective
            .exceptions
            .is_empty()
    );
    assert_eq!(
        compiled(&expired, "reports").hash,
        compiled(&lifted, "reports").hash
    );

    // A policy is deleted: it leaves the plan, the others are kept.
    inputs
        .policies
        .retain(|p| p.metadata.name.as_deref() != Some("billing"));
    let deleted = inputs.replan(&expired, "2026-12-15T00:00:00Z", &no_traces);
    assert_eq!(deleted.compiled_afresh, 0);
    assert!(!deleted.policies.contains_key(&key("billing")));
    assert!(kept(&expired, &deleted, "reports"));
}

#[test]
fn approver_keys_recompile_a_policy_only_when_they_change_its_exceptions_in_force() {
    const NOW: &str = "2026-12-05T00:00:00Z";
    let no_traces = BTreeMap::new();
    let mut inputs = Inputs {
        policies: vec![
            policy("reports", "2026-11-01T00:00:00Z", "reports"),
            policy("other", "2026-11-02T00:00:00Z", "other"),
        ],
        exceptions: vec![exception(
            "reports",
            "2026-12-01T00:00:00Z",
            "2026-12-15T00:00:00Z",
        )],
        revocations: vec![],
        pods: vec![],
        keys: loaded_keys(),
    };
    let first = inputs.plan(NOW);
    assert_eq!(compiled(&first, "reports").effective.exceptions.len(), 1);

    // The same keys read again (a new Secret object): nothing is compiled.
    inputs.keys = loaded_keys();
    let reread = inputs.replan(&first, NOW, &no_traces);
    assert_eq!(reread.compiled_afresh, 0);

    // The keys are gone: the exception is no longer in force, reports is compiled without it.
    inputs.keys = ApproverKeys::Missing;
    let missing = inputs.replan(&reread, NOW, &no_traces);
    assert_eq!(missing.compiled_afresh, 1);
    assert!(!kept(&reread, &missing, "reports") && kept(&reread, &missing, "other"));
    assert!(
        compiled(&missing, "reports")
            .effective
            .exceptions
            .is_empty()
    );

    // A previous plan of an unrelated world changes nothing about the result.
    let unrelated = Inputs {
        policies: vec![policy("reports", "2026-11-01T00:00:00Z", "elsewhere")],
        exceptions: vec![],
        revocations: vec![revocation("x", "https://idp.example.com", None)],
        pods: vec![],
        keys: ApproverKeys::Missing,
    }
    .plan(NOW);
    let from_unrelated = inputs.replan(&unrelated, NOW, &no_traces);
    assert_eq!(from_unrelated.compiled_afresh, 2);
    let from_default = inputs.replan(&Plan::default(), NOW, &no_traces);
    assert_eq!(from_default.compiled_afresh, 2);
}
