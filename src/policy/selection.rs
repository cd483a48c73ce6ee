//! Which McpServerPolicy governs a pod: the policies of the pod's namespace whose selector
//! matches its labels, the oldest first (creation time, then name: the API server's order of
//! arrival). The operator assigns pods with it and the webhook injects with it, so both agree.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::core::{Selector, SelectorExt};

use crate::api::McpServerPolicy;

/// Older first: creation time, then name.
pub fn age_order(policy: &McpServerPolicy) -> (Option<Timestamp>, String) {
    (
        policy.metadata.creation_timestamp.as_ref().map(|t| t.0),
        policy.metadata.name.clone().unwrap_or_default(),
    )
}

/// Whether `policy` selects a pod of `namespace` with `labels`. An empty selector selects
/// nothing (the compiler refuses it: it would capture every pod of the namespace), and so does
/// a selector that does not parse.
pub fn selects(
    policy: &McpServerPolicy,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    if super::compile::namespace_of(&policy.metadata) != namespace {
        return false;
    }
    let Ok(selector) = Selector::try_from(policy.spec.selector.clone()) else {
        return false;
    };
    if selector.selects_all() {
        return false;
    }
    let empty = BTreeMap::new();
    selector.matches(labels.unwrap_or(&empty))
}

/// The policy that governs the pod: the oldest of those that select it.
pub fn governing<'a>(
    policies: impl IntoIterator<Item = &'a McpServerPolicy>,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Option<&'a McpServerPolicy> {
    policies
        .into_iter()
        .filter(|p| selects(p, namespace, labels))
        .min_by_key(|p| age_order(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn policy(name: &str, created: &str, selector: serde_json::Value) -> McpServerPolicy {
        let mut p: McpServerPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"selector": selector, "resource": "https://r.example.com/mcp",
                     "identity": {"issuers": [{"issuer": "https://idp", "jwksUri": "https://idp/jwks"}]}},
        }))
        .unwrap();
        p.metadata.creation_timestamp = Some(Time(created.parse().unwrap()));
        p
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_oldest_selecting_policy_governs() {
        let policies = [
            policy(
                "newer",
                "2026-11-02T00:00:00Z",
                serde_json::json!({"matchLabels": {"app": "reports"}}),
            ),
            policy(
                "older",
                "2026-11-01T00:00:00Z",
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["reports", "x"]}]}),
            ),
            policy(
                "oldest-other",
                "2026-10-01T00:00:00Z",
                serde_json::json!({"matchLabels": {"app": "billing"}}),
            ),
        ];
        let got = governing(&policies, "team-a", Some(&labels(&[("app", "reports")])));
        assert_eq!(got.unwrap().metadata.name.as_deref(), Some("older"));
        assert!(governing(&policies, "team-b", Some(&labels(&[("app", "reports")]))).is_none());
        assert!(governing(&policies, "team-a", None).is_none());
    }

    #[test]
    fn same_age_breaks_ties_by_name_and_empty_selectors_select_nothing() {
        let policies = [
            policy(
                "b",
                "2026-11-01T00:00:00Z",
                serde_json::json!({"matchLabels": {"app": "r"}}),
            ),
            policy(
                "a",
                "2026-11-01T00:00:00Z",
                serde_json::json!({"matchLabels": {"app": "r"}}),
            ),
            policy("all", "2020-01-01T00:00:00Z", serde_json::json!({})),
        ];
        let got = governing(&policies, "team-a", Some(&labels(&[("app", "r")])));
        assert_eq!(got.unwrap().metadata.name.as_deref(), Some("a"));
    }
}
