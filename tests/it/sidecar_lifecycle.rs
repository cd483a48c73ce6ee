//! Sidecar II, black box: deadlines, retention, quotas under concurrency, idempotency,
//! entitlement re-checks and administrative cancel.

use crate::support;
use crate::support::alice;

use std::time::Duration;

use serde_json::{Value, json};
use support::{McpClient, User};

#[tokio::test]
async fn deadlines_end_tasks_and_stop_their_writes() {
    let (server, sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    deadline: {default: 1s}\n    minPollInterval: 50ms\n",
    )
    .await;
    let token = alice().token();
    // The ledger counts in whole milliseconds.
    let sent = jiff::Timestamp::from_millisecond(jiff::Timestamp::now().as_millisecond()).unwrap();
    let id = support::create_task(
        &client,
        &token,
        "write_rows",
        json!({"count": 1000, "intervalMs": 25, "label": "deadline"}),
    )
    .await;
    let ended = support::eventually(Duration::from_secs(10), async || {
        let r = client.get_task(&token, &id).await;
        (r.result()["status"] == "failed").then_some(r)
    })
    .await
    .expect("task failed at its deadline");
    let message = ended.result()["statusMessage"].as_str().unwrap();
    assert!(message.contains("Deadline exceeded"), "{message}");

    // The server was told to stop, and no row lands after the task reads failed plus one of
    // the server's poll intervals.
    let rows_at_end = server.rows_labelled("deadline").await.len();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(server.rows_labelled("deadline").await.len(), rows_at_end);
    assert_eq!(
        server.debug("/_example/tasks").await[0]["status"],
        "cancelled"
    );

    // Neither early nor late, as orderings of recorded instants (none depends on how fast this
    // machine is): the deadline the sidecar recorded at creation is the configured 1s after a
    // moment between sending the request and the ledger's creation, and the ledger records
    // the end at or after that deadline.
    let instant = |value: &Value| -> jiff::Timestamp {
        value
            .as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("not a timestamp: {value}"))
    };
    let created = sidecar
        .audit_event(|e| e["event"] == "task.created")
        .await
        .expect("creation audited");
    let deadline = instant(&created["detail"]["deadlineAt"]);
    let limit = jiff::SignedDuration::from_secs(1);
    assert!(
        sent + limit <= deadline && deadline <= instant(&ended.result()["createdAt"]) + limit,
        "deadline {deadline} is not 1s after the request (sent {sent}): {ended:?}"
    );
    assert!(
        instant(&ended.result()["lastUpdatedAt"]) >= deadline,
        "the task ended before its deadline {deadline}: {ended:?}"
    );

    let event = sidecar
        .audit_event(|e| e["event"] == "task.cancelled" && e["reason"] == "deadline")
        .await
        .expect("deadline cancellation audited");
    assert_eq!(event["subject"], "alice");
}

#[tokio::test]
async fn deadlines_survive_a_sidecar_restart() {
    let (_server, sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    deadline: {default: 2s}\n    minPollInterval: 50ms\n",
    )
    .await;
    let token = alice().token();
    let id = support::create_task(&client, &token, "slow_compute", json!({"seconds": 60})).await;
    let sidecar = sidecar.restart_after_kill().await;
    let client = McpClient::new(&sidecar.url);
    let ended = support::eventually(Duration::from_secs(5), async || {
        let r = client.get_task(&token, &id).await;
        (r.result()["status"] == "failed").then_some(r)
    })
    .await;
    assert!(ended.is_some(), "deadline lost across the restart");
}

#[tokio::test]
async fn retention_clamps_ttl_and_purges_tasks_into_unknown_ones() {
    let (_server, sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    retention: {defaultTtl: 1s, maxTtl: 1s}\n    minPollInterval: 50ms\n",
    )
    .await;
    let token = alice().token();
    let reply = client
        .call_tool(&token, "slow_compute", json!({"seconds": 0.05}))
        .await;
    assert_eq!(
        reply.result()["ttlMs"],
        1000,
        "server's 1h TTL clamped to maxTtl"
    );
    let id = reply.result()["taskId"].as_str().unwrap().to_owned();
    let done = client.wait_terminal(&token, &id, 3_000).await;
    assert_eq!(done.result()["status"], "completed");

    let unknown = client
        .get_task(&token, &format!("lgt_{}", "Z".repeat(32)))
        .await;
    let purged = support::eventually(Duration::from_secs(3), async || {
        let r = client.get_task(&token, &id).await;
        (r.status == 400).then_some(r)
    })
    .await
    .expect("task purged after its TTL");
    assert_eq!(purged.body_without_id(), unknown.body_without_id());
    let purged_event = sidecar
        .audit_event(|e| e["event"] == "task.expired" && e["reason"] == "retention")
        .await;
    assert!(purged_event.is_some(), "purge not audited");
}

