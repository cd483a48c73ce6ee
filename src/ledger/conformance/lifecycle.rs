//! Lifecycle after confirmation: terminal CAS, observations, deadlines, retention, lookups.

use futures_util::future::join_all;
use serde_json::json;

use super::cancellation::{intent, request_ok};
use super::{
    DAY, FAR, NOW, UNLIMITED, claim, confirm, confirmation, create, end, finishing, fresh_owner,
    get, ids, new_id, reservation, reserve_ok, unique,
};
use crate::ledger::{
    Confirmation, Confirmed, EndReason, Ending, Finish, FinishOutcome, LedgerError, Owner,
    PrincipalFilter, Reservation, TaskId, TaskLedger, TaskRecord, TaskStatus,
};

/// The first terminal write wins; later ones see it unchanged.
pub async fn finish_cas(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let task = create(ledger, &owner).await;
    let first = Finish {
        status: TaskStatus::Completed,
        status_message: Some("ok".into()),
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: Some(json!({"content": [], "structuredContent": {"n": 1}})),
            at: NOW + 10,
        },
    };
    let after = match ledger.finish(&task.id, first).await.expect("finish") {
        FinishOutcome::Applied(after) => *after,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (after.status, after.last_updated_at),
        (TaskStatus::Completed, NOW + 10)
    );
    let second = Finish {
        status: TaskStatus::Failed,
        status_message: Some("late".into()),
        ending: Ending {
            reason: EndReason::Deadline,
            by: Some(owner),
            payload: Some(json!({"code": -32000, "message": "deadline"})),
            at: NOW + 20,
        },
    };
    let outcome = ledger.finish(&task.id, second).await.expect("finish");
    assert_eq!(
        outcome,
        FinishOutcome::AlreadyTerminal(Box::new(after.clone()))
    );
    assert_eq!(get(ledger, &task.id).await, Some(after));

    let f = finishing(TaskStatus::Cancelled, EndReason::Revocation, NOW);
    assert_eq!(
        ledger.finish(&new_id(), f).await.expect("finish"),
        FinishOutcome::NotFound
    );
    let live = create(ledger, &fresh_owner()).await;
    let f = finishing(TaskStatus::Working, EndReason::Upstream, NOW);
    let err = ledger.finish(&live.id, f).await;
    assert!(
        matches!(err, Err(LedgerError::InvalidArgument(_))),
        "{err:?}"
    );
    assert_eq!(get(ledger, &live.id).await, Some(live));
}

/// Of many concurrent terminal writes exactly one applies, and everyone sees that one.
pub async fn finish_race(ledger: &dyn TaskLedger) {
    let task = create(ledger, &fresh_owner()).await;
    let statuses = [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];
    let finishes = (0..20).map(|i| Finish {
        status: statuses[i % 3],
        status_message: Some(format!("writer {i}")),
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: Some(json!({"writer": i})),
            at: NOW + i as i64,
        },
    });
    let outcomes = join_all(finishes.map(|f| ledger.finish(&task.id, f))).await;
    let mut applied = Vec::new();
    let mut already = Vec::new();
    for outcome in outcomes {
        match outcome.expect("finish") {
            FinishOutcome::Applied(r) => applied.push(*r),
            FinishOutcome::AlreadyTerminal(r) => already.push(*r),
            FinishOutcome::NotFound => panic!("task vanished"),
        }
    }
    assert_eq!(applied.len(), 1, "exactly one terminal write applies");
    let winner = applied.remove(0);
    assert!(winner.status.is_terminal() && winner.ended.is_some());
    for seen in already {
        assert_eq!(seen, winner);
    }
    assert_eq!(get(ledger, &task.id).await, Some(winner));
}

