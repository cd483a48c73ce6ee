//! DPoP proofs seen by any replica (the replay cache): one row per server and proof digest,
//! kept until the proof could no longer be accepted anyway. Taken by one `INSERT … ON CONFLICT
//! DO UPDATE … WHERE`: the conflict's row lock serializes concurrent uses of one proof, so of
//! any number of them, on any replicas, exactly one is the first.

use deadpool_postgres::GenericClient;

use super::sql::{exec, opt_row};
use crate::ledger::Result;

/// Records the use of proof `$2` until `$3`; a row comes back only when this call inserted it
/// or took over a use that expired before `$4` (an expired use is no replay).
const REMEMBER: &str = "INSERT INTO lifeguard_proof_uses AS p (server, digest, until) \
    VALUES ($1, $2, $3) \
    ON CONFLICT (server, digest) DO UPDATE SET until = EXCLUDED.until WHERE p.until < $4 \
    RETURNING 1";

/// Whether this use of proof `digest` is its first (no use recorded before is unexpired at
/// `now`). One statement in its own transaction, committed with `synchronous_commit` on like
/// every write but a reservation: a use lost in a crash would let the proof be replayed until
/// it expires, and the flush costs this caller a disk write, not anyone else a held lock (only
/// replays of the same proof wait on its row).
pub(super) async fn remember<C: GenericClient>(
    c: &C,
    server: &str,
    digest: &[u8; 32],
    until: i64,
    now: i64,
) -> Result<bool> {
    let taken = opt_row(
        c,
        REMEMBER,
        &[&server, &&digest[..], &until, &now],
        "remember DPoP proof",
    )
    .await?;
    Ok(taken.is_some())
}

/// Deletes at most `limit` proof uses of `server` that expired before `now`; how many went.
pub(super) async fn purge_expired<C: GenericClient>(
    c: &C,
    server: &str,
    now: i64,
    limit: i64,
) -> Result<u64> {
    // The victims are chosen once, in a materialized CTE, as the retention purge chooses tasks
    // (an `IN (SELECT … LIMIT …)` may be rescanned per row deleted, and bound nothing). Locking them
    // rechecks `until` on the latest version of each row: a use a concurrent `remember` just
    // took over is new, and stays; one it holds right now is left for the next purge.
    let sql = "WITH doomed AS MATERIALIZED (SELECT digest FROM lifeguard_proof_uses \
               WHERE server = $1 AND until < $2 ORDER BY until LIMIT $3 FOR UPDATE SKIP LOCKED) \
               DELETE FROM lifeguard_proof_uses AS p USING doomed \
               WHERE p.server = $1 AND p.digest = doomed.digest";
    exec(
        c,
        sql,
        &[&server, &now, &limit],
        "purge expired DPoP proofs",
    )
    .await
}
