//! Admission: quotas and idempotency, decided at reservation.

use futures_util::future::join_all;

use super::{
    MINUTE, NOW, UNLIMITED, claim, confirm, confirmation, end, fresh_owner, get, new_id,
    reservation, reserve, reserve_ok, unique,
};
use crate::ledger::{
    IdempotencyClaim, Owner, QuotaLimits, QuotaScope, Reservation, ReserveOutcome, TaskId,
    TaskLedger, TaskStatus,
};

/// The principal quota counts reservations and non-terminal tasks; ending or releasing frees a
/// slot; other principals are unaffected.
pub async fn quota_principal(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let two = QuotaLimits {
        per_principal: 2,
        ..UNLIMITED
    };
    let over = ReserveOutcome::OverQuota(QuotaScope::Principal);
    let a = reserve_ok(ledger, reservation(&owner, two)).await;
    let b = reserve_ok(ledger, reservation(&owner, two)).await;
    assert_eq!(reserve(ledger, reservation(&owner, two)).await, over);
    confirm(ledger, &a, confirmation(NOW)).await;
    confirm(ledger, &b, confirmation(NOW)).await;
    assert_eq!(reserve(ledger, reservation(&owner, two)).await, over);
    ledger
        .observe(&b, TaskStatus::InputRequired, None, NOW + 1)
        .await
        .expect("observe");
    assert_eq!(
        reserve(ledger, reservation(&owner, two)).await,
        over,
        "input_required counts"
    );

    end(ledger, &a).await;
    let c = reserve_ok(ledger, reservation(&owner, two)).await;
    assert_eq!(reserve(ledger, reservation(&owner, two)).await, over);
    ledger.release(&c).await.expect("release");
    reserve_ok(ledger, reservation(&owner, two)).await;

    // Same tenant and client, other subject: its own quota.
    let peer = Owner {
        subject: unique("peer-"),
        ..owner.clone()
    };
    reserve_ok(ledger, reservation(&peer, two)).await;
}

/// The tenant quota counts every principal of the tenant (of one issuer).
pub async fn quota_tenant(ledger: &dyn TaskLedger) {
    let issuer = unique("https://issuer.test/");
    let tenant = unique("tenant-");
    let member = || Owner {
        issuer: issuer.clone(),
        tenant: tenant.clone(),
        ..fresh_owner()
    };
    let two = QuotaLimits {
        per_tenant: 2,
        ..UNLIMITED
    };
    let over = ReserveOutcome::OverQuota(QuotaScope::Tenant);
    reserve_ok(ledger, reservation(&member(), two)).await;
    let b = reserve_ok(ledger, reservation(&member(), two)).await;
    confirm(ledger, &b, confirmation(NOW)).await;
    assert_eq!(reserve(ledger, reservation(&member(), two)).await, over);
    end(ledger, &b).await;
    reserve_ok(ledger, reservation(&member(), two)).await;
    assert_eq!(reserve(ledger, reservation(&member(), two)).await, over);
    reserve_ok(ledger, reservation(&fresh_owner(), two)).await;
}

/// The client quota counts every principal using the client (of one issuer).
pub async fn quota_client(ledger: &dyn TaskLedger) {
    let issuer = unique("https://issuer.test/");
    let client = unique("client-");
    let user = || Owner {
        issuer: issuer.clone(),
        client: client.clone(),
        ..fresh_owner()
    };
    let two = QuotaLimits {
        per_client: 2,
        ..UNLIMITED
    };
    let over = ReserveOutcome::OverQuota(QuotaScope::Client);
    reserve_ok(ledger, reservation(&user(), two)).await;
    let b = reserve_ok(ledger, reservation(&user(), two)).await;
    confirm(ledger, &b, confirmation(NOW)).await;
    assert_eq!(reserve(ledger, reservation(&user(), two)).await, over);
    end(ledger, &b).await;
    reserve_ok(ledger, reservation(&user(), two)).await;
    assert_eq!(reserve(ledger, reservation(&user(), two)).await, over);
    reserve_ok(ledger, reservation(&fresh_owner(), two)).await;
}

