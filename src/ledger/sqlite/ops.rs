//! The ledger's statements. Every function here runs on a connection the caller chose: writes
//! inside the writer's transaction (under a savepoint), reads on a read connection.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::Ctx;
use crate::ledger::{
    BUDGET_USE_HORIZON_MS, CancelIntent, CancelRequest, Confirmation, Confirmed, EndReason, Ending,
    Finish, FinishOutcome, LedgerError, Owner, PendingCancel, PrincipalFilter, PurgedTask,
    QuotaScope, Reservation, ReserveOutcome, Result, TaskId, TaskRecord, TaskStatus,
};

/// A task's columns (`t`) and its pending cancellation intent's (`c`, all NULL without one), in
/// the order [`RawTask::from_row`] reads them. Select them `FROM` [`TASK_FROM`], or from any
/// join that names the two tables `t` and `c`.
pub(super) const TASK_COLUMNS: &str = "t.id, t.upstream_id, t.issuer, t.subject, t.tenant, t.client, \
    t.tool, t.scopes, t.status, t.status_message, t.created_at, t.last_updated_at, t.ttl_ms, \
    t.deadline_at, t.poll_interval_ms, t.end_reason, t.ended_by, t.payload, t.ended_at, \
    t.result_reads, t.token_issued_at, t.home, t.correlation_id, t.object, \
    t.lease_until, t.delegated_until, c.reason, c.requested_by, c.pending_message, c.requested_at, c.give_up_at";

/// How many columns [`TASK_COLUMNS`] has; columns selected after them start here.
const TASK_COLUMN_COUNT: usize = 31;

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
    cancel_reason: Option<String>,
    cancel_by: Option<String>,
    cancel_message: Option<String>,
    cancel_requested_at: Option<i64>,
    cancel_give_up_at: Option<i64>,
}

impl RawTask {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
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
            cancel_reason: row.get(26)?,
            cancel_by: row.get(27)?,
            cancel_message: row.get(28)?,
            cancel_requested_at: row.get(29)?,
            cancel_give_up_at: row.get(30)?,
        })
    }

    fn into_record(self) -> Result<TaskRecord> {
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
            cancel,
        })
    }
}

/// [`RawTask::from_row`] as a function, for `query_map`.
pub(super) fn raw_task(row: &Row<'_>) -> rusqlite::Result<RawTask> {
    RawTask::from_row(row)
}

fn to_json<T: serde::Serialize + ?Sized>(value: &T, what: &str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| LedgerError::storage(format!("encode {what}"), e))
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
    t.lease_until, t.delegated_until, NULL, NULL, NULL, NULL, NULL";

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
            "SELECT reason, requested_by, pending_message, requested_at, give_up_at \
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
            ))
        })
        .optional()
        .ctx("look up intent")?;
    if let Some((reason, by, message, requested_at, give_up_at)) = intent {
        raw.cancel_reason = Some(reason);
        raw.cancel_by = by;
        raw.cancel_message = Some(message);
        raw.cancel_requested_at = Some(requested_at);
        raw.cancel_give_up_at = Some(give_up_at);
    }
    raw.into_record().map(Some)
}

fn count_active(conn: &Connection, sql: &str, args: &[&dyn rusqlite::ToSql]) -> Result<i64> {
    conn.prepare_cached(sql)
        .ctx("prepare quota count")?
        .query_row(args, |row| row.get(0))
        .ctx("count active tasks")
}

/// Deletes reservations whose expiry is at or before `now`; returns their IDs.
fn void_expired_reservations(conn: &Connection, now: i64) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached(
            "DELETE FROM tasks WHERE confirmed = 0 AND reservation_expires_at <= ?1 RETURNING id",
        )
        .ctx("prepare reservation sweep")?;
    let ids = stmt
        .query_map([now], |row| row.get::<_, String>(0))
        .ctx("void expired reservations")?;
    ids.map(|id| id.ctx("read voided reservation id")).collect()
}

/// Whether `id` is a reservation (not yet confirmed, released or swept away).
pub(super) fn is_reserved(conn: &Connection, id: &str) -> Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = ?1 AND confirmed = 0)")
        .ctx("prepare reservation check")?
        .query_row([id], |row| row.get(0))
        .ctx("check reservation")
}

