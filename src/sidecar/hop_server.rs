//! The internal hop's endpoint: `POST /internal/v1/mcp` on `--internal-listen`, answering
//! requests other replicas forward (see [`super::hop`]) once their signature checks out.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use serde_json::json;

use crate::mcp::jsonrpc::MAX_REQUEST_BYTES;
use crate::runtime::http::{BodyReadTimeout, read_body};

use super::context::Arrival;
use super::hop::{PATH, auth};
use super::respond;
use super::state::AppState;

/// The internal hop's router: `POST /internal/v1/mcp`, signed requests only.
pub fn router(app: Arc<AppState>) -> Router {
    Router::new().route(PATH, post(receive)).with_state(app)
}

async fn receive(
    State(app): State<Arc<AppState>>,
    timeout: BodyReadTimeout,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(hop) = app.replica.hop.as_ref() else {
        return respond::status(StatusCode::NOT_FOUND);
    };
    let Ok(bytes) = read_body(body, MAX_REQUEST_BYTES, timeout).await else {
        return refuse(&app, "body");
    };
    let claims = match hop.accept(&headers, &bytes) {
        Ok(claims) => claims,
        Err(refusal) => return refuse(&app, refusal.as_str()),
    };
    let mut client_headers = headers;
    for name in auth::HOP_HEADERS {
        client_headers.remove(name);
    }
    app.metrics.hop_received.inc();
    // Boxed, as a client's request is (`pipeline::handle_mcp`): this handler's own future stays
    // small while axum's layers move it.
    Box::pin(super::pipeline::serve(
        app.clone(),
        timeout,
        client_headers,
        Body::from(bytes),
        Arrival::Hop { from: claims.from },
        None,
    ))
    .await
}

fn refuse(app: &AppState, reason: &'static str) -> Response {
    app.metrics.denial(match reason {
        "body" => "hop_body",
        "malformed" => "hop_malformed",
        "wrong_replica" => "hop_wrong_replica",
        "stale" => "hop_stale",
        "replayed" => "hop_replayed",
        _ => "hop_bad_signature",
    });
    tracing::warn!(reason, "refused an internal hop request");
    respond::json(StatusCode::UNAUTHORIZED, &json!({"error": "hop_refused"}))
}
