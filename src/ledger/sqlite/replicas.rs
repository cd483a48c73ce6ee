//! Statements for what replicas share: heartbeats, leases and capability budgets. On SQLite
//! there is one replica, but the rows are the same as on a shared backend so the behaviour
//! (and the conformance suite) is too.

use rusqlite::{Connection, OptionalExtension, params};

use super::Ctx;
use super::rows::{TASK_COLUMNS, TASK_FROM, collect, raw_task, sql_limit};
use crate::ledger::{
    BudgetOutcome, BudgetSpend, ReplicaBeat, ReplicaInfo, Result, TaskId, TaskRecord,
};

pub(super) fn heartbeat(conn: &Connection, replica: &str, beat: &ReplicaBeat) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO replicas (replica, address, last_beat_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (replica) DO UPDATE SET \
         address = excluded.address, last_beat_at = excluded.last_beat_at, \
         expires_at = excluded.expires_at",
    )
    .ctx("prepare heartbeat")?
    .execute(params![replica, beat.address, beat.now, beat.expires_at])
    .ctx("record heartbeat")?;
    Ok(())
}

pub(super) fn replica(conn: &Connection, replica: &str) -> Result<Option<ReplicaInfo>> {
    conn.prepare_cached(
        "SELECT replica, address, last_beat_at, expires_at FROM replicas WHERE replica = ?1",
    )
    .ctx("prepare replica lookup")?
    .query_row([replica], |row| {
        Ok(ReplicaInfo {
            replica: row.get(0)?,
            address: row.get(1)?,
            last_beat_at: row.get(2)?,
            expires_at: row.get(3)?,
        })
    })
    .optional()
    .ctx("look up replica")
}

pub(super) fn orphaned(conn: &Connection, now: i64, limit: usize) -> Result<Vec<TaskRecord>> {
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM {TASK_FROM} \
         LEFT JOIN replicas AS r ON r.replica = t.home \
         WHERE t.ended_at IS NULL AND t.confirmed = 1 AND t.home <> '' \
         AND (r.replica IS NULL OR r.expires_at <= ?1) \
         ORDER BY t.created_at, t.id LIMIT ?2"
    );
    let mut stmt = conn.prepare_cached(&sql).ctx("prepare orphan scan")?;
    let rows = stmt
        .query_map(params![now, sql_limit(limit)], raw_task)
        .ctx("scan orphaned tasks")?;
    collect(rows)
}

pub(super) fn try_lease(
    conn: &Connection,
    name: &str,
    holder: &str,
    now: i64,
    until: i64,
) -> Result<bool> {
    let granted = conn
        .prepare_cached(
            "INSERT INTO leases (name, holder, until) VALUES (?1, ?2, ?4) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until \
             WHERE leases.holder = excluded.holder OR leases.until <= ?3",
        )
        .ctx("prepare lease")?
        .execute(params![name, holder, now, until])
        .ctx("take lease")?;
    Ok(granted == 1)
}

pub(super) fn spend_budget(conn: &Connection, spend: &BudgetSpend) -> Result<BudgetOutcome> {
    // A use counts for the grant it was spent under; uses recorded before grants were tracked
    // (`grant_key = ''`) count under their exception's name.
    const OF_GRANT: &str = "(grant_key = ?1 OR (grant_key = '' AND exception = ?2))";
    let spent_before: bool = conn
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM budget_uses WHERE {OF_GRANT} AND decision = ?3)"
        ))
        .ctx("prepare budget decision lookup")?
        .query_row(
            params![spend.grant, spend.exception, spend.decision],
            |row| row.get(0),
        )
        .ctx("look up budget decision")?;
    if spent_before {
        return Ok(BudgetOutcome::Repeated);
    }
    let since = spend
        .iteration_window_ms
        .map_or(i64::MIN, |w| spend.now.saturating_sub(w));
    let iterations: i64 = conn
        .prepare_cached(&format!(
            "SELECT COUNT(*) FROM budget_uses WHERE {OF_GRANT} AND scope = ?3 AND at > ?4"
        ))
        .ctx("prepare iteration count")?
        .query_row(
            params![spend.grant, spend.exception, spend.scope, since],
            |row| row.get(0),
        )
        .ctx("count iterations")?;
    if iterations >= i64::from(spend.max_iterations) {
        return Ok(BudgetOutcome::IterationBudget);
    }
    let last_minute: i64 = conn
        .prepare_cached(&format!(
            "SELECT COUNT(*) FROM budget_uses WHERE {OF_GRANT} AND at > ?3"
        ))
        .ctx("prepare rate count")?
        .query_row(
            params![
                spend.grant,
                spend.exception,
                spend.now.saturating_sub(60_000)
            ],
            |row| row.get(0),
        )
        .ctx("count uses in the last minute")?;
    if last_minute >= i64::from(spend.max_per_minute) {
        return Ok(BudgetOutcome::Rate);
    }
    let cost_left = match spend.max_cost {
        None => None,
        Some(max_cost) => {
            let spent: Option<i64> = conn
                .prepare_cached("SELECT spent FROM budget_costs WHERE grant_key = ?1")
                .ctx("prepare cost lookup")?
                .query_row(params![spend.grant], |row| row.get(0))
                .optional()
                .ctx("look up spent cost")?;
            let spent = u64::try_from(spent.unwrap_or(0)).unwrap_or(u64::MAX);
            let Some(after) = spent
                .checked_add(spend.cost)
                .filter(|after| *after <= max_cost)
            else {
                return Ok(BudgetOutcome::CostBudget);
            };
            conn.prepare_cached(
                "INSERT INTO budget_costs (grant_key, spent, until) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (grant_key) DO UPDATE SET spent = excluded.spent, \
                 until = max(budget_costs.until, excluded.until)",
            )
            .ctx("prepare cost spend")?
            .execute(params![
                spend.grant,
                i64::try_from(after).unwrap_or(i64::MAX),
                spend.cost_until
            ])
            .ctx("spend cost")?;
            Some(max_cost - after)
        }
    };
    conn.prepare_cached(
        // The same decision under the same object name and another grant (the object was
        // re-signed) moves the use to the grant in force.
        "INSERT INTO budget_uses (exception, grant_key, decision, scope, task_id, at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (exception, decision) DO UPDATE \
         SET grant_key = excluded.grant_key, scope = excluded.scope, \
         task_id = excluded.task_id, at = excluded.at",
    )
    .ctx("prepare budget use")?
    .execute(params![
        spend.exception,
        spend.grant,
        spend.decision,
        spend.scope,
        spend.task.as_ref().map(TaskId::as_str),
        spend.now
    ])
    .ctx("record budget use")?;
    // Counts fit u32: both are below a u32 limit.
    Ok(BudgetOutcome::Spent {
        iterations_left: spend.max_iterations - (iterations as u32) - 1,
        per_minute_left: spend.max_per_minute - (last_minute as u32) - 1,
        cost_left,
    })
}
