//! Counters that only go up (`advance_counter`, `counter`): one row per server and name. The
//! advance is one upsert, so concurrent advances on any replica each get a distinct value.

use deadpool_postgres::GenericClient;

use super::sql::{col, one_row, opt_row};
use crate::ledger::{LedgerError, Result};

fn to_u64(name: &str, value: i64) -> Result<u64> {
    u64::try_from(value)
        .map_err(|_| LedgerError::corrupt(format!("counter {name:?} is negative ({value})")))
}

/// Adds one to `name` of `server` (creating it at 1) and returns the new value.
pub(super) async fn advance<C: GenericClient>(c: &C, server: &str, name: &str) -> Result<u64> {
    let sql = "INSERT INTO lifeguard_counters (server, name, value) VALUES ($1, $2, 1) \
               ON CONFLICT (server, name) DO UPDATE SET value = lifeguard_counters.value + 1 \
               RETURNING value";
    let row = one_row(c, sql, &[&server, &name], "advance counter").await?;
    to_u64(name, col(&row, 0)?)
}

/// The value of `name` of `server`; 0 if it never advanced.
pub(super) async fn read<C: GenericClient>(c: &C, server: &str, name: &str) -> Result<u64> {
    let sql = "SELECT value FROM lifeguard_counters WHERE server = $1 AND name = $2";
    match opt_row(c, sql, &[&server, &name], "look up counter").await? {
        Some(row) => to_u64(name, col(&row, 0)?),
        None => Ok(0),
    }
}
