//! The single writer thread and its group commit.
//!
//! SQLite admits one writer at a time, and with `synchronous=FULL` every COMMIT costs an fsync.
//! Funnelling all writes through one thread that owns the write connection removes lock
//! contention (no `SQLITE_BUSY` between our own writers) and lets that thread amortise the fsync:
//! it takes whatever commands are queued, runs them in one transaction, each under its own
//! SAVEPOINT, and commits once. A failing command rolls back to its savepoint and affects nobody
//! else; a reply is sent only after the COMMIT returned, so `Ok` always means "durable". A
//! command may carry a hook that runs on the writer thread once its work is durable, before the
//! reply: the ledger uses it to wake waiters on settled reservations.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::ledger::{LedgerError, Result};

/// Most commands one transaction may carry. Bounds the latency a command queued behind a full
/// batch can see, and the work lost to a failed COMMIT.
pub(super) const MAX_BATCH: usize = 256;

/// Commands waiting for the writer. Bounded so a stalled disk pushes back on callers (their
/// `send` awaits) instead of growing memory without limit.
const QUEUE_CAPACITY: usize = 1024;

/// Counters of the writer's work, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Transactions committed (one fsync each).
    pub commits: u64,
    /// Commands that ran inside those transactions (successful or rolled back).
    pub commands: u64,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    commands: AtomicU64,
}

/// A queued command with its reply channel, type-erased so one queue carries every command.
trait Job: Send {
    /// Runs the command under its own savepoint inside the open transaction. Returns `false`
    /// when the transaction itself can no longer be trusted (SQLite rolled it back, or the
    /// savepoint could not be released or rolled back): the batch must then be abandoned.
    fn run(&mut self, conn: &Connection) -> bool;

    /// Sends the command's result. `outcome` is the fate of the whole transaction: when it
    /// failed, a command that succeeded inside it did not take effect and must report so.
    fn reply(self: Box<Self>, outcome: &Outcome);
}

/// The fate of a whole transaction, shared by every command in it.
type Outcome = std::result::Result<(), BatchFailure>;

/// Why a transaction did not commit.
#[derive(Clone, Debug)]
enum BatchFailure {
    /// A transaction statement (`BEGIN`, `COMMIT`) failed. Every command of the batch reports
    /// it, so the source of their errors is a shared `Arc<rusqlite::Error>`.
    Statement {
        context: &'static str,
        error: Arc<rusqlite::Error>,
    },
    /// Another command broke the transaction; this one's work was rolled back with it.
    Aborted,
}

impl BatchFailure {
    fn statement(context: &'static str, error: rusqlite::Error) -> Self {
        Self::Statement {
            context,
            error: Arc::new(error),
        }
    }

    /// The error each command of the failed transaction reports.
    fn to_error(&self) -> LedgerError {
        match self {
            Self::Statement { context, error } => LedgerError::storage(*context, Arc::clone(error)),
            Self::Aborted => {
                LedgerError::Internal("transaction aborted by a failing ledger command".into())
            }
        }
    }
}

struct Command<T, F, A> {
    work: Option<F>,
    /// Runs with the successful result once the transaction committed.
    after_commit: Option<A>,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F, A> Job for Command<T, F, A>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T> + Send,
    A: FnOnce(&T) + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            // Each job is run at most once (a batch pops it before running it).
            self.result = Some(Err(LedgerError::Internal(
                "ledger command ran twice".into(),
            )));
            return true;
        };
        let (result, healthy) = run_in_savepoint(conn, work);
        self.result = Some(result);
        healthy && !conn.is_autocommit()
    }

    fn reply(self: Box<Self>, outcome: &Outcome) {
        let result = match (self.result, outcome) {
            (Some(Ok(_)), Err(why)) => Err(why.to_error()),
            (Some(result), _) => result,
            (None, Err(why)) => Err(why.to_error()),
            (None, Ok(())) => Err(LedgerError::Internal("ledger command did not run".into())),
        };
        if let (Ok(value), Some(after_commit)) = (&result, self.after_commit) {
            after_commit(value);
        }
        // The caller may have stopped waiting (its future was dropped); the write stands.
        let _ = self.reply.send(result);
    }
}