/// Observations update live tasks only, and never make a task terminal.
pub async fn observe(ledger: &dyn TaskLedger) {
    let task = create(ledger, &fresh_owner()).await;
    let message = Some("needs approval".to_string());
    ledger
        .observe(
            &task.id,
            TaskStatus::InputRequired,
            message.clone(),
            NOW + 3,
        )
        .await
        .expect("observe");
    let seen = get(ledger, &task.id).await.expect("task");
    assert_eq!(
        (seen.status, &seen.status_message),
        (TaskStatus::InputRequired, &message)
    );
    assert_eq!(seen.last_updated_at, NOW + 3);
    ledger
        .observe(&task.id, TaskStatus::Working, None, NOW + 4)
        .await
        .expect("observe");
    let seen = get(ledger, &task.id).await.expect("task");
    assert_eq!(
        (seen.status, seen.status_message, seen.last_updated_at),
        (TaskStatus::Working, None, NOW + 4)
    );

    let err = ledger
        .observe(&task.id, TaskStatus::Completed, None, NOW + 5)
        .await;
    assert!(
        matches!(err, Err(LedgerError::InvalidArgument(_))),
        "{err:?}"
    );
    assert_eq!(
        get(ledger, &task.id).await.map(|r| r.status),
        Some(TaskStatus::Working)
    );

    let ended = end(ledger, &task.id).await;
    ledger
        .observe(&task.id, TaskStatus::Working, Some("late".into()), NOW + 9)
        .await
        .expect("observe");
    assert_eq!(get(ledger, &task.id).await, Some(ended));
    ledger
        .observe(&new_id(), TaskStatus::Working, None, NOW)
        .await
        .expect("observe unknown");
}

/// Result reads count up per task; unknown tasks count nothing.
pub async fn result_reads(ledger: &dyn TaskLedger) {
    let task = create(ledger, &fresh_owner()).await;
    let other = create(ledger, &fresh_owner()).await;
    end(ledger, &task.id).await;
    for expected in 1..=3 {
        assert_eq!(
            ledger
                .note_result_read(&task.id)
                .await
                .expect("note_result_read"),
            expected
        );
    }
    let counts = join_all((0..10).map(|_| ledger.note_result_read(&other.id))).await;
    let mut counts: Vec<u32> = counts
        .into_iter()
        .map(|c| c.expect("note_result_read"))
        .collect();
    counts.sort_unstable();
    assert_eq!(
        counts,
        (1..=10).collect::<Vec<u32>>(),
        "concurrent reads each count once"
    );
    assert_eq!(get(ledger, &task.id).await.map(|r| r.result_reads), Some(3));
    assert_eq!(
        ledger
            .note_result_read(&new_id())
            .await
            .expect("note_result_read"),
        0
    );
}

/// `forget_payload` drops a terminal task's result and nothing else; unfinished and unknown
/// tasks are unaffected.
pub async fn forget_payload(ledger: &dyn TaskLedger) {
    let done = create(ledger, &fresh_owner()).await;
    let finish = Finish {
        status: TaskStatus::Completed,
        status_message: Some("done".into()),
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: Some(json!({"content": [{"type": "text", "text": "secret result"}]})),
            at: NOW + 5,
        },
    };
    ledger.finish(&done.id, finish).await.expect("finish");
    ledger
        .forget_payload(&done.id)
        .await
        .expect("forget_payload");
    let after = get(ledger, &done.id).await.expect("task stays");
    assert_eq!(after.status, TaskStatus::Completed);
    assert_eq!(after.status_message.as_deref(), Some("done"));
    let ending = after.ended.expect("still ended");
    assert_eq!(ending.payload, None);
    assert_eq!(ending.reason, EndReason::Upstream);

    let running = create(ledger, &fresh_owner()).await;
    ledger
        .forget_payload(&running.id)
        .await
        .expect("forget_payload");
    assert_eq!(get(ledger, &running.id).await, Some(running));
    ledger
        .forget_payload(&new_id())
        .await
        .expect("unknown is a no-op");
}

