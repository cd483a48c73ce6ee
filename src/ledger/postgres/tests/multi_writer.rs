//! Two replicas of one server: two ledger instances (two pools, two listeners) on one database,
//! racing each other.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::poll;

use super::support::TestDb;
use crate::ledger::conformance::{FAR, NOW, UNLIMITED, confirmation, fresh_owner, reservation};
use crate::ledger::{
    BudgetOutcome, BudgetSpend, CancelIntent, CancelRequest, Confirmation, Confirmed, EndReason,
    Ending, Finish, FinishOutcome, IdempotencyClaim, PrincipalFilter, QuotaLimits, QuotaScope,
    ReplicaBeat, Reservation, ReserveOutcome, TaskId, TaskLedger, TaskRecord, TaskStatus,
};

const SERVER: &str = "ns/replicated";
/// Bound on waits that a correct ledger ends at once.
const WAIT: Duration = Duration::from_secs(30);

async fn replicas() -> (TestDb, [Box<dyn TaskLedger>; 2]) {
    let db = TestDb::create().await;
    let a = db.open(SERVER, "replica-a").await;
    let b = db.open(SERVER, "replica-b").await;
    (db, [Box::new(a), Box::new(b)])
}

/// Reserves and confirms a task on `ledger`.
async fn create(ledger: &dyn TaskLedger, owner: &crate::ledger::Owner) -> TaskRecord {
    let r = reservation(owner, UNLIMITED);
    let id = r.id.clone();
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
    match ledger.confirm(&id, confirmation(NOW)).await.unwrap() {
        Confirmed::New(record) => record,
        other => panic!("{other:?}"),
    }
}

/// Reservations of two owners on both replicas confirm one upstream ID at once: one task.
#[tokio::test(flavor = "multi_thread")]
async fn one_upstream_id_one_task_across_replicas() {
    let (_db, [a, b]) = replicas().await;
    let (alice, bob) = (fresh_owner(), fresh_owner());
    let shared = Confirmation {
        upstream_id: "upstream-shared".into(),
        ..confirmation(NOW)
    };
    let mut attempts = Vec::new();
    for i in 0..16 {
        let (ledger, owner) = if i % 2 == 0 { (&a, &alice) } else { (&b, &bob) };
        let r = reservation(owner, UNLIMITED);
        let id = r.id.clone();
        assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
        attempts.push((ledger, owner.clone(), id));
    }
    let outcomes = join_all(
        attempts
            .iter()
            .map(|(ledger, _, id)| ledger.confirm(id, shared.clone())),
    )
    .await;
    let new: Vec<&TaskRecord> = outcomes
        .iter()
        .filter_map(
            |o| match o.as_ref().expect("confirm never errs on a race") {
                Confirmed::New(record) => Some(record),
                _ => None,
            },
        )
        .collect();
    assert_eq!(new.len(), 1, "{outcomes:?}");
    let winner = new[0].owner.clone();
    for ((_, owner, _), outcome) in attempts.iter().zip(&outcomes) {
        match outcome.as_ref().unwrap() {
            Confirmed::New(_) => {}
            Confirmed::SameOwner(record) => {
                assert_eq!((owner, &record.id), (&winner, &new[0].id));
            }
            Confirmed::HeldByAnotherOwner => assert_ne!(owner, &winner),
        }
    }
}

