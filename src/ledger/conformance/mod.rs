//! Backend-independent conformance suite for [`TaskLedger`] implementations.
//!
//! Every function drives a ledger through the trait only and panics on the first violation. A
//! backend gets the whole suite as tests by invoking [`ledger_conformance_tests!`] once with a
//! factory for fresh instances. Compiled for the crate's unit tests only (backends live in this
//! crate), so none of it ships in the binary.
//!
//! Sharing one database between tests (e.g. one PostgreSQL schema for a whole test run) is
//! supported with one exception: every function makes its own random principals, tenants,
//! clients, idempotency keys and secret names, and only asserts on rows it created. Functions
//! that use `now` values off the common [`NOW`] keep those rows out of each other's way:
//! reservations meant to stay alive expire at [`FAR`], and tasks meant to stay are retained past
//! any `now` the suite passes to `purge_expired`. The exceptions are [`quota_server`], which
//! counts every active task, and [`budgets_purged`], which purges at times other functions'
//! tasks live in: both need a ledger nobody else is using. [`run_shared`] runs the
//! rest concurrently on one ledger to prove the point. Functions leave their rows behind
//! (including reservations alive until [`FAR`]), so a shared database only grows.

/// Expands to one `#[tokio::test(flavor = "multi_thread")]` per conformance function, each on
/// a fresh ledger, plus `run_all` (the whole suite in order on one fresh ledger) and
/// `run_shared` (the shareable part, interleaved, twice over on one ledger).
///
/// The argument is a factory called once per test: an async closure (or anything callable with
/// no arguments that returns a future) resolving to `(guard, ledger)`, where `ledger` is a
/// concrete [`TaskLedger`] and `guard` is anything that must outlive it (a temporary directory,
/// a database schema to drop). Invoke it once in the backend's test module:
///
/// ```ignore
/// crate::ledger::conformance::ledger_conformance_tests!(async || {
///     let dir = tempfile::tempdir().expect("temp dir");
///     let ledger = SqliteLedger::open(&dir.path().join("ledger.db")).expect("open ledger");
///     (dir, ledger)
/// });
/// ```
///
/// The generated tests are named after the functions, so the invoking module must not define
/// items of those names.
macro_rules! ledger_conformance_tests {
    ($fresh:expr $(,)?) => {
        $crate::ledger::conformance::ledger_conformance_tests!(
            @each $fresh;
            round_trip,
            key_bindings,
            reservations_are_invisible,
            release,
            reservations_expire,
            quota_principal,
            quota_tenant,
            quota_client,
            quota_order,
            quota_tenant_per_issuer,
            quota_client_per_issuer,
            quota_without_tenant_or_client,
            quota_server,
            quota_race,
            idempotency,
            idempotency_window,
            idempotency_race,
            upstream_one_owner,
            upstream_one_owner_per_key,
            upstream_race,
            finish_cas,
            finish_race,
            observe,
            result_reads,
            forget_payload,
            past_deadline,
            identity_renewal,
            purge_expired,
            active_for,
            secret,
            counters,
            settle_not_pending,
            settle_on_confirm,
            settle_on_release,
            settle_on_sweep,
            settle_many_waiters,
            cancel_request,
            cancel_race,
            cancels_due,
            cancel_holds_quota,
            replicas_and_orphans,
            cancels_due_per_home,
            leases,
            budgets,
            budgets_by_grant,
            budget_costs,
            budget_race,
            budgets_purged,
            run_all,
        );

        /// The suite's claim that it can share a database: all of it at once, twice over.
        #[tokio::test(flavor = "multi_thread")]
        async fn run_shared() {
            let (_guard, ledger) = ($fresh)().await;
            $crate::ledger::conformance::run_shared(&ledger).await;
            $crate::ledger::conformance::run_shared(&ledger).await;
        }
    };
    (@each $fresh:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            let (_guard, ledger) = ($fresh)().await;
            $crate::ledger::conformance::$name(&ledger).await;
        }
    )*};
}

pub(crate) use ledger_conformance_tests;

use futures_util::FutureExt;
use futures_util::future::{LocalBoxFuture, join_all};

mod admission;
pub mod cancellation;
mod lifecycle;
mod records;
mod replicas;
mod settlement;
mod upstream;

pub use admission::{
    idempotency, idempotency_race, idempotency_window, quota_client, quota_client_per_issuer,
    quota_order, quota_principal, quota_race, quota_server, quota_tenant, quota_tenant_per_issuer,
    quota_without_tenant_or_client,
};
pub use cancellation::{cancel_holds_quota, cancel_race, cancel_request, cancels_due};
pub use lifecycle::{
    active_for, counters, finish_cas, finish_race, forget_payload, identity_renewal, observe,
    past_deadline, purge_expired, result_reads, secret,
};
pub use records::{
    key_bindings, release, reservations_are_invisible, reservations_expire, round_trip,
};
pub use replicas::{
    budget_costs, budget_race, budgets, budgets_by_grant, budgets_purged, cancels_due_per_home,
    leases, replicas_and_orphans,
};
pub use settlement::{
    settle_many_waiters, settle_not_pending, settle_on_confirm, settle_on_release, settle_on_sweep,
};
pub use upstream::{upstream_one_owner, upstream_one_owner_per_key, upstream_race};

