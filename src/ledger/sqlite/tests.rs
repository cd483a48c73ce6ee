use std::path::Path;
use std::sync::Arc;

use rusqlite::Connection;
use serde_json::json;
use tempfile::TempDir;

use super::SqliteLedger;
use crate::ledger::conformance::{self, NOW, UNLIMITED, confirmation, fresh_owner, reservation};
use crate::ledger::model_check;
use crate::ledger::{
    CancelRequest, Confirmed, EndReason, Ending, Finish, FinishOutcome, LedgerError, LedgerScope,
    ReserveOutcome, TaskId, TaskLedger, TaskStatus,
};

fn fresh() -> (TempDir, SqliteLedger) {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = SqliteLedger::open(&dir.path().join("ledger.db")).expect("open ledger");
    (dir, ledger)
}

conformance::ledger_conformance_tests!(async || fresh());

/// The model-based tests' storage: a file per case, opened once per replica.
struct Files;

#[async_trait::async_trait]
impl model_check::Storage for Files {
    async fn open(
        &self,
        server: &str,
    ) -> (Vec<Box<dyn TaskLedger>>, Box<dyn std::any::Any + Send>) {
        // In memory where there is a tmpfs: the cases fsync thousands of commits.
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        };
        let dir = dir.expect("temp dir");
        let path = dir.path().join("ledger.db");
        let ledgers = (0..model_check::model::REPLICAS)
            .map(|r| {
                let scope = LedgerScope {
                    server: server.into(),
                    replica: model_check::sut::replica(r),
                };
                let ledger = SqliteLedger::open_scoped(&path, scope).expect("open ledger");
                Box::new(ledger) as Box<dyn TaskLedger>
            })
            .collect();
        (ledgers, Box::new(dir))
    }

    fn replica_spaces(&self) -> bool {
        false
    }
}

model_check::ledger_model_tests!(async || Files, 256);

/// Waiters leave nothing behind, whether their reservation settles or they give up.
#[tokio::test(flavor = "multi_thread")]
async fn settlement_waiters_leave_nothing_behind() {
    let (_dir, ledger) = fresh();
    let owner = fresh_owner();
    let r = reservation(&owner, UNLIMITED);
    let id = r.id.clone();
    ledger.reserve(r).await.unwrap();

    let mut gives_up = ledger.wait_settled(&id);
    let mut waits = ledger.wait_settled(&id);
    assert!(futures_util::poll!(&mut gives_up).is_pending());
    assert!(futures_util::poll!(&mut waits).is_pending());
    assert_eq!(ledger.settlements.tracked(), 1);
    drop(gives_up); // as a caller's timeout would
    assert_eq!(
        ledger.settlements.tracked(),
        1,
        "the other waiter still waits"
    );
    let confirmed = ledger.confirm(&id, confirmation(NOW)).await.unwrap();
    assert!(matches!(confirmed, Confirmed::New(_)));
    waits.await.unwrap();
    assert_eq!(ledger.settlements.tracked(), 0);

    let r = reservation(&owner, UNLIMITED);
    let id = r.id.clone();
    ledger.reserve(r).await.unwrap();
    let mut gives_up = ledger.wait_settled(&id);
    assert!(futures_util::poll!(&mut gives_up).is_pending());
    drop(gives_up);
    assert_eq!(ledger.settlements.tracked(), 0);
}

fn raw(path: &Path) -> Connection {
    Connection::open(path).expect("open raw connection")
}

#[tokio::test(flavor = "multi_thread")]
async fn reopening_keeps_tasks_secrets_and_settings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let ledger = SqliteLedger::open(&path).unwrap();
    let owner = fresh_owner();
    let r = reservation(&owner, UNLIMITED);
    let id = r.id.clone();
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    let Confirmed::New(confirmed) = ledger.confirm(&id, confirmation(NOW)).await.unwrap() else {
        panic!("a fresh upstream ID confirms as new");
    };
    let key = ledger.secret("audit").await.unwrap();
    ledger.close().unwrap();

    let ledger = SqliteLedger::open(&path).unwrap();
    assert_eq!(ledger.get(&id).await.unwrap(), Some(confirmed));
    assert_eq!(ledger.secret("audit").await.unwrap(), key);
    drop(ledger);

    let conn = raw(&path);
    let mode: String = conn.pragma_query_one(None, "journal_mode").unwrap();
    assert_eq!(mode, "wal");
    let version: i64 = conn.pragma_query_one(None, "user_version").unwrap();
    assert_eq!(version, super::schema::SCHEMA_VERSION);
}

