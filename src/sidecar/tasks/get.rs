//! `tasks/get`: answered from the ledger when it knows enough (terminal tasks, polls faster
//! than `minPollInterval`), otherwise from the server, whose report is recorded first.

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use crate::audit::Decision;
use crate::ledger::TaskRecord;
use crate::mcp::task::{present_task, replace_task_id};
use crate::model::TaskStatus;

use super::super::capability_screen::{Recipient, Screening, screen_task_state};
use super::super::context::RequestContext;
use super::super::decisions::{
    Operation, ReadPlan, Report, TaskReply, deliver_result, interpret_task_reply, plan_read,
    task_view,
};
use super::super::error::Error;
use super::super::minimize;
use super::super::object_access::{object_digest, object_refusal, object_verdict};
use super::super::objects::Action;
use super::super::respond;
use super::super::state::AppState;
use super::super::task_state::{
    end_for_server_report, now_ms, observe_if_changed, settle_terminal, try_settle_terminal,
};
use super::super::upstream::{Answer, UpstreamError, response_message};
use super::{authorized_task, forwarded_task_message};
use crate::mcp::task_wire::{PollTerms, translate_poll_answer};

/// Status message of a completed task whose result was read once under
/// `deleteResultAfterRetrieval`.
pub const RESULT_DELETED: &str = "The result was deleted after it was retrieved";

/// `tasks/get`.
pub async fn get(app: &AppState, ctx: &RequestContext, task_id: &str) -> Response {
    let (record, _) = match authorized_task(app, ctx, task_id, Operation::Read).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let plan = plan_read(
        &record,
        app.polls.last(&record.id),
        now_ms(),
        ctx.policy.min_poll_ms(),
    );
    if plan == ReadPlan::FromLedger {
        return answer_from_ledger(app, ctx, &record).await;
    }
    let (headers, message) = forwarded_task_message(app, ctx, &record);
    let (status, answer) = match app.upstream.call_answer(headers, &message).await {
        Ok(r) => r,
        Err(e) => return Error::from(e).respond(&app.metrics, &ctx.id()),
    };
    let reply = match answer {
        Answer::Json(bytes) => {
            if let Some(response) = answer_on_the_wire(app, ctx, &record, &bytes).await {
                return response;
            }
            match response_message(&bytes, &ctx.id()) {
                Ok(reply) => reply,
                Err(e) => return Error::from(e).respond(&app.metrics, &ctx.id()),
            }
        }
        Answer::Message(reply) => reply,
    };
    answer_from_reply(app, ctx, &record, status, reply).await
}

/// The common poll of a running task, translated without a JSON tree ([`task_wire`]): `None`
/// when the answer needs the tree path (anything but a plain unfinished state, or a task with
/// a pending cancellation, whose status message is the sidecar's to tell).
async fn answer_on_the_wire(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
    bytes: &[u8],
) -> Option<Response> {
    if record.cancel.is_some() || minimize::masks_task_states(&ctx.policy) {
        return None;
    }
    let request_id = ctx.id();
    let terms = PollTerms {
        request_id: &request_id,
        upstream_id: &record.upstream_id,
        sidecar_id: record.id.as_str(),
        ttl_ms: record.ttl_ms,
        poll_floor_ms: task_view(record, ctx.policy.min_poll_ms()).poll_interval_ms,
    };
    let translated = translate_poll_answer(bytes, &terms)?;
    if let Some(finish) = end_for_server_report(app, record, Report::State(&translated.state)).await
    {
        let settled =
            try_settle_terminal(app, &ctx.policy, &ctx.correlation_id, record, finish).await;
        return Some(match settled {
            Ok(Some(settled)) => answer_from_ledger(app, ctx, &settled.record).await,
            Ok(None) => respond::task_not_found(&ctx.id()),
            // Not recorded (the ledger out of reach): the task is there, the answer is not.
            Err(e) => Error::from(e).respond(&app.metrics, &ctx.id()),
        });
    }
    app.polls.touch(&record.id, now_ms());
    observe_if_changed(app, record, &translated.state).await;
    audit_status_read(app, ctx, record, translated.state.status);
    Some(respond::raw_json(
        StatusCode::OK,
        bytes::Bytes::from(translated.body),
    ))
}

