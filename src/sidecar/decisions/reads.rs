//! Reading a task: whether to ask the server or answer from the ledger, how the ledger's view
//! is presented, and who gets a read-once result.

use crate::ledger::TaskRecord;
use crate::mcp::task::TaskView;
use crate::model::TaskStatus;

/// Where the answer to a `tasks/get` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPlan {
    /// The ledger alone: the task is terminal (its end is recorded and immutable), or it is
    /// working and was asked about less than `minPollInterval` ago.
    FromLedger,
    /// Ask the server for the current state.
    AskServer,
}

/// Decides where a read of `record` is answered from. `last_asked_ms` is when the server was
/// last asked about the task (the in-memory poll clock), if known.
pub fn plan_read(
    record: &TaskRecord,
    last_asked_ms: Option<i64>,
    now_ms: i64,
    min_poll_ms: i64,
) -> ReadPlan {
    if record.status.is_terminal() {
        return ReadPlan::FromLedger;
    }
    // Not for input_required: its outstanding input requests are not cached.
    let last_learned =
        last_asked_ms.map_or(record.last_updated_at, |t| t.max(record.last_updated_at));
    if record.status == TaskStatus::Working && now_ms - last_learned < min_poll_ms {
        ReadPlan::FromLedger
    } else {
        ReadPlan::AskServer
    }
}

/// The ledger's view of a task as a policy with `min_poll_ms` presents it: the poll interval
/// is never below the policy's floor.
pub fn task_view(record: &TaskRecord, min_poll_ms: i64) -> TaskView<'_> {
    TaskView {
        task_id: record.id.as_str(),
        status: record.status,
        status_message: record.status_message.as_deref(),
        created_at: record.created_at,
        last_updated_at: record.last_updated_at,
        ttl_ms: record.ttl_ms,
        poll_interval_ms: record
            .poll_interval_ms
            .unwrap_or(min_poll_ms)
            .max(min_poll_ms),
    }
}

/// Whether the read that was counted as the `reads`-th gets the completed result. Under
/// read-once only the first counted read does, even when two reads race.
pub fn deliver_result(read_once: bool, reads: u32) -> bool {
    !(read_once && reads > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: TaskStatus, last_updated_at: i64) -> TaskRecord {
        let owner = crate::model::Owner {
            issuer: "i".into(),
            subject: "s".into(),
            tenant: String::new(),
            client: String::new(),
        };
        TaskRecord {
            status,
            last_updated_at,
            ..crate::sidecar::decisions::test_task(owner)
        }
    }

    #[test]
    fn terminal_tasks_are_always_answered_from_the_ledger() {
        for status in [
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Cancelled,
        ] {
            assert_eq!(
                plan_read(&record(status, 0), None, 1_000_000, 0),
                ReadPlan::FromLedger
            );
        }
    }

    #[test]
    fn working_tasks_polled_too_fast_are_answered_from_the_ledger() {
        let r = record(TaskStatus::Working, 1_000);
        assert_eq!(plan_read(&r, None, 2_000, 2_000), ReadPlan::FromLedger);
        assert_eq!(plan_read(&r, None, 3_000, 2_000), ReadPlan::AskServer);
        // The poll clock counts when it is later than the ledger's last update.
        assert_eq!(
            plan_read(&r, Some(2_500), 4_000, 2_000),
            ReadPlan::FromLedger
        );
        assert_eq!(plan_read(&r, Some(500), 3_000, 2_000), ReadPlan::AskServer);
        // Without a floor every poll asks.
        assert_eq!(plan_read(&r, Some(1_000), 1_000, 0), ReadPlan::AskServer);
    }

    #[test]
    fn input_required_tasks_always_ask_the_server() {
        let r = record(TaskStatus::InputRequired, 1_000);
        assert_eq!(
            plan_read(&r, Some(1_000), 1_001, 60_000),
            ReadPlan::AskServer
        );
    }

    #[test]
    fn the_view_never_polls_faster_than_the_policy() {
        let mut r = record(TaskStatus::Working, 0);
        assert_eq!(task_view(&r, 2_000).poll_interval_ms, 2_000);
        r.poll_interval_ms = Some(500);
        assert_eq!(task_view(&r, 2_000).poll_interval_ms, 2_000);
        r.poll_interval_ms = Some(5_000);
        assert_eq!(task_view(&r, 2_000).poll_interval_ms, 5_000);
    }

    #[test]
    fn read_once_results_go_to_the_first_read_only() {
        assert!(deliver_result(true, 1));
        assert!(!deliver_result(true, 2));
        assert!(deliver_result(false, 7));
    }
}
