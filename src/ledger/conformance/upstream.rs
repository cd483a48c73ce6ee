//! One upstream task ID, one owner (and key): what `confirm` does with an upstream ID already
//! recorded.

use futures_util::future::join_all;

use super::{
    NOW, UNLIMITED, confirm, confirmation, end, fresh_owner, get, reservation, reserve_ok, unique,
};
use crate::ledger::{
    Confirmation, Confirmed, KeyBinding, LedgerError, Owner, QuotaLimits, Reservation, TaskLedger,
    TaskRecord, TaskStatus,
};

async fn confirm_any(ledger: &dyn TaskLedger, owner: &Owner, c: &Confirmation) -> Confirmed {
    confirm_reserved(ledger, reservation(owner, UNLIMITED), c).await
}

/// Reserves `r` and confirms it with `c`; when that made no task, checks that nothing was
/// recorded and the reservation is gone.
async fn confirm_reserved(ledger: &dyn TaskLedger, r: Reservation, c: &Confirmation) -> Confirmed {
    let id = reserve_ok(ledger, r).await;
    let outcome = ledger.confirm(&id, c.clone()).await.expect("confirm");
    if !matches!(outcome, Confirmed::New(_)) {
        assert_eq!(get(ledger, &id).await, None, "nothing recorded");
        let again = ledger.confirm(&id, confirmation(NOW)).await;
        assert!(
            matches!(again, Err(LedgerError::NoReservation)),
            "the reservation was released: {again:?}"
        );
    }
    outcome
}

/// A second confirmation of an upstream ID gets the existing task when the owner is the same
/// (issuer, subject, tenant and client, both unbound here) and nothing when any of them
/// differs; either way the reservation is released. Terminal tasks keep their upstream ID.
pub async fn upstream_one_owner(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let two = QuotaLimits {
        per_principal: 2,
        ..UNLIMITED
    };
    let c = confirmation(NOW);
    let first = reserve_ok(ledger, reservation(&owner, two)).await;
    let task = confirm(ledger, &first, c.clone()).await;

    // The server deduplicated the owner's own repeated call: the existing task, whatever the
    // second confirmation says.
    let again = reserve_ok(ledger, reservation(&owner, two)).await;
    let later = Confirmation {
        status: TaskStatus::InputRequired,
        created_at: NOW + 5,
        ..c.clone()
    };
    assert_eq!(
        ledger
            .confirm(&again, later.clone())
            .await
            .expect("confirm"),
        Confirmed::SameOwner(task.clone())
    );
    assert_eq!(get(ledger, &again).await, None);
    let err = ledger.confirm(&again, later).await;
    assert!(matches!(err, Err(LedgerError::NoReservation)), "{err:?}");
    // The released reservation freed its slot: one of two is held, by `task`.
    let third = reserve_ok(ledger, reservation(&owner, two)).await;
    ledger.release(&third).await.expect("release");

    // Differing in any one field makes another owner.
    let others = [
        Owner {
            issuer: unique("https://issuer.test/"),
            ..owner.clone()
        },
        Owner {
            subject: unique("user-"),
            ..owner.clone()
        },
        Owner {
            tenant: unique("tenant-"),
            ..owner.clone()
        },
        Owner {
            client: unique("client-"),
            ..owner.clone()
        },
        Owner {
            tenant: String::new(),
            client: String::new(),
            ..owner.clone()
        },
    ];
    for other in &others {
        assert_eq!(
            confirm_any(ledger, other, &c).await,
            Confirmed::HeldByAnotherOwner,
            "{other:?}"
        );
    }
    assert_eq!(get(ledger, &task.id).await, Some(task.clone()), "untouched");

    // Terminal or not, the task keeps its upstream ID.
    let ended = end(ledger, &task.id).await;
    assert_eq!(
        confirm_any(ledger, &others[0], &c).await,
        Confirmed::HeldByAnotherOwner
    );
    assert_eq!(
        confirm_any(ledger, &owner, &c).await,
        Confirmed::SameOwner(ended.clone())
    );
    assert_eq!(get(ledger, &task.id).await, Some(ended));

    // Other upstream IDs are unaffected.
    assert!(matches!(
        confirm_any(ledger, &others[1], &confirmation(NOW)).await,
        Confirmed::New(_)
    ));
}