/// Returns the outcome and the IDs of the expired reservations it voided on the way.
pub(super) fn reserve(conn: &Connection, r: &Reservation) -> Result<(ReserveOutcome, Vec<String>)> {
    // Void expired reservations first, so neither the idempotency lookup nor the counts below
    // can see one.
    let voided = void_expired_reservations(conn, r.now)?;
    let outcome = reserve_slot(conn, r)?;
    Ok((outcome, voided))
}

fn reserve_slot(conn: &Connection, r: &Reservation) -> Result<ReserveOutcome> {
    if let Some(claim) = &r.idempotency {
        let holder: Option<(String, bool, i64)> = conn
            .prepare_cached(
                "SELECT id, confirmed, idempotency_until FROM tasks WHERE idempotency_key = ?1",
            )
            .ctx("prepare idempotency lookup")?
            .query_row([&claim.key_hash[..]], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()
            .ctx("look up idempotency key")?;
        if let Some((id, confirmed, until)) = holder {
            if until > r.now {
                if !confirmed {
                    return Ok(ReserveOutcome::InFlight(TaskId::from_string(id)));
                }
                let record = load_task(conn, &id)?
                    .ok_or_else(|| LedgerError::corrupt("idempotency key of a lost task"))?;
                return Ok(ReserveOutcome::Existing(Box::new(record)));
            }
            // The window lapsed: the key no longer means that task; free it for this claim.
            conn.prepare_cached(
                "UPDATE tasks SET idempotency_key = NULL, idempotency_until = NULL, \
                 idempotency_window_ms = NULL WHERE id = ?1",
            )
            .ctx("prepare idempotency release")?
            .execute([&id])
            .ctx("clear lapsed idempotency key")?;
        }
    }

    let o = &r.owner;
    let limits = &r.limits;
    let principal = count_active(
        conn,
        "SELECT COUNT(*) FROM tasks WHERE issuer = ?1 AND subject = ?2 AND ended_at IS NULL",
        &[&o.issuer, &o.subject],
    )?;
    if principal >= i64::from(limits.per_principal) {
        return Ok(ReserveOutcome::OverQuota(QuotaScope::Principal));
    }
    // An empty tenant/client means the token carried no such claim: there is no group to
    // share a quota with, so only the principal and server quotas apply. Tenant and client
    // names belong to their issuer: two issuers' "acme" are two tenants.
    if !o.tenant.is_empty() {
        let tenant = count_active(
            conn,
            "SELECT COUNT(*) FROM tasks WHERE issuer = ?1 AND tenant = ?2 AND ended_at IS NULL",
            &[&o.issuer, &o.tenant],
        )?;
        if tenant >= i64::from(limits.per_tenant) {
            return Ok(ReserveOutcome::OverQuota(QuotaScope::Tenant));
        }
    }
    if !o.client.is_empty() {
        let client = count_active(
            conn,
            "SELECT COUNT(*) FROM tasks WHERE issuer = ?1 AND client = ?2 AND ended_at IS NULL",
            &[&o.issuer, &o.client],
        )?;
        if client >= i64::from(limits.per_client) {
            return Ok(ReserveOutcome::OverQuota(QuotaScope::Client));
        }
    }
    let server = count_active(
        conn,
        "SELECT COUNT(*) FROM tasks WHERE ended_at IS NULL",
        &[],
    )?;
    if server >= i64::from(limits.per_server) {
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
    conn.prepare_cached(
        "INSERT INTO tasks (id, confirmed, issuer, subject, tenant, client, tool, scopes, \
         idempotency_key, idempotency_until, idempotency_window_ms, reservation_expires_at, \
         token_issued_at, correlation_id, object, lease_until, delegated_until) \
         VALUES (?1, 0, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )
    .ctx("prepare reservation insert")?
    .execute(params![
        r.id.as_str(),
        o.issuer,
        o.subject,
        o.tenant,
        o.client,
        r.tool,
        to_json(&r.scopes, "scopes")?,
        key,
        until,
        window,
        r.reservation_expires_at,
        r.token_issued_at,
        r.correlation_id,
        r.object,
        r.lease_until,
        r.delegated_until,
    ])
    .ctx("insert reservation")?;
    Ok(ReserveOutcome::Reserved)
}

/// The ID and owner of the confirmed task holding `upstream_id`, if any.
fn upstream_holder(conn: &Connection, upstream_id: &str) -> Result<Option<(String, Owner)>> {
    conn.prepare_cached(
        "SELECT id, issuer, subject, tenant, client FROM tasks \
         WHERE upstream_id = ?1 AND confirmed = 1",
    )
    .ctx("prepare upstream ID lookup")?
    .query_row([upstream_id], |row| {
        Ok((
            row.get(0)?,
            Owner {
                issuer: row.get(1)?,
                subject: row.get(2)?,
                tenant: row.get(3)?,
                client: row.get(4)?,
            },
        ))
    })
    .optional()
    .ctx("look up upstream ID")
}

pub(super) fn confirm(
    conn: &Connection,
    id: &str,
    c: &Confirmation,
    home: &str,
) -> Result<Confirmed> {
    let reservation: Option<(Option<i64>, Option<i64>, Owner)> = conn
        .prepare_cached(
            "SELECT idempotency_until, idempotency_window_ms, issuer, subject, tenant, client \
             FROM tasks WHERE id = ?1 AND confirmed = 0",
        )
        .ctx("prepare reservation lookup")?
        .query_row([id], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                Owner {
                    issuer: row.get(2)?,
                    subject: row.get(3)?,
                    tenant: row.get(4)?,
                    client: row.get(5)?,
                },
            ))
        })
        .optional()
        .ctx("look up reservation")?;
    let Some((until, window, owner)) = reservation else {
        return Err(LedgerError::NoReservation);
    };
    // One upstream task, one owner. Decided here, inside the writer's transaction; the unique
    // index `tasks_upstream` is the backstop.
    if let Some((holder_id, holder)) = upstream_holder(conn, &c.upstream_id)? {
        release(conn, id)?;
        if holder != owner {
            return Ok(Confirmed::HeldByAnotherOwner);
        }
        let existing = load_task(conn, &holder_id)?
            .ok_or_else(|| LedgerError::Internal("task holding an upstream ID vanished".into()))?;
        return Ok(Confirmed::SameOwner(existing));
    }
    // The window runs from the task's creation, so a slow upstream does not eat into it; it
    // never shrinks below what the reservation promised.
    let until = match (until, window) {
        (Some(until), Some(window)) => Some(until.max(c.created_at.saturating_add(window))),
        (until, _) => until,
    };
    conn.prepare_cached(
        "UPDATE tasks SET confirmed = 1, upstream_id = ?2, status = ?3, status_message = ?4, \
         created_at = ?5, last_updated_at = ?5, ttl_ms = ?6, expires_at = ?7, deadline_at = ?8, \
         poll_interval_ms = ?9, idempotency_until = ?10, reservation_expires_at = NULL, \
         home = ?11 WHERE id = ?1 AND confirmed = 0",
    )
    .ctx("prepare confirm")?
    .execute(params![
        id,
        c.upstream_id,
        c.status.as_str(),
        c.status_message,
        c.created_at,
        c.ttl_ms,
        c.created_at.saturating_add(c.ttl_ms),
        c.deadline_at,
        c.poll_interval_ms,
        until,
        home,
    ])
    .ctx("confirm task")?;
    let record = load_task(conn, id)?
        .ok_or_else(|| LedgerError::Internal("confirmed task vanished".into()))?;
    Ok(Confirmed::New(record))
}

