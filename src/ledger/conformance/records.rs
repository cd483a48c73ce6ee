//! Records, reservations and release.

use serde_json::json;

use super::{
    DAY, FAR, KEEP, MINUTE, NOW, UNLIMITED, confirm, confirmation, end, finishing, fresh_owner,
    get, ids, new_id, reservation, reserve, reserve_ok, unique,
};
use crate::ledger::{
    Confirmation, EndReason, Ending, Finish, FinishOutcome, KeyBinding, LedgerError, Owner,
    PrincipalFilter, QuotaLimits, QuotaScope, Reservation, ReserveOutcome, TaskId, TaskLedger,
    TaskRecord, TaskStatus,
};

/// Every field survives reserve → confirm → get → finish → get, including unusual values.
pub async fn round_trip(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let mut r = reservation(&owner, UNLIMITED);
    r.tool = "outils.générer 📄".into();
    r.scopes = vec!["b".into(), "a".into(), "a".into(), String::new()];
    let id = reserve_ok(ledger, r.clone()).await;
    let c = Confirmation {
        // Unusual characters, and unique: an upstream ID belongs to one task.
        upstream_id: unique("upstream/42 with spaces ✓ "),
        status: TaskStatus::InputRequired,
        status_message: Some("waiting for \"approval\"\n".into()),
        created_at: NOW,
        ttl_ms: KEEP,
        deadline_at: NOW + 7 * MINUTE,
        poll_interval_ms: Some(2_500),
    };
    let mut expected = TaskRecord {
        id: id.clone(),
        upstream_id: c.upstream_id.clone(),
        owner: owner.clone(),
        tool: r.tool.clone(),
        scopes: r.scopes.clone(),
        status: TaskStatus::InputRequired,
        status_message: c.status_message.clone(),
        created_at: NOW,
        last_updated_at: NOW,
        ttl_ms: KEEP,
        deadline_at: NOW + 7 * MINUTE,
        poll_interval_ms: Some(2_500),
        ended: None,
        result_reads: 0,
        token_issued_at: r.token_issued_at,
        home: ledger.scope().replica.clone(),
        correlation_id: r.correlation_id.clone(),
        object: r.object.clone(),
        lease_until: r.lease_until,
        delegated_until: r.delegated_until,
        cancel: None,
        trace: r.trace.clone(),
        binding: r.binding.clone(),
    };
    assert_eq!(confirm(ledger, &id, c).await, expected);
    assert_eq!(get(ledger, &id).await.as_ref(), Some(&expected));
    assert_eq!(expected.expires_at(), NOW + KEEP);

    let admin = fresh_owner();
    let ending = Ending {
        reason: EndReason::AdminCancel,
        by: Some(admin),
        payload: Some(json!({
            "content": [{"type": "text", "text": "done ✓"}],
            "isError": false,
            "numbers": [0, -1, 2.5, 9_007_199_254_740_993_u64, null],
            "nested": {"deep": {"empty": {}, "list": []}},
        })),
        at: NOW + 5,
    };
    let f = Finish {
        status: TaskStatus::Completed,
        status_message: Some("finished".into()),
        ending: ending.clone(),
    };
    expected.status = TaskStatus::Completed;
    expected.status_message = Some("finished".into());
    expected.last_updated_at = NOW + 5;
    expected.ended = Some(ending);
    let applied = ledger.finish(&id, f).await.expect("finish");
    assert_eq!(applied, FinishOutcome::Applied(Box::new(expected.clone())));
    assert_eq!(get(ledger, &id).await, Some(expected));

    // The minimal shape: no tenant, client, scopes, message, poll interval, ender or payload.
    let bare = Owner {
        tenant: String::new(),
        client: String::new(),
        ..fresh_owner()
    };
    let mut r = reservation(&bare, UNLIMITED);
    r.scopes = Vec::new();
    let id = reserve_ok(ledger, r).await;
    let c = Confirmation {
        poll_interval_ms: None,
        ..confirmation(NOW)
    };
    let record = confirm(ledger, &id, c.clone()).await;
    assert_eq!(record.owner, bare);
    assert!(record.scopes.is_empty());
    assert_eq!(
        (record.status_message, record.poll_interval_ms),
        (None, None)
    );
    let done = end(ledger, &id).await;
    let ending = done.ended.clone().expect("terminal task has an ending");
    assert_eq!(
        (ending.reason, ending.by, ending.payload),
        (EndReason::OwnerCancel, None, None)
    );
    assert_eq!(get(ledger, &id).await, Some(done));

    assert_eq!(get(ledger, &new_id()).await, None);
    assert_eq!(get(ledger, &TaskId::from_string("")).await, None);
}

