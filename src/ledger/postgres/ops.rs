//! The ledger's task statements. Every function takes the server scope and runs on a pooled
//! connection (or a transaction on one) the caller chose; see the module doc of
//! [`super`] for how they stay atomic across replicas.

use deadpool_postgres::{GenericClient, Transaction};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::{Ctx, lock_key};
use crate::ledger::{
    CancelIntent, CancelRequest, Confirmation, Confirmed, EndReason, Ending, Finish, FinishOutcome,
    LedgerError, Owner, PendingCancel, PrincipalFilter, QuotaScope, Reservation, ReserveOutcome,
    Result, TaskId, TaskRecord, TaskStatus,
};

/// A task's columns (`t`) and its pending intent's (`c`, all NULL without one), in the order
/// [`record`] reads them; select them from [`task_from!`].
macro_rules! task_columns {
    () => {
        "t.id, t.upstream_id, t.issuer, t.subject, t.tenant, t.client, t.tool, t.scopes, \
         t.status, t.status_message, t.created_at, t.last_updated_at, t.ttl_ms, t.deadline_at, \
         t.poll_interval_ms, t.end_reason, t.ended_by, t.payload, t.ended_at, t.result_reads, \
         t.token_issued_at, t.home, c.reason, c.requested_by, c.pending_message, \
         c.requested_at, c.give_up_at"
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
const TASK_COLUMN_COUNT: usize = 27;

pub(super) type Params<'a> = [&'a (dyn ToSql + Sync)];

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
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, i: usize) -> Result<T> {
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
    let cancel = match col::<Option<String>>(row, 22)? {
        None => None,
        Some(reason) => Some(CancelIntent {
            reason: EndReason::parse(&reason)
                .filter(|r| r.is_cancellation())
                .ok_or_else(|| {
                    LedgerError::corrupt(format!("unknown cancellation reason {reason:?}"))
                })?,
            by: col::<Option<String>>(row, 23)?
                .map(|t| json(&t, "cancellation requested_by"))
                .transpose()?,
            pending_message: need(col(row, 24)?, "cancellation pending_message")?,
            requested_at: need(col(row, 25)?, "cancellation requested_at")?,
            give_up_at: need(col(row, 26)?, "cancellation give_up_at")?,
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
pub(super) async fn notify_settled<C: GenericClient>(
    c: &C,
    server: &str,
    ids: &[String],
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    // One notification per ID, `server \n id`, on the channel every listener LISTENs to.
    let sql = "SELECT pg_notify('lifeguard_settled', $1::text || E'\\n' || id) \
               FROM unnest($2::text[]) AS id";
    rows(c, sql, &[&server, &ids], "announce settled reservations").await?;
    Ok(())
}

/// One confirmed task by ID.
pub(super) async fn load_task<C: GenericClient>(
    c: &C,
    server: &str,
    id: &str,
) -> Result<Option<TaskRecord>> {
    let sql = concat!(
        "SELECT ",
        task_columns!(),
        " FROM ",
        task_from!(),
        " WHERE t.server = $1 AND t.id = $2 AND t.confirmed"
    );
    opt_row(c, sql, &[&server, &id], "look up task")
        .await?
        .as_ref()
        .map(record)
        .transpose()
}

/// Locks the confirmed task `id` for the rest of the transaction; whether it exists. Taken
/// before reading the task (with its intent) in a separate statement, which in READ COMMITTED
/// sees every write committed before the lock was granted.
async fn lock_task(tx: &Transaction<'_>, server: &str, id: &str) -> Result<bool> {
    let sql = "SELECT 1 FROM lifeguard_tasks WHERE server = $1 AND id = $2 AND confirmed \
               FOR UPDATE";
    Ok(opt_row(tx, sql, &[&server, &id], "lock task")
        .await?
        .is_some())
}

/// Whether `id` is a reservation (not yet confirmed, released or swept away).
pub(super) async fn is_reserved<C: GenericClient>(c: &C, server: &str, id: &str) -> Result<bool> {
    let sql = "SELECT EXISTS (SELECT 1 FROM lifeguard_tasks \
               WHERE server = $1 AND id = $2 AND NOT confirmed)";
    let row = one_row(c, sql, &[&server, &id], "check reservation").await?;
    col(&row, 0)
}

/// Deletes reservations whose expiry is at or before `now`; returns their IDs. `skip_locked`:
/// leave reservations another transaction is settling right now.
async fn void_expired(
    tx: &Transaction<'_>,
    server: &str,
    now: i64,
    skip_locked: bool,
) -> Result<Vec<String>> {
    let sql = if skip_locked {
        "DELETE FROM lifeguard_tasks WHERE server = $1 AND id IN (SELECT id FROM lifeguard_tasks \
         WHERE server = $1 AND NOT confirmed AND reservation_expires_at <= $2 \
         FOR UPDATE SKIP LOCKED) RETURNING id"
    } else {
        "DELETE FROM lifeguard_tasks WHERE server = $1 AND NOT confirmed \
         AND reservation_expires_at <= $2 RETURNING id"
    };
    let voided = rows(tx, sql, &[&server, &now], "void expired reservations").await?;
    voided.iter().map(|r| col(r, 0)).collect()
}

/// Returns the outcome and the IDs of the expired reservations it voided on the way.
pub(super) async fn reserve(
    tx: &Transaction<'_>,
    server: &str,
    r: &Reservation,
) -> Result<(ReserveOutcome, Vec<String>)> {
    // Every reservation of this server, from any replica, takes this lock first: the counts and
    // the idempotency lookup below see every reservation committed before, and nobody else's
    // can commit before this one does.
    exec(
        tx,
        "SELECT pg_advisory_xact_lock($1)",
        &[&lock_key(&["reserve", server])],
        "lock the server's reservations",
    )
    .await?;
    let voided = void_expired(tx, server, r.now, false).await?;
    notify_settled(tx, server, &voided).await?;
    let outcome = reserve_slot(tx, server, r).await?;
    Ok((outcome, voided))
}

async fn reserve_slot(
    tx: &Transaction<'_>,
    server: &str,
    r: &Reservation,
) -> Result<ReserveOutcome> {
    if let Some(claim) = &r.idempotency {
        let key = &claim.key_hash[..];
        let sql = "SELECT id, confirmed, idempotency_until FROM lifeguard_tasks \
                   WHERE server = $1 AND idempotency_key = $2";
        let holder = opt_row(tx, sql, &[&server, &key], "look up idempotency key").await?;
        if let Some(holder) = holder {
            let id: String = col(&holder, 0)?;
            let confirmed: bool = col(&holder, 1)?;
            let until: i64 = col(&holder, 2)?;
            if until > r.now {
                if !confirmed {
                    return Ok(ReserveOutcome::InFlight(TaskId::from_string(id)));
                }
                let record = load_task(tx, server, &id)
                    .await?
                    .ok_or_else(|| LedgerError::corrupt("idempotency key of a lost task"))?;
                return Ok(ReserveOutcome::Existing(Box::new(record)));
            }
            // The window lapsed: the key no longer means that task; free it for this claim.
            let sql = "UPDATE lifeguard_tasks SET idempotency_key = NULL, \
                       idempotency_until = NULL, idempotency_window_ms = NULL \
                       WHERE server = $1 AND id = $2";
            exec(tx, sql, &[&server, &id], "clear lapsed idempotency key").await?;
        }
    }

    let o = &r.owner;
    // One round trip for the four counts; each uses its own partial index. An empty tenant
    // (client) has no group to share a quota with: not counted.
    let sql = "SELECT \
        (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 AND issuer = $2 \
            AND subject = $3 AND ended_at IS NULL), \
        CASE WHEN $4::text <> '' THEN (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 \
            AND issuer = $2 AND tenant = $4 AND ended_at IS NULL) ELSE 0 END, \
        CASE WHEN $5::text <> '' THEN (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 \
            AND issuer = $2 AND client = $5 AND ended_at IS NULL) ELSE 0 END, \
        (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 AND ended_at IS NULL)";
    let counts = one_row(
        tx,
        sql,
        &[&server, &o.issuer, &o.subject, &o.tenant, &o.client],
        "count active tasks",
    )
    .await?;
    let (principal, tenant, client, all): (i64, i64, i64, i64) = (
        col(&counts, 0)?,
        col(&counts, 1)?,
        col(&counts, 2)?,
        col(&counts, 3)?,
    );
    let limits = &r.limits;
    if principal >= i64::from(limits.per_principal) {
        return Ok(ReserveOutcome::OverQuota(QuotaScope::Principal));
    }
    if !o.tenant.is_empty() && tenant >= i64::from(limits.per_tenant) {
        return Ok(ReserveOutcome::OverQuota(QuotaScope::Tenant));
    }
    if !o.client.is_empty() && client >= i64::from(limits.per_client) {
        return Ok(ReserveOutcome::OverQuota(QuotaScope::Client));
    }
    if all >= i64::from(limits.per_server) {
        return Ok(ReserveOutcome::OverQuota(QuotaScope::Server));
    }

    let (key, until, window) = match &r.idempotency {
        Some(c) => (
            Some(&c.key_hash[..]),
            Some(r.now.saturating_add(c.window_ms)),
            Some(c.window_ms),
        ),
        None => (None, None, None),
    };
    let scopes = to_json(&r.scopes, "scopes")?;
    let sql = "INSERT INTO lifeguard_tasks (server, id, confirmed, issuer, subject, tenant, \
               client, tool, scopes, idempotency_key, idempotency_until, idempotency_window_ms, \
               reservation_expires_at, token_issued_at) \
               VALUES ($1, $2, FALSE, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";
    exec(
        tx,
        sql,
        &[
            &server,
            &r.id.as_str(),
            &o.issuer,
            &o.subject,
            &o.tenant,
            &o.client,
            &r.tool,
            &scopes,
            &key,
            &until,
            &window,
            &r.reservation_expires_at,
            &r.token_issued_at,
        ],
        "insert reservation",
    )
    .await?;
    Ok(ReserveOutcome::Reserved)
}

/// Deletes the reservation `id` (never a confirmed task) and announces it settled; whether
/// there was one.
pub(super) async fn release<C: GenericClient>(c: &C, server: &str, id: &str) -> Result<bool> {
    // One statement: the delete and its notification commit together.
    let sql = "WITH gone AS (DELETE FROM lifeguard_tasks \
               WHERE server = $1 AND id = $2 AND NOT confirmed RETURNING id) \
               SELECT pg_notify('lifeguard_settled', $1::text || E'\\n' || id) FROM gone";
    let released = rows(c, sql, &[&server, &id], "release reservation").await?;
    Ok(!released.is_empty())
}

/// The confirmation's answer, or `None` when it lost a race on the upstream ID index: the
/// transaction is aborted; roll it back and try again (the winner is visible then).
pub(super) async fn confirm(
    tx: &Transaction<'_>,
    server: &str,
    id: &str,
    c: &Confirmation,
    home: &str,
) -> Result<Option<Confirmed>> {
    // Locks the reservation: a concurrent confirm, release or sweep of it waits for this one.
    let sql = "SELECT idempotency_until, idempotency_window_ms, issuer, subject, tenant, client \
               FROM lifeguard_tasks WHERE server = $1 AND id = $2 AND NOT confirmed FOR UPDATE";
    let Some(reservation) = opt_row(tx, sql, &[&server, &id], "look up reservation").await? else {
        return Err(LedgerError::NoReservation);
    };
    let until: Option<i64> = col(&reservation, 0)?;
    let window: Option<i64> = col(&reservation, 1)?;
    let owner = Owner {
        issuer: col(&reservation, 2)?,
        subject: col(&reservation, 3)?,
        tenant: col(&reservation, 4)?,
        client: col(&reservation, 5)?,
    };
    let settled = [id.to_owned()];

    // One upstream task, one owner. The unique index is the backstop for a concurrent
    // confirmation of the same upstream ID that this lookup cannot see yet.
    let sql = "SELECT id, issuer, subject, tenant, client FROM lifeguard_tasks \
               WHERE server = $1 AND upstream_id = $2 AND confirmed";
    let holder = opt_row(tx, sql, &[&server, &c.upstream_id], "look up upstream ID").await?;
    if let Some(holder) = holder {
        let holder_id: String = col(&holder, 0)?;
        let holder_owner = Owner {
            issuer: col(&holder, 1)?,
            subject: col(&holder, 2)?,
            tenant: col(&holder, 3)?,
            client: col(&holder, 4)?,
        };
        let sql = "DELETE FROM lifeguard_tasks WHERE server = $1 AND id = $2 AND NOT confirmed";
        exec(tx, sql, &[&server, &id], "release reservation").await?;
        notify_settled(tx, server, &settled).await?;
        if holder_owner != owner {
            return Ok(Some(Confirmed::HeldByAnotherOwner));
        }
        let existing = load_task(tx, server, &holder_id)
            .await?
            .ok_or_else(|| LedgerError::Internal("task holding an upstream ID vanished".into()))?;
        return Ok(Some(Confirmed::SameOwner(existing)));
    }
    // The window runs from the task's creation; it never shrinks below the reservation's.
    let until = match (until, window) {
        (Some(until), Some(window)) => Some(until.max(c.created_at.saturating_add(window))),
        (until, _) => until,
    };
    let sql = "UPDATE lifeguard_tasks SET confirmed = TRUE, upstream_id = $3, status = $4, \
               status_message = $5, created_at = $6, last_updated_at = $6, ttl_ms = $7, \
               expires_at = $8, deadline_at = $9, poll_interval_ms = $10, \
               idempotency_until = $11, reservation_expires_at = NULL, home = $12 \
               WHERE server = $1 AND id = $2 AND NOT confirmed";
    let updated = exec(
        tx,
        sql,
        &[
            &server,
            &id,
            &c.upstream_id,
            &c.status.as_str(),
            &c.status_message,
            &c.created_at,
            &c.ttl_ms,
            &c.created_at.saturating_add(c.ttl_ms),
            &c.deadline_at,
            &c.poll_interval_ms,
            &until,
            &home,
        ],
        "confirm task",
    )
    .await;
    match updated {
        Ok(_) => {}
        Err(e) if sql_state(&e) == Some(&SqlState::UNIQUE_VIOLATION) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    }
    notify_settled(tx, server, &settled).await?;
    let record = load_task(tx, server, id)
        .await?
        .ok_or_else(|| LedgerError::Internal("confirmed task vanished".into()))?;
    Ok(Some(Confirmed::New(record)))
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

pub(super) async fn observe(
    tx: &Transaction<'_>,
    server: &str,
    id: &str,
    status: TaskStatus,
    status_message: Option<&str>,
    now: i64,
) -> Result<()> {
    // Locked first, so the intent check below sees an intent committed by a concurrent
    // request_cancel (the task keeps its intent's message while a cancellation is pending).
    if !lock_task(tx, server, id).await? {
        return Ok(());
    }
    let sql = "UPDATE lifeguard_tasks SET status = $3, last_updated_at = $5, \
               status_message = CASE WHEN EXISTS (SELECT 1 FROM lifeguard_cancel_intents \
               WHERE server = $1 AND task_id = $2) THEN status_message ELSE $4 END \
               WHERE server = $1 AND id = $2 AND confirmed AND ended_at IS NULL";
    exec(
        tx,
        sql,
        &[&server, &id, &status.as_str(), &status_message, &now],
        "record observed status",
    )
    .await?;
    Ok(())
}

pub(super) async fn finish(
    tx: &Transaction<'_>,
    server: &str,
    id: &str,
    f: &Finish,
) -> Result<FinishOutcome> {
    if !lock_task(tx, server, id).await? {
        return Ok(FinishOutcome::NotFound);
    }
    let current = load_task(tx, server, id)
        .await?
        .ok_or_else(|| LedgerError::Internal("locked task vanished".into()))?;
    if current.ended.is_some() {
        return Ok(FinishOutcome::AlreadyTerminal(Box::new(current)));
    }
    let e = &f.ending;
    let by = e.by.as_ref().map(|o| to_json(o, "ended_by")).transpose()?;
    let payload = e
        .payload
        .as_ref()
        .map(|p| to_json(p, "payload"))
        .transpose()?;
    // Compare-and-set on `ended_at IS NULL` (the row lock makes it certain anyway).
    let sql = "UPDATE lifeguard_tasks SET status = $3, status_message = $4, last_updated_at = $5, \
               end_reason = $6, ended_by = $7, payload = $8, ended_at = $5 \
               WHERE server = $1 AND id = $2 AND confirmed AND ended_at IS NULL";
    let changed = exec(
        tx,
        sql,
        &[
            &server,
            &id,
            &f.status.as_str(),
            &f.status_message,
            &e.at,
            &e.reason.as_str(),
            &by,
            &payload,
        ],
        "finish task",
    )
    .await?;
    if changed == 1 {
        // Same transaction: the terminal state and the end of the intent commit together.
        let sql = "DELETE FROM lifeguard_cancel_intents WHERE server = $1 AND task_id = $2";
        exec(tx, sql, &[&server, &id], "delete cancellation intent").await?;
    }
    let after = load_task(tx, server, id)
        .await?
        .ok_or_else(|| LedgerError::Internal("finished task vanished".into()))?;
    Ok(if changed == 1 {
        FinishOutcome::Applied(Box::new(after))
    } else {
        FinishOutcome::AlreadyTerminal(Box::new(after))
    })
}

pub(super) async fn request_cancel(
    tx: &Transaction<'_>,
    server: &str,
    id: &str,
    intent: &CancelIntent,
) -> Result<CancelRequest> {
    if !lock_task(tx, server, id).await? {
        return Ok(CancelRequest::NotFound);
    }
    let current = load_task(tx, server, id)
        .await?
        .ok_or_else(|| LedgerError::Internal("locked task vanished".into()))?;
    if current.ended.is_some() {
        return Ok(CancelRequest::AlreadyTerminal(Box::new(current)));
    }
    if current.cancel.is_some() {
        return Ok(CancelRequest::AlreadyRequested(Box::new(current)));
    }
    let by = intent
        .by
        .as_ref()
        .map(|o| to_json(o, "cancellation requested_by"))
        .transpose()?;
    // ON CONFLICT: the first intent wins even without the row lock above.
    let sql = "INSERT INTO lifeguard_cancel_intents (server, task_id, reason, requested_by, \
               pending_message, requested_at, give_up_at, attempts, next_attempt_at) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $6) ON CONFLICT DO NOTHING";
    let inserted = exec(
        tx,
        sql,
        &[
            &server,
            &id,
            &intent.reason.as_str(),
            &by,
            &intent.pending_message,
            &intent.requested_at,
            &intent.give_up_at,
        ],
        "record cancellation intent",
    )
    .await?;
    if inserted == 0 {
        let now = load_task(tx, server, id)
            .await?
            .ok_or_else(|| LedgerError::Internal("task being cancelled vanished".into()))?;
        return Ok(CancelRequest::AlreadyRequested(Box::new(now)));
    }
    let sql = "UPDATE lifeguard_tasks SET status_message = $3, last_updated_at = $4 \
               WHERE server = $1 AND id = $2 AND confirmed AND ended_at IS NULL";
    exec(
        tx,
        sql,
        &[&server, &id, &intent.pending_message, &intent.requested_at],
        "set cancellation message",
    )
    .await?;
    let after = load_task(tx, server, id)
        .await?
        .ok_or_else(|| LedgerError::Internal("task being cancelled vanished".into()))?;
    Ok(CancelRequest::Recorded(Box::new(after)))
}

/// Due intents of every task (`home` `None`) or of the tasks homed on `home`.
pub(super) async fn cancels_due<C: GenericClient>(
    c: &C,
    server: &str,
    home: Option<&str>,
    now: i64,
    limit: usize,
) -> Result<Vec<PendingCancel>> {
    let sql = concat!(
        "SELECT ",
        task_columns!(),
        ", c.attempts, c.next_attempt_at \
         FROM lifeguard_cancel_intents AS c JOIN lifeguard_tasks AS t \
         ON t.server = c.server AND t.id = c.task_id \
         WHERE c.server = $1 AND c.next_attempt_at <= $2 AND t.confirmed AND t.ended_at IS NULL \
         AND ($4::text IS NULL OR t.home = $4) \
         ORDER BY c.next_attempt_at, c.requested_at, c.task_id LIMIT $3"
    );
    let found = rows(
        c,
        sql,
        &[&server, &now, &sql_limit(limit), &home],
        "scan due cancellations",
    )
    .await?;
    found
        .iter()
        .map(|row| {
            let record = record(row)?;
            let intent = record.cancel.clone().ok_or_else(|| {
                LedgerError::Internal("due cancellation without its intent".into())
            })?;
            Ok(PendingCancel {
                record,
                intent,
                attempts: u32::try_from(col::<i64>(row, TASK_COLUMN_COUNT)?)
                    .map_err(|_| LedgerError::corrupt("cancellation attempts out of range"))?,
                next_attempt_at: col(row, TASK_COLUMN_COUNT + 1)?,
            })
        })
        .collect()
}

pub(super) async fn note_cancel_attempt<C: GenericClient>(
    c: &C,
    server: &str,
    id: &str,
    next_attempt_at: i64,
) -> Result<()> {
    let sql = "UPDATE lifeguard_cancel_intents SET attempts = LEAST(attempts + 1, 4294967295), \
               next_attempt_at = $3 WHERE server = $1 AND task_id = $2";
    exec(
        c,
        sql,
        &[&server, &id, &next_attempt_at],
        "note cancellation attempt",
    )
    .await?;
    Ok(())
}

pub(super) async fn note_result_read<C: GenericClient>(
    c: &C,
    server: &str,
    id: &str,
) -> Result<u32> {
    let sql = "UPDATE lifeguard_tasks SET result_reads = LEAST(result_reads + 1, 4294967295) \
               WHERE server = $1 AND id = $2 AND confirmed RETURNING result_reads";
    match opt_row(c, sql, &[&server, &id], "count result read").await? {
        None => Ok(0),
        Some(row) => u32::try_from(col::<i64>(&row, 0)?)
            .map_err(|_| LedgerError::corrupt("result_reads out of range")),
    }
}

pub(super) async fn forget_payload<C: GenericClient>(c: &C, server: &str, id: &str) -> Result<()> {
    let sql = "UPDATE lifeguard_tasks SET payload = NULL \
               WHERE server = $1 AND id = $2 AND confirmed AND ended_at IS NOT NULL";
    exec(c, sql, &[&server, &id], "forget payload").await?;
    Ok(())
}

pub(super) async fn past_deadline<C: GenericClient>(
    c: &C,
    server: &str,
    now: i64,
    limit: usize,
) -> Result<Vec<TaskRecord>> {
    let sql = concat!(
        "SELECT ",
        task_columns!(),
        " FROM ",
        task_from!(),
        " WHERE t.server = $1 AND t.ended_at IS NULL AND t.confirmed AND t.deadline_at <= $2 \
         AND c.task_id IS NULL ORDER BY t.deadline_at, t.id LIMIT $3"
    );
    let found = rows(
        c,
        sql,
        &[&server, &now, &sql_limit(limit)],
        "scan deadlines",
    )
    .await?;
    records(&found)
}

/// Returns the IDs of the purged tasks and of the voided reservations.
pub(super) async fn purge_expired(
    tx: &Transaction<'_>,
    server: &str,
    now: i64,
    limit: usize,
) -> Result<(Vec<TaskId>, Vec<String>)> {
    // SKIP LOCKED: rows another transaction holds are left for the next purge, so two purges
    // (or a purge and a finish) never wait on each other in opposite orders.
    let voided = void_expired(tx, server, now, true).await?;
    notify_settled(tx, server, &voided).await?;
    // Their cancellation intents go with them (ON DELETE CASCADE).
    let sql = "DELETE FROM lifeguard_tasks WHERE server = $1 AND id IN (SELECT id \
               FROM lifeguard_tasks WHERE server = $1 AND confirmed AND expires_at <= $2 \
               ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED) RETURNING id";
    let purged = rows(
        tx,
        sql,
        &[&server, &now, &sql_limit(limit)],
        "purge expired tasks",
    )
    .await?;
    let purged: Vec<String> = purged.iter().map(|r| col(r, 0)).collect::<Result<_>>()?;
    super::replicas::forget_budget_uses(tx, server, &purged, now).await?;
    Ok((
        purged.into_iter().map(TaskId::from_string).collect(),
        voided,
    ))
}

pub(super) async fn active_for<C: GenericClient>(
    c: &C,
    server: &str,
    p: &PrincipalFilter,
) -> Result<Vec<TaskRecord>> {
    let sql = concat!(
        "SELECT ",
        task_columns!(),
        " FROM ",
        task_from!(),
        " WHERE t.server = $1 AND t.issuer = $2 AND t.subject = $3 AND t.ended_at IS NULL \
         AND t.confirmed AND ($4::text IS NULL OR t.tenant = $4) \
         AND ($5::text IS NULL OR t.client = $5) ORDER BY t.created_at, t.id"
    );
    let found = rows(
        c,
        sql,
        &[&server, &p.issuer, &p.subject, &p.tenant, &p.client],
        "scan principal's tasks",
    )
    .await?;
    records(&found)
}

/// The secret `name`, created from `fresh` if it does not exist: the first writer wins, so
/// concurrent first uses (on any replica) agree.
pub(super) async fn secret<C: GenericClient>(
    c: &C,
    server: &str,
    name: &str,
    fresh: impl FnOnce() -> Result<[u8; 32]>,
) -> Result<[u8; 32]> {
    let read = "SELECT value FROM lifeguard_secrets WHERE server = $1 AND name = $2";
    let decode = |row: Row| -> Result<[u8; 32]> {
        let value: Vec<u8> = col(&row, 0)?;
        <[u8; 32]>::try_from(value.as_slice())
            .map_err(|_| LedgerError::corrupt(format!("secret {name:?} is not 32 bytes")))
    };
    if let Some(row) = opt_row(c, read, &[&server, &name], "look up secret").await? {
        return decode(row);
    }
    let value = fresh()?;
    let insert = "INSERT INTO lifeguard_secrets (server, name, value) VALUES ($1, $2, $3) \
                  ON CONFLICT DO NOTHING";
    exec(c, insert, &[&server, &name, &&value[..]], "store secret").await?;
    let row = opt_row(c, read, &[&server, &name], "look up secret")
        .await?
        .ok_or_else(|| LedgerError::Internal("stored secret vanished".into()))?;
    decode(row)
}
