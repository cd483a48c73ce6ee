use serde_json::{Value, json};

use super::fixtures::*;
use crate::exception::ApproverKeys;
use crate::webhook::validate::{ClusterView, Verdict, reasons, validate_request};

fn view() -> View {
    View {
        policies: vec![policy(
            "reports",
            json!({"matchLabels": {"app": "reports"}}),
        )],
        keys: keys(),
    }
}

fn request(kind: &str, op: &str, ns: Option<&str>, object: &Value, old: Option<&Value>) -> Verdict {
    validate_request(
        kind,
        op,
        ns,
        object,
        old,
        &view() as &dyn ClusterView,
        at(DURING),
    )
}

fn signed_exception_json() -> Value {
    serde_json::to_value(signed(exception())).unwrap()
}

#[test]
fn delete_and_connect_are_not_validated_and_unknown_operations_are_denied() {
    for op in ["DELETE", "CONNECT"] {
        let v = request("CapabilityException", op, Some(NS), &json!(null), None);
        assert_eq!(v, Verdict::allow("ignored_operation"));
    }
    assert_denied(
        &request("McpServerPolicy", "PATCH", Some(NS), &json!({}), None),
        "unsupported_operation",
        &["`PATCH`"],
    );
}

#[test]
fn an_unknown_kind_is_denied() {
    assert_denied(
        &request("Pod", "CREATE", Some(NS), &json!({}), None),
        "unsupported_kind",
        &["kind `Pod` is not validated by this webhook"],
    );
}

#[test]
fn a_structure_error_is_denied_with_its_field_path() {
    let mut object = policy_json("reports", json!({"matchLabels": {"app": 5}}));
    assert_denied(
        &request("McpServerPolicy", "CREATE", Some(NS), &object, None),
        "bad_structure",
        &["McpServerPolicy: spec.selector.matchLabels.app: invalid type"],
    );
    object.as_object_mut().unwrap().remove("spec");
    assert_denied(
        &request("McpServerPolicy", "CREATE", Some(NS), &object, None),
        "bad_structure",
        &["McpServerPolicy: missing field `spec`"],
    );
    let mut revocation = revocation_json(DURING, "sessionRevoked");
    revocation["spec"]["reason"] = json!("because");
    assert_denied(
        &request("PrincipalRevocation", "CREATE", None, &revocation, None),
        "bad_structure",
        &["PrincipalRevocation: spec.reason: unknown variant `because`"],
    );
}

#[test]
fn routes_each_kind_with_the_cluster_view() {
    // An exception verified against the view's keys and policies.
    assert_clean(&request(
        "CapabilityException",
        "CREATE",
        Some(NS),
        &signed_exception_json(),
        None,
    ));
    let no_keys = View {
        keys: ApproverKeys::Missing,
        ..view()
    };
    let v = validate_request(
        "CapabilityException",
        "CREATE",
        Some(NS),
        &signed_exception_json(),
        None,
        &no_keys,
        at(DURING),
    );
    assert_eq!(v.reason, "no_approver_keys");
    // A policy checked against the others in its namespace, itself skipped.
    let overlapping = policy_json(
        "billing",
        json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
    );
    assert_denied(
        &request("McpServerPolicy", "CREATE", Some(NS), &overlapping, None),
        "selector_overlap",
        &["McpServerPolicy `reports`"],
    );
    assert_clean(&request(
        "McpServerPolicy",
        "CREATE",
        Some("team-b"),
        &{
            let mut p = overlapping.clone();
            p["metadata"]["namespace"] = json!("team-b");
            p
        },
        None,
    ));
    let itself = policy_json(
        "reports",
        json!({"matchLabels": {"app": "reports", "v": "2"}}),
    );
    let old = policy_json("reports", json!({"matchLabels": {"app": "reports"}}));
    assert_clean(&request(
        "McpServerPolicy",
        "UPDATE",
        Some(NS),
        &itself,
        Some(&old),
    ));
    // A revocation (cluster-scoped: no namespace needed).
    assert_denied(
        &request(
            "PrincipalRevocation",
            "CREATE",
            None,
            &revocation_json("2030-01-01T00:00:00Z", "sessionRevoked"),
            None,
        ),
        "revoked_before_in_future",
        &[],
    );
    assert_clean(&request(
        "PrincipalRevocation",
        "CREATE",
        None,
        &revocation_json(DURING, "sessionRevoked"),
        None,
    ));
}

#[test]
fn old_objects_count_only_on_update() {
    let overlapping = policy_json(
        "billing",
        json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
    );
    // The same overlap in the old object: allowed with a warning on UPDATE…
    let v = request(
        "McpServerPolicy",
        "UPDATE",
        Some(NS),
        &overlapping,
        Some(&overlapping),
    );
    assert_warned(&v, "selector_overlap", &["predates this update"]);
    // …but a CREATE ignores an oldObject, and an UPDATE without one is judged as a CREATE.
    for (op, old) in [("CREATE", Some(&overlapping)), ("UPDATE", None)] {
        assert_denied(
            &request("McpServerPolicy", op, Some(NS), &overlapping, old),
            "selector_overlap",
            &[],
        );
    }
}

#[test]
fn the_namespace_comes_from_the_request_or_else_the_object() {
    let e = signed_exception_json();
    assert_clean(&request("CapabilityException", "CREATE", None, &e, None));
    let mut anonymous = e.clone();
    anonymous["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    assert_clean(&request(
        "CapabilityException",
        "CREATE",
        Some(NS),
        &anonymous,
        None,
    ));
    assert_denied(
        &request("CapabilityException", "CREATE", None, &anonymous, None),
        "bad_structure",
        &["names no namespace"],
    );
}

#[test]
fn every_reason_label_is_documented() {
    let docs = include_str!("../../../../docs/admission.md");
    let section = docs
        .split("## Validation")
        .nth(1)
        .expect("docs/admission.md has a Validation section");
    for reason in reasons::ALL {
        assert!(
            section.contains(&format!("`{reason}`")),
            "`{reason}` is not in docs/admission.md"
        );
    }
}
