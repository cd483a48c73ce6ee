//! Statements for what replicas share: heartbeats, leases and capability budgets.

use deadpool_postgres::{GenericClient, Transaction};

use super::lock_key;
use super::sql::{exec, one_row, opt_row, records, rows, sql_limit, task_columns, task_from};
use crate::ledger::{
    BUDGET_USE_HORIZON_MS, BudgetOutcome, BudgetSpend, LedgerError, ReplicaBeat, ReplicaInfo,
    Result, TaskId, TaskRecord,
};

fn corrupt(e: tokio_postgres::Error) -> LedgerError {
    LedgerError::corrupt_because("replica row", e)
}

pub(super) async fn heartbeat<C: GenericClient>(
    c: &C,
    server: &str,
    replica: &str,
    beat: &ReplicaBeat,
) -> Result<()> {
    let sql = "INSERT INTO lifeguard_replicas (server, replica, address, last_beat_at, \
               expires_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (server, replica) DO UPDATE \
               SET address = excluded.address, last_beat_at = excluded.last_beat_at, \
               expires_at = excluded.expires_at";
    exec(
        c,
        sql,
        &[
            &server,
            &replica,
            &beat.address,
            &beat.now,
            &beat.expires_at,
        ],
        "record heartbeat",
    )
    .await?;
    Ok(())
}

pub(super) async fn replica<C: GenericClient>(
    c: &C,
    server: &str,
    replica: &str,
) -> Result<Option<ReplicaInfo>> {
    let sql = "SELECT replica, address, last_beat_at, expires_at FROM lifeguard_replicas \
               WHERE server = $1 AND replica = $2";
    let Some(row) = opt_row(c, sql, &[&server, &replica], "look up replica").await? else {
        return Ok(None);
    };
    Ok(Some(ReplicaInfo {
        replica: row.try_get(0).map_err(corrupt)?,
        address: row.try_get(1).map_err(corrupt)?,
        last_beat_at: row.try_get(2).map_err(corrupt)?,
        expires_at: row.try_get(3).map_err(corrupt)?,
    }))
}

pub(super) async fn orphaned<C: GenericClient>(
    c: &C,
    server: &str,
    now: i64,
    limit: usize,
) -> Result<Vec<TaskRecord>> {
    let sql = concat!(
        "SELECT ",
        task_columns!(),
        " FROM ",
        task_from!(),
        " LEFT JOIN lifeguard_replicas AS r ON r.server = t.server AND r.replica = t.home \
         WHERE t.server = $1 AND t.ended_at IS NULL AND t.confirmed AND t.home <> '' \
         AND (r.replica IS NULL OR r.expires_at <= $2) \
         ORDER BY t.created_at, t.id LIMIT $3"
    );
    let found = rows(
        c,
        sql,
        &[&server, &now, &sql_limit(limit)],
        "scan orphaned tasks",
    )
    .await?;
    records(&found)
}

/// One statement: a new lease row, or the existing one taken over when it ended or `holder`
/// has it. Under concurrent takers the row lock of the conflict decides: one wins, the others
/// see its row and their WHERE fails.
pub(super) async fn try_lease<C: GenericClient>(
    c: &C,
    server: &str,
    name: &str,
    holder: &str,
    now: i64,
    until: i64,
) -> Result<bool> {
    let sql = "INSERT INTO lifeguard_leases (server, name, holder, held_until) \
               VALUES ($1, $2, $3, $5) ON CONFLICT (server, name) DO UPDATE \
               SET holder = excluded.holder, held_until = excluded.held_until \
               WHERE lifeguard_leases.holder = excluded.holder \
               OR lifeguard_leases.held_until <= $4";
    let granted = exec(
        c,
        sql,
        &[&server, &name, &holder, &now, &until],
        "take lease",
    )
    .await?;
    Ok(granted == 1)
}

