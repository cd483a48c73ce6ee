//! The kstatus rules (sigs.k8s.io/cli-utils `pkg/kstatus/status`, what Flux's health checks,
//! `kpt live status` and kstatus-based tooling compute), ported as one pure function over an
//! object's JSON, so tests can assert what those tools make of Lifeguard's status.
//!
//! For a custom resource the rules are, in order: a `metadata.deletionTimestamp` means
//! Terminating; a `status.observedGeneration` different from `metadata.generation` means
//! InProgress (the controller has not seen the latest spec); a `Reconciling` condition that is
//! `True` means InProgress and a `Stalled` one that is `True` means Failed; otherwise a `Ready`
//! condition decides (`True`: Current, `False`: InProgress); an object with none of these is
//! Current.

use serde_json::Value;

/// What kstatus computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KStatus {
    InProgress,
    Failed,
    Current,
    Terminating,
}

/// The status and kstatus's message for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub status: KStatus,
    pub message: String,
}

/// The kstatus of `object` (a whole Kubernetes object as JSON).
pub fn compute(object: &Value) -> Health {
    let health = |status, message: String| Health { status, message };
    if object
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        return health(
            KStatus::Terminating,
            "Resource scheduled for deletion".into(),
        );
    }
    if let (Some(generation), Some(observed)) = (
        object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64),
        object
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64),
    ) && generation != observed
    {
        let kind = object["kind"].as_str().unwrap_or_default();
        return health(
            KStatus::InProgress,
            format!(
                "{kind} generation is {generation}, but latest observed generation is {observed}"
            ),
        );
    }
    let conditions = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let is_true = |c: &Value| c["status"] == "True";
    for condition in conditions {
        let message = condition["message"].as_str().unwrap_or_default().to_owned();
        match condition["type"].as_str() {
            Some("Reconciling") if is_true(condition) => {
                return health(KStatus::InProgress, message);
            }
            Some("Stalled") if is_true(condition) => return health(KStatus::Failed, message),
            _ => {}
        }
    }
    if let Some(ready) = conditions.iter().find(|c| c["type"] == "Ready") {
        let message = ready["message"].as_str().unwrap_or_default().to_owned();
        match ready["status"].as_str() {
            Some("True") => return health(KStatus::Current, "Resource is Ready".into()),
            Some("False") => return health(KStatus::InProgress, message),
            _ => {}
        }
    }
    health(KStatus::Current, "Resource is current".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(generation: i64, status: Value) -> Value {
        json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "generation": generation},
            "status": status,
        })
    }

    fn condition(type_: &str, status: &str, message: &str) -> Value {
        json!({"type": type_, "status": status, "reason": "R", "message": message})
    }

    // The cases of the kstatus documentation (README "Statuses", "Conditions", "The Ready
    // Condition") and of its generic rules.

    #[test]
    fn a_deletion_timestamp_is_terminating_whatever_else_the_status_says() {
        let mut o = object(1, json!({"conditions": [condition("Ready", "True", "")]}));
        o["metadata"]["deletionTimestamp"] = json!("2026-12-03T10:00:00Z");
        assert_eq!(compute(&o).status, KStatus::Terminating);
    }

    #[test]
    fn an_unobserved_generation_is_in_progress_even_when_ready() {
        let o = object(
            3,
            json!({"observedGeneration": 2, "conditions": [condition("Ready", "True", "")]}),
        );
        let h = compute(&o);
        assert_eq!(h.status, KStatus::InProgress);
        assert_eq!(
            h.message,
            "Widget generation is 3, but latest observed generation is 2"
        );
    }

    #[test]
    fn reconciling_is_in_progress_and_stalled_is_failed() {
        let o = object(
            1,
            json!({"observedGeneration": 1, "conditions": [
                condition("Ready", "False", "waiting"),
                condition("Reconciling", "True", "2 of 3 done"),
            ]}),
        );
        assert_eq!(
            compute(&o),
            Health {
                status: KStatus::InProgress,
                message: "2 of 3 done".into()
            }
        );
        let o = object(
            1,
            json!({"observedGeneration": 1, "conditions": [
                condition("Ready", "False", "broken"),
                condition("Stalled", "True", "bad spec"),
            ]}),
        );
        assert_eq!(compute(&o).status, KStatus::Failed);
        assert_eq!(compute(&o).message, "bad spec");
    }

    #[test]
    fn abnormal_true_conditions_that_are_false_leave_the_decision_to_ready() {
        let o = object(
            1,
            json!({"observedGeneration": 1, "conditions": [
                condition("Ready", "True", ""),
                condition("Reconciling", "False", ""),
                condition("Stalled", "False", ""),
            ]}),
        );
        assert_eq!(compute(&o).status, KStatus::Current);
        let o = object(1, json!({"conditions": [condition("Ready", "False", "x")]}));
        assert_eq!(compute(&o).status, KStatus::InProgress);
    }

    #[test]
    fn no_known_condition_and_no_status_are_current() {
        assert_eq!(compute(&object(1, json!({}))).status, KStatus::Current);
        let o = json!({"kind": "ConfigMap", "metadata": {"name": "c"}});
        assert_eq!(compute(&o).status, KStatus::Current);
        let o = object(
            1,
            json!({"conditions": [condition("Compiled", "False", "")]}),
        );
        assert_eq!(compute(&o).status, KStatus::Current);
    }
}
