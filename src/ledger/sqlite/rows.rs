//! How a task row is selected and read back: the columns every task query selects, the raw row
//! as SQLite returns it, and its parsing into a [`TaskRecord`] (where a corrupt row is found).

use rusqlite::{Connection, OptionalExtension, Row};

use super::Ctx;

use crate::ledger::{
    CancelIntent, EndReason, Ending, LedgerError, Owner, Result, TaskId, TaskRecord, TaskStatus,
    stored_binding,
};

/// A task's columns (`t`) and its pending cancellation intent's (`c`, all NULL without one), in
/// the order [`RawTask::from_row`] reads them. Select them `FROM` [`TASK_FROM`], or from any
/// join that names the two tables `t` and `c`.
pub(super) const TASK_COLUMNS: &str = "t.id, t.upstream_id, t.issuer, t.subject, t.tenant, t.client, \
    t.tool, t.scopes, t.status, t.status_message, t.created_at, t.last_updated_at, t.ttl_ms, \
    t.deadline_at, t.poll_interval_ms, t.end_reason, t.ended_by, t.payload, t.ended_at, \
    t.result_reads, t.token_issued_at, t.home, t.correlation_id, t.object, \
    t.lease_until, t.delegated_until, t.trace, t.key_binding, c.reason, c.requested_by, \
    c.pending_message, c.requested_at, c.give_up_at, c.trace";

/// How many columns [`TASK_COLUMNS`] has; columns selected after them start here.
pub(super) const TASK_COLUMN_COUNT: usize = 34;

/// Every task with its intent, if any.
pub(super) const TASK_FROM: &str = "tasks AS t LEFT JOIN cancel_intents AS c ON c.task_id = t.id";

/// A confirmed row as SQLite returns it, before the parsing that can find it corrupt.
pub(super) struct RawTask {
    id: String,
    upstream_id: Option<String>,
    owner: Owner,
    tool: String,
    scopes: String,
    status: Option<String>,
    status_message: Option<String>,
    created_at: Option<i64>,
    last_updated_at: Option<i64>,
    ttl_ms: Option<i64>,
    deadline_at: Option<i64>,
    poll_interval_ms: Option<i64>,
    end_reason: Option<String>,
    ended_by: Option<String>,
    payload: Option<String>,
    ended_at: Option<i64>,
    result_reads: i64,
    token_issued_at: Option<i64>,
    home: String,
    correlation_id: String,
    object: Option<String>,
    lease_until: Option<i64>,
    delegated_until: Option<i64>,
    trace: Option<String>,
    key_binding: Option<String>,
    cancel_reason: Option<String>,
    cancel_by: Option<String>,
    cancel_message: Option<String>,
    cancel_requested_at: Option<i64>,
    cancel_give_up_at: Option<i64>,
    cancel_trace: Option<String>,
}

impl RawTask {
    pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            upstream_id: row.get(1)?,
            owner: Owner {
                issuer: row.get(2)?,
                subject: row.get(3)?,
                tenant: row.get(4)?,
                client: row.get(5)?,
            },
            tool: row.get(6)?,
            scopes: row.get(7)?,
            status: row.get(8)?,
            status_message: row.get(9)?,
            created_at: row.get(10)?,
            last_updated_at: row.get(11)?,
            ttl_ms: row.get(12)?,
            deadline_at: row.get(13)?,
            poll_interval_ms: row.get(14)?,
            end_reason: row.get(15)?,
            ended_by: row.get(16)?,
            payload: row.get(17)?,
            ended_at: row.get(18)?,
            result_reads: row.get(19)?,
            token_issued_at: row.get(20)?,
            home: row.get(21)?,
            correlation_id: row.get(22)?,
            object: row.get(23)?,
            lease_until: row.get(24)?,
            delegated_until: row.get(25)?,
            trace: row.get(26)?,
            key_binding: row.get(27)?,
            cancel_reason: row.get(28)?,
            cancel_by: row.get(29)?,
            cancel_message: row.get(30)?,
            cancel_requested_at: row.get(31)?,
            cancel_give_up_at: row.get(32)?,
            cancel_trace: row.get(33)?,
        })
    }

    pub(super) fn into_record(self) -> Result<TaskRecord> {
        fn need<T>(value: Option<T>, column: &str) -> Result<T> {
            value.ok_or_else(|| LedgerError::corrupt(format!("confirmed task without {column}")))
        }
        fn json<T: serde::de::DeserializeOwned>(text: &str, column: &str) -> Result<T> {
            serde_json::from_str(text)
                .map_err(|e| LedgerError::corrupt_because(format!("task {column} is not valid"), e))
        }
        let status_text = need(self.status, "status")?;
        let status = TaskStatus::parse(&status_text)
            .ok_or_else(|| LedgerError::corrupt(format!("unknown task status {status_text:?}")))?;
        let ended = match (self.ended_at, self.end_reason) {
            (None, None) => None,
            (Some(at), Some(reason)) => Some(Ending {
                reason: EndReason::parse(&reason).ok_or_else(|| {
                    LedgerError::corrupt(format!("unknown end reason {reason:?}"))
                })?,
                by: self
                    .ended_by
                    .as_deref()
                    .map(|t| json(t, "ended_by"))
                    .transpose()?,
                payload: self
                    .payload
                    .as_deref()
                    .map(|t| json(t, "payload"))
                    .transpose()?,
                at,
            }),
            _ => return Err(LedgerError::corrupt("half-recorded task ending")),
        };
        let cancel = match self.cancel_reason {
            None => None,
            Some(reason) => Some(CancelIntent {
                reason: EndReason::parse(&reason)
                    .filter(|r| r.is_cancellation())
                    .ok_or_else(|| {
                        LedgerError::corrupt(format!("unknown cancellation reason {reason:?}"))
                    })?,
                by: self
                    .cancel_by
                    .as_deref()
                    .map(|t| json(t, "cancellation requested_by"))
                    .transpose()?,
                pending_message: need(self.cancel_message, "cancellation pending_message")?,
                requested_at: need(self.cancel_requested_at, "cancellation requested_at")?,
                give_up_at: need(self.cancel_give_up_at, "cancellation give_up_at")?,
                trace: self.cancel_trace,
            }),
        };
        Ok(TaskRecord {
            id: TaskId::from_string(self.id),
            upstream_id: need(self.upstream_id, "upstream_id")?,
            owner: self.owner,
            tool: self.tool,
            scopes: json(&self.scopes, "scopes")?,
            status,
            status_message: self.status_message,
            created_at: need(self.created_at, "created_at")?,
            last_updated_at: need(self.last_updated_at, "last_updated_at")?,
            ttl_ms: need(self.ttl_ms, "ttl_ms")?,
            deadline_at: need(self.deadline_at, "deadline_at")?,
            poll_interval_ms: self.poll_interval_ms,
            ended,
            result_reads: u32::try_from(self.result_reads)
                .map_err(|_| LedgerError::corrupt("result_reads out of range"))?,
            token_issued_at: self.token_issued_at,
            home: self.home,
            correlation_id: self.correlation_id,
            object: self.object,
            lease_until: self.lease_until,
            delegated_until: self.delegated_until,
            trace: self.trace,
            binding: stored_binding(self.key_binding)?,
            cancel,
        })
    }
}