pub(super) fn release(conn: &Connection, id: &str) -> Result<()> {
    conn.prepare_cached("DELETE FROM tasks WHERE id = ?1 AND confirmed = 0")
        .ctx("prepare release")?
        .execute([id])
        .ctx("release reservation")?;
    Ok(())
}

pub(super) fn observe(
    conn: &Connection,
    id: &str,
    status: TaskStatus,
    status_message: Option<&str>,
    now: i64,
) -> Result<()> {
    // While a cancellation is pending the task keeps its intent's message.
    conn.prepare_cached(
        "UPDATE tasks SET status = ?2, last_updated_at = ?4, status_message = CASE \
         WHEN EXISTS (SELECT 1 FROM cancel_intents WHERE task_id = ?1) THEN status_message \
         ELSE ?3 END \
         WHERE id = ?1 AND confirmed = 1 AND ended_at IS NULL",
    )
    .ctx("prepare observe")?
    .execute(params![id, status.as_str(), status_message, now])
    .ctx("record observed status")?;
    Ok(())
}

pub(super) fn finish(conn: &Connection, id: &str, f: &Finish) -> Result<FinishOutcome> {
    let Some(current) = load_task(conn, id)? else {
        return Ok(FinishOutcome::NotFound);
    };
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
    // The `ended_at IS NULL` guard keeps this a compare-and-set even if another process
    // shares the file (our transaction holds the write lock anyway).
    let changed = conn
        .prepare_cached(
            "UPDATE tasks SET status = ?2, status_message = ?3, last_updated_at = ?4, \
             end_reason = ?5, ended_by = ?6, payload = ?7, ended_at = ?4 \
             WHERE id = ?1 AND confirmed = 1 AND ended_at IS NULL",
        )
        .ctx("prepare finish")?
        .execute(params![
            id,
            f.status.as_str(),
            f.status_message,
            e.at,
            e.reason.as_str(),
            by,
            payload
        ])
        .ctx("finish task")?;
    if changed == 1 {
        // Same transaction: the terminal state and the end of the intent commit together.
        delete_cancel_intent(conn, id)?;
    }
    let after = load_task(conn, id)?
        .ok_or_else(|| LedgerError::Internal("finished task vanished".into()))?;
    Ok(if changed == 1 {
        FinishOutcome::Applied(Box::new(after))
    } else {
        FinishOutcome::AlreadyTerminal(Box::new(after))
    })
}

