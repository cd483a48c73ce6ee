//! The task methods. Every `tasks/get`, `tasks/update` and `tasks/cancel` is authorized on its
//! own against the ledger row and *this* request's token; an ID the caller may not see gets the
//! one uniform "Task not found" whatever the reason. `tools/call` ([`create`]) is where tasks
//! come into being.

mod cancel;
mod create;
mod get;
mod idempotency;
mod reconcile;
mod update;

pub use cancel::cancel;
pub use create::call_tool;
pub use get::get;
pub use update::update;

use axum::response::Response;
use serde_json::json;

use crate::audit::Decision;
use crate::ledger::TaskRecord;
use crate::model::TaskId;

use super::context::RequestContext;
use super::decisions::{Access, Operation, authorize, missing_scopes};
use super::error::Error;
use super::forward::set_mcp_headers;
use super::respond;
use super::state::AppState;
use super::task_state::now_ms;

/// The client's own message with the task ID swapped for the upstream's, and headers to match.
fn forwarded_task_message(
    ctx: &RequestContext,
    upstream_id: &str,
) -> (http::HeaderMap, serde_json::Value) {
    let mut message = ctx.request.message.clone();
    message["params"]["taskId"] = json!(upstream_id);
    let mut headers = ctx.upstream_headers();
    set_mcp_headers(&mut headers, &ctx.request.method, Some(upstream_id));
    (headers, message)
}

/// Looks the task up and authorizes the caller; on refusal returns the uniform answer.
async fn authorized_task(
    app: &AppState,
    ctx: &RequestContext,
    task_id: &str,
    op: Operation,
) -> Result<(TaskRecord, Access), Response> {
    let id = TaskId::from_string(task_id);
    // Every ID goes through the same lookup, minted-looking or not, so the answer for a forged
    // ID and for a foreign one take the same path.
    let record = app
        .ledger
        .get(&id)
        .await
        .map_err(|e| Error::from(e).respond(&app.metrics, &ctx.id()))?;
    let tasks = ctx.policy.effective.tasks.as_ref();
    let admin_scope = tasks.and_then(|t| t.admin_cancel_scope.as_deref());
    let access = match authorize(record.as_ref(), &ctx.identity, op, admin_scope, now_ms()) {
        Ok(access) => access,
        Err(reason) => {
            app.metrics.denial(reason.as_str());
            let mut event = ctx
                .audit("task.denied", Decision::Deny, reason.as_str())
                .task(app.hasher.hash(&id))
                .detail("method", ctx.request.method.clone());
            if let Some(r) = &record {
                event = event.tool(&r.tool);
            }
            app.audit.log(event);
            return Err(respond::task_not_found(&ctx.id()));
        }
    };
    // authorize() returns Ok only for a present record.
    let Some(record) = record else {
        return Err(respond::task_not_found(&ctx.id()));
    };
    if access == Access::Owner
        && let Some(tasks) = tasks
    {
        let missing = missing_scopes(tasks.scopes_for(&record.tool), &ctx.identity);
        if !missing.is_empty() {
            app.metrics.denial("scope");
            app.audit.log(
                ctx.audit("task.denied", Decision::Deny, "scope")
                    .tool(&record.tool)
                    .task(app.hasher.hash(&record.id))
                    .detail("missingScopes", json!(missing)),
            );
            return Err(respond::insufficient_scope(
                &ctx.policy.resource_metadata_url,
                &missing,
            ));
        }
    }
    Ok((record, access))
}
