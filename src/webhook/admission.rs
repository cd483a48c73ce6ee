//! AdmissionReview in, AdmissionReview out: the wire of both endpoints, pure.

use base64::Engine;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::Value;

use super::inject::{self, Decision};
use super::reasons::SkipReason;
use super::validate::{self, ClusterView, Verdict};

/// What one `/inject` call decided, for metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InjectOutcome {
    Injected,
    Skipped(SkipReason),
    Denied(SkipReason),
    /// Not a Pod CREATE, or a body that is not a Pod.
    Ignored,
    Invalid,
}

impl InjectOutcome {
    /// Metric labels: (outcome, reason).
    pub fn labels(&self) -> (&'static str, &'static str) {
        match self {
            Self::Injected => ("injected", ""),
            Self::Skipped(r) => ("skipped", r.as_str()),
            Self::Denied(r) => ("denied", r.as_str()),
            Self::Ignored => ("ignored", ""),
            Self::Invalid => ("invalid", ""),
        }
    }
}

/// The only AdmissionReview version the webhooks are registered for
/// (`admissionReviewVersions: [v1]` in the chart).
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// Parses an AdmissionReview body; `Err` carries the response for a body that is not one.
/// Only `admission.k8s.io/v1` `AdmissionReview`s are accepted: the answer repeats the review's
/// `apiVersion` and `kind`, so any other pair would be answered as something the API server
/// does not read.
pub fn parse_review(
    body: &[u8],
) -> Result<AdmissionRequest<DynamicObject>, Box<AdmissionResponse>> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(|e| {
        Box::new(AdmissionResponse::invalid(format!(
            "not an AdmissionReview: {e}"
        )))
    })?;
    if review.types.api_version != REVIEW_API_VERSION || review.types.kind != "AdmissionReview" {
        return Err(Box::new(AdmissionResponse::invalid(format!(
            "not an AdmissionReview: expected apiVersion {REVIEW_API_VERSION} and kind \
             AdmissionReview, found {:?} and {:?}",
            review.types.api_version, review.types.kind
        ))));
    }
    review.try_into().map_err(|_| {
        Box::new(AdmissionResponse::invalid(
            "the AdmissionReview carries no request",
        ))
    })
}

/// The raw object of a request, as sent (unknown fields included).
pub fn raw_object(request: &AdmissionRequest<DynamicObject>) -> Option<Value> {
    request
        .object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok())
}

