//! Connection settings and the schema, versioned with `PRAGMA user_version`.

use std::path::Path;
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};

use super::Ctx;
use crate::ledger::{LedgerError, Result};

/// The schema version this build writes. Bump it and add a step to [`MIGRATIONS`] to change the
/// schema; never edit a step that has shipped.
pub(super) const SCHEMA_VERSION: i64 = 10;

/// How long a connection waits for a lock held by another connection (another process on the
/// same file, or a checkpoint) before giving up with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// One schema change: plain SQL, or code for a change that must also report what it did.
enum Step {
    Sql(&'static str),
    Code(fn(&Connection) -> Result<()>),
}

/// `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`.
const MIGRATIONS: [Step; SCHEMA_VERSION as usize] = [
    Step::Sql(V1),
    Step::Sql(V2),
    Step::Code(to_v3),
    Step::Sql(V4),
    Step::Sql(V5),
    Step::Sql(V6),
    Step::Sql(V7),
    Step::Sql(V8),
    Step::Sql(V9),
    Step::Sql(V10),
];

/// Version 1.
///
/// One `tasks` row per reservation or confirmed task, so confirming is an UPDATE and quotas are
/// one COUNT over both. "Active" (holding a quota slot) is `ended_at IS NULL`: reservations and
/// non-terminal tasks; expired reservations are deleted before every count, so they never hold
/// a slot. The partial indexes cover exactly the active rows, which quotas keep small.
pub(super) const V1: &str = "
CREATE TABLE tasks (
    id                     TEXT PRIMARY KEY NOT NULL,
    confirmed              INTEGER NOT NULL DEFAULT 0 CHECK (confirmed IN (0, 1)),
    upstream_id            TEXT,
    issuer                 TEXT NOT NULL,
    subject                TEXT NOT NULL,
    tenant                 TEXT NOT NULL,
    client                 TEXT NOT NULL,
    tool                   TEXT NOT NULL,
    scopes                 TEXT NOT NULL,          -- JSON array of strings
    status                 TEXT,
    status_message         TEXT,
    created_at             INTEGER,
    last_updated_at        INTEGER,
    ttl_ms                 INTEGER,
    expires_at             INTEGER,                -- created_at + ttl_ms, saturating
    deadline_at            INTEGER,
    poll_interval_ms       INTEGER,
    end_reason             TEXT,
    ended_by               TEXT,                   -- JSON Owner
    payload                TEXT,                   -- JSON
    ended_at               INTEGER,                -- set iff terminal
    result_reads           INTEGER NOT NULL DEFAULT 0,
    idempotency_key        BLOB,
    idempotency_until      INTEGER,
    idempotency_window_ms  INTEGER,
    reservation_expires_at INTEGER,                -- reservations only
    CHECK (confirmed = 1 OR (reservation_expires_at IS NOT NULL AND ended_at IS NULL)),
    CHECK (confirmed = 0 OR (upstream_id IS NOT NULL AND status IS NOT NULL
        AND created_at IS NOT NULL AND last_updated_at IS NOT NULL AND ttl_ms IS NOT NULL
        AND expires_at IS NOT NULL AND deadline_at IS NOT NULL)),
    CHECK ((ended_at IS NULL) = (end_reason IS NULL)),
    CHECK (idempotency_key IS NULL OR idempotency_until IS NOT NULL)
) STRICT;

CREATE INDEX tasks_active_principal ON tasks (issuer, subject) WHERE ended_at IS NULL;
CREATE INDEX tasks_active_tenant ON tasks (tenant) WHERE ended_at IS NULL;
CREATE INDEX tasks_active_client ON tasks (client) WHERE ended_at IS NULL;
-- Also serves the server-wide active count (any partial index on ended_at IS NULL does).
CREATE INDEX tasks_active_deadline ON tasks (deadline_at) WHERE ended_at IS NULL;
CREATE INDEX tasks_expiry ON tasks (expires_at) WHERE confirmed = 1;
CREATE INDEX tasks_reservation_expiry ON tasks (reservation_expires_at) WHERE confirmed = 0;
-- UNIQUE: a key maps to at most one task; keys of lapsed windows are cleared before reuse.
CREATE UNIQUE INDEX tasks_idempotency ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE secrets (
    name  TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL CHECK (length(value) = 32)
) STRICT;
";

/// Version 2: the `iat` of the token that created a task, so a session revocation cancels
/// exactly the work its revoked tokens started (and none a fresh token started later).
pub(super) const V2: &str = "
ALTER TABLE tasks ADD COLUMN token_issued_at INTEGER;
";

/// Version 3, before its schema change ([`V3`]): earlier versions let one upstream task ID be
/// recorded for several tasks, which the unique index of version 3 refuses. For each such ID
/// the earliest task (by `created_at`, then insertion order) keeps it and the later ones are
/// deleted: they are the tasks of callers the server handed someone else's task (or a
/// duplicate of their own), whose stored results may be that other owner's.
pub(super) const V3_DEDUPLICATE: &str = "
DELETE FROM tasks WHERE rowid IN (
    SELECT rowid FROM (
        SELECT rowid, row_number() OVER (PARTITION BY upstream_id ORDER BY created_at, rowid) AS n
        FROM tasks WHERE confirmed = 1
    ) WHERE n > 1
)
";

/// Version 3.
///
/// - One upstream task ID, one task: a unique index over the upstream IDs of confirmed tasks
///   (reservations have none), terminal or not; deleting (purging) a task frees its ID.
/// - Tenant and client quotas count by issuer: the active indexes become (issuer, tenant) and
///   (issuer, client).
/// - The cancellation outbox: at most one pending intent per task, deleted with the task
///   (`ON DELETE CASCADE`; the writer enables foreign keys) and by `finish`. Intents exist only
///   for confirmed non-terminal tasks (the ledger's statements keep it so).
pub(super) const V3: &str = "
CREATE UNIQUE INDEX tasks_upstream ON tasks (upstream_id) WHERE upstream_id IS NOT NULL;

DROP INDEX tasks_active_tenant;
DROP INDEX tasks_active_client;
CREATE INDEX tasks_active_tenant ON tasks (issuer, tenant) WHERE ended_at IS NULL;
CREATE INDEX tasks_active_client ON tasks (issuer, client) WHERE ended_at IS NULL;

CREATE TABLE cancel_intents (
    task_id         TEXT PRIMARY KEY NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    reason          TEXT NOT NULL
        CHECK (reason IN ('owner_cancel', 'admin_cancel', 'deadline', 'revocation')),
    requested_by    TEXT,                  -- JSON Owner
    pending_message TEXT NOT NULL,
    requested_at    INTEGER NOT NULL,
    give_up_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at INTEGER NOT NULL
) STRICT;

CREATE INDEX cancel_intents_due ON cancel_intents (next_attempt_at);
";

/// Version 4: what replicas share (the same tables as the PostgreSQL ledger, so both pass one
/// conformance suite).
///
/// - Each task's home replica (empty for tasks recorded before).
/// - Replica heartbeats, named leases, and the uses of CapabilityException budgets: one row
///   per decision (the primary key makes a repeated decision spend nothing), counted per scope
///   for iterations and per exception for the per-minute rate.
pub(super) const V4: &str = "
ALTER TABLE tasks ADD COLUMN home TEXT NOT NULL DEFAULT '';
CREATE INDEX tasks_active_home ON tasks (home) WHERE ended_at IS NULL;

CREATE TABLE replicas (
    replica      TEXT PRIMARY KEY NOT NULL,
    address      TEXT,
    last_beat_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT;

CREATE TABLE leases (
    name   TEXT PRIMARY KEY NOT NULL,
    holder TEXT NOT NULL,
    until  INTEGER NOT NULL
) STRICT;

CREATE TABLE budget_uses (
    exception TEXT NOT NULL,
    decision  TEXT NOT NULL,
    scope     TEXT NOT NULL,
    task_id   TEXT,
    at        INTEGER NOT NULL,
    PRIMARY KEY (exception, decision)
) STRICT;

CREATE INDEX budget_uses_scope ON budget_uses (exception, scope, at);
CREATE INDEX budget_uses_rate ON budget_uses (exception, at);
CREATE INDEX budget_uses_task ON budget_uses (task_id) WHERE task_id IS NOT NULL;
";

/// Version 5: what a security review reconstructs a task from and re-authorizes it against.
///
/// - The task's correlation ID: the ID of the request that created it, carried by every audit
///   event of the task (empty for tasks recorded before).
/// - The object the task acts on (`tasks.objects`): the value at the tool's JSON pointer into
///   its arguments, asked about again at every later request.
pub(super) const V5: &str = "
ALTER TABLE tasks ADD COLUMN correlation_id TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN object TEXT;
";

/// Version 6: identity at minute forty. When the owner must next present a valid token
/// (`tasks.identityLease`; the deadline scan also finds leases that ended) and how long the
/// task's upstream delegation runs (`upstream.identity: delegation`). Cancellation intents may
/// now carry `identity_lease_expired` (SQLite cannot change a CHECK in place: the table is
/// rebuilt with its rows).
pub(super) const V6: &str = "
ALTER TABLE tasks ADD COLUMN lease_until INTEGER;
ALTER TABLE tasks ADD COLUMN delegated_until INTEGER;
CREATE INDEX tasks_lease ON tasks (lease_until) WHERE ended_at IS NULL AND lease_until IS NOT NULL;

CREATE TABLE cancel_intents_v6 (
    task_id         TEXT PRIMARY KEY NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    reason          TEXT NOT NULL
        CHECK (reason IN ('owner_cancel', 'admin_cancel', 'deadline', 'revocation',
                          'identity_lease_expired')),
    requested_by    TEXT,                  -- JSON Owner
    pending_message TEXT NOT NULL,
    requested_at    INTEGER NOT NULL,
    give_up_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at INTEGER NOT NULL
) STRICT;
INSERT INTO cancel_intents_v6 (task_id, reason, requested_by, pending_message, requested_at,
    give_up_at, attempts, next_attempt_at)
    SELECT task_id, reason, requested_by, pending_message, requested_at, give_up_at, attempts,
           next_attempt_at FROM cancel_intents;
DROP TABLE cancel_intents;
ALTER TABLE cancel_intents_v6 RENAME TO cancel_intents;
CREATE INDEX cancel_intents_due ON cancel_intents (next_attempt_at);
";

/// Version 7: budgets belong to the signed grant, not to the object's name.
///
/// - `budget_uses.grant_key`: the grant a use was spent under (a digest of the signed grant,
///   the same for every copy of one approval). Uses recorded before carry `''` and keep
///   counting under their exception's name until they age out or their task is purged.
/// - `budget_costs`: the cost units (`maxCostUnits`) each grant has spent over its validity,
///   kept until the grant expires (`until`, Unix ms).
pub(super) const V7: &str = "
ALTER TABLE budget_uses ADD COLUMN grant_key TEXT NOT NULL DEFAULT '';
CREATE INDEX budget_uses_grant_scope ON budget_uses (grant_key, scope, at);
CREATE INDEX budget_uses_grant_rate ON budget_uses (grant_key, at);
CREATE INDEX budget_uses_grant_decision ON budget_uses (grant_key, decision);

CREATE TABLE budget_costs (
    grant_key TEXT PRIMARY KEY NOT NULL,
    spent     INTEGER NOT NULL CHECK (spent >= 0),
    until     INTEGER NOT NULL
) STRICT;
";

/// Version 8: counters that only go up (`advance_counter`), e.g. the generation of the persisted
/// policy snapshot, so an older copy of that file is told apart from the last one written.
pub(super) const V8: &str = "
CREATE TABLE counters (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL CHECK (value >= 0)
) STRICT;
";

/// Version 9: where a task's story is in the traces. `tasks.trace` is the W3C `traceparent`
/// of the `tools/call` span that created the task (later requests about it link to that span);
/// `cancel_intents.trace` that of the span that asked for the cancellation (retries from the
/// outbox continue its trace). NULL when traces were not exported.
pub(super) const V9: &str = "
ALTER TABLE tasks ADD COLUMN trace TEXT;
ALTER TABLE cancel_intents ADD COLUMN trace TEXT;
";

/// Version 10: the key a task is bound to. `tasks.key_binding` is the stored form of the key
/// the creating token was bound to (`jkt:<thumbprint>` for DPoP, `x5t#S256:<thumbprint>` for a
/// client certificate); only requests proving that key may touch the task. NULL for bearer
/// tokens' tasks and for tasks recorded before.
pub(super) const V10: &str = "
ALTER TABLE tasks ADD COLUMN key_binding TEXT;
";

fn to_v3(conn: &Connection) -> Result<()> {
    let deleted = conn
        .execute(V3_DEDUPLICATE, [])
        .ctx("delete tasks sharing an upstream task ID")?;
    if deleted > 0 {
        tracing::warn!(
            deleted,
            "ledger migration: deleted tasks whose upstream task ID was already recorded for an \
             earlier task (one upstream task, one owner); their owners now get \"task not found\""
        );
    }
    conn.execute_batch(V3).ctx("migrate ledger schema")
}

/// Opens the write connection, switches the file to WAL and brings the schema up to date.
pub(super) fn open_writer(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).ctx("open ledger database")?;
    conn.busy_timeout(BUSY_TIMEOUT).ctx("set busy_timeout")?;
    // WAL: readers never block the writer nor each other, and a commit is one sequential append.
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .ctx("set journal_mode")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(LedgerError::Internal(format!(
            "ledger database refused WAL mode (got {mode})"
        )));
    }
    // FULL: in WAL mode, NORMAL may lose the last commits on power loss; confirm() promises
    // the task survives a crash once it returns.
    conn.pragma_update(None, "synchronous", "FULL")
        .ctx("set synchronous")?;
    conn.pragma_update(None, "foreign_keys", true)
        .ctx("set foreign_keys")?;
    // Purged tasks must leave nothing behind (payloads can be sensitive): zero freed space.
    conn.pragma_update(None, "secure_delete", true)
        .ctx("set secure_delete")?;
    stable_plans(&conn)?;
    migrate(&conn)?;
    Ok(conn)
}

