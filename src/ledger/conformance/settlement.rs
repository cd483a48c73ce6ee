//! Waiting for a reservation to settle ([`TaskLedger::wait_settled`]).
//!
//! A waiter that is still pending is polled once by hand: a correct ledger can never have
//! finished it while its reservation is pending, so `Pending` is the only valid answer, and the
//! poll gives the ledger the chance to register the waiter before the settlement happens.

use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::poll;

use super::{
    DAY, NOW, UNLIMITED, confirm, confirmation, create, end, fresh_owner, get, new_id, reservation,
    reserve_ok,
};
use crate::ledger::{LedgerError, Reservation, Result, TaskId, TaskLedger};

/// Guard against a waiter that never returns, so a broken backend fails instead of hanging.
/// Nothing here depends on how long anything takes.
const HANG: Duration = Duration::from_secs(120);

/// Awaits a wait to completion; panics if it fails or never returns.
async fn returns(what: &str, wait: impl Future<Output = Result<()>>) {
    match tokio::time::timeout(HANG, wait).await {
        Ok(result) => result.unwrap_or_else(|e| panic!("{what}: wait_settled failed: {e}")),
        Err(_) => panic!("{what}: wait_settled never returned"),
    }
}

/// Finishes a wait that was polled once before (`early`): it may already have returned.
async fn finish(what: &str, early: Poll<Result<()>>, waiter: impl Future<Output = Result<()>>) {
    match early {
        Poll::Ready(result) => {
            result.unwrap_or_else(|e| panic!("{what}: wait_settled failed: {e}"));
        }
        Poll::Pending => returns(what, waiter).await,
    }
}

/// Waiting on anything that is not a pending reservation returns at once: an ID never
/// reserved, a confirmed task, a released reservation, a finished task.
pub async fn settle_not_pending(ledger: &dyn TaskLedger) {
    returns("unknown id", ledger.wait_settled(&new_id())).await;
    returns("empty id", ledger.wait_settled(&TaskId::from_string(""))).await;
    let owner = fresh_owner();
    let task = create(ledger, &owner).await;
    returns("confirmed task", ledger.wait_settled(&task.id)).await;
    let released = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    ledger.release(&released).await.expect("release");
    returns("released reservation", ledger.wait_settled(&released)).await;
    end(ledger, &task.id).await;
    returns("finished task", ledger.wait_settled(&task.id)).await;
}

/// A waiter keeps waiting while its reservation is pending, also when other reservations
/// settle, and returns once its own is confirmed.
pub async fn settle_on_confirm(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let id = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    let other = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    let mut waiter = ledger.wait_settled(&id);
    assert!(poll!(&mut waiter).is_pending(), "returned while pending");
    confirm(ledger, &other, confirmation(NOW)).await;
    assert!(
        poll!(&mut waiter).is_pending(),
        "returned when another reservation settled"
    );
    let record = confirm(ledger, &id, confirmation(NOW)).await;
    returns("confirmed", waiter).await;
    assert_eq!(get(ledger, &id).await, Some(record));
}

/// A waiter returns once its reservation is released.
pub async fn settle_on_release(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let id = reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;
    let mut waiter = ledger.wait_settled(&id);
    assert!(poll!(&mut waiter).is_pending(), "returned while pending");
    ledger.release(&id).await.expect("release");
    returns("released", waiter).await;
    let err = ledger.confirm(&id, confirmation(NOW)).await;
    assert!(matches!(err, Err(LedgerError::NoReservation)), "{err:?}");
}

/// A reservation voided by expiry wakes its waiter once a sweep removes it: `purge_expired`'s,
/// or the one every `reserve` does first.
pub async fn settle_on_sweep(ledger: &dyn TaskLedger) {
    // Expires before `reservations_expire`'s stale reservation (the other live ones expire at
    // FAR), so these sweeps void no other function's live reservation; `limit` 0 purges no
    // task. A concurrent function's own sweep may void it first, which settles it just the same.
    let expiry = NOW + 500 * DAY;
    let owner = fresh_owner();
    let expiring = || Reservation {
        reservation_expires_at: expiry,
        ..reservation(&owner, UNLIMITED)
    };

    let id = reserve_ok(ledger, expiring()).await;
    let mut waiter = ledger.wait_settled(&id);
    let early = poll!(&mut waiter);
    let purged = ledger
        .purge_expired(expiry, 0)
        .await
        .expect("purge_expired");
    assert!(purged.is_empty(), "limit 0 purges no task");
    finish("voided by purge_expired", early, waiter).await;
    let err = ledger.confirm(&id, confirmation(NOW)).await;
    assert!(matches!(err, Err(LedgerError::NoReservation)), "{err:?}");

    let id = reserve_ok(ledger, expiring()).await;
    let mut waiter = ledger.wait_settled(&id);
    let early = poll!(&mut waiter);
    let later = Reservation {
        now: expiry,
        ..reservation(&owner, UNLIMITED)
    };
    reserve_ok(ledger, later).await;
    finish("voided by reserve", early, waiter).await;
    let err = ledger.confirm(&id, confirmation(NOW)).await;
    assert!(matches!(err, Err(LedgerError::NoReservation)), "{err:?}");
}

/// Many waiters, several on each reservation, all return once theirs settles.
pub async fn settle_many_waiters(ledger: &dyn TaskLedger) {
    const RESERVATIONS: usize = 4;
    const WAITERS_EACH: usize = 16;
    let owner = fresh_owner();
    let mut ids = Vec::with_capacity(RESERVATIONS);
    for _ in 0..RESERVATIONS {
        ids.push(reserve_ok(ledger, reservation(&owner, UNLIMITED)).await);
    }
    let mut waiters: Vec<_> = ids
        .iter()
        .flat_map(|id| (0..WAITERS_EACH).map(move |_| ledger.wait_settled(id)))
        .collect();
    for waiter in &mut waiters {
        assert!(poll!(waiter).is_pending(), "returned while pending");
    }
    // Half confirmed, half released, all at once.
    let settle = ids.iter().enumerate().map(|(i, id)| async move {
        if i % 2 == 0 {
            confirm(ledger, id, confirmation(NOW)).await;
        } else {
            ledger.release(id).await.expect("release");
        }
    });
    join_all(settle).await;
    returns("all settled", async {
        join_all(waiters).await.into_iter().collect::<Result<()>>()
    })
    .await;
}
