//! The HTTPS endpoints: `POST /inject` and `POST /validate`, AdmissionReview v1 both ways.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{StatusCode, header};

use crate::api::McpServerPolicy;

use super::admission::{self, InjectOutcome};
use super::config::WebhookFileConfig;
use super::inject::{self, Candidate};
use super::metrics::{EndpointLabels, InjectionLabels, ValidationLabels, WebhookMetrics};
use super::validate::ClusterView;

/// The largest AdmissionReview accepted. An object may be up to ~1.5 MiB in etcd and a review
/// carries the object and the old object; 8 MiB leaves room without letting a caller pin
/// unbounded memory.
pub const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;

/// What the webhook reads from the cluster (its watch caches in production; fixed values in
/// tests): what the validators read, plus namespace labels for injection.
pub trait ClusterReader: ClusterView + Send + Sync + 'static {
    /// Labels of a namespace; `None` when the namespace is unknown.
    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>>;
}

/// Shared by both handlers.
pub struct WebhookState {
    pub config: WebhookFileConfig,
    pub own_namespace: String,
    pub cluster: Arc<dyn ClusterReader>,
    pub metrics: Arc<WebhookMetrics>,
}

/// The router of `--listen`.
pub fn router(state: Arc<WebhookState>) -> Router {
    Router::new()
        .route("/inject", post(inject_handler))
        .route("/validate", post(validate_handler))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(state)
}

fn json_response(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

async fn inject_handler(State(state): State<Arc<WebhookState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let (response, outcome) = match admission::parse_review(&body) {
        Err(invalid) => (*invalid, InjectOutcome::Invalid),
        Ok(request) => {
            let (response, outcome) = admission::inject_response(&request, |pod, namespace| {
                let labels = state.cluster.namespace_labels(namespace);
                let policies = state.cluster.policies_in(namespace);
                let refs: Vec<&McpServerPolicy> = policies.iter().map(Arc::as_ref).collect();
                inject::decide(&Candidate {
                    pod,
                    namespace,
                    namespace_labels: labels.as_ref(),
                    policies: &refs,
                    own_namespace: &state.own_namespace,
                    config: &state.config,
                })
            });
            log_injection(&request, &outcome);
            (response, outcome)
        }
    };
    let (label, reason) = outcome.labels();
    state
        .metrics
        .injections
        .get_or_create(&InjectionLabels {
            outcome: label,
            reason,
        })
        .inc();
    finish(&state, "inject", started, response)
}

async fn validate_handler(State(state): State<Arc<WebhookState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let response = match admission::parse_review(&body) {
        Err(invalid) => *invalid,
        Ok(request) => {
            let (response, kind, verdict) = admission::validate_response(
                &request,
                state.cluster.as_ref(),
                jiff::Timestamp::now(),
            );
            state
                .metrics
                .validations
                .get_or_create(&ValidationLabels {
                    kind,
                    outcome: if verdict.allowed { "allowed" } else { "denied" },
                    reason: verdict.reason,
                })
                .inc();
            if !verdict.allowed {
                tracing::info!(
                    uid = %request.uid, kind, namespace = request.namespace.as_deref().unwrap_or(""),
                    name = %request.name, reason = verdict.reason, "validation denied"
                );
            }
            response
        }
    };
    finish(&state, "validate", started, response)
}

fn finish(
    state: &WebhookState,
    endpoint: &'static str,
    started: Instant,
    response: kube::core::admission::AdmissionResponse,
) -> Response {
    if response.warnings.as_ref().is_some_and(|w| !w.is_empty()) {
        state
            .metrics
            .warnings
            .get_or_create(&EndpointLabels { endpoint })
            .inc();
    }
    let body = admission::review_body(response);
    state
        .metrics
        .duration
        .get_or_create(&EndpointLabels { endpoint })
        .observe(started.elapsed().as_secs_f64());
    json_response(body)
}

fn log_injection(
    request: &kube::core::admission::AdmissionRequest<kube::core::DynamicObject>,
    outcome: &InjectOutcome,
) {
    let namespace = request.namespace.as_deref().unwrap_or("");
    match outcome {
        InjectOutcome::Injected => {
            tracing::info!(uid = %request.uid, namespace, name = %request.name, dry_run = request.dry_run, "sidecar injected");
        }
        InjectOutcome::Denied(reason) => {
            tracing::info!(uid = %request.uid, namespace, name = %request.name, %reason, "pod denied: injection required");
        }
        InjectOutcome::Skipped(reason) if reason.is_reported() => {
            tracing::debug!(uid = %request.uid, namespace, name = %request.name, %reason, "injection skipped");
        }
        _ => {}
    }
}