fn delete_cancel_intent(conn: &Connection, id: &str) -> Result<()> {
    conn.prepare_cached("DELETE FROM cancel_intents WHERE task_id = ?1")
        .ctx("prepare cancellation intent delete")?
        .execute([id])
        .ctx("delete cancellation intent")?;
    Ok(())
}

pub(super) fn request_cancel(
    conn: &Connection,
    id: &str,
    intent: &CancelIntent,
) -> Result<CancelRequest> {
    let Some(current) = load_task(conn, id)? else {
        return Ok(CancelRequest::NotFound);
    };
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
    conn.prepare_cached(
        "INSERT INTO cancel_intents (task_id, reason, requested_by, pending_message, \
         requested_at, give_up_at, attempts, next_attempt_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?5)",
    )
    .ctx("prepare cancellation intent insert")?
    .execute(params![
        id,
        intent.reason.as_str(),
        by,
        intent.pending_message,
        intent.requested_at,
        intent.give_up_at,
    ])
    .ctx("record cancellation intent")?;
    conn.prepare_cached(
        "UPDATE tasks SET status_message = ?2, last_updated_at = ?3 \
         WHERE id = ?1 AND confirmed = 1 AND ended_at IS NULL",
    )
    .ctx("prepare cancellation message")?
    .execute(params![id, intent.pending_message, intent.requested_at])
    .ctx("set cancellation message")?;
    let after = load_task(conn, id)?
        .ok_or_else(|| LedgerError::Internal("task being cancelled vanished".into()))?;
    Ok(CancelRequest::Recorded(Box::new(after)))
}

