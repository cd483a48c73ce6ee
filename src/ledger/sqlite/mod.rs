//! The embedded SQLite ledger: one file, one pod.
//!
//! Writes go through one dedicated thread that group-commits ([`writer`]); reads run on a small
//! pool of separate connections, which WAL lets proceed concurrently with the writer.

mod counters;
mod files;
mod ops;
mod replicas;
mod rows;
mod schema;
mod writer;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};

use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode};

pub use self::writer::WriteStats;
use self::writer::Writer;
use super::checks::{check_finish, check_intent, require_nonterminal};
use super::settlements::Settlements;
use super::{
    BudgetOutcome, BudgetSpend, CancelIntent, CancelRequest, Confirmation, Confirmed, Finish,
    FinishOutcome, LedgerError, LedgerScope, PendingCancel, PrincipalFilter, PurgedTask,
    ReplicaBeat, ReplicaInfo, Reservation, ReserveOutcome, Result, TaskId, TaskLedger, TaskRecord,
    TaskStatus,
};
use crate::model::ModelError;

/// Read connections kept open. Reads are short point or index lookups, so a handful covers the
/// concurrency of a sidecar on a few cores.
const READ_CONNECTIONS: usize = 4;

/// The SQLite task ledger.
///
/// Guarantees, beyond the [`TaskLedger`] contract: a write's `Ok` means its transaction was
/// committed with `synchronous=FULL` (on disk); a write whose future is dropped after it was
/// queued still happens; dropping the ledger (or [`SqliteLedger::close`]) finishes every queued
/// write before the file is closed, blocking the dropping thread meanwhile.
///
/// [`TaskLedger::wait_settled`] is woken by the writer thread right after the commit that
/// confirmed, released or voided the reservation, before that write's caller gets its answer;
/// writes by another process sharing the file wake nobody.
pub struct SqliteLedger {
    // Declared before `writer` so the read connections close first and the writer's connection
    // is the last one: SQLite then checkpoints and removes the WAL file on close.
    readers: ReadPool,
    writer: Writer,
    /// Waiters on reservations, woken after the commits that settle them.
    settlements: Arc<Settlements>,
    path: PathBuf,
    scope: LedgerScope,
}

impl SqliteLedger {
    /// Opens (creating if needed) the ledger at `path`, bringing its schema up to date. Safe to
    /// call on an existing ledger; refuses a file written by a newer schema version. Does file
    /// I/O on the calling thread: call it at startup or from `spawn_blocking`.
    ///
    /// On Unix the database and its `-wal` and `-shm` files are owner-only (0600): a new
    /// database is created so, and existing files with group or other permissions are
    /// tightened (logged as a warning); failing that, the open fails.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_scoped(path, LedgerScope::local())
    }

    /// [`SqliteLedger::open`], recording `scope.replica` as the home of the tasks it confirms.
    /// The file holds one server's tasks, so `scope.server` only names it.
    pub fn open_scoped(path: &Path, scope: LedgerScope) -> Result<Self> {
        files::make_owner_only(path)?;
        let write_conn = schema::open_writer(path)?;
        // Readers open after the writer so the file is already in WAL mode with a schema.
        let readers = ReadPool::open(path, READ_CONNECTIONS)?;
        let writer = Writer::spawn(write_conn)?;
        Ok(Self {
            readers,
            writer,
            settlements: Arc::default(),
            path: path.to_owned(),
            scope,
        })
    }

    /// Where the ledger lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How much the writer has done; `commands / commits` is the group-commit factor.
    pub fn write_stats(&self) -> WriteStats {
        self.writer.stats()
    }

    /// Finishes queued writes and closes the database, reporting a writer that died abnormally.
    /// Blocks the calling thread until the queue is drained (normally milliseconds).
    pub fn close(self) -> Result<()> {
        let Self {
            readers,
            mut writer,
            settlements: _,
            path: _,
            scope: _,
        } = self;
        drop(readers);
        writer.close()
    }
}

impl fmt::Debug for SqliteLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLedger")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Read connections, each behind its own mutex.
///
/// Reads run inline on the calling (tokio worker) thread rather than via `spawn_blocking`: every
/// read is a primary-key lookup or an indexed scan whose size quotas or `limit` bound, served
/// from the page cache in microseconds, and WAL readers never wait for the writer. A hop to the
/// blocking pool would cost more than the query.
struct ReadPool {
    conns: Vec<Mutex<Connection>>,
    next: AtomicUsize,
}

