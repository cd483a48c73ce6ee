//! `tasks.objects` at request time: the object authorizer's verdict on this caller doing an
//! action to the object a task acts on, the object's audit digest, and the uniform refusal.
//! Shared by the task methods ([`super::tasks`]) and listen subscriptions ([`super::listen`]).

use axum::response::Response;

use crate::audit::Decision;
use crate::ledger::TaskRecord;

use super::context::RequestContext;
use super::objects::{Action, Verdict};
use super::respond;
use super::state::AppState;

/// Asks the object authorizer (`tasks.objects`) whether the caller may do `action` to the
/// object `record` acts on; allowed without asking when its tool names no object.
pub(crate) async fn object_verdict(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
    action: Action,
) -> Verdict {
    app.objects
        .for_task(
            ctx.policy.effective.object_rules(),
            &ctx.policy.name,
            &ctx.identity,
            record,
            action,
            &app.metrics,
        )
        .await
}

/// The audit digest of the object `record` acts on, when it names one.
pub(crate) fn object_digest(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
) -> Option<String> {
    let object = record.object.as_deref()?;
    let resource_type = ctx
        .policy
        .effective
        .object_rules()
        .and_then(|o| o.for_tool(&record.tool))
        .map_or(record.tool.as_str(), |p| p.resource_type.as_str());
    Some(app.hasher.object_digest(resource_type, object))
}

/// The answer to an operation the object authorizer did not allow, audited as `task.denied`
/// with the object's digest: the uniform "Task not found" for a refusal, a retryable error
/// when no decision could be had.
pub(crate) fn object_refusal(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
    verdict: &Verdict,
) -> Response {
    let reason = verdict.reason();
    app.metrics.denial(reason);
    let mut event = ctx
        .audit("task.denied", Decision::Deny, reason)
        .tool(&record.tool)
        .for_task(&app.hasher, &record.id, &record.correlation_id)
        .detail("method", ctx.request.method.clone());
    if let Some(digest) = object_digest(app, ctx, record) {
        event = event.detail("object", digest);
    }
    app.audit.log(event);
    match verdict {
        Verdict::Unavailable(_) => respond::authorizer_unavailable(&ctx.id(), &ctx.policy.name),
        _ => respond::task_not_found(&ctx.id()),
    }
}
