//! Fuzz target: the admission-review decoder and both webhook endpoints' logic
//! (`webhook::admission::parse_review`, `inject_response` with `inject::decide`,
//! `validate_response`, `review_json`), against the injection fixtures' policies and config.
//!
//! Input: an AdmissionReview body.
//!
//! Asserts: a body that is not a review is answered with a refusal that says why; a review is
//! answered for its own `uid`, as a JSON AdmissionReview; a patch is base64 of a JSON Patch that
//! applies to the object as sent; a denial carries a message; the validation reason is one of
//! the documented labels.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use libfuzzer_sys::fuzz_target;
use lifeguard::api::McpServerPolicy;
use lifeguard::exception::ApproverKeys;
use lifeguard::webhook::admission::{
    inject_response, parse_review, raw_object, review_json, validate_response,
};
use lifeguard::webhook::config::WebhookFileConfig;
use lifeguard::webhook::inject::{Candidate, decide};
use lifeguard::webhook::validate::{ClusterView, reasons};
use lifeguard_fuzz::NOW;
use serde_json::Value;

const POLICIES: &str = include_str!("../../tests/fixtures/injection/policies.yaml");
const CONFIG: &str = include_str!("../../tests/fixtures/injection/webhook-config.yaml");

struct View {
    policies: Vec<Arc<McpServerPolicy>>,
    config: WebhookFileConfig,
}

impl ClusterView for View {
    fn policies_in(&self, namespace: &str) -> Vec<Arc<McpServerPolicy>> {
        self.policies
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .cloned()
            .collect()
    }

    fn approver_keys(&self) -> ApproverKeys {
        ApproverKeys::from_document(lifeguard_fuzz::ISSUER_JWKS)
    }
}

static VIEW: LazyLock<View> = LazyLock::new(|| View {
    policies: serde_saphyr::from_multiple::<McpServerPolicy>(POLICIES)
        .expect("the fixture policies parse")
        .into_iter()
        .map(Arc::new)
        .collect(),
    config: WebhookFileConfig::parse("webhook-config.yaml", CONFIG).expect("the fixture config"),
});

/// The `response` of an answer, checked to be an AdmissionReview for `uid`.
fn answered(review: &Value, uid: &str) -> Value {
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{review}");
    assert_eq!(review["kind"], "AdmissionReview");
    let response = review["response"].clone();
    assert_eq!(response["uid"], uid, "{review}");
    let allowed = response["allowed"].as_bool().expect("allowed is a bool");
    if !allowed {
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "a refusal without a message: {review}");
    }
    response
}

fuzz_target!(|data: &[u8]| {
    let view = &*VIEW;
    let request = match parse_review(data) {
        Ok(request) => request,
        Err(refusal) => {
            let review = review_json(*refusal);
            let response = answered(&review, "");
            assert_eq!(response["allowed"], false);
            return;
        }
    };
    let uid = request.uid.clone();
    let labels: BTreeMap<String, String> =
        BTreeMap::from([("lifeguard.dev/inject".to_owned(), "enabled".to_owned())]);
    let (response, _outcome) = inject_response(&request, |pod, namespace| {
        let policies = view.policies_in(namespace);
        let refs: Vec<&McpServerPolicy> = policies.iter().map(Arc::as_ref).collect();
        decide(&Candidate {
            pod,
            namespace,
            namespace_labels: Some(&labels),
            policies: &refs,
            own_namespace: "lifeguard",
            config: &view.config,
        })
    });
    let review = review_json(response);
    let response = answered(&review, &uid);
    if let Some(patch) = response.get("patch").filter(|p| !p.is_null()) {
        let bytes = STANDARD
            .decode(patch.as_str().expect("the patch is a base64 string"))
            .expect("the patch is base64");
        let patch: json_patch::Patch =
            serde_json::from_slice(&bytes).expect("the patch is a JSON Patch");
        let mut pod = raw_object(&request).expect("only an object is patched");
        json_patch::patch(&mut pod, &patch).expect("the patch applies to the pod as sent");
    }

    let now = jiff::Timestamp::from_second(NOW).unwrap();
    let (response, kind, verdict) = validate_response(&request, view, now);
    assert!(!kind.is_empty());
    assert!(reasons::ALL.contains(&verdict.reason), "{}", verdict.reason);
    if !verdict.allowed {
        assert!(verdict.message.as_ref().is_some_and(|m| !m.is_empty()));
    }
    answered(&review_json(response), &uid);
});
