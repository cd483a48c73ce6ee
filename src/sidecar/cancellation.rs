//! Carrying a cancellation to the server until it is confirmed. Every cancel — by the owner, an
//! administrator, the deadline or a revocation — is first recorded durably as an intent (the
//! ledger's outbox; the task keeps its quota slot and reads "cancellation requested"), then
//! sent upstream and checked with `tasks/get`, again with back-off, until the server reports
//! the task ended (`task.cancelled`, or how it ended on its own) or the sidecar stops waiting
//! (`task.cancel_unconfirmed`: the task ends, and says the server never confirmed).

use crate::audit::{AuditEvent, Decision};
use tracing::Instrument;

use crate::ledger::{CancelRequest, Finish, PendingCancel, TaskRecord};
use crate::telemetry::task_spans;

use super::active_policy::ActivePolicy;
use super::decisions::{
    Report, TaskReply, end_for_report, intent_for, interpret_task_reply, next_attempt_at,
    unconfirmed_end,
};
use super::server_tasks::{ask_state, cancel_at_server};
use super::state::AppState;
use super::task_state::{now_ms, settle_terminal, settle_terminal_as};

/// Most intents driven per sweep; the rest follow on the next sweep.
const OUTBOX_BATCH: usize = 100;

/// What asking for a cancellation did.
#[derive(Debug)]
pub enum Requested {
    /// Recorded now, and tried once.
    Recorded,
    /// A cancellation was already pending, or the task had already ended.
    Already,
    /// No such task.
    Nothing,
    /// The ledger could not record the intent: nothing was sent.
    Failed(crate::ledger::LedgerError),
}

/// Records the intent to end `record` as `end` says, audits `task.cancel_requested` (with
/// `requested_by` when a client asked), and makes the first attempt: the cancel is sent with
/// `send` (the client's own `tasks/cancel`, or the sidecar's) and the server's state is asked.
pub async fn request(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    end: Finish,
    requested_by: Option<AuditEvent>,
    send: impl AsyncFnOnce(),
) -> Requested {
    let now = now_ms();
    let give_up_at = now + app.cancel_confirm_timeout.as_millis() as i64;
    let mut intent = intent_for(&end, now, give_up_at);
    // Whoever asks (the owner's request, a revocation's apply span): retries continue its trace.
    intent.trace = task_spans::current_traceparent();
    let requested = app.ledger.request_cancel(&record.id, intent.clone()).await;
    app.replica.forget_home(&record.id);
    let recorded = match requested {
        Ok(CancelRequest::Recorded(record)) => record,
        Ok(CancelRequest::AlreadyRequested(_) | CancelRequest::AlreadyTerminal(_)) => {
            return Requested::Already;
        }
        Ok(CancelRequest::NotFound) => return Requested::Nothing,
        Err(e) => return Requested::Failed(e),
    };
    let event = requested_by.unwrap_or_else(|| {
        AuditEvent::new(
            "task.cancel_requested",
            correlation_id,
            policy.stamp(),
            Decision::Record,
            intent.reason.as_str(),
        )
        .owner(&record.owner)
    });
    app.audit.log(
        event
            .tool(&record.tool)
            .for_task(&app.hasher, &record.id, &record.correlation_id)
            .detail("reason", intent.reason.as_str()),
    );
    if app.replica.remote_home(policy, &recorded).is_some() {
        // Only the task's home replica can reach its server: its outbox sends the cancel
        // (the intent is due at once).
        return Requested::Recorded;
    }
    send().await;
    let pending = PendingCancel {
        record: *recorded,
        intent,
        attempts: 0,
        next_attempt_at: now,
    };
    check(app, policy, correlation_id, &pending).await;
    Requested::Recorded
}

/// Sends the cancel again and checks every intent that is due; ends the ones past their
/// patience as unconfirmed.
pub async fn drive_outbox(app: &AppState, policy: &ActivePolicy, correlation_id: &str) {
    let due = match app.replica.outbox_home(policy) {
        Some(home) => {
            app.ledger
                .cancels_due_for(home, now_ms(), OUTBOX_BATCH)
                .await
        }
        None => app.ledger.cancels_due(now_ms(), OUTBOX_BATCH).await,
    };
    let due = match due {
        Ok(due) => due,
        Err(e) => {
            tracing::error!(error = %e, "reading pending cancellations failed");
            return;
        }
    };
    for pending in due {
        if now_ms() >= pending.intent.give_up_at {
            give_up(app, policy, correlation_id, &pending).await;
            continue;
        }
        let span = task_spans::outbox_cancel(
            pending.intent.trace.as_deref(),
            pending.record.trace.as_deref(),
            pending.intent.reason.as_str(),
        );
        let attempt = async {
            cancel_at_server(
                app,
                correlation_id,
                &pending.record,
                pending.intent.reason.as_str(),
            )
            .await;
            check(app, policy, correlation_id, &pending).await;
        };
        attempt.instrument(span).await;
    }
}

/// Asks the server how the task stands; records the end when it reports one, otherwise
/// schedules the next attempt.
async fn check(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    pending: &PendingCancel,
) {
    let record = &pending.record;
    let reply = ask_state(app, correlation_id, record, "cancel_check").await;
    let end = match reply.as_ref().map(interpret_task_reply) {
        Some(TaskReply::Lost) => end_for_report(record, Report::Lost, now_ms()),
        Some(TaskReply::State(state)) => end_for_report(record, Report::State(&state), now_ms()),
        _ => None,
    };
    if let Some(end) = end {
        settle_terminal(app, policy, correlation_id, record, end).await;
        return;
    }
    let next = next_attempt_at(pending.attempts, now_ms());
    if let Err(e) = app.ledger.note_cancel_attempt(&record.id, next).await {
        tracing::warn!(error = %e, "scheduling a cancellation retry failed");
    }
}

/// Ends a task whose server never confirmed the cancellation: it reads cancelled (or failed,
/// for a deadline) and says the server did not confirm; its quota slot is freed.
async fn give_up(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    pending: &PendingCancel,
) {
    let end = unconfirmed_end(&pending.intent, now_ms());
    let settled = settle_terminal_as(
        app,
        policy,
        correlation_id,
        &pending.record,
        end,
        "task.cancel_unconfirmed",
    )
    .await;
    if settled.is_some_and(|s| s.applied) {
        tracing::warn!(
            attempts = pending.attempts,
            reason = pending.intent.reason.as_str(),
            "the MCP server did not confirm a cancellation; the task ended unconfirmed"
        );
        // One last word to the server, in case it comes back.
        cancel_at_server(app, correlation_id, &pending.record, "cancel_unconfirmed").await;
    }
}
