//! What the object authorizer is sent and what its answer means: pure functions, so each
//! shape is tested without a network.
//!
//! Two shapes are spoken (`tasks.objects.authorizer.format`):
//! - `authzen` (default), an OpenID AuthZEN access evaluation: `subject`, `resource`, `action`
//!   and `context`; the answer is `{"decision": true|false}`.
//! - `subjectAccessReview`, a Kubernetes `authorization.k8s.io/v1` SubjectAccessReview; the
//!   answer is the same object with `status.allowed`.
//!
//! Neither carries the caller's token or the task ID (both are credentials of a kind); the
//! authorizer learns who asks (issuer, subject, tenant, client), about which object of which
//! type through which tool, and the operation.

use serde_json::{Value, json};

use crate::api::AuthorizerFormat;

use super::Question;

/// Longest object value taken from a tool's arguments, in bytes.
pub const MAX_OBJECT_BYTES: usize = 1024;

/// Why a tool call's arguments do not name its object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    #[error("the arguments must name the object at {0} (tasks.objects)")]
    Missing(String),
    #[error("the object at {0} must be a string, number or boolean (tasks.objects)")]
    NotScalar(String),
    #[error("the object at {0} is longer than {MAX_OBJECT_BYTES} bytes (tasks.objects)")]
    TooLong(String),
}

/// The object `arguments` name at `pointer`: a string as it is, a number or boolean as its JSON
/// text.
pub fn object_of(arguments: &Value, pointer: &str) -> Result<String, ObjectError> {
    let value = match arguments.pointer(pointer) {
        None | Some(Value::Null) => return Err(ObjectError::Missing(pointer.to_owned())),
        Some(v) => v,
    };
    let object = match value {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::String(_) => return Err(ObjectError::Missing(pointer.to_owned())),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => return Err(ObjectError::NotScalar(pointer.to_owned())),
    };
    if object.len() > MAX_OBJECT_BYTES {
        return Err(ObjectError::TooLong(pointer.to_owned()));
    }
    Ok(object)
}

/// The request body asking `question` of a decision point speaking `format`, for the policy
/// `server` (namespace/name).
pub fn request_body(format: AuthorizerFormat, question: &Question, server: &str) -> Value {
    match format {
        AuthorizerFormat::Authzen => json!({
            "subject": {
                "type": "user",
                "id": question.subject,
                "properties": {
                    "issuer": question.issuer,
                    "tenant": question.tenant,
                    "client": question.client,
                },
            },
            "resource": {
                "type": question.resource_type,
                "id": question.object,
                "properties": {"tool": question.tool, "server": server},
            },
            "action": {"name": question.action.as_str()},
            "context": {"source": "lifeguard"},
        }),
        AuthorizerFormat::SubjectAccessReview => json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": question.subject,
                "extra": {
                    "lifeguard.dev/issuer": [question.issuer],
                    "lifeguard.dev/tenant": [question.tenant],
                    "lifeguard.dev/client": [question.client],
                    "lifeguard.dev/tool": [question.tool],
                    "lifeguard.dev/server": [server],
                },
                "resourceAttributes": {
                    "group": "lifeguard.dev",
                    "resource": question.resource_type,
                    "name": question.object,
                    "verb": question.action.as_str(),
                },
            },
        }),
    }
}

/// Why an answer is not a decision.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("the authorizer's answer is not JSON")]
    NotJson,
    #[error("the authorizer's answer has no boolean {0}")]
    NoDecision(&'static str),
}