/// `past_deadline` lists live confirmed tasks at or past their deadline, earliest first, except
/// those whose cancellation is already pending.
pub async fn past_deadline(ledger: &dyn TaskLedger) {
    // Deadlines far before NOW so that only this function's tasks (and leftovers of earlier
    // runs of it) are due at `now`.
    let now = 10_000;
    let owner = fresh_owner();
    let mut due = Vec::new();
    for deadline in [5_000, 3_000, now, 9_000, now + 1, 1_000] {
        let id = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
        let c = Confirmation {
            deadline_at: deadline,
            ttl_ms: NOW,
            ..confirmation(500)
        };
        confirm(ledger, &id, c).await;
        match deadline {
            1_000 => {
                end(ledger, &id).await;
            }
            d if d <= now => due.push((d, id)),
            _ => {}
        }
    }
    due.sort();
    let expected: Vec<TaskId> = due.into_iter().map(|(_, id)| id).collect();
    reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    // Due, but its cancellation is already under way.
    let cancelling = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    let c = Confirmation {
        deadline_at: 2_000,
        ttl_ms: NOW,
        ..confirmation(500)
    };
    confirm(ledger, &cancelling, c).await;
    request_ok(ledger, &cancelling, intent(EndReason::Deadline, 2_000)).await;

    let listed = ledger
        .past_deadline(now, 10_000)
        .await
        .expect("past_deadline");
    let due_at = |r: &TaskRecord| r.deadline_at.min(r.lease_until.unwrap_or(r.deadline_at));
    assert!(
        listed.windows(2).all(|w| due_at(&w[0]) <= due_at(&w[1])),
        "ordered"
    );
    assert!(listed.iter().all(|r| r.ended.is_none() && due_at(r) <= now));
    let mine: Vec<TaskId> = listed
        .into_iter()
        .filter(|r| r.owner == owner)
        .map(|r| r.id)
        .collect();
    assert_eq!(mine, expected);
    let limited = ledger.past_deadline(now, 2).await.expect("past_deadline");
    assert!(limited.len() <= 2);
    assert!(
        ledger
            .past_deadline(now, 0)
            .await
            .expect("past_deadline")
            .is_empty()
    );

    // Leave nothing due for the next run against a shared database.
    for id in expected.iter().chain([&cancelling]) {
        end(ledger, id).await;
    }
    let listed = ledger
        .past_deadline(now, 10_000)
        .await
        .expect("past_deadline");
    assert!(listed.iter().all(|r| r.owner != owner));
}

/// `renew_identity` moves a live task's identity lease and delegation forward, never back, and
/// `past_deadline` also lists tasks whose lease ended.
pub async fn identity_renewal(ledger: &dyn TaskLedger) {
    // Times far before NOW and apart from `past_deadline`'s, so only this function's task is due.
    let owner = fresh_owner();
    let id = reserve_ok(
        ledger,
        Reservation {
            lease_until: Some(25_000),
            delegated_until: Some(24_000),
            ..reservation(&owner, UNLIMITED)
        },
    )
    .await;
    let c = Confirmation {
        deadline_at: 90_000,
        ttl_ms: NOW,
        ..confirmation(500)
    };
    confirm(ledger, &id, c).await;
    let stored = |r: Option<TaskRecord>| r.map(|r| (r.lease_until, r.delegated_until));
    assert_eq!(
        stored(get(ledger, &id).await),
        Some((Some(25_000), Some(24_000)))
    );

    let renew = async |lease: Option<i64>, delegated: Option<i64>| {
        ledger
            .renew_identity(&id, lease, delegated)
            .await
            .expect("renew_identity")
    };
    assert!(!renew(Some(22_000), None).await, "a lease never moves back");
    assert!(!renew(None, Some(20_000)).await, "nor a delegation");
    assert!(!renew(None, None).await);
    assert_eq!(
        stored(get(ledger, &id).await),
        Some((Some(25_000), Some(24_000)))
    );
    assert!(renew(Some(28_000), None).await);
    assert!(
        renew(Some(27_000), Some(26_000)).await,
        "the delegation alone moves"
    );
    assert_eq!(
        stored(get(ledger, &id).await),
        Some((Some(28_000), Some(26_000)))
    );

    let due = async |now: i64| -> bool {
        ledger
            .past_deadline(now, 10_000)
            .await
            .expect("past_deadline")
            .iter()
            .any(|r| r.id == id)
    };
    assert!(
        !due(27_999).await,
        "neither the lease nor the deadline has passed"
    );
    assert!(due(28_000).await, "the lease ended before the deadline");
    // The sweeper ends it with a cancellation of its own reason.
    let pending = request_ok(ledger, &id, intent(EndReason::IdentityLeaseExpired, 28_000)).await;
    assert_eq!(
        pending.cancel.map(|c| c.reason),
        Some(EndReason::IdentityLeaseExpired)
    );
    assert!(
        !due(28_000).await,
        "a task whose cancellation is under way is not listed again"
    );

    end(ledger, &id).await;
    assert!(
        !renew(Some(40_000), Some(40_000)).await,
        "a finished task is not renewed"
    );
    assert!(!due(30_000).await);
    assert!(
        !ledger
            .renew_identity(&new_id(), Some(1), Some(1))
            .await
            .expect("unknown is a no-op")
    );
}

