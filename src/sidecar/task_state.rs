//! Recording what happens to a task: terminal transitions (first terminal write wins, with the
//! metric and audit event each one gets) and changes of an unfinished task's state. Every
//! handler and background job that learns something about a task records it through here.

use std::time::Instant;

use crate::audit::{AuditEvent, Decision};
use crate::ledger::{EndReason, Finish, FinishOutcome, LedgerError, TaskRecord, TaskStatus};
use crate::mcp::task::ReportedState;
use crate::telemetry::metrics::TerminalLabels;

use super::active_policy::ActivePolicy;
use super::decisions::{
    Minimized, Report, end_after_revocation, end_for_report, lifecycle_event,
    may_confirm_unseen_intent, revocation_over, revokes_token,
};
use super::state::AppState;

/// The sidecar's clock: Unix milliseconds.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// Whether `record`'s owner is revoked: the task carries a revocation's cancel, or a
/// revocation in force now covers it (its owner, and the token that started it). Once it is,
/// only the cancellation and its confirmation go to the server on the owner's behalf.
pub fn owner_revoked(app: &AppState, record: &TaskRecord) -> bool {
    record
        .cancel
        .as_ref()
        .is_some_and(|c| c.reason == EndReason::Revocation)
        || app
            .policy()
            .is_some_and(|p| revocation_over(&p.effective.revocations, record).is_some())
}

/// Whether a revocation in force now refuses `identity`'s token (one that was valid when its
/// request was authenticated, and revoked while the request was under way).
pub fn identity_revoked(app: &AppState, identity: &crate::identity::Identity) -> bool {
    app.policy().is_some_and(|p| {
        p.effective
            .revocations
            .iter()
            .any(|r| revokes_token(r, &identity.owner, identity.issued_at))
    })
}

/// A terminal transition as recorded.
pub struct Settled {
    /// The state to report from now on.
    pub record: TaskRecord,
    /// Whether this call ended the task (false: it was already terminal; first write wins).
    pub applied: bool,
}

/// The end a server report gives `record`, if it ends it. A report that may confirm a
/// cancellation the record does not show (a `cancelled` state, a forgotten task) is judged
/// against the record as the ledger holds it now: the cancel was recorded before the server
/// was asked to stop, so the intended end (e.g. "Deadline exceeded") is kept rather than the
/// server's plain "cancelled".
pub async fn end_for_server_report(
    app: &AppState,
    record: &TaskRecord,
    report: Report<'_>,
) -> Option<Finish> {
    if may_confirm_unseen_intent(record, report) {
        match app.ledger.get(&record.id).await {
            Ok(Some(fresh)) => return end_for_report(&fresh, report, now_ms()),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "re-reading a task before recording its end failed")
            }
        }
    }
    end_for_report(record, report, now_ms())
}

/// Records a terminal state; returns the state to report from now on (the earlier terminal
/// state when one was already recorded: first terminal write wins), `None` when the task is
/// gone or the ledger failed (logged: every caller carries on with what it knew).
/// Lifecycle audit events name the task's owner.
pub async fn settle_terminal(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    finish: Finish,
) -> Option<Settled> {
    let event = lifecycle_event(finish.status, finish.ending.reason);
    settle_terminal_as(app, policy, correlation_id, record, finish, event).await
}

/// Fails an unfinished task whose home replica is gone (audited `task.orphaned`).
pub async fn fail_orphaned(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
) -> Option<Settled> {
    let end = super::decisions::home_replica_gone(&record.home, now_ms());
    let settled =
        settle_terminal_as(app, policy, correlation_id, record, end, "task.orphaned").await;
    if settled.as_ref().is_some_and(|s| s.applied) {
        app.metrics.tasks_orphaned.inc();
    }
    settled
}

/// [`settle_terminal`], audited as `event` when it applies.
pub async fn settle_terminal_as(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    finish: Finish,
    event: &'static str,
) -> Option<Settled> {
    try_settle_terminal_as(app, policy, correlation_id, record, finish, event)
        .await
        .unwrap_or(None)
}

/// [`settle_terminal`], with the ledger's failure to record the end returned (after logging
/// it) rather than folded into `None`: `Ok(None)` means the task is not in the ledger, which a
/// caller may tell its owner; a failure must not be told as that.
pub async fn try_settle_terminal(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    finish: Finish,
) -> Result<Option<Settled>, LedgerError> {
    let event = lifecycle_event(finish.status, finish.ending.reason);
    try_settle_terminal_as(app, policy, correlation_id, record, finish, event).await
}

