//! The HTTPS endpoints: `POST /inject` and `POST /validate`, AdmissionReview v1 both ways.
//!
//! A review body is read only within bounds: at most [`WebhookState::max_review_bytes`]
//! (a larger `Content-Length` is answered 413 before a byte of the body is read), within the
//! listener's body read timeout, and only once its length fits in the [`BodyBudget`] shared by
//! every request, so the memory spent on bodies is bounded whatever the number of connections.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{StatusCode, header};

use crate::api::McpServerPolicy;
use crate::runtime::http::{BodyBudget, BodyError, BodyReadTimeout, Reservation, read_body};

use super::admission::{self, InjectOutcome};
use super::config::WebhookFileConfig;
use super::inject::{self, Candidate};
use super::metrics::{
    BodyRefusalLabels, EndpointLabels, InjectionLabels, ValidationLabels, WebhookMetrics,
};
use super::validate::ClusterView;

/// The default largest AdmissionReview read (`--max-review-bytes`). The API server refuses
/// request bodies over 3 MiB, so an object is at most that, and an UPDATE's review carries the
/// object and the old object: 8 MiB leaves room for both and the request's metadata.
pub const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;
/// The default memory for review bodies being read at once (`--review-buffer-bytes`): eight
/// largest reviews, or thousands of typical ones (a pod's review is a few KiB).
pub const REVIEW_BUFFER_BYTES: usize = 64 * 1024 * 1024;
/// `Retry-After` of a 503 when the review buffer is full, in seconds.
const RETRY_AFTER_SECS: &str = "1";

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
    /// Largest review body read.
    pub max_review_bytes: usize,
    /// Memory for review bodies being read at once.
    pub review_buffer: BodyBudget,
}

/// The router of `--listen`.
pub fn router(state: Arc<WebhookState>) -> Router {
    Router::new()
        .route("/inject", post(inject_handler))
        .route("/validate", post(validate_handler))
        .layer(axum::middleware::from_fn(
            crate::telemetry::spans::http_server,
        ))
        .with_state(state)
}

/// Reads a review body within the bounds of the module documentation; the reservation must be
/// kept while the bytes are in use.
async fn read_review(
    state: &WebhookState,
    endpoint: &'static str,
    timeout: BodyReadTimeout,
    body: Body,
) -> Result<(Bytes, Reservation), Response> {
    let limit = state.max_review_bytes;
    let refuse = |reason: &'static str, response: Response| {
        state
            .metrics
            .bodies_refused
            .get_or_create(&BodyRefusalLabels { endpoint, reason })
            .inc();
        tracing::warn!(endpoint, reason, "AdmissionReview body refused");
        response
    };
    let too_large = || {
        let message = format!("the AdmissionReview is larger than {limit} bytes");
        (StatusCode::PAYLOAD_TOO_LARGE, message).into_response()
    };
    if axum::body::HttpBody::size_hint(&body).lower() > limit as u64 {
        return Err(refuse("too_large", too_large()));
    }
    let Ok(reservation) = state.review_buffer.reserve(&body, limit, timeout).await else {
        let busy = (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, RETRY_AFTER_SECS)],
            "too many AdmissionReview bodies are being read; retry",
        );
        return Err(refuse("busy", busy.into_response()));
    };
    match read_body(body, limit, timeout).await {
        Ok(bytes) => Ok((bytes, reservation)),
        Err(BodyError::TooLarge) => Err(refuse("too_large", too_large())),
        Err(BodyError::TimedOut) => {
            let message = "the AdmissionReview body did not arrive in time";
            Err(refuse(
                "timed_out",
                (StatusCode::REQUEST_TIMEOUT, message).into_response(),
            ))
        }
        Err(BodyError::Unreadable) => {
            let message = "the AdmissionReview body could not be read";
            Err(refuse(
                "unreadable",
                (StatusCode::BAD_REQUEST, message).into_response(),
            ))
        }
    }
}

fn json_response(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

async fn inject_handler(
    State(state): State<Arc<WebhookState>>,
    timeout: BodyReadTimeout,
    body: Body,
) -> Response {
    let started = Instant::now();
    let (body, _reservation) = match read_review(&state, "inject", timeout, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
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
    crate::telemetry::spans::audit(label, reason, "", None);
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

async fn validate_handler(
    State(state): State<Arc<WebhookState>>,
    timeout: BodyReadTimeout,
    body: Body,
) -> Response {
    let started = Instant::now();
    let (body, _reservation) = match read_review(&state, "validate", timeout, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let response = match admission::parse_review(&body) {
        Err(invalid) => *invalid,
        Ok(request) => {
            let (response, kind, verdict) = admission::validate_response(
                &request,
                state.cluster.as_ref(),
                jiff::Timestamp::now(),
            );
            crate::telemetry::spans::audit(
                if verdict.allowed { "allow" } else { "deny" },
                verdict.reason,
                "",
                None,
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
