//! A client's `notifications/cancelled`: forwarded to the server only when it names a request
//! of the caller's own that is in flight on this replica ([`super::in_flight`]); otherwise it
//! is dropped, counted (`lifeguard_denials_total{reason}`) and audited (`request.denied`,
//! rate-limited per principal). Either way the caller gets what any notification gets, `202
//! Accepted` with no body: the answer must not tell a caller whether someone else's request id
//! is in flight.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use http::StatusCode;

use crate::audit::Decision;

use super::context::RequestContext;
use super::in_flight::CancelVerdict;
use super::state::AppState;
use super::{relay, respond};

/// The one notification a 2026-07-28 client sends.
pub const CANCELLED: &str = "notifications/cancelled";

/// Forwards or drops a client's `notifications/cancelled`.
pub async fn cancelled(app: Arc<AppState>, ctx: RequestContext) -> Response {
    let request_id = ctx.request.params().and_then(|p| p.get("requestId"));
    let verdict = app.in_flight.judge(&ctx.identity.owner, request_id);
    if verdict == CancelVerdict::Forward {
        return relay::forward_plain(app, ctx).await;
    }
    let reason = verdict.reason();
    app.metrics.denial(reason);
    let event = ctx
        .audit("request.denied", Decision::Deny, reason)
        .detail("method", CANCELLED);
    app.denials
        .log(&app.audit, event, Some(&ctx.identity.owner), Instant::now());
    respond::status(StatusCode::ACCEPTED)
}