async fn try_settle_terminal_as(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    record: &TaskRecord,
    finish: Finish,
    event: &'static str,
) -> Result<Option<Settled>, LedgerError> {
    // A server's report that lands after the owner was revoked keeps nothing for the owner
    // (the policy in force now, not the one the caller started with, decides).
    let current = app.policy();
    let covering = current
        .as_deref()
        .and_then(|p| revocation_over(&p.effective.revocations, record));
    let reported = finish.ending.reason;
    let finish = end_after_revocation(record, covering, finish, now_ms());
    let event = if finish.ending.reason == reported {
        event
    } else {
        // The server's report became the revocation's end: audited as that end.
        lifecycle_event(finish.status, finish.ending.reason)
    };
    let (finish, minimized) = minimize_result(policy, finish);
    let status = finish.status;
    let reason = finish.ending.reason;
    let ended_by = finish.ending.by.clone().filter(|by| by != &record.owner);
    let outcome = match record_finish(app, record, finish).await {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::error!(error = %e, "recording a terminal task state failed");
            return Err(e);
        }
    };
    let audit = |event: &'static str, why: &'static str| {
        AuditEvent::new(event, correlation_id, policy.stamp(), Decision::Record, why)
            .owner(&record.owner)
            .tool(&record.tool)
            .for_task(&app.hasher, &record.id, &record.correlation_id)
    };
    match outcome {
        FinishOutcome::Applied(after) => {
            let mut line = audit(event, reason.as_str()).detail("endReason", reason.as_str());
            if let Some(ending) = &after.ended {
                line = line.detail("durationMs", ending.at.saturating_sub(after.created_at));
                if let Some(payload) = &ending.payload {
                    line = line.detail("result", crate::audit::summarize(payload));
                }
            }
            if let Some(by) = ended_by {
                line = line.detail("endedBy", serde_json::json!(by));
            }
            if let Some(m) = minimized {
                line = line.detail(
                    "resultMinimized",
                    serde_json::json!({"dropped": m.dropped, "masked": m.masked,
                                       "bytes": m.bytes, "withheld": m.withheld,
                                       "statusOnly": m.status_message.is_some()}),
                );
            }
            app.audit.log(line);
            // Allowed capability requests the client never answered lapse with the task.
            for lapsed in app.gate.end_scope(record.id.as_str()) {
                let base = audit("capability.lapsed", "unanswered");
                if let Some(event) = super::capability::lapsed_event(base, &lapsed, reason.as_str())
                {
                    app.audit.log(event);
                }
            }
            Ok(Some(Settled {
                record: *after,
                applied: true,
            }))
        }
        FinishOutcome::AlreadyTerminal(existing) => {
            // A server reporting a different end than the one recorded breaks terminal
            // immutability: keep the first, audit the second. Races between the sidecar's own
            // ends (deadline, revocation, cancel) are not anomalies.
            if reason == EndReason::Upstream && existing.status != status {
                app.metrics.anomaly("terminal_state_changed");
                app.audit.log(
                    audit("task.anomaly", "terminal_state_changed")
                        .detail("kept", existing.status.as_str())
                        .detail("reported", status.as_str()),
                );
            }
            Ok(Some(Settled {
                record: *existing,
                applied: false,
            }))
        }
        FinishOutcome::NotFound => Ok(None),
    }
}

/// A server-reported end as the policy keeps it (`tasks.results`): its statusMessage and a
/// failed task's error masked, a completed task's result minimized (with what was done to it).
/// Endings the sidecar wrote pass unchanged.
fn minimize_result(policy: &ActivePolicy, mut finish: Finish) -> (Finish, Option<Minimized>) {
    let Some(minimizer) = &policy.results else {
        return (finish, None);
    };
    if finish.ending.reason != EndReason::Upstream {
        return (finish, None);
    }
    if let Some(message) = &mut finish.status_message {
        minimizer.mask_text(message);
    }
    if finish.status != TaskStatus::Completed {
        if let Some(error) = &mut finish.ending.payload {
            minimizer.mask_error(error);
        }
        return (finish, None);
    }
    let Some(result) = finish.ending.payload.take() else {
        return (finish, None);
    };
    let mut minimized = minimizer.minimize(result);
    finish.ending.payload = Some(std::mem::take(&mut minimized.result));
    if let Some(message) = &minimized.status_message {
        finish.status_message = Some(message.clone());
    }
    (finish, Some(minimized))
}

/// The ledger write of a terminal transition, timed, and counted when it applied.
async fn record_finish(
    app: &AppState,
    record: &TaskRecord,
    finish: Finish,
) -> Result<FinishOutcome, LedgerError> {
    let labels = TerminalLabels {
        status: finish.status.as_str(),
        reason: finish.ending.reason.as_str(),
    };
    let started = Instant::now();
    let outcome = app.ledger.finish(&record.id, finish).await;
    app.replica.forget_home(&record.id);
    app.metrics
        .ledger_write_seconds
        .observe(started.elapsed().as_secs_f64());
    if let Ok(FinishOutcome::Applied(_)) = &outcome {
        app.metrics.tasks_terminal.get_or_create(&labels).inc();
    }
    outcome
}

/// Records a non-terminal state the server reported, when it differs from the ledger's: only a
/// changed status is worth a (durable) ledger write. A failed write is logged: the state is
/// only a cache of the server's.
/// The statusMessage is stored as the policy in force masks it (`tasks.results`).
pub async fn observe_if_changed(app: &AppState, record: &TaskRecord, state: &ReportedState) {
    let mut message = state.status_message.clone();
    if let (Some(text), Some(policy)) = (&mut message, app.policy())
        && let Some(minimizer) = &policy.results
    {
        minimizer.mask_text(text);
    }
    if state.status == record.status && message == record.status_message {
        return;
    }
    let written = app
        .ledger
        .observe(&record.id, state.status, message, now_ms())
        .await;
    app.replica.forget_home(&record.id);
    if let Err(e) = written {
        tracing::warn!(error = %e, "caching a task status failed");
    }
}
