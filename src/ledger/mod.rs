//! The task ledger: the sidecar's durable record of every task it handed to a client.
//!
//! The ledger is the source of truth for a task's owner and lifecycle. A row is committed durably
//! before the client learns the task ID; terminal states are written once (first terminal write
//! wins); quotas, idempotency and the one-owner rule for upstream task IDs are decided inside
//! the ledger's own transactions so concurrent requests can never double-spend or share a task.
//! A cancellation is an outbox: its intent is recorded durably first (the task stays
//! non-terminal and keeps its quota slot), and the task ends only once the server confirmed it
//! stopped or the sidecar gave up. Backends: embedded SQLite (default, one pod) and PostgreSQL
//! (replicas of one MCP server share it). Both pass the same conformance suite
//! (`conformance`, compiled for tests only) and the model-based tests (`model_check`: random
//! operation sequences checked against a reference model, also tests only).
//!
//! [`LedgerLocation`] names where a ledger lives and opens the backend that holds it.
//!
//! Times are Unix milliseconds (`i64`); the caller supplies `now` so decisions are testable.

mod checks;
#[cfg(test)]
pub mod conformance;
mod error;
mod location;
#[cfg(test)]
pub mod model_check;
pub mod postgres;
mod settlements;
pub mod sqlite;
pub mod traced;

pub use error::{BoxError, LedgerError, Result};
pub use location::{LedgerLocation, LocationError};
pub use postgres::{PostgresLedger, PostgresLocation};
pub use sqlite::SqliteLedger;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use crate::model::{KeyBinding, Owner, TASK_ID_PREFIX, TaskId, TaskStatus};

/// Why a task reached its terminal state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The upstream server reported completed/failed/cancelled.
    Upstream,
    /// The owner called tasks/cancel.
    OwnerCancel,
    /// A token with the policy's admin cancel scope called tasks/cancel.
    AdminCancel,
    /// The owner's identity was revoked.
    Revocation,
    /// The task's server-enforced deadline passed.
    Deadline,
    /// The upstream server no longer knows the task.
    UpstreamLost,
    /// The server asked for a capability the policy refuses and that cannot be declined
    /// (sampling): the task cannot go on.
    CapabilityRefused,
    /// The owner presented no valid token within the task's identity lease
    /// (`tasks.identityLease`).
    IdentityLeaseExpired,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Upstream => "upstream",
            Self::OwnerCancel => "owner_cancel",
            Self::AdminCancel => "admin_cancel",
            Self::Revocation => "revocation",
            Self::Deadline => "deadline",
            Self::UpstreamLost => "upstream_lost",
            Self::CapabilityRefused => "capability_refused",
            Self::IdentityLeaseExpired => "identity_lease_expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "upstream" => Self::Upstream,
            "owner_cancel" => Self::OwnerCancel,
            "admin_cancel" => Self::AdminCancel,
            "revocation" => Self::Revocation,
            "deadline" => Self::Deadline,
            "upstream_lost" => Self::UpstreamLost,
            "capability_refused" => Self::CapabilityRefused,
            "identity_lease_expired" => Self::IdentityLeaseExpired,
            _ => return None,
        })
    }

    /// Whether the sidecar itself ends tasks for this reason (owner, admin, deadline,
    /// revocation): the reasons a [`CancelIntent`] may carry.
    pub fn is_cancellation(self) -> bool {
        matches!(
            self,
            Self::OwnerCancel
                | Self::AdminCancel
                | Self::Deadline
                | Self::Revocation
                | Self::IdentityLeaseExpired
        )
    }
}

