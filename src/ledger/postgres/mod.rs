//! The PostgreSQL ledger: one database shared by the replicas of many MCP servers.
//!
//! Every row carries its server ([`LedgerScope::server`]) and every statement filters on it,
//! so two servers sharing a database share nothing. Writes run on a pool of connections
//! (deadpool, statements prepared once per connection); settlements reach waiters on every
//! replica through LISTEN/NOTIFY ([`notify`]).
//!
//! # Atomicity across replicas
//!
//! Transactions run at READ COMMITTED with explicit locks, rather than SERIALIZABLE with
//! retries: every decision that must be atomic names the few rows or the one lock it depends
//! on, so contention is explicit, nothing is retried under load, and a statement that starts
//! after a lock is granted sees everything committed by its previous holder (READ COMMITTED
//! takes a fresh snapshot per statement, and PostgreSQL releases transaction locks only after
//! the commit is visible).
//!
//! - `reserve`: `pg_advisory_xact_lock` on a key derived from the server, then the sweep of
//!   expired reservations, the idempotency lookup, the quota counts and the insert. Only
//!   `reserve` adds rows that quotas count, so serializing reservations per server makes the
//!   counts exact; concurrent finishes and releases can only lower them.
//! - `confirm`: the reservation row is locked (`FOR UPDATE`), then the upstream ID is looked
//!   up and the row updated. The partial unique index on `(server, upstream_id)` is the
//!   backstop: a confirmation that loses the race on it (`unique_violation`, raised once the
//!   winner committed) rolls back and tries again, and then sees the winner's owner.
//! - `finish`, `request_cancel`, `observe`: the task row is locked first, then read with its
//!   intent in a separate statement (so it sees a concurrent writer's intent), then written.
//!   `finish` is also a compare-and-set on `ended_at IS NULL`; `request_cancel` also inserts
//!   with `ON CONFLICT DO NOTHING` (the first intent wins).
//! - `try_lease`: one `INSERT … ON CONFLICT DO UPDATE … WHERE` (the conflict's row lock
//!   decides). `spend_budget`: an advisory transaction lock per (server, exception), then
//!   count and insert. `secret`: `INSERT … ON CONFLICT DO NOTHING`, then read.
//!   `advance_counter`: one `INSERT … ON CONFLICT DO UPDATE … RETURNING` (each advance, on
//!   any replica, gets its own value). `remember_proof`: one `INSERT … ON CONFLICT DO UPDATE
//!   … WHERE … RETURNING` (of concurrent first uses of a proof exactly one inserts the row).
//! - The two statements on every task creation's path send their independent statements as
//!   one pipeline (`reserve`: the lock, the sweep, the lookup and the counts; `confirm`: the
//!   row lock with the upstream ID lookup, then the update with its notice and read): the
//!   database still runs them one after the other, each with its own snapshot, so the order
//!   above holds, at two round trips per transaction instead of one per statement.
//! - Sweeps (`purge_expired`) lock with `SKIP LOCKED`: rows another transaction is settling are
//!   left for the next sweep, so sweeps never wait on anyone in an order that could deadlock.
//!   A transaction that fails with a serialization failure or a deadlock anyway is retried.
//!
//! # Durability and failures
//!
//! A write's `Ok` means its transaction committed with `synchronous_commit` on (turned back on
//! for the ledger's sessions if the database turned it off). Writes run in tasks of their own:
//! a caller that stops waiting does not cut a transaction short. While the database cannot be
//! reached every operation fails (fail closed); the pool replaces broken connections, so the
//! same instance works again once it can be reached.

mod config;
mod counters;
mod lifecycle;
mod notify;
mod ops;
mod passfile;
mod proof_uses;
mod rate_buckets;
mod replicas;
mod schema;
mod sql;
mod tls;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Transaction};
use sha2::{Digest, Sha256};
use tokio_postgres::IsolationLevel;
use tokio_postgres::error::SqlState;

pub use self::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_SIZE, InvalidPostgresUrl, PostgresLocation, RootCert,
    SslMode,
};
pub use self::passfile::PasswordSources;
use super::settlements::Settlements;
use super::{LedgerError, LedgerScope, Result};

/// How long an operation waits for a free pooled connection before it fails.
const POOL_WAIT: Duration = Duration::from_secs(10);
/// How long checking a pooled connection before reuse may take.
const RECYCLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of a transaction that fails with a serialization failure or a deadlock.
const TRANSIENT_ATTEMPTS: u32 = 5;
/// Attempts of a confirmation that keeps losing races on its upstream ID (each loss means a
/// winner is visible to the next attempt, so the second normally decides).
const CONFIRM_ATTEMPTS: u32 = 5;
/// The longest server name: a notification payload (server, newline, task ID) must stay well
/// under PostgreSQL's 8000 bytes.
const MAX_SERVER_LEN: usize = 1024;

