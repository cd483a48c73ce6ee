//! The terms a task is recorded under when the server creates it: retention, deadline and
//! poll interval, bounded by the policy whatever the server asked for.

use std::time::Duration;

use crate::ledger::Confirmation;
use crate::mcp::task::CreatedTask;
use crate::model::TaskStatus;
use crate::policy::TaskRules;

/// What the ledger records for a task the server just created, and what the client is told.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfirmationTerms {
    pub confirmation: Confirmation,
    /// The poll interval the client is told: the server's, never below the policy's floor.
    pub poll_interval_ms: i64,
}

/// The terms of a task `tool` the server created (`created`), requested at `started_ms` and
/// confirmed at `now_ms`.
pub fn confirmation_terms(
    created: &CreatedTask,
    rules: &TaskRules,
    min_poll_ms: i64,
    tool: &str,
    started_ms: i64,
    now_ms: i64,
) -> ConfirmationTerms {
    let ttl = rules.effective_ttl(
        created
            .ttl_ms
            .map(|ms| Duration::from_millis(ms.max(0) as u64)),
    );
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let deadline_ms = i64::try_from(rules.deadline_for(tool).as_millis()).unwrap_or(i64::MAX);
    let poll_interval_ms = created.poll_interval_ms.unwrap_or(0).max(min_poll_ms);
    // A task is born non-terminal; a terminal status here is reconciled on the first read.
    let status = if created.status.is_terminal() {
        TaskStatus::Working
    } else {
        created.status
    };
    ConfirmationTerms {
        confirmation: Confirmation {
            upstream_id: created.upstream_id.clone(),
            status,
            status_message: created.status_message.clone(),
            created_at: now_ms,
            ttl_ms,
            // A task cannot outlive its retention: past its TTL nobody could read it anyway.
            deadline_at: started_ms
                .saturating_add(deadline_ms)
                .min(now_ms.saturating_add(ttl_ms)),
            poll_interval_ms: Some(poll_interval_ms),
        },
        poll_interval_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> TaskRules {
        crate::policy::testing::with_tasks(
            "    enabled: true\n    retention: {defaultTtl: 10m, maxTtl: 1h}\n    deadline: {default: 30m, max: 2h}\n",
        )
        .tasks
        .expect("tasks")
    }

    fn created(ttl_ms: Option<i64>, poll: Option<i64>, status: TaskStatus) -> CreatedTask {
        CreatedTask {
            upstream_id: "up-1".into(),
            status,
            status_message: None,
            ttl_ms,
            poll_interval_ms: poll,
        }
    }

    const MIN: i64 = 60_000;

    #[test]
    fn retention_is_the_servers_within_the_policys_maximum() {
        let r = rules();
        let t = confirmation_terms(&created(None, None, TaskStatus::Working), &r, 0, "x", 0, 0);
        assert_eq!(t.confirmation.ttl_ms, 10 * MIN, "default TTL");
        let t = confirmation_terms(
            &created(Some(5 * MIN), None, TaskStatus::Working),
            &r,
            0,
            "x",
            0,
            0,
        );
        assert_eq!(t.confirmation.ttl_ms, 5 * MIN);
        let t = confirmation_terms(
            &created(Some(600 * MIN), None, TaskStatus::Working),
            &r,
            0,
            "x",
            0,
            0,
        );
        assert_eq!(t.confirmation.ttl_ms, 60 * MIN, "clamped to maxTtl");
    }

    #[test]
    fn the_deadline_runs_from_the_request_and_never_outlives_retention() {
        let r = rules();
        let t = confirmation_terms(
            &created(Some(60 * MIN), None, TaskStatus::Working),
            &r,
            0,
            "x",
            1_000,
            3_000,
        );
        assert_eq!(t.confirmation.deadline_at, 1_000 + 30 * MIN);
        assert_eq!(t.confirmation.created_at, 3_000);
        let short = confirmation_terms(
            &created(Some(MIN), None, TaskStatus::Working),
            &r,
            0,
            "x",
            1_000,
            3_000,
        );
        assert_eq!(short.confirmation.deadline_at, 3_000 + MIN);
    }

    #[test]
    fn poll_interval_has_the_policys_floor_and_status_starts_unfinished() {
        let r = rules();
        let t = confirmation_terms(
            &created(None, Some(100), TaskStatus::Completed),
            &r,
            2_000,
            "x",
            0,
            0,
        );
        assert_eq!(t.poll_interval_ms, 2_000);
        assert_eq!(t.confirmation.poll_interval_ms, Some(2_000));
        assert_eq!(t.confirmation.status, TaskStatus::Working);
        let t = confirmation_terms(
            &created(None, Some(9_000), TaskStatus::InputRequired),
            &r,
            2_000,
            "x",
            0,
            0,
        );
        assert_eq!(t.poll_interval_ms, 9_000);
        assert_eq!(t.confirmation.status, TaskStatus::InputRequired);
    }
}