/// Turns on SQLite's query planner stability guarantee: a statement's plan never depends on
/// the values bound to it. Without it, a statement whose plan looked at a bound value (every
/// `LIMIT ?n`) expires whenever its bindings are cleared or replaced, and the statement cache
/// clears them each time it takes a statement back: the scans that run on a timer (deadlines,
/// expiry, due cancellations, a replica's takeover) were parsed and planned again on every run.
/// Their plans are the same either way (checked with `EXPLAIN QUERY PLAN`): every condition a
/// partial index needs (`ended_at IS NULL`, `confirmed = 1`) is written in the SQL, never bound.
fn stable_plans(conn: &Connection) -> Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .ctx("set the query planner stability guarantee")?;
    Ok(())
}

/// Opens a connection for reads only. Opened read-write with `query_only` rather than with
/// `SQLITE_OPEN_READ_ONLY`, which cannot recreate the WAL index (`-shm`) if it is missing.
pub(super) fn open_reader(path: &Path) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).ctx("open ledger read connection")?;
    conn.busy_timeout(BUSY_TIMEOUT).ctx("set busy_timeout")?;
    conn.pragma_update(None, "query_only", true)
        .ctx("set query_only")?;
    stable_plans(&conn)?;
    Ok(conn)
}

fn migrate(conn: &Connection) -> Result<()> {
    // IMMEDIATE: two processes opening a fresh file at once must not both create the schema.
    conn.execute_batch("BEGIN IMMEDIATE")
        .ctx("begin migration")?;
    let result = migrate_in_transaction(conn);
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.execute_batch(end).ctx("end migration");
    result.and(ended)
}

fn migrate_in_transaction(conn: &Connection) -> Result<()> {
    let version: i64 = conn
        .pragma_query_one(None, "user_version")
        .ctx("read user_version")?;
    if !(0..=SCHEMA_VERSION).contains(&version) {
        return Err(LedgerError::UnsupportedSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    for (from, step) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        match step {
            Step::Sql(sql) => conn.execute_batch(sql).ctx("migrate ledger schema")?,
            Step::Code(run) => run(conn)?,
        }
        let to = from as i64 + 1;
        conn.pragma_update(None, "user_version", to)
            .ctx("write user_version")?;
    }
    Ok(())
}