/// Due intents of every task (`home` `None`) or of the tasks homed on `home`.
pub(super) fn cancels_due(
    conn: &Connection,
    home: Option<&str>,
    now: i64,
    limit: usize,
) -> Result<Vec<PendingCancel>> {
    let sql = format!(
        "SELECT {TASK_COLUMNS}, c.attempts, c.next_attempt_at \
         FROM cancel_intents AS c JOIN tasks AS t ON t.id = c.task_id \
         WHERE c.next_attempt_at <= ?1 AND t.confirmed = 1 AND t.ended_at IS NULL \
         AND (?3 IS NULL OR t.home = ?3) \
         ORDER BY c.next_attempt_at, c.requested_at, c.task_id LIMIT ?2"
    );
    let mut stmt = conn.prepare_cached(&sql).ctx("prepare cancellation scan")?;
    let rows = stmt
        .query_map(params![now, sql_limit(limit), home], |row| {
            Ok((
                RawTask::from_row(row)?,
                row.get::<_, i64>(TASK_COLUMN_COUNT)?,
                row.get::<_, i64>(TASK_COLUMN_COUNT + 1)?,
            ))
        })
        .ctx("scan due cancellations")?;
    rows.map(|row| {
        let (raw, attempts, next_attempt_at) = row.ctx("read cancellation row")?;
        let record = raw.into_record()?;
        let intent = record
            .cancel
            .clone()
            .ok_or_else(|| LedgerError::Internal("due cancellation without its intent".into()))?;
        Ok(PendingCancel {
            record,
            intent,
            attempts: u32::try_from(attempts)
                .map_err(|_| LedgerError::corrupt("cancellation attempts out of range"))?,
            next_attempt_at,
        })
    })
    .collect()
}

pub(super) fn note_cancel_attempt(conn: &Connection, id: &str, next_attempt_at: i64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE cancel_intents SET attempts = min(attempts + 1, 4294967295), \
         next_attempt_at = ?2 WHERE task_id = ?1",
    )
    .ctx("prepare cancellation attempt")?
    .execute(params![id, next_attempt_at])
    .ctx("note cancellation attempt")?;
    Ok(())
}

pub(super) fn note_result_read(conn: &Connection, id: &str) -> Result<u32> {
    let reads: Option<i64> = conn
        .prepare_cached(
            "UPDATE tasks SET result_reads = min(result_reads + 1, 4294967295) \
             WHERE id = ?1 AND confirmed = 1 RETURNING result_reads",
        )
        .ctx("prepare result read")?
        .query_row([id], |row| row.get(0))
        .optional()
        .ctx("count result read")?;
    match reads {
        None => Ok(0),
        Some(n) => u32::try_from(n).map_err(|_| LedgerError::corrupt("result_reads out of range")),
    }
}

/// Moves a non-terminal task's lease and delegation forward, never back.
pub(super) fn renew_identity(
    conn: &Connection,
    id: &str,
    lease_until: Option<i64>,
    delegated_until: Option<i64>,
) -> Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE tasks SET \
               lease_until = CASE WHEN ?2 IS NOT NULL AND ?2 > coalesce(lease_until, -1) \
                 THEN ?2 ELSE lease_until END, \
               delegated_until = CASE WHEN ?3 IS NOT NULL AND ?3 > coalesce(delegated_until, -1) \
                 THEN ?3 ELSE delegated_until END \
             WHERE id = ?1 AND confirmed = 1 AND ended_at IS NULL \
               AND ((?2 IS NOT NULL AND ?2 > coalesce(lease_until, -1)) \
                 OR (?3 IS NOT NULL AND ?3 > coalesce(delegated_until, -1)))",
        )
        .ctx("prepare identity renewal")?
        .execute(params![id, lease_until, delegated_until])
        .ctx("renew identity")?;
    Ok(changed > 0)
}

/// Drops a terminal task's payload (its result or error); the task itself stays.
pub(super) fn forget_payload(conn: &Connection, id: &str) -> Result<()> {
    conn.prepare_cached(
        "UPDATE tasks SET payload = NULL WHERE id = ?1 AND confirmed = 1 AND ended_at IS NOT NULL",
    )
    .ctx("prepare forget payload")?
    .execute([id])
    .ctx("forget payload")?;
    Ok(())
}

pub(super) fn past_deadline(conn: &Connection, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM {TASK_FROM} \
         WHERE t.ended_at IS NULL AND t.confirmed = 1 \
         AND (t.deadline_at <= ?1 OR t.lease_until <= ?1) \
         AND c.task_id IS NULL \
         ORDER BY min(t.deadline_at, coalesce(t.lease_until, t.deadline_at)), t.id LIMIT ?2"
    );
    let mut stmt = conn.prepare_cached(&sql).ctx("prepare deadline scan")?;
    let rows = stmt
        .query_map(params![now, sql_limit(limit)], RawTask::from_row)
        .ctx("scan deadlines")?;
    collect(rows)
}

