//! `tools/call`: the one way a task comes into being. The slot is reserved in the ledger before
//! the server is asked (quotas), the ledger row is committed durably before the client sees the
//! `CreateTaskResult`, and the client only ever sees the sidecar's own task ID.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use crate::audit::{Decision, summarize};
use crate::ledger::{
    Confirmation, IdempotencyClaim, QuotaLimits, Reservation, ReserveOutcome, TaskId, TaskLedger,
    TaskStatus,
};
use crate::mcp::jsonrpc::ErrorObject;
use crate::mcp::task::{parse_created_task, replace_task_id};
use crate::mcp::{TASKS_EXTENSION, codes, methods};

use super::super::decisions::missing_scopes;
use super::super::forward::{client_request_headers, set_mcp_headers, sidecar_request_headers};
use super::super::pipeline::RequestContext;
use super::super::relay::{FinalAction, anomaly, error_value, send_and_relay};
use super::super::respond;
use super::super::state::AppState;
use super::{deny_metric, now_ms};

/// JSON-RPC error code of an exhausted concurrency quota. Outside the ranges JSON-RPC
/// (-32768…-32000) and MCP reserve; `data.scope` names the quota.
pub const QUOTA_EXCEEDED: i64 = -31429;

/// How long a reservation outlives the upstream timeout before it is considered abandoned.
const RESERVATION_GRACE: Duration = Duration::from_secs(60);

/// A reserved task slot waiting for the server's answer. Dropping it without confirming
/// releases the slot (the server answered without a task, failed, or the client went away).
pub struct PendingTask {
    pub id: TaskId,
    pub tool: String,
    pub started_ms: i64,
    ledger: Arc<dyn TaskLedger>,
    armed: bool,
}

impl PendingTask {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for PendingTask {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ledger = self.ledger.clone();
        let id = self.id.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = ledger.release(&id).await {
                    tracing::warn!(error = %e, "releasing a task reservation failed; it expires on its own");
                }
            });
        }
    }
}

fn strip_tasks_extension(message: &mut Value) {
    if let Some(extensions) = message
        .pointer_mut("/params/_meta/io.modelcontextprotocol~1clientCapabilities/extensions")
        .and_then(Value::as_object_mut)
    {
        extensions.remove(TASKS_EXTENSION);
    }
}

