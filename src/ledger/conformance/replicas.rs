//! What replicas share: home replicas and heartbeats, orphaned tasks, leases, the cancellation
//! outbox per home, and CapabilityException budgets.

use futures_util::future::join_all;

use super::cancellation::{intent, request_ok};
use super::{
    FAR, NOW, UNLIMITED, confirm, confirmation, create, end, fresh_owner, reservation, reserve_ok,
    unique,
};
use crate::ledger::{
    BUDGET_USE_HORIZON_MS, BudgetOutcome, BudgetSpend, EndReason, ReplicaBeat, TaskLedger,
};

/// When [`budgets`] and [`budget_race`] spend: later than any `now` another function purges
/// at, so no purge of a shared ledger removes their uses.
const AT: i64 = FAR;

/// Large enough to list every row a shared test database holds.
const ALL: usize = 1_000_000;

/// A task records the replica that confirmed it; the replica's heartbeat decides whether its
/// unfinished tasks are orphaned. The only function that beats: beats of the one replica a
/// ledger instance is would race between functions.
pub async fn replicas_and_orphans(ledger: &dyn TaskLedger) {
    let me = ledger.scope().replica.clone();
    assert!(!me.is_empty() && !ledger.scope().server.is_empty());
    let owner = fresh_owner();
    let live = create(ledger, &owner).await;
    assert_eq!(live.home, me);
    let cancelling = create(ledger, &owner).await;
    request_ok(ledger, &cancelling.id, intent(EndReason::OwnerCancel, NOW)).await;
    let ended = create(ledger, &owner).await;
    end(ledger, &ended.id).await;

    let beat = ReplicaBeat {
        address: Some("10.0.0.7:15021".into()),
        now: NOW,
        expires_at: NOW + 30_000,
    };
    ledger.heartbeat(&beat).await.expect("heartbeat");
    let info = ledger
        .replica(&me)
        .await
        .expect("replica")
        .expect("beat recorded");
    assert_eq!(
        (info.replica.as_str(), info.address.as_deref()),
        (me.as_str(), Some("10.0.0.7:15021"))
    );
    assert_eq!((info.last_beat_at, info.expires_at), (NOW, NOW + 30_000));
    assert_eq!(
        ledger.replica(&unique("never-")).await.expect("replica"),
        None
    );

    let orphan_ids = |at: i64| async move {
        let orphans = ledger.orphaned(at, ALL).await.expect("orphaned");
        assert!(orphans.iter().all(|t| t.ended.is_none()));
        orphans.into_iter().map(|t| t.id).collect::<Vec<_>>()
    };
    let alive = orphan_ids(NOW + 29_999).await;
    assert!(!alive.contains(&live.id) && !alive.contains(&cancelling.id));
    let gone = orphan_ids(NOW + 30_000).await;
    assert!(gone.contains(&live.id), "home's beat expired: orphaned");
    assert!(
        gone.contains(&cancelling.id),
        "a pending cancel is orphaned too"
    );
    assert!(!gone.contains(&ended.id), "terminal tasks never are");

    // A newer beat brings the replica back; the address may change.
    let renewed = ReplicaBeat {
        address: None,
        now: NOW + 40_000,
        expires_at: FAR,
    };
    ledger.heartbeat(&renewed).await.expect("heartbeat");
    let info = ledger.replica(&me).await.expect("replica").expect("beat");
    assert_eq!(
        (info.address, info.last_beat_at, info.expires_at),
        (None, NOW + 40_000, FAR)
    );
    let back = orphan_ids(NOW + 50_000).await;
    assert!(!back.contains(&live.id) && !back.contains(&cancelling.id));
}

/// The cancellation outbox per home: a replica sees the intents of its own tasks only.
pub async fn cancels_due_per_home(ledger: &dyn TaskLedger) {
    let me = ledger.scope().replica.clone();
    let task = create(ledger, &fresh_owner()).await;
    request_ok(ledger, &task.id, intent(EndReason::Revocation, NOW)).await;
    let mine = ledger
        .cancels_due_for(&me, NOW, ALL)
        .await
        .expect("cancels_due_for");
    assert!(mine.iter().any(|p| p.record.id == task.id));
    assert!(mine.iter().all(|p| p.record.home == me));
    let elsewhere = ledger
        .cancels_due_for(&unique("replica-"), NOW, ALL)
        .await
        .expect("cancels_due_for");
    assert!(elsewhere.is_empty(), "{elsewhere:?}");
    let not_yet = ledger
        .cancels_due_for(&me, NOW - 1, ALL)
        .await
        .expect("cancels_due_for");
    assert!(!not_yet.iter().any(|p| p.record.id == task.id));
}