/// The key a reservation's token was bound to (a DPoP key, a client certificate, or none)
/// comes back on the confirmed task, from `get`, from a listing and once the task ended.
pub async fn key_bindings(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let bindings = [
        Some(KeyBinding::Dpop {
            jkt: unique("jkt-"),
        }),
        Some(KeyBinding::Mtls {
            x5t_s256: unique("x5t-"),
        }),
        None,
    ];
    let mut tasks = Vec::new();
    for binding in &bindings {
        let r = Reservation {
            binding: binding.clone(),
            ..reservation(&owner, UNLIMITED)
        };
        let id = reserve_ok(ledger, r).await;
        let record = confirm(ledger, &id, confirmation(NOW)).await;
        assert_eq!(&record.binding, binding);
        assert_eq!(get(ledger, &id).await.as_ref(), Some(&record));
        tasks.push(record);
    }
    let filter = PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: Some(owner.subject.clone()),
        tenant: None,
        client: None,
    };
    let mut listed = ledger.active_for(&filter).await.expect("active_for");
    listed.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    tasks.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    assert_eq!(listed, tasks);
    for task in &tasks {
        assert_eq!(end(ledger, &task.id).await.binding, task.binding);
    }
}

/// A reservation is invisible to every read and to task updates until it is confirmed.
pub async fn reservations_are_invisible(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let id = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    assert_eq!(get(ledger, &id).await, None);
    let filter = PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: Some(owner.subject.clone()),
        tenant: None,
        client: None,
    };
    assert!(
        ledger
            .active_for(&filter)
            .await
            .expect("active_for")
            .is_empty()
    );
    let late = ledger
        .past_deadline(FAR, usize::MAX)
        .await
        .expect("past_deadline");
    assert!(!ids(&late).contains(&id));
    let f = finishing(TaskStatus::Failed, EndReason::Deadline, NOW);
    assert_eq!(
        ledger.finish(&id, f).await.expect("finish"),
        FinishOutcome::NotFound
    );
    ledger
        .observe(&id, TaskStatus::InputRequired, None, NOW)
        .await
        .expect("observe");
    assert_eq!(
        ledger
            .note_result_read(&id)
            .await
            .expect("note_result_read"),
        0
    );
    let terminal = Confirmation {
        status: TaskStatus::Completed,
        ..confirmation(NOW)
    };
    let err = ledger.confirm(&id, terminal).await;
    assert!(
        matches!(err, Err(LedgerError::InvalidArgument(_))),
        "{err:?}"
    );
    // Untouched by all that: it still confirms normally.
    let record = confirm(ledger, &id, confirmation(NOW)).await;
    assert_eq!(
        (record.status, record.result_reads),
        (TaskStatus::Working, 0)
    );
    assert_eq!(record.ended, None);
}

/// Release frees the slot, is idempotent, and never touches a confirmed task.
pub async fn release(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let one = QuotaLimits {
        per_principal: 1,
        ..UNLIMITED
    };
    let first = reserve_ok(ledger, reservation(&owner, one)).await;
    let over = reserve(ledger, reservation(&owner, one)).await;
    assert_eq!(over, ReserveOutcome::OverQuota(QuotaScope::Principal));
    ledger.release(&first).await.expect("release");
    ledger
        .release(&first)
        .await
        .expect("second release is a no-op");
    ledger
        .release(&new_id())
        .await
        .expect("release of an unknown id is a no-op");
    let second = reserve_ok(ledger, reservation(&owner, one)).await;
    let err = ledger.confirm(&first, confirmation(NOW)).await;
    assert!(matches!(err, Err(LedgerError::NoReservation)), "{err:?}");

    let record = confirm(ledger, &second, confirmation(NOW)).await;
    ledger
        .release(&second)
        .await
        .expect("release of a confirmed task is a no-op");
    assert_eq!(get(ledger, &second).await, Some(record));
    let err = ledger.confirm(&second, confirmation(NOW)).await;
    assert!(
        matches!(err, Err(LedgerError::NoReservation)),
        "confirmed twice: {err:?}"
    );
    let over = reserve(ledger, reservation(&owner, one)).await;
    assert_eq!(
        over,
        ReserveOutcome::OverQuota(QuotaScope::Principal),
        "task still holds slot"
    );
}

/// A reservation past its expiry holds no slot and can no longer be confirmed.
pub async fn reservations_expire(ledger: &dyn TaskLedger) {
    // Later than any other function's `now`, so no concurrent test voids it early.
    let expiry = NOW + 1_000 * DAY;
    let owner = fresh_owner();
    let one = QuotaLimits {
        per_principal: 1,
        ..UNLIMITED
    };
    let stale = Reservation {
        reservation_expires_at: expiry,
        ..reservation(&owner, one)
    };
    let stale_id = reserve_ok(ledger, stale).await;
    let early = Reservation {
        now: expiry - 1,
        ..reservation(&owner, one)
    };
    assert_eq!(
        reserve(ledger, early).await,
        ReserveOutcome::OverQuota(QuotaScope::Principal)
    );
    let on_time = Reservation {
        now: expiry,
        ..reservation(&owner, one)
    };
    reserve_ok(ledger, on_time).await;
    let err = ledger.confirm(&stale_id, confirmation(expiry)).await;
    assert!(matches!(err, Err(LedgerError::NoReservation)), "{err:?}");
}
