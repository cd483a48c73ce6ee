//! [`TaskLedger`] for [`PostgresLedger`]: each method is one transaction (or one statement)
//! of [`ops`] or [`replicas`]; writes run in tasks of their own ([`spawn`]).

use std::time::Duration;

use async_trait::async_trait;

use super::sql::sql_limit;
use super::{
    CONFIRM_ATTEMPTS, Ctx, PostgresLedger, TRANSIENT_ATTEMPTS, begin, client, commit, replicas,
    spawn, transient,
};
use super::{counters, lifecycle, ops, proof_uses, rate_buckets};
use crate::ledger::checks::{check_finish, check_intent, require_nonterminal};
use crate::ledger::{
    BudgetOutcome, BudgetSpend, CancelIntent, CancelRequest, Confirmation, Confirmed, Finish,
    FinishOutcome, LedgerError, LedgerScope, PendingCancel, PrincipalFilter, PurgedTask,
    ReplicaBeat, ReplicaInfo, Reservation, ReserveOutcome, Result, TaskId, TaskLedger, TaskRecord,
    TaskStatus, TokenAsk, TokenGrant,
};
use crate::model::ModelError;

impl PostgresLedger {
    /// `confirm`, with the upstream ID unique within `space` ('' for servers sharing task
    /// state, the replica for per-replica state).
    async fn confirm_in_space(
        &self,
        id: &TaskId,
        confirmation: Confirmation,
        space: String,
    ) -> Result<Confirmed> {
        require_nonterminal(confirmation.status, "confirm")?;
        let (pool, server) = self.handles();
        let home = self.scope.replica.clone();
        let task = id.as_str().to_owned();
        let confirmed = spawn(async move {
            for _ in 0..CONFIRM_ATTEMPTS {
                let attempt = retrying!(async {
                    let mut client = client(&pool).await?;
                    let tx = begin(&mut client).await?;
                    let done =
                        ops::confirm(&tx, &server, &task, &confirmation, &home, &space).await?;
                    if done.is_some() {
                        commit(tx).await?;
                    } else {
                        tx.rollback().await.ctx("roll back")?;
                    }
                    Ok(done)
                })?;
                if let Some(done) = attempt {
                    return Ok(done);
                }
            }
            Err(LedgerError::Internal(
                "a confirmation kept losing races on its upstream task ID".into(),
            ))
        })
        .await?;
        // Every outcome settles the reservation: confirmed, or released for a taken ID.
        self.settlements.settle([id.as_str()]);
        Ok(confirmed)
    }
}

#[async_trait]
impl TaskLedger for PostgresLedger {
    async fn reserve(&self, reservation: Reservation) -> Result<ReserveOutcome> {
        let (pool, server) = self.handles();
        let (outcome, voided) = spawn(async move {
            retrying!(async {
                let mut client = client(&pool).await?;
                let tx = begin(&mut client).await?;
                let done = ops::reserve(&tx, &server, &reservation).await?;
                commit(tx).await?;
                Ok(done)
            })
        })
        .await?;
        // Local waiters need not wait for the notification's round trip.
        self.settlements.settle(&voided);
        Ok(outcome)
    }

    async fn confirm(&self, id: &TaskId, confirmation: Confirmation) -> Result<Confirmed> {
        self.confirm_in_space(id, confirmation, String::new()).await
    }

    async fn confirm_in_replica(
        &self,
        id: &TaskId,
        confirmation: Confirmation,
    ) -> Result<Confirmed> {
        let space = self.scope.replica.clone();
        self.confirm_in_space(id, confirmation, space).await
    }

    async fn release(&self, id: &TaskId) -> Result<()> {
        let (pool, server) = self.handles();
        let task = id.as_str().to_owned();
        let released = spawn(async move {
            let client = client(&pool).await?;
            ops::release(&client, &server, &task).await
        })
        .await?;
        if released {
            self.settlements.settle([id.as_str()]);
        }
        Ok(())
    }