fn run_in_savepoint<T>(
    conn: &Connection,
    work: impl FnOnce(&Connection) -> Result<T>,
) -> (Result<T>, bool) {
    if let Err(e) = conn.execute_batch("SAVEPOINT job") {
        return (Err(LedgerError::storage("savepoint", e)), false);
    }
    // A panicking command must not take the writer (and every later write) down with it; its
    // partial writes are rolled back like any other failure.
    let result = catch_unwind(AssertUnwindSafe(|| work(conn)))
        .unwrap_or_else(|_| Err(LedgerError::Internal("ledger command panicked".into())));
    match result {
        Ok(value) => match conn.execute_batch("RELEASE job") {
            Ok(()) => (Ok(value), true),
            Err(e) => (Err(LedgerError::storage("release savepoint", e)), false),
        },
        Err(err) => {
            let healthy = conn.execute_batch("ROLLBACK TO job; RELEASE job").is_ok();
            (Err(err), healthy)
        }
    }
}

type Queue = mpsc::Sender<Box<dyn Job>>;

/// The caller side of the writer: submit commands, and stop the thread.
pub(super) struct Writer {
    queue: Option<Queue>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer thread, which owns `conn` from now on.
    pub(super) fn spawn(conn: Connection) -> Result<Self> {
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        Self::spawn_with(conn, queue, receiver)
    }

    fn spawn_with(
        conn: Connection,
        queue: Queue,
        receiver: mpsc::Receiver<Box<dyn Job>>,
    ) -> Result<Self> {
        let counters = Arc::new(Counters::default());
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || writer_loop(&conn, receiver, &thread_counters))
            .map_err(|e| LedgerError::storage("start ledger writer thread", e))?;
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
            counters,
        })
    }

    /// Runs `work` in the next group-committed transaction and returns its result once that
    /// transaction is durable. Never blocks the calling thread: both the enqueue (when the
    /// queue is full) and the wait for the reply are awaits.
    ///
    /// If the returned future is dropped after the command was queued, the command still runs.
    pub(super) async fn call<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.call_then(work, |_: &T| {}).await
    }

    /// [`Writer::call`], and once `work` succeeded and its transaction is durable, runs
    /// `after_commit` with the result on the writer thread, before the reply is sent. The hook
    /// runs even if the returned future was dropped; it must be quick and must not panic.
    pub(super) async fn call_then<T, F, A>(&self, work: F, after_commit: A) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        A: FnOnce(&T) + Send + 'static,
    {
        let queue = self.queue.as_ref().ok_or(LedgerError::Closed)?;
        let (reply, answer) = oneshot::channel();
        let command = Command {
            work: Some(work),
            after_commit: Some(after_commit),
            result: None,
            reply,
        };
        queue
            .send(Box::new(command))
            .await
            .map_err(|_| LedgerError::Closed)?;
        // A dropped reply sender means the thread died (it replies to every job otherwise).
        answer.await.map_err(|_| LedgerError::Closed)?
    }

    pub(super) fn stats(&self) -> WriteStats {
        WriteStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            commands: self.counters.commands.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting commands, lets the thread finish everything already queued, and waits
    /// for it to exit (closing the write connection). Blocks for as long as the queued work
    /// takes; idempotent.
    pub(super) fn close(&mut self) -> Result<()> {
        // Closing the queue is the stop signal: the thread drains what is left, then sees the
        // end of the channel.
        self.queue = None;
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| LedgerError::Internal("ledger writer thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Nothing to report to from a destructor; `close` is there for callers who care.
        let _ = self.close();
    }
}

fn writer_loop(conn: &Connection, mut receiver: mpsc::Receiver<Box<dyn Job>>, counters: &Counters) {
    let mut pending: VecDeque<Box<dyn Job>> = VecDeque::new();
    loop {
        if pending.is_empty() {
            match receiver.blocking_recv() {
                Some(job) => pending.push_back(job),
                None => return,
            }
        }
        while pending.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(job) => pending.push_back(job),
                Err(_) => break,
            }
        }
        run_batch(conn, &mut pending, counters);
    }
}

