//! This sidecar as one replica of its MCP server: its name, whether it shares the ledger with
//! other replicas, where its tasks' server state lives, its heartbeat, and the lease that makes
//! one replica at a time run the server-wide sweeps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::UpstreamTaskState;
use crate::ledger::{ReplicaBeat, TaskLedger, TaskRecord};
use crate::model::TaskId;

use super::active_policy::ActivePolicy;
use super::home_memory::{HomeMemory, ReadStart};
use super::hop::Hop;

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
/// How long the sweep lease lasts once taken or renewed.
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// The leader renews once less than this is left; others try to take it at most this often.
const LEASE_RENEW_MARGIN: Duration = Duration::from_secs(10);
/// Name of the lease of the server-wide sweeps (deadlines, retention, orphans).
pub const SWEEP_LEASE: &str = "sweeper";

/// This replica.
pub struct Replica {
    pub id: String,
    /// Whether other replicas share the ledger (PostgreSQL).
    pub shared: bool,
    /// The internal hop (shared ledgers only).
    pub hop: Option<Hop>,
    lease: Mutex<LeaseState>,
    /// Unfinished tasks homed elsewhere, as last read: what a request about them needs here
    /// (owner, tool, home, retention) never changes, so their next requests are authorized
    /// and forwarded without reading the ledger first.
    remote_tasks: Mutex<HashMap<TaskId, Arc<TaskRecord>>>,
    /// Unfinished tasks homed here, as last read (see [`HomeMemory`]).
    home_tasks: Arc<HomeMemory>,
}

/// Most remote tasks remembered; beyond it the memory starts over.
const MAX_REMOTE_TASKS: usize = 50_000;

#[derive(Default)]
struct LeaseState {
    /// Until when this replica holds the sweep lease (0: not held).
    held_until: i64,
    /// When a non-holder last tried to take it.
    last_try: i64,
}

impl Replica {
    /// This replica; `home_tasks` is the memory its heartbeat keeps trusted.
    pub fn new(ledger: &dyn TaskLedger, hop: Option<Hop>, home_tasks: Arc<HomeMemory>) -> Self {
        Self {
            id: ledger.scope().replica.clone(),
            shared: ledger.is_shared(),
            hop,
            lease: Mutex::default(),
            remote_tasks: Mutex::default(),
            home_tasks,
        }
    }

    /// A remembered unfinished task homed here that may answer without reading the ledger
    /// (see [`HomeMemory`] and [`Self::remembers_home_tasks`]).
    pub fn recall_home(
        &self,
        policy: &ActivePolicy,
        id: &TaskId,
        now: i64,
    ) -> Option<Arc<TaskRecord>> {
        if !self.remembers_home_tasks(policy) {
            return None;
        }
        self.home_tasks.recall(id, now)
    }

    /// Whether this replica answers from its memory of its own unfinished tasks: with a ledger
    /// of its own (SQLite: this process is the only writer, and each of its writes drops the
    /// entry), and with per-replica server state on a shared ledger (only the home writes what
    /// its server reports). Not with shared server state, where any replica records any task's
    /// reports.
    pub fn remembers_home_tasks(&self, policy: &ActivePolicy) -> bool {
        !self.shared || self.separate_server_state(policy)
    }

    /// Call before reading a task from the ledger, for [`Replica::remember_home`].
    pub fn home_read_start(&self) -> ReadStart {
        self.home_tasks.read_start(now_ms())
    }

    /// Remembers `record`, read from the ledger in a read that began at `start`, when it is an
    /// unfinished task homed here and memory is in use.
    pub fn remember_home(&self, policy: &ActivePolicy, record: &TaskRecord, start: ReadStart) {
        if self.remembers_home_tasks(policy) && record.home == self.id {
            self.home_tasks.remember(record, start);
        }
    }

    /// Forgets a task homed here: this replica has just changed it in the ledger.
    pub fn forget_home(&self, id: &TaskId) {
        self.home_tasks.forget(id);
    }