    async fn wait_settled(&self, id: &TaskId) -> Result<()> {
        loop {
            // Interest first, then the check: a settlement committed after the check is
            // announced to the listener (which listens since open), and wakes us.
            let (_interest, settled) = self.settlements.interest(id.as_str());
            // The check runs in a task of its own: a waiter polled once and then left alone
            // (until its reservation settles) must not keep a pooled connection meanwhile.
            let (pool, server) = self.handles();
            let task = id.as_str().to_owned();
            let reserved = spawn(async move {
                let client = client(&pool).await?;
                ops::is_reserved(&client, &server, &task).await
            })
            .await?;
            if !reserved {
                return Ok(());
            }
            settled.await;
        }
    }

    async fn get(&self, id: &TaskId) -> Result<Option<TaskRecord>> {
        let client = self.client().await?;
        ops::load_task(&client, &self.server, id.as_str()).await
    }

    async fn observe(
        &self,
        id: &TaskId,
        status: TaskStatus,
        status_message: Option<String>,
        now: i64,
    ) -> Result<()> {
        require_nonterminal(status, "observe")?;
        let (pool, server) = self.handles();
        let id = id.as_str().to_owned();
        spawn(async move {
            retrying!(async {
                let mut client = client(&pool).await?;
                let tx = begin(&mut client).await?;
                lifecycle::observe(&tx, &server, &id, status, status_message.as_deref(), now)
                    .await?;
                commit(tx).await
            })
        })
        .await
    }

    async fn finish(&self, id: &TaskId, finish: Finish) -> Result<FinishOutcome> {
        check_finish(&finish)?;
        let (pool, server) = self.handles();
        let id = id.as_str().to_owned();
        spawn(async move {
            retrying!(async {
                let mut client = client(&pool).await?;
                let tx = begin(&mut client).await?;
                let outcome = lifecycle::finish(&tx, &server, &id, &finish).await?;
                commit(tx).await?;
                Ok(outcome)
            })
        })
        .await
    }

    async fn request_cancel(&self, id: &TaskId, intent: CancelIntent) -> Result<CancelRequest> {
        check_intent(&intent)?;
        let (pool, server) = self.handles();
        let id = id.as_str().to_owned();
        spawn(async move {
            retrying!(async {
                let mut client = client(&pool).await?;
                let tx = begin(&mut client).await?;
                let outcome = lifecycle::request_cancel(&tx, &server, &id, &intent).await?;
                commit(tx).await?;
                Ok(outcome)
            })
        })
        .await
    }

    async fn cancels_due(&self, now: i64, limit: usize) -> Result<Vec<PendingCancel>> {
        let client = self.client().await?;
        lifecycle::cancels_due(&client, &self.server, None, now, limit).await
    }

    async fn note_cancel_attempt(&self, id: &TaskId, next_attempt_at: i64) -> Result<()> {
        let (pool, server) = self.handles();
        let id = id.as_str().to_owned();
        spawn(async move {
            let client = client(&pool).await?;
            lifecycle::note_cancel_attempt(&client, &server, &id, next_attempt_at).await
        })
        .await
    }

    async fn note_result_read(&self, id: &TaskId) -> Result<u32> {
        let (pool, server) = self.handles();
        let id = id.as_str().to_owned();
        spawn(async move {
            let client = client(&pool).await?;
            lifecycle::note_result_read(&client, &server, &id).await
        })
        .await
    }

    async fn renew_identity(
        &self,
        id: &TaskId,
        lease_until: Option<i64>,
        delegated_until: Option<i64>,
    ) -> Result<bool> {
        let (pool, server) = self.handles();
        let id = id.as_str().to_owned();
        spawn(async move {
            let client = client(&pool).await?;
            lifecycle::renew_identity(&client, &server, &id, lease_until, delegated_until).await
        })
        .await
    }

    async fn forget_payload(&self, id: &TaskId) -> Result<()> {
        let (pool, server) = self.handles();
        let id = id.as_str().to_owned();
        spawn(async move {
            let client = client(&pool).await?;
            lifecycle::forget_payload(&client, &server, &id).await
        })
        .await
    }

    async fn past_deadline(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
        let client = self.client().await?;
        lifecycle::past_deadline(&client, &self.server, now, limit).await
    }