/// With per-replica server state, each replica's server numbers its own tasks: the same
/// upstream ID confirmed on two replicas is two tasks, one per replica; on one replica the
/// one-owner rule still holds; and a shared-state confirmation lives in a space of its own.
#[tokio::test(flavor = "multi_thread")]
async fn upstream_ids_are_per_replica_when_the_servers_keep_their_state_apart() {
    let (_db, [a, b]) = replicas().await;
    let (alice, bob) = (fresh_owner(), fresh_owner());
    let task_1 = || Confirmation {
        upstream_id: "task-1".into(),
        ..confirmation(NOW)
    };
    let reserve = async |ledger: &dyn TaskLedger, owner| {
        let r = reservation(owner, UNLIMITED);
        let id = r.id.clone();
        assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
        id
    };
    let on_a = reserve(a.as_ref(), &alice).await;
    let on_b = reserve(b.as_ref(), &bob).await;
    let (first, second) = futures_util::join!(
        a.confirm_in_replica(&on_a, task_1()),
        b.confirm_in_replica(&on_b, task_1())
    );
    let (Confirmed::New(first), Confirmed::New(second)) = (first.unwrap(), second.unwrap()) else {
        panic!("two replicas' task-1 are two tasks");
    };
    assert_eq!(
        (first.home.as_str(), second.home.as_str()),
        ("replica-a", "replica-b")
    );
    assert_eq!(first.upstream_id, second.upstream_id);

    // Within a replica, one upstream task still has one owner.
    let again = reserve(a.as_ref(), &bob).await;
    assert_eq!(
        a.confirm_in_replica(&again, task_1()).await.unwrap(),
        Confirmed::HeldByAnotherOwner
    );
    let same = reserve(a.as_ref(), &alice).await;
    assert_eq!(
        a.confirm_in_replica(&same, task_1()).await.unwrap(),
        Confirmed::SameOwner(first.clone())
    );
    // Shared server state is its own space: task-1 there is a third task.
    let shared = reserve(b.as_ref(), &alice).await;
    assert!(matches!(
        b.confirm(&shared, task_1()).await.unwrap(),
        Confirmed::New(_)
    ));
}

/// A principal quota of 5 holds across replicas: 2 × 12 reservations at once, 5 granted.
#[tokio::test(flavor = "multi_thread")]
async fn quotas_hold_across_replicas() {
    let (_db, [a, b]) = replicas().await;
    let owner = fresh_owner();
    let limits = QuotaLimits {
        per_principal: 5,
        ..UNLIMITED
    };
    let outcomes = join_all((0..24).map(|i| {
        let ledger = if i % 2 == 0 { &a } else { &b };
        ledger.reserve(reservation(&owner, limits))
    }))
    .await;
    let reserved = outcomes
        .iter()
        .filter(|o| *o.as_ref().unwrap() == ReserveOutcome::Reserved)
        .count();
    assert_eq!(reserved, 5, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| matches!(
        o.as_ref().unwrap(),
        ReserveOutcome::Reserved | ReserveOutcome::OverQuota(QuotaScope::Principal)
    )));
}

/// One idempotency key from both replicas: one reservation; the rest wait on it, then find it.
#[tokio::test(flavor = "multi_thread")]
async fn one_idempotency_key_across_replicas() {
    let (_db, [a, b]) = replicas().await;
    let owner = fresh_owner();
    let claim = IdempotencyClaim {
        key_hash: [7; 32],
        window_ms: 600_000,
    };
    let keyed = || Reservation {
        idempotency: Some(claim.clone()),
        ..reservation(&owner, UNLIMITED)
    };
    let attempts: Vec<Reservation> = (0..16).map(|_| keyed()).collect();
    let outcomes = join_all(attempts.iter().enumerate().map(|(i, r)| {
        let ledger = if i % 2 == 0 { &a } else { &b };
        ledger.reserve(r.clone())
    }))
    .await;
    let winners: Vec<&TaskId> = attempts
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| *o.as_ref().unwrap() == ReserveOutcome::Reserved)
        .map(|(r, _)| &r.id)
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    let holder = winners[0].clone();
    for outcome in &outcomes {
        match outcome.as_ref().unwrap() {
            ReserveOutcome::Reserved => {}
            ReserveOutcome::InFlight(id) => assert_eq!(id, &holder),
            other => panic!("{other:?}"),
        }
    }
    // Confirmed by one replica (whichever reserved it): both now answer with that task.
    let confirmed = b.confirm(&holder, confirmation(NOW)).await.unwrap();
    assert!(matches!(confirmed, Confirmed::New(_)));
    for ledger in [&a, &b] {
        match ledger.reserve(keyed()).await.unwrap() {
            ReserveOutcome::Existing(record) => assert_eq!(record.id, holder),
            other => panic!("{other:?}"),
        }
    }
}

fn finishing(at: i64) -> Finish {
    Finish {
        status: TaskStatus::Completed,
        status_message: None,
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: Some(serde_json::json!({ "at": at })),
            at,
        },
    }
}