pub(super) async fn spend_budget(
    tx: &Transaction<'_>,
    server: &str,
    spend: &BudgetSpend,
) -> Result<BudgetOutcome> {
    // (The same decision under the same object name and another grant — the object was
    // re-signed — moves the use to the grant in force.)
    // Spends of one grant take turns (across replicas): the counts below see every use
    // committed before, and no other can commit before this one does.
    exec(
        tx,
        "SELECT pg_advisory_xact_lock($1)",
        &[&lock_key(&["budget", server, &spend.grant])],
        "lock the grant's budget",
    )
    .await?;
    let since = spend
        .iteration_window_ms
        .map_or(i64::MIN, |w| spend.now.saturating_sub(w));
    // A use counts for the grant it was spent under; uses recorded before grants were tracked
    // (`grant_key = ''`) count under their exception's name.
    let sql = "SELECT \
        EXISTS (SELECT 1 FROM lifeguard_budget_uses WHERE server = $1 \
            AND (grant_key = $2 OR (grant_key = '' AND exception = $3)) AND decision = $4), \
        (SELECT count(*) FROM lifeguard_budget_uses WHERE server = $1 \
            AND (grant_key = $2 OR (grant_key = '' AND exception = $3)) \
            AND scope = $5 AND used_at > $6), \
        (SELECT count(*) FROM lifeguard_budget_uses WHERE server = $1 \
            AND (grant_key = $2 OR (grant_key = '' AND exception = $3)) AND used_at > $7), \
        (SELECT spent FROM lifeguard_budget_costs WHERE server = $1 AND grant_key = $2)";
    let row = one_row(
        tx,
        sql,
        &[
            &server,
            &spend.grant,
            &spend.exception,
            &spend.decision,
            &spend.scope,
            &since,
            &spend.now.saturating_sub(60_000),
        ],
        "count budget uses",
    )
    .await?;
    let spent_before: bool = row.try_get(0).map_err(corrupt)?;
    let iterations: i64 = row.try_get(1).map_err(corrupt)?;
    let last_minute: i64 = row.try_get(2).map_err(corrupt)?;
    let cost_spent: Option<i64> = row.try_get(3).map_err(corrupt)?;
    if spent_before {
        return Ok(BudgetOutcome::Repeated);
    }
    if iterations >= i64::from(spend.max_iterations) {
        return Ok(BudgetOutcome::IterationBudget);
    }
    if last_minute >= i64::from(spend.max_per_minute) {
        return Ok(BudgetOutcome::Rate);
    }
    let cost_left = match spend.max_cost {
        None => None,
        Some(max_cost) => {
            let spent = u64::try_from(cost_spent.unwrap_or(0)).unwrap_or(u64::MAX);
            let Some(after) = spent
                .checked_add(spend.cost)
                .filter(|after| *after <= max_cost)
            else {
                return Ok(BudgetOutcome::CostBudget);
            };
            let sql = "INSERT INTO lifeguard_budget_costs (server, grant_key, spent, held_until) \
                       VALUES ($1, $2, $3, $4) ON CONFLICT (server, grant_key) DO UPDATE \
                       SET spent = excluded.spent, \
                       held_until = GREATEST(lifeguard_budget_costs.held_until, excluded.held_until)";
            exec(
                tx,
                sql,
                &[
                    &server,
                    &spend.grant,
                    &i64::try_from(after).unwrap_or(i64::MAX),
                    &spend.cost_until,
                ],
                "spend cost",
            )
            .await?;
            Some(max_cost - after)
        }
    };
    let sql = "INSERT INTO lifeguard_budget_uses (server, exception, grant_key, decision, scope, \
               task_id, used_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
               ON CONFLICT (server, exception, decision) DO UPDATE \
               SET grant_key = excluded.grant_key, scope = excluded.scope, \
               task_id = excluded.task_id, used_at = excluded.used_at";
    exec(
        tx,
        sql,
        &[
            &server,
            &spend.exception,
            &spend.grant,
            &spend.decision,
            &spend.scope,
            &spend.task.as_ref().map(TaskId::as_str),
            &spend.now,
        ],
        "record budget use",
    )
    .await?;
    // Counts fit u32: both are below a u32 limit.
    Ok(BudgetOutcome::Spent {
        iterations_left: spend.max_iterations - (iterations as u32) - 1,
        per_minute_left: spend.max_per_minute - (last_minute as u32) - 1,
        cost_left,
    })
}

/// Deletes the budget uses of purged tasks, uses outside tasks older than any window, and the
/// spent cost of grants that expired.
pub(super) async fn forget_budget_uses(
    tx: &Transaction<'_>,
    server: &str,
    purged: &[String],
    now: i64,
) -> Result<()> {
    if !purged.is_empty() {
        let sql = "DELETE FROM lifeguard_budget_uses WHERE server = $1 AND task_id = ANY($2)";
        exec(
            tx,
            sql,
            &[&server, &purged],
            "delete budget uses of purged tasks",
        )
        .await?;
    }
    let sql = "DELETE FROM lifeguard_budget_uses \
               WHERE server = $1 AND task_id IS NULL AND used_at <= $2";
    exec(
        tx,
        sql,
        &[&server, &now.saturating_sub(BUDGET_USE_HORIZON_MS)],
        "delete old budget uses",
    )
    .await?;
    let sql = "DELETE FROM lifeguard_budget_costs WHERE server = $1 AND held_until <= $2";
    exec(
        tx,
        sql,
        &[&server, &now],
        "delete the spent cost of expired grants",
    )
    .await?;
    Ok(())
}
