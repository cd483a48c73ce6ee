//! Task methods. Every `tasks/get`, `tasks/update` and `tasks/cancel` is authorized on its own
//! against the ledger row and *this* request's token; an ID the caller may not see gets the one
//! uniform "Task not found" whatever the reason.

mod create;
mod idempotency;
mod reconcile;

pub use create::{
    PendingTask, QUOTA_EXCEEDED, call_tool, confirm_created_task, refuse_unexpected_task,
};
pub use reconcile::{cancel_at_server, owner_identity, refresh_from_upstream};

use std::time::Instant;

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use crate::audit::{AuditEvent, Decision};
use crate::ledger::{EndReason, Ending, Finish, FinishOutcome, TaskId, TaskRecord, TaskStatus};
use crate::mcp::jsonrpc::ErrorObject;
use crate::mcp::task::{TaskView, empty_ack, parse_reported_state, replace_task_id};
use crate::mcp::{PROTOCOL_VERSION, TASKS_EXTENSION, codes, meta, methods};
use crate::telemetry::metrics::{ReasonLabels, TerminalLabels};

use super::capability::Carrier;
use super::decisions::{Access, Operation, authorize, missing_scopes};
use super::forward::{client_request_headers, set_mcp_headers};
use super::pipeline::RequestContext;
use super::relay::{anomaly, upstream_failure};
use super::respond;
use super::state::{ActivePolicy, AppState};

/// When the server was last asked about each task (in memory: it only paces polls, and
/// forgetting it on restart costs one extra upstream call).
#[derive(Default)]
pub struct PollClock {
    last: std::sync::Mutex<std::collections::HashMap<TaskId, i64>>,
}

impl PollClock {
    /// Most tasks remembered; beyond it the clock starts over.
    const MAX: usize = 100_000;

    pub fn touch(&self, id: &TaskId, now: i64) {
        if let Ok(mut last) = self.last.lock() {
            if last.len() >= Self::MAX {
                last.clear();
            }
            last.insert(id.clone(), now);
        }
    }

    pub fn last(&self, id: &TaskId) -> Option<i64> {
        self.last.lock().ok().and_then(|l| l.get(id).copied())
    }
}

pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

pub(crate) fn deny_metric(app: &AppState, reason: &'static str) {
    app.metrics
        .denials
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

/// A task request the sidecar builds itself (its own id, the Tasks extension declared).
pub fn sidecar_task_request(method: &str, upstream_id: &str, correlation_id: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": format!("lifeguard-{correlation_id}"),
        "method": method,
        "params": {
            "taskId": upstream_id,
            "_meta": {
                meta::PROTOCOL_VERSION: PROTOCOL_VERSION,
                meta::CLIENT_CAPABILITIES: {"extensions": {TASKS_EXTENSION: {}}},
            }
        }
    })
}

/// The client's own message with the task ID swapped for the upstream's, and headers to match.
fn forwarded_task_message(ctx: &RequestContext, upstream_id: &str) -> (http::HeaderMap, Value) {
    let mut message = ctx.request.message.clone();
    message["params"]["taskId"] = json!(upstream_id);
    let mut headers = client_request_headers(
        &ctx.headers,
        &ctx.identity,
        ctx.policy.effective.upstream_identity,
    );
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
    let record = match app.ledger.get(&id).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "task ledger read failed");
            return Err(respond::rpc_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &ctx.id(),
                &ErrorObject::new(codes::INTERNAL_ERROR, "Internal error"),
            ));
        }
    };
    let tasks = ctx.policy.effective.tasks.as_ref();
    let admin_scope = tasks.and_then(|t| t.admin_cancel_scope.as_deref());
    match authorize(record.as_ref(), &ctx.identity, op, admin_scope, now_ms()) {
        Ok(access) => {
            // authorize() returns Ok only for a present record.
            let Some(record) = record else {
                return Err(respond::task_not_found(&ctx.id()));
            };
            if access == Access::Owner
                && let Some(tasks) = tasks
            {
                let missing = missing_scopes(tasks.scopes_for(&record.tool), &ctx.identity);
                if !missing.is_empty() {
                    deny_metric(app, "scope");
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
        Err(reason) => {
            deny_metric(app, reason.as_str());
            let mut event = ctx
                .audit("task.denied", Decision::Deny, reason.as_str())
                .task(app.hasher.hash(&id))
                .detail("method", ctx.request.method.clone());
            if let Some(r) = &record {
                event = event.tool(&r.tool);
            }
            app.audit.log(event);
            Err(respond::task_not_found(&ctx.id()))
        }
    }
}

/// The policy's `minPollInterval` in milliseconds (0 without a tasks section).
fn min_poll_interval_ms(ctx: &RequestContext) -> i64 {
    ctx.policy
        .effective
        .tasks
        .as_ref()
        .map_or(0, |t| t.min_poll_interval.get().as_millis() as i64)
}

/// Records a non-terminal state the server reported, when it differs from the ledger's: only a
/// changed status is worth a (durable) ledger write.
pub(crate) async fn observe_if_changed(
    app: &AppState,
    record: &TaskRecord,
    state: &crate::mcp::task::ReportedState,
) {
    if state.status == record.status && state.status_message == record.status_message {
        return;
    }
    if let Err(e) = app
        .ledger
        .observe(
            &record.id,
            state.status,
            state.status_message.clone(),
            now_ms(),
        )
        .await
    {
        tracing::warn!(error = %e, "caching a task status failed");
    }
}

/// The ledger's view of a task as the caller's policy presents it.
pub(crate) fn task_view<'a>(record: &'a TaskRecord, ctx: &RequestContext) -> TaskView<'a> {
    let min_poll = min_poll_interval_ms(ctx);
    TaskView {
        task_id: record.id.as_str(),
        status: record.status,
        status_message: record.status_message.as_deref(),
        created_at: record.created_at,
        last_updated_at: record.last_updated_at,
        ttl_ms: record.ttl_ms,
        poll_interval_ms: record.poll_interval_ms.unwrap_or(min_poll).max(min_poll),
    }
}