use super::{
    Confirmation, Confirmed, EndReason, Ending, Finish, FinishOutcome, IdempotencyClaim, Owner,
    QuotaLimits, Reservation, ReserveOutcome, TaskId, TaskLedger, TaskRecord, TaskStatus,
};

/// The suite's usual "now" (2030).
pub const NOW: i64 = 1_900_000_000_000;
/// Expiry of reservations that must stay alive: later than any `now` the suite uses.
pub const FAR: i64 = NOW * 4;
const MINUTE: i64 = 60_000;
const DAY: i64 = 86_400_000;
/// Retention long enough that no `purge_expired` call in the suite removes the task.
const KEEP: i64 = 365 * DAY;

/// Limits that never bind.
pub const UNLIMITED: QuotaLimits = QuotaLimits {
    per_principal: u32::MAX,
    per_tenant: u32::MAX,
    per_client: u32::MAX,
    per_server: u32::MAX,
};

/// Runs every function of the suite. [`quota_server`] goes first because it needs a ledger
/// without active tasks, so `ledger` must be fresh.
pub async fn run_all(ledger: &dyn TaskLedger) {
    quota_server(ledger).await;
    round_trip(ledger).await;
    key_bindings(ledger).await;
    reservations_are_invisible(ledger).await;
    release(ledger).await;
    reservations_expire(ledger).await;
    quota_principal(ledger).await;
    quota_tenant(ledger).await;
    quota_client(ledger).await;
    quota_tenant_per_issuer(ledger).await;
    quota_client_per_issuer(ledger).await;
    quota_order(ledger).await;
    quota_without_tenant_or_client(ledger).await;
    quota_race(ledger).await;
    idempotency(ledger).await;
    idempotency_window(ledger).await;
    idempotency_race(ledger).await;
    upstream_one_owner(ledger).await;
    upstream_one_owner_per_key(ledger).await;
    upstream_race(ledger).await;
    finish_cas(ledger).await;
    finish_race(ledger).await;
    observe(ledger).await;
    result_reads(ledger).await;
    forget_payload(ledger).await;
    past_deadline(ledger).await;
    identity_renewal(ledger).await;
    purge_expired(ledger).await;
    active_for(ledger).await;
    secret(ledger).await;
    counters(ledger).await;
    settle_not_pending(ledger).await;
    settle_on_confirm(ledger).await;
    settle_on_release(ledger).await;
    settle_on_sweep(ledger).await;
    settle_many_waiters(ledger).await;
    cancel_request(ledger).await;
    cancel_race(ledger).await;
    cancels_due(ledger).await;
    cancel_holds_quota(ledger).await;
    replicas_and_orphans(ledger).await;
    cancels_due_per_home(ledger).await;
    leases(ledger).await;
    budgets(ledger).await;
    budgets_by_grant(ledger).await;
    budget_costs(ledger).await;
    budget_race(ledger).await;
    budgets_purged(ledger).await;
}

/// Runs every function except [`quota_server`] and [`budgets_purged`] at once, interleaved on one ledger: what a
/// shared database sees when many test binaries use it. Safe to call on a ledger that already
/// holds data, including from earlier calls.
pub async fn run_shared(ledger: &dyn TaskLedger) {
    let suite: Vec<LocalBoxFuture<'_, ()>> = vec![
        round_trip(ledger).boxed_local(),
        key_bindings(ledger).boxed_local(),
        reservations_are_invisible(ledger).boxed_local(),
        release(ledger).boxed_local(),
        reservations_expire(ledger).boxed_local(),
        quota_principal(ledger).boxed_local(),
        quota_tenant(ledger).boxed_local(),
        quota_client(ledger).boxed_local(),
        quota_tenant_per_issuer(ledger).boxed_local(),
        quota_client_per_issuer(ledger).boxed_local(),
        quota_order(ledger).boxed_local(),
        quota_without_tenant_or_client(ledger).boxed_local(),
        quota_race(ledger).boxed_local(),
        idempotency(ledger).boxed_local(),
        idempotency_window(ledger).boxed_local(),
        idempotency_race(ledger).boxed_local(),
        upstream_one_owner(ledger).boxed_local(),
        upstream_one_owner_per_key(ledger).boxed_local(),
        upstream_race(ledger).boxed_local(),
        finish_cas(ledger).boxed_local(),
        finish_race(ledger).boxed_local(),
        observe(ledger).boxed_local(),
        result_reads(ledger).boxed_local(),
        forget_payload(ledger).boxed_local(),
        past_deadline(ledger).boxed_local(),
        identity_renewal(ledger).boxed_local(),
        purge_expired(ledger).boxed_local(),
        active_for(ledger).boxed_local(),
        secret(ledger).boxed_local(),
        counters(ledger).boxed_local(),
        settle_not_pending(ledger).boxed_local(),
        settle_on_confirm(ledger).boxed_local(),
        settle_on_release(ledger).boxed_local(),
        settle_on_sweep(ledger).boxed_local(),
        settle_many_waiters(ledger).boxed_local(),
        cancel_request(ledger).boxed_local(),
        cancel_race(ledger).boxed_local(),
        cancels_due(ledger).boxed_local(),
        cancel_holds_quota(ledger).boxed_local(),
        replicas_and_orphans(ledger).boxed_local(),
        cancels_due_per_home(ledger).boxed_local(),
        leases(ledger).boxed_local(),
        budgets(ledger).boxed_local(),
        budgets_by_grant(ledger).boxed_local(),
        budget_costs(ledger).boxed_local(),
        budget_race(ledger).boxed_local(),
    ];
    join_all(suite).await;
}

