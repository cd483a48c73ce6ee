//! Running the ledger's statements and reading their rows: cached statements, task rows,
//! settlement notifications, and what a failed statement's SQLSTATE was.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::Ctx;
use crate::ledger::{
    CancelIntent, EndReason, Ending, LedgerError, Owner, Result, TaskId, TaskRecord, TaskStatus,
    stored_binding,
};

/// A task's columns (`t`) and its pending intent's (`c`, all NULL without one), in the order
/// [`record`] reads them; select them from [`task_from!`].
macro_rules! task_columns {
    () => {
        "t.id, t.upstream_id, t.issuer, t.subject, t.tenant, t.client, t.tool, t.scopes, \
         t.status, t.status_message, t.created_at, t.last_updated_at, t.ttl_ms, t.deadline_at, \
         t.poll_interval_ms, t.end_reason, t.ended_by, t.payload, t.ended_at, t.result_reads, \
         t.token_issued_at, t.home, t.correlation_id, t.object, c.reason, c.requested_by, \
         c.pending_message, c.requested_at, c.give_up_at, t.lease_until, t.delegated_until, \
         t.trace, c.trace, t.key_binding"
    };
}
pub(super) use task_columns;

/// Every task with its intent, if any.
macro_rules! task_from {
    () => {
        "lifeguard_tasks AS t LEFT JOIN lifeguard_cancel_intents AS c \
         ON c.server = t.server AND c.task_id = t.id"
    };
}
pub(super) use task_from;

/// How many columns [`task_columns!`] has; columns selected after them start here.
pub(super) const TASK_COLUMN_COUNT: usize = 34;

pub(super) type Params<'a> = [&'a (dyn ToSql + Sync)];

/// `sql` prepared on `c` (cached per connection), for a pipeline: prepare every statement of a
/// pipeline before sending any of it. A statement prepared on the way would wait for its Parse
/// while the ones after it are sent, and run before it.
///
/// A pipeline is several statements of one transaction sent without waiting for each answer
/// (`futures_util::future::join*`, which polls its futures in order, so they are sent in
/// order); PostgreSQL runs them one after the other, and in READ COMMITTED each sees what was
/// committed before it started. One round trip instead of one each.
pub(super) async fn prepared<C: GenericClient>(
    c: &C,
    sql: &str,
    what: &str,
) -> Result<tokio_postgres::Statement> {
    c.prepare_cached(sql).await.ctx(what)
}

/// Runs a cached statement; returns its rows.
pub(super) async fn rows<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &Params<'_>,
    what: &str,
) -> Result<Vec<Row>> {
    let stmt = c.prepare_cached(sql).await.ctx(what)?;
    c.query(&stmt, params).await.ctx(what)
}

/// Runs a cached statement that returns at most one row.
pub(super) async fn opt_row<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &Params<'_>,
    what: &str,
) -> Result<Option<Row>> {
    let stmt = c.prepare_cached(sql).await.ctx(what)?;
    c.query_opt(&stmt, params).await.ctx(what)
}

/// Runs a cached statement that returns exactly one row.
pub(super) async fn one_row<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &Params<'_>,
    what: &str,
) -> Result<Row> {
    let stmt = c.prepare_cached(sql).await.ctx(what)?;
    c.query_one(&stmt, params).await.ctx(what)
}

/// Runs a cached statement; returns how many rows it changed.
pub(super) async fn exec<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &Params<'_>,
    what: &str,
) -> Result<u64> {
    let stmt = c.prepare_cached(sql).await.ctx(what)?;
    c.execute(&stmt, params).await.ctx(what)
}

/// Column `i` of `row`, or `Corrupt` when it does not decode.
pub(super) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i)
        .map_err(|e| LedgerError::corrupt_because(format!("task column {i}"), e))
}

fn json<T: serde::de::DeserializeOwned>(text: &str, column: &str) -> Result<T> {
    serde_json::from_str(text)
        .map_err(|e| LedgerError::corrupt_because(format!("task {column} is not valid"), e))
}

pub(super) fn to_json<T: serde::Serialize + ?Sized>(value: &T, what: &str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| LedgerError::storage(format!("encode {what}"), e))
}