/// Answers a read of a terminal task from the ledger alone.
/// Status message of a completed task whose result was read once under
/// `deleteResultAfterRetrieval`.
pub const RESULT_DELETED: &str = "The result was deleted after it was retrieved";

/// Answers a read from the ledger alone: terminal tasks, and unfinished tasks polled faster
/// than `minPollInterval`.
async fn answer_from_ledger(app: &AppState, ctx: &RequestContext, record: &TaskRecord) -> Response {
    let hashed = app.hasher.hash(&record.id);
    let mut payload = record.ended.as_ref().and_then(|e| e.payload.as_ref());
    let completed = record.status == TaskStatus::Completed;
    let read_once = ctx
        .policy
        .effective
        .tasks
        .as_ref()
        .is_some_and(|t| t.delete_result_after_retrieval);
    if completed && payload.is_some() {
        let reads = app.ledger.note_result_read(&record.id).await.unwrap_or(0);
        // Under read-once, only the read that counted first gets the result, even when two
        // reads race; the ledger then forgets it.
        if read_once && reads > 1 {
            payload = None;
        } else {
            app.audit.log(
                ctx.audit("task.result_read", Decision::Allow, "owner")
                    .tool(&record.tool)
                    .task(hashed.clone())
                    .detail("reads", reads),
            );
        }
        if read_once && let Err(e) = app.ledger.forget_payload(&record.id).await {
            tracing::error!(error = %e, "deleting a retrieved result failed");
        }
    }
    let mut result = task_view(record, ctx).get_result(payload);
    if completed && payload.is_none() {
        result["statusMessage"] = json!(RESULT_DELETED);
    }
    if payload.is_none() && sampled(ctx.policy.effective.audit.status_read_sample_percent) {
        app.audit.log(
            ctx.audit("task.status_read", Decision::Allow, "owner")
                .tool(&record.tool)
                .task(hashed)
                .detail("status", record.status.as_str()),
        );
    }
    respond::rpc_result(&ctx.id(), result)
}

fn sampled(percent: u8) -> bool {
    if percent >= 100 {
        return true;
    }
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    u32::from(byte[0]) * 100 < u32::from(percent) * 256
}

