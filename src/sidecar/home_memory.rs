//! The home replica's memory of its own unfinished tasks, so its owners' polls do not wait for
//! a database round trip.
//!
//! With a ledger of its own (SQLite), the sidecar is the only writer of its tasks' rows, so
//! everything below holds with no other replica at all. With per-replica server state on a
//! shared ledger, only a task's home replica talks to the
//! task's server, so only the home records what the server reports (state changes, ends) and
//! carries cancellations to it. Other replicas write two things about a live home's tasks: a
//! cancellation intent (a revocation or a deadline found by the sweep leader), which the home's
//! outbox picks up within a sweep, and — only once the home stopped beating — the orphan end.
//!
//! So a record the home read (or re-read after its own write) stays good enough to answer from
//! for a short while:
//! - what authorizing and routing needs (owner, tool, scopes, retention, home) never changes;
//! - every write this replica makes about a task drops its entry once written, and a read that
//!   began before any such write is not remembered, so the next request reads again;
//! - an intent recorded by another replica shows at most [`FRESH_FOR`] late (the server's
//!   answer to that cancellation is checked against the ledger itself, see
//!   `task_state::end_for_server_report`);
//! - nothing is answered from memory once this replica's last recorded heartbeat is less than
//!   half its TTL from expiring: others may fail its tasks only after it expired, so memory is
//!   distrusted long before (the other half is the margin for clock skew between replicas).
//!
//! Refusals never come from here: a request the remembered record does not authorize takes the
//! ledger path, so a denial costs the same whether or not the task was remembered.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::ledger::TaskRecord;
use crate::model::TaskId;

/// How long a remembered record is answered from after it was read.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// Most tasks remembered; beyond it the memory starts over.
const MAX_TASKS: usize = 50_000;

/// One replica's memory of the unfinished tasks homed on it.
#[derive(Default)]
pub struct HomeMemory {
    tasks: Mutex<HashMap<TaskId, Remembered>>,
    /// Until when (Unix ms) memory may be trusted, from the last recorded heartbeat.
    trusted_until: AtomicI64,
    /// Counts this replica's writes about its tasks ([`HomeMemory::forget`]).
    writes: AtomicU64,
}

/// Where [`HomeMemory`] stood when a ledger read began: a read that overlapped one of this
/// replica's writes may have seen the state before it and is not remembered.
#[derive(Clone, Copy, Debug)]
pub struct ReadStart {
    writes: u64,
    at: i64,
}

struct Remembered {
    record: Arc<TaskRecord>,
    read_at: i64,
}

/// Whether a record read at `read_at` may answer at `now` while memory is trusted until
/// `trusted_until`.
pub fn answers_from_memory(read_at: i64, now: i64, trusted_until: i64) -> bool {
    let fresh_for = FRESH_FOR.as_millis() as i64;
    now >= read_at && now - read_at < fresh_for && now < trusted_until
}

/// Until when memory is trusted after a heartbeat valid until `expires_at` for `ttl`: half the
/// TTL before it expires.
pub fn trusted_until(expires_at: i64, ttl: Duration) -> i64 {
    expires_at - (ttl.as_millis() as i64) / 2
}

impl HomeMemory {
    /// Notes a heartbeat recorded in the ledger, valid until `expires_at` for `ttl`.
    pub fn note_heartbeat(&self, expires_at: i64, ttl: Duration) {
        self.trusted_until
            .fetch_max(trusted_until(expires_at, ttl), Ordering::Relaxed);
    }

    /// The remembered record of task `id`, if it may answer now.
    pub fn recall(&self, id: &TaskId, now: i64) -> Option<Arc<TaskRecord>> {
        let trusted_until = self.trusted_until.load(Ordering::Relaxed);
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let entry = tasks.get(id)?;
        if answers_from_memory(entry.read_at, now, trusted_until) {
            return Some(Arc::clone(&entry.record));
        }
        tasks.remove(id);
        None
    }

