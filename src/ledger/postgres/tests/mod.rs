//! The PostgreSQL ledger against a real server (`LIFEGUARD_TEST_POSTGRES`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`); each test on a database of its own. Without
//! a reachable server these tests fail, saying how to start one.

mod isolation;
mod model;
mod multi_writer;
mod proof_uses;
mod rate_buckets;
mod recovery;
mod support;
mod tls;

use futures_util::future::join_all;

use self::support::{TestDb, scope};
use super::schema::SCHEMA_VERSION;
use super::{PasswordSources, PostgresLedger, PostgresLocation};
use crate::ledger::conformance::{self, NOW, UNLIMITED, confirmation, fresh_owner, reservation};
use crate::ledger::{Confirmed, LedgerError, ReserveOutcome, TaskLedger};

/// The server and replica conformance ledgers serve.
const SERVER: &str = "ns/conformance";

conformance::ledger_conformance_tests!(async || {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "replica-0").await;
    (db, ledger)
});

/// Eight sidecars opening a fresh database at once: all open, the schema is created once.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_opens_migrate_once() {
    let db = TestDb::create().await;
    let location = db.location().with_pool_size(1);
    let opens = (0..8).map(|i| {
        let location = location.clone();
        async move { PostgresLedger::open(&location, scope(SERVER, &format!("r{i}"))).await }
    });
    let ledgers: Vec<PostgresLedger> = join_all(opens)
        .await
        .into_iter()
        .map(|opened| opened.expect("every instance opens"))
        .collect();
    let client = db.client().await;
    let rows = client
        .query(
            "SELECT version FROM lifeguard_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        versions,
        (1..=SCHEMA_VERSION).collect::<Vec<_>>(),
        "each version applied once"
    );
    for ledger in &ledgers {
        let r = reservation(&fresh_owner(), UNLIMITED);
        assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn refuses_a_newer_schema() {
    let db = TestDb::create().await;
    drop(db.open(SERVER, "r").await);
    db.client()
        .await
        .execute(
            "INSERT INTO lifeguard_schema_migrations (version) VALUES ($1)",
            &[&(SCHEMA_VERSION + 1)],
        )
        .await
        .unwrap();
    let err = PostgresLedger::open(&db.location(), scope(SERVER, "r"))
        .await
        .expect_err("a newer schema is refused");
    assert!(
        matches!(err, LedgerError::UnsupportedSchema { found, supported }
            if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{err}"
    );
}

/// A version-1 database gains version 2's columns in place; its tasks read with no correlation
/// ID and no object.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_1_database_is_migrated_in_place() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r").await;
    let r = reservation(&fresh_owner(), UNLIMITED);
    let id = r.id.clone();
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    ledger.confirm(&id, confirmation(NOW)).await.unwrap();
    drop(ledger);
    // Back to version 1, as a database written by the previous release.
    db.client()
        .await
        .batch_execute(
            "ALTER TABLE lifeguard_tasks DROP COLUMN correlation_id, DROP COLUMN object,
                 DROP COLUMN lease_until, DROP COLUMN delegated_until, DROP COLUMN trace,
                 DROP COLUMN key_binding;
             ALTER TABLE lifeguard_cancel_intents DROP COLUMN trace;
             ALTER TABLE lifeguard_cancel_intents
                 DROP CONSTRAINT lifeguard_cancel_intents_reason_check,
                 ADD CONSTRAINT lifeguard_cancel_intents_reason_check
                     CHECK (reason IN ('owner_cancel', 'admin_cancel', 'deadline', 'revocation'));
             ALTER TABLE lifeguard_budget_uses DROP COLUMN grant_key;
             DROP TABLE lifeguard_budget_costs;
             DROP TABLE lifeguard_counters;
             DROP TABLE lifeguard_rate_buckets;
             DROP TABLE lifeguard_proof_uses;
             DELETE FROM lifeguard_schema_migrations WHERE version > 1;",
        )
        .await
        .unwrap();
    let ledger = db.open(SERVER, "r").await;
    let task = ledger.get(&id).await.unwrap().expect("the task survives");
    assert_eq!((task.correlation_id.as_str(), task.object), ("", None));
    assert_eq!((task.lease_until, task.delegated_until), (None, None));
    assert_eq!((task.trace, task.binding), (None, None));
    let versions = db
        .client()
        .await
        .query("SELECT max(version) FROM lifeguard_schema_migrations", &[])
        .await
        .unwrap();
    assert_eq!(versions[0].get::<_, i64>(0), SCHEMA_VERSION);
}

/// A stored key binding that does not read back is a corrupt row, never an unbound task: not
/// for `get`, and not for the owner check of a confirmation of the same upstream ID.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_key_binding_is_corrupt() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r").await;
    let owner = fresh_owner();
    let r = reservation(&owner, UNLIMITED);
    let id = r.id.clone();
    ledger.reserve(r).await.unwrap();
    let c = confirmation(NOW);
    ledger.confirm(&id, c.clone()).await.unwrap();
    db.client()
        .await
        .execute(
            "UPDATE lifeguard_tasks SET key_binding = 'sha256:abc' WHERE id = $1",
            &[&id.as_str()],
        )
        .await
        .unwrap();

    let err = ledger.get(&id).await.unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
    let again = reservation(&owner, UNLIMITED);
    let again_id = again.id.clone();
    ledger.reserve(again).await.unwrap();
    let err = ledger.confirm(&again_id, c).await.unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err}");
}

