//! Counters that only go up (`advance_counter`, `counter`): one row per name.

use rusqlite::{Connection, OptionalExtension, params};

use super::Ctx;
use crate::ledger::{LedgerError, Result};

fn to_u64(name: &str, value: i64) -> Result<u64> {
    u64::try_from(value)
        .map_err(|_| LedgerError::corrupt(format!("counter {name:?} is negative ({value})")))
}

/// Adds one to `name` (creating it at 1) and returns the new value.
pub(super) fn advance(conn: &Connection, name: &str) -> Result<u64> {
    let value: i64 = conn
        .prepare_cached(
            "INSERT INTO counters (name, value) VALUES (?1, 1) \
             ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
        )
        .ctx("prepare counter advance")?
        .query_row(params![name], |row| row.get(0))
        .ctx("advance counter")?;
    to_u64(name, value)
}

/// The value of `name`; 0 if it never advanced.
pub(super) fn read(conn: &Connection, name: &str) -> Result<u64> {
    let value: Option<i64> = conn
        .prepare_cached("SELECT value FROM counters WHERE name = ?1")
        .ctx("prepare counter lookup")?
        .query_row(params![name], |row| row.get(0))
        .optional()
        .ctx("look up counter")?;
    to_u64(name, value.unwrap_or(0))
}