/// One confirmed task as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord {
    pub id: TaskId,
    /// The upstream server's own task ID. Never shown to clients.
    pub upstream_id: String,
    pub owner: Owner,
    pub tool: String,
    /// Scopes of the creating token (kept for audit; access is re-checked on every request).
    pub scopes: Vec<String>,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub created_at: i64,
    pub last_updated_at: i64,
    /// Retention: the task is purged after `created_at + ttl_ms`.
    pub ttl_ms: i64,
    /// Server-enforced deadline (Unix ms).
    pub deadline_at: i64,
    pub poll_interval_ms: Option<i64>,
    /// Set once the task is terminal.
    pub ended: Option<Ending>,
    /// How many times the owner read the completed result.
    pub result_reads: u32,
    /// `iat` (Unix seconds) of the token that created the task, when it had one: revocations
    /// cancel the tasks their revoked tokens started.
    pub token_issued_at: Option<i64>,
    /// The replica whose server holds the task (the [`LedgerScope::replica`] of the ledger that
    /// confirmed it). Empty for tasks recorded before replicas were tracked.
    pub home: String,
    /// The ID of the request that created the task: the correlation ID of every audit event
    /// about it. Empty for tasks recorded before it was kept.
    pub correlation_id: String,
    /// The object the task acts on (the value at the tool's `tasks.objects` pointer), asked
    /// about at every later request when the policy has an object authorizer.
    pub object: Option<String>,
    /// Unix ms by which the owner must present a valid token again (`tasks.identityLease`),
    /// or the task is ended with reason `identity_lease_expired`; `None` without a lease.
    pub lease_until: Option<i64>,
    /// Unix ms until which the task's upstream delegation runs: the latest owner token
    /// expiry seen (capped at the deadline) under `upstream.identity: delegation`.
    pub delegated_until: Option<i64>,
    /// The W3C `traceparent` of the `tools/call` span that created the task, when traces were
    /// exported: every later span about the task links to it, so a trace viewer shows a
    /// minutes-long task as one story. Not a secret (two random IDs and a flag).
    pub trace: Option<String>,
    /// The key the creating token was bound to (DPoP or mTLS): only requests proving this key
    /// may touch the task. `None` for tasks of unbound (bearer) tokens and for tasks recorded
    /// before bindings were kept.
    pub binding: Option<KeyBinding>,
    /// The pending cancellation: set by [`TaskLedger::request_cancel`] on a non-terminal task,
    /// gone once the task is terminal (`finish` removes it in the same transaction).
    pub cancel: Option<CancelIntent>,
}

impl TaskRecord {
    /// When retention ends.
    pub fn expires_at(&self) -> i64 {
        self.created_at.saturating_add(self.ttl_ms)
    }
}

/// A task's key binding from its stored form ([`KeyBinding::to_stored`]; NULL for none). A
/// value that does not read back is a corrupt row, never an unbound task: taking it for `None`
/// would let any bearer token of the owner touch a task bound to a key.
fn stored_binding(stored: Option<String>) -> Result<Option<KeyBinding>> {
    stored
        .map(|text| {
            KeyBinding::from_stored(&text)
                .ok_or_else(|| LedgerError::corrupt(format!("unknown key binding {text:?}")))
        })
        .transpose()
}

/// A task retention ended for, deleted by [`TaskLedger::purge_expired`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgedTask {
    pub id: TaskId,
    /// Its correlation ID, for the audit event of its deletion.
    pub correlation_id: String,
}

/// How a terminal task ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Ending {
    pub reason: EndReason,
    /// Who ended it, for owner/admin cancels.
    pub by: Option<Owner>,
    /// The terminal payload to report from now on: for `completed` the exact CallToolResult
    /// (`result`), for `failed` the JSON-RPC error object (`error`). `None` for cancellations.
    pub payload: Option<serde_json::Value>,
    pub at: i64,
}

/// Why the sidecar is cancelling a task, recorded durably before the server is asked
/// ([`TaskLedger::request_cancel`]). While it is pending the task stays non-terminal (and keeps
/// its quota slot); it ends when the server confirms the task stopped, or when the sidecar gives
/// up, through [`TaskLedger::finish`].
#[derive(Clone, Debug, PartialEq)]
pub struct CancelIntent {
    /// One of the cancellation reasons: `OwnerCancel`, `AdminCancel`, `Deadline`, `Revocation`
    /// ([`EndReason::is_cancellation`]).
    pub reason: EndReason,
    /// Who asked (owner and admin cancels).
    pub by: Option<Owner>,
    /// The task's `statusMessage` until it settles (e.g. "Cancellation requested…").
    pub pending_message: String,
    pub requested_at: i64,
    /// After this the sidecar ends the task as unconfirmed. Not before `requested_at`.
    pub give_up_at: i64,
    /// The W3C `traceparent` of the span that asked for the cancellation (a revocation's apply
    /// span, the owner's `tasks/cancel`), when traces were exported: every retry from the
    /// outbox, on whichever replica, continues that trace.
    pub trace: Option<String>,
}