/// [`RawTask::from_row`] as a function, for `query_map`.
pub(super) fn raw_task(row: &Row<'_>) -> rusqlite::Result<RawTask> {
    RawTask::from_row(row)
}

/// SQLite's LIMIT is signed; anything beyond `i64::MAX` means "no limit" anyway.
pub(super) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

pub(super) fn collect(
    rows: impl Iterator<Item = rusqlite::Result<RawTask>>,
) -> Result<Vec<TaskRecord>> {
    rows.map(|raw| raw.ctx("read task row")?.into_record())
        .collect()
}

/// A confirmed task; reservations are invisible.
/// [`TASK_COLUMNS`] with the intent's columns left NULL, for reads of `tasks` alone.
const TASK_ONLY_COLUMNS: &str = "t.id, t.upstream_id, t.issuer, t.subject, t.tenant, t.client, \
    t.tool, t.scopes, t.status, t.status_message, t.created_at, t.last_updated_at, t.ttl_ms, \
    t.deadline_at, t.poll_interval_ms, t.end_reason, t.ended_by, t.payload, t.ended_at, \
    t.result_reads, t.token_issued_at, t.home, t.correlation_id, t.object, \
    t.lease_until, t.delegated_until, t.trace, t.key_binding, NULL, NULL, NULL, NULL, NULL, \
    NULL";

/// One task by ID, the read of every `tasks/get`. Two primary-key lookups rather than the
/// join of [`TASK_FROM`]: SQLite re-prepared the joined statement at every call (30 µs a read
/// instead of 4 µs, `examples/ledger_read_bench.rs`).
pub(super) fn load_task(conn: &Connection, id: &str) -> Result<Option<TaskRecord>> {
    let sql =
        format!("SELECT {TASK_ONLY_COLUMNS} FROM tasks AS t WHERE t.id = ?1 AND t.confirmed = 1");
    let raw = conn
        .prepare_cached(&sql)
        .ctx("prepare task lookup")?
        .query_row([id], RawTask::from_row)
        .optional()
        .ctx("look up task")?;
    let Some(mut raw) = raw else {
        return Ok(None);
    };
    let intent = conn
        .prepare_cached(
            "SELECT reason, requested_by, pending_message, requested_at, give_up_at, trace \
             FROM cancel_intents WHERE task_id = ?1",
        )
        .ctx("prepare intent lookup")?
        .query_row([id], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
                row.get(5)?,
            ))
        })
        .optional()
        .ctx("look up intent")?;
    if let Some((reason, by, message, requested_at, give_up_at, trace)) = intent {
        raw.cancel_reason = Some(reason);
        raw.cancel_by = by;
        raw.cancel_message = Some(message);
        raw.cancel_requested_at = Some(requested_at);
        raw.cancel_give_up_at = Some(give_up_at);
        raw.cancel_trace = trace;
    }
    raw.into_record().map(Some)
}