// Helpers

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("OS random number generator");
    bytes
}

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", hex::encode(random_bytes::<9>()))
}

/// A principal nobody else uses, in its own tenant and client.
pub fn fresh_owner() -> Owner {
    Owner {
        issuer: unique("https://issuer.test/"),
        subject: unique("user-"),
        tenant: unique("tenant-"),
        client: unique("client-"),
    }
}

fn new_id() -> TaskId {
    TaskId::generate().expect("mint task id")
}

fn claim(window_ms: i64) -> IdempotencyClaim {
    IdempotencyClaim {
        key_hash: random_bytes(),
        window_ms,
    }
}

/// A reservation at [`NOW`] that stays alive until [`FAR`].
pub fn reservation(owner: &Owner, limits: QuotaLimits) -> Reservation {
    Reservation {
        id: new_id(),
        owner: owner.clone(),
        tool: "reports.generate".into(),
        scopes: vec!["tasks:write".into(), "reports".into()],
        idempotency: None,
        limits,
        now: NOW,
        reservation_expires_at: FAR,
        token_issued_at: Some(NOW / 1000 - 30),
        correlation_id: unique("request-"),
        object: Some("projects/p-1".into()),
        lease_until: None,
        delegated_until: Some(NOW + 5 * 60_000),
        trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        binding: None,
    }
}

/// A working task created at `created_at`, retained for [`KEEP`], deadline an hour later.
pub fn confirmation(created_at: i64) -> Confirmation {
    Confirmation {
        upstream_id: unique("upstream-"),
        status: TaskStatus::Working,
        status_message: None,
        created_at,
        ttl_ms: KEEP,
        deadline_at: created_at + 60 * MINUTE,
        poll_interval_ms: Some(2_000),
    }
}

fn finishing(status: TaskStatus, reason: EndReason, at: i64) -> Finish {
    Finish {
        status,
        status_message: None,
        ending: Ending {
            reason,
            by: None,
            payload: None,
            at,
        },
    }
}

async fn reserve(ledger: &dyn TaskLedger, r: Reservation) -> ReserveOutcome {
    ledger.reserve(r).await.expect("reserve")
}

async fn reserve_ok(ledger: &dyn TaskLedger, r: Reservation) -> TaskId {
    let id = r.id.clone();
    assert_eq!(reserve(ledger, r).await, ReserveOutcome::Reserved);
    id
}

/// Confirms a reservation that must become a new task.
async fn confirm(ledger: &dyn TaskLedger, id: &TaskId, c: Confirmation) -> TaskRecord {
    match ledger.confirm(id, c).await.expect("confirm") {
        Confirmed::New(record) => record,
        other => panic!("confirm with a fresh upstream ID: {other:?}"),
    }
}

/// Reserves (without limits) and confirms a task with [`confirmation`]`(NOW)`.
async fn create(ledger: &dyn TaskLedger, owner: &Owner) -> TaskRecord {
    let id = reserve_ok(ledger, reservation(owner, UNLIMITED)).await;
    confirm(ledger, &id, confirmation(NOW)).await
}

async fn get(ledger: &dyn TaskLedger, id: &TaskId) -> Option<TaskRecord> {
    ledger.get(id).await.expect("get")
}

async fn end(ledger: &dyn TaskLedger, id: &TaskId) -> TaskRecord {
    let f = finishing(TaskStatus::Cancelled, EndReason::OwnerCancel, NOW + 1);
    match ledger.finish(id, f).await.expect("finish") {
        FinishOutcome::Applied(record) => *record,
        other => panic!("finish of a live task: {other:?}"),
    }
}

fn ids(records: &[TaskRecord]) -> Vec<TaskId> {
    records.iter().map(|r| r.id.clone()).collect()
}
