//! Shared token buckets (`take_tokens`): one bucket per server and ID whatever replica charges
//! it, never giving more than it holds, refilled on the database's clock, purged once full.

use std::time::Duration;

use futures_util::future::join_all;

use super::support::TestDb;
use crate::ledger::{TaskLedger, TokenAsk};

const SERVER: &str = "ns/rates";

/// Whether `check` came true within `limit` (asked every 10 ms).
async fn until(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ask(bucket: &str, rate: f64, burst: u32, want: u32) -> TokenAsk {
    TokenAsk {
        bucket: bucket.into(),
        requests_per_second: rate,
        burst,
        want,
    }
}

/// A new bucket starts full; it gives what is asked while it holds it, then what is left, then
/// nothing — and says how much of a token it holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_gives_what_it_holds_and_no_more() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r0").await;
    // 0.001 a second: nothing refills during the test.
    let slow = ask("all\u{1}principal\u{1}alice", 0.001, 5, 3);
    let grants = ledger
        .take_tokens(std::slice::from_ref(&slow))
        .await
        .unwrap();
    assert_eq!(grants[0].granted, 3);
    assert!((grants[0].left - 2.0).abs() < 0.01, "{grants:?}");
    let grants = ledger
        .take_tokens(std::slice::from_ref(&slow))
        .await
        .unwrap();
    assert_eq!(grants[0].granted, 2);
    let grants = ledger
        .take_tokens(std::slice::from_ref(&slow))
        .await
        .unwrap();
    assert_eq!(grants[0].granted, 0);
    assert!(grants[0].left < 1.0, "{grants:?}");
}

/// Several buckets in one call answer in the order asked; replicas share each bucket, and a
/// bucket of another server is another bucket.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_buckets_and_servers_do_not() {
    let db = TestDb::create().await;
    let one = db.open(SERVER, "r0").await;
    let two = db.open(SERVER, "r1").await;
    let other = db.open("ns/other", "r0").await;
    let asks = [ask("a", 0.001, 2, 2), ask("b", 0.001, 4, 1)];
    let grants = one.take_tokens(&asks).await.unwrap();
    assert_eq!((grants[0].granted, grants[1].granted), (2, 1));
    let grants = two.take_tokens(&asks).await.unwrap();
    assert_eq!((grants[0].granted, grants[1].granted), (0, 1));
    let grants = other.take_tokens(&asks).await.unwrap();
    assert_eq!((grants[0].granted, grants[1].granted), (2, 1));
}

/// Fifty charges at once from three replicas of a bucket of ten: exactly ten are granted.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_charges_never_take_more_than_the_bucket_holds() {
    let db = TestDb::create().await;
    let replicas = [
        db.open(SERVER, "r0").await,
        db.open(SERVER, "r1").await,
        db.open(SERVER, "r2").await,
    ];
    let charges = (0..50).map(|n| {
        let ledger = &replicas[n % 3];
        async move {
            ledger
                .take_tokens(&[ask("all\u{1}server\u{1}", 0.001, 10, 1)])
                .await
                .unwrap()[0]
                .granted
        }
    });
    let granted: u32 = join_all(charges).await.into_iter().sum();
    assert_eq!(granted, 10);
}

/// The bucket refills at its rate: drained, it gives again once a token is due.
#[tokio::test(flavor = "multi_thread")]
async fn a_drained_bucket_refills_at_its_rate() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r0").await;
    let fast = ask("fast", 100.0, 1, 1);
    assert_eq!(
        ledger
            .take_tokens(std::slice::from_ref(&fast))
            .await
            .unwrap()[0]
            .granted,
        1
    );
    let refilled = until(Duration::from_secs(5), async || {
        ledger
            .take_tokens(std::slice::from_ref(&fast))
            .await
            .unwrap()[0]
            .granted
            == 1
    })
    .await;
    assert!(refilled);
}

/// A bucket full again is deleted by the retention purge; one still refilling is kept.
#[tokio::test(flavor = "multi_thread")]
async fn buckets_full_again_are_purged() {
    let db = TestDb::create().await;
    let ledger = db.open(SERVER, "r0").await;
    ledger
        .take_tokens(&[ask("quick", 1000.0, 1, 1), ask("slow", 0.001, 1, 1)])
        .await
        .unwrap();
    let count = async || -> i64 {
        db.client()
            .await
            .query_one("SELECT count(*) FROM lifeguard_rate_buckets", &[])
            .await
            .unwrap()
            .get(0)
    };
    assert_eq!(count().await, 2);
    let purged = until(Duration::from_secs(5), async || {
        ledger.purge_expired(0, 100).await.unwrap();
        count().await == 1
    })
    .await;
    assert!(purged, "the full bucket stayed");
    let left: String = db
        .client()
        .await
        .query_one("SELECT bucket FROM lifeguard_rate_buckets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, "slow");
}
