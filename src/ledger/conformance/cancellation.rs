//! The cancellation outbox: an intent recorded before the server is asked, pending until
//! `finish`.

use futures_util::future::join_all;

use super::{
    MINUTE, NOW, UNLIMITED, confirm, confirmation, create, end, fresh_owner, get, new_id,
    reservation, reserve, reserve_ok,
};
use crate::ledger::{
    CancelIntent, CancelRequest, Confirmation, EndReason, Ending, Finish, FinishOutcome,
    LedgerError, PendingCancel, PrincipalFilter, QuotaLimits, QuotaScope, ReserveOutcome, TaskId,
    TaskLedger, TaskRecord, TaskStatus,
};

/// An intent for `reason` requested at `at`, giving up five minutes later.
pub fn intent(reason: EndReason, at: i64) -> CancelIntent {
    CancelIntent {
        reason,
        by: None,
        pending_message: "Cancellation requested; waiting for the server to stop".into(),
        requested_at: at,
        give_up_at: at + 5 * MINUTE,
        trace: Some(format!("00-{:032x}-{:016x}-01", at, reason as u64 + 1)),
    }
}

async fn request(ledger: &dyn TaskLedger, id: &TaskId, i: CancelIntent) -> CancelRequest {
    ledger.request_cancel(id, i).await.expect("request_cancel")
}

/// Requests a cancellation that must be recorded; returns the task as it is now.
pub async fn request_ok(ledger: &dyn TaskLedger, id: &TaskId, i: CancelIntent) -> TaskRecord {
    match request(ledger, id, i).await {
        CancelRequest::Recorded(record) => *record,
        other => panic!("request_cancel of a live task without an intent: {other:?}"),
    }
}

async fn due(ledger: &dyn TaskLedger, now: i64) -> Vec<PendingCancel> {
    ledger
        .cancels_due(now, usize::MAX)
        .await
        .expect("cancels_due")
}