#[test]
fn refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    drop(SqliteLedger::open(&path).unwrap());
    raw(&path).pragma_update(None, "user_version", 99).unwrap();
    let err = SqliteLedger::open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            LedgerError::UnsupportedSchema {
                found: 99,
                supported: super::schema::SCHEMA_VERSION
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("version 99"), "{err}");
}

#[test]
fn refuses_a_file_that_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    std::fs::write(&path, vec![7u8; 8192]).unwrap();
    let err = SqliteLedger::open(&path).unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    let cause = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<rusqlite::Error>())
        .expect("the SQLite error is the source");
    assert_eq!(
        cause.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase)
    );
}

/// A stored key binding that does not read back is a corrupt row, never an unbound task: not
/// for `get`, and not for the owner check of a confirmation of the same upstream ID.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_key_binding_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let ledger = SqliteLedger::open(&path).unwrap();
    let owner = fresh_owner();
    let r = reservation(&owner, UNLIMITED);
    let id = r.id.clone();
    ledger.reserve(r).await.unwrap();
    let c = confirmation(NOW);
    ledger.confirm(&id, c.clone()).await.unwrap();
    ledger.close().unwrap();
    raw(&path)
        .execute(
            "UPDATE tasks SET key_binding = 'sha256:abc' WHERE id = ?1",
            [id.as_str()],
        )
        .unwrap();

    let ledger = SqliteLedger::open(&path).unwrap();
    let err = ledger.get(&id).await.unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    let again = reservation(&owner, UNLIMITED);
    let again_id = again.id.clone();
    ledger.reserve(again).await.unwrap();
    let err = ledger.confirm(&again_id, c).await.unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
}

/// The DPoP replay cache is shared through PostgreSQL only: an SQLite ledger refuses to keep
/// proofs (its sidecar keeps them in memory) and has none to purge.
#[tokio::test(flavor = "multi_thread")]
async fn keeps_no_shared_proof_cache() {
    let (_dir, ledger) = fresh();
    let err = ledger
        .remember_proof(&[7; 32], NOW + 60_000, NOW)
        .await
        .unwrap_err();
    assert!(matches!(err, LedgerError::Internal(_)), "{err}");
    assert_eq!(ledger.purge_proofs(NOW, 100).await.unwrap(), 0);
}

