use std::sync::Arc;

use serde_json::{Value, json};

use super::fixtures::*;
use crate::api::McpServerPolicy;
use crate::webhook::validate::validate_policy;

fn labels(pairs: &[(&str, &str)]) -> Value {
    json!({"matchLabels": pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()})
}

fn with_selector(p: &McpServerPolicy, selector: Value) -> McpServerPolicy {
    let mut p = p.clone();
    p.spec.selector = serde_json::from_value(selector).unwrap();
    p
}

#[test]
fn a_compiling_policy_with_a_disjoint_selector_is_admitted_cleanly() {
    let others = vec![policy("billing", labels(&[("app", "billing")]))];
    let new = policy("reports", labels(&[("app", "reports")]));
    assert_clean(&validate_policy(&new, None, &others));
}

#[test]
fn a_policy_the_compiler_refuses_is_denied_with_the_compilers_message() {
    let mut value = policy_json("reports", labels(&[("app", "reports")]));
    value["spec"]["resource"] = json!("not a url");
    let new: McpServerPolicy = serde_json::from_value(value).unwrap();
    let v = validate_policy(&new, None, &[]);
    assert_denied(
        &v,
        "invalid_spec",
        &["spec.resource: is not an absolute URL"],
    );
    // `jwksFile` names a file in some container: refused in cluster mode, as the operator does.
    let mut value = policy_json("reports", labels(&[("app", "reports")]));
    value["spec"]["identity"]["issuers"][0]
        .as_object_mut()
        .unwrap()
        .remove("jwksUri");
    value["spec"]["identity"]["issuers"][0]["jwksFile"] = json!("/keys.json");
    let new: McpServerPolicy = serde_json::from_value(value).unwrap();
    assert_denied(
        &validate_policy(&new, None, &[]),
        "invalid_spec",
        &["jwksFile"],
    );
    // A label edit on a stored policy that no longer compiles is not blocked.
    let mut relabelled = new.clone();
    relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_warned(
        &validate_policy(&relabelled, Some(&new), &[]),
        "invalid_spec",
        &["jwksFile", "(unchanged by this update)"],
    );
}

#[test]
fn creating_an_overlapping_policy_is_denied_naming_the_other() {
    let others = vec![
        policy("billing", labels(&[("app", "billing")])),
        policy(
            "all-mcp",
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["mcp", "tools"]}]}),
        ),
    ];
    let new = policy("reports", labels(&[("app", "reports"), ("tier", "mcp")]));
    let v = validate_policy(&new, None, &others);
    assert_denied(
        &v,
        "selector_overlap",
        &[
            "spec.selector: overlaps McpServerPolicy `all-mcp`",
            "a pod labelled app=reports,tier=mcp",
        ],
    );
    assert!(!v.message.unwrap().contains("billing"));
}

#[test]
fn the_policy_itself_is_not_an_other() {
    let current = policy("reports", labels(&[("app", "reports")]));
    let updated = with_selector(&current, labels(&[("app", "reports"), ("v", "2")]));
    assert_clean(&validate_policy(
        &updated,
        Some(&current),
        std::slice::from_ref(&current),
    ));
}

#[test]
fn an_update_is_denied_only_for_an_overlap_it_introduces() {
    let billing = policy("billing", labels(&[("app", "billing")]));
    let others = vec![billing.clone()];
    let current = policy("reports", labels(&[("app", "reports")]));
    // Widening the selector to cover billing's pods: denied.
    let widened = with_selector(
        &current,
        json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
    );
    assert_denied(
        &validate_policy(&widened, Some(&current), &others),
        "selector_overlap",
        &["McpServerPolicy `billing`", "a pod labelled app=billing"],
    );
    // An overlap that was already there: a warning, whatever else the update changes.
    let mut relabelled = widened.clone();
    relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_warned(
        &validate_policy(&relabelled, Some(&widened), &others),
        "selector_overlap",
        &["McpServerPolicy `billing`", "predates this update"],
    );
    let still = with_selector(
        &widened,
        json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["other"]}]}),
    );
    assert_eq!(
        validate_policy(&still, Some(&widened), &others).reason,
        "selector_overlap"
    );
    assert!(validate_policy(&still, Some(&widened), &others).allowed);
    // Narrowing it away: clean.
    assert_clean(&validate_policy(&current, Some(&widened), &others));
}

#[test]
fn an_empty_selector_overlaps_every_policy_that_can_match_something() {
    let others = vec![policy("billing", labels(&[("app", "billing")]))];
    assert_denied(
        &validate_policy(&policy("all", json!({})), None, &others),
        "selector_overlap",
        &["a pod labelled app=billing"],
    );
    let contradictory = vec![policy(
        "nothing",
        json!({"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "a", "operator": "DoesNotExist"}]}),
    )];
    assert_clean(&validate_policy(
        &policy("all", json!({})),
        None,
        &contradictory,
    ));
}

#[test]
fn selectors_kubernetes_would_refuse_are_denied() {
    let cases = [
        (
            json!({"key": "app", "operator": "Equals", "values": ["x"]}),
            "matchExpressions[0].operator: `Equals` is not one of In, NotIn, Exists, DoesNotExist",
        ),
        (
            json!({"key": "app", "operator": "In"}),
            "matchExpressions[0].values: must list at least one value for operator `In`",
        ),
        (
            json!({"key": "app", "operator": "NotIn", "values": []}),
            "matchExpressions[0].values: must list at least one value for operator `NotIn`",
        ),
        (
            json!({"key": "app", "operator": "Exists", "values": ["x"]}),
            "matchExpressions[0].values: must be empty for operator `Exists`",
        ),
        (
            json!({"key": "app", "operator": "DoesNotExist", "values": ["x"]}),
            "matchExpressions[0].values: must be empty for operator `DoesNotExist`",
        ),
    ];
    for (requirement, message) in cases {
        let new = policy("reports", json!({"matchExpressions": [requirement]}));
        assert_denied(
            &validate_policy(&new, None, &[]),
            "invalid_selector",
            &[&format!("spec.selector.{message}")],
        );
    }
    // An invalid selector elsewhere selects nothing (as in the operator): no overlap with it.
    let others = vec![policy(
        "broken",
        json!({"matchExpressions": [{"key": "app", "operator": "In"}]}),
    )];
    assert_clean(&validate_policy(
        &policy("reports", labels(&[("app", "reports")])),
        None,
        &others,
    ));
}

#[test]
fn a_selector_that_contradicts_itself_warns_and_overlaps_nothing() {
    let others: Vec<Arc<McpServerPolicy>> = vec![policy("all", json!({}))];
    let new = policy(
        "reports",
        json!({"matchLabels": {"app": "reports"}, "matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["reports"]}]}),
    );
    assert_warned(
        &validate_policy(&new, None, &others),
        "selector_matches_nothing",
        &["spec.selector: its requirements contradict each other"],
    );
}
