//! The statements that create tasks: reservations (quotas, idempotency), confirmations (one
//! upstream task ID, one owner), releases, and secrets. See the module doc of [`super`] for
//! how they stay atomic across replicas.

use deadpool_postgres::{GenericClient, Transaction};
use futures_util::future::{join3, try_join, try_join4};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::sql::{
    NOTIFY_SETTLED, col, exec, notify_settled, one_row, opt_row, prepared, record, rows, sql_state,
    task_columns, task_from, to_json,
};
use super::{Ctx, lock_key};
use crate::ledger::{
    Confirmation, Confirmed, KeyBinding, LedgerError, Owner, QuotaScope, Reservation,
    ReserveOutcome, Result, TaskId, TaskRecord, stored_binding,
};

/// One confirmed task by ID.
pub(super) async fn load_task<C: GenericClient>(
    c: &C,
    server: &str,
    id: &str,
) -> Result<Option<TaskRecord>> {
    opt_row(c, LOAD_TASK, &[&server, &id], "look up task")
        .await?
        .as_ref()
        .map(record)
        .transpose()
}

/// Locks the confirmed task `id` for the rest of the transaction; whether it exists. Taken
/// before reading the task (with its intent) in a separate statement, which in READ COMMITTED
/// sees every write committed before the lock was granted.
pub(super) async fn lock_task(tx: &Transaction<'_>, server: &str, id: &str) -> Result<bool> {
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

/// Deletes reservations whose expiry is at or before `now`, leaving those another transaction
/// is settling right now; returns their IDs. (A reservation, which holds the server's
/// reservation lock, voids them all with [`VOID_EXPIRED_LOCKED`].)
pub(super) async fn void_expired(
    tx: &Transaction<'_>,
    server: &str,
    now: i64,
) -> Result<Vec<String>> {
    let sql = "DELETE FROM lifeguard_tasks WHERE server = $1 AND id IN (SELECT id FROM lifeguard_tasks \
         WHERE server = $1 AND NOT confirmed AND reservation_expires_at <= $2 \
         FOR UPDATE SKIP LOCKED) RETURNING id";
    let voided = rows(tx, sql, &[&server, &now], "void expired reservations").await?;
    voided.iter().map(|r| col(r, 0)).collect()
}

/// Every reservation of a server, from any replica, takes this lock first. (`set_config(…,
/// true)` is `SET LOCAL`, in the same statement.)
const LOCK_RESERVATIONS: &str =
    "SELECT set_config('synchronous_commit', 'off', true), pg_advisory_xact_lock($1)";
/// Expired reservations, deleted by the reservation that finds them (it holds the lock).
const VOID_EXPIRED_LOCKED: &str = "DELETE FROM lifeguard_tasks WHERE server = $1 \
    AND NOT confirmed AND reservation_expires_at <= $2 RETURNING id";
const IDEMPOTENCY_HOLDER: &str = "SELECT id, confirmed, idempotency_until FROM lifeguard_tasks \
    WHERE server = $1 AND idempotency_key = $2";
/// The four counts of active tasks in one statement; each uses its own partial index. An empty
/// tenant (client) has no group to share a quota with: not counted.
const COUNT_ACTIVE: &str = "SELECT \
    (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 AND issuer = $2 \
        AND subject = $3 AND ended_at IS NULL), \
    CASE WHEN $4::text <> '' THEN (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 \
        AND issuer = $2 AND tenant = $4 AND ended_at IS NULL) ELSE 0 END, \
    CASE WHEN $5::text <> '' THEN (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 \
        AND issuer = $2 AND client = $5 AND ended_at IS NULL) ELSE 0 END, \
    (SELECT count(*) FROM lifeguard_tasks WHERE server = $1 AND ended_at IS NULL)";
const INSERT_RESERVATION: &str = "INSERT INTO lifeguard_tasks (server, id, confirmed, issuer, \
    subject, tenant, client, tool, scopes, idempotency_key, idempotency_until, \
    idempotency_window_ms, reservation_expires_at, token_issued_at, correlation_id, object, \
    lease_until, delegated_until, trace, key_binding) \
    VALUES ($1, $2, FALSE, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
    $19)";