#[tokio::test]
async fn read_once_results_are_returned_exactly_once() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    retention: {deleteResultAfterRetrieval: true}\n    minPollInterval: 50ms\n",
    )
    .await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 0.05, "label": "once"}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reads = futures_util::future::join_all((0..4).map(|_| client.get_task(&token, &id))).await;
    let with_result = reads
        .iter()
        .filter(|r| r.result().get("result").is_some())
        .count();
    // The first read may have been answered from the server's state (still working) if the
    // task had not been observed yet; poll until one read carries the result.
    let with_result = if with_result == 0 {
        let first = client.wait_terminal(&token, &id, 3_000).await;
        usize::from(first.result().get("result").is_some())
    } else {
        with_result
    };
    assert_eq!(with_result, 1, "{reads:?}");
    let later = client.get_task(&token, &id).await;
    assert_eq!(later.result()["status"], "completed");
    assert!(later.result().get("result").is_none());
    assert_eq!(
        later.result()["statusMessage"],
        "The result was deleted after it was retrieved"
    );
}

#[tokio::test]
async fn polls_faster_than_the_minimum_do_not_reach_the_server() {
    let (server, _sidecar, client) =
        support::start_behind_sidecar("  tasks:\n    minPollInterval: 3s\n").await;
    let token = alice().token();
    let id = support::create_task(&client, &token, "slow_compute", json!({"seconds": 30})).await;
    let created = client
        .call_tool(&token, "slow_compute", json!({"seconds": 30}))
        .await;
    assert_eq!(created.result()["pollIntervalMs"], 3000);
    for _ in 0..5 {
        let r = client.get_task(&token, &id).await;
        assert_eq!(r.result()["status"], "working");
    }
    let gets = server
        .debug("/_example/requests")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["mcpMethod"] == "tasks/get")
        .count();
    assert_eq!(gets, 0, "fast polls reached the server");
}

#[tokio::test]
async fn concurrent_creates_never_exceed_the_quota() {
    let (server, _sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    concurrency: {perPrincipal: 5, perTenant: 8}\n",
    )
    .await;
    let token = alice().token();
    let replies = futures_util::future::join_all(
        (0..20).map(|_| client.call_tool(&token, "slow_compute", json!({"seconds": 30}))),
    )
    .await;
    let created = replies.iter().filter(|r| r.status == 200).count();
    let refused = replies.iter().filter(|r| r.status == 429).count();
    assert_eq!((created, refused), (5, 15), "{replies:?}");
    assert!(
        replies
            .iter()
            .filter(|r| r.status == 429)
            .all(|r| r.body["error"]["data"]["scope"] == "principal")
    );
    assert_eq!(
        server
            .debug("/_example/tasks")
            .await
            .as_array()
            .unwrap()
            .len(),
        5
    );

    // The tenant quota (8) binds across principals of the tenant.
    let bob = User::new("bob", "tenant-a", "console").token();
    let more = futures_util::future::join_all(
        (0..6).map(|_| client.call_tool(&bob, "slow_compute", json!({"seconds": 30}))),
    )
    .await;
    assert_eq!(more.iter().filter(|r| r.status == 200).count(), 3);
    assert!(
        more.iter()
            .filter(|r| r.status == 429)
            .all(|r| r.body["error"]["data"]["scope"] == "tenant")
    );
}

