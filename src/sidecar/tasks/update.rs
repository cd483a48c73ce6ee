//! `tasks/update`: only answers to input requests that are outstanding right now, and that the
//! capability gate did not refuse, reach the server.

use axum::response::Response;
use serde_json::{Value, json};

use crate::audit::Decision;
use crate::ledger::TaskRecord;
use crate::mcp::methods;
use crate::mcp::task::{
    empty_ack, input_requests_mut, input_responses, replace_task_id, set_input_responses,
};

use super::super::capability::{answered_event, is_gated};
use super::super::context::RequestContext;
use super::super::decisions::{Operation, Outstanding, forwardable_inputs};
use super::super::error::Error;
use super::super::forward::set_mcp_headers;
use super::super::respond;
use super::super::state::AppState;
use super::super::task_state::{identity_revoked, owner_revoked};
use super::{authorized_task, forwarded_task_message};

/// `tasks/update`.
pub async fn update(app: &AppState, ctx: &RequestContext, task_id: &str) -> Response {
    let (record, _) = match authorized_task(app, ctx, task_id, Operation::Update).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if record.status.is_terminal() || owner_revoked(app, &record) {
        // A task being cancelled for a revocation takes no more input on its owner's behalf.
        let why = if record.status.is_terminal() {
            "terminal_ignored"
        } else {
            "revoked_ignored"
        };
        app.audit.log(
            ctx.audit("task.updated", Decision::Allow, why)
                .tool(&record.tool)
                .for_task(&app.hasher, &record.id, &record.correlation_id),
        );
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    // While a cancellation is pending the task is being stopped: no answer (a model's output
    // for a sampling request, roots) reaches the server. Read afresh: the cancel may have been
    // requested since the record was read, by another replica.
    if cancel_pending(app, &record).await {
        app.audit.log(
            ctx.audit("task.updated", Decision::Deny, "cancel_pending")
                .tool(&record.tool)
                .for_task(&app.hasher, &record.id, &record.correlation_id)
                .detail("inputsForwarded", 0)
                .detail("inputsDropped", input_responses(ctx.request.params()).len()),
        );
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    // Ask the server which input requests are outstanding now.
    let outstanding = match outstanding_inputs(app, ctx, &record).await {
        Ok(keys) => keys,
        Err(e) => return e.respond(&app.metrics, &ctx.id()),
    };
    let offered = input_responses(ctx.request.params());
    let offered_count = offered.len();
    let kept = forwardable_inputs(offered, &outstanding, |key| {
        app.gate.allowed(record.id.as_str(), key)
    });
    let forwarded = kept.len();
    for (key, answer) in &kept {
        let method = outstanding
            .iter()
            .find(|o| &o.key == key && o.gated)
            .map(|o| o.method.as_str());
        let allowance = method.and_then(|_| app.gate.allowance(record.id.as_str(), key));
        if let (Some(method), Some(allowance)) = (method, allowance) {
            let base = ctx
                .audit("capability.answered", Decision::Allow, "exception")
                .tool(&record.tool)
                .for_task(&app.hasher, &record.id, &record.correlation_id);
            if let Some(event) = answered_event(base, &allowance, method, answer) {
                app.audit.log(event);
            }
        }
    }
    app.audit.log(
        ctx.audit("task.updated", Decision::Allow, "owner")
            .tool(&record.tool)
            .for_task(&app.hasher, &record.id, &record.correlation_id)
            .detail("inputsForwarded", forwarded)
            .detail("inputsDropped", offered_count - forwarded),
    );
    if kept.is_empty() {
        return respond::rpc_result(&ctx.id(), empty_ack());
    }
    if identity_revoked(app, &ctx.identity) {
        // Revoked while the server was asked what is outstanding: nothing more goes out.
        return respond::unauthorized(
            &ctx.policy.resource_metadata_url,
            &ctx.id(),
            &crate::identity::AuthError::Revoked,
        );
    }
    // Sent on: the gated requests are answered (not lapsed), whatever the server replies.
    for o in outstanding
        .iter()
        .filter(|o| o.gated && kept.contains_key(&o.key))
    {
        app.gate.note_answered(record.id.as_str(), &o.key);
    }
    let (headers, mut message) = forwarded_task_message(app, ctx, &record);
    set_input_responses(&mut message, kept, None);
    match app.upstream.call(headers, &message).await {
        Ok((status, mut reply)) => {
            replace_task_id(&mut reply, &record.upstream_id, record.id.as_str());
            super::super::minimize::task_reply_error(&ctx.policy, &mut reply);
            respond::json(status, &reply)
        }
        Err(e) => Error::from(e).respond(&app.metrics, &ctx.id()),
    }
}

/// The input requests the task has outstanding now, asked of the server with the caller's own
/// request turned into a `tasks/get`.
async fn outstanding_inputs(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
) -> Result<Vec<Outstanding>, Error> {
    let upstream_id = record.upstream_id.as_str();
    let mut probe = ctx.request.message.clone();
    probe["method"] = json!(methods::TASKS_GET);
    probe["id"] = json!(ctx.sidecar_request_id());
    probe["params"] = json!({
        "taskId": upstream_id,
        "_meta": ctx.request.params().and_then(|p| p.get("_meta")).cloned().unwrap_or(Value::Null),
    });
    let mut headers = ctx.upstream_headers();
    super::super::delegate::attach(app, ctx, &mut headers, Some(record.into()), None);
    set_mcp_headers(&mut headers, methods::TASKS_GET, Some(upstream_id));
    let (_, mut reply) = app.upstream.call(headers, &probe).await?;
    let Some(requests) = reply.get_mut("result").and_then(input_requests_mut) else {
        return Ok(Vec::new());
    };
    Ok(requests
        .iter()
        .map(|(key, request)| Outstanding {
            key: key.clone(),
            method: request
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            gated: is_gated(request),
        })
        .collect())
}

/// Whether a cancellation of the task is pending (in the ledger now). A ledger that cannot be
/// read counts as pending: an answer withheld can be sent again, one forwarded cannot be undone.
async fn cancel_pending(app: &AppState, record: &TaskRecord) -> bool {
    if record.cancel.is_some() {
        return true;
    }
    match app.ledger.get(&record.id).await {
        Ok(Some(fresh)) => fresh.cancel.is_some(),
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %e, "reading a task before forwarding answers failed");
            true
        }
    }
}