/// Result of [`TaskLedger::request_cancel`].
#[derive(Clone, Debug, PartialEq)]
pub enum CancelRequest {
    /// The intent was stored; the task as it is now (with the intent and its pending message).
    Recorded(Box<TaskRecord>),
    /// The task already has an intent (the first one wins); the stored state is unchanged.
    AlreadyRequested(Box<TaskRecord>),
    /// The task is already terminal; nothing was stored.
    AlreadyTerminal(Box<TaskRecord>),
    /// No such confirmed task.
    NotFound,
}

/// A cancellation intent due for (another) attempt to reach the server
/// ([`TaskLedger::cancels_due`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PendingCancel {
    /// The task's current record (`record.cancel` is `Some(intent.clone())`).
    pub record: TaskRecord,
    pub intent: CancelIntent,
    /// Attempts noted so far with [`TaskLedger::note_cancel_attempt`].
    pub attempts: u32,
    pub next_attempt_at: i64,
}

/// Concurrency quotas checked at reservation, on non-terminal tasks plus live reservations.
/// Checked in the order principal, tenant, client, server; the first exhausted one is reported.
/// Tenant and client names are scoped by issuer: the tenant quota counts every principal of
/// the same (issuer, tenant), the client quota every principal of the same (issuer, client), so
/// two trusted issuers that happen to use the same tenant (client) name share nothing. An owner
/// with an empty tenant (or client) has none, so that quota does not apply to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaLimits {
    pub per_principal: u32,
    pub per_tenant: u32,
    pub per_client: u32,
    pub per_server: u32,
}

/// Which quota was exhausted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    Principal,
    Tenant,
    Client,
    Server,
}

impl QuotaScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Principal => "principal",
            Self::Tenant => "tenant",
            Self::Client => "client",
            Self::Server => "server",
        }
    }
}

/// An idempotency key (already hashed and bound to the owner by the caller) and how long it
/// maps to the task it creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdempotencyClaim {
    pub key_hash: [u8; 32],
    pub window_ms: i64,
}

/// A request to hold a task slot before the upstream server is contacted.
#[derive(Clone, Debug)]
pub struct Reservation {
    pub id: TaskId,
    pub owner: Owner,
    pub tool: String,
    pub scopes: Vec<String>,
    pub idempotency: Option<IdempotencyClaim>,
    pub limits: QuotaLimits,
    pub now: i64,
    /// A reservation not confirmed or released by then is void (crash recovery).
    pub reservation_expires_at: i64,
    /// `iat` (Unix seconds) of the creating token.
    pub token_issued_at: Option<i64>,
    /// The creating request's ID, kept as the task's correlation ID.
    pub correlation_id: String,
    /// The object the task acts on, when the tool names one.
    pub object: Option<String>,
    /// The first identity lease's end (`tasks.identityLease`), if any.
    pub lease_until: Option<i64>,
    /// How long the creating token delegates (`upstream.identity: delegation`), if it does.
    pub delegated_until: Option<i64>,
    /// The `traceparent` of the creating `tools/call` span ([`TaskRecord::trace`]).
    pub trace: Option<String>,
    /// The key the creating token was bound to, if any ([`TaskRecord::binding`]).
    pub binding: Option<KeyBinding>,
}

/// One ask of [`TaskLedger::take_tokens`].
#[derive(Clone, Debug, PartialEq)]
pub struct TokenAsk {
    /// The bucket (family, scope and party of a request-rate limit).
    pub bucket: String,
    pub requests_per_second: f64,
    pub burst: u32,
    /// Tokens wanted, 1 to `burst`.
    pub want: u32,
}