    /// Where `record`'s server state lives: `Some(home)` when another replica must answer
    /// requests about it (a shared ledger, per-replica server state, and a home that is not
    /// this replica); `None` when this replica answers itself.
    pub fn remote_home<'a>(
        &self,
        policy: &ActivePolicy,
        record: &'a TaskRecord,
    ) -> Option<&'a str> {
        remote_home(
            self.shared,
            policy.effective.upstream_task_state,
            &self.id,
            record,
        )
    }

    /// Whether the replicas' servers keep their task state apart: a shared ledger and
    /// per-replica server state. Then each server knows only the tasks homed on its replica,
    /// and numbers them on its own.
    pub fn separate_server_state(&self, policy: &ActivePolicy) -> bool {
        self.shared && policy.effective.upstream_task_state == UpstreamTaskState::PerReplica
    }

    /// A remembered task homed elsewhere, unless its retention ended. Its mutable state
    /// (status, intent) may be stale: use it only to authorize and route a request to its home,
    /// which answers from its own read.
    pub fn remembered_remote(&self, id: &TaskId, now: i64) -> Option<Arc<TaskRecord>> {
        let mut tasks = self.remote_tasks.lock().unwrap_or_else(|p| p.into_inner());
        match tasks.get(id) {
            Some(record) if record.expires_at() > now => Some(Arc::clone(record)),
            Some(_) => {
                tasks.remove(id);
                None
            }
            None => None,
        }
    }

    /// Remembers an unfinished task homed elsewhere (see [`Replica::remembered_remote`]).
    pub fn remember_remote(&self, record: &TaskRecord) {
        let mut tasks = self.remote_tasks.lock().unwrap_or_else(|p| p.into_inner());
        if tasks.len() >= MAX_REMOTE_TASKS {
            tasks.clear();
        }
        tasks.insert(record.id.clone(), Arc::new(record.clone()));
    }

    /// Forgets a remembered task (it ended, or its home is gone).
    pub fn forget_remote(&self, id: &TaskId) {
        let mut tasks = self.remote_tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.remove(id);
    }

    /// The home whose pending cancellations this replica carries to its server: its own when
    /// the servers keep their state apart, every task's otherwise (`None`).
    pub fn outbox_home(&self, policy: &ActivePolicy) -> Option<&str> {
        self.separate_server_state(policy)
            .then_some(self.id.as_str())
    }

    /// Whether this replica runs the server-wide sweeps now: always on an unshared ledger; on
    /// a shared one while it holds the sweep lease (taken or renewed here, throttled).
    pub async fn leads_sweeps(&self, ledger: &dyn TaskLedger) -> bool {
        if !self.shared {
            return true;
        }
        let now = now_ms();
        let margin = LEASE_RENEW_MARGIN.as_millis() as i64;
        {
            let mut state = self.lease.lock().unwrap_or_else(|p| p.into_inner());
            if state.held_until - margin > now {
                return true;
            }
            if state.held_until <= now && now - state.last_try < margin {
                return false;
            }
            state.last_try = now;
        }
        let until = now + LEASE_TTL.as_millis() as i64;
        let held = match ledger.try_lease(SWEEP_LEASE, &self.id, now, until).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "taking the sweep lease failed");
                false
            }
        };
        let mut state = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        // A failed renewal keeps what was held: it still runs until then.
        if held {
            state.held_until = until;
        }
        state.held_until > now
    }
}

/// [`Replica::remote_home`], pure.
pub fn remote_home<'a>(
    shared: bool,
    task_state: UpstreamTaskState,
    me: &str,
    record: &'a TaskRecord,
) -> Option<&'a str> {
    let remote = shared
        && task_state == UpstreamTaskState::PerReplica
        && !record.home.is_empty()
        && record.home != me;
    remote.then_some(record.home.as_str())
}

/// Records this replica's heartbeat, valid for `ttl`, with where its hop listens; once
/// recorded, `memory` may be trusted for a while longer.
pub async fn beat_once(
    ledger: &dyn TaskLedger,
    advertise: Option<&str>,
    ttl: Duration,
    memory: &HomeMemory,
) -> crate::ledger::Result<()> {
    let now = now_ms();
    let beat = ReplicaBeat {
        address: advertise.map(str::to_owned),
        now,
        expires_at: now + ttl.as_millis() as i64,
    };
    ledger.heartbeat(&beat).await?;
    memory.note_heartbeat(beat.expires_at, ttl);
    Ok(())
}

/// Beats every sixth of `ttl` until shutdown.
pub async fn heartbeat(
    ledger: std::sync::Arc<dyn TaskLedger>,
    advertise: Option<String>,
    ttl: Duration,
    memory: Arc<HomeMemory>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(ttl / 6) => {}
        }
        if let Err(e) = beat_once(ledger.as_ref(), advertise.as_deref(), ttl, &memory).await {
            tracing::warn!(error = %e, "recording this replica's heartbeat failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Owner;

    fn task(home: &str) -> TaskRecord {
        TaskRecord {
            home: home.into(),
            ..crate::sidecar::decisions::test_task(Owner {
                issuer: "https://idp.test".into(),
                subject: "alice".into(),
                tenant: String::new(),
                client: String::new(),
            })
        }
    }

    #[test]
    fn only_per_replica_state_on_a_shared_ledger_routes_to_another_home() {
        use UpstreamTaskState::{PerReplica, Shared};
        let elsewhere = task("pod-b");
        assert_eq!(
            remote_home(true, PerReplica, "pod-a", &elsewhere),
            Some("pod-b")
        );
        assert_eq!(
            remote_home(true, PerReplica, "pod-b", &elsewhere),
            None,
            "home"
        );
        assert_eq!(
            remote_home(true, Shared, "pod-a", &elsewhere),
            None,
            "shared state"
        );
        assert_eq!(
            remote_home(false, PerReplica, "pod-a", &elsewhere),
            None,
            "own ledger"
        );
        assert_eq!(
            remote_home(true, PerReplica, "pod-a", &task("")),
            None,
            "no home"
        );
    }
}
