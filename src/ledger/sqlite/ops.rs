//! The ledger's statements. Every function here runs on a connection the caller chose: writes
//! inside the writer's transaction (under a savepoint), reads on a read connection.

use rusqlite::{Connection, OptionalExtension, params};

use super::Ctx;
use super::rows::{
    RawTask, TASK_COLUMN_COUNT, TASK_COLUMNS, TASK_FROM, collect, load_task, sql_limit,
};
use crate::ledger::{
    BUDGET_USE_HORIZON_MS, CancelIntent, CancelRequest, Confirmation, Confirmed, Finish,
    FinishOutcome, KeyBinding, LedgerError, Owner, PendingCancel, PrincipalFilter, PurgedTask,
    QuotaScope, Reservation, ReserveOutcome, Result, TaskId, TaskRecord, TaskStatus,
    stored_binding,
};

fn to_json<T: serde::Serialize + ?Sized>(value: &T, what: &str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| LedgerError::storage(format!("encode {what}"), e))
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
         token_issued_at, correlation_id, object, lease_until, delegated_until, trace, \
         key_binding) \
         VALUES (?1, 0, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
         ?18)",
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
        r.trace,
        r.binding.as_ref().map(KeyBinding::to_stored),
    ])
    .ctx("insert reservation")?;
    Ok(ReserveOutcome::Reserved)
}

/// Whom a task or reservation belongs to: its owner and the key it is bound to. Two rows
/// belong to the same caller only when both are equal: a task bound to a key is not the task of
/// the same owner's token bound to another key, or to none.
type Ownership = (Owner, Option<KeyBinding>);

/// [`Ownership`] as a row has it: the binding still in its stored form.
type RawOwnership = (Owner, Option<String>);

/// The owner columns and `key_binding` of a row, starting at column `first` (both lookups
/// below select them in that order).
fn raw_ownership(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<RawOwnership> {
    Ok((
        Owner {
            issuer: row.get(first)?,
            subject: row.get(first + 1)?,
            tenant: row.get(first + 2)?,
            client: row.get(first + 3)?,
        },
        row.get(first + 4)?,
    ))
}

fn ownership((owner, binding): RawOwnership) -> Result<Ownership> {
    Ok((owner, stored_binding(binding)?))
}

/// The ID and ownership of the confirmed task holding `upstream_id`, if any.
fn upstream_holder(conn: &Connection, upstream_id: &str) -> Result<Option<(String, Ownership)>> {
    let found = conn
        .prepare_cached(
            "SELECT id, issuer, subject, tenant, client, key_binding FROM tasks \
             WHERE upstream_id = ?1 AND confirmed = 1",
        )
        .ctx("prepare upstream ID lookup")?
        .query_row([upstream_id], |row| {
            Ok((row.get(0)?, raw_ownership(row, 1)?))
        })
        .optional()
        .ctx("look up upstream ID")?;
    found.map(|(id, raw)| Ok((id, ownership(raw)?))).transpose()
}

pub(super) fn confirm(
    conn: &Connection,
    id: &str,
    c: &Confirmation,
    home: &str,
) -> Result<Confirmed> {
    let reservation: Option<(Option<i64>, Option<i64>, RawOwnership)> = conn
        .prepare_cached(
            "SELECT idempotency_until, idempotency_window_ms, issuer, subject, tenant, client, \
             key_binding FROM tasks WHERE id = ?1 AND confirmed = 0",
        )
        .ctx("prepare reservation lookup")?
        .query_row([id], |row| {
            Ok((row.get(0)?, row.get(1)?, raw_ownership(row, 2)?))
        })
        .optional()
        .ctx("look up reservation")?;
    let Some((until, window, caller)) = reservation else {
        return Err(LedgerError::NoReservation);
    };
    let caller = ownership(caller)?;
    // One upstream task, one owner (and key). Decided here, inside the writer's transaction;
    // the unique index `tasks_upstream` is the backstop.
    if let Some((holder_id, holder)) = upstream_holder(conn, &c.upstream_id)? {
        release(conn, id)?;
        if holder != caller {
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
         requested_at, give_up_at, attempts, next_attempt_at, trace) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?5, ?7)",
    )
    .ctx("prepare cancellation intent insert")?
    .execute(params![
        id,
        intent.reason.as_str(),
        by,
        intent.pending_message,
        intent.requested_at,
        intent.give_up_at,
        intent.trace,
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