/// What a bucket gave for a [`TokenAsk`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenGrant {
    /// Whole tokens taken, 0 to `want`.
    pub granted: u32,
    /// What the bucket holds after the take (a fraction of a token when it gave nothing).
    pub left: f64,
}

/// Result of [`TaskLedger::reserve`].
#[derive(Clone, Debug, PartialEq)]
pub enum ReserveOutcome {
    /// The slot is held under the requested ID.
    Reserved,
    /// The idempotency key already maps to a confirmed task within its window.
    Existing(Box<TaskRecord>),
    /// The idempotency key is held by a reservation still in flight, under this ID: wait for it
    /// to be confirmed or released ([`TaskLedger::wait_settled`]), then ask again.
    InFlight(TaskId),
    /// A quota is exhausted; nothing was reserved.
    OverQuota(QuotaScope),
}

/// Facts about a task the upstream server just created.
#[derive(Clone, Debug, PartialEq)]
pub struct Confirmation {
    pub upstream_id: String,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub created_at: i64,
    pub ttl_ms: i64,
    pub deadline_at: i64,
    pub poll_interval_ms: Option<i64>,
}

/// Result of [`TaskLedger::confirm`]: an upstream task ID belongs to one owner only.
#[derive(Clone, Debug, PartialEq)]
pub enum Confirmed {
    /// The reservation is now this confirmed task.
    New(TaskRecord),
    /// The upstream ID is already recorded for a task of the same owner (issuer, subject,
    /// tenant and client all equal) bound to the same key (or, like the reservation, to none),
    /// terminal or not: that existing task. The reservation was released; nothing else changed.
    SameOwner(TaskRecord),
    /// The upstream ID is already recorded for a task of another owner (the server handed one
    /// task to two callers, e.g. by deduplicating on arguments), or of the same owner under
    /// another key binding (a task bound to one key is not the task of a token bound to
    /// another, or to none: only requests proving its key may touch it). Nothing was recorded,
    /// the reservation was released, and the other task is untouched: the caller must not
    /// reveal or cancel it.
    HeldByAnotherOwner,
}

/// A terminal transition.
#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub ending: Ending,
}

/// Result of [`TaskLedger::finish`].
#[derive(Clone, Debug, PartialEq)]
pub enum FinishOutcome {
    /// This write made the task terminal.
    Applied(Box<TaskRecord>),
    /// The task was already terminal; the stored state is unchanged.
    AlreadyTerminal(Box<TaskRecord>),
    /// No such confirmed task.
    NotFound,
}

/// Whose tasks a revocation lookup lists: one issuer's, narrowed by subject, tenant and client;
/// `None` matches any. (A revocation names at least one of the three; a filter naming none
/// lists the whole issuer's tasks.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrincipalFilter {
    pub issuer: String,
    pub subject: Option<String>,
    pub tenant: Option<String>,
    pub client: Option<String>,
}

/// Which MCP server's tasks a ledger instance holds, and which replica of that server this
/// process is. A shared database (PostgreSQL) holds the tasks of many servers: every row and
/// query is scoped by `server`, so two policies sharing one database see nothing of each other.
/// `replica` is recorded as the home of every task this instance confirms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerScope {
    /// The MCP server (its policy), e.g. `namespace/name`. Not empty.
    pub server: String,
    /// This replica (its pod name in a cluster). Not empty.
    pub replica: String,
}

impl LedgerScope {
    /// The scope of a single-process ledger (standalone SQLite, tests).
    pub fn local() -> Self {
        Self {
            server: "local".into(),
            replica: "local".into(),
        }
    }
}

/// One replica's heartbeat ([`TaskLedger::heartbeat`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaBeat {
    /// Where other replicas reach this one's internal hop (`host:port`), when it serves one.
    pub address: Option<String>,
    pub now: i64,
    /// The replica counts as gone once this passes without a newer beat.
    pub expires_at: i64,
}

/// A replica as the ledger last heard of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub replica: String,
    pub address: Option<String>,
    pub last_beat_at: i64,
    pub expires_at: i64,
}

/// How long budget uses outside tasks are kept: longer than any window they are counted in
/// (the per-minute rate, the exchange iteration window). Uses of a task go with the task.
pub const BUDGET_USE_HORIZON_MS: i64 = 3_600_000;