/// Handles `tools/call`.
pub async fn call_tool(app: Arc<AppState>, ctx: RequestContext, tool: String) -> Response {
    let policy = &ctx.policy.effective;
    let id = ctx.id();

    // Scopes a tool requires apply to every call of it, task or not.
    if let Some(tasks) = &policy.tasks {
        let missing = missing_scopes(tasks.scopes_for(&tool), &ctx.identity);
        if !missing.is_empty() {
            deny_metric(&app, "scope");
            app.audit.log(
                ctx.audit("task.denied", Decision::Deny, "scope")
                    .tool(&tool)
                    .detail("missingScopes", json!(missing)),
            );
            return respond::insufficient_scope(&ctx.policy.resource_metadata_url, &missing);
        }
    }

    let mut message = ctx.request.message.clone();
    let task_allowed =
        ctx.facts.declares_tasks && policy.tasks.as_ref().is_some_and(|t| t.allows_tool(&tool));
    let headers = client_request_headers(&ctx.headers, &ctx.identity, policy.upstream_identity);
    if !task_allowed {
        // The server must not create a task it was not offered; a task result is refused.
        let body = if ctx.facts.declares_tasks {
            strip_tasks_extension(&mut message);
            Bytes::from(serde_json::to_vec(&message).unwrap_or_default())
        } else {
            ctx.body.clone()
        };
        return send_and_relay(app, Arc::new(ctx), headers, body, FinalAction::Plain).await;
    }
    // `task_allowed` implies a tasks section.
    let Some(tasks) = policy.tasks.as_ref() else {
        return respond::status(StatusCode::INTERNAL_SERVER_ERROR);
    };

    let task_id = match TaskId::generate() {
        Ok(id) => id,
        Err(e) => return internal_error(&id, &e.to_string()),
    };
    let now = now_ms();
    let limits = QuotaLimits {
        per_principal: tasks.concurrency.per_principal,
        per_tenant: tasks.concurrency.per_tenant,
        per_client: tasks.concurrency.per_client,
        per_server: tasks.concurrency.per_server,
    };
    let arguments = tool_arguments(&ctx);
    let material = match super::idempotency::key_material(
        &ctx.headers,
        tasks.derive_idempotency_key,
        &arguments,
    ) {
        Ok(m) => m,
        Err(e) => {
            return respond::rpc_error(
                StatusCode::BAD_REQUEST,
                &id,
                &ErrorObject::new(codes::INVALID_PARAMS, e.to_string()),
            );
        }
    };
    let idempotency = material.map(|m| IdempotencyClaim {
        key_hash: super::idempotency::claim_hash(
            &app.idempotency_secret,
            &ctx.identity.owner,
            &tool,
            &m,
        ),
        window_ms: tasks.idempotency_window.get().as_millis() as i64,
    });
    let reservation = Reservation {
        id: task_id.clone(),
        owner: ctx.identity.owner.clone(),
        tool: tool.clone(),
        scopes: ctx.identity.scopes.iter().cloned().collect(),
        idempotency,
        limits,
        now,
        reservation_expires_at: now + (app.upstream_timeout + RESERVATION_GRACE).as_millis() as i64,
        token_issued_at: ctx.identity.issued_at,
    };
    let outcome = match reserve_slot(&app, &ctx, reservation).await {
        Ok(o) => o,
        Err(e) => return internal_error(&id, &e.to_string()),
    };
    match outcome {
        ReserveOutcome::Reserved => {}
        ReserveOutcome::OverQuota(scope) => {
            deny_metric(&app, "quota");
            app.audit.log(
                ctx.audit("task.denied", Decision::Deny, "quota")
                    .tool(&tool)
                    .detail("scope", scope.as_str()),
            );
            let retry_after = tasks.min_poll_interval.get().as_secs().max(1);
            let mut response = respond::rpc_error(
                StatusCode::TOO_MANY_REQUESTS,
                &id,
                &ErrorObject::new(
                    QUOTA_EXCEEDED,
                    format!("Concurrent task quota per {} exhausted", scope.as_str()),
                )
                .with_data(json!({"scope": scope.as_str()})),
            );
            if let Ok(v) = http::HeaderValue::from_str(&retry_after.to_string()) {
                response.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            return response;
        }
        ReserveOutcome::Existing(record) => {
            app.audit.log(
                ctx.audit("task.deduplicated", Decision::Allow, "idempotency_key")
                    .tool(&tool)
                    .task(app.hasher.hash(&record.id)),
            );
            return respond::rpc_result(&id, super::task_view(&record, &ctx).create_result());
        }
        ReserveOutcome::InFlight(_) => {
            return respond::rpc_error(
                StatusCode::CONFLICT,
                &id,
                &ErrorObject::new(
                    codes::INTERNAL_ERROR,
                    "An identical request is still being processed; retry",
                ),
            );
        }
    }

    let pending = PendingTask {
        id: task_id,
        tool,
        started_ms: now,
        ledger: app.ledger.clone(),
        armed: true,
    };
    let body = Bytes::from(serde_json::to_vec(&message).unwrap_or_default());
    let ctx = Arc::new(ctx);
    // Run to completion even if the client disconnects, so a task the server created is
    // either recorded (and subject to deadlines) or released — never silently lost.
    let app2 = app.clone();
    let work = tokio::spawn(async move {
        send_and_relay(
            app2,
            ctx,
            headers,
            body,
            FinalAction::MayCreateTask(Box::new(pending)),
        )
        .await
    });
    work.await
        .unwrap_or_else(|_| respond::status(StatusCode::INTERNAL_SERVER_ERROR))
}

/// Reserves a slot, resolving the two outcomes that can change by waiting or asking:
/// an identical request in flight (wait for it to become a task or be released) and an
/// exhausted quota (ask the server whether the caller's unpolled tasks finished).
async fn reserve_slot(
    app: &AppState,
    ctx: &RequestContext,
    reservation: Reservation,
) -> crate::ledger::Result<ReserveOutcome> {
    let deadline = Instant::now() + app.upstream_timeout;
    let mut reconciled = false;
    loop {
        let started = Instant::now();
        let outcome = app.ledger.reserve(reservation.clone()).await?;
        app.metrics
            .ledger_write_seconds
            .observe(started.elapsed().as_secs_f64());
        match outcome {
            ReserveOutcome::InFlight(other) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if let Some(record) = app.ledger.get(&other).await? {
                    return Ok(ReserveOutcome::Existing(Box::new(record)));
                }
            }
            ReserveOutcome::OverQuota(_) if !reconciled => {
                reconciled = true;
                let freed = super::reconcile::reconcile_principal(
                    app,
                    &ctx.policy,
                    &ctx.correlation_id,
                    &ctx.identity.owner,
                )
                .await;
                if freed == 0 {
                    return Ok(outcome);
                }
                // Some of the caller's tasks had finished at the server without anyone
                // polling them; their slots are free now.
            }
            other => return Ok(other),
        }
    }
}

fn internal_error(id: &Value, detail: &str) -> Response {
    tracing::error!(%detail, "task ledger failure");
    respond::rpc_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        id,
        &ErrorObject::new(codes::INTERNAL_ERROR, "Internal error"),
    )
}