/// Scopes are checked principal, tenant, client, server; a limit of 0 refuses everything.
pub async fn quota_order(ledger: &dyn TaskLedger) {
    let ones = QuotaLimits {
        per_principal: 1,
        per_tenant: 1,
        per_client: 1,
        per_server: u32::MAX,
    };
    let owner = fresh_owner();
    reserve_ok(ledger, reservation(&owner, ones)).await;
    let scope = |outcome| match outcome {
        ReserveOutcome::OverQuota(scope) => scope,
        other => panic!("expected OverQuota, got {other:?}"),
    };
    assert_eq!(
        scope(reserve(ledger, reservation(&owner, ones)).await),
        QuotaScope::Principal
    );
    let same_tenant = Owner {
        subject: unique("peer-"),
        ..owner.clone()
    };
    assert_eq!(
        scope(reserve(ledger, reservation(&same_tenant, ones)).await),
        QuotaScope::Tenant
    );
    let same_client = Owner {
        issuer: owner.issuer.clone(),
        client: owner.client.clone(),
        ..fresh_owner()
    };
    assert_eq!(
        scope(reserve(ledger, reservation(&same_client, ones)).await),
        QuotaScope::Client
    );
    let zero = QuotaLimits {
        per_server: 0,
        ..UNLIMITED
    };
    assert_eq!(
        scope(reserve(ledger, reservation(&fresh_owner(), zero)).await),
        QuotaScope::Server
    );
    let zero = QuotaLimits {
        per_principal: 0,
        per_server: 0,
        ..UNLIMITED
    };
    assert_eq!(
        scope(reserve(ledger, reservation(&fresh_owner(), zero)).await),
        QuotaScope::Principal
    );
}

/// Tenants are scoped by issuer: the same tenant name from two issuers is two tenants, each
/// with its own quota.
pub async fn quota_tenant_per_issuer(ledger: &dyn TaskLedger) {
    let tenant = unique("tenant-");
    let (first, second) = (
        unique("https://issuer.test/"),
        unique("https://issuer.test/"),
    );
    let member = |issuer: &str| Owner {
        issuer: issuer.into(),
        tenant: tenant.clone(),
        ..fresh_owner()
    };
    let one = QuotaLimits {
        per_tenant: 1,
        ..UNLIMITED
    };
    let over = ReserveOutcome::OverQuota(QuotaScope::Tenant);
    let a = reserve_ok(ledger, reservation(&member(&first), one)).await;
    confirm(ledger, &a, confirmation(NOW)).await;
    assert_eq!(
        reserve(ledger, reservation(&member(&first), one)).await,
        over
    );
    reserve_ok(ledger, reservation(&member(&second), one)).await;
    assert_eq!(
        reserve(ledger, reservation(&member(&second), one)).await,
        over
    );
    end(ledger, &a).await;
    reserve_ok(ledger, reservation(&member(&first), one)).await;
}

/// Clients are scoped by issuer: the same client ID from two issuers is two clients, each with
/// its own quota.
pub async fn quota_client_per_issuer(ledger: &dyn TaskLedger) {
    let client = unique("client-");
    let (first, second) = (
        unique("https://issuer.test/"),
        unique("https://issuer.test/"),
    );
    let user = |issuer: &str| Owner {
        issuer: issuer.into(),
        client: client.clone(),
        ..fresh_owner()
    };
    let one = QuotaLimits {
        per_client: 1,
        ..UNLIMITED
    };
    let over = ReserveOutcome::OverQuota(QuotaScope::Client);
    let a = reserve_ok(ledger, reservation(&user(&first), one)).await;
    confirm(ledger, &a, confirmation(NOW)).await;
    assert_eq!(reserve(ledger, reservation(&user(&first), one)).await, over);
    reserve_ok(ledger, reservation(&user(&second), one)).await;
    assert_eq!(
        reserve(ledger, reservation(&user(&second), one)).await,
        over
    );
    end(ledger, &a).await;
    reserve_ok(ledger, reservation(&user(&first), one)).await;
}