/// One use of a CapabilityException's budgets ([`TaskLedger::spend_budget`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetSpend {
    /// The exception (`namespace/name`) the use is recorded under (for people reading the
    /// ledger; budgets are not counted by it).
    pub exception: String,
    /// The signed grant the budgets belong to ([`crate::exception::grant_key`]): every object
    /// carrying the same signed grant draws on one budget, so copying an approved exception
    /// under another name does not multiply what the approver signed. Uses recorded before
    /// grants were tracked (an empty grant) count under their exception's name.
    pub grant: String,
    /// What `max_iterations` counts over: one task, or one principal's exchanges with a tool.
    pub scope: String,
    /// The decision this use is for (task or request scope + input request key). Spending again
    /// for a decision already spent spends nothing and answers [`BudgetOutcome::Repeated`].
    pub decision: String,
    /// The task the scope belongs to, when it is a task: its uses go when the task is purged.
    pub task: Option<TaskId>,
    pub max_iterations: u32,
    /// Only uses younger than this count against `max_iterations` (exchanges); `None`: all.
    /// At most [`BUDGET_USE_HORIZON_MS`].
    pub iteration_window_ms: Option<i64>,
    /// Uses of the grant (any scope) allowed in the 60 s before `now`.
    pub max_per_minute: u32,
    /// Cost units this use costs (sampling: the request's `maxTokens`).
    pub cost: u64,
    /// The grant's cost budget (`maxCostUnits`) over its whole validity; `None`: no cost
    /// budget (nothing is recorded for it).
    pub max_cost: Option<u64>,
    /// Until when the grant's spent cost must be kept (its `expiresAt`, Unix ms): purged after.
    pub cost_until: i64,
    pub now: i64,
}

/// Result of [`TaskLedger::spend_budget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetOutcome {
    /// This use was recorded; what is left after it.
    Spent {
        iterations_left: u32,
        per_minute_left: u32,
        /// Cost units left after this use, when the grant has a cost budget.
        cost_left: Option<u64>,
    },
    /// The decision was spent before (by this or another replica); nothing more was spent.
    Repeated,
    /// `max_iterations` uses of the scope exist already; nothing was recorded.
    IterationBudget,
    /// `max_per_minute` uses of the grant in the last minute; nothing was recorded.
    Rate,
    /// This use's cost would take the grant's spent cost past `max_cost`; nothing was recorded.
    CostBudget,
}

/// Storage of task ownership and lifecycle. Every method is atomic; implementations must be
/// safe to call concurrently from many requests (and, for shared backends, many replicas).
/// Every write's `Ok` means it is durable; reads see every write that returned before they
/// started.
#[async_trait]
pub trait TaskLedger: Send + Sync {
    /// Holds a slot for a task about to be created upstream, enforcing quotas and idempotency
    /// in one atomic step. Counts non-terminal confirmed tasks plus unexpired reservations.
    /// Unlike the other writes, its `Ok` need not be durable yet (PostgreSQL does not wait for
    /// the flush): a reservation lost in a crash only frees a slot nobody was told about, and
    /// [`TaskLedger::confirm`]'s durable commit covers it.
    async fn reserve(&self, reservation: Reservation) -> Result<ReserveOutcome>;

    /// Turns a reservation into a confirmed task, unless its upstream task ID is already
    /// recorded. Durable (fsync'ed) before it returns: after this, a crash cannot lose the task.
    /// `NoReservation` if `id` is not a reservation (never made, released, voided by expiry, or
    /// already confirmed). The confirmation's status must be non-terminal (`InvalidArgument`
    /// otherwise): a task becomes terminal only through [`TaskLedger::finish`]. An idempotency
    /// window runs from `created_at` (and never ends before the one the reservation started).
    ///
    /// One upstream task ID, one owner: `upstream_id` is unique across all confirmed tasks
    /// still retained, terminal or not (a purged task no longer holds it). If another task
    /// holds it the reservation is released and the answer is [`Confirmed::SameOwner`] (with
    /// that task, when it has the reservation's owner and key binding) or
    /// [`Confirmed::HeldByAnotherOwner`] (with nothing). The lookup, the decision and the write
    /// are one atomic step: of concurrent confirmations of one upstream ID exactly one is
    /// [`Confirmed::New`]. A shared backend must guarantee the same across replicas (a unique
    /// index as the backstop; a confirmation that loses the race on it reports the winner's
    /// owner, never an error).
    async fn confirm(&self, id: &TaskId, confirmation: Confirmation) -> Result<Confirmed>;

