//! Request-rate limits across replicas, black box: three replicas on one PostgreSQL ledger
//! share each bucket, so a server-wide or per-principal limit holds for the server as a whole
//! whichever replicas the requests reach; a request forwarded to a task's home replica over the
//! internal hop is charged once, where the client sent it.
//!
//! Rates are 0.001 a second, so no token refills during a test and the shared bucket's counts
//! are exact (each replica takes one token at a time at such a rate; see
//! `sidecar::rate_limit::shared`).

use crate::support;

use serde_json::json;
use support::User;
use support::replicas::{ReplicaOptions, Replicas};

fn options(spec: &str) -> ReplicaOptions {
    ReplicaOptions {
        spec: spec.to_owned(),
        ..Default::default()
    }
}

/// Twelve calls spread over three replicas against a server-wide burst of six: six reach the
/// servers, six are refused with when to retry.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_wide_limit_holds_across_replicas() {
    let spec = "  rateLimits:\n    perServer: {requestsPerSecond: 0.001, burst: 6}\n";
    let r = Replicas::start(3, options(spec)).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-b", "cli").token();
    let mut admitted = 0;
    let mut refused = 0;
    for n in 0..12 {
        let token = if n % 2 == 0 { &alice } else { &bob };
        let reply = r
            .client(n)
            .call_tool(token, "greet", json!({"name": "x"}))
            .await;
        match reply.status {
            200 => admitted += 1,
            429 => {
                assert_eq!(reply.body["error"]["data"]["reason"], "rate_limited");
                assert!(reply.body["error"]["data"]["retryAfterMs"].as_u64() > Some(0));
                refused += 1;
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!((admitted, refused), (6, 6));
    let mut reached = 0;
    for server in &r.servers {
        reached += server.requests("tools/call").await.len();
    }
    assert_eq!(reached, 6);
    assert_eq!(
        r.metric_sum("lifeguard_rate_limited_total{scope=\"server\",reason=\"all\"}")
            .await,
        6.0
    );
}

/// Polls of a task homed on one replica through the others are forwarded to the home; each
/// is charged once against the shared per-principal bucket of task reads.
#[tokio::test(flavor = "multi_thread")]
async fn a_forwarded_request_is_charged_once_and_per_principal_limits_are_shared() {
    let spec = "  tasks:\n    minPollInterval: 1ms\n  rateLimits:\n    methods:\n      taskReads: {perPrincipal: {requestsPerSecond: 0.001, burst: 3}}\n";
    let r = Replicas::start(3, options(spec)).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        r.client(0),
        &alice,
        "write_rows",
        json!({"count": 100_000, "intervalMs": 50, "label": "polled"}),
    )
    .await;
    // Three polls through the three replicas (two of them forwarded to replica 0): three
    // tokens, not five.
    for n in 0..3 {
        let reply = r.client(n).get_task(&alice, &id).await;
        assert_eq!(reply.status, 200, "poll {n}: {reply:?}");
    }
    // The fourth, through any replica, finds alice's shared bucket empty.
    for n in 0..3 {
        let reply = r.client(n).get_task(&alice, &id).await;
        assert_eq!(reply.status, 429, "poll {n}: {reply:?}");
    }
    // Another principal's polls of his own are not affected.
    // Every charge was the shared bucket's (none fell back to a replica's memory).
    assert_eq!(
        r.metric_sum("lifeguard_errors_total{reason=\"rate_limit_store\"}")
            .await,
        0.0
    );
    let bob = User::new("bob", "tenant-a", "console").token();
    let his = support::create_task(
        r.client(1),
        &bob,
        "write_rows",
        json!({"count": 100_000, "intervalMs": 50, "label": "his"}),
    )
    .await;
    assert_eq!(r.client(2).get_task(&bob, &his).await.status, 200);
}

/// While the database cannot be reached, each replica limits by itself (the whole limit in its
/// own memory) and counts the failure; once it is back, the shared bucket counts again.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_database_each_replica_limits_by_itself_until_it_is_back() {
    use support::postgres::{DatabaseProxy, TestDatabase};

    let db = TestDatabase::create().await;
    let mut proxy = DatabaseProxy::start().await;
    let url = proxy.url_for(&db.url);
    let spec = "  rateLimits:\n    perPrincipal: {requestsPerSecond: 0.001, burst: 2}\n";
    let r = Replicas::start_on(
        db,
        2,
        ReplicaOptions {
            spec: spec.into(),
            ledger_url: Some(url),
            ..Default::default()
        },
    )
    .await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let greet = async |n: usize| {
        r.client(n)
            .call_tool(&alice, "greet", json!({"name": "x"}))
            .await
            .status
    };

    proxy.take_down();
    // Each replica grants alice its whole limit from memory, then refuses.
    for replica in 0..2 {
        assert_eq!(greet(replica).await, 200);
        assert_eq!(greet(replica).await, 200);
        assert_eq!(greet(replica).await, 429);
    }
    assert!(
        r.metric_sum("lifeguard_errors_total{reason=\"rate_limit_store\"}")
            .await
            >= 6.0
    );

    proxy.bring_back().await;
    // The shared bucket was never charged: two more across the replicas, then none anywhere.
    let admitted = support::eventually(std::time::Duration::from_secs(20), async || {
        (greet(0).await == 200).then_some(())
    })
    .await;
    assert!(admitted.is_some(), "the shared bucket never answered again");
    assert_eq!(greet(1).await, 200);
    assert_eq!(greet(0).await, 429);
    assert_eq!(greet(1).await, 429);
}