/// Runs queued jobs in one transaction. Jobs not reached because the transaction broke stay in
/// `pending` for the next batch, so one bad command cannot fail commands queued behind it.
fn run_batch(conn: &Connection, pending: &mut VecDeque<Box<dyn Job>>, counters: &Counters) {
    // IMMEDIATE takes the write lock up front, so a second process on the same file makes us
    // wait (busy_timeout) here rather than fail halfway through the batch.
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let outcome = Err(BatchFailure::statement("begin transaction", e));
        for job in pending.drain(..) {
            job.reply(&outcome);
        }
        return;
    }
    let mut done: Vec<Box<dyn Job>> = Vec::with_capacity(pending.len());
    while let Some(mut job) = pending.pop_front() {
        let healthy = job.run(conn);
        done.push(job);
        counters.commands.fetch_add(1, Ordering::Relaxed);
        if !healthy {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            let outcome = Err(BatchFailure::Aborted);
            for job in done {
                job.reply(&outcome);
            }
            return;
        }
    }
    let outcome = conn
        .execute_batch("COMMIT")
        .map_err(|e| BatchFailure::statement("commit", e));
    match &outcome {
        Ok(()) => {
            counters.commits.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
    }
    for job in done {
        job.reply(&outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_conn(dir: &tempfile::TempDir) -> Connection {
        let conn = Connection::open(dir.path().join("w.db")).unwrap();
        conn.execute_batch("CREATE TABLE t (v INTEGER PRIMARY KEY)")
            .unwrap();
        conn
    }

    fn count(path: &std::path::Path) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    fn command<T: Send + 'static>(
        work: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> (Box<dyn Job>, oneshot::Receiver<Result<T>>) {
        let (reply, answer) = oneshot::channel();
        (
            Box::new(Command {
                work: Some(work),
                after_commit: None::<fn(&T)>,
                result: None,
                reply,
            }),
            answer,
        )
    }

    fn insert(v: i64) -> impl FnOnce(&Connection) -> Result<()> + Send + 'static {
        move |c: &Connection| {
            c.execute("INSERT INTO t (v) VALUES (?1)", [v])
                .map(|_| ())
                .map_err(|e| LedgerError::storage("insert", e))
        }
    }

    #[tokio::test]
    async fn queued_commands_share_one_commit_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let conn = table_conn(&dir);
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        // Queue everything before the thread starts, so it all lands in the first batch.
        let (a, a_answer) = command(insert(1));
        let (b, b_answer) = command(|c: &Connection| -> Result<()> {
            insert(2)(c)?;
            Err(LedgerError::NoReservation)
        });
        let (p, p_answer) = command(|c: &Connection| -> Result<()> {
            insert(4)(c)?;
            panic!("command bug");
        });
        let (d, d_answer) = command(insert(1)); // duplicate key: fails on its own
        let (e, e_answer) = command(insert(3));
        for job in [a, b, p, d, e] {
            assert!(queue.send(job).await.is_ok());
        }
        let mut writer = Writer::spawn_with(conn, queue, receiver).unwrap();

        assert!(a_answer.await.unwrap().is_ok());
        assert!(matches!(
            b_answer.await.unwrap(),
            Err(LedgerError::NoReservation)
        ));
        assert!(matches!(
            p_answer.await.unwrap(),
            Err(LedgerError::Internal(_))
        ));
        let duplicate = d_answer.await.unwrap().unwrap_err();
        let cause = std::error::Error::source(&duplicate)
            .and_then(|s| s.downcast_ref::<rusqlite::Error>())
            .expect("the SQLite error is the source");
        assert_eq!(
            cause.sqlite_error_code(),
            Some(rusqlite::ErrorCode::ConstraintViolation)
        );
        assert!(e_answer.await.unwrap().is_ok());
        assert_eq!(
            writer.stats(),
            WriteStats {
                commits: 1,
                commands: 5
            }
        );
        writer.close().unwrap();
        assert_eq!(count(&dir.path().join("w.db")), 2);
    }

    #[tokio::test]
    async fn hooks_run_only_after_a_commit_and_before_the_reply() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = Writer::spawn(table_conn(&dir)).unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let hook = |ran: &Arc<AtomicU64>| {
            let ran = Arc::clone(ran);
            move |_: &()| {
                ran.fetch_add(1, Ordering::SeqCst);
            }
        };
        writer.call_then(insert(1), hook(&ran)).await.unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "ran before the reply");
        let duplicate = writer.call_then(insert(1), hook(&ran)).await;
        assert!(duplicate.is_err());
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "no hook for a failed command"
        );
        writer.close().unwrap();
    }

    #[tokio::test]
    async fn close_finishes_queued_work_then_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = Writer::spawn(table_conn(&dir)).unwrap();
        writer.call(insert(1)).await.unwrap();
        writer.close().unwrap();
        writer.close().unwrap();
        assert!(matches!(
            writer.call(insert(2)).await,
            Err(LedgerError::Closed)
        ));
        assert_eq!(count(&dir.path().join("w.db")), 1);
    }
}