/// Returns the outcome and the IDs of the expired reservations it voided on the way.
///
/// Two round trips inside the transaction: the lock, the void, the idempotency lookup and the
/// counts in one pipeline (each statement starts after the one before it ended, so all of them
/// see every reservation committed before the lock was granted, and nobody else's can commit
/// before this one does), then the insert with the settlement notices.
pub(super) async fn reserve(
    tx: &Transaction<'_>,
    server: &str,
    r: &Reservation,
) -> Result<(ReserveOutcome, Vec<String>)> {
    // A reservation need not reach the disk before it is answered: one lost in a crash is a
    // slot nobody was told about (the client got no task), and the confirmation that makes it
    // a task is a synchronous commit, which flushes the write-ahead log up to and including
    // this transaction. Not waiting for the flush here keeps the server's reservation lock
    // held for microseconds instead of a disk flush: creations serialize on it.
    const LOCKING: &str = "lock the server's reservations";
    const VOIDING: &str = "void expired reservations";
    const HOLDER: &str = "look up idempotency key";
    const COUNTING: &str = "count active tasks";
    let lock = prepared(tx, LOCK_RESERVATIONS, LOCKING).await?;
    let void = prepared(tx, VOID_EXPIRED_LOCKED, VOIDING).await?;
    let holder = prepared(tx, IDEMPOTENCY_HOLDER, HOLDER).await?;
    let count = prepared(tx, COUNT_ACTIVE, COUNTING).await?;
    let key = lock_key(&["reserve", server]);
    let claim = r.idempotency.as_ref().map(|c| &c.key_hash[..]);
    let o = &r.owner;
    let (_, voided, holder, counts) = try_join4(
        async { tx.execute(&lock, &[&key]).await.ctx(LOCKING) },
        async { tx.query(&void, &[&server, &r.now]).await.ctx(VOIDING) },
        async {
            match claim {
                Some(claim) => tx.query_opt(&holder, &[&server, &claim]).await.ctx(HOLDER),
                None => Ok(None),
            }
        },
        async {
            let params: [&(dyn ToSql + Sync); 5] =
                [&server, &o.issuer, &o.subject, &o.tenant, &o.client];
            tx.query_one(&count, &params).await.ctx(COUNTING)
        },
    )
    .await?;
    let voided: Vec<String> = voided.iter().map(|r| col(r, 0)).collect::<Result<_>>()?;
    let outcome = reserve_slot(tx, server, r, holder, &counts, &voided).await?;
    Ok((outcome, voided))
}

/// The rest of [`reserve`] once the lock is held: `holder` is the task holding the claimed
/// idempotency key, `counts` the active tasks, `voided` the reservations just voided (their
/// notices go with the insert).
async fn reserve_slot(
    tx: &Transaction<'_>,
    server: &str,
    r: &Reservation,
    holder: Option<Row>,
    counts: &Row,
    voided: &[String],
) -> Result<ReserveOutcome> {
    if let Some(holder) = holder {
        notify_settled(tx, server, voided).await?;
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
        return insert_reservation(tx, server, r, counts, &[]).await;
    }
    insert_reservation(tx, server, r, counts, voided).await
}

