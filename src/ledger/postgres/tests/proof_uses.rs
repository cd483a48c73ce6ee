//! The shared DPoP replay cache (`remember_proof`, `purge_proofs`): one use per server and
//! proof whatever replica sees it, a use expired at `now` taken over, expired uses purged in
//! bounded batches.

use futures_util::future::join_all;

use super::support::TestDb;
use crate::ledger::TaskLedger;
use crate::ledger::conformance::NOW;

const SERVER: &str = "ns/proofs";

/// A digest nobody else uses.
fn digest() -> [u8; 32] {
    let mut digest = [0u8; 32];
    getrandom::fill(&mut digest).expect("OS random number generator");
    digest
}

/// Proof uses of `server` in the database, expired or not.
async fn stored(db: &TestDb, server: &str) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT count(*) FROM lifeguard_proof_uses WHERE server = $1",
            &[&server],
        )
        .await
        .unwrap()
        .get(0)
}

/// The first use of a proof is the only one until it expires; from then on (`until` before
/// `now`) it is taken again, for its new lifetime.
#[tokio::test(flavor = "multi_thread")]
async fn a_proof_is_used_once_until_it_expires() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r0").await;
    let proof = digest();
    assert!(ledger.remember_proof(&proof, NOW + 10, NOW).await.unwrap());
    assert!(!ledger.remember_proof(&proof, NOW + 10, NOW).await.unwrap());
    // Still unexpired at its last millisecond.
    assert!(
        !ledger
            .remember_proof(&proof, NOW + 100, NOW + 10)
            .await
            .unwrap()
    );
    assert!(
        ledger
            .remember_proof(&proof, NOW + 100, NOW + 11)
            .await
            .unwrap()
    );
    assert!(
        !ledger
            .remember_proof(&proof, NOW + 100, NOW + 50)
            .await
            .unwrap(),
        "the new use runs until NOW + 100"
    );
    assert!(
        ledger
            .remember_proof(&digest(), NOW + 10, NOW)
            .await
            .unwrap()
    );
}

/// A proof first used on one replica is a replay on another; another server (its own policy
/// on the same database) keeps its own cache.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_proofs_and_servers_do_not() {
    let db = TestDb::create().await;
    let one = db.open(SERVER, "r0").await;
    let two = db.open(SERVER, "r1").await;
    let other = db.open("ns/other", "r0").await;
    let proof = digest();
    assert!(one.remember_proof(&proof, NOW + 10, NOW).await.unwrap());
    assert!(!two.remember_proof(&proof, NOW + 10, NOW).await.unwrap());
    assert!(other.remember_proof(&proof, NOW + 10, NOW).await.unwrap());
    assert!(!other.remember_proof(&proof, NOW + 10, NOW).await.unwrap());
    assert!(!one.remember_proof(&proof, NOW + 10, NOW).await.unwrap());
}

/// Sixty uses of one proof at once from three replicas: exactly one is the first, for a new
/// proof and for one whose earlier use expired.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_uses_of_a_proof_have_one_first() {
    let db = TestDb::create().await;
    let replicas = [
        db.open(SERVER, "r0").await,
        db.open(SERVER, "r1").await,
        db.open(SERVER, "r2").await,
    ];
    let expired = digest();
    assert!(
        replicas[0]
            .remember_proof(&expired, NOW - 1, NOW - 100)
            .await
            .unwrap()
    );
    for proof in [digest(), digest(), expired] {
        let uses = (0..60).map(|n| {
            let ledger = &replicas[n % 3];
            async move { ledger.remember_proof(&proof, NOW + 60_000, NOW).await }
        });
        let firsts = join_all(uses)
            .await
            .into_iter()
            .map(|first| first.expect("remember_proof"))
            .filter(|first| *first)
            .count();
        assert_eq!(firsts, 1);
    }
}

/// `purge_proofs` deletes uses that expired before `now`, at most `limit` a call, and nothing
/// of another server; a purged proof is new again.
#[tokio::test(flavor = "multi_thread")]
async fn purges_take_expired_uses_only_and_respect_the_limit() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r0").await;
    let other = db.open("ns/other", "r0").await;
    let expired: Vec<[u8; 32]> = (0..5).map(|_| digest()).collect();
    for (i, proof) in (0_i64..).zip(&expired) {
        assert!(ledger.remember_proof(proof, NOW + i, NOW).await.unwrap());
    }
    // Expires exactly at the purge's `now`: not before it, so it stays.
    let live = [digest(), digest()];
    for proof in &live {
        assert!(ledger.remember_proof(proof, NOW + 10, NOW).await.unwrap());
    }
    assert!(other.remember_proof(&digest(), NOW, NOW).await.unwrap());

    let now = NOW + 10;
    assert_eq!(ledger.purge_proofs(now, 2).await.unwrap(), 2);
    assert_eq!(stored(&db, SERVER).await, 5);
    assert_eq!(ledger.purge_proofs(now, 0).await.unwrap(), 0);
    assert_eq!(ledger.purge_proofs(now, 100).await.unwrap(), 3);
    assert_eq!(ledger.purge_proofs(now, 100).await.unwrap(), 0);
    assert_eq!(stored(&db, SERVER).await, 2);
    assert_eq!(stored(&db, "ns/other").await, 1);
    for proof in &live {
        assert!(!ledger.remember_proof(proof, now + 10, now).await.unwrap());
    }
    assert!(
        ledger
            .remember_proof(&expired[0], now + 10, now)
            .await
            .unwrap()
    );
}