/// A confirmed task from a row of [`task_columns!`].
pub(super) fn record(row: &Row) -> Result<TaskRecord> {
    fn need<T>(value: Option<T>, column: &str) -> Result<T> {
        value.ok_or_else(|| LedgerError::corrupt(format!("confirmed task without {column}")))
    }
    let status_text: String = need(col(row, 8)?, "status")?;
    let status = TaskStatus::parse(&status_text)
        .ok_or_else(|| LedgerError::corrupt(format!("unknown task status {status_text:?}")))?;
    let ended = match (
        col::<Option<i64>>(row, 18)?,
        col::<Option<String>>(row, 15)?,
    ) {
        (None, None) => None,
        (Some(at), Some(reason)) => Some(Ending {
            reason: EndReason::parse(&reason)
                .ok_or_else(|| LedgerError::corrupt(format!("unknown end reason {reason:?}")))?,
            by: col::<Option<String>>(row, 16)?
                .map(|t| json(&t, "ended_by"))
                .transpose()?,
            payload: col::<Option<String>>(row, 17)?
                .map(|t| json(&t, "payload"))
                .transpose()?,
            at,
        }),
        _ => return Err(LedgerError::corrupt("half-recorded task ending")),
    };
    let cancel = match col::<Option<String>>(row, 24)? {
        None => None,
        Some(reason) => Some(CancelIntent {
            reason: EndReason::parse(&reason)
                .filter(|r| r.is_cancellation())
                .ok_or_else(|| {
                    LedgerError::corrupt(format!("unknown cancellation reason {reason:?}"))
                })?,
            by: col::<Option<String>>(row, 25)?
                .map(|t| json(&t, "cancellation requested_by"))
                .transpose()?,
            pending_message: need(col(row, 26)?, "cancellation pending_message")?,
            requested_at: need(col(row, 27)?, "cancellation requested_at")?,
            give_up_at: need(col(row, 28)?, "cancellation give_up_at")?,
            trace: col(row, 32)?,
        }),
    };
    Ok(TaskRecord {
        id: TaskId::from_string(col::<String>(row, 0)?),
        upstream_id: need(col(row, 1)?, "upstream_id")?,
        owner: Owner {
            issuer: col(row, 2)?,
            subject: col(row, 3)?,
            tenant: col(row, 4)?,
            client: col(row, 5)?,
        },
        tool: col(row, 6)?,
        scopes: json(&col::<String>(row, 7)?, "scopes")?,
        status,
        status_message: col(row, 9)?,
        created_at: need(col(row, 10)?, "created_at")?,
        last_updated_at: need(col(row, 11)?, "last_updated_at")?,
        ttl_ms: need(col(row, 12)?, "ttl_ms")?,
        deadline_at: need(col(row, 13)?, "deadline_at")?,
        poll_interval_ms: col(row, 14)?,
        ended,
        result_reads: u32::try_from(col::<i64>(row, 19)?)
            .map_err(|_| LedgerError::corrupt("result_reads out of range"))?,
        token_issued_at: col(row, 20)?,
        home: col(row, 21)?,
        correlation_id: col(row, 22)?,
        object: col(row, 23)?,
        lease_until: col(row, 29)?,
        delegated_until: col(row, 30)?,
        trace: col(row, 31)?,
        binding: stored_binding(col(row, 33)?)?,
        cancel,
    })
}

pub(super) fn records(rows: &[Row]) -> Result<Vec<TaskRecord>> {
    rows.iter().map(record).collect()
}

/// LIMIT is a signed 64-bit number; anything beyond `i64::MAX` means "no limit" anyway.
pub(super) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Sends the settlement of reservations `ids` to every listening ledger instance (delivered
/// when the transaction commits).
/// Announces settled reservations: one notification per ID (`$2`, a text array), `server \n
/// id`, on the channel every listener LISTENs to.
pub(super) const NOTIFY_SETTLED: &str = "SELECT pg_notify('lifeguard_settled', \
    $1::text || E'\\n' || id) FROM unnest($2::text[]) AS id";

pub(super) async fn notify_settled<C: GenericClient>(
    c: &C,
    server: &str,
    ids: &[String],
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    rows(
        c,
        NOTIFY_SETTLED,
        &[&server, &ids],
        "announce settled reservations",
    )
    .await?;
    Ok(())
}

/// The SQLSTATE of a storage error from PostgreSQL, if it is one.
pub(super) fn sql_state(e: &LedgerError) -> Option<&SqlState> {
    match e {
        LedgerError::Storage { source, .. }
        | LedgerError::Corrupt {
            source: Some(source),
            ..
        } => source.downcast_ref::<super::PostgresError>()?.code(),
        _ => None,
    }
}