    /// [`TaskLedger::confirm`] for a server whose replicas keep their task state apart
    /// (per-replica server state): the upstream task ID is recorded in this replica's space, so
    /// the servers of two replicas may hand out the same ID for different tasks (a counter
    /// each, say) without the second being taken for the first. The one-owner rule holds among
    /// the upstream IDs of this replica. A ledger that only one replica uses has one space, so
    /// this is `confirm`.
    async fn confirm_in_replica(
        &self,
        id: &TaskId,
        confirmation: Confirmation,
    ) -> Result<Confirmed>;

    /// Drops a reservation (the upstream answered without a task, or failed). Idempotent: an ID
    /// that is not a reservation (already released, voided, unknown) is a no-op, and confirmed
    /// tasks are never touched.
    async fn release(&self, id: &TaskId) -> Result<()>;

    /// Waits until the reservation `id` is no longer pending: confirmed, released, or gone
    /// (voided by expiry and swept by `reserve` or `purge_expired`). Returns at once when it is
    /// not pending now (including IDs that were never reserved). Meant for
    /// [`ReserveOutcome::InFlight`]: wait on the holder, then call `reserve` again.
    ///
    /// Race-free: interest is registered before the current state is checked, so a settlement
    /// committed at any point after the call starts wakes it. It does not poll storage: each
    /// backend signals settlements its own way (SQLite: in-process notification after the
    /// commit; a shared backend such as PostgreSQL: its own mechanism, e.g. LISTEN/NOTIFY, so a
    /// reservation settled by another replica wakes it too).
    ///
    /// Callers must still bound the wait (`tokio::time::timeout`): a reservation voided only by
    /// the clock (its expiry passed but nothing swept it yet) is never signalled, and an SQLite
    /// file shared with another process is not watched for that process's writes.
    async fn wait_settled(&self, id: &TaskId) -> Result<()>;

    /// A confirmed task by ID. Reservations are invisible.
    async fn get(&self, id: &TaskId) -> Result<Option<TaskRecord>>;

    /// Records a non-terminal status reported by the upstream. No effect on terminal or unknown
    /// tasks; a terminal `status` is refused with `InvalidArgument` (use `finish`). While a
    /// cancellation is pending the status and `last_updated_at` are updated but the status
    /// message is not: the task keeps its intent's `pending_message`, so a client never sees the
    /// server's "still working" message on a task it asked to cancel.
    async fn observe(
        &self,
        id: &TaskId,
        status: TaskStatus,
        status_message: Option<String>,
        now: i64,
    ) -> Result<()>;

    /// Makes a task terminal unless it already is (compare-and-set; first terminal write wins).
    /// `finish.status` must be terminal (`InvalidArgument` otherwise). Durable before it
    /// returns. A pending cancellation intent is deleted in the same transaction, so the
    /// terminal state and the end of the intent commit together (neither is visible without the
    /// other).
    async fn finish(&self, id: &TaskId, finish: Finish) -> Result<FinishOutcome>;

    /// Records durably (fsync'ed, like `confirm` and `finish`) that the sidecar is about to ask
    /// the server to cancel a task, before it asks. Atomic: only a confirmed, non-terminal task
    /// without an intent gets one (the first intent wins; concurrent requests get one
    /// `Recorded`, the rest `AlreadyRequested`). Storing it sets the task's `status_message` to
    /// `intent.pending_message` and `last_updated_at` to `intent.requested_at`, schedules the
    /// first attempt at `requested_at` (0 attempts so far) and leaves the status alone: the task
    /// stays non-terminal, holding its quota slot, until [`TaskLedger::finish`] ends it.
    ///
    /// `InvalidArgument` (nothing stored) if `intent.reason` is not a cancellation
    /// ([`EndReason::is_cancellation`]) or `give_up_at` is before `requested_at`.
    async fn request_cancel(&self, id: &TaskId, intent: CancelIntent) -> Result<CancelRequest>;