/// The PostgreSQL task ledger ([`super::TaskLedger`]). See the module documentation for its
/// guarantees.
pub struct PostgresLedger {
    pool: Pool,
    server: Arc<str>,
    scope: LedgerScope,
    /// Waiters on reservations, woken by the listener (and after local commits).
    settlements: Arc<Settlements>,
    /// Stops listening when the ledger is dropped.
    _listener: notify::Listener,
    /// The location without its password, for `Debug`.
    shown: String,
}

impl PostgresLedger {
    /// Opens the ledger at `location` for `scope`: connects, brings the schema up to date
    /// (refusing a newer one), starts the pool and the settlement listener. The password comes
    /// from the URL, else `PGPASSWORD`, else the password file (see [`PasswordSources`]).
    pub async fn open(location: &PostgresLocation, scope: LedgerScope) -> Result<Self> {
        Self::open_with(location, scope, &PasswordSources::from_env()).await
    }

    /// [`PostgresLedger::open`] with the password sources given rather than read from the
    /// environment.
    pub async fn open_with(
        location: &PostgresLocation,
        scope: LedgerScope,
        sources: &PasswordSources,
    ) -> Result<Self> {
        check_scope(&scope)?;
        Self::open_resolved(passfile::resolve(location, sources), scope).await
    }

    async fn open_resolved(mut location: PostgresLocation, scope: LedgerScope) -> Result<Self> {
        let shown = location.to_string();
        // Defence in depth: nothing below formats the password (the resolved one included), and
        // no error leaves here with it.
        let secrets = location.clone();
        let redact = |e: LedgerError| redacted(e, |text| secrets.redact(text));
        let tls = tls::connector(&location)?;
        let (mut client, connection) = location
            .pg()
            .connect(tls.clone())
            .await
            .map_err(|e| {
                let what = format!("connect to the ledger database {shown}");
                LedgerError::storage(what, PostgresError(e))
            })
            .map_err(redact)?;
        let driver = tokio::spawn(connection);
        let setup = async {
            schema::migrate(&mut client).await?;
            let sync = client
                .query_one("SHOW synchronous_commit", &[])
                .await
                .ctx("read synchronous_commit")?;
            Ok::<_, LedgerError>(sync.get::<_, String>(0) == "off")
        }
        .await;
        // Closing the connection also drops the migration lock if anything failed midway.
        drop(client);
        let _ = driver.await;
        if setup.map_err(redact)? {
            tracing::warn!(
                ledger = %shown,
                "the ledger database has synchronous_commit off; the ledger turns it on for \
                 its own sessions (a commit it reports must survive a crash)"
            );
            location.add_option("-c synchronous_commit=on");
        }

        let manager = Manager::from_config(
            location.pg().clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(location.pool_size())
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(location.connect_timeout()))
            .recycle_timeout(Some(RECYCLE_TIMEOUT))
            .build()
            .map_err(|e| LedgerError::storage("create the connection pool", e))?;
        let settlements = Arc::new(Settlements::default());
        let server: Arc<str> = Arc::from(scope.server.as_str());
        let listener = notify::Listener::start(
            location.pg().clone(),
            tls,
            Arc::clone(&settlements),
            Arc::clone(&server),
            shown.clone(),
        )
        .await
        .map_err(redact)?;
        Ok(Self {
            pool,
            server,
            scope,
            settlements,
            _listener: listener,
            shown,
        })
    }

    /// What a spawned operation needs.
    fn handles(&self) -> (Pool, Arc<str>) {
        (self.pool.clone(), Arc::clone(&self.server))
    }

    async fn client(&self) -> Result<deadpool_postgres::Client> {
        client(&self.pool).await
    }
}

/// `e` with the text of its storage cause passed through `redact` (the cause becomes text).
fn redacted(e: LedgerError, redact: impl Fn(&str) -> String) -> LedgerError {
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Redacted(String);
    match e {
        LedgerError::Storage { context, source } => LedgerError::Storage {
            context: redact(&context),
            source: Box::new(Redacted(redact(&source.to_string()))),
        },
        LedgerError::Unavailable { context, source } => LedgerError::Unavailable {
            context: redact(&context),
            source: Box::new(Redacted(redact(&source.to_string()))),
        },
        LedgerError::Internal(text) => LedgerError::Internal(redact(&text)),
        other => other,
    }
}