/// Retention removes tasks, terminal or not, with everything about them (their cancellation
/// intents; their hold on their upstream IDs), and voids dead reservations; `limit` bounds each
/// call.
pub async fn purge_expired(ledger: &dyn TaskLedger) {
    // Times far before NOW, so no other function's tasks are ever due.
    let owner = fresh_owner();
    let key = claim(30 * DAY);
    let task = |created_at: i64, ttl_ms: i64| Confirmation {
        ttl_ms,
        ..confirmation(created_at)
    };
    let mut r = reservation(&owner, UNLIMITED);
    r.idempotency = Some(key.clone());
    r.now = 50;
    let live = reserve_ok(ledger, r).await;
    let live_upstream = confirm(ledger, &live, task(100, 1_000)).await.upstream_id;
    request_ok(ledger, &live, intent(EndReason::Revocation, 150)).await;
    let done = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    let done_upstream = confirm(ledger, &done, task(200, 500)).await.upstream_id;
    let f = Finish {
        status: TaskStatus::Completed,
        status_message: None,
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: Some(json!({"secret": 1})),
            at: 300,
        },
    };
    assert!(matches!(
        ledger.finish(&done, f).await.expect("finish"),
        FinishOutcome::Applied(_)
    ));
    let kept = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    confirm(ledger, &kept, task(300, NOW)).await;
    let dead = Reservation {
        now: 100,
        reservation_expires_at: 1_500,
        ..reservation(&owner, UNLIMITED)
    };
    let dead = reserve_ok(ledger, dead).await;
    // Until then another owner cannot have their upstream tasks.
    let intruder = fresh_owner();
    let taken = |upstream_id: &str| Confirmation {
        upstream_id: upstream_id.into(),
        ..task(1_000, NOW)
    };
    for upstream_id in [&live_upstream, &done_upstream] {
        let id = reserve_ok(ledger, reservation(&intruder, UNLIMITED)).await;
        let outcome = ledger.confirm(&id, taken(upstream_id)).await;
        assert_eq!(outcome.expect("confirm"), Confirmed::HeldByAnotherOwner);
    }

    let first = ledger
        .purge_expired(1_099, usize::MAX)
        .await
        .expect("purge_expired")
        .into_iter()
        .map(|p| p.id)
        .collect::<Vec<_>>();
    assert!(
        first.contains(&done) && !first.contains(&live),
        "expires_at = created_at + ttl_ms"
    );
    let mut purged = first;
    loop {
        // Exactly at `live`'s expiry: retention ends at created_at + ttl_ms inclusive.
        let batch: Vec<_> = ledger
            .purge_expired(1_100, 1)
            .await
            .expect("purge_expired")
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert!(batch.len() <= 1);
        if batch.is_empty() {
            break;
        }
        purged.extend(batch);
    }
    for id in [&live, &done] {
        assert_eq!(purged.iter().filter(|p| *p == id).count(), 1, "purged once");
        assert_eq!(get(ledger, id).await, None);
        assert_eq!(
            ledger.note_result_read(id).await.expect("note_result_read"),
            0
        );
    }
    assert!(
        !purged.contains(&kept) && !purged.contains(&dead),
        "reservations are not tasks"
    );
    let pending = ledger
        .cancels_due(FAR, usize::MAX)
        .await
        .expect("cancels_due");
    assert!(
        !pending.iter().any(|p| p.record.id == live),
        "the intent went with its task"
    );
    for upstream_id in [&live_upstream, &done_upstream] {
        let id = reserve_ok(ledger, reservation(&intruder, UNLIMITED)).await;
        confirm(ledger, &id, taken(upstream_id)).await;
    }
    assert!(get(ledger, &kept).await.is_some());
    let late = ledger
        .purge_expired(2_000, usize::MAX)
        .await
        .expect("purge_expired");
    assert!(!late.iter().any(|p| p.id == kept || p.id == dead));
    let err = ledger.confirm(&dead, task(1_600, NOW)).await;
    assert!(matches!(err, Err(LedgerError::NoReservation)), "{err:?}");
    // The idempotency key went with its task.
    let again = Reservation {
        idempotency: Some(key),
        now: 2_000,
        ..reservation(&owner, UNLIMITED)
    };
    reserve_ok(ledger, again).await;
}

