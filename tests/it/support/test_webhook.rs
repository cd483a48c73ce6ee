//! A scriptable admission webhook over TLS for tests of the Kubernetes API emulator's admission
//! (`tests/kube_emulator/admission.py`): what it answers depends on the path it is called on
//! (`answer`), and it records every AdmissionReview it receives. Plus builders of webhook
//! configurations created through kube-rs.

use super::tls::{mint_tls, serve};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::task::JoinSet;

/// (path and query, the review's `request`) of every review received, in arrival order.
type Reviews = Arc<Mutex<Vec<(String, Value)>>>;

/// The container `/inject` adds.
pub const SIDECAR: &str = "lifeguard-sidecar";
/// The annotation `/inject` adds along with it.
pub const STATUS_ANNOTATION: &str = "lifeguard.dev/status";
/// The annotation `/count-containers` keeps equal to the number of containers.
pub const COUNT_ANNOTATION: &str = "test.lifeguard.dev/containers";

/// A scripted admission webhook over HTTPS on 127.0.0.1; what it answers depends on the path
/// (see `answer`). It records every AdmissionReview it receives.
pub struct TestWebhook {
    /// `https://127.0.0.1:PORT`
    pub address: String,
    /// base64 of the PEM of the CA that signed its certificate (for 127.0.0.1 and localhost).
    pub ca_bundle: String,
    /// (path and query, the review's `request`), in arrival order.
    reviews: Reviews,
    _server: JoinSet<()>,
}

impl TestWebhook {
    pub async fn start() -> Self {
        let (ca_pem, tls) = mint_tls();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("https://{}", listener.local_addr().unwrap());
        let reviews = Reviews::default();
        let router = Router::new()
            .fallback(admission_review)
            .with_state(reviews.clone());
        Self {
            address,
            ca_bundle: BASE64.encode(ca_pem),
            reviews,
            _server: serve(listener, tls, router),
        }
    }

    pub fn reviews(&self) -> Vec<(String, Value)> {
        self.reviews.lock().unwrap().clone()
    }

    /// A `clientConfig` calling `path` on this webhook by URL.
    pub fn url_config(&self, path: &str) -> Value {
        json!({"url": format!("{}{path}", self.address), "caBundle": self.ca_bundle})
    }

    /// A `clientConfig` calling `path` on the service `lifeguard/lifeguard-webhook:443`.
    pub fn service_config(&self, path: &str) -> Value {
        json!({
            "service": {"namespace": "lifeguard", "name": "lifeguard-webhook", "path": path},
            "caBundle": self.ca_bundle,
        })
    }
}

async fn admission_review(
    State(reviews): State<Reviews>,
    uri: http::Uri,
    body: Bytes,
) -> axum::Json<Value> {
    let review: Value = serde_json::from_slice(&body).expect("an AdmissionReview");
    let request = review["request"].clone();
    let path = uri.path_and_query().map(ToString::to_string);
    reviews
        .lock()
        .unwrap()
        .push((path.unwrap_or_default(), request.clone()));
    let mut response = answer(uri.path(), &request).await;
    response["uid"] = request["uid"].clone();
    axum::Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// The webhook's answer (an AdmissionResponse without its uid) to a review sent to `path`.
pub async fn answer(path: &str, request: &Value) -> Value {
    let object = &request["object"];
    match path {
        // Adds the sidecar and a status annotation unless the pod has the sidecar.
        "/inject" => {
            let containers = object["spec"]["containers"].as_array().unwrap();
            if containers.iter().any(|c| c["name"] == SIDECAR) {
                return json!({"allowed": true});
            }
            let sidecar = json!({"name": SIDECAR, "image": "ghcr.io/lifeguard-dev/lifeguard:test"});
            json_patch(
                vec![
                    json!({"op": "add", "path": "/spec/containers/-", "value": sidecar}),
                    annotate(object, STATUS_ANNOTATION, "{\"injected\":true}"),
                ],
                &["sidecar injected"],
            )
        }
        // Records how many containers the pod has, as an annotation (no patch when it is right).
        "/count-containers" => {
            let count = object["spec"]["containers"].as_array().unwrap().len();
            let recorded = object["metadata"]["annotations"][COUNT_ANNOTATION].as_str();
            if recorded.and_then(|r| r.parse().ok()) == Some(count) {
                return json!({"allowed": true});
            }
            json_patch(
                vec![annotate(object, COUNT_ANNOTATION, &count.to_string())],
                &[],
            )
        }
        "/deny" if object["metadata"]["labels"]["deny"] == "yes" => json!({
            "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": "pods labelled deny=yes are refused"},
        }),
        "/warn" => json!({"allowed": true, "warnings": ["first warning", "a \"quoted\" warning"]}),
        "/policy" => {
            let resource = object["spec"]["resource"].as_str().unwrap_or_default();
            if resource.contains("forbidden") {
                json!({"allowed": false, "status": {"message": format!("resource {resource} is not allowed")}})
            } else {
                json!({"allowed": true})
            }
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            json!({"allowed": true})
        }
        _ => json!({"allowed": true}),
    }
}

fn annotate(object: &Value, key: &str, value: &str) -> Value {
    if object["metadata"]["annotations"].is_object() {
        let pointer = key.replace('~', "~0").replace('/', "~1");
        json!({"op": "add", "path": format!("/metadata/annotations/{pointer}"), "value": value})
    } else {
        json!({"op": "add", "path": "/metadata/annotations", "value": {key: value}})
    }
}

fn json_patch(operations: Vec<Value>, warnings: &[&str]) -> Value {
    let patch = BASE64.encode(serde_json::to_vec(&operations).unwrap());
    json!({"allowed": true, "patchType": "JSONPatch", "patch": patch, "warnings": warnings})
}

/// One webhook of a configuration: `name`, `client_config`, `rules`, plus `extra` fields.
pub fn webhook(name: &str, client_config: Value, rules: Value, extra: Value) -> Value {
    let mut hook = json!({
        "name": name,
        "clientConfig": client_config,
        "rules": rules,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
    });
    hook.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    hook
}

pub fn pod_rules(operations: &[&str]) -> Value {
    json!([{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}])
}

pub async fn create_mutating(client: &kube::Client, name: &str, webhooks: Vec<Value>) {
    let configuration: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": webhooks,
    }))
    .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap_or_else(|e| panic!("create MutatingWebhookConfiguration {name}: {e}"));
}

pub async fn create_validating(client: &kube::Client, name: &str, webhooks: Vec<Value>) {
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": webhooks,
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap_or_else(|e| panic!("create ValidatingWebhookConfiguration {name}: {e}"));
}