/// Screens the input requests of a task state (a `tasks/get` result or the params of a
/// `notifications/tasks`) through the capability gate: refused requests are removed, the server
/// is sent a decline for each newly refused one, and a task left with nothing to ask reads
/// `working`.
pub(crate) fn screen_task_state(
    app: &AppState,
    policy: &ActivePolicy,
    record: &TaskRecord,
    declared: &Value,
    protocol_version: &str,
    correlation_id: &str,
    state: &mut Value,
) {
    let Some(requests) = state
        .get_mut("inputRequests")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let carrier = Carrier {
        scope: record.id.as_str(),
        owner: &record.owner,
        declared,
        protocol_version,
        correlation_id,
        policy_name: &policy.name,
    };
    let screened = app
        .gate
        .screen(&policy.effective, policy.trust.as_ref(), &carrier, requests);
    let nothing_left = requests.is_empty();
    screened.count(&app.metrics);
    let hashed = app.hasher.hash(&record.id);
    for event in screened.events {
        app.audit.log(event.tool(&record.tool).task(hashed.clone()));
    }
    if nothing_left {
        if let Some(o) = state.as_object_mut() {
            o.remove("inputRequests");
        }
        if state.get("status").and_then(Value::as_str) == Some("input_required") {
            state["status"] = json!("working");
        }
    }
    if screened.newly_rejected.is_empty() {
        return;
    }
    let responses: serde_json::Map<String, Value> = screened
        .newly_rejected
        .iter()
        .map(|(key, method, reason)| (key.clone(), super::capability::decline(method, *reason)))
        .collect();
    let mut headers = super::forward::sidecar_request_headers(
        &reconcile::owner_identity(record),
        "capability_declined",
    );
    set_mcp_headers(
        &mut headers,
        methods::TASKS_UPDATE,
        Some(&record.upstream_id),
    );
    let mut message =
        sidecar_task_request(methods::TASKS_UPDATE, &record.upstream_id, correlation_id);
    message["params"]["inputResponses"] = Value::Object(responses);
    let upstream = app.upstream.clone();
    tokio::spawn(async move {
        if let Err(e) = upstream.call(headers, &message).await {
            tracing::warn!(error = %e, "sending a capability decline to the server failed");
        }
    });
}

/// A terminal transition as recorded.
pub(crate) struct Settled {
    /// The state to report from now on.
    pub record: TaskRecord,
    /// Whether this call ended the task (false: it was already terminal; first write wins).
    pub applied: bool,
}

/// Records a terminal state; returns the state to report from now on (the earlier terminal
/// state when one was already recorded: first terminal write wins). Lifecycle audit events name
/// the task's owner.
pub(crate) async fn settle_terminal(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    finish: Finish,
) -> Option<Settled> {
    let status = finish.status;
    let reason = finish.ending.reason;
    let started = Instant::now();
    let outcome = app.ledger.finish(&record.id, finish).await;
    app.metrics
        .ledger_write_seconds
        .observe(started.elapsed().as_secs_f64());
    let audit = |event: &'static str, decision: Decision, why: &'static str| {
        AuditEvent::new(event, correlation_id, &policy.name, decision, why)
            .owner(&record.owner)
            .tool(&record.tool)
            .task(app.hasher.hash(&record.id))
    };
    match outcome {
        Ok(FinishOutcome::Applied(after)) => {
            app.metrics
                .tasks_terminal
                .get_or_create(&TerminalLabels {
                    status: status.as_str(),
                    reason: reason.as_str(),
                })
                .inc();
            let event = lifecycle_event(status, reason);
            app.audit
                .log(audit(event, Decision::Record, reason.as_str()));
            Some(Settled {
                record: *after,
                applied: true,
            })
        }
        Ok(FinishOutcome::AlreadyTerminal(existing)) => {
            // A server reporting a different end than the one recorded breaks terminal
            // immutability: keep the first, audit the second. Races between the sidecar's own
            // ends (deadline, revocation, cancel) are not anomalies.
            if reason == EndReason::Upstream && existing.status != status {
                anomaly(app, "terminal_state_changed");
                app.audit.log(
                    audit("task.anomaly", Decision::Record, "terminal_state_changed")
                        .detail("kept", existing.status.as_str())
                        .detail("reported", status.as_str()),
                );
            }
            Some(Settled {
                record: *existing,
                applied: false,
            })
        }
        Ok(FinishOutcome::NotFound) => None,
        Err(e) => {
            tracing::error!(error = %e, "recording a terminal task state failed");
            None
        }
    }
}

/// The audit event of a terminal transition: ends the sidecar imposed (owner, admin, deadline,
/// revocation) are cancellations whatever status they leave; the rest follow the status.
pub(crate) fn lifecycle_event(status: TaskStatus, reason: EndReason) -> &'static str {
    match (reason, status) {
        (EndReason::AdminCancel, _) => "task.admin_cancelled",
        (EndReason::OwnerCancel | EndReason::Deadline | EndReason::Revocation, _) => {
            "task.cancelled"
        }
        (_, TaskStatus::Completed) => "task.completed",
        (_, TaskStatus::Cancelled) => "task.cancelled",
        _ => "task.failed",
    }
}

/// The ledger's terminal record for a state the server reported, if it is terminal.
pub(crate) fn finish_from_report(state: &crate::mcp::task::ReportedState) -> Option<Finish> {
    state.status.is_terminal().then(|| Finish {
        status: state.status,
        status_message: state.status_message.clone(),
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: state.payload.clone(),
            at: now_ms(),
        },
    })
}

