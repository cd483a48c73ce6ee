//! Bringing the ledger up to date with the server for tasks nobody is polling: a task that
//! finished at the server keeps its quota slot until the ledger learns it ended.

use crate::identity::Identity;
use crate::ledger::TaskRecord;
use crate::mcp::codes;
use crate::mcp::methods;
use crate::mcp::task::parse_reported_state;

use super::super::forward::{set_mcp_headers, sidecar_request_headers};
use super::super::state::{ActivePolicy, AppState};
use super::{finish_from_report, finish_lost, settle_terminal, sidecar_task_request};

/// The owner of a task as an identity for requests the sidecar makes about it.
pub fn owner_identity(record: &TaskRecord) -> Identity {
    Identity {
        owner: record.owner.clone(),
        scopes: record.scopes.iter().cloned().collect(),
        issued_at: None,
        expires_at: 0,
    }
}

/// Asks the server for the task's state (as the sidecar, never with a token) and records what
/// it learns: a terminal state ends the task in the ledger, a forgotten task fails. Returns the
/// record as it stands afterwards, or `None` when the server could not be asked.
pub async fn refresh_from_upstream(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    reason: &str,
) -> Option<TaskRecord> {
    let mut headers = sidecar_request_headers(&owner_identity(record), reason);
    set_mcp_headers(&mut headers, methods::TASKS_GET, Some(&record.upstream_id));
    let message = sidecar_task_request(methods::TASKS_GET, &record.upstream_id, correlation_id);
    let (_, reply) = match app.upstream.call(headers, &message).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "refreshing a task from the server failed");
            return None;
        }
    };
    if reply
        .pointer("/error/code")
        .and_then(serde_json::Value::as_i64)
        == Some(codes::INVALID_PARAMS)
    {
        return settle_terminal(app, policy, correlation_id, record, finish_lost())
            .await
            .map(|s| s.record);
    }
    let state = reply.get("result").and_then(parse_reported_state)?;
    if let Some(finish) = finish_from_report(&state) {
        return settle_terminal(app, policy, correlation_id, record, finish)
            .await
            .map(|s| s.record);
    }
    super::observe_if_changed(app, record, &state).await;
    let mut updated = record.clone();
    updated.status = state.status;
    updated.status_message = state.status_message;
    Some(updated)
}

/// Refreshes every unfinished task of a principal; returns how many turned out to be finished.
pub async fn reconcile_principal(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    owner: &crate::ledger::Owner,
) -> usize {
    let filter = crate::ledger::PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: owner.subject.clone(),
        tenant: None,
        client: None,
    };
    let Ok(active) = app.ledger.active_for(&filter).await else {
        return 0;
    };
    let refreshed = futures_util::future::join_all(
        active
            .iter()
            .take(64)
            .map(|record| refresh_from_upstream(app, policy, correlation_id, record, "reconcile")),
    )
    .await;
    refreshed
        .into_iter()
        .flatten()
        .filter(|r| r.status.is_terminal())
        .count()
}

/// Asks the server to stop a task the ledger ended on its own authority (deadline,
/// revocation): cooperative, best effort, as the sidecar and never with a token.
pub async fn cancel_at_server(
    app: &AppState,
    correlation_id: &str,
    record: &TaskRecord,
    reason: &str,
) {
    let mut headers = sidecar_request_headers(&owner_identity(record), reason);
    set_mcp_headers(
        &mut headers,
        methods::TASKS_CANCEL,
        Some(&record.upstream_id),
    );
    let message = sidecar_task_request(methods::TASKS_CANCEL, &record.upstream_id, correlation_id);
    if let Err(e) = app.upstream.call(headers, &message).await {
        tracing::warn!(error = %e, reason, "asking the server to cancel a task failed");
    }
}