/// Owners without a tenant (client) claim share no tenant (client) quota.
pub async fn quota_without_tenant_or_client(ledger: &dyn TaskLedger) {
    let ones = QuotaLimits {
        per_tenant: 1,
        per_client: 1,
        ..UNLIMITED
    };
    // One issuer, so only the missing claims keep them apart.
    let issuer = unique("https://issuer.test/");
    for _ in 0..3 {
        let owner = Owner {
            issuer: issuer.clone(),
            tenant: String::new(),
            client: String::new(),
            ..fresh_owner()
        };
        reserve_ok(ledger, reservation(&owner, ones)).await;
    }
}

/// The server quota counts every active task. Needs a ledger no one else is using.
pub async fn quota_server(ledger: &dyn TaskLedger) {
    let three = QuotaLimits {
        per_server: 3,
        ..UNLIMITED
    };
    let over = ReserveOutcome::OverQuota(QuotaScope::Server);
    let a = reserve_ok(ledger, reservation(&fresh_owner(), three)).await;
    let b = reserve_ok(ledger, reservation(&fresh_owner(), three)).await;
    let c = reserve_ok(ledger, reservation(&fresh_owner(), three)).await;
    assert_eq!(
        reserve(ledger, reservation(&fresh_owner(), three)).await,
        over
    );
    confirm(ledger, &a, confirmation(NOW)).await;
    assert_eq!(
        reserve(ledger, reservation(&fresh_owner(), three)).await,
        over
    );
    end(ledger, &a).await;
    let d = reserve_ok(ledger, reservation(&fresh_owner(), three)).await;
    assert_eq!(
        reserve(ledger, reservation(&fresh_owner(), three)).await,
        over
    );
    for id in [&b, &c, &d] {
        ledger.release(id).await.expect("release");
    }
}

/// Concurrent reservations cannot overspend a quota.
pub async fn quota_race(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let five = QuotaLimits {
        per_principal: 5,
        ..UNLIMITED
    };
    let attempts = (0..50).map(|_| ledger.reserve(reservation(&owner, five)));
    let outcomes: Vec<_> = join_all(attempts)
        .await
        .into_iter()
        .map(|o| o.expect("reserve"))
        .collect();
    let reserved = outcomes
        .iter()
        .filter(|o| **o == ReserveOutcome::Reserved)
        .count();
    let over = ReserveOutcome::OverQuota(QuotaScope::Principal);
    let refused = outcomes.iter().filter(|o| **o == over).count();
    assert_eq!((reserved, refused), (5, 45), "{outcomes:?}");
}

// Idempotency

/// A key maps to its reservation (in flight) and then its task (existing), terminal or not;
/// other keys and key-less requests never collide; releasing frees the key.
pub async fn idempotency(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let key = claim(10 * MINUTE);
    let with_key = |key: &IdempotencyClaim| Reservation {
        idempotency: Some(key.clone()),
        ..reservation(&owner, UNLIMITED)
    };
    let a = reserve_ok(ledger, with_key(&key)).await;
    assert_eq!(
        reserve(ledger, with_key(&key)).await,
        ReserveOutcome::InFlight(a.clone())
    );
    reserve_ok(ledger, with_key(&claim(10 * MINUTE))).await;
    reserve_ok(ledger, reservation(&owner, UNLIMITED)).await;

    let record = confirm(ledger, &a, confirmation(NOW)).await;
    let existing = ReserveOutcome::Existing(Box::new(record));
    assert_eq!(reserve(ledger, with_key(&key)).await, existing);
    let ended = end(ledger, &a).await;
    assert_eq!(
        reserve(ledger, with_key(&key)).await,
        ReserveOutcome::Existing(Box::new(ended))
    );
    // Existing/InFlight outcomes reserve nothing.
    let one = QuotaLimits {
        per_principal: 1,
        ..UNLIMITED
    };
    let solo = fresh_owner();
    let mut first = reservation(&solo, one);
    first.idempotency = Some(claim(10 * MINUTE));
    let again = Reservation {
        id: new_id(),
        ..first.clone()
    };
    let first_id = reserve_ok(ledger, first).await;
    assert_eq!(
        reserve(ledger, again).await,
        ReserveOutcome::InFlight(first_id.clone())
    );
    ledger.release(&first_id).await.expect("release");
    reserve_ok(ledger, reservation(&solo, one)).await;

    // A released reservation takes its key with it.
    let released_key = claim(10 * MINUTE);
    let b = reserve_ok(ledger, with_key(&released_key)).await;
    ledger.release(&b).await.expect("release");
    reserve_ok(ledger, with_key(&released_key)).await;
}