/// The ledger's record for a task the server no longer knows.
pub(crate) fn finish_lost() -> Finish {
    Finish {
        status: TaskStatus::Failed,
        status_message: Some("The MCP server no longer knows this task".into()),
        ending: Ending {
            reason: EndReason::UpstreamLost,
            by: None,
            payload: Some(json!({"code": codes::INTERNAL_ERROR,
                                 "message": "The MCP server lost this task"})),
            at: now_ms(),
        },
    }
}

/// `tasks/get`.
pub async fn get(app: &AppState, ctx: &RequestContext, task_id: &str) -> Response {
    let (record, _) = match authorized_task(app, ctx, task_id, Operation::Read).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if record.status.is_terminal() {
        return answer_from_ledger(app, ctx, &record).await;
    }
    // Polls faster than minPollInterval get the state last learned from the server. Not for
    // input_required: its outstanding input requests are not cached.
    let min_poll = min_poll_interval_ms(ctx);
    let last_learned = app
        .polls
        .last(&record.id)
        .map_or(record.last_updated_at, |t| t.max(record.last_updated_at));
    if record.status == TaskStatus::Working && now_ms() - last_learned < min_poll {
        return answer_from_ledger(app, ctx, &record).await;
    }
    let (headers, message) = forwarded_task_message(ctx, &record.upstream_id);
    let (status, mut reply) = match app.upstream.call(headers, &message).await {
        Ok(r) => r,
        Err(e) => return upstream_failure(&ctx.id(), &e),
    };
    if let Some(error) = reply.get("error") {
        if error.get("code").and_then(Value::as_i64) == Some(codes::INVALID_PARAMS) {
            // The server forgot a task the ledger says is running (it restarted, or purged it).
            let settled = settle_terminal(
                app,
                &ctx.policy,
                &ctx.correlation_id,
                &record,
                finish_lost(),
            )
            .await;
            if let Some(settled) = settled {
                return answer_from_ledger(app, ctx, &settled.record).await;
            }
        }
        replace_task_id(&mut reply, &record.upstream_id, record.id.as_str());
        return respond::json(status, &reply);
    }
    let Some(result) = reply.get("result").cloned() else {
        return upstream_failure(
            &ctx.id(),
            &super::upstream::UpstreamError::BadResponse("no result".into()),
        );
    };
    let Some(state) = parse_reported_state(&result) else {
        anomaly(app, "malformed_task_state");
        return respond::rpc_error(
            StatusCode::BAD_GATEWAY,
            &ctx.id(),
            &ErrorObject::new(
                codes::INTERNAL_ERROR,
                "The MCP server returned a malformed task",
            ),
        );
    };
    if let Some(finish) = finish_from_report(&state) {
        let settled = settle_terminal(app, &ctx.policy, &ctx.correlation_id, &record, finish).await;
        return match settled {
            Some(settled) => answer_from_ledger(app, ctx, &settled.record).await,
            None => respond::task_not_found(&ctx.id()),
        };
    }
    // An unchanged poll only updates the in-memory poll clock that paces the next one.
    app.polls.touch(&record.id, now_ms());
    observe_if_changed(app, &record, &state).await;
    let mut result = result;
    replace_task_id(&mut result, &record.upstream_id, record.id.as_str());
    let v = task_view(&record, ctx);
    result["taskId"] = json!(record.id.as_str());
    result["ttlMs"] = json!(record.ttl_ms);
    let upstream_poll = result
        .get("pollIntervalMs")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    result["pollIntervalMs"] = json!(upstream_poll.max(v.poll_interval_ms));
    screen_task_state(
        app,
        &ctx.policy,
        &record,
        &ctx.facts.capabilities,
        &ctx.facts.protocol_version,
        &ctx.correlation_id,
        &mut result,
    );
    if sampled(ctx.policy.effective.audit.status_read_sample_percent) {
        app.audit.log(
            ctx.audit("task.status_read", Decision::Allow, "owner")
                .tool(&record.tool)
                .task(app.hasher.hash(&record.id))
                .detail("status", state.status.as_str()),
        );
    }
    respond::rpc_result(&ctx.id(), result)
}