/// A lease has one holder at a time; it passes on once it ends; its holder renews it.
pub async fn leases(ledger: &dyn TaskLedger) {
    let name = unique("sweeper-");
    let lease = |holder: &'static str, now: i64, until: i64| {
        let name = name.clone();
        async move {
            ledger
                .try_lease(&name, holder, now, until)
                .await
                .expect("try_lease")
        }
    };
    assert!(lease("a", NOW, NOW + 15_000).await);
    assert!(!lease("b", NOW + 1, NOW + 15_001).await, "held by a");
    assert!(lease("a", NOW + 5_000, NOW + 20_000).await, "a renews");
    assert!(
        !lease("b", NOW + 19_999, NOW + 35_000).await,
        "renewed until +20 s"
    );
    assert!(
        lease("b", NOW + 20_000, NOW + 35_000).await,
        "a's lease ended"
    );
    assert!(
        !lease("a", NOW + 21_000, NOW + 36_000).await,
        "b holds it now"
    );

    let raced = unique("raced-");
    let holders: Vec<String> = (0..16).map(|i| format!("holder-{i}")).collect();
    let takes = join_all(
        holders
            .iter()
            .map(|h| ledger.try_lease(&raced, h, NOW, NOW + 15_000)),
    )
    .await;
    let granted = takes
        .into_iter()
        .map(|t| t.expect("try_lease"))
        .filter(|t| *t)
        .count();
    assert_eq!(granted, 1, "one holder of a free lease");
}

/// A use of the grant `grant`, recorded under an exception of the same name.
fn spend(grant: &str, scope: &str, decision: &str, now: i64) -> BudgetSpend {
    BudgetSpend {
        exception: grant.into(),
        grant: grant.into(),
        scope: scope.into(),
        decision: decision.into(),
        task: None,
        max_iterations: 2,
        iteration_window_ms: None,
        max_per_minute: 3,
        cost: 0,
        max_cost: None,
        cost_until: FAR * 2,
        now,
    }
}

async fn spent(ledger: &dyn TaskLedger, s: BudgetSpend) -> BudgetOutcome {
    ledger.spend_budget(&s).await.expect("spend_budget")
}

/// Iterations per scope and uses per minute per exception, spent once per decision.
pub async fn budgets(ledger: &dyn TaskLedger) {
    let e = unique("ns/exception-");
    let left = |iterations_left, per_minute_left| BudgetOutcome::Spent {
        iterations_left,
        per_minute_left,
        cost_left: None,
    };
    assert_eq!(
        spent(ledger, spend(&e, "task-a", "a/1", AT)).await,
        left(1, 2)
    );
    assert_eq!(
        spent(ledger, spend(&e, "task-a", "a/1", AT + 1)).await,
        BudgetOutcome::Repeated,
        "the same decision spends nothing again"
    );
    assert_eq!(
        spent(ledger, spend(&e, "task-a", "a/2", AT + 2)).await,
        left(0, 1)
    );
    assert_eq!(
        spent(ledger, spend(&e, "task-a", "a/3", AT + 3)).await,
        BudgetOutcome::IterationBudget
    );
    assert_eq!(
        spent(ledger, spend(&e, "task-b", "b/1", AT + 4)).await,
        left(1, 0)
    );
    assert_eq!(
        spent(ledger, spend(&e, "task-b", "b/2", AT + 5)).await,
        BudgetOutcome::Rate,
        "three uses of the exception within a minute"
    );
    // Another exception has budgets of its own.
    let other = unique("ns/exception-");
    assert_eq!(
        spent(ledger, spend(&other, "task-b", "b/2", AT + 5)).await,
        left(1, 2)
    );
    // A minute after the first use, one use per minute is free again.
    assert_eq!(
        spent(ledger, spend(&e, "task-b", "b/2", AT + 60_000)).await,
        left(0, 0)
    );

    // Iterations within a window (exchanges outside tasks).
    let windowed = |decision: &str, now: i64| BudgetSpend {
        iteration_window_ms: Some(600_000),
        max_per_minute: 100,
        ..spend(&e, "exchange", decision, now)
    };
    let at = AT + 120_000;
    assert!(matches!(
        spent(ledger, windowed("x/1", at)).await,
        BudgetOutcome::Spent { .. }
    ));
    assert!(matches!(
        spent(ledger, windowed("x/2", at + 1)).await,
        BudgetOutcome::Spent { .. }
    ));
    assert_eq!(
        spent(ledger, windowed("x/3", at + 2)).await,
        BudgetOutcome::IterationBudget
    );
    assert!(
        matches!(
            spent(ledger, windowed("x/3", at + 600_000)).await,
            BudgetOutcome::Spent { .. }
        ),
        "the first use left the window"
    );
}

