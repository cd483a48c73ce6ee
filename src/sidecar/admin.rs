//! The admin endpoint: liveness, readiness, Prometheus metrics. Served on its own address so it
//! can stay inside the pod network while `/mcp` faces clients.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use http::header::{self, HeaderValue};

use super::state::AppState;

pub fn router(app: Arc<AppState>) -> Router {
    Router::new()
        .route("/live", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(app)
}

/// Ready once a policy is in force (the ledger is opened before the server starts).
async fn ready(State(app): State<Arc<AppState>>) -> Response {
    match app.policy() {
        Some(policy) => (
            StatusCode::OK,
            format!("ready: policy {} {}", policy.name, policy.hash),
        )
            .into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no policy loaded").into_response(),
    }
}

async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    app.metrics
        .listen_streams
        .set(i64::try_from(app.streams.len()).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        app.metrics.encode(),
    )
        .into_response()
}
