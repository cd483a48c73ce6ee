//! Token buckets shared by replicas (request-rate limits): one row per server and bucket,
//! charged by one `INSERT … ON CONFLICT DO UPDATE` for all of a request's buckets at once. The
//! refill runs on the database's clock, so replicas' clocks never disagree about it, and the
//! row lock of the upsert serializes concurrent charges of one bucket.

use deadpool_postgres::GenericClient;

use super::sql::{col, rows};
use crate::ledger::{LedgerError, Result, TokenAsk, TokenGrant};

/// The level of the existing row `b` at `now` (`EXCLUDED.updated_at`), refilled at the ask's
/// rate up to its burst.
const LEVEL: &str = "LEAST(EXCLUDED.burst::float8, b.tokens + GREATEST(0, EXCLUDED.updated_at - b.updated_at) * EXCLUDED.rate / 1000.0)";

/// Charges every ask (`$2..$5` are parallel arrays: bucket, rate, burst, want) and returns
/// each bucket's grant and level. A new bucket starts full. `last_granted` of the inserted row
/// carries the want into the update (it is at most the burst).
static TAKE: std::sync::LazyLock<String> = std::sync::LazyLock::new(take_sql);

fn take_sql() -> String {
    let granted = format!("LEAST(EXCLUDED.last_granted, floor({LEVEL}))");
    format!(
        "INSERT INTO lifeguard_rate_buckets AS b \
             (server, bucket, tokens, rate, burst, updated_at, last_granted, full_at) \
         SELECT $1, a.bucket, a.burst - LEAST(a.want, a.burst), a.rate, a.burst, now.ms, \
                LEAST(a.want, a.burst), \
                now.ms + ceil(LEAST(a.want, a.burst) / a.rate * 1000.0)::bigint \
         FROM unnest($2::text[], $3::float8[], $4::int[], $5::int[]) AS a(bucket, rate, burst, want), \
              (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) AS now \
         ON CONFLICT (server, bucket) DO UPDATE SET \
             tokens = {LEVEL} - {granted}, \
             rate = EXCLUDED.rate, \
             burst = EXCLUDED.burst, \
             updated_at = GREATEST(b.updated_at, EXCLUDED.updated_at), \
             last_granted = {granted}::int, \
             full_at = GREATEST(b.updated_at, EXCLUDED.updated_at) \
                 + ceil((EXCLUDED.burst - ({LEVEL} - {granted})) / EXCLUDED.rate * 1000.0)::bigint \
         RETURNING b.bucket, b.last_granted, b.tokens"
    )
}

pub(super) async fn take<C: GenericClient>(
    c: &C,
    server: &str,
    asks: &[TokenAsk],
) -> Result<Vec<TokenGrant>> {
    if asks.is_empty() {
        return Ok(Vec::new());
    }
    let buckets: Vec<&str> = asks.iter().map(|a| a.bucket.as_str()).collect();
    let rates: Vec<f64> = asks.iter().map(|a| a.requests_per_second).collect();
    let bursts: Vec<i32> = asks
        .iter()
        .map(|a| i32::try_from(a.burst).unwrap_or(i32::MAX))
        .collect();
    let wants: Vec<i32> = asks
        .iter()
        .map(|a| i32::try_from(a.want.min(a.burst)).unwrap_or(i32::MAX))
        .collect();
    let found = rows(
        c,
        &TAKE,
        &[&server, &buckets, &rates, &bursts, &wants],
        "take rate-limit tokens",
    )
    .await?;
    let mut grants = Vec::with_capacity(asks.len());
    for ask in asks {
        let row = found
            .iter()
            .find(|row| col::<String>(row, 0).is_ok_and(|b| b == ask.bucket))
            .ok_or_else(|| LedgerError::Internal(format!("bucket {:?} not charged", ask.bucket)))?;
        let granted: i32 = col(row, 1)?;
        grants.push(TokenGrant {
            granted: u32::try_from(granted)
                .map_err(|_| LedgerError::corrupt("negative rate-limit grant"))?,
            left: col(row, 2)?,
        });
    }
    Ok(grants)
}

/// Deletes the buckets of `server` that are full again (the same as none): at most `limit`.
pub(super) async fn purge_full<C: GenericClient>(c: &C, server: &str, limit: i64) -> Result<u64> {
    let sql = "DELETE FROM lifeguard_rate_buckets WHERE server = $1 AND bucket IN ( \
                   SELECT bucket FROM lifeguard_rate_buckets WHERE server = $1 \
                   AND full_at <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
                   LIMIT $2)";
    super::sql::exec(c, sql, &[&server, &limit], "purge full rate-limit buckets").await
}