/// Budgets belong to the grant, not to the object: two exceptions carrying one grant draw on
/// one budget (iterations, rate, and a repeated decision); a re-signed object (same name, new
/// grant) moves a repeated decision to the new grant instead of failing.
pub async fn budgets_by_grant(ledger: &dyn TaskLedger) {
    let grant = unique("sha256:grant-");
    let under = |name: &str, scope: &str, decision: &str, now: i64| BudgetSpend {
        exception: name.into(),
        ..spend(&grant, scope, decision, now)
    };
    let (a, b) = (unique("ns/original-"), unique("ns/clone-"));
    assert!(matches!(
        spent(ledger, under(&a, "task-a", "a/1", AT)).await,
        BudgetOutcome::Spent { .. }
    ));
    assert_eq!(
        spent(ledger, under(&b, "task-a", "a/1", AT + 1)).await,
        BudgetOutcome::Repeated,
        "the clone sees the decision the original spent"
    );
    assert!(matches!(
        spent(ledger, under(&b, "task-a", "a/2", AT + 2)).await,
        BudgetOutcome::Spent {
            iterations_left: 0,
            per_minute_left: 1,
            ..
        }
    ));
    assert_eq!(
        spent(ledger, under(&a, "task-a", "a/3", AT + 3)).await,
        BudgetOutcome::IterationBudget,
        "the task's iterations are the grant's, whichever object asks"
    );
    assert!(matches!(
        spent(ledger, under(&b, "task-b", "b/1", AT + 4)).await,
        BudgetOutcome::Spent { .. }
    ));
    assert_eq!(
        spent(ledger, under(&a, "task-c", "c/1", AT + 5)).await,
        BudgetOutcome::Rate,
        "three uses of the grant within a minute, across both objects"
    );
    // The original re-signed (a new grant under the same name) deciding a decision it spent
    // before: recorded for the new grant, not an error.
    let resigned = BudgetSpend {
        grant: unique("sha256:grant-"),
        ..under(&a, "task-a", "a/1", AT + 6)
    };
    assert!(matches!(
        spent(ledger, resigned).await,
        BudgetOutcome::Spent { .. }
    ));
}

/// A cost budget is the grant's over its validity, across tasks and scopes: each use reserves
/// its cost, and a use that would go past the budget is refused and records nothing.
pub async fn budget_costs(ledger: &dyn TaskLedger) {
    let grant = unique("sha256:cost-");
    let costing = |scope: &str, decision: &str, cost: u64| BudgetSpend {
        cost,
        max_cost: Some(1_000),
        max_iterations: 100,
        max_per_minute: 100,
        ..spend(&grant, scope, decision, AT)
    };
    assert_eq!(
        spent(ledger, costing("task-a", "a/1", 600)).await,
        BudgetOutcome::Spent {
            iterations_left: 99,
            per_minute_left: 99,
            cost_left: Some(400)
        }
    );
    assert_eq!(
        spent(ledger, costing("task-a", "a/1", 600)).await,
        BudgetOutcome::Repeated,
        "a repeated decision costs nothing"
    );
    assert_eq!(
        spent(ledger, costing("task-b", "b/1", 401)).await,
        BudgetOutcome::CostBudget
    );
    assert!(matches!(
        spent(ledger, costing("task-b", "b/1", 400)).await,
        BudgetOutcome::Spent {
            cost_left: Some(0),
            ..
        }
    ));
    assert_eq!(
        spent(ledger, costing("task-c", "c/1", 1)).await,
        BudgetOutcome::CostBudget,
        "spent out"
    );
    // Concurrent uses never overspend it.
    let raced = unique("sha256:cost-");
    let outcomes = join_all((0..12).map(|i| {
        let s = BudgetSpend {
            grant: raced.clone(),
            exception: raced.clone(),
            ..costing("task", &format!("d/{i}"), 100)
        };
        async move { spent(ledger, s).await }
    }))
    .await;
    let granted = outcomes
        .iter()
        .filter(|o| matches!(o, BudgetOutcome::Spent { .. }))
        .count();
    assert_eq!(granted, 10, "{outcomes:?}");
}

