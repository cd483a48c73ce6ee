//! Cancellation that tells the truth: a cancel (by the owner, an administrator, the deadline or
//! a revocation) is recorded as an intent, and the task ends only when the server confirms it
//! stopped (or reports how it ended), or when the sidecar stops waiting and says so.

use std::time::Duration;

use crate::ledger::{CancelIntent, EndReason, Ending, Finish, TaskRecord, TaskStatus};
use crate::mcp::task::ReportedState;

use super::endings::upstream_end;

/// Appended to the intended end's message while the server has not confirmed.
pub const AWAITING_CONFIRMATION: &str =
    " (cancellation requested; waiting for the MCP server to confirm it stopped)";
/// Appended to the intended end's message when the server never confirmed.
pub const NOT_CONFIRMED: &str = " (the MCP server did not confirm that it stopped)";

/// The intent to end a task as `end` says (one of the sidecar's cancellations), waiting for
/// the server until `give_up_at`.
pub fn intent_for(end: &Finish, requested_at: i64, give_up_at: i64) -> CancelIntent {
    CancelIntent {
        reason: end.ending.reason,
        by: end.ending.by.clone(),
        pending_message: format!(
            "{}{AWAITING_CONFIRMATION}",
            end.status_message.as_deref().unwrap_or("Cancelled")
        ),
        requested_at,
        give_up_at: give_up_at.max(requested_at),
        trace: None,
    }
}

/// The end the intent asked for.
pub(super) fn intended_end(intent: &CancelIntent, now_ms: i64, suffix: &str) -> Finish {
    let message = intent
        .pending_message
        .strip_suffix(AWAITING_CONFIRMATION)
        .unwrap_or(&intent.pending_message);
    let deadline = intent.reason == EndReason::Deadline;
    Finish {
        status: if deadline {
            TaskStatus::Failed
        } else {
            TaskStatus::Cancelled
        },
        status_message: Some(format!("{message}{suffix}")),
        ending: Ending {
            reason: intent.reason,
            by: intent.by.clone(),
            payload: deadline.then(super::endings::deadline_error),
            at: now_ms,
        },
    }
}

/// What the server said about a task whose cancellation is pending.
#[derive(Clone, Copy, Debug)]
pub enum Report<'a> {
    /// It no longer knows the task: it is not running.
    Lost,
    State(&'a ReportedState),
}

/// The end to record for a server report about `record`, if the report ends it. With a
/// pending cancellation, a report of `cancelled` (or a forgotten task) confirms the intended
/// end; `completed` or `failed` means the work ended on its own first, and that is what is
/// recorded. Without one, a terminal report is recorded as the server's.
pub fn end_for_report(record: &TaskRecord, report: Report<'_>, now_ms: i64) -> Option<Finish> {
    match (&record.cancel, report) {
        (Some(intent), Report::Lost) => Some(intended_end(intent, now_ms, "")),
        (Some(intent), Report::State(s)) if s.status == TaskStatus::Cancelled => {
            Some(intended_end(intent, now_ms, ""))
        }
        (_, Report::State(s)) => upstream_end(s, now_ms),
        (None, Report::Lost) => Some(super::endings::upstream_lost(now_ms)),
    }
}

/// Whether `report` could be the server confirming a cancellation that `record` (as read
/// before the server was asked) does not show yet: a cancel recorded meanwhile (by another
/// request, the deadline sweep or another replica) is committed before the server is asked to
/// stop, so a record read again after this report shows it.
pub fn may_confirm_unseen_intent(record: &TaskRecord, report: Report<'_>) -> bool {
    record.cancel.is_none()
        && match report {
            Report::Lost => true,
            Report::State(s) => s.status == TaskStatus::Cancelled,
        }
}

/// The end of a task whose server never confirmed its cancellation before `give_up_at`.
pub fn unconfirmed_end(intent: &CancelIntent, now_ms: i64) -> Finish {
    intended_end(intent, now_ms, NOT_CONFIRMED)
}

