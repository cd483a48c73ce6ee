//! The ledger across an outage: cut off from PostgreSQL (a proxy in between is stopped), every
//! operation fails; once the proxy is back, the same instance works again, its settlement
//! listener included.

use std::time::{Duration, Instant};

use futures_util::poll;

use super::support::{Proxy, TestDb, scope};
use crate::ledger::conformance::{NOW, UNLIMITED, confirmation, fresh_owner, reservation};
use crate::ledger::{Confirmed, LedgerError, PostgresLedger, ReserveOutcome, TaskLedger};

const SERVER: &str = "ns/recovering";
const PASSWORD: &str = "proxy-password-never-shown";

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn survives_the_database_going_away() {
    let db = TestDb::create().await;
    let mut proxy = Proxy::start().await;
    let location = db
        .location()
        .with_endpoint("127.0.0.1", proxy.port())
        .with_password(PASSWORD)
        .with_connect_timeout(Duration::from_secs(2));
    let ledger = PostgresLedger::open(&location, scope(SERVER, "behind-proxy"))
        .await
        .expect("open through the proxy");
    // Another replica, connected directly.
    let direct = db.open(SERVER, "direct").await;

    let owner = fresh_owner();
    let r = reservation(&owner, UNLIMITED);
    let id = r.id.clone();
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    let Confirmed::New(task) = ledger.confirm(&id, confirmation(NOW)).await.unwrap() else {
        panic!("a fresh upstream ID");
    };

    // A waiter from before the outage does not hang through it: woken when the listener loses
    // its connection, it checks again and fails.
    let r = reservation(&owner, UNLIMITED);
    let held = r.id.clone();
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    let mut waiter = ledger.wait_settled(&held);
    assert!(poll!(&mut waiter).is_pending());

    proxy.stop().await;
    let waited = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("woken by the lost connection");
    assert!(
        waited.as_ref().is_err_and(LedgerError::is_unavailable),
        "{waited:?}"
    );
    // Fail closed: reads, writes and waits all fail, and say why without the password.
    let failures: Vec<LedgerError> = vec![
        ledger.get(&task.id).await.expect_err("get while down"),
        ledger
            .reserve(reservation(&owner, UNLIMITED))
            .await
            .expect_err("reserve while down"),
        ledger.wait_settled(&id).await.expect_err("wait while down"),
        ledger.secret("audit").await.expect_err("secret while down"),
    ];
    for err in &failures {
        assert!(err.is_unavailable(), "{err}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(PASSWORD), "{shown}");
    }
    assert_eq!(
        direct.get(&task.id).await.unwrap().as_ref(),
        Some(&task),
        "nothing was written by the failed calls"
    );

    proxy.restart().await;
    // The same instance, not reopened: the pool connects anew.
    assert_eq!(ledger.get(&task.id).await.unwrap(), Some(task.clone()));
    let r = reservation(&owner, UNLIMITED);
    let pending = r.id.clone();
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);

    // The listener reconnects too: a settlement by the other replica wakes a waiter here.
    eventually("the listener reconnects", || {
        ledger._listener.sessions() >= 2
    })
    .await;
    let mut waiter = ledger.wait_settled(&pending);
    assert!(poll!(&mut waiter).is_pending());
    direct.release(&pending).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("woken by the other replica's release")
        .unwrap();
}
