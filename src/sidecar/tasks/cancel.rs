//! `tasks/cancel` by the task's owner or an administrator: recorded durably first (so the task
//! reads `cancelled` from now on, whatever the server does), then forwarded to the server, then
//! acknowledged.

use axum::response::Response;
use serde_json::json;

use crate::audit::Decision;
use crate::mcp::task::empty_ack;

use super::super::context::RequestContext;
use super::super::decisions::{Access, Operation, cancellation};
use super::super::respond;
use super::super::state::AppState;
use super::super::task_state::{finish_for_client, now_ms};
use super::{authorized_task, forwarded_task_message};

/// `tasks/cancel`.
pub async fn cancel(app: &AppState, ctx: &RequestContext, task_id: &str) -> Response {
    let (record, access) = match authorized_task(app, ctx, task_id, Operation::Cancel).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if record.status.is_terminal() {
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    let finish = cancellation(access, &ctx.identity, now_ms());
    let applied = match finish_for_client(app, &record, finish).await {
        Ok(applied) => applied,
        Err(e) => return e.respond(&app.metrics, &ctx.id()),
    };
    if applied {
        let event = match access {
            Access::Owner => ctx.audit("task.cancelled", Decision::Allow, "owner"),
            Access::Admin => ctx
                .audit("task.admin_cancelled", Decision::Allow, "admin")
                .detail("taskOwner", json!(record.owner)),
        };
        app.audit
            .log(event.tool(&record.tool).task(app.hasher.hash(&record.id)));
        let (headers, message) = forwarded_task_message(ctx, &record.upstream_id);
        if let Err(e) = app.upstream.call(headers, &message).await {
            // The ledger already says cancelled; the server is not asked again.
            tracing::warn!(error = %e, "forwarding tasks/cancel failed");
        }
    }
    respond::rpc_result(&ctx.id(), empty_ack())
}