/// An upstream ID held by a task bound to a key goes to the same owner only under that key: a
/// token of the owner bound to another key, to the same thumbprint as another kind of key, or
/// to none gets nothing. A task of an unbound token goes to unbound tokens of its owner only.
pub async fn upstream_one_owner_per_key(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let bound = |binding: Option<KeyBinding>| Reservation {
        binding,
        ..reservation(&owner, UNLIMITED)
    };
    let dpop = KeyBinding::Dpop {
        jkt: unique("jkt-"),
    };
    let others = [
        None,
        Some(KeyBinding::Dpop {
            jkt: unique("jkt-"),
        }),
        Some(KeyBinding::Mtls {
            x5t_s256: dpop.thumbprint().to_owned(),
        }),
    ];

    let c = confirmation(NOW);
    let id = reserve_ok(ledger, bound(Some(dpop.clone()))).await;
    let task = confirm(ledger, &id, c.clone()).await;
    for other in &others {
        assert_eq!(
            confirm_reserved(ledger, bound(other.clone()), &c).await,
            Confirmed::HeldByAnotherOwner,
            "{other:?}"
        );
    }
    assert_eq!(
        confirm_reserved(ledger, bound(Some(dpop.clone())), &c).await,
        Confirmed::SameOwner(task.clone())
    );
    assert_eq!(get(ledger, &task.id).await, Some(task), "untouched");

    let c = confirmation(NOW);
    let id = reserve_ok(ledger, bound(None)).await;
    let unbound = confirm(ledger, &id, c.clone()).await;
    assert_eq!(
        confirm_reserved(ledger, bound(Some(dpop)), &c).await,
        Confirmed::HeldByAnotherOwner
    );
    assert_eq!(
        confirm_reserved(ledger, bound(None), &c).await,
        Confirmed::SameOwner(unbound.clone())
    );
    assert_eq!(get(ledger, &unbound.id).await, Some(unbound), "untouched");
}

/// Concurrent confirmations of one upstream ID: exactly one becomes a task; the rest get it
/// (same owner) or nothing (other owners).
pub async fn upstream_race(ledger: &dyn TaskLedger) {
    // Two owners at a time, many rounds; then many owners with two reservations each.
    for _ in 0..10 {
        let c = confirmation(NOW);
        let (a, b) = (fresh_owner(), fresh_owner());
        let ra = reserve_ok(ledger, reservation(&a, UNLIMITED)).await;
        let rb = reserve_ok(ledger, reservation(&b, UNLIMITED)).await;
        let (oa, ob) = futures_util::join!(
            ledger.confirm(&ra, c.clone()),
            ledger.confirm(&rb, c.clone())
        );
        match (oa.expect("confirm"), ob.expect("confirm")) {
            (Confirmed::New(r), Confirmed::HeldByAnotherOwner) => {
                assert_eq!((r.id, r.owner), (ra, a));
                assert_eq!(get(ledger, &rb).await, None);
            }
            (Confirmed::HeldByAnotherOwner, Confirmed::New(r)) => {
                assert_eq!((r.id, r.owner), (rb, b));
                assert_eq!(get(ledger, &ra).await, None);
            }
            other => panic!("exactly one New, the other refused: {other:?}"),
        }
    }

    let c = confirmation(NOW);
    let owners: Vec<Owner> = (0..6).map(|_| fresh_owner()).collect();
    let mut attempts = Vec::new();
    for owner in &owners {
        for _ in 0..2 {
            let id = reserve_ok(ledger, reservation(owner, UNLIMITED)).await;
            attempts.push((owner.clone(), id));
        }
    }
    let outcomes = join_all(attempts.iter().map(|(_, id)| ledger.confirm(id, c.clone()))).await;
    let mut new: Vec<TaskRecord> = Vec::new();
    let mut same: Vec<(Owner, TaskRecord)> = Vec::new();
    let mut refused = 0;
    for ((owner, id), outcome) in attempts.iter().zip(outcomes) {
        match outcome.expect("confirm") {
            Confirmed::New(record) => {
                assert_eq!(record.id, *id);
                new.push(record);
            }
            Confirmed::SameOwner(record) => same.push((owner.clone(), record)),
            Confirmed::HeldByAnotherOwner => refused += 1,
        }
    }
    assert_eq!(new.len(), 1, "exactly one New");
    let winner = new.remove(0);
    assert_eq!(same, vec![(winner.owner.clone(), winner.clone())]);
    assert_eq!(refused, attempts.len() - 2);
    for (_, id) in &attempts {
        let expected = (*id == winner.id).then(|| winner.clone());
        assert_eq!(get(ledger, id).await, expected);
    }
}
