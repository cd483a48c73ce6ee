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

use super::context::{Arrival, RequestContext};
use super::decisions::{Access, Operation, authorize, missing_scopes};
use super::delegate;
use super::error::Error;
use super::forward::set_mcp_headers;
use super::hop::{ForwardError, unreachable_answer as hop_unreachable};
use super::object_access::{object_refusal, object_verdict};
use super::objects::Action;
use super::respond;
use super::state::AppState;
use super::task_state::fail_orphaned;
use super::task_state::now_ms;
use crate::telemetry::metrics::ReasonLabels;
use crate::telemetry::task_spans;

/// The client's own message with the task ID swapped for the upstream's, and headers to match
/// (with the task's delegation assertion when the policy delegates).
fn forwarded_task_message(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
) -> (http::HeaderMap, serde_json::Value) {
    let upstream_id = record.upstream_id.as_str();
    let mut message = ctx.request.message.clone();
    message["params"]["taskId"] = json!(upstream_id);
    let mut headers = ctx.upstream_headers();
    delegate::attach(app, ctx, &mut headers, Some(record.into()), None);
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
    let tasks = ctx.policy.effective.tasks.as_ref();
    let admin_scope = tasks.and_then(|t| t.admin_cancel_scope.as_deref());
    // A task homed on another replica that this one has forwarded requests about before: what
    // authorizing and routing needs never changes, so a request its owner (or an
    // administrator) may make goes straight to the home. Anything else — including every
    // refusal — takes the ledger path below, so refusals cost the same whatever was cached.
    // (The object authorizer's refusals are the exception: they reach only the task's owner,
    // who learns nothing from their timing.)
    if ctx.arrival == Arrival::Client
        && let Some(remembered) = app.replica.remembered_remote(&id, now_ms())
        && app.replica.remote_home(&ctx.policy, &remembered).is_some()
        && let Ok(access) = authorize(Some(&remembered), &ctx.identity, op, admin_scope, now_ms())
        && (access == Access::Admin
            || tasks.is_none_or(|t| {
                missing_scopes(t.scopes_for(&remembered.tool), &ctx.identity).is_empty()
            }))
    {
        task_spans::link_task(remembered.trace.as_deref());
        if access == Access::Owner {
            let verdict = object_verdict(app, ctx, &remembered, op.into()).await;
            if !verdict.allowed() {
                return Err(object_refusal(app, ctx, &remembered, &verdict));
            }
            delegate::renew(app, ctx, &remembered).await;
        }
        return match route_to_home(app, ctx, (*remembered).clone()).await {
            Routed::Here(record) => Ok((*record, access)),
            Routed::Answered(response) => Err(response),
        };
    }
    // An unfinished task homed here, read moments ago (see `home_memory`): answered without
    // reading the ledger again when it authorizes the request; anything else (including every
    // refusal) takes the ledger path below.
    if let Some(known) = app.replica.recall_home(&ctx.policy, &id, now_ms())
        && let Ok(access) = authorize(Some(&known), &ctx.identity, op, admin_scope, now_ms())
        && (access == Access::Admin
            || tasks.is_none_or(|t| {
                missing_scopes(t.scopes_for(&known.tool), &ctx.identity).is_empty()
            }))
    {
        task_spans::link_task(known.trace.as_deref());
        if access == Access::Owner {
            let verdict = object_verdict(app, ctx, &known, op.into()).await;
            if !verdict.allowed() {
                return Err(object_refusal(app, ctx, &known, &verdict));
            }
            delegate::renew(app, ctx, &known).await;
        }
        app.metrics.home_memory_answers.inc();
        return Ok(((*known).clone(), access));
    }
    // Every ID goes through the same lookup, minted-looking or not, so the answer for a forged
    // ID and for a foreign one take the same path.
    let read_start = app.replica.home_read_start();
    let record = app
        .ledger
        .get(&id)
        .await
        .map_err(|e| Error::from(e).respond(&app.metrics, &ctx.id()))?;
    // Every request that names an existing task joins its story, refused ones too (a probe of
    // someone else's task is part of that task's story, as in the audit trail).
    if let Some(r) = &record {
        task_spans::link_task(r.trace.as_deref());
    }
    let access = match authorize(record.as_ref(), &ctx.identity, op, admin_scope, now_ms()) {
        Ok(access) => access,
        Err(reason) => {
            app.metrics.denial(reason.as_str());
            let mut event = ctx
                .audit("task.denied", Decision::Deny, reason.as_str())
                .task(app.hasher.hash(&id))
                .detail("method", ctx.request.method.clone());
            if let Some(r) = &record {
                // Attempts on someone else's task belong to that task's story.
                event = event
                    .tool(&r.tool)
                    .for_task(&app.hasher, &r.id, &r.correlation_id);
            }
            app.audit.log(event);
            return Err(respond::task_not_found(&ctx.id()));
        }
    };
    // authorize() returns Ok only for a present record.
    let Some(record) = record else {
        return Err(respond::task_not_found(&ctx.id()));
    };
    app.replica.remember_home(&ctx.policy, &record, read_start);
    if access == Access::Owner
        && let Some(tasks) = tasks
    {
        let missing = missing_scopes(tasks.scopes_for(&record.tool), &ctx.identity);
        if !missing.is_empty() {
            app.metrics.denial("scope");
            app.audit.log(
                ctx.audit("task.denied", Decision::Deny, "scope")
                    .tool(&record.tool)
                    .for_task(&app.hasher, &record.id, &record.correlation_id)
                    .detail("missingScopes", json!(missing)),
            );
            return Err(respond::insufficient_scope(
                &ctx.policy.resource_metadata_url,
                &ctx.id(),
                &missing,
                &ctx.policy.name,
            ));
        }
    }
    if access == Access::Owner {
        let verdict = object_verdict(app, ctx, &record, op.into()).await;
        if !verdict.allowed() {
            return Err(object_refusal(app, ctx, &record, &verdict));
        }
        // The owner presented a valid token about the task: its identity lease (and its
        // delegation) move forward.
        delegate::renew(app, ctx, &record).await;
    }
    let record = match route_to_home(app, ctx, record).await {
        Routed::Here(record) => *record,
        Routed::Answered(response) => return Err(response),
    };
    Ok((record, access))
}