/// An intent is stored once (first wins) on live tasks only, sets the pending message, keeps
/// the status; observations cannot replace the message; `finish` ends task and intent together.
pub async fn cancel_request(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let task = create(ledger, &owner).await;
    let first = CancelIntent {
        by: Some(owner.clone()),
        pending_message: "Cancellation requested by the owner…".into(),
        ..intent(EndReason::OwnerCancel, NOW + 10)
    };
    let mut expected = TaskRecord {
        status_message: Some(first.pending_message.clone()),
        last_updated_at: NOW + 10,
        cancel: Some(first.clone()),
        ..task.clone()
    };
    assert_eq!(
        request_ok(ledger, &task.id, first.clone()).await,
        expected,
        "status unchanged, message and time set, intent stored"
    );
    assert_eq!(get(ledger, &task.id).await.as_ref(), Some(&expected));

    // The first intent wins.
    let second = CancelIntent {
        by: Some(fresh_owner()),
        pending_message: "Cancelled by an administrator".into(),
        ..intent(EndReason::AdminCancel, NOW + 20)
    };
    assert_eq!(
        request(ledger, &task.id, second).await,
        CancelRequest::AlreadyRequested(Box::new(expected.clone()))
    );
    assert_eq!(get(ledger, &task.id).await.as_ref(), Some(&expected));

    // The server's reports update the status, not the message.
    for (status, message, at) in [
        (
            TaskStatus::InputRequired,
            Some("need input".to_string()),
            NOW + 30,
        ),
        (TaskStatus::Working, None, NOW + 31),
    ] {
        ledger
            .observe(&task.id, status, message, at)
            .await
            .expect("observe");
        expected.status = status;
        expected.last_updated_at = at;
        assert_eq!(get(ledger, &task.id).await.as_ref(), Some(&expected));
    }

    // Still active, intent and all.
    let filter = PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: Some(owner.subject.clone()),
        tenant: None,
        client: None,
    };
    let active = ledger.active_for(&filter).await.expect("active_for");
    assert_eq!(active, vec![expected.clone()]);

    // `finish` ends the intent with the task.
    let f = Finish {
        status: TaskStatus::Cancelled,
        status_message: Some("Cancelled by the owner".into()),
        ending: Ending {
            reason: EndReason::OwnerCancel,
            by: Some(owner.clone()),
            payload: None,
            at: NOW + 40,
        },
    };
    let done = match ledger.finish(&task.id, f).await.expect("finish") {
        FinishOutcome::Applied(record) => *record,
        other => panic!("{other:?}"),
    };
    assert_eq!(done.cancel, None);
    assert_eq!(
        (done.status, done.status_message.as_deref()),
        (TaskStatus::Cancelled, Some("Cancelled by the owner"))
    );
    assert_eq!(get(ledger, &task.id).await.as_ref(), Some(&done));
    assert!(
        !due(ledger, i64::MAX)
            .await
            .iter()
            .any(|p| p.record.id == task.id)
    );

    // Terminal tasks take no intent, and attempts at a missing intent change nothing.
    assert_eq!(
        request(ledger, &task.id, first.clone()).await,
        CancelRequest::AlreadyTerminal(Box::new(done.clone()))
    );
    ledger
        .note_cancel_attempt(&task.id, NOW + 50)
        .await
        .expect("note_cancel_attempt");
    assert_eq!(get(ledger, &task.id).await, Some(done));

    // Unknown IDs and reservations are not found.
    assert_eq!(
        request(ledger, &new_id(), first.clone()).await,
        CancelRequest::NotFound
    );
    ledger
        .note_cancel_attempt(&new_id(), NOW)
        .await
        .expect("note_cancel_attempt of an unknown task");
    let reserved = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    assert_eq!(
        request(ledger, &reserved, first.clone()).await,
        CancelRequest::NotFound
    );
    let record = confirm(ledger, &reserved, confirmation(NOW)).await;
    assert_eq!(
        record.cancel, None,
        "the reservation confirms without an intent"
    );

    // Malformed intents are refused and store nothing.
    let malformed = [
        intent(EndReason::Upstream, NOW),
        intent(EndReason::UpstreamLost, NOW),
        CancelIntent {
            give_up_at: NOW - 1,
            ..intent(EndReason::Deadline, NOW)
        },
    ];
    for bad in malformed {
        let err = ledger.request_cancel(&record.id, bad).await;
        assert!(
            matches!(err, Err(LedgerError::InvalidArgument(_))),
            "{err:?}"
        );
    }
    assert_eq!(get(ledger, &record.id).await.as_ref(), Some(&record));

    // Every cancellation reason is accepted; an intent may give up at once.
    for reason in [
        EndReason::AdminCancel,
        EndReason::Deadline,
        EndReason::Revocation,
    ] {
        let t = create(ledger, &owner).await;
        let i = CancelIntent {
            give_up_at: NOW,
            ..intent(reason, NOW)
        };
        assert_eq!(request_ok(ledger, &t.id, i.clone()).await.cancel, Some(i));
        end(ledger, &t.id).await;
    }
    end(ledger, &record.id).await;
}

