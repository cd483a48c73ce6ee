//! Requests the sidecar makes to the server on its own about a task — asking its state,
//! cancelling it, declining its input requests — always as the sidecar (`Lifeguard-Initiator:
//! sidecar`), never with a client's token.

use serde_json::{Map, Value};

use crate::identity::Identity;
use crate::ledger::TaskRecord;
use crate::mcp::methods;
use crate::mcp::task::{set_input_responses, sidecar_task_request};

use super::active_policy::ActivePolicy;
use super::context::sidecar_request_id;
use super::decisions::{Report, TaskReply, interpret_task_reply};
use super::forward::{set_mcp_headers, sidecar_request_headers};
use super::state::AppState;
use super::task_state::{
    end_for_server_report, observe_if_changed, owner_revoked, settle_terminal,
};
use super::upstream::Upstream;

/// The owner of a task as an identity for requests the sidecar makes about it.
pub fn owner_identity(record: &TaskRecord) -> Identity {
    Identity {
        owner: record.owner.clone(),
        scopes: record.scopes.iter().cloned().collect(),
        issued_at: None,
        expires_at: 0,
        binding: record.binding.clone(),
    }
}

/// A `tasks/*` request about `upstream_id` on behalf of `identity`, with its headers.
fn task_request(
    method: &str,
    identity: &Identity,
    upstream_id: &str,
    correlation_id: &str,
    reason: &str,
) -> (http::HeaderMap, Value) {
    let mut headers = sidecar_request_headers(identity, reason);
    set_mcp_headers(&mut headers, method, Some(upstream_id));
    let message = sidecar_task_request(method, upstream_id, &sidecar_request_id(correlation_id));
    (headers, message)
}

/// Asks the server (as the sidecar) for the task's state; `None` when it could not be asked.
pub async fn ask_state(
    app: &AppState,
    correlation_id: &str,
    record: &TaskRecord,
    reason: &str,
) -> Option<Value> {
    let (headers, message) = task_request(
        methods::TASKS_GET,
        &owner_identity(record),
        &record.upstream_id,
        correlation_id,
        reason,
    );
    match app.upstream.call(headers, &message).await {
        Ok((_, reply)) => Some(reply),
        Err(e) => {
            tracing::debug!(error = %e, "asking the server for a task's state failed");
            None
        }
    }
}

/// Asks the server for the task's state and records what it learns: a terminal state ends the
/// task in the ledger (confirming a pending cancellation), a forgotten task ends. Returns the
/// record as it stands afterwards, or `None` when the server could not be asked. A task whose
/// owner is revoked is not asked about: only its cancellation and the cancellation's
/// confirmation (the outbox's) go out on the owner's behalf.
pub async fn refresh_from_upstream(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    reason: &str,
) -> Option<TaskRecord> {
    if owner_revoked(app, record) {
        app.metrics.anomaly("revoked_owner_request_withheld");
        return None;
    }
    let reply = ask_state(app, correlation_id, record, reason).await?;
    let state = match interpret_task_reply(&reply) {
        TaskReply::Lost => {
            let end = end_for_server_report(app, record, Report::Lost).await?;
            return settle_terminal(app, policy, correlation_id, record, end)
                .await
                .map(|s| s.record);
        }
        TaskReply::State(state) => state,
        TaskReply::Error | TaskReply::NoResult | TaskReply::Malformed => return None,
    };
    match end_for_server_report(app, record, Report::State(&state)).await {
        Some(end) => settle_terminal(app, policy, correlation_id, record, end)
            .await
            .map(|s| s.record),
        None => {
            observe_if_changed(app, record, &state).await;
            let mut updated = record.clone();
            updated.status = state.status;
            updated.status_message = state.status_message;
            Some(updated)
        }
    }
}

/// Asks the server to stop a task (as the sidecar): cooperative; waits for the server's
/// answer, whose failure is only logged (the cancellation outbox asks again).
pub async fn cancel_at_server(
    app: &AppState,
    correlation_id: &str,
    record: &TaskRecord,
    reason: &str,
) {
    let (headers, message) = task_request(
        methods::TASKS_CANCEL,
        &owner_identity(record),
        &record.upstream_id,
        correlation_id,
        reason,
    );
    if let Err(e) = app.upstream.call(headers, &message).await {
        tracing::warn!(error = %e, reason, "asking the server to cancel a task failed");
    }
}

/// Best-effort `tasks/cancel`, in the background, for a task no client will ever know about
/// (the server created it where it must not, or the ledger could not record it).
pub fn cancel_orphan(
    upstream: &Upstream,
    requester: &Identity,
    upstream_id: &str,
    correlation_id: &str,
    reason: &str,
) {
    let (headers, message) = task_request(
        methods::TASKS_CANCEL,
        requester,
        upstream_id,
        correlation_id,
        reason,
    );
    let upstream = upstream.clone();
    tokio::spawn(async move {
        if let Err(e) = upstream.call(headers, &message).await {
            tracing::warn!(error = %e, "cancelling an orphaned upstream task failed");
        }
    });
}

/// Sends the server, in the background, `responses` to input requests of `record` (the
/// declines of refused capability requests), so the task moves on instead of waiting. Nothing
/// is sent for a task whose owner is revoked: it is being cancelled.
pub fn send_input_responses(
    app: &AppState,
    record: &TaskRecord,
    correlation_id: &str,
    responses: Map<String, Value>,
) {
    if owner_revoked(app, record) {
        app.metrics.anomaly("revoked_owner_request_withheld");
        return;
    }
    let (headers, mut message) = task_request(
        methods::TASKS_UPDATE,
        &owner_identity(record),
        &record.upstream_id,
        correlation_id,
        "capability_declined",
    );
    set_input_responses(&mut message, responses, None);
    let upstream = app.upstream.clone();
    tokio::spawn(async move {
        if let Err(e) = upstream.call(headers, &message).await {
            tracing::warn!(error = %e, "sending a capability decline to the server failed");
        }
    });
}