fn check_scope(scope: &LedgerScope) -> Result<()> {
    if scope.server.is_empty() || scope.replica.is_empty() {
        return Err(LedgerError::InvalidArgument(
            "a PostgreSQL ledger needs a server and a replica name".into(),
        ));
    }
    if scope.server.contains('\n') || scope.server.len() > MAX_SERVER_LEN {
        return Err(LedgerError::InvalidArgument(format!(
            "the ledger's server name must be a single line of at most {MAX_SERVER_LEN} bytes"
        )));
    }
    Ok(())
}

impl fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLedger")
            .field("location", &self.shown)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// A 64-bit advisory lock key for `parts` (stable across builds and processes).
fn lock_key(parts: &[&str]) -> i64 {
    let mut hash = Sha256::new();
    hash.update(b"lifeguard-ledger-lock");
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest: [u8; 32] = hash.finalize().into();
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(key)
}

/// A PostgreSQL client error, shown with its causes: tokio-postgres shows only its kind ("db
/// error", "error connecting to server") and keeps the server's message or the I/O error as its
/// source. The source of this backend's storage errors; [`PostgresError::error`] is the
/// original.
#[derive(Debug)]
pub struct PostgresError(tokio_postgres::Error);

impl PostgresError {
    pub fn error(&self) -> &tokio_postgres::Error {
        &self.0
    }

    /// The SQLSTATE, for an error the server reported.
    pub fn code(&self) -> Option<&SqlState> {
        self.0.code()
    }
}

impl fmt::Display for PostgresError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = std::error::Error::source(&self.0);
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl std::error::Error for PostgresError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Attaches context to PostgreSQL errors on their way into [`LedgerError`].
trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T>;
}

impl<T> Ctx<T> for std::result::Result<T, tokio_postgres::Error> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| match e.code() {
            Some(code)
                if *code == SqlState::DATA_CORRUPTED || *code == SqlState::INDEX_CORRUPTED =>
            {
                LedgerError::corrupt_because(what, PostgresError(e))
            }
            // PostgreSQL text cannot hold NUL characters (SQLite's can): the request is refused
            // as it is, and nothing was written.
            Some(code) if *code == SqlState::CHARACTER_NOT_IN_REPERTOIRE => {
                LedgerError::InvalidArgument(format!("{what}: {}", PostgresError(e)))
            }
            _ if out_of_reach(&e) => LedgerError::unavailable(what, PostgresError(e)),
            _ => LedgerError::storage(what, PostgresError(e)),
        })
    }
}

/// Whether `e` means the database is out of reach (and may come back), rather than refusing
/// the statement: the connection is closed or broke on the wire, or the server reports a
/// connection exception (SQLSTATE class 08) or is shutting down or starting up (57P01–57P03).
/// An authentication or permission failure is not this: it will not fix itself.
fn out_of_reach(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        return code.code().starts_with("08")
            || *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW;
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

async fn client(pool: &Pool) -> Result<deadpool_postgres::Client> {
    const WHAT: &str = "get a ledger database connection";
    pool.get().await.map_err(|e| match e {
        deadpool_postgres::PoolError::Backend(e) if out_of_reach(&e) => {
            LedgerError::unavailable(WHAT, PostgresError(e))
        }
        deadpool_postgres::PoolError::Backend(e) => LedgerError::storage(WHAT, PostgresError(e)),
        // No connection came free (or could be made) in time: the database is slow or gone.
        e @ deadpool_postgres::PoolError::Timeout(_) => LedgerError::unavailable(WHAT, e),
        other => LedgerError::storage(WHAT, other),
    })
}

async fn begin(client: &mut deadpool_postgres::Client) -> Result<Transaction<'_>> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .ctx("begin transaction")
}

async fn commit(tx: Transaction<'_>) -> Result<()> {
    tx.commit().await.ctx("commit")
}

/// Whether a failed transaction may simply be run again.
fn transient(e: &LedgerError) -> bool {
    sql::sql_state(e).is_some_and(|code| {
        *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// Runs a transaction (`async { … }` resolving to a [`Result`]) again while it fails with a
/// serialization failure or a deadlock, a few times.
macro_rules! retrying {
    ($attempt:expr) => {{
        let mut tries = 1;
        loop {
            let result: Result<_> = $attempt.await;
            match result {
                Err(e) if tries < TRANSIENT_ATTEMPTS && transient(&e) => {
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(tries))).await;
                    tries += 1;
                }
                other => break other,
            }
        }
    }};
}

/// Runs a write in a task of its own, so it completes even if its caller stops waiting.
async fn spawn<T: Send + 'static>(
    op: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(op).await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => Err(LedgerError::Internal(format!("ledger write stopped: {e}"))),
        },
    }
}

mod methods;
