//! A [`TaskLedger`] that records each operation made while a request is being served as a child
//! span of that request (`ledger {operation}`, with `db.system.name` and `db.operation.name`
//! after the OpenTelemetry database conventions), so a trace shows where a request's time went
//! between the token check, the ledger and the server.
//!
//! Installed only when spans are exported. An operation made under any span (a request's, a
//! listen delivery's, a retried cancellation's, a revocation's apply) is its child; background
//! work (sweeps, heartbeats) runs outside any span and records nothing. Only the operation's name is recorded, never a task
//! ID, an owner or a key.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use super::{
    BudgetOutcome, BudgetSpend, CancelIntent, CancelRequest, Confirmation, Confirmed, Finish,
    FinishOutcome, LedgerScope, PendingCancel, PrincipalFilter, PurgedTask, ReplicaBeat,
    ReplicaInfo, Reservation, ReserveOutcome, Result, TaskId, TaskLedger, TaskRecord, TaskStatus,
    TokenAsk, TokenGrant,
};

/// Wraps a ledger; every method delegates to it.
pub struct TracedLedger {
    inner: Arc<dyn TaskLedger>,
    /// `sqlite` or `postgresql`, as the conventions name them.
    system: &'static str,
}

impl TracedLedger {
    pub fn new(inner: Arc<dyn TaskLedger>) -> Self {
        let system = if inner.is_shared() {
            "postgresql"
        } else {
            "sqlite"
        };
        Self { inner, system }
    }

    /// Runs `operation` in a child span of the current span, if any (the span ends when the
    /// operation does).
    async fn traced<T>(&self, name: &'static str, operation: impl Future<Output = T>) -> T {
        let span = crate::telemetry::spans::ledger(name, self.system, self.inner.is_shared());
        let output = operation.await;
        drop(span);
        output
    }
}

#[async_trait]
impl TaskLedger for TracedLedger {
    async fn reserve(&self, reservation: Reservation) -> Result<ReserveOutcome> {
        self.traced("reserve", self.inner.reserve(reservation))
            .await
    }

    async fn confirm(&self, id: &TaskId, confirmation: Confirmation) -> Result<Confirmed> {
        self.traced("confirm", self.inner.confirm(id, confirmation))
            .await
    }

    async fn confirm_in_replica(
        &self,
        id: &TaskId,
        confirmation: Confirmation,
    ) -> Result<Confirmed> {
        self.traced(
            "confirm_in_replica",
            self.inner.confirm_in_replica(id, confirmation),
        )
        .await
    }

    async fn release(&self, id: &TaskId) -> Result<()> {
        self.traced("release", self.inner.release(id)).await
    }

    async fn wait_settled(&self, id: &TaskId) -> Result<()> {
        self.traced("wait_settled", self.inner.wait_settled(id))
            .await
    }

    async fn get(&self, id: &TaskId) -> Result<Option<TaskRecord>> {
        self.traced("get", self.inner.get(id)).await
    }

    async fn observe(
        &self,
        id: &TaskId,
        status: TaskStatus,
        status_message: Option<String>,
        now: i64,
    ) -> Result<()> {
        self.traced(
            "observe",
            self.inner.observe(id, status, status_message, now),
        )
        .await
    }

    async fn finish(&self, id: &TaskId, finish: Finish) -> Result<FinishOutcome> {
        self.traced("finish", self.inner.finish(id, finish)).await
    }

    async fn request_cancel(&self, id: &TaskId, intent: CancelIntent) -> Result<CancelRequest> {
        self.traced("request_cancel", self.inner.request_cancel(id, intent))
            .await
    }

    async fn cancels_due(&self, now: i64, limit: usize) -> Result<Vec<PendingCancel>> {
        self.traced("cancels_due", self.inner.cancels_due(now, limit))
            .await
    }

    async fn note_cancel_attempt(&self, id: &TaskId, next_attempt_at: i64) -> Result<()> {
        self.traced(
            "note_cancel_attempt",
            self.inner.note_cancel_attempt(id, next_attempt_at),
        )
        .await
    }

    async fn note_result_read(&self, id: &TaskId) -> Result<u32> {
        self.traced("note_result_read", self.inner.note_result_read(id))
            .await
    }

    async fn forget_payload(&self, id: &TaskId) -> Result<()> {
        self.traced("forget_payload", self.inner.forget_payload(id))
            .await
    }

    async fn past_deadline(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
        self.traced("past_deadline", self.inner.past_deadline(now, limit))
            .await
    }

    async fn renew_identity(
        &self,
        id: &TaskId,
        lease_until: Option<i64>,
        delegated_until: Option<i64>,
    ) -> Result<bool> {
        self.traced(
            "renew_identity",
            self.inner.renew_identity(id, lease_until, delegated_until),
        )
        .await
    }

    async fn purge_expired(&self, now: i64, limit: usize) -> Result<Vec<PurgedTask>> {
        self.traced("purge_expired", self.inner.purge_expired(now, limit))
            .await
    }

    async fn active_for(&self, principal: &PrincipalFilter) -> Result<Vec<TaskRecord>> {
        self.traced("active_for", self.inner.active_for(principal))
            .await
    }

    async fn secret(&self, name: &str) -> Result<[u8; 32]> {
        self.traced("secret", self.inner.secret(name)).await
    }

    async fn take_tokens(&self, asks: &[TokenAsk]) -> Result<Vec<TokenGrant>> {
        self.traced("take_tokens", self.inner.take_tokens(asks))
            .await
    }

    async fn remember_proof(&self, digest: &[u8; 32], until: i64, now: i64) -> Result<bool> {
        self.traced(
            "remember_proof",
            self.inner.remember_proof(digest, until, now),
        )
        .await
    }

    async fn purge_proofs(&self, now: i64, limit: usize) -> Result<u64> {
        self.traced("purge_proofs", self.inner.purge_proofs(now, limit))
            .await
    }

    async fn advance_counter(&self, name: &str) -> Result<u64> {
        self.traced("advance_counter", self.inner.advance_counter(name))
            .await
    }

    async fn counter(&self, name: &str) -> Result<u64> {
        self.traced("counter", self.inner.counter(name)).await
    }

    fn scope(&self) -> &LedgerScope {
        self.inner.scope()
    }

    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }

    async fn cancels_due_for(
        &self,
        home: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<PendingCancel>> {
        self.traced(
            "cancels_due_for",
            self.inner.cancels_due_for(home, now, limit),
        )
        .await
    }

    async fn heartbeat(&self, beat: &ReplicaBeat) -> Result<()> {
        self.traced("heartbeat", self.inner.heartbeat(beat)).await
    }

    async fn replica(&self, replica: &str) -> Result<Option<ReplicaInfo>> {
        self.traced("replica", self.inner.replica(replica)).await
    }

    async fn orphaned(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
        self.traced("orphaned", self.inner.orphaned(now, limit))
            .await
    }

    async fn try_lease(&self, name: &str, holder: &str, now: i64, until: i64) -> Result<bool> {
        self.traced("try_lease", self.inner.try_lease(name, holder, now, until))
            .await
    }

    async fn spend_budget(&self, spend: &BudgetSpend) -> Result<BudgetOutcome> {
        self.traced("spend_budget", self.inner.spend_budget(spend))
            .await
    }
}