/// Final response of a `tools/call` that may create a task: confirm a task durably and rewrite
/// it, or release the reservation.
pub async fn confirm_created_task(
    app: &AppState,
    ctx: &RequestContext,
    pending: &mut PendingTask,
    mut message: Value,
) -> Value {
    let id = ctx.id();
    let Some(result) = message.get("result") else {
        return message; // an error: the reservation is released when `pending` drops
    };
    if result.get("resultType").and_then(Value::as_str) != Some("task") {
        return message;
    }
    let Some(created) = parse_created_task(result) else {
        anomaly(app, "malformed_task_result");
        return error_value(
            &id,
            codes::INTERNAL_ERROR,
            "The MCP server returned a malformed task",
        );
    };
    // `call_tool` only creates a pending task when the policy has a tasks section.
    let Some(tasks) = ctx.policy.effective.tasks.as_ref() else {
        return error_value(&id, codes::INTERNAL_ERROR, "Tasks are disabled");
    };
    let now = now_ms();
    let ttl = tasks.effective_ttl(
        created
            .ttl_ms
            .map(|ms| Duration::from_millis(ms.max(0) as u64)),
    );
    let poll_ms = created
        .poll_interval_ms
        .unwrap_or(0)
        .max(tasks.min_poll_interval.get().as_millis() as i64);
    let deadline = tasks.deadline_for(&pending.tool);
    let status = if created.status.is_terminal() {
        // A task is born non-terminal; a terminal status here is reconciled on the first get.
        TaskStatus::Working
    } else {
        created.status
    };
    let confirmation = Confirmation {
        upstream_id: created.upstream_id.clone(),
        status,
        status_message: created.status_message.clone(),
        created_at: now,
        ttl_ms: ttl.as_millis() as i64,
        // A task cannot outlive its retention: past its TTL nobody could read it anyway.
        deadline_at: (pending.started_ms + deadline.as_millis() as i64)
            .min(now + ttl.as_millis() as i64),
        poll_interval_ms: Some(poll_ms),
    };
    let started = Instant::now();
    let confirmed = app.ledger.confirm(&pending.id, confirmation).await;
    app.metrics
        .ledger_write_seconds
        .observe(started.elapsed().as_secs_f64());
    let record = match confirmed {
        Ok(record) => record,
        Err(e) => {
            tracing::error!(error = %e, "could not record a task; cancelling it upstream");
            cancel_upstream_orphan(app, ctx, &created.upstream_id, "ledger_failure");
            return error_value(&id, codes::INTERNAL_ERROR, "Internal error");
        }
    };
    pending.disarm();
    app.metrics.tasks_created.inc();
    let arguments = tool_arguments(ctx);
    // A revocation may have arrived while the server was creating the task: it must not slip
    // through the gap between the token check and the ledger write.
    if let Some(current) = app.policy()
        && let Some(rule) = current
            .effective
            .revocations
            .iter()
            .find(|r| crate::sidecar::lifecycle::revokes_task(r, &record))
    {
        crate::sidecar::lifecycle::cancel_for_revocation(
            app,
            &current,
            &ctx.correlation_id,
            &record,
            rule,
        )
        .await;
    }
    app.audit.log(
        ctx.audit("task.created", Decision::Allow, "created")
            .tool(&pending.tool)
            .task(app.hasher.hash(&record.id))
            .detail("ttlMs", record.ttl_ms)
            .detail(
                "deadlineAt",
                crate::mcp::task::iso_millis(record.deadline_at),
            )
            .detail("arguments", summarize(&arguments)),
    );

    if let Some(result) = message.get_mut("result") {
        replace_task_id(result, &created.upstream_id, pending.id.as_str());
        result["taskId"] = json!(pending.id.as_str());
        result["ttlMs"] = json!(record.ttl_ms);
        result["pollIntervalMs"] = json!(poll_ms);
    }
    message
}

/// A task result for a request that may not create one (no Tasks extension declared, tool not
/// allowed as a task, or a method other than `tools/call`): the client gets an error, the server
/// is asked to cancel the task, and the event is audited.
pub async fn refuse_unexpected_task(
    app: &AppState,
    ctx: &RequestContext,
    message: &Value,
) -> Value {
    anomaly(app, "unexpected_task");
    app.audit.log(
        ctx.audit("task.refused", Decision::Deny, "task_not_allowed")
            .detail("method", ctx.request.method.clone()),
    );
    if let Some(upstream_id) = message.pointer("/result/taskId").and_then(Value::as_str) {
        cancel_upstream_orphan(app, ctx, upstream_id, "task_not_allowed");
    }
    error_value(
        &ctx.id(),
        codes::INTERNAL_ERROR,
        "The MCP server answered with a task, which this request may not create",
    )
}

/// Best-effort `tasks/cancel` for a task no client will ever know about.
fn cancel_upstream_orphan(app: &AppState, ctx: &RequestContext, upstream_id: &str, reason: &str) {
    let mut headers = sidecar_request_headers(&ctx.identity, reason);
    set_mcp_headers(&mut headers, methods::TASKS_CANCEL, Some(upstream_id));
    let message =
        super::sidecar_task_request(methods::TASKS_CANCEL, upstream_id, &ctx.correlation_id);
    let upstream = app.upstream.clone();
    tokio::spawn(async move {
        if let Err(e) = upstream.call(headers, &message).await {
            tracing::warn!(error = %e, "cancelling an orphaned upstream task failed");
        }
    });
}

/// The `arguments` of the `tools/call` in `ctx` (null when absent).
fn tool_arguments(ctx: &RequestContext) -> Value {
    ctx.request
        .params()
        .and_then(|p| p.get("arguments"))
        .cloned()
        .unwrap_or(Value::Null)
}