#[tokio::test]
async fn twenty_identical_creations_make_one_task() {
    let (server, sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    idempotency: {window: 10m, deriveFromRequest: true}\n",
    )
    .await;
    let token = alice().token();
    let create_keyed = |key: &'static str| {
        client
            .request(
                "tools/call",
                json!({"name": "slow_compute", "arguments": {"seconds": 30, "label": "same"}}),
            )
            .token(&token)
            .header("idempotency-key", key)
            .send()
    };
    // Sequential.
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(create_keyed("order-1").await.result()["taskId"].clone());
    }
    // Concurrent, another key.
    let concurrent = futures_util::future::join_all((0..20).map(|_| create_keyed("order-2"))).await;
    let concurrent_ids: Vec<Value> = concurrent
        .iter()
        .map(|r| r.result()["taskId"].clone())
        .collect();
    assert!(ids.iter().all(|i| i == &ids[0] && i.is_string()), "{ids:?}");
    assert!(
        concurrent_ids
            .iter()
            .all(|i| i == &concurrent_ids[0] && i.is_string()),
        "{concurrent:?}"
    );
    assert_ne!(ids[0], concurrent_ids[0]);
    // Derived keys (no header): the same arguments twice are one task.
    let derived_a = client
        .call_tool(&token, "slow_compute", json!({"label": "d", "seconds": 30}))
        .await;
    let derived_b = client
        .call_tool(&token, "slow_compute", json!({"seconds": 30, "label": "d"}))
        .await;
    assert_eq!(derived_a.result()["taskId"], derived_b.result()["taskId"]);
    // The same key from another principal is another task.
    let bob = User::new("bob", "tenant-a", "console").token();
    let bobs = client
        .request(
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 30, "label": "same"}}),
        )
        .token(&bob)
        .header("idempotency-key", "order-1")
        .send()
        .await;
    assert_ne!(bobs.result()["taskId"], ids[0]);
    assert_eq!(
        server
            .debug("/_example/tasks")
            .await
            .as_array()
            .unwrap()
            .len(),
        4,
        "one upstream task per distinct creation"
    );
    assert!(
        sidecar
            .audit_event(|e| e["event"] == "task.deduplicated")
            .await
            .is_some()
    );
}

#[tokio::test]
async fn scopes_are_rechecked_and_expired_tokens_refused_on_every_request() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    requiredScopes: {slow_compute: [compute:run]}\n    minPollInterval: 50ms\n",
    )
    .await;
    let with_scope = alice().with_scopes("compute:run");
    let id = support::create_task(
        &client,
        &with_scope.token(),
        "slow_compute",
        json!({"seconds": 30}),
    )
    .await;

    // The same user, a token that lost the scope.
    let without = alice().token();
    for method in ["tasks/get", "tasks/cancel"] {
        let r = client.task(&without, method, &id).await;
        assert_eq!(r.status, 403, "{method}: {r:?}");
        let challenge = r.headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains("insufficient_scope") && challenge.contains("compute:run"));
    }
    // The creating token expires: refused; a fresh token of the owner continues.
    let expired = with_scope.token_with(|c| {
        let now = jiff::Timestamp::now().as_second();
        c["iat"] = json!(now - 7200);
        c["exp"] = json!(now - 3600);
    });
    assert_eq!(client.get_task(&expired, &id).await.status, 401);
    let fresh = client.get_task(&with_scope.token(), &id).await;
    assert_eq!(fresh.result()["status"], "working");
    client.cancel_task(&with_scope.token(), &id).await;
}

#[tokio::test]
async fn admins_cancel_tasks_of_their_tenant_and_nothing_more() {
    let (_server, sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    adminCancelScope: lifeguard:tasks:admin\n    minPollInterval: 50ms\n",
    )
    .await;
    let owner = alice().token();
    let id = support::create_task(&client, &owner, "slow_compute", json!({"seconds": 30})).await;
    let other_tenant_admin = User::new("root", "tenant-b", "ops")
        .with_scopes("lifeguard:tasks:admin")
        .token();
    let denied = client.cancel_task(&other_tenant_admin, &id).await;
    assert_eq!((denied.status, denied.error_code()), (400, Some(-32602)));

    let admin = User::new("ops", "tenant-a", "ops-cli")
        .with_scopes("lifeguard:tasks:admin")
        .token();
    let read = client.get_task(&admin, &id).await;
    assert_eq!(read.status, 400, "the admin scope grants no reads");
    let cancelled = client.cancel_task(&admin, &id).await;
    assert_eq!(cancelled.result(), &json!({"resultType": "complete"}));
    let after = client.get_task(&owner, &id).await;
    assert_eq!(after.result()["status"], "cancelled");
    assert_eq!(
        after.result()["statusMessage"],
        "Cancelled by an administrator"
    );
    // The admin's request is audited as theirs; the confirmed end names the owner and who
    // ended it.
    let requested = sidecar
        .audit_event(|e| e["event"] == "task.cancel_requested")
        .await
        .expect("admin cancel request audited");
    assert_eq!(requested["subject"], "ops");
    assert_eq!(requested["reason"], "admin");
    assert_eq!(requested["detail"]["taskOwner"]["subject"], "alice");
    let event = sidecar
        .audit_event(|e| e["event"] == "task.admin_cancelled")
        .await
        .expect("admin cancel audited");
    assert_eq!(event["subject"], "alice");
    assert_eq!(event["detail"]["endedBy"]["subject"], "ops");
}