/// Payloads may be sensitive; a purge must not leave them readable in free pages.
#[tokio::test(flavor = "multi_thread")]
async fn purged_payloads_leave_no_trace_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let marker = format!(
        "payload-marker-{}",
        crate::ledger::TaskId::generate().unwrap()
    );
    let file_has_marker = || {
        let mut bytes = std::fs::read(&path).unwrap();
        if let Ok(wal) = std::fs::read(dir.path().join("ledger.db-wal")) {
            bytes.extend(wal);
        }
        bytes.windows(marker.len()).any(|w| w == marker.as_bytes())
    };

    let ledger = SqliteLedger::open(&path).unwrap();
    let r = reservation(&fresh_owner(), UNLIMITED);
    let id = r.id.clone();
    ledger.reserve(r).await.unwrap();
    let c = crate::ledger::Confirmation {
        ttl_ms: 1_000,
        ..confirmation(NOW)
    };
    ledger.confirm(&id, c).await.unwrap();
    let f = Finish {
        status: TaskStatus::Completed,
        status_message: None,
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: Some(json!({ "text": marker })),
            at: NOW + 1,
        },
    };
    assert!(matches!(
        ledger.finish(&id, f).await.unwrap(),
        FinishOutcome::Applied(_)
    ));
    ledger.close().unwrap();
    assert!(
        file_has_marker(),
        "control: the payload is stored in the file"
    );

    let ledger = SqliteLedger::open(&path).unwrap();
    assert_eq!(
        ledger
            .purge_expired(NOW + 1_000, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.id)
            .collect::<Vec<_>>(),
        vec![id]
    );
    ledger.close().unwrap();
    assert!(!file_has_marker());
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_writers_share_commits() {
    let (_dir, ledger) = fresh();
    let ledger: Arc<dyn TaskLedger> = Arc::new(ledger);
    let owner = fresh_owner();
    let spawned: Vec<_> = (0..64)
        .map(|_| {
            let ledger = Arc::clone(&ledger);
            let r = reservation(&owner, UNLIMITED);
            tokio::spawn(async move { ledger.reserve(r).await })
        })
        .collect();
    for handle in spawned {
        assert_eq!(handle.await.unwrap().unwrap(), ReserveOutcome::Reserved);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_writes_are_grouped() {
    let (_dir, ledger) = fresh();
    let owner = fresh_owner();
    let writes = (0..100).map(|_| ledger.reserve(reservation(&owner, UNLIMITED)));
    for outcome in futures_util::future::join_all(writes).await {
        assert_eq!(outcome.unwrap(), ReserveOutcome::Reserved);
    }
    let stats = ledger.write_stats();
    assert_eq!(stats.commands, 100);
    assert!(stats.commits < stats.commands, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_1_ledger_is_migrated_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    {
        let conn = raw(&path);
        conn.execute_batch(super::schema::V1).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO tasks (id, confirmed, upstream_id, issuer, subject, tenant, client, tool, \
             scopes, status, created_at, last_updated_at, ttl_ms, expires_at, deadline_at) \
             VALUES ('lgt_old', 1, 'u1', 'i', 's', 't', 'c', 'tool', '[]', 'working', 1, 1, \
             1000000000000, 1000000000001, 2)",
            [],
        )
        .unwrap();
    }
    let ledger = SqliteLedger::open(&path).unwrap();
    let old = ledger
        .get(&crate::ledger::TaskId::from_string("lgt_old"))
        .await
        .unwrap()
        .expect("v1 task survives the migration");
    assert_eq!((old.token_issued_at, old.trace), (None, None));
    assert_eq!(old.binding, None);
    let version: i64 = raw(&path)
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, super::schema::SCHEMA_VERSION);
}

/// A version 2 ledger gains the upstream ID index (keeping the earliest of tasks that shared an
/// upstream ID), issuer-scoped quota indexes and the cancellation outbox.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_2_ledger_is_migrated_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    {
        let conn = raw(&path);
        conn.execute_batch(super::schema::V1).unwrap();
        conn.execute_batch(super::schema::V2).unwrap();
        conn.pragma_update(None, "user_version", 2).unwrap();
        let insert = "INSERT INTO tasks (id, confirmed, upstream_id, issuer, subject, tenant, \
            client, tool, scopes, status, created_at, last_updated_at, ttl_ms, expires_at, \
            deadline_at, payload) VALUES (?1, 1, ?2, 'i', ?3, 't', 'c', 'tool', '[]', \
            'working', ?4, ?4, 1000000000000, 1000000000000 + ?4, 2, ?5)";
        for (id, upstream, subject, created, payload) in [
            (
                "lgt_second",
                "u1",
                "other",
                2,
                Some("\"the first owner's result\""),
            ),
            ("lgt_first", "u1", "s", 1, None),
            ("lgt_own", "u2", "s", 1, None),
        ] {
            conn.execute(
                insert,
                rusqlite::params![id, upstream, subject, created, payload],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO tasks (id, confirmed, issuer, subject, tenant, client, tool, scopes, \
             reservation_expires_at) VALUES ('lgt_res', 0, 'i', 'other', 't', 'c', 'tool', '[]', \
             ?1)",
            [conformance::FAR],
        )
        .unwrap();
    }
    let ledger = SqliteLedger::open(&path).unwrap();
    let get = async |id: &str| ledger.get(&TaskId::from_string(id)).await.unwrap();
    let first = get("lgt_first").await.expect("the earliest task keeps u1");
    assert_eq!(first.cancel, None);
    assert_eq!(
        (first.correlation_id.as_str(), first.object.as_deref()),
        ("", None),
        "tasks recorded before version 5 have no correlation ID and no object"
    );
    assert_eq!(get("lgt_second").await, None, "the later one is gone");
    assert!(get("lgt_own").await.is_some());
    // Version 6 rebuilt the intents table: it takes the identity lease's reason.
    let own = TaskId::from_string("lgt_own");
    let intent =
        conformance::cancellation::intent(crate::ledger::EndReason::IdentityLeaseExpired, NOW);
    ledger.request_cancel(&own, intent).await.unwrap();
    let cancel = get("lgt_own").await.and_then(|t| t.cancel);
    assert_eq!(
        cancel.map(|c| c.reason),
        Some(crate::ledger::EndReason::IdentityLeaseExpired)
    );

    // The reservation survives; its owner cannot take u1.
    let c = crate::ledger::Confirmation {
        upstream_id: "u1".into(),
        ..confirmation(NOW)
    };
    let res = TaskId::from_string("lgt_res");
    assert_eq!(
        ledger.confirm(&res, c).await.unwrap(),
        Confirmed::HeldByAnotherOwner
    );
    let intent = crate::ledger::CancelIntent {
        reason: EndReason::OwnerCancel,
        by: None,
        pending_message: "Cancellation requested".into(),
        requested_at: NOW,
        give_up_at: NOW + 60_000,
        trace: None,
    };
    assert!(matches!(
        ledger.request_cancel(&first.id, intent).await.unwrap(),
        CancelRequest::Recorded(_)
    ));
    ledger.close().unwrap();

    let conn = raw(&path);
    let version: i64 = conn.pragma_query_one(None, "user_version").unwrap();
    assert_eq!(version, super::schema::SCHEMA_VERSION);
    // The unique index is the backstop under the ledger's own check.
    let err = conn
        .execute(
            "UPDATE tasks SET upstream_id = 'u1' WHERE id = 'lgt_own'",
            [],
        )
        .unwrap_err();
    assert_eq!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ConstraintViolation)
    );
    let columns = |index: &str| -> Vec<String> {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT name FROM pragma_index_info('{index}') ORDER BY seqno"
            ))
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    assert_eq!(columns("tasks_active_tenant"), ["issuer", "tenant"]);
    assert_eq!(columns("tasks_active_client"), ["issuer", "client"]);
}