/// When to ask the server again after `attempts` attempts: 1 s, doubling, at most 15 s.
pub fn next_attempt_at(attempts: u32, now_ms: i64) -> i64 {
    let delay = Duration::from_secs(1) * 2u32.saturating_pow(attempts.min(4));
    now_ms + (delay.min(Duration::from_secs(15)).as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::Owner;

    fn owner() -> Owner {
        Owner {
            issuer: "i".into(),
            subject: "alice".into(),
            tenant: "t".into(),
            client: "c".into(),
        }
    }

    fn record(cancel: Option<CancelIntent>) -> TaskRecord {
        TaskRecord {
            cancel,
            ..crate::sidecar::decisions::test_task(owner())
        }
    }

    fn owner_cancel() -> Finish {
        Finish {
            status: TaskStatus::Cancelled,
            status_message: Some("Cancelled by its owner".into()),
            ending: Ending {
                reason: EndReason::OwnerCancel,
                by: Some(owner()),
                payload: None,
                at: 1,
            },
        }
    }

    fn state(status: TaskStatus) -> ReportedState {
        ReportedState {
            status,
            status_message: Some("server says".into()),
            input_keys: vec![],
            payload: Some(json!({"content": []})),
        }
    }

    #[test]
    fn the_intent_says_it_waits_and_the_confirmation_restores_the_end() {
        let intent = intent_for(&owner_cancel(), 10, 70);
        assert_eq!(
            intent.pending_message,
            format!("Cancelled by its owner{AWAITING_CONFIRMATION}")
        );
        let r = record(Some(intent.clone()));
        let confirmed = end_for_report(&r, Report::State(&state(TaskStatus::Cancelled)), 20)
            .expect("cancelled confirms");
        assert_eq!(confirmed.status, TaskStatus::Cancelled);
        assert_eq!(
            confirmed.status_message.as_deref(),
            Some("Cancelled by its owner")
        );
        assert_eq!(confirmed.ending.reason, EndReason::OwnerCancel);
        assert_eq!(confirmed.ending.by, Some(owner()));
        let lost = end_for_report(&r, Report::Lost, 20).expect("a forgotten task is not running");
        assert_eq!(lost.ending.reason, EndReason::OwnerCancel);
    }

    #[test]
    fn work_that_ended_first_is_recorded_as_it_ended() {
        let r = record(Some(intent_for(&owner_cancel(), 10, 70)));
        let done = end_for_report(&r, Report::State(&state(TaskStatus::Completed)), 20).unwrap();
        assert_eq!(done.status, TaskStatus::Completed);
        assert_eq!(done.ending.reason, EndReason::Upstream);
        assert!(end_for_report(&r, Report::State(&state(TaskStatus::Working)), 20).is_none());
    }

    #[test]
    fn without_an_intent_reports_are_the_servers() {
        let r = record(None);
        let cancelled =
            end_for_report(&r, Report::State(&state(TaskStatus::Cancelled)), 5).unwrap();
        assert_eq!(cancelled.ending.reason, EndReason::Upstream);
        assert_eq!(
            end_for_report(&r, Report::Lost, 5).unwrap().ending.reason,
            EndReason::UpstreamLost
        );
    }

    #[test]
    fn deadlines_fail_and_unconfirmed_ends_say_so() {
        let deadline = Finish {
            status: TaskStatus::Failed,
            status_message: Some("Deadline exceeded: limit 1s".into()),
            ending: Ending {
                reason: EndReason::Deadline,
                by: None,
                payload: None,
                at: 1,
            },
        };
        let intent = intent_for(&deadline, 10, 5);
        assert_eq!(intent.give_up_at, 10, "never before the request");
        let end = unconfirmed_end(&intent, 99);
        assert_eq!(end.status, TaskStatus::Failed);
        assert_eq!(
            end.status_message.as_deref(),
            Some(format!("Deadline exceeded: limit 1s{NOT_CONFIRMED}").as_str())
        );
        assert_eq!(
            end.ending.payload.as_ref().unwrap()["message"],
            "Deadline exceeded"
        );
        assert_eq!(
            end.ending.payload.as_ref().unwrap()["data"],
            serde_json::json!({"reason": "deadline", "remediation": "none"})
        );
    }

    #[test]
    fn only_reports_that_could_confirm_a_cancel_send_the_caller_back_to_the_ledger() {
        let bare = record(None);
        assert!(may_confirm_unseen_intent(&bare, Report::Lost));
        assert!(may_confirm_unseen_intent(
            &bare,
            Report::State(&state(TaskStatus::Cancelled))
        ));
        for status in [
            TaskStatus::Working,
            TaskStatus::InputRequired,
            TaskStatus::Completed,
            TaskStatus::Failed,
        ] {
            assert!(!may_confirm_unseen_intent(
                &bare,
                Report::State(&state(status))
            ));
        }
        // An intent already seen is what end_for_report confirms: no second read.
        let pending = record(Some(intent_for(&owner_cancel(), 10, 70)));
        assert!(!may_confirm_unseen_intent(&pending, Report::Lost));
    }

    #[test]
    fn retries_back_off_to_fifteen_seconds() {
        assert_eq!(next_attempt_at(0, 0), 1_000);
        assert_eq!(next_attempt_at(1, 0), 2_000);
        assert_eq!(next_attempt_at(3, 0), 8_000);
        assert_eq!(next_attempt_at(4, 0), 15_000);
        assert_eq!(next_attempt_at(40, 0), 15_000);
    }
}