/// Concurrent uses never overspend; concurrent repeats of one decision spend once.
pub async fn budget_race(ledger: &dyn TaskLedger) {
    let e = unique("ns/exception-");
    let many = |decision: String| BudgetSpend {
        max_iterations: 5,
        max_per_minute: 100,
        ..spend(&e, "task", &decision, AT)
    };
    let outcomes = join_all((0..16).map(|i| {
        let s = many(format!("d/{i}"));
        async move { spent(ledger, s).await }
    }))
    .await;
    let granted = outcomes
        .iter()
        .filter(|o| matches!(o, BudgetOutcome::Spent { .. }))
        .count();
    assert_eq!(granted, 5, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| matches!(
        o,
        BudgetOutcome::Spent { .. } | BudgetOutcome::IterationBudget
    )));

    let once = unique("ns/exception-");
    let outcomes = join_all((0..16).map(|_| {
        let s = spend(&once, "task", "same", AT);
        async move { spent(ledger, s).await }
    }))
    .await;
    let first = outcomes
        .iter()
        .filter(|o| matches!(o, BudgetOutcome::Spent { .. }))
        .count();
    let repeats = outcomes
        .iter()
        .filter(|o| **o == BudgetOutcome::Repeated)
        .count();
    assert_eq!((first, repeats), (1, 15), "{outcomes:?}");
}

/// Budget uses go with their task when it is purged, and uses outside tasks once no window
/// can count them. Purges at times other functions' tasks live in: needs a ledger of its own
/// (left out of [`super::run_shared`]).
pub async fn budgets_purged(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let id = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    let short = crate::ledger::Confirmation {
        ttl_ms: 1_000,
        ..confirmation(NOW)
    };
    let task = confirm(ledger, &id, short).await;
    let e = unique("ns/exception-");
    let of_task = |decision: &str| BudgetSpend {
        task: Some(task.id.clone()),
        max_iterations: 1,
        ..spend(&e, &format!("task\n{}", task.id.as_str()), decision, NOW)
    };
    assert!(matches!(
        spent(ledger, of_task("t/1")).await,
        BudgetOutcome::Spent { .. }
    ));
    assert_eq!(
        spent(ledger, of_task("t/2")).await,
        BudgetOutcome::IterationBudget
    );
    let outside = spend(&e, "exchange", "x/1", NOW);
    assert!(matches!(
        spent(ledger, outside.clone()).await,
        BudgetOutcome::Spent { .. }
    ));

    // Purged one second later: the task's uses go, the recent outside use stays.
    let purged = ledger.purge_expired(NOW + 1_000, ALL).await.expect("purge");
    assert!(purged.iter().any(|p| p.id == task.id));
    let later = |s: BudgetSpend| BudgetSpend {
        now: NOW + 61_000,
        ..s
    };
    assert!(matches!(
        spent(ledger, later(of_task("t/2"))).await,
        BudgetOutcome::Spent { .. }
    ));
    assert_eq!(
        spent(ledger, later(outside.clone())).await,
        BudgetOutcome::Repeated
    );

    // Past the horizon the outside use is gone: its decision can be spent anew.
    let past = NOW + BUDGET_USE_HORIZON_MS + 1;
    ledger.purge_expired(past, ALL).await.expect("purge");
    assert!(matches!(
        spent(
            ledger,
            BudgetSpend {
                now: past,
                ..outside
            }
        )
        .await,
        BudgetOutcome::Spent { .. }
    ));
}