/// A file's permission bits, in octal.
#[cfg(unix)]
fn mode(path: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    format!(
        "{:o}",
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    )
}

/// The ledger's files hold results and keys: owner-only, although under umask 022 SQLite would
/// create them world-readable.
#[cfg(unix)]
#[test]
fn files_are_owner_only() {
    const CHILD: &str = "LIFEGUARD_LEDGER_UMASK_022";
    if std::env::var_os(CHILD).is_none() {
        // The umask is per process and setting it takes `unsafe`: run this test again in a child
        // under umask 022.
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", "umask 022 && exec \"$0\" \"$@\""])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ledger::sqlite::tests::files_are_owner_only",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "child under umask 022 failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Control: under this umask a new file is readable by everyone.
    let control = dir.path().join("control");
    std::fs::write(&control, b"").unwrap();
    assert_eq!(mode(&control), "644", "the child runs under umask 022");

    let path = dir.path().join("ledger.db");
    let ledger = SqliteLedger::open(&path).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let reserved = runtime.block_on(ledger.reserve(reservation(&fresh_owner(), UNLIMITED)));
    assert_eq!(reserved.unwrap(), ReserveOutcome::Reserved);
    for file in ["ledger.db", "ledger.db-wal", "ledger.db-shm"] {
        assert_eq!(mode(&dir.path().join(file)), "600", "{file}");
    }
    ledger.close().unwrap();
}

/// Files an earlier build (or anyone) left accessible to others are tightened on open.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn permissive_files_are_tightened() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let files = ["ledger.db", "ledger.db-wal", "ledger.db-shm"].map(|f| dir.path().join(f));
    // Keep one ledger open so the WAL and shared-memory files exist, and loosen all three.
    let first = SqliteLedger::open(&path).unwrap();
    first
        .reserve(reservation(&fresh_owner(), UNLIMITED))
        .await
        .unwrap();
    for file in &files {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o664)).unwrap();
    }
    let second = SqliteLedger::open(&path).unwrap();
    for file in &files {
        assert_eq!(mode(file), "600", "{}", file.display());
    }
    // Both still work on the tightened files.
    for ledger in [&first, &second] {
        let r = reservation(&fresh_owner(), UNLIMITED);
        assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    }
}

/// A scan that binds the clock and a limit on every run (the sweeper's, the outbox's) is
/// compiled once on the ledger's connections. Left to itself, SQLite plans with the value bound
/// to `LIMIT ?n`, and clearing the bindings of such a statement (which the statement cache does
/// each time it takes one back) expires it, so it was compiled again on every run; the same
/// scan on a plain connection shows it.
#[test]
fn a_cached_scan_is_not_compiled_again_when_only_its_bound_values_change() {
    use rusqlite::{StatementStatus, params};

    const SCAN: &str = "SELECT id FROM tasks WHERE confirmed = 1 AND expires_at <= ?1 \
                        ORDER BY expires_at LIMIT ?2";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let writer = super::schema::open_writer(&path).unwrap();
    let reader = super::schema::open_reader(&path).unwrap();
    let plain = raw(&path);
    let recompiled = |conn: &Connection| {
        for now in 1..=5_i64 {
            let ids: Vec<String> = conn
                .prepare_cached(SCAN)
                .unwrap()
                .query_map(params![now, 100], |row| row.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert!(ids.is_empty());
        }
        conn.prepare_cached(SCAN)
            .unwrap()
            .get_status(StatementStatus::RePrepare)
    };
    assert!(
        recompiled(&plain) >= 4,
        "a plain connection compiles the scan again on every run"
    );
    assert_eq!(recompiled(&writer), 0, "the write connection");
    assert_eq!(recompiled(&reader), 0, "a read connection");
}