    async fn purge_expired(&self, now: i64, limit: usize) -> Result<Vec<PurgedTask>> {
        let (pool, server) = self.handles();
        let (purged, voided) = spawn(async move {
            retrying!(async {
                let mut client = client(&pool).await?;
                let tx = begin(&mut client).await?;
                let done = lifecycle::purge_expired(&tx, &server, now, limit).await?;
                commit(tx).await?;
                // Rate-limit buckets that refilled are the same as none.
                rate_buckets::purge_full(&client, &server, sql_limit(limit)).await?;
                Ok(done)
            })
        })
        .await?;
        self.settlements.settle(&voided);
        Ok(purged)
    }

    async fn active_for(&self, principal: &PrincipalFilter) -> Result<Vec<TaskRecord>> {
        let client = self.client().await?;
        lifecycle::active_for(&client, &self.server, principal).await
    }

    async fn secret(&self, name: &str) -> Result<[u8; 32]> {
        let (pool, server) = self.handles();
        let name = name.to_owned();
        spawn(async move {
            let client = client(&pool).await?;
            ops::secret(&client, &server, &name, || {
                let mut fresh = [0u8; 32];
                getrandom::fill(&mut fresh).map_err(ModelError::Random)?;
                Ok(fresh)
            })
            .await
        })
        .await
    }

    async fn take_tokens(&self, asks: &[TokenAsk]) -> Result<Vec<TokenGrant>> {
        let (pool, server) = self.handles();
        let asks = asks.to_vec();
        spawn(async move {
            let client = client(&pool).await?;
            rate_buckets::take(&client, &server, &asks).await
        })
        .await
    }

    async fn remember_proof(&self, digest: &[u8; 32], until: i64, now: i64) -> Result<bool> {
        let (pool, server) = self.handles();
        let digest = *digest;
        spawn(async move {
            let client = client(&pool).await?;
            proof_uses::remember(&client, &server, &digest, until, now).await
        })
        .await
    }

    async fn purge_proofs(&self, now: i64, limit: usize) -> Result<u64> {
        let (pool, server) = self.handles();
        spawn(async move {
            let client = client(&pool).await?;
            proof_uses::purge_expired(&client, &server, now, sql_limit(limit)).await
        })
        .await
    }

    async fn advance_counter(&self, name: &str) -> Result<u64> {
        let (pool, server) = self.handles();
        let name = name.to_owned();
        spawn(async move {
            let client = client(&pool).await?;
            counters::advance(&client, &server, &name).await
        })
        .await
    }

    async fn counter(&self, name: &str) -> Result<u64> {
        let client = self.client().await?;
        counters::read(&client, &self.server, name).await
    }

    fn scope(&self) -> &LedgerScope {
        &self.scope
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn cancels_due_for(
        &self,
        home: &str,
        now: i64,
        limit: usize,
    ) -> Result<Vec<PendingCancel>> {
        let client = self.client().await?;
        lifecycle::cancels_due(&client, &self.server, Some(home), now, limit).await
    }

    async fn heartbeat(&self, beat: &ReplicaBeat) -> Result<()> {
        let (pool, server) = self.handles();
        let replica = self.scope.replica.clone();
        let beat = beat.clone();
        spawn(async move {
            let client = client(&pool).await?;
            replicas::heartbeat(&client, &server, &replica, &beat).await
        })
        .await
    }

    async fn replica(&self, replica: &str) -> Result<Option<ReplicaInfo>> {
        let client = self.client().await?;
        replicas::replica(&client, &self.server, replica).await
    }

    async fn orphaned(&self, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
        let client = self.client().await?;
        replicas::orphaned(&client, &self.server, now, limit).await
    }

    async fn try_lease(&self, name: &str, holder: &str, now: i64, until: i64) -> Result<bool> {
        let (pool, server) = self.handles();
        let (name, holder) = (name.to_owned(), holder.to_owned());
        spawn(async move {
            let client = client(&pool).await?;
            replicas::try_lease(&client, &server, &name, &holder, now, until).await
        })
        .await
    }

    async fn spend_budget(&self, spend: &BudgetSpend) -> Result<BudgetOutcome> {
        let (pool, server) = self.handles();
        let spend = spend.clone();
        spawn(async move {
            retrying!(async {
                let mut client = client(&pool).await?;
                let tx = begin(&mut client).await?;
                let outcome = replicas::spend_budget(&tx, &server, &spend).await?;
                commit(tx).await?;
                Ok(outcome)
            })
        })
        .await
    }
}