/// Concurrent terminal transitions from both replicas: the first wins, everyone sees it.
#[tokio::test(flavor = "multi_thread")]
async fn first_finish_wins_across_replicas() {
    let (_db, [a, b]) = replicas().await;
    let task = create(&*a, &fresh_owner()).await;
    let outcomes = join_all((0..16).map(|i| {
        let ledger = if i % 2 == 0 { &a } else { &b };
        ledger.finish(&task.id, finishing(NOW + 1 + i))
    }))
    .await;
    let applied: Vec<&TaskRecord> = outcomes
        .iter()
        .filter_map(|o| match o.as_ref().unwrap() {
            FinishOutcome::Applied(record) => Some(&**record),
            _ => None,
        })
        .collect();
    assert_eq!(applied.len(), 1, "{outcomes:?}");
    for outcome in &outcomes {
        match outcome.as_ref().unwrap() {
            FinishOutcome::Applied(_) => {}
            FinishOutcome::AlreadyTerminal(record) => assert_eq!(&**record, applied[0]),
            FinishOutcome::NotFound => panic!("the task exists"),
        }
    }
    assert_eq!(b.get(&task.id).await.unwrap().as_ref(), Some(applied[0]));
}

/// Both replicas sweep one revoked principal's tasks at once: one intent per task.
#[tokio::test(flavor = "multi_thread")]
async fn revocation_sweeps_across_replicas_record_one_intent_each() {
    let (_db, [a, b]) = replicas().await;
    let owner = fresh_owner();
    for i in 0..10 {
        create(if i % 2 == 0 { &*a } else { &*b }, &owner).await;
    }
    let filter = PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: Some(owner.subject.clone()),
        tenant: None,
        client: None,
    };
    let sweep = async |ledger: &dyn TaskLedger| {
        let tasks = ledger.active_for(&filter).await.unwrap();
        let requests = tasks.iter().map(|t| {
            let intent = CancelIntent {
                reason: EndReason::Revocation,
                by: None,
                pending_message: "Cancelled: access revoked".into(),
                requested_at: NOW,
                give_up_at: NOW + 60_000,
                trace: None,
            };
            async move { (t.id.clone(), ledger.request_cancel(&t.id, intent).await) }
        });
        join_all(requests).await
    };
    let (from_a, from_b) = tokio::join!(sweep(&*a), sweep(&*b));
    let mut recorded: HashMap<TaskId, usize> = HashMap::new();
    for (id, outcome) in from_a.into_iter().chain(from_b) {
        match outcome.unwrap() {
            CancelRequest::Recorded(_) => *recorded.entry(id).or_default() += 1,
            CancelRequest::AlreadyRequested(record) => {
                assert!(record.cancel.is_some());
                recorded.entry(id).or_default();
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(recorded.len(), 10);
    assert!(recorded.values().all(|n| *n == 1), "{recorded:?}");
}

/// A lease has one holder among both replicas; budgets are spent once across them; both
/// agree on secrets and see each other's heartbeats.
#[tokio::test(flavor = "multi_thread")]
async fn leases_budgets_secrets_and_beats_across_replicas() {
    let (_db, [a, b]) = replicas().await;
    let (from_a, from_b) = tokio::join!(a.secret("audit"), b.secret("audit"));
    assert_eq!(
        from_a.unwrap(),
        from_b.unwrap(),
        "one secret, whoever made it"
    );
    let beat = ReplicaBeat {
        address: Some("10.0.0.1:15021".into()),
        now: NOW,
        expires_at: NOW + 30_000,
    };
    a.heartbeat(&beat).await.unwrap();
    let seen = b.replica("replica-a").await.unwrap().expect("a's beat");
    assert_eq!(seen.address.as_deref(), Some("10.0.0.1:15021"));
    let task = create(&*a, &fresh_owner()).await;
    let orphans = b.orphaned(NOW + 30_000, 100).await.unwrap();
    assert!(orphans.iter().any(|t| t.id == task.id), "a's beat expired");
    assert!(b.orphaned(NOW + 29_999, 100).await.unwrap().is_empty());

    let takes = join_all((0..16).map(|i| {
        let ledger = if i % 2 == 0 { &a } else { &b };
        let holder = format!("holder-{i}");
        async move {
            ledger
                .try_lease("sweeper", &holder, NOW, NOW + 15_000)
                .await
        }
    }))
    .await;
    let granted = takes.iter().filter(|t| *t.as_ref().unwrap()).count();
    assert_eq!(granted, 1, "{takes:?}");

    let spend = |decision: String| BudgetSpend {
        exception: "ns/exception".into(),
        grant: "sha256:grant".into(),
        scope: "task".into(),
        decision,
        task: None,
        max_iterations: 5,
        iteration_window_ms: None,
        max_per_minute: 100,
        cost: 0,
        max_cost: None,
        cost_until: i64::MAX,
        now: FAR,
    };
    let outcomes = join_all((0..20).map(|i| {
        let ledger = if i % 2 == 0 { &a } else { &b };
        let s = spend(format!("d/{i}"));
        async move { ledger.spend_budget(&s).await.unwrap() }
    }))
    .await;
    let spent = outcomes
        .iter()
        .filter(|o| matches!(o, BudgetOutcome::Spent { .. }))
        .count();
    assert_eq!(spent, 5, "{outcomes:?}");
    let repeats = join_all((0..16).map(|i| {
        let ledger = if i % 2 == 0 { &a } else { &b };
        let s = BudgetSpend {
            exception: "ns/other".into(),
            grant: "sha256:other".into(),
            ..spend("same".into())
        };
        async move { ledger.spend_budget(&s).await.unwrap() }
    }))
    .await;
    let first = repeats
        .iter()
        .filter(|o| matches!(o, BudgetOutcome::Spent { .. }))
        .count();
    assert_eq!(first, 1, "{repeats:?}");
    assert!(
        repeats
            .iter()
            .all(|o| matches!(o, BudgetOutcome::Spent { .. } | BudgetOutcome::Repeated))
    );
}

/// A waiter on one replica is woken by the other replica's confirm, release or sweep.
#[tokio::test(flavor = "multi_thread")]
async fn the_other_replica_settles_waiters() {
    let (_db, [a, b]) = replicas().await;
    let owner = fresh_owner();
    let pending = async |ledger: &dyn TaskLedger, expires: i64| {
        let r = Reservation {
            reservation_expires_at: expires,
            ..reservation(&owner, UNLIMITED)
        };
        let id = r.id.clone();
        assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
        id
    };

    let id = pending(&*a, FAR).await;
    let mut waiter = b.wait_settled(&id);
    assert!(poll!(&mut waiter).is_pending(), "pending on b too");
    a.confirm(&id, confirmation(NOW)).await.unwrap();
    tokio::time::timeout(WAIT, waiter)
        .await
        .expect("woken by a's confirm")
        .unwrap();

    let id = pending(&*b, FAR).await;
    let mut waiter = a.wait_settled(&id);
    assert!(poll!(&mut waiter).is_pending());
    b.release(&id).await.unwrap();
    tokio::time::timeout(WAIT, waiter)
        .await
        .expect("woken by b's release")
        .unwrap();

    let id = pending(&*a, NOW + 1_000).await;
    let mut waiter = a.wait_settled(&id);
    assert!(poll!(&mut waiter).is_pending());
    b.purge_expired(NOW + 1_000, 0).await.unwrap();
    tokio::time::timeout(WAIT, waiter)
        .await
        .expect("woken by b's sweep")
        .unwrap();
}

/// Two replicas advance one counter of their server: one sequence, each value once; another
/// server's counter of the same name is its own.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_counters() {
    let (db, [a, b]) = replicas().await;
    assert_eq!(a.counter("generation").await.unwrap(), 0);
    assert_eq!(a.advance_counter("generation").await.unwrap(), 1);
    assert_eq!(b.counter("generation").await.unwrap(), 1);
    assert_eq!(b.advance_counter("generation").await.unwrap(), 2);
    assert_eq!(a.counter("generation").await.unwrap(), 2);
    let advances = join_all((0..16).map(|i| {
        let ledger = if i % 2 == 0 { &a } else { &b };
        ledger.advance_counter("generation")
    }))
    .await;
    let mut values: Vec<u64> = advances.into_iter().map(|v| v.unwrap()).collect();
    values.sort_unstable();
    assert_eq!(values, (3..=18).collect::<Vec<u64>>());
    let elsewhere = db.open("ns/elsewhere", "replica-a").await;
    assert_eq!(elsewhere.counter("generation").await.unwrap(), 0);
    assert_eq!(elsewhere.advance_counter("generation").await.unwrap(), 1);
    assert_eq!(a.counter("generation").await.unwrap(), 18);
}
