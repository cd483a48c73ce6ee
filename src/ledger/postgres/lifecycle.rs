//! The statements of a task's life after confirmation: observed statuses, terminal
//! transitions, the cancellation outbox, result reads, deadlines, retention and revocation
//! lookups.

use deadpool_postgres::{GenericClient, Transaction};

use super::ops::{load_task, lock_task, void_expired};
use super::sql::{
    TASK_COLUMN_COUNT, col, exec, notify_settled, opt_row, record, records, rows, sql_limit,
    task_columns, task_from, to_json,
};
use crate::ledger::{
    CancelIntent, CancelRequest, Finish, FinishOutcome, LedgerError, PendingCancel,
    PrincipalFilter, PurgedTask, Result, TaskId, TaskRecord, TaskStatus,
};

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
               pending_message, requested_at, give_up_at, attempts, next_attempt_at, trace) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $6, $8) ON CONFLICT DO NOTHING";
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
            &intent.trace,
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

pub(super) async fn renew_identity<C: GenericClient>(
    c: &C,
    server: &str,
    id: &str,
    lease_until: Option<i64>,
    delegated_until: Option<i64>,
) -> Result<bool> {
    let sql = "UPDATE lifeguard_tasks SET \
                 lease_until = CASE WHEN $3::bigint > COALESCE(lease_until, -1) \
                   THEN $3 ELSE lease_until END, \
                 delegated_until = CASE WHEN $4::bigint > COALESCE(delegated_until, -1) \
                   THEN $4 ELSE delegated_until END \
               WHERE server = $1 AND id = $2 AND confirmed AND ended_at IS NULL \
                 AND ($3::bigint > COALESCE(lease_until, -1) \
                   OR $4::bigint > COALESCE(delegated_until, -1))";
    let changed = exec(
        c,
        sql,
        &[&server, &id, &lease_until, &delegated_until],
        "renew identity",
    )
    .await?;
    Ok(changed > 0)
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
        " WHERE t.server = $1 AND t.ended_at IS NULL AND t.confirmed \
         AND (t.deadline_at <= $2 OR t.lease_until <= $2) \
         AND c.task_id IS NULL \
         ORDER BY LEAST(t.deadline_at, COALESCE(t.lease_until, t.deadline_at)), t.id LIMIT $3"
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
) -> Result<(Vec<PurgedTask>, Vec<String>)> {
    // SKIP LOCKED: rows another transaction holds are left for the next purge, so two purges
    // (or a purge and a finish) never wait on each other in opposite orders.
    let voided = void_expired(tx, server, now).await?;
    notify_settled(tx, server, &voided).await?;
    // Their cancellation intents go with them (ON DELETE CASCADE). The victims are chosen once,
    // in a materialized CTE: as `id IN (SELECT … LIMIT $3 FOR UPDATE SKIP LOCKED)` the planner
    // may rescan the subquery for every row it deletes (a nested-loop semi join), and each
    // rescan, skipping the rows just deleted, picks the next ones, so LIMIT bounded nothing.
    let sql = "WITH doomed AS MATERIALIZED (SELECT id FROM lifeguard_tasks \
               WHERE server = $1 AND confirmed AND expires_at <= $2 \
               ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED) \
               DELETE FROM lifeguard_tasks AS t USING doomed WHERE t.server = $1 AND t.id = doomed.id \
               RETURNING t.id, t.correlation_id";
    let purged = rows(
        tx,
        sql,
        &[&server, &now, &sql_limit(limit)],
        "purge expired tasks",
    )
    .await?;
    let purged: Vec<PurgedTask> = purged
        .iter()
        .map(|r| {
            Ok(PurgedTask {
                id: TaskId::from_string(col::<String>(r, 0)?),
                correlation_id: col(r, 1)?,
            })
        })
        .collect::<Result<_>>()?;
    let ids: Vec<String> = purged.iter().map(|p| p.id.as_str().to_owned()).collect();
    super::replicas::forget_budget_uses(tx, server, &ids, now).await?;
    Ok((purged, voided))
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
        " WHERE t.server = $1 AND t.issuer = $2 AND ($3::text IS NULL OR t.subject = $3) \
         AND t.ended_at IS NULL AND t.confirmed AND ($4::text IS NULL OR t.tenant = $4) \
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
