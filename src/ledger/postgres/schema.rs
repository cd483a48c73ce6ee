//! The schema, versioned in `lifeguard_schema_migrations`.
//!
//! Every table is prefixed `lifeguard_` and created in the connection's default schema (the
//! first of its `search_path`). Every table but the version table has a `server` column, first
//! in its primary key and in every index: one database holds the ledgers of many MCP servers,
//! and every statement filters on its server. The version table is the database's.
//!
//! Migrations run at open, on one connection, under a session advisory lock
//! ([`MIGRATION_LOCK`]): many sidecars starting at once take turns, and the first brings the
//! schema up to date for the rest. Each version commits in its own transaction with its row in
//! the version table. A database at a newer version than this build is refused untouched.

use tokio_postgres::Client;

use super::Ctx;
use crate::ledger::{LedgerError, Result};

/// The schema version this build writes. Add a step to [`MIGRATIONS`] to change the schema;
/// never edit one that has shipped.
pub const SCHEMA_VERSION: i64 = 8;

/// Session advisory lock held while migrating (`"lifeguar"` in ASCII).
pub const MIGRATION_LOCK: i64 = 0x6c69_6665_6775_6172;

/// `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [V1, V2, V3, V4, V5, V6, V7, V8];

/// Version 1: SQLite's versions 1 to 4 together, scoped by server.
///
/// One `lifeguard_tasks` row per reservation or confirmed task (confirming is an UPDATE; quotas
/// are one count over both). "Active" (holding a quota slot) is `ended_at IS NULL`. The partial
/// unique indexes make an upstream task ID belong to one task of a server, or of one replica's
/// server with per-replica state (reservations have none) and an idempotency key map to one task. Cancel intents go with their task (`ON DELETE
/// CASCADE`). JSON values (scopes, owners, payloads) are stored as text, exactly as serialized.
const V1: &str = "
CREATE TABLE lifeguard_tasks (
    server                 TEXT NOT NULL,
    id                     TEXT NOT NULL,
    confirmed              BOOLEAN NOT NULL DEFAULT FALSE,
    upstream_id            TEXT,
    -- Where the upstream ID is unique: '' for servers sharing task state, the home replica
    -- for per-replica state (each replica's server numbers its own tasks).
    upstream_space         TEXT NOT NULL DEFAULT '',
    issuer                 TEXT NOT NULL,
    subject                TEXT NOT NULL,
    tenant                 TEXT NOT NULL,
    client                 TEXT NOT NULL,
    tool                   TEXT NOT NULL,
    scopes                 TEXT NOT NULL,
    status                 TEXT,
    status_message         TEXT,
    created_at             BIGINT,
    last_updated_at        BIGINT,
    ttl_ms                 BIGINT,
    expires_at             BIGINT,
    deadline_at            BIGINT,
    poll_interval_ms       BIGINT,
    end_reason             TEXT,
    ended_by               TEXT,
    payload                TEXT,
    ended_at               BIGINT,
    result_reads           BIGINT NOT NULL DEFAULT 0,
    idempotency_key        BYTEA,
    idempotency_until      BIGINT,
    idempotency_window_ms  BIGINT,
    reservation_expires_at BIGINT,
    token_issued_at        BIGINT,
    home                   TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (server, id),
    CHECK (confirmed OR (reservation_expires_at IS NOT NULL AND ended_at IS NULL)),
    CHECK (NOT confirmed OR (upstream_id IS NOT NULL AND status IS NOT NULL
        AND created_at IS NOT NULL AND last_updated_at IS NOT NULL AND ttl_ms IS NOT NULL
        AND expires_at IS NOT NULL AND deadline_at IS NOT NULL)),
    CHECK ((ended_at IS NULL) = (end_reason IS NULL)),
    CHECK (idempotency_key IS NULL OR idempotency_until IS NOT NULL)
);

CREATE INDEX lifeguard_tasks_active_principal ON lifeguard_tasks (server, issuer, subject)
    WHERE ended_at IS NULL;
CREATE INDEX lifeguard_tasks_active_tenant ON lifeguard_tasks (server, issuer, tenant)
    WHERE ended_at IS NULL;
CREATE INDEX lifeguard_tasks_active_client ON lifeguard_tasks (server, issuer, client)
    WHERE ended_at IS NULL;
CREATE INDEX lifeguard_tasks_active_deadline ON lifeguard_tasks (server, deadline_at)
    WHERE ended_at IS NULL;
CREATE INDEX lifeguard_tasks_active_home ON lifeguard_tasks (server, home)
    WHERE ended_at IS NULL;
CREATE INDEX lifeguard_tasks_expiry ON lifeguard_tasks (server, expires_at) WHERE confirmed;
CREATE INDEX lifeguard_tasks_reservation_expiry ON lifeguard_tasks (server, reservation_expires_at)
    WHERE NOT confirmed;
CREATE UNIQUE INDEX lifeguard_tasks_idempotency ON lifeguard_tasks (server, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX lifeguard_tasks_upstream
    ON lifeguard_tasks (server, upstream_space, upstream_id) WHERE upstream_id IS NOT NULL;

CREATE TABLE lifeguard_cancel_intents (
    server          TEXT NOT NULL,
    task_id         TEXT NOT NULL,
    reason          TEXT NOT NULL
        CHECK (reason IN ('owner_cancel', 'admin_cancel', 'deadline', 'revocation')),
    requested_by    TEXT,
    pending_message TEXT NOT NULL,
    requested_at    BIGINT NOT NULL,
    give_up_at      BIGINT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at BIGINT NOT NULL,
    PRIMARY KEY (server, task_id),
    FOREIGN KEY (server, task_id) REFERENCES lifeguard_tasks (server, id) ON DELETE CASCADE
);

CREATE INDEX lifeguard_cancel_intents_due ON lifeguard_cancel_intents (server, next_attempt_at);

CREATE TABLE lifeguard_secrets (
    server TEXT NOT NULL,
    name   TEXT NOT NULL,
    value  BYTEA NOT NULL CHECK (length(value) = 32),
    PRIMARY KEY (server, name)
);

CREATE TABLE lifeguard_replicas (
    server       TEXT NOT NULL,
    replica      TEXT NOT NULL,
    address      TEXT,
    last_beat_at BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (server, replica)
);

CREATE TABLE lifeguard_leases (
    server     TEXT NOT NULL,
    name       TEXT NOT NULL,
    holder     TEXT NOT NULL,
    held_until BIGINT NOT NULL,
    PRIMARY KEY (server, name)
);

CREATE TABLE lifeguard_budget_uses (
    server    TEXT NOT NULL,
    exception TEXT NOT NULL,
    decision  TEXT NOT NULL,
    scope     TEXT NOT NULL,
    task_id   TEXT,
    used_at   BIGINT NOT NULL,
    PRIMARY KEY (server, exception, decision)
);

CREATE INDEX lifeguard_budget_uses_scope ON lifeguard_budget_uses (server, exception, scope, used_at);
CREATE INDEX lifeguard_budget_uses_rate ON lifeguard_budget_uses (server, exception, used_at);
CREATE INDEX lifeguard_budget_uses_task ON lifeguard_budget_uses (server, task_id)
    WHERE task_id IS NOT NULL;
";

/// Version 2 (SQLite's version 5): each task's correlation ID (the ID of the request that
/// created it; empty for tasks recorded before) and the object it acts on (`tasks.objects`).
const V2: &str = "
ALTER TABLE lifeguard_tasks ADD COLUMN correlation_id TEXT NOT NULL DEFAULT '';
ALTER TABLE lifeguard_tasks ADD COLUMN object TEXT;
";

/// Version 3 (SQLite's version 6): when the owner must next present a valid token
/// (`tasks.identityLease`) and how long the task's upstream delegation runs.
const V3: &str = "
ALTER TABLE lifeguard_tasks ADD COLUMN lease_until BIGINT;
ALTER TABLE lifeguard_tasks ADD COLUMN delegated_until BIGINT;
CREATE INDEX lifeguard_tasks_lease ON lifeguard_tasks (server, lease_until)
    WHERE ended_at IS NULL AND lease_until IS NOT NULL;
ALTER TABLE lifeguard_cancel_intents
    DROP CONSTRAINT lifeguard_cancel_intents_reason_check,
    ADD CONSTRAINT lifeguard_cancel_intents_reason_check
        CHECK (reason IN ('owner_cancel', 'admin_cancel', 'deadline', 'revocation',
                          'identity_lease_expired'));
";

/// Version 4 (SQLite's version 7): budgets belong to the signed grant, not to the object's
/// name (`grant_key`: a digest of the signed grant, the same for every copy of one approval;
/// uses recorded before carry `''` and count under their exception's name), and the cost units
/// each grant has spent over its validity (`lifeguard_budget_costs`, kept until it expires).
const V4: &str = "
ALTER TABLE lifeguard_budget_uses ADD COLUMN grant_key TEXT NOT NULL DEFAULT '';
CREATE INDEX lifeguard_budget_uses_grant_scope
    ON lifeguard_budget_uses (server, grant_key, scope, used_at);
CREATE INDEX lifeguard_budget_uses_grant_rate ON lifeguard_budget_uses (server, grant_key, used_at);
CREATE INDEX lifeguard_budget_uses_grant_decision
    ON lifeguard_budget_uses (server, grant_key, decision);

CREATE TABLE lifeguard_budget_costs (
    server     TEXT NOT NULL,
    grant_key  TEXT NOT NULL,
    spent      BIGINT NOT NULL CHECK (spent >= 0),
    held_until BIGINT NOT NULL,
    PRIMARY KEY (server, grant_key)
);
";

/// Version 5 (SQLite's version 8): counters that only go up (`advance_counter`), e.g. the
/// generation of each replica's persisted policy snapshot.
const V5: &str = "
CREATE TABLE lifeguard_counters (
    server TEXT NOT NULL,
    name   TEXT NOT NULL,
    value  BIGINT NOT NULL CHECK (value >= 0),
    PRIMARY KEY (server, name)
);
";

/// Version 6 (SQLite's version 9): where a task's story is in the traces. `trace` of a task
/// is the W3C `traceparent` of the `tools/call` span that created it, `trace` of an intent that
/// of the span that asked for the cancellation; NULL when traces were not exported.
const V6: &str = "
ALTER TABLE lifeguard_tasks ADD COLUMN trace TEXT;
ALTER TABLE lifeguard_cancel_intents ADD COLUMN trace TEXT;
";

/// Version 7: request-rate limits held across replicas (`spec.rateLimits`). One token bucket
/// per server and bucket ID: its level (`tokens`) when last charged (`updated_at`, Unix ms on
/// the database's clock), the rate and burst it was last charged with, the tokens the last
/// charge took (`last_granted`, returned to the charging replica) and when it will be full
/// again (`full_at`): a bucket full by then is the same as none and is purged.
const V7: &str = "
CREATE TABLE lifeguard_rate_buckets (
    server       TEXT NOT NULL,
    bucket       TEXT NOT NULL,
    tokens       DOUBLE PRECISION NOT NULL,
    rate         DOUBLE PRECISION NOT NULL CHECK (rate > 0),
    burst        INTEGER NOT NULL CHECK (burst >= 1),
    updated_at   BIGINT NOT NULL,
    last_granted INTEGER NOT NULL CHECK (last_granted >= 0),
    full_at      BIGINT NOT NULL,
    PRIMARY KEY (server, bucket)
);
CREATE INDEX lifeguard_rate_buckets_full ON lifeguard_rate_buckets (server, full_at);
";

/// Version 8 (SQLite's version 10, for the tasks): the key a task is bound to, and the DPoP
/// proofs replicas have seen. `key_binding` is the stored form of the key the creating token was
/// bound to (`jkt:<thumbprint>` or `x5t#S256:<thumbprint>`; NULL for bearer tokens' tasks and
/// for tasks recorded before): only requests proving that key may touch the task.
/// `lifeguard_proof_uses` holds one row per proof used (`digest`: SHA-256 over its key's
/// thumbprint and `jti`) until `until` (Unix ms), when the proof could no longer be accepted
/// anyway: a proof found there unexpired is a replay, on whichever replica it was first used.
const V8: &str = "
ALTER TABLE lifeguard_tasks ADD COLUMN key_binding TEXT;

CREATE TABLE lifeguard_proof_uses (
    server TEXT NOT NULL,
    digest BYTEA NOT NULL CHECK (length(digest) = 32),
    until  BIGINT NOT NULL,
    PRIMARY KEY (server, digest)
);
CREATE INDEX lifeguard_proof_uses_until ON lifeguard_proof_uses (server, until);
";

/// Brings the schema up to date under [`MIGRATION_LOCK`], on `client` (a connection of its
/// own: the session lock goes with it if anything fails midway).
pub async fn migrate(client: &mut Client) -> Result<()> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .ctx("take the migration lock")?;
    let migrated = migrate_locked(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .ctx("release the migration lock");
    migrated.and(unlocked.map(drop))
}

/// The version recorded in the database (0 for none).
pub async fn version(client: &Client) -> Result<i64> {
    let row = client
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM lifeguard_schema_migrations",
            &[],
        )
        .await
        .ctx("read the schema version")?;
    Ok(row.get(0))
}

async fn migrate_locked(client: &mut Client) -> Result<()> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS lifeguard_schema_migrations (
                version    BIGINT PRIMARY KEY,
                applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
            )",
        )
        .await
        .ctx("create the schema version table")?;
    let found = version(client).await?;
    if !(0..=SCHEMA_VERSION).contains(&found) {
        return Err(LedgerError::UnsupportedSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let to = from as i64 + 1;
        let tx = client.transaction().await.ctx("begin migration")?;
        tx.batch_execute(sql).await.ctx("migrate ledger schema")?;
        tx.execute(
            "INSERT INTO lifeguard_schema_migrations (version) VALUES ($1)",
            &[&to],
        )
        .await
        .ctx("record the schema version")?;
        tx.commit().await.ctx("commit migration")?;
        tracing::info!(version = to, "ledger schema migrated");
    }
    Ok(())
}