/// Returns the IDs of the purged tasks and of the voided reservations.
pub(super) fn purge_expired(
    conn: &Connection,
    now: i64,
    limit: usize,
) -> Result<(Vec<PurgedTask>, Vec<String>)> {
    let voided = void_expired_reservations(conn, now)?;
    let mut stmt = conn
        .prepare_cached(
            // Their cancellation intents go with them (ON DELETE CASCADE).
            "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks \
             WHERE confirmed = 1 AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2) \
             RETURNING id, correlation_id",
        )
        .ctx("prepare purge")?;
    let rows = stmt
        .query_map(params![now, sql_limit(limit)], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .ctx("purge expired tasks")?;
    let purged: Vec<PurgedTask> = rows
        .map(|row| {
            let (id, correlation_id) = row.ctx("read purged task")?;
            Ok(PurgedTask {
                id: TaskId::from_string(id),
                correlation_id,
            })
        })
        .collect::<Result<_>>()?;
    let ids: Vec<TaskId> = purged.iter().map(|p| p.id.clone()).collect();
    forget_budget_uses(conn, &ids, now)?;
    Ok((purged, voided))
}

/// Deletes the budget uses of purged tasks, uses outside tasks older than any window, and the
/// spent cost of grants that expired.
fn forget_budget_uses(conn: &Connection, purged: &[TaskId], now: i64) -> Result<()> {
    let mut by_task = conn
        .prepare_cached("DELETE FROM budget_uses WHERE task_id = ?1")
        .ctx("prepare budget use delete")?;
    for id in purged {
        by_task
            .execute([id.as_str()])
            .ctx("delete budget uses of a purged task")?;
    }
    conn.prepare_cached("DELETE FROM budget_uses WHERE task_id IS NULL AND at <= ?1")
        .ctx("prepare old budget use delete")?
        .execute([now.saturating_sub(BUDGET_USE_HORIZON_MS)])
        .ctx("delete old budget uses")?;
    conn.prepare_cached("DELETE FROM budget_costs WHERE until <= ?1")
        .ctx("prepare expired cost delete")?
        .execute([now])
        .ctx("delete the spent cost of expired grants")?;
    Ok(())
}

pub(super) fn active_for(conn: &Connection, p: &PrincipalFilter) -> Result<Vec<TaskRecord>> {
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM {TASK_FROM} \
         WHERE t.issuer = ?1 AND (?2 IS NULL OR t.subject = ?2) AND t.ended_at IS NULL \
         AND t.confirmed = 1 \
         AND (?3 IS NULL OR t.tenant = ?3) AND (?4 IS NULL OR t.client = ?4) \
         ORDER BY t.created_at, t.id"
    );
    let mut stmt = conn.prepare_cached(&sql).ctx("prepare principal scan")?;
    let rows = stmt
        .query_map(
            params![p.issuer, p.subject, p.tenant, p.client],
            RawTask::from_row,
        )
        .ctx("scan principal's tasks")?;
    collect(rows)
}

pub(super) fn read_secret(conn: &Connection, name: &str) -> Result<Option<[u8; 32]>> {
    let value: Option<Vec<u8>> = conn
        .prepare_cached("SELECT value FROM secrets WHERE name = ?1")
        .ctx("prepare secret lookup")?
        .query_row([name], |row| row.get(0))
        .optional()
        .ctx("look up secret")?;
    value
        .map(|v| {
            <[u8; 32]>::try_from(v.as_slice())
                .map_err(|_| LedgerError::corrupt(format!("secret {name:?} is not 32 bytes")))
        })
        .transpose()
}

/// Stores `fresh` under `name` unless a value exists, and returns the stored one: the first
/// writer wins, so concurrent first uses agree.
pub(super) fn create_secret(conn: &Connection, name: &str, fresh: &[u8; 32]) -> Result<[u8; 32]> {
    conn.prepare_cached("INSERT INTO secrets (name, value) VALUES (?1, ?2) ON CONFLICT DO NOTHING")
        .ctx("prepare secret insert")?
        .execute(params![name, &fresh[..]])
        .ctx("store secret")?;
    read_secret(conn, name)?.ok_or_else(|| LedgerError::Internal("stored secret vanished".into()))
}