/// A database whose default turned `synchronous_commit` off still gets durable commits.
#[tokio::test(flavor = "multi_thread")]
async fn commits_stay_synchronous() {
    let db = TestDb::create().await;
    let name = db.location().dbname().unwrap().to_owned();
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        ))
        .await
        .unwrap();
    let ledger = db.open(SERVER, "r").await;
    let client = ledger.client().await.unwrap();
    let row = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "on");
}

/// A scope must name a server and a replica, and the server fits in a notification.
#[tokio::test(flavor = "multi_thread")]
async fn refuses_unusable_scopes() {
    let db = TestDb::create().await;
    for (server, replica) in [("", "r"), ("s", ""), ("two\nlines", "r")] {
        let err = PostgresLedger::open(&db.location(), scope(server, replica))
            .await
            .expect_err("refused");
        assert!(matches!(err, LedgerError::InvalidArgument(_)), "{err}");
    }
    let long = "s".repeat(super::MAX_SERVER_LEN + 1);
    let err = PostgresLedger::open(&db.location(), scope(&long, "r")).await;
    assert!(matches!(err, Err(LedgerError::InvalidArgument(_))));
}

const PASSWORD: &str = "hunter2-do-not-print";

fn shows_no_password(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the password: {text}"
    );
}

/// The password of the URL, of `PGPASSWORD` or of the password file never shows in an error,
/// a location or a ledger.
#[tokio::test(flavor = "multi_thread")]
async fn the_password_never_shows() {
    let db = TestDb::create().await;
    let base = db.location();
    // Trust authentication ignores the password: the ledger opens with it.
    let with_password = base.with_password(PASSWORD);
    let ledger = PostgresLedger::open_with(
        &with_password,
        scope(SERVER, "r"),
        &PasswordSources::default(),
    )
    .await
    .expect("open with a password");
    shows_no_password("ledger Debug", &format!("{ledger:?}"));
    shows_no_password("location", &format!("{with_password} {with_password:?}"));
    drop(ledger);

    // Nothing listens on port 1; a database that does not exist; each with the password in
    // the URL, in PGPASSWORD, and in a password file.
    let dir = tempfile::tempdir().unwrap();
    let passfile = dir.path().join("pgpass");
    std::fs::write(&passfile, format!("*:*:*:*:{PASSWORD}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let unreachable: PostgresLocation = format!("postgres://u:{PASSWORD}@127.0.0.1:1/db")
        .parse()
        .unwrap();
    let unreachable = unreachable.with_connect_timeout(std::time::Duration::from_secs(2));
    let missing_db = base.with_dbname("lifeguard_test_no_such_database");
    let no_password: PostgresLocation = "postgres://u@127.0.0.1:1/db".parse().unwrap();
    let env = PasswordSources {
        pgpassword: Some(PASSWORD.into()),
        ..Default::default()
    };
    let file = PasswordSources {
        pgpassfile: Some(passfile),
        ..Default::default()
    };
    let cases = [
        ("unreachable, URL", unreachable, PasswordSources::default()),
        (
            "missing database, URL",
            missing_db.with_password(PASSWORD),
            PasswordSources::default(),
        ),
        (
            "missing database, PGPASSWORD",
            missing_db.clone(),
            env.clone(),
        ),
        ("missing database, file", missing_db, file.clone()),
        ("unreachable, PGPASSWORD", no_password.clone(), env),
        ("unreachable, file", no_password, file),
    ];
    for (what, location, sources) in cases {
        let err = PostgresLedger::open_with(&location, scope(SERVER, "r"), &sources)
            .await
            .expect_err(what);
        assert!(matches!(err, LedgerError::Storage { .. }), "{what}: {err}");
        shows_no_password(what, &format!("{err} {err:?}"));
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            shows_no_password(what, &format!("{cause} {cause:?}"));
            source = cause.source();
        }
    }
}

/// Open through `LedgerLocation` (what `--ledger postgres://…` does).
#[tokio::test(flavor = "multi_thread")]
async fn ledger_location_opens_postgres() {
    let db = TestDb::create().await;
    let location = crate::ledger::LedgerLocation::Postgres(db.location());
    let ledger = location.open(scope(SERVER, "r")).await.expect("open");
    assert!(ledger.is_shared());
    let r = reservation(&fresh_owner(), UNLIMITED);
    let id = r.id.clone();
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    let confirmed = ledger.confirm(&id, confirmation(NOW)).await.unwrap();
    assert!(matches!(confirmed, Confirmed::New(_)));
}

/// Text with a NUL character cannot be stored in PostgreSQL: refused as an invalid request,
/// nothing written.
#[tokio::test(flavor = "multi_thread")]
async fn nul_characters_are_refused() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r").await;
    let r = reservation(&fresh_owner(), UNLIMITED);
    let id = r.id.clone();
    ledger.reserve(r).await.unwrap();
    let Confirmed::New(task) = ledger.confirm(&id, confirmation(NOW)).await.unwrap() else {
        panic!("a fresh upstream ID");
    };
    let err = ledger
        .observe(
            &task.id,
            crate::ledger::TaskStatus::Working,
            Some("a\0b".into()),
            NOW + 1,
        )
        .await
        .expect_err("NUL refused");
    assert!(matches!(err, LedgerError::InvalidArgument(_)), "{err}");
    assert_eq!(ledger.get(&task.id).await.unwrap(), Some(task));
}