/// A poll answered from the server's reply, parsed.
async fn answer_from_reply(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
    status: StatusCode,
    mut reply: Value,
) -> Response {
    minimize::task_reply_error(&ctx.policy, &mut reply);
    let state = match interpret_task_reply(&reply) {
        TaskReply::State(state) => state,
        TaskReply::Lost => {
            // The server forgot a task the ledger says is running (it restarted, or purged it;
            // or it confirms a pending cancellation).
            if let Some(lost) = end_for_server_report(app, record, Report::Lost).await
                && let Some(settled) =
                    settle_terminal(app, &ctx.policy, &ctx.correlation_id, record, lost).await
            {
                return answer_from_ledger(app, ctx, &settled.record).await;
            }
            return pass_on_error(status, reply, record);
        }
        TaskReply::Error => return pass_on_error(status, reply, record),
        TaskReply::NoResult => {
            let error = UpstreamError::BadResponse("no result".into());
            return Error::from(error).respond(&app.metrics, &ctx.id());
        }
        TaskReply::Malformed => {
            app.metrics.anomaly("malformed_task_state");
            return Error::MalformedTask.respond(&app.metrics, &ctx.id());
        }
    };
    if let Some(finish) = end_for_server_report(app, record, Report::State(&state)).await {
        let settled =
            try_settle_terminal(app, &ctx.policy, &ctx.correlation_id, record, finish).await;
        return match settled {
            Ok(Some(settled)) => answer_from_ledger(app, ctx, &settled.record).await,
            Ok(None) => respond::task_not_found(&ctx.id()),
            // Not recorded (the ledger out of reach): the task is there, the answer is not.
            Err(e) => Error::from(e).respond(&app.metrics, &ctx.id()),
        };
    }
    // An unchanged poll only updates the in-memory poll clock that paces the next one.
    app.polls.touch(&record.id, now_ms());
    observe_if_changed(app, record, &state).await;
    let mut result = reply.get_mut("result").map(Value::take).unwrap_or_default();
    let floor = task_view(record, ctx.policy.min_poll_ms()).poll_interval_ms;
    present_task(
        &mut result,
        &record.upstream_id,
        record.id.as_str(),
        record.ttl_ms,
        Some(floor),
    );
    if let Some(intent) = &record.cancel {
        // A pending cancellation is the sidecar's to tell.
        result["statusMessage"] = json!(intent.pending_message);
    }
    let screening =
        screen_task_state(app, &ctx.policy, record, &Recipient::of(ctx), &mut result).await;
    if let Screening::TaskFailed(failed) = screening {
        return answer_from_ledger(app, ctx, &failed).await;
    }
    minimize::task_state(&ctx.policy, &mut result);
    audit_status_read(app, ctx, record, state.status);
    respond::rpc_result(&ctx.id(), result)
}

/// The server's error answer, passed on in the sidecar's task ID.
fn pass_on_error(status: StatusCode, mut reply: Value, record: &TaskRecord) -> Response {
    replace_task_id(&mut reply, &record.upstream_id, record.id.as_str());
    respond::json(status, &reply)
}

/// Answers a read from the ledger alone: terminal tasks, and unfinished tasks polled faster
/// than `minPollInterval`. A completed result is counted as read, withheld from all but the
/// first read under read-once (and then forgotten), and audited when delivered.
async fn answer_from_ledger(app: &AppState, ctx: &RequestContext, record: &TaskRecord) -> Response {
    let mut payload = record.ended.as_ref().and_then(|e| e.payload.as_ref());
    let completed = record.status == TaskStatus::Completed;
    let read_once = ctx.policy.tasks.as_ref().is_some_and(|t| t.read_once);
    if completed && payload.is_some() {
        // Reading the result is an operation of its own on the object.
        let verdict = object_verdict(app, ctx, record, Action::Result).await;
        if !verdict.allowed() {
            return object_refusal(app, ctx, record, &verdict);
        }
        let reads = app.ledger.note_result_read(&record.id).await.unwrap_or(0);
        if deliver_result(read_once, reads) {
            let mut event = ctx
                .audit("task.result_read", Decision::Allow, "owner")
                .tool(&record.tool)
                .for_task(&app.hasher, &record.id, &record.correlation_id)
                .detail("reads", reads);
            if let Some(digest) = object_digest(app, ctx, record) {
                event = event.detail("object", digest);
            }
            app.audit.log(event);
        } else {
            payload = None;
        }
        if read_once && let Err(e) = app.ledger.forget_payload(&record.id).await {
            tracing::error!(error = %e, "deleting a retrieved result failed");
        }
    }
    let mut result = task_view(record, ctx.policy.min_poll_ms()).get_result(payload);
    if completed && payload.is_none() {
        result["statusMessage"] = json!(RESULT_DELETED);
    }
    if payload.is_none() {
        audit_status_read(app, ctx, record, record.status);
    }
    respond::rpc_result(&ctx.id(), result)
}

/// A sampled `task.status_read` audit event (the policy's `statusReadSamplePercent`).
fn audit_status_read(
    app: &AppState,
    ctx: &RequestContext,
    record: &TaskRecord,
    status: TaskStatus,
) {
    if sampled(ctx.policy.effective.audit.status_read_sample_percent) {
        app.audit.log(
            ctx.audit("task.status_read", Decision::Allow, "owner")
                .tool(&record.tool)
                .for_task(&app.hasher, &record.id, &record.correlation_id)
                .detail("status", status.as_str()),
        );
    }
}

fn sampled(percent: u8) -> bool {
    if percent >= 100 {
        return true;
    }
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    u32::from(byte[0]) * 100 < u32::from(percent) * 256
}