impl ReadPool {
    fn open(path: &Path, size: usize) -> Result<Self> {
        let conns = (0..size.max(1))
            .map(|_| schema::open_reader(path).map(Mutex::new))
            .collect::<Result<_>>()?;
        Ok(Self {
            conns,
            next: AtomicUsize::new(0),
        })
    }

    fn with<T>(&self, read: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        // A panic during an earlier read poisons the mutex but cannot have left a read-only
        // connection in a bad state, so poisoned connections are used as they are.
        for conn in &self.conns {
            match conn.try_lock() {
                Ok(guard) => return read(&guard),
                Err(TryLockError::Poisoned(poisoned)) => return read(&poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        // All busy: queue on one of them, spreading waiters round-robin.
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let guard = self.conns[i].lock().unwrap_or_else(PoisonError::into_inner);
        read(&guard)
    }
}

/// Attaches context to SQLite errors on their way into [`LedgerError`].
trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T>;
}

impl<T> Ctx<T> for rusqlite::Result<T> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                LedgerError::corrupt_because(what, e)
            }
            _ => LedgerError::storage(what, e),
        })
    }
}

#[async_trait]
impl TaskLedger for SqliteLedger {
    async fn reserve(&self, reservation: Reservation) -> Result<ReserveOutcome> {
        let settlements = Arc::clone(&self.settlements);
        let (outcome, _voided) = self
            .writer
            .call_then(
                move |conn| ops::reserve(conn, &reservation),
                move |(_, voided)| settlements.settle(voided),
            )
            .await?;
        Ok(outcome)
    }

    async fn confirm(&self, id: &TaskId, confirmation: Confirmation) -> Result<Confirmed> {
        require_nonterminal(confirmation.status, "confirm")?;
        let id = id.as_str().to_owned();
        let settlements = Arc::clone(&self.settlements);
        let settled = id.clone();
        let home = self.scope.replica.clone();
        // Every successful outcome settles the reservation: confirmed, or released because
        // its upstream ID was taken.
        self.writer
            .call_then(
                move |conn| ops::confirm(conn, &id, &confirmation, &home),
                move |_: &Confirmed| settlements.settle([settled]),
            )
            .await
    }

    async fn confirm_in_replica(
        &self,
        id: &TaskId,
        confirmation: Confirmation,
    ) -> Result<Confirmed> {
        // One file, one replica: one space of upstream IDs.
        self.confirm(id, confirmation).await
    }

    async fn release(&self, id: &TaskId) -> Result<()> {
        let id = id.as_str().to_owned();
        let settlements = Arc::clone(&self.settlements);
        let released = id.clone();
        self.writer
            .call_then(
                move |conn| ops::release(conn, &id),
                move |()| settlements.settle([released]),
            )
            .await
    }

    async fn wait_settled(&self, id: &TaskId) -> Result<()> {
        loop {
            // Interest first, then the check: a settlement committed after the check wakes us.
            let (_interest, settled) = self.settlements.interest(id.as_str());
            if !self
                .readers
                .with(|conn| ops::is_reserved(conn, id.as_str()))?
            {
                return Ok(());
            }
            // Woken only by a settlement of this ID, so the next check normally returns.
            settled.await;
        }
    }

    async fn get(&self, id: &TaskId) -> Result<Option<TaskRecord>> {
        self.readers.with(|conn| rows::load_task(conn, id.as_str()))
    }

    async fn observe(
        &self,
        id: &TaskId,
        status: TaskStatus,
        status_message: Option<String>,
        now: i64,
    ) -> Result<()> {
        require_nonterminal(status, "observe")?;
        let id = id.as_str().to_owned();
        self.writer
            .call(move |conn| ops::observe(conn, &id, status, status_message.as_deref(), now))
            .await
    }

    async fn finish(&self, id: &TaskId, finish: Finish) -> Result<FinishOutcome> {
        check_finish(&finish)?;
        let id = id.as_str().to_owned();
        self.writer
            .call(move |conn| ops::finish(conn, &id, &finish))
            .await
    }