impl From<Operation> for Action {
    fn from(op: Operation) -> Self {
        match op {
            Operation::Read => Action::Read,
            Operation::Update => Action::Update,
            Operation::Cancel => Action::Cancel,
        }
    }
}

/// Where an authorized request about a task is answered.
enum Routed {
    /// Here, about this record (which may have just ended because its home is gone).
    Here(Box<TaskRecord>),
    /// By the task's home replica (or its absence): this is the answer.
    Answered(Response),
}

/// Sends a client's request about an unfinished task homed on another replica (per-replica
/// server state on a shared ledger) to that replica, which answers it. A task whose home is
/// gone fails here and now (the owner learns it from this very answer); a home that does not
/// answer gets the client a retryable error. Requests that arrived over the hop, and finished
/// tasks (answered from the ledger), stay here.
async fn route_to_home(app: &AppState, ctx: &RequestContext, record: TaskRecord) -> Routed {
    if ctx.arrival != Arrival::Client || record.ended.is_some() {
        return Routed::Here(Box::new(record));
    }
    let (Some(home), Some(hop)) = (
        app.replica.remote_home(&ctx.policy, &record),
        app.replica.hop.as_ref(),
    ) else {
        return Routed::Here(Box::new(record));
    };
    let outcome = |outcome: &'static str| {
        app.metrics
            .hop_forwarded
            .get_or_create(&ReasonLabels { reason: outcome })
            .inc();
    };
    // Boxed, as is `fail_orphaned` below: only replicas on a shared ledger get here, and held
    // inline these would size every task request's future (docs/design.md, "A request's
    // future is boxed once").
    match Box::pin(hop.forward(app.ledger.as_ref(), home, ctx)).await {
        Ok(response) => {
            outcome("answered");
            app.replica.remember_remote(&record);
            Routed::Answered(response)
        }
        // The home's heartbeat lapsed, but the ledger has not been writable long enough (a
        // database outage, or this replica's own start) for that to prove it stopped: the
        // client retries, and the task lives on if the home beats again.
        Err(e @ ForwardError::HomeGone(_)) if !app.replica.may_declare_dead() => {
            outcome("unreachable");
            tracing::warn!(error = %e, "not yet declaring the home replica dead: the ledger was unreachable within a heartbeat TTL");
            Routed::Answered(hop_unreachable(ctx))
        }
        Err(ForwardError::HomeGone(_)) => {
            outcome("home_gone");
            app.replica.forget_remote(&record.id);
            match Box::pin(fail_orphaned(
                app,
                &ctx.policy,
                &ctx.correlation_id,
                &record,
            ))
            .await
            {
                Some(settled) => Routed::Here(Box::new(settled.record)),
                None => Routed::Answered(hop_unreachable(ctx)),
            }
        }
        Err(e @ ForwardError::Unreachable { .. }) => {
            outcome("unreachable");
            tracing::warn!(error = %e, "forwarding a task request to its home replica failed");
            Routed::Answered(hop_unreachable(ctx))
        }
    }
}