    /// Call before reading a task from the ledger, to [`HomeMemory::remember`] it afterwards.
    pub fn read_start(&self, now: i64) -> ReadStart {
        ReadStart {
            writes: self.writes.load(Ordering::SeqCst),
            at: now,
        }
    }

    /// Remembers an unfinished task as read from the ledger in a read that began at `start`,
    /// unless this replica wrote about a task since.
    pub fn remember(&self, record: &TaskRecord, start: ReadStart) {
        if record.ended.is_some() || record.status.is_terminal() {
            return;
        }
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if self.writes.load(Ordering::SeqCst) != start.writes {
            return;
        }
        if tasks.len() >= MAX_TASKS {
            tasks.clear();
        }
        tasks.insert(
            record.id.clone(),
            Remembered {
                record: Arc::new(record.clone()),
                read_at: start.at,
            },
        );
    }

    /// Forgets a task: this replica has just changed it in the ledger (called after the write,
    /// whether or not it applied).
    pub fn forget(&self, id: &TaskId) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        self.writes.fetch_add(1, Ordering::SeqCst);
        tasks.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Owner;

    const TTL: Duration = Duration::from_secs(30);

    fn task() -> TaskRecord {
        crate::sidecar::decisions::test_task(Owner {
            issuer: "https://idp.test".into(),
            subject: "alice".into(),
            tenant: String::new(),
            client: String::new(),
        })
    }

    #[test]
    fn a_read_answers_for_one_second_while_the_heartbeat_has_half_its_ttl_left() {
        let beat_expires = 100_000;
        let trusted = trusted_until(beat_expires, TTL);
        assert_eq!(trusted, 85_000);
        assert!(answers_from_memory(10_000, 10_000, trusted));
        assert!(answers_from_memory(10_000, 10_999, trusted));
        assert!(!answers_from_memory(10_000, 11_000, trusted), "stale");
        assert!(
            !answers_from_memory(10_000, 9_999, trusted),
            "clock went back"
        );
        assert!(answers_from_memory(84_500, 84_999, trusted));
        assert!(
            !answers_from_memory(84_500, 85_000, trusted),
            "heartbeat aging"
        );
    }

    #[test]
    fn only_unfinished_tasks_are_remembered_and_writes_forget_them() {
        let memory = HomeMemory::default();
        let record = task();
        memory.remember(&record, memory.read_start(1_000));
        assert!(
            memory.recall(&record.id, 1_001).is_none(),
            "no heartbeat yet"
        );
        memory.note_heartbeat(1_000 + TTL.as_millis() as i64, TTL);
        memory.remember(&record, memory.read_start(1_000));
        let recalled = memory.recall(&record.id, 1_001).expect("remembered");
        assert_eq!(recalled.owner, record.owner);
        memory.forget(&record.id);
        assert!(memory.recall(&record.id, 1_002).is_none(), "forgotten");

        let mut ended = task();
        ended.status = crate::model::TaskStatus::Completed;
        memory.remember(&ended, memory.read_start(1_000));
        assert!(memory.recall(&ended.id, 1_001).is_none(), "terminal");
    }

    #[test]
    fn a_read_that_overlapped_a_write_is_not_remembered() {
        let memory = HomeMemory::default();
        memory.note_heartbeat(100_000, TTL);
        let record = task();
        let start = memory.read_start(1_000);
        memory.forget(&TaskId::from_string("another task"));
        memory.remember(&record, start);
        assert!(memory.recall(&record.id, 1_001).is_none());
        memory.remember(&record, memory.read_start(1_002));
        assert!(memory.recall(&record.id, 1_003).is_some());
    }

    #[test]
    fn a_stale_entry_is_dropped_and_a_later_heartbeat_never_lowers_trust() {
        let memory = HomeMemory::default();
        memory.note_heartbeat(100_000, TTL);
        memory.note_heartbeat(90_000, TTL);
        let record = task();
        memory.remember(&record, memory.read_start(80_000));
        assert!(memory.recall(&record.id, 80_500).is_some());
        assert!(memory.recall(&record.id, 81_000).is_none(), "stale");
        assert!(memory.recall(&record.id, 80_500).is_none(), "dropped");
    }
}