    async fn request_cancel(&self, id: &TaskId, intent: CancelIntent) -> Result<CancelRequest> {
        check_intent(&intent)?;
        let id = id.as_str().to_owned();
        self.writer
            .call(move |conn| ops::request_cancel(conn, &id, &intent))
            .await
    }

    async fn cancels_due(&self, now: i64, limit: usize) -> Result<Vec<PendingCancel>> {
        self.readers
            .with(|conn| ops::cancels_due(conn, None, now, limit))
    }

    async fn note_cancel_attempt(&self, id: &TaskId, next_attempt_at: i64) -> Result<()> {
        let id = id.as_str().to_owned();
        self.writer
            .call(move |conn| ops::note_cancel_attempt(conn, &id, next_attempt_at))
            .await
    }

    async fn note_result_read(&self, id: &TaskId) -> Result<u32> {
        let id = id.as_str().to_owned();
        self.writer
            .call(move |conn| ops::note_result_read(conn, &id))
            .await
    }

    async fn renew_identity(
        &self,
        id: &TaskId,
        lease_until: Option<i64>,
        delegated_until: Option<i64>,
    ) -> Result<bool> {
        let id = id.as_str().to_owned();
        self.writer
            .call(move |conn| ops::renew_identity(conn, &id, lease_until, delegated_until))
            .await
    }

    async fn forget_payload(&self, id: &TaskId) -> Result<()> {
        let id = id.as_str().to_owned();
        self.writer
            .call(move |conn| ops::forget_payload(conn, &id))
            .await
    }

    async fn past_deadline(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
        self.readers
            .with(|conn| ops::past_deadline(conn, now, limit))
    }

    async fn purge_expired(&self, now: i64, limit: usize) -> Result<Vec<PurgedTask>> {
        let settlements = Arc::clone(&self.settlements);
        let (purged, _voided) = self
            .writer
            .call_then(
                move |conn| ops::purge_expired(conn, now, limit),
                move |(_, voided)| settlements.settle(voided),
            )
            .await?;
        Ok(purged)
    }

    async fn active_for(&self, principal: &PrincipalFilter) -> Result<Vec<TaskRecord>> {
        self.readers.with(|conn| ops::active_for(conn, principal))
    }

    async fn secret(&self, name: &str) -> Result<[u8; 32]> {
        if let Some(value) = self.readers.with(|conn| ops::read_secret(conn, name))? {
            return Ok(value);
        }
        let mut fresh = [0u8; 32];
        getrandom::fill(&mut fresh).map_err(ModelError::Random)?;
        let name = name.to_owned();
        self.writer
            .call(move |conn| ops::create_secret(conn, &name, &fresh))
            .await
    }

    async fn advance_counter(&self, name: &str) -> Result<u64> {
        let name = name.to_owned();
        self.writer
            .call(move |conn| counters::advance(conn, &name))
            .await
    }

    async fn counter(&self, name: &str) -> Result<u64> {
        self.readers.with(|conn| counters::read(conn, name))
    }

    fn scope(&self) -> &LedgerScope {
        &self.scope
    }

    fn is_shared(&self) -> bool {
        false
    }

    async fn cancels_due_for(
        &self,
        home: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<PendingCancel>> {
        self.readers
            .with(|conn| ops::cancels_due(conn, Some(home), now, limit))
    }

    async fn heartbeat(&self, beat: &ReplicaBeat) -> Result<()> {
        let replica = self.scope.replica.clone();
        let beat = beat.clone();
        self.writer
            .call(move |conn| replicas::heartbeat(conn, &replica, &beat))
            .await
    }

    async fn replica(&self, replica: &str) -> Result<Option<ReplicaInfo>> {
        self.readers.with(|conn| replicas::replica(conn, replica))
    }

    async fn orphaned(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
        self.readers
            .with(|conn| replicas::orphaned(conn, now, limit))
    }

    async fn try_lease(&self, name: &str, holder: &str, now: i64, until: i64) -> Result<bool> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.writer
            .call(move |conn| replicas::try_lease(conn, &name, &holder, now, until))
            .await
    }

    async fn spend_budget(&self, spend: &BudgetSpend) -> Result<BudgetOutcome> {
        let spend = spend.clone();
        self.writer
            .call(move |conn| replicas::spend_budget(conn, &spend))
            .await
    }
}
