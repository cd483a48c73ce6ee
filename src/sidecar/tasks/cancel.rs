//! `tasks/cancel` by the task's owner or an administrator: the intent is recorded durably
//! first, the client's `tasks/cancel` is forwarded, and the server is asked how the task
//! stands; the task reads `cancelled` once the server confirms (see `cancellation`), and the
//! client is acknowledged either way (MCP cancellation is cooperative).

use axum::response::Response;
use serde_json::json;

use crate::audit::Decision;
use crate::mcp::task::empty_ack;

use super::super::cancellation::{self, Requested};
use super::super::context::RequestContext;
use super::super::decisions::{Access, Operation, cancellation as cancel_end};
use super::super::error::Error;
use super::super::respond;
use super::super::state::AppState;
use super::super::task_state::now_ms;
use super::{authorized_task, forwarded_task_message};

/// `tasks/cancel`.
pub async fn cancel(app: &AppState, ctx: &RequestContext, task_id: &str) -> Response {
    let (record, access) = match authorized_task(app, ctx, task_id, Operation::Cancel).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if record.status.is_terminal() || record.cancel.is_some() {
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    let end = cancel_end(access, &ctx.identity, now_ms());
    let requested_by = match access {
        Access::Owner => ctx.audit("task.cancel_requested", Decision::Allow, "owner"),
        Access::Admin => ctx
            .audit("task.cancel_requested", Decision::Allow, "admin")
            .detail("taskOwner", json!(record.owner)),
    };
    let forward = async || {
        let (headers, message) = forwarded_task_message(app, ctx, &record);
        if let Err(e) = app.upstream.call(headers, &message).await {
            // The intent is recorded; the outbox asks again.
            tracing::warn!(error = %e, "forwarding tasks/cancel failed");
        }
    };
    let requested = cancellation::request(
        app,
        &ctx.policy,
        &ctx.correlation_id,
        &record,
        end,
        Some(requested_by),
        forward,
    )
    .await;
    if let Requested::Failed(e) = requested {
        return Error::from(e).respond(&app.metrics, &ctx.id());
    }
    respond::rpc_result(&ctx.id(), empty_ack())
}