/// Answers one `/inject` request. `lookup` gives the candidate's cluster view for the
/// request's namespace.
pub fn inject_response(
    request: &AdmissionRequest<DynamicObject>,
    candidate: impl FnOnce(&Value, &str) -> Result<Decision, String>,
) -> (AdmissionResponse, InjectOutcome) {
    let response = AdmissionResponse::from(request);
    let is_pod_create = request.kind.group.is_empty()
        && request.kind.kind == "Pod"
        && matches!(request.operation, Operation::Create);
    let Some(pod) = raw_object(request).filter(|_| is_pod_create) else {
        return (response, InjectOutcome::Ignored);
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    let decision = match candidate(&pod, &namespace) {
        Ok(d) => d,
        Err(message) => return (response.deny(message), InjectOutcome::Invalid),
    };
    match decision {
        Decision::Inject { pod: after, .. } => {
            (with_diff(response, &pod, &after), InjectOutcome::Injected)
        }
        Decision::Skip(reason) => {
            let after = inject::annotated_skip(&pod, reason);
            let mut response = with_diff(response, &pod, &after);
            if reason.is_reported() {
                response.warnings = Some(vec![skip_warning(reason)]);
            }
            (response, InjectOutcome::Skipped(reason))
        }
        Decision::Deny { reason, policy } => (
            response.deny(format!(
                "lifeguard: McpServerPolicy {policy} requires a Lifeguard sidecar on this pod, but it cannot be injected: {reason} ({})",
                reason.explanation()
            )),
            InjectOutcome::Denied(reason),
        ),
    }
}

/// The warning shown by kubectl for a skipped pod: it contains the annotation's value.
pub fn skip_warning(reason: SkipReason) -> String {
    format!(
        "lifeguard: sidecar not injected: {reason} ({})",
        reason.explanation()
    )
}

fn with_diff(response: AdmissionResponse, before: &Value, after: &Value) -> AdmissionResponse {
    let patch = json_patch::diff(before, after);
    response.with_patch(patch).expect("a JSON patch serializes")
}

/// Renders a response as the AdmissionReview body.
pub fn review_body(response: AdmissionResponse) -> Vec<u8> {
    serde_json::to_vec(&review_json(response)).expect("JSON serializes")
}

/// The AdmissionReview JSON of a response, with `patch` base64-encoded as the API server's
/// `[]byte` field is on the wire (kube-core serializes the bytes as a number array, which Go
/// happens to accept, but clients and tools expect the documented base64 string).
pub fn review_json(response: AdmissionResponse) -> Value {
    let mut review =
        serde_json::to_value(response.into_review()).expect("an AdmissionReview serializes");
    if let Some(patch) = review.pointer_mut("/response/patch") {
        let bytes: Vec<u8> = serde_json::from_value(patch.take()).unwrap_or_default();
        *patch = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    review
}

/// The metric label of a validated kind (bounded: the three CRDs or `other`).
pub fn kind_label(kind: &str) -> &'static str {
    match kind {
        "McpServerPolicy" => "McpServerPolicy",
        "CapabilityException" => "CapabilityException",
        "PrincipalRevocation" => "PrincipalRevocation",
        _ => "other",
    }
}

fn operation_name(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Answers one `/validate` request.
pub fn validate_response(
    request: &AdmissionRequest<DynamicObject>,
    view: &dyn ClusterView,
    now: jiff::Timestamp,
) -> (AdmissionResponse, &'static str, Verdict) {
    let kind = kind_label(&request.kind.kind);
    let object = raw_object(request).unwrap_or(Value::Null);
    let old_object = request
        .old_object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok());
    let verdict = validate::validate_request(
        &request.kind.kind,
        operation_name(&request.operation),
        request.namespace.as_deref(),
        &object,
        old_object.as_ref(),
        view,
        now,
    );
    let mut response = AdmissionResponse::from(request);
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings.clone());
    }
    if !verdict.allowed {
        response = response.deny(
            verdict
                .message
                .clone()
                .unwrap_or_else(|| format!("denied: {}", verdict.reason)),
        );
    }
    (response, kind, verdict)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn review(api_version: &str, kind: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": api_version, "kind": kind,
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a", "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
                "oldObject": null, "dryRun": false,
            }
        }))
        .unwrap()
    }

    /// Found by the `admission_review` fuzz target: a body of another kind (or AdmissionReview
    /// version) was decoded as a review and answered with that kind and version, which the API
    /// server does not read; it is refused as not an AdmissionReview.
    #[test]
    fn a_review_of_another_kind_or_version_was_answered_as_that_kind() {
        let v1 = parse_review(&review(REVIEW_API_VERSION, "AdmissionReview")).unwrap();
        let answer = review_json(AdmissionResponse::from(&v1));
        assert_eq!(answer["apiVersion"], REVIEW_API_VERSION);
        assert_eq!(answer["kind"], "AdmissionReview");
        for (api_version, kind) in [
            (REVIEW_API_VERSION, "AkmissionReview"),
            ("admission.k8s.io/v1beta1", "AdmissionReview"),
            ("v1", "Pod"),
        ] {
            let refusal = parse_review(&review(api_version, kind)).unwrap_err();
            let answer = review_json(*refusal);
            assert_eq!(answer["kind"], "AdmissionReview", "{api_version} {kind}");
            assert_eq!(answer["apiVersion"], REVIEW_API_VERSION);
            assert_eq!(answer["response"]["allowed"], false);
            let message = answer["response"]["status"]["message"].as_str().unwrap();
            assert!(
                message.starts_with("not an AdmissionReview") && message.contains(kind),
                "{message}"
            );
        }
    }
}