/// The window runs from confirmation (never shorter than from reservation); once it has
/// passed, the key starts a new task, also when its reservation is still in flight.
pub async fn idempotency_window(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let at = |now: i64, key: &IdempotencyClaim| Reservation {
        now,
        idempotency: Some(key.clone()),
        ..reservation(&owner, UNLIMITED)
    };
    let window = 10 * MINUTE;
    let key = claim(window);
    let a = reserve_ok(ledger, at(NOW, &key)).await;
    // Confirmed 5 minutes after the reservation: the window ends at confirmation + window.
    let created = NOW + 5 * MINUTE;
    let record = confirm(ledger, &a, confirmation(created)).await;
    let existing = ReserveOutcome::Existing(Box::new(record));
    assert_eq!(reserve(ledger, at(NOW + window, &key)).await, existing);
    assert_eq!(
        reserve(ledger, at(created + window - 1, &key)).await,
        existing
    );
    let b = reserve_ok(ledger, at(created + window, &key)).await;
    assert_eq!(
        reserve(ledger, at(created + window + 1, &key)).await,
        ReserveOutcome::InFlight(b.clone())
    );
    // The old task itself is untouched.
    assert_eq!(get(ledger, &a).await.map(|r| r.id), Some(a));

    // A reservation whose window lapsed before confirmation no longer holds the key.
    let short = claim(MINUTE);
    let c = reserve_ok(ledger, at(NOW, &short)).await;
    assert_eq!(
        reserve(ledger, at(NOW + MINUTE - 1, &short)).await,
        ReserveOutcome::InFlight(c.clone())
    );
    let d = reserve_ok(ledger, at(NOW + MINUTE, &short)).await;
    confirm(ledger, &c, confirmation(NOW + MINUTE)).await;
    assert_eq!(
        reserve(ledger, at(NOW + MINUTE, &short)).await,
        ReserveOutcome::InFlight(d)
    );
}

/// Concurrent requests with one key create one task.
pub async fn idempotency_race(ledger: &dyn TaskLedger) {
    let owner = fresh_owner();
    let key = claim(10 * MINUTE);
    let attempt = || Reservation {
        idempotency: Some(key.clone()),
        ..reservation(&owner, UNLIMITED)
    };
    let attempts: Vec<Reservation> = (0..20).map(|_| attempt()).collect();
    let ids_tried: Vec<TaskId> = attempts.iter().map(|r| r.id.clone()).collect();
    let outcomes: Vec<_> = join_all(attempts.into_iter().map(|r| ledger.reserve(r)))
        .await
        .into_iter()
        .map(|o| o.expect("reserve"))
        .collect();
    let winners: Vec<&TaskId> = ids_tried
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| **o == ReserveOutcome::Reserved)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    let winner = winners[0].clone();
    for outcome in &outcomes {
        assert!(
            *outcome == ReserveOutcome::Reserved
                || *outcome == ReserveOutcome::InFlight(winner.clone()),
            "{outcome:?}"
        );
    }
    let record = confirm(ledger, &winner, confirmation(NOW)).await;
    let again = join_all((0..20).map(|_| ledger.reserve(attempt()))).await;
    for outcome in again {
        assert_eq!(
            outcome.expect("reserve"),
            ReserveOutcome::Existing(Box::new(record.clone()))
        );
    }
}