/// The decision in an answer body: `true` only for an explicit allow.
pub fn decision(format: AuthorizerFormat, body: &[u8]) -> Result<bool, AnswerError> {
    let answer: Value = serde_json::from_slice(body).map_err(|_| AnswerError::NotJson)?;
    match format {
        AuthorizerFormat::Authzen => answer
            .get("decision")
            .and_then(Value::as_bool)
            .ok_or(AnswerError::NoDecision("decision")),
        AuthorizerFormat::SubjectAccessReview => {
            let status = answer.get("status");
            let allowed = status
                .and_then(|s| s.get("allowed"))
                .and_then(Value::as_bool)
                .ok_or(AnswerError::NoDecision("status.allowed"))?;
            // `denied: true` wins over `allowed`, as the API server reads it.
            let denied = status
                .and_then(|s| s.get("denied"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            Ok(allowed && !denied)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Action;
    use super::*;

    fn question() -> Question {
        Question {
            issuer: "https://idp.test".into(),
            subject: "alice".into(),
            tenant: "acme".into(),
            client: "console".into(),
            tool: "build_report".into(),
            resource_type: "project".into(),
            object: "proj-x".into(),
            action: Action::Result,
        }
    }

    #[test]
    fn the_object_is_read_at_the_pointer_as_a_scalar() {
        let args = json!({"projectId": "proj-x", "n": 42, "flag": true, "nested": {"id": "a/b"}});
        assert_eq!(object_of(&args, "/projectId").unwrap(), "proj-x");
        assert_eq!(object_of(&args, "/n").unwrap(), "42");
        assert_eq!(object_of(&args, "/flag").unwrap(), "true");
        assert_eq!(object_of(&args, "/nested/id").unwrap(), "a/b");
    }

    #[test]
    fn absent_empty_structured_or_oversized_objects_are_refused() {
        let args =
            json!({"empty": "", "null": null, "list": [1], "map": {}, "big": "x".repeat(1025)});
        for pointer in ["/absent", "/empty", "/null"] {
            assert_eq!(
                object_of(&args, pointer),
                Err(ObjectError::Missing(pointer.into()))
            );
        }
        for pointer in ["/list", "/map"] {
            assert_eq!(
                object_of(&args, pointer),
                Err(ObjectError::NotScalar(pointer.into()))
            );
        }
        assert_eq!(
            object_of(&args, "/big"),
            Err(ObjectError::TooLong("/big".into()))
        );
        assert_eq!(
            object_of(&json!("text"), "/x"),
            Err(ObjectError::Missing("/x".into()))
        );
    }

    #[test]
    fn an_authzen_evaluation_names_subject_resource_and_action_and_no_credential() {
        let body = request_body(AuthorizerFormat::Authzen, &question(), "team/reports");
        assert_eq!(body["subject"]["id"], "alice");
        assert_eq!(body["subject"]["properties"]["issuer"], "https://idp.test");
        assert_eq!(body["subject"]["properties"]["tenant"], "acme");
        assert_eq!(body["subject"]["properties"]["client"], "console");
        assert_eq!(body["resource"]["type"], "project");
        assert_eq!(body["resource"]["id"], "proj-x");
        assert_eq!(body["resource"]["properties"]["tool"], "build_report");
        assert_eq!(body["resource"]["properties"]["server"], "team/reports");
        assert_eq!(body["action"]["name"], "result");
    }

    #[test]
    fn a_subject_access_review_carries_the_same_facts_in_kubernetes_terms() {
        let body = request_body(
            AuthorizerFormat::SubjectAccessReview,
            &question(),
            "team/reports",
        );
        assert_eq!(body["kind"], "SubjectAccessReview");
        assert_eq!(body["spec"]["user"], "alice");
        assert_eq!(
            body["spec"]["extra"]["lifeguard.dev/tenant"],
            json!(["acme"])
        );
        let attributes = &body["spec"]["resourceAttributes"];
        assert_eq!(attributes["resource"], "project");
        assert_eq!(attributes["name"], "proj-x");
        assert_eq!(attributes["verb"], "result");
    }

    #[test]
    fn only_an_explicit_boolean_allow_allows() {
        let authzen = AuthorizerFormat::Authzen;
        assert_eq!(decision(authzen, br#"{"decision": true}"#), Ok(true));
        assert_eq!(decision(authzen, br#"{"decision": false}"#), Ok(false));
        assert_eq!(
            decision(authzen, br#"{"decision": "true"}"#),
            Err(AnswerError::NoDecision("decision"))
        );
        assert_eq!(
            decision(authzen, br#"{}"#),
            Err(AnswerError::NoDecision("decision"))
        );
        assert_eq!(decision(authzen, b"allow"), Err(AnswerError::NotJson));
        let sar = AuthorizerFormat::SubjectAccessReview;
        assert_eq!(decision(sar, br#"{"status": {"allowed": true}}"#), Ok(true));
        assert_eq!(
            decision(sar, br#"{"status": {"allowed": true, "denied": true}}"#),
            Ok(false)
        );
        assert_eq!(
            decision(sar, br#"{"status": {}}"#),
            Err(AnswerError::NoDecision("status.allowed"))
        );
    }
}