/// Of many concurrent requests for one task exactly one is recorded; the others see it.
pub async fn cancel_race(ledger: &dyn TaskLedger) {
    let task = create(ledger, &fresh_owner()).await;
    let intents = (0..20).map(|i| CancelIntent {
        pending_message: format!("request {i}"),
        ..intent(EndReason::Revocation, NOW + i)
    });
    let outcomes = join_all(intents.map(|i| ledger.request_cancel(&task.id, i))).await;
    let mut recorded = Vec::new();
    let mut already = Vec::new();
    for outcome in outcomes {
        match outcome.expect("request_cancel") {
            CancelRequest::Recorded(r) => recorded.push(*r),
            CancelRequest::AlreadyRequested(r) => already.push(*r),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(recorded.len(), 1, "exactly one intent is recorded");
    let winner = recorded.remove(0);
    let stored = winner.cancel.clone().expect("the winner's intent");
    assert_eq!(
        winner.status_message.as_ref(),
        Some(&stored.pending_message)
    );
    for seen in already {
        assert_eq!(seen, winner);
    }
    assert_eq!(get(ledger, &task.id).await, Some(winner));
    end(ledger, &task.id).await;
}

/// `cancels_due` lists intents whose next attempt is due, longest overdue first, with their
/// tasks; `note_cancel_attempt` counts and reschedules.
pub async fn cancels_due(ledger: &dyn TaskLedger) {
    // Times far before NOW, so that no other function's intents but those it leaves for a
    // moment (`purge_expired`, `past_deadline`) are due at these `now`s; only this function's
    // are asserted on.
    let owner = fresh_owner();
    let mut tasks = Vec::new();
    for requested_at in [3_000, 1_000, 2_000] {
        let id = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
        let c = Confirmation {
            ttl_ms: NOW,
            ..confirmation(500)
        };
        confirm(ledger, &id, c).await;
        let i = intent(EndReason::Deadline, requested_at);
        tasks.push(request_ok(ledger, &id, i).await);
    }
    let plain = create(ledger, &owner).await;
    let (a, b, c) = (&tasks[0].id, &tasks[1].id, &tasks[2].id);

    // Mine, in order, as (id, attempts, next_attempt_at); checks every listed entry.
    let mine = |listed: Vec<PendingCancel>, now: i64| -> Vec<(TaskId, u32, i64)> {
        assert!(
            listed
                .windows(2)
                .all(|w| w[0].next_attempt_at <= w[1].next_attempt_at),
            "ordered by next attempt"
        );
        for p in &listed {
            assert!(p.next_attempt_at <= now);
            assert!(p.record.ended.is_none());
            assert_eq!(p.record.cancel.as_ref(), Some(&p.intent));
        }
        listed
            .into_iter()
            .filter(|p| p.record.owner == owner)
            .map(|p| (p.record.id, p.attempts, p.next_attempt_at))
            .collect()
    };

    let listed = due(ledger, 2_500).await;
    for p in listed.iter().filter(|p| p.record.owner == owner) {
        let task = tasks.iter().find(|t| t.id == p.record.id).expect("mine");
        assert_eq!(&p.record, task);
        assert_eq!(Some(&p.intent), task.cancel.as_ref());
    }
    assert_eq!(
        mine(listed, 2_500),
        vec![(b.clone(), 0, 1_000), (c.clone(), 0, 2_000)],
        "the first attempt is due at requested_at"
    );

    ledger
        .note_cancel_attempt(b, 5_000)
        .await
        .expect("note_cancel_attempt");
    assert_eq!(
        mine(due(ledger, 2_500).await, 2_500),
        vec![(c.clone(), 0, 2_000)]
    );
    assert_eq!(
        mine(due(ledger, 5_000).await, 5_000),
        vec![
            (c.clone(), 0, 2_000),
            (a.clone(), 0, 3_000),
            (b.clone(), 1, 5_000)
        ]
    );
    // Ties go to the older request.
    ledger
        .note_cancel_attempt(b, 3_000)
        .await
        .expect("note_cancel_attempt");
    ledger
        .note_cancel_attempt(c, 3_000)
        .await
        .expect("note_cancel_attempt");
    assert_eq!(
        mine(due(ledger, 3_000).await, 3_000),
        vec![
            (b.clone(), 2, 3_000),
            (c.clone(), 1, 3_000),
            (a.clone(), 0, 3_000)
        ]
    );
    // Attempts do not touch the task.
    assert_eq!(get(ledger, b).await.as_ref(), Some(&tasks[1]));

    let limited = ledger.cancels_due(5_000, 1).await.expect("cancels_due");
    assert!(limited.len() <= 1);
    assert!(
        ledger
            .cancels_due(5_000, 0)
            .await
            .expect("cancels_due")
            .is_empty()
    );

    // Finished tasks leave the outbox; tasks never cancelled were never in it.
    for task in &tasks {
        end(ledger, &task.id).await;
    }
    assert!(mine(due(ledger, i64::MAX).await, i64::MAX).is_empty());
    end(ledger, &plain.id).await;
}

/// A task with a pending intent keeps its quota slot until `finish`.
pub async fn cancel_holds_quota(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let one = QuotaLimits {
        per_principal: 1,
        ..UNLIMITED
    };
    let over = ReserveOutcome::OverQuota(QuotaScope::Principal);
    let id = reserve_ok(ledger, reservation(&owner, one)).await;
    confirm(ledger, &id, confirmation(NOW)).await;
    request_ok(ledger, &id, intent(EndReason::OwnerCancel, NOW + 1)).await;
    assert_eq!(reserve(ledger, reservation(&owner, one)).await, over);
    ledger
        .observe(&id, TaskStatus::Working, None, NOW + 2)
        .await
        .expect("observe");
    ledger
        .note_cancel_attempt(&id, NOW + MINUTE)
        .await
        .expect("note_cancel_attempt");
    assert_eq!(
        reserve(ledger, reservation(&owner, one)).await,
        over,
        "still held while the cancellation is pending"
    );
    end(ledger, &id).await;
    reserve_ok(ledger, reservation(&owner, one)).await;
}
