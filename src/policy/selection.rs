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

/// A policy's selector, parsed once and asked about any number of pods (the operator's plan
/// asks it about every pod, the webhook about the pod under review). An empty selector selects
/// nothing (the compiler refuses it: it would capture every pod of the namespace), and so does
/// a selector that does not parse.
#[derive(Clone, Debug)]
pub struct PolicySelector {
    namespace: String,
    /// `None`: selects nothing.
    selector: Option<Selector>,
}

impl PolicySelector {
    /// Parses `policy`'s selector.
    pub fn of(policy: &McpServerPolicy) -> Self {
        Self {
            namespace: super::compile::namespace_of(&policy.metadata),
            selector: Selector::try_from(policy.spec.selector.clone())
                .ok()
                .filter(|s| !s.selects_all()),
        }
    }

    /// The policy's namespace: it selects pods of this namespace only.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether it selects a pod of `namespace` with `labels`.
    pub fn selects(&self, namespace: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        if self.namespace != namespace {
            return false;
        }
        let Some(selector) = &self.selector else {
            return false;
        };
        let empty = BTreeMap::new();
        selector.matches(labels.unwrap_or(&empty))
    }
}

/// Whether `policy` selects a pod of `namespace` with `labels` (the selector parsed for this
/// one question; [`PolicySelector`] keeps it for many).
pub fn selects(
    policy: &McpServerPolicy,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    super::compile::namespace_of(&policy.metadata) == namespace
        && PolicySelector::of(policy).selects(namespace, labels)
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

    #[test]
    fn a_parsed_selector_answers_as_the_one_shot_rule_for_every_pod() {
        let policies = [
            policy(
                "in",
                "2026-11-01T00:00:00Z",
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["r", "x"]}]}),
            ),
            policy(
                "labels",
                "2026-11-01T00:00:00Z",
                serde_json::json!({"matchLabels": {"app": "r", "tier": "web"}}),
            ),
            policy("all", "2026-11-01T00:00:00Z", serde_json::json!({})),
            policy(
                "broken",
                "2026-11-01T00:00:00Z",
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "Resembles", "values": ["r"]}]}),
            ),
        ];
        let pods = [
            None,
            Some(labels(&[])),
            Some(labels(&[("app", "r")])),
            Some(labels(&[("app", "r"), ("tier", "web")])),
            Some(labels(&[("app", "x"), ("tier", "web")])),
        ];
        for p in &policies {
            let parsed = PolicySelector::of(p);
            assert_eq!(parsed.namespace(), "team-a");
            for namespace in ["team-a", "team-b"] {
                for pod in &pods {
                    assert_eq!(
                        parsed.selects(namespace, pod.as_ref()),
                        selects(p, namespace, pod.as_ref()),
                        "{:?} on {namespace} {pod:?}",
                        p.metadata.name
                    );
                }
            }
        }
        let app_r = labels(&[("app", "r"), ("tier", "web")]);
        assert!(PolicySelector::of(&policies[0]).selects("team-a", Some(&app_r)));
        assert!(PolicySelector::of(&policies[1]).selects("team-a", Some(&app_r)));
        assert!(!PolicySelector::of(&policies[2]).selects("team-a", Some(&app_r)));
        assert!(!PolicySelector::of(&policies[1]).selects("team-b", Some(&app_r)));
    }
}