/// `active_for` lists a principal's confirmed non-terminal tasks, narrowed by tenant/client;
/// without a subject, every subject's of that issuer, tenant and/or client.
pub async fn active_for(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let (t1, t2) = (owner.tenant.clone(), unique("tenant-"));
    let (c1, c2) = (owner.client.clone(), unique("client-"));
    let with = |tenant: &str, client: &str| Owner {
        tenant: tenant.into(),
        client: client.into(),
        ..owner.clone()
    };
    let a = create(ledger, &with(&t1, &c1)).await.id;
    let b = create(ledger, &with(&t1, &c2)).await.id;
    let c = create(ledger, &with(&t2, &c1)).await.id;
    let ended = create(ledger, &with(&t1, &c1)).await.id;
    end(ledger, &ended).await;
    reserve_ok(ledger, reservation(&with(&t1, &c1), UNLIMITED)).await;
    let peer = create(
        ledger,
        &Owner {
            subject: unique("peer-"),
            ..owner.clone()
        },
    )
    .await
    .id;
    create(
        ledger,
        &Owner {
            issuer: unique("https://other.test/"),
            ..owner.clone()
        },
    )
    .await;

    let anyone = |tenant: Option<&str>, client: Option<&str>| PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: None,
        tenant: tenant.map(Into::into),
        client: client.map(Into::into),
    };
    let query = |tenant: Option<&str>, client: Option<&str>| PrincipalFilter {
        subject: Some(owner.subject.clone()),
        ..anyone(tenant, client)
    };
    let cases = [
        (query(None, None), vec![&a, &b, &c]),
        (query(Some(&t1), None), vec![&a, &b]),
        (query(None, Some(&c1)), vec![&a, &c]),
        (query(Some(&t1), Some(&c1)), vec![&a]),
        (query(Some(&t2), Some(&c2)), vec![]),
        (query(Some(""), None), vec![]),
        // A whole tenant, a client application, that application in that tenant.
        (anyone(Some(&t1), None), vec![&a, &b, &peer]),
        (anyone(None, Some(&c1)), vec![&a, &c, &peer]),
        (anyone(Some(&t1), Some(&c1)), vec![&a, &peer]),
        (anyone(Some(&t2), Some(&c2)), vec![]),
    ];
    for (filter, expected) in cases {
        let found = ledger.active_for(&filter).await.expect("active_for");
        let mut found = ids(&found);
        found.sort();
        let mut expected: Vec<TaskId> = expected.into_iter().cloned().collect();
        expected.sort();
        assert_eq!(found, expected, "{filter:?}");
    }
}

/// Secrets are created once, stable, distinct per name, and agreed on by concurrent callers.
pub async fn secret(ledger: &dyn TaskLedger) {
    let name = unique("audit-");
    let first = ledger.secret(&name).await.expect("secret");
    assert_ne!(first, [0u8; 32]);
    assert_eq!(ledger.secret(&name).await.expect("secret"), first);
    assert_ne!(
        ledger.secret(&unique("audit-")).await.expect("secret"),
        first
    );

    let raced = unique("idempotency-");
    let values = join_all((0..16).map(|_| ledger.secret(&raced))).await;
    let values: Vec<[u8; 32]> = values.into_iter().map(|v| v.expect("secret")).collect();
    assert!(
        values.iter().all(|v| *v == values[0]),
        "concurrent first uses agree"
    );
    assert_eq!(ledger.secret(&raced).await.expect("secret"), values[0]);
}

/// Counters start at 0, each advance returns the next value (1 first), names are independent,
/// and concurrent advances each get a distinct value.
pub async fn counters(ledger: &dyn TaskLedger) {
    let name = unique("generation-");
    let other = unique("generation-");
    assert_eq!(ledger.counter(&name).await.expect("counter"), 0);
    for expected in 1..=3 {
        assert_eq!(
            ledger.advance_counter(&name).await.expect("advance"),
            expected
        );
        assert_eq!(ledger.counter(&name).await.expect("counter"), expected);
    }
    assert_eq!(ledger.counter(&other).await.expect("counter"), 0);
    assert_eq!(ledger.advance_counter(&other).await.expect("advance"), 1);
    assert_eq!(ledger.counter(&name).await.expect("counter"), 3);

    let raced = unique("generation-");
    let values = join_all((0..16).map(|_| ledger.advance_counter(&raced))).await;
    let mut values: Vec<u64> = values.into_iter().map(|v| v.expect("advance")).collect();
    values.sort_unstable();
    assert_eq!(
        values,
        (1..=16).collect::<Vec<u64>>(),
        "one value per advance"
    );
    assert_eq!(ledger.counter(&raced).await.expect("counter"), 16);
}