/// `tasks/update`: only answers to input requests that are outstanding right now reach the
/// server.
pub async fn update(app: &AppState, ctx: &RequestContext, task_id: &str) -> Response {
    let (record, _) = match authorized_task(app, ctx, task_id, Operation::Update).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let hashed = app.hasher.hash(&record.id);
    if record.status.is_terminal() {
        app.audit.log(
            ctx.audit("task.updated", Decision::Allow, "terminal_ignored")
                .tool(&record.tool)
                .task(hashed),
        );
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    // Ask the server which input requests are outstanding now.
    let mut probe = ctx.request.message.clone();
    probe["method"] = json!(methods::TASKS_GET);
    probe["id"] = json!(format!("lifeguard-{}", ctx.correlation_id));
    probe["params"] = json!({
        "taskId": record.upstream_id,
        "_meta": ctx.request.params().and_then(|p| p.get("_meta")).cloned().unwrap_or(Value::Null),
    });
    let mut probe_headers = client_request_headers(
        &ctx.headers,
        &ctx.identity,
        ctx.policy.effective.upstream_identity,
    );
    set_mcp_headers(
        &mut probe_headers,
        methods::TASKS_GET,
        Some(&record.upstream_id),
    );
    let outstanding: Vec<String> = match app.upstream.call(probe_headers, &probe).await {
        Ok((_, reply)) => reply
            .get("result")
            .and_then(parse_reported_state)
            .map(|s| s.input_keys)
            .unwrap_or_default(),
        Err(e) => return upstream_failure(&ctx.id(), &e),
    };
    let responses = ctx
        .request
        .params()
        .and_then(|p| p.get("inputResponses"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let offered = responses.len();
    let kept: serde_json::Map<String, Value> = responses
        .into_iter()
        .filter(|(k, _)| outstanding.contains(k) && !app.gate.refused(record.id.as_str(), k))
        .collect();
    let forwarded = kept.len();
    app.audit.log(
        ctx.audit("task.updated", Decision::Allow, "owner")
            .tool(&record.tool)
            .task(hashed)
            .detail("inputsForwarded", forwarded)
            .detail("inputsDropped", offered - forwarded),
    );
    if kept.is_empty() {
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    let (headers, mut message) = forwarded_task_message(ctx, &record.upstream_id);
    message["params"]["inputResponses"] = Value::Object(kept);
    match app.upstream.call(headers, &message).await {
        Ok((status, mut reply)) => {
            replace_task_id(&mut reply, &record.upstream_id, record.id.as_str());
            respond::json(status, &reply)
        }
        Err(e) => upstream_failure(&ctx.id(), &e),
    }
}

/// `tasks/cancel`: recorded durably first (so the task reads `cancelled` from now on, whatever
/// the server does), then forwarded to the server, then acknowledged.
pub async fn cancel(app: &AppState, ctx: &RequestContext, task_id: &str) -> Response {
    let (record, access) = match authorized_task(app, ctx, task_id, Operation::Cancel).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if record.status.is_terminal() {
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    let (reason, message) = match access {
        Access::Owner => (EndReason::OwnerCancel, "Cancelled by its owner"),
        Access::Admin => (EndReason::AdminCancel, "Cancelled by an administrator"),
    };
    let finish = Finish {
        status: TaskStatus::Cancelled,
        status_message: Some(message.into()),
        ending: Ending {
            reason,
            by: Some(ctx.identity.owner.clone()),
            payload: None,
            at: now_ms(),
        },
    };
    let started = Instant::now();
    let outcome = app.ledger.finish(&record.id, finish).await;
    app.metrics
        .ledger_write_seconds
        .observe(started.elapsed().as_secs_f64());
    match outcome {
        Ok(FinishOutcome::Applied(_)) => {
            app.metrics
                .tasks_terminal
                .get_or_create(&TerminalLabels {
                    status: "cancelled",
                    reason: reason.as_str(),
                })
                .inc();
            let mut event = match access {
                Access::Owner => ctx.audit("task.cancelled", Decision::Allow, "owner"),
                Access::Admin => ctx
                    .audit("task.admin_cancelled", Decision::Allow, "admin")
                    .detail("taskOwner", json!(record.owner)),
            };
            event = event.tool(&record.tool).task(app.hasher.hash(&record.id));
            app.audit.log(event);
            let (headers, message) = forwarded_task_message(ctx, &record.upstream_id);
            if let Err(e) = app.upstream.call(headers, &message).await {
                // The ledger already says cancelled; the server learns on its next contact or
                // when the deadline sweeper retries.
                tracing::warn!(error = %e, "forwarding tasks/cancel failed");
            }
        }
        Ok(FinishOutcome::AlreadyTerminal(_)) | Ok(FinishOutcome::NotFound) => {}
        Err(e) => {
            tracing::error!(error = %e, "recording a cancellation failed");
            return respond::rpc_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &ctx.id(),
                &ErrorObject::new(codes::INTERNAL_ERROR, "Internal error"),
            );
        }
    }
    respond::rpc_result(&ctx.id(), empty_ack())
}
