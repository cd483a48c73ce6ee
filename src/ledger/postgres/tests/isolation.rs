//! Two servers on one database share nothing.

use super::support::TestDb;
use crate::ledger::conformance::{FAR, NOW, UNLIMITED, confirmation, fresh_owner, reservation};
use crate::ledger::{
    BudgetOutcome, BudgetSpend, CancelIntent, Confirmation, Confirmed, EndReason, IdempotencyClaim,
    PrincipalFilter, QuotaLimits, QuotaScope, ReplicaBeat, Reservation, ReserveOutcome, TaskLedger,
};

const ALL: usize = 1_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn servers_sharing_a_database_share_nothing() {
    let db = TestDb::create().await;
    // The same replica name on purpose: only the server separates them.
    let one = db.open("ns/one", "replica").await;
    let two = db.open("ns/two", "replica").await;

    // A task of one is invisible to two, by every read.
    let owner = fresh_owner();
    let r = reservation(&owner, UNLIMITED);
    let id = r.id.clone();
    assert_eq!(one.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    assert!(
        two.confirm(&id, confirmation(NOW)).await.is_err(),
        "not two's reservation"
    );
    let task = match one.confirm(&id, confirmation(NOW)).await.unwrap() {
        Confirmed::New(task) => task,
        other => panic!("{other:?}"),
    };
    let intent = CancelIntent {
        reason: EndReason::OwnerCancel,
        by: None,
        pending_message: "Cancellation requested".into(),
        requested_at: NOW,
        give_up_at: NOW + 60_000,
        trace: None,
    };
    one.request_cancel(&task.id, intent).await.unwrap();
    assert_eq!(two.get(&task.id).await.unwrap(), None);
    let filter = PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: Some(owner.subject.clone()),
        tenant: None,
        client: None,
    };
    assert!(two.active_for(&filter).await.unwrap().is_empty());
    assert_eq!(one.active_for(&filter).await.unwrap().len(), 1);
    assert!(two.cancels_due(FAR, ALL).await.unwrap().is_empty());
    assert!(two.past_deadline(FAR, ALL).await.unwrap().is_empty());
    assert!(two.orphaned(FAR, ALL).await.unwrap().is_empty());
    assert_eq!(one.orphaned(FAR, ALL).await.unwrap().len(), 1);
    assert!(two.purge_expired(FAR, ALL).await.unwrap().is_empty());
    assert!(one.get(&task.id).await.unwrap().is_some(), "two's purge");
    two.note_result_read(&task.id).await.unwrap();
    assert_eq!(one.get(&task.id).await.unwrap().unwrap().result_reads, 0);

    // The same upstream ID is a new task in each.
    let same = Confirmation {
        upstream_id: task.upstream_id.clone(),
        ..confirmation(NOW)
    };
    let r = reservation(&owner, UNLIMITED);
    let other_id = r.id.clone();
    two.reserve(r).await.unwrap();
    assert!(matches!(
        two.confirm(&other_id, same).await.unwrap(),
        Confirmed::New(_)
    ));

    // Quotas count each server's own tasks: with one more reservation, one holds 2 active
    // tasks and two holds 1, so a server quota of 2 is full in one only.
    assert_eq!(
        one.reserve(reservation(&owner, UNLIMITED)).await.unwrap(),
        ReserveOutcome::Reserved
    );
    let limits = QuotaLimits {
        per_server: 2,
        ..UNLIMITED
    };
    assert_eq!(
        one.reserve(reservation(&fresh_owner(), limits))
            .await
            .unwrap(),
        ReserveOutcome::OverQuota(QuotaScope::Server)
    );
    assert_eq!(
        two.reserve(reservation(&fresh_owner(), limits))
            .await
            .unwrap(),
        ReserveOutcome::Reserved
    );

    // One idempotency key, a reservation in each.
    let claim = IdempotencyClaim {
        key_hash: [9; 32],
        window_ms: 60_000,
    };
    for ledger in [&one, &two] {
        let keyed = Reservation {
            idempotency: Some(claim.clone()),
            ..reservation(&owner, UNLIMITED)
        };
        assert_eq!(
            ledger.reserve(keyed).await.unwrap(),
            ReserveOutcome::Reserved
        );
    }

    // Secrets, leases, replicas and budgets are each server's own.
    assert_ne!(
        one.secret("audit").await.unwrap(),
        two.secret("audit").await.unwrap()
    );
    assert_eq!(
        one.secret("audit").await.unwrap(),
        one.secret("audit").await.unwrap()
    );
    assert!(
        one.try_lease("sweeper", "a", NOW, NOW + 1_000)
            .await
            .unwrap()
    );
    assert!(
        two.try_lease("sweeper", "b", NOW, NOW + 1_000)
            .await
            .unwrap()
    );
    let beat = ReplicaBeat {
        address: None,
        now: NOW,
        expires_at: FAR,
    };
    one.heartbeat(&beat).await.unwrap();
    assert!(one.replica("replica").await.unwrap().is_some());
    assert_eq!(two.replica("replica").await.unwrap(), None);
    let spend = BudgetSpend {
        exception: "ns/exception".into(),
        grant: "sha256:grant".into(),
        scope: "task".into(),
        decision: "d".into(),
        task: None,
        max_iterations: 1,
        iteration_window_ms: None,
        max_per_minute: 1,
        cost: 0,
        max_cost: None,
        cost_until: i64::MAX,
        now: NOW,
    };
    for ledger in [&one, &two] {
        assert!(matches!(
            ledger.spend_budget(&spend).await.unwrap(),
            BudgetOutcome::Spent { .. }
        ));
    }
}