/// Inserts the reservation when `counts` leave room under every quota, announcing `voided` in
/// the same round trip.
async fn insert_reservation(
    tx: &Transaction<'_>,
    server: &str,
    r: &Reservation,
    counts: &Row,
    voided: &[String],
) -> Result<ReserveOutcome> {
    let o = &r.owner;
    let (principal, tenant, client, all): (i64, i64, i64, i64) = (
        col(counts, 0)?,
        col(counts, 1)?,
        col(counts, 2)?,
        col(counts, 3)?,
    );
    let limits = &r.limits;
    let over = if principal >= i64::from(limits.per_principal) {
        Some(QuotaScope::Principal)
    } else if !o.tenant.is_empty() && tenant >= i64::from(limits.per_tenant) {
        Some(QuotaScope::Tenant)
    } else if !o.client.is_empty() && client >= i64::from(limits.per_client) {
        Some(QuotaScope::Client)
    } else if all >= i64::from(limits.per_server) {
        Some(QuotaScope::Server)
    } else {
        None
    };
    if let Some(scope) = over {
        notify_settled(tx, server, voided).await?;
        return Ok(ReserveOutcome::OverQuota(scope));
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
    let binding = r.binding.as_ref().map(KeyBinding::to_stored);
    const INSERTING: &str = "insert reservation";
    let insert = prepared(tx, INSERT_RESERVATION, INSERTING).await?;
    let params: [&(dyn ToSql + Sync); 19] = [
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
        &r.correlation_id,
        &r.object,
        &r.lease_until,
        &r.delegated_until,
        &r.trace,
        &binding,
    ];
    if voided.is_empty() {
        tx.execute(&insert, &params).await.ctx(INSERTING)?;
    } else {
        let notify = prepared(tx, NOTIFY_SETTLED, "announce settled reservations").await?;
        try_join(
            async { tx.execute(&insert, &params).await.ctx(INSERTING) },
            async {
                tx.execute(&notify, &[&server, &voided])
                    .await
                    .ctx("announce settled reservations")
            },
        )
        .await?;
    }
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

/// Locks the reservation: a concurrent confirm, release or sweep of it waits for this one.
const LOCK_RESERVATION: &str = "SELECT idempotency_until, idempotency_window_ms, issuer, \
    subject, tenant, client, key_binding FROM lifeguard_tasks \
    WHERE server = $1 AND id = $2 AND NOT confirmed FOR UPDATE";
const UPSTREAM_HOLDER: &str = "SELECT id, issuer, subject, tenant, client, key_binding \
    FROM lifeguard_tasks WHERE server = $1 AND upstream_space = $3 AND upstream_id = $2 \
    AND confirmed";
const CONFIRM: &str = "UPDATE lifeguard_tasks SET confirmed = TRUE, upstream_id = $3, \
    status = $4, status_message = $5, created_at = $6, last_updated_at = $6, ttl_ms = $7, \
    expires_at = $8, deadline_at = $9, poll_interval_ms = $10, idempotency_until = $11, \
    reservation_expires_at = NULL, home = $12, upstream_space = $13 \
    WHERE server = $1 AND id = $2 AND NOT confirmed";
const LOAD_TASK: &str = concat!(
    "SELECT ",
    task_columns!(),
    " FROM ",
    task_from!(),
    " WHERE t.server = $1 AND t.id = $2 AND t.confirmed"
);

/// Whom a task or reservation belongs to: its owner and the key it is bound to, read from the
/// five columns starting at `first` (issuer, subject, tenant, client, key_binding). Two rows
/// belong to the same caller only when both are equal: a task bound to a key is not the task of
/// the same owner's token bound to another key, or to none.
fn ownership(row: &Row, first: usize) -> Result<(Owner, Option<KeyBinding>)> {
    let owner = Owner {
        issuer: col(row, first)?,
        subject: col(row, first + 1)?,
        tenant: col(row, first + 2)?,
        client: col(row, first + 3)?,
    };
    Ok((owner, stored_binding(col(row, first + 4)?)?))
}

/// The confirmation's answer, or `None` when it lost a race on the upstream ID index: the
/// transaction is aborted; roll it back and try again (the winner is visible then).
///
/// Two round trips inside the transaction: the reservation's lock with the upstream ID's
/// lookup, then the update with its notice and the read of the task it made (see
/// [`prepared`] for pipelines).
pub(super) async fn confirm(
    tx: &Transaction<'_>,
    server: &str,
    id: &str,
    c: &Confirmation,
    home: &str,
    space: &str,
) -> Result<Option<Confirmed>> {
    const LOCKING: &str = "look up reservation";
    const HOLDER: &str = "look up upstream ID";
    let lock = prepared(tx, LOCK_RESERVATION, LOCKING).await?;
    let lookup = prepared(tx, UPSTREAM_HOLDER, HOLDER).await?;
    // One upstream task, one owner (and key). The unique index is the backstop for a concurrent
    // confirmation of the same upstream ID that this lookup cannot see yet.
    let (reservation, holder) = try_join(
        async { tx.query_opt(&lock, &[&server, &id]).await.ctx(LOCKING) },
        async {
            tx.query_opt(&lookup, &[&server, &c.upstream_id, &space])
                .await
                .ctx(HOLDER)
        },
    )
    .await?;
    let Some(reservation) = reservation else {
        return Err(LedgerError::NoReservation);
    };
    let until: Option<i64> = col(&reservation, 0)?;
    let window: Option<i64> = col(&reservation, 1)?;
    let caller = ownership(&reservation, 2)?;
    let settled = [id.to_owned()];

    if let Some(holder) = holder {
        let holder_id: String = col(&holder, 0)?;
        let holder_ownership = ownership(&holder, 1)?;
        let sql = "DELETE FROM lifeguard_tasks WHERE server = $1 AND id = $2 AND NOT confirmed";
        exec(tx, sql, &[&server, &id], "release reservation").await?;
        notify_settled(tx, server, &settled).await?;
        if holder_ownership != caller {
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
    const CONFIRMING: &str = "confirm task";
    const NOTIFYING: &str = "announce settled reservations";
    const LOADING: &str = "look up task";
    let update = prepared(tx, CONFIRM, CONFIRMING).await?;
    let notify = prepared(tx, NOTIFY_SETTLED, NOTIFYING).await?;
    let load = prepared(tx, LOAD_TASK, LOADING).await?;
    let expires_at = c.created_at.saturating_add(c.ttl_ms);
    let params: [&(dyn ToSql + Sync); 13] = [
        &server,
        &id,
        &c.upstream_id,
        &c.status.as_str(),
        &c.status_message,
        &c.created_at,
        &c.ttl_ms,
        &expires_at,
        &c.deadline_at,
        &c.poll_interval_ms,
        &until,
        &home,
        &space,
    ];
    // Not `try_join3`: when the update loses the race on the upstream ID index, the statements
    // after it fail only because the transaction is aborted; the update's answer decides.
    let (updated, notified, loaded) = join3(
        async { tx.execute(&update, &params).await.ctx(CONFIRMING) },
        async {
            tx.execute(&notify, &[&server, &&settled[..]])
                .await
                .ctx(NOTIFYING)
        },
        async { tx.query_opt(&load, &[&server, &id]).await.ctx(LOADING) },
    )
    .await;
    match updated {
        Ok(_) => {}
        Err(e) if sql_state(&e) == Some(&SqlState::UNIQUE_VIOLATION) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    }
    notified?;
    let record = loaded?
        .as_ref()
        .map(record)
        .transpose()?
        .ok_or_else(|| LedgerError::Internal("confirmed task vanished".into()))?;
    Ok(Some(Confirmed::New(record)))
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