    /// Pending intents whose next attempt is due (`next_attempt_at <= now`), the longest
    /// overdue first (by `next_attempt_at`, then `requested_at`), at most `limit`, each with its
    /// task's current record. Every listed task is non-terminal. A shared backend lists every
    /// replica's intents: callers on several replicas may attempt the same one (forwarding a
    /// cancel twice is harmless; `finish` stays first-write-wins).
    async fn cancels_due(&self, now: i64, limit: usize) -> Result<Vec<PendingCancel>>;

    /// Counts one more attempt at a pending intent and schedules the next at `next_attempt_at`.
    /// Durable before it returns. No effect (and no error) when the task has no intent
    /// (finished, purged, never requested, unknown).
    async fn note_cancel_attempt(&self, id: &TaskId, next_attempt_at: i64) -> Result<()>;

    /// Counts one read of a completed result; returns the count after this read, or 0 when
    /// there is no such confirmed task (nothing counted).
    async fn note_result_read(&self, id: &TaskId) -> Result<u32>;

    /// Drops the stored payload (result or error) of a terminal task; the task stays. Used for
    /// `deleteResultAfterRetrieval`. No effect on unknown or unfinished tasks.
    async fn forget_payload(&self, id: &TaskId) -> Result<()>;

    /// Non-terminal tasks whose deadline is at or before `now`, oldest deadline first. Tasks
    /// with a pending cancellation intent are left out: their cancellation is already under
    /// way, so a sweeper calling this every round does not request it again.
    /// (Also those whose identity lease ended, `lease_until <= now`: the caller tells the two
    /// apart by the deadline.)
    async fn past_deadline(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>>;

    /// Moves a non-terminal task's identity lease and delegation forward to `lease_until` and
    /// `delegated_until` (each only when given and later than what is stored: neither ever
    /// moves back). Returns whether anything changed.
    async fn renew_identity(
        &self,
        id: &TaskId,
        lease_until: Option<i64>,
        delegated_until: Option<i64>,
    ) -> Result<bool>;

    /// Deletes tasks whose retention ended (`created_at + ttl_ms <= now`) with everything stored
    /// about them (their upstream task IDs become free; a pending cancellation intent and the
    /// task's budget uses go with it), void reservations, and budget uses outside tasks older
    /// than [`BUDGET_USE_HORIZON_MS`]; returns the IDs of deleted tasks. `limit` bounds the
    /// tasks deleted per call (call again until fewer come back); void reservations are always
    /// all removed.
    async fn purge_expired(&self, now: i64, limit: usize) -> Result<Vec<PurgedTask>>;

    /// Non-terminal tasks of a principal, including those with a pending cancellation (their
    /// `cancel` is set).
    async fn active_for(&self, principal: &PrincipalFilter) -> Result<Vec<TaskRecord>>;

    /// A 32-byte secret stored in the ledger, created on first use (stable across restarts and
    /// shared by replicas): used to key audit hashes and idempotency keys.
    async fn secret(&self, name: &str) -> Result<[u8; 32]>;

    /// Adds one to the counter `name` (of this server) and returns its new value, atomically
    /// across replicas and durable before it returns; a counter's first advance returns 1.
    /// Used for generation numbers that must never go back (the persisted policy snapshot's).
    async fn advance_counter(&self, name: &str) -> Result<u64>;

    /// The counter `name` of this server as last advanced; 0 if it never was.
    async fn counter(&self, name: &str) -> Result<u64>;

    /// Takes tokens from shared token buckets (request-rate limits held across replicas), one
    /// ask per bucket, in one round trip: each bucket refills at its ask's rate up to its
    /// burst on the database's clock, and gives `want` tokens, or every whole token it holds
    /// when it holds fewer. Answers in the order of `asks`. Only a shared ledger keeps shared
    /// buckets: the others answer an error (their sidecar keeps its buckets in memory).
    async fn take_tokens(&self, asks: &[TokenAsk]) -> Result<Vec<TokenGrant>> {
        let _ = asks;
        Err(LedgerError::Internal(
            "this ledger keeps no shared rate-limit buckets".into(),
        ))
    }

    /// Records the use of a DPoP proof until `until` (Unix ms), atomically across replicas:
    /// `true` when this is its first use, `false` when a use was recorded before and has not
    /// expired at `now` (a replay). `digest` is SHA-256 over the proof's key thumbprint and `jti`
    /// (the caller computes it). Durable before it returns, like every write but `reserve`: a
    /// use lost in a crash would let the proof be replayed until `until`. Only a shared ledger
    /// keeps proofs; the others answer an error (their sidecar keeps the cache in memory).
    async fn remember_proof(&self, digest: &[u8; 32], until: i64, now: i64) -> Result<bool> {
        let _ = (digest, until, now);
        Err(LedgerError::Internal(
            "this ledger keeps no shared proof cache".into(),
        ))
    }

    /// Deletes up to `limit` proof uses that expired before `now`; how many went. A ledger
    /// without a proof cache answers 0.
    async fn purge_proofs(&self, now: i64, limit: usize) -> Result<u64> {
        let _ = (now, limit);
        Ok(0)
    }

    /// Which server and replica this instance serves.
    fn scope(&self) -> &LedgerScope;

    /// Whether other processes (replicas) share this ledger's rows. A shared ledger's
    /// leader-only work (deadline sweeps, retention purges, orphan failing) runs under a
    /// [`TaskLedger::try_lease`]; an unshared one does it all itself.
    fn is_shared(&self) -> bool;

    /// Pending intents due for an attempt, as [`TaskLedger::cancels_due`], of tasks homed on
    /// `home` only: with per-replica server state, only the home replica can reach the task's
    /// server.
    async fn cancels_due_for(
        &self,
        home: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<PendingCancel>>;

    /// Records that this instance's replica is alive (upsert of its row), with where its
    /// internal hop listens. Durable before it returns.
    async fn heartbeat(&self, beat: &ReplicaBeat) -> Result<()>;

    /// A replica of this server as last heard of, alive or not; `None` if it never beat.
    async fn replica(&self, replica: &str) -> Result<Option<ReplicaInfo>>;

    /// Non-terminal tasks whose home replica is gone: its last beat expired at or before `now`
    /// (or it never beat), oldest first, at most `limit`. Tasks without a home (recorded before
    /// replicas were tracked) are never listed. Tasks with a pending cancellation intent are
    /// listed too (nothing will confirm them now).
    async fn orphaned(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>>;

    /// Takes or renews the lease `name` for `holder` until `until`: granted when nobody holds
    /// it, its holder's lease ended at or before `now`, or `holder` holds it already. Atomic
    /// across replicas: of concurrent takers of a free lease exactly one gets `true`.
    async fn try_lease(&self, name: &str, holder: &str, now: i64, until: i64) -> Result<bool>;

    /// Spends one use of an exception's budgets, atomically across replicas: counts the
    /// scope's uses (within the window) and the exception's uses in the last minute, and
    /// records this one only if both are below their limits. A decision spent before is
    /// [`BudgetOutcome::Repeated`] whatever the counts.
    async fn spend_budget(&self, spend: &BudgetSpend) -> Result<BudgetOutcome>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_names_round_trip() {
        for r in [
            EndReason::Upstream,
            EndReason::OwnerCancel,
            EndReason::AdminCancel,
            EndReason::Revocation,
            EndReason::Deadline,
            EndReason::UpstreamLost,
            EndReason::CapabilityRefused,
        ] {
            assert_eq!(EndReason::parse(r.as_str()), Some(r));
        }
        assert!(EndReason::Deadline.is_cancellation() && EndReason::Revocation.is_cancellation());
        assert!(
            !EndReason::Upstream.is_cancellation() && !EndReason::UpstreamLost.is_cancellation()
        );
    }
}
