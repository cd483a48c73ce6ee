//! Sidecar I, black box: the real `lifeguard sidecar` in front of the bundled example MCP
//! server, spoken to over HTTP. Every task belongs to one issuer+subject, tenant and client, and
//! that holds on every request.

use crate::support;
use crate::support::alice;

use std::time::Duration;

use serde_json::json;
use support::{McpClient, User};

const TASK_TOOLS: &str = r#"  tasks:
    tools: [write_rows, slow_compute, confirm_action, multi_input, failing_job, unstable_status]
    requiredScopes: {failing_job: [jobs:run]}
    minPollInterval: 100ms
"#;

#[tokio::test]
async fn a_task_is_created_with_the_sidecars_own_id_and_completes() {
    let (server, sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    let reply = client
        .call_tool(&token, "write_rows", json!({"count": 3, "intervalMs": 30}))
        .await;
    let result = reply.result().clone();
    let id = result["taskId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("lgt_") && id.len() == 36, "{id}");
    assert_eq!(result["status"], "working");
    assert_eq!(result["ttlMs"], 15 * 60 * 1000, "default TTL");
    assert!(result["pollIntervalMs"].as_i64().unwrap() >= 100);
    let upstream_ids: Vec<String> = server
        .debug("/_example/tasks")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap().to_owned())
        .collect();
    assert!(!reply.raw.contains(&upstream_ids[0]), "upstream ID leaked");

    let done = client.wait_terminal(&token, &id, 5_000).await;
    assert_eq!(done.result()["status"], "completed", "{done:?}");
    assert_eq!(done.result()["taskId"], id);
    assert_eq!(
        done.result()["result"]["content"][0]["text"],
        "wrote 3 rows"
    );

    // The last event of this flow, so that the others are written too.
    sidecar
        .audit_event(|e| e["event"] == "task.result_read")
        .await;
    let audit = sidecar.audit();
    let events: Vec<&str> = audit.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert!(events.contains(&"task.created"), "{events:?}");
    // Every event names the policy version it was decided under.
    let hash = &audit[0]["policy_hash"];
    assert!(
        hash.as_str().is_some_and(|h| h.len() >= 16),
        "{:?}",
        audit[0]
    );
    assert!(audit.iter().all(|e| e["policy_hash"] == *hash), "{audit:?}");
    assert!(events.contains(&"task.completed"), "{events:?}");
    assert!(events.contains(&"task.result_read"), "{events:?}");
    let created = audit.iter().find(|e| e["event"] == "task.created").unwrap();
    assert_eq!(created["subject"], "alice");
    assert_eq!(created["tenant"], "tenant-a");
    assert_eq!(created["client"], "console");
    assert_eq!(created["tool"], "write_rows");
    assert!(created["task"].as_str().unwrap().starts_with("h:"));
    assert!(created["detail"]["arguments"]["sha256"].is_string());
    let raw_audit = std::fs::read_to_string(&sidecar.audit_path).unwrap();
    assert!(!raw_audit.contains(&id), "raw task ID in the audit trail");
    assert!(!raw_audit.contains(&token), "token in the audit trail");
    assert!(
        !raw_audit.contains("intervalMs"),
        "tool arguments in the audit trail"
    );
}

#[tokio::test]
async fn other_principals_tenants_and_clients_get_one_identical_denial() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let owner = alice().token();
    let id = support::create_task(
        &client,
        &owner,
        "write_rows",
        json!({"count": 200, "intervalMs": 50}),
    )
    .await;

    let strangers = [
        (
            "same tenant, other user",
            User::new("bob", "tenant-a", "console").token(),
        ),
        (
            "other tenant",
            User::new("carol", "tenant-b", "console").token(),
        ),
        (
            "same user, other tenant",
            User::new("alice", "tenant-b", "console").token(),
        ),
        (
            "same user, other client",
            User::new("alice", "tenant-a", "cli").token(),
        ),
    ];
    let mut replies = Vec::new();
    for (who, token) in &strangers {
        for method in ["tasks/get", "tasks/cancel"] {
            replies.push((
                format!("{who} {method}"),
                client.task(token, method, &id).await,
            ));
        }
        let update = client
            .request(
                "tasks/update",
                json!({"taskId": id, "inputResponses": {"x": {"action": "accept"}}}),
            )
            .token(token)
            .send()
            .await;
        replies.push((format!("{who} tasks/update"), update));
    }
    // IDs that never existed: an attacker iterating well-formed IDs, and garbage.
    for _ in 0..25 {
        let random = lifeguard::ledger::TaskId::generate().unwrap().to_string();
        replies.push(("random id".into(), client.get_task(&owner, &random).await));
    }
    replies.push(("garbage id".into(), client.get_task(&owner, "task-1").await));

    let reference = replies[0].1.clone();
    assert_eq!(reference.status, 400);
    assert_eq!(reference.error_code(), Some(-32602));
    for (who, reply) in &replies {
        assert_eq!(reply.status, reference.status, "{who}");
        assert_eq!(
            reply.body_without_id(),
            reference.body_without_id(),
            "{who}"
        );
        assert_eq!(
            reply.headers.get("content-type"),
            reference.headers.get("content-type"),
            "{who}"
        );
    }

    // The owner's task is untouched by all of that.
    let mine = client.get_task(&owner, &id).await;
    assert_eq!(mine.status, 200);
    assert_eq!(mine.result()["status"], "working");

    let reasons: Vec<String> = sidecar
        .audit()
        .iter()
        .filter(|e| e["event"] == "task.denied")
        .map(|e| e["reason"].as_str().unwrap().to_owned())
        .collect();
    for reason in [
        "foreign_subject",
        "foreign_tenant",
        "foreign_client",
        "unknown",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} in {reasons:?}"
        );
    }
    client.cancel_task(&owner, &id).await;
}

#[tokio::test]
async fn protocol_violations_are_refused_before_reaching_the_server() {
    let (server, _sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();

    let no_version = client
        .request("tools/list", json!({}))
        .token(&token)
        .without_header("mcp-protocol-version")
        .send()
        .await;
    assert_eq!(
        (no_version.status, no_version.error_code()),
        (400, Some(-32020))
    );

    let old = client
        .request("tools/list", json!({}))
        .token(&token)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await;
    assert_eq!((old.status, old.error_code()), (400, Some(-32022)));
    assert_eq!(old.body["error"]["data"]["requested"], "2025-11-25");

    let wrong_method = client
        .request("tools/list", json!({}))
        .token(&token)
        .header("mcp-method", "tools/call")
        .send()
        .await;
    assert_eq!(
        (wrong_method.status, wrong_method.error_code()),
        (400, Some(-32020))
    );

    let id = support::create_task(&client, &token, "slow_compute", json!({"seconds": 5})).await;
    let wrong_name = client
        .request("tasks/get", json!({"taskId": id}))
        .token(&token)
        .header("mcp-name", "lgt_somebody_else")
        .send()
        .await;
    assert_eq!(
        (wrong_name.status, wrong_name.error_code()),
        (400, Some(-32020))
    );

    let undeclared = client
        .request("tasks/get", json!({"taskId": id}))
        .token(&token)
        .without_tasks()
        .send()
        .await;
    assert_eq!(
        (undeclared.status, undeclared.error_code()),
        (400, Some(-32021))
    );
    assert_eq!(
        undeclared.body["error"]["data"]["requiredCapabilities"],
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    );

    for removed in ["tasks/list", "tasks/result"] {
        let r = client
            .request(removed, json!({}))
            .token(&token)
            .send()
            .await;
        assert_eq!((r.status, r.error_code()), (404, Some(-32601)), "{removed}");
    }

    let no_meta = client
        .request(
            "tools/list",
            json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
        )
        .token(&token)
        .send()
        .await;
    assert_eq!((no_meta.status, no_meta.error_code()), (400, Some(-32602)));

    let http = reqwest::Client::new();
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = http
            .request(method.clone(), &client.url)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method}");
    }

    // None of the refused requests reached the server.
    let seen = server.debug("/_example/requests").await;
    let methods: Vec<&str> = seen
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["mcpMethod"].as_str())
        .collect();
    assert!(!methods.contains(&"tools/list"), "{methods:?}");
    assert!(!methods.contains(&"tasks/list"), "{methods:?}");
    client.cancel_task(&token, &id).await;
}

#[tokio::test]
async fn tokens_are_checked_on_every_request() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let missing = client.request("tools/list", json!({})).send().await;
    assert_eq!(missing.status, 401);
    let challenge = missing.headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains(
            "resource_metadata=\"http://127.0.0.1/.well-known/oauth-protected-resource/mcp\""
        ),
        "{challenge}"
    );

    let user = alice();
    let bad = [
        user.token_with(|c| c["exp"] = json!(jiff::Timestamp::now().as_second() - 120)),
        user.token_with(|c| c["aud"] = json!("https://elsewhere/mcp")),
        user.token_with(|c| c["iss"] = json!("https://evil.test")),
        {
            let key = std::fs::read(support::fixture("keys/attacker-ed25519.pem")).unwrap();
            let claims = json!({"iss": support::ISSUER, "aud": support::RESOURCE, "sub": "alice",
                                "exp": jiff::Timestamp::now().as_second() + 60});
            lifeguard::identity::mint::mint_token(
                &key,
                jsonwebtoken::Algorithm::EdDSA,
                Some("test-ed-1"),
                &claims,
            )
            .unwrap()
        },
    ];
    for token in bad {
        let r = client
            .request("tools/list", json!({}))
            .token(&token)
            .send()
            .await;
        assert_eq!(r.status, 401, "{r:?}");
        assert!(
            r.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .contains("error=\"invalid_token\"")
        );
    }
    let good = client
        .request("tools/list", json!({}))
        .token(&user.token())
        .send()
        .await;
    assert_eq!(good.status, 200, "{good:?}");
}

#[tokio::test]
async fn the_server_learns_the_caller_from_headers_only_the_sidecar_sets() {
    let (server, _sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().with_scopes("a b").token();
    let r = client
        .request("tools/list", json!({}))
        .token(&token)
        .header("lifeguard-subject", "mallory")
        .header("lifeguard-tenant", "tenant-z")
        .header("mcp-session-id", "stolen-session")
        .send()
        .await;
    assert_eq!(r.status, 200);
    let seen = server.debug("/_example/requests").await;
    let last = seen
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|r| r["mcpMethod"] == "tools/list")
        .unwrap()
        .clone();
    assert_eq!(
        last["authorization"], false,
        "token must not reach the server"
    );
    assert_eq!(last["lifeguard"]["lifeguard-subject"], "alice");
    assert_eq!(last["lifeguard"]["lifeguard-tenant"], "tenant-a");
    assert_eq!(last["lifeguard"]["lifeguard-client"], "console");
    assert_eq!(last["lifeguard"]["lifeguard-scopes"], "a b");
    assert_eq!(last["lifeguard"]["lifeguard-initiator"], "client");
}

#[tokio::test]
async fn tasks_only_for_declaring_clients_and_allowed_tools() {
    let (server, _sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    // Not declaring the extension: the call runs synchronously.
    let sync = client
        .request(
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 0.05, "label": "x"}}),
        )
        .token(&token)
        .without_tasks()
        .send()
        .await;
    assert_eq!(sync.result()["resultType"], "complete", "{sync:?}");

    // A tool the policy does not allow as a task: the server is not offered the extension.
    let (server2, _sc2, restricted) =
        support::start_behind_sidecar("  tasks:\n    tools: [write_rows]\n").await;
    let r = restricted
        .call_tool(
            &token,
            "slow_compute",
            json!({"seconds": 0.05, "label": "y"}),
        )
        .await;
    assert_eq!(r.result()["resultType"], "complete", "{r:?}");
    assert_eq!(r.result()["content"][0]["text"], "computed y");
    for s in [&server, &server2] {
        let upstream_tasks = s.debug("/_example/tasks").await;
        assert_eq!(upstream_tasks.as_array().unwrap().len(), 0);
    }
}

#[tokio::test]
async fn required_scopes_are_enforced_at_creation() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let without = client
        .call_tool(&alice().token(), "failing_job", json!({}))
        .await;
    assert_eq!(without.status, 403);
    let challenge = without.headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(challenge.contains("scope=\"jobs:run\""), "{challenge}");

    let with = alice().with_scopes("jobs:run").token();
    let id = support::create_task(&client, &with, "failing_job", json!({"afterMs": 20})).await;
    let done = client.wait_terminal(&with, &id, 5_000).await;
    assert_eq!(done.result()["status"], "failed");
    assert_eq!(done.result()["error"]["message"], "job failed on purpose");
}

#[tokio::test]
async fn updates_reach_the_server_only_for_outstanding_inputs() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "confirm_action",
        json!({"action": "drop table"}),
    )
    .await;
    let waiting = support::eventually(Duration::from_secs(5), async || {
        let r = client.get_task(&token, &id).await;
        (r.result()["status"] == "input_required").then_some(r)
    })
    .await
    .expect("task asks for input");
    assert!(waiting.result()["inputRequests"]["confirm-1"].is_object());

    let ack = client
        .request(
            "tasks/update",
            json!({"taskId": id, "inputResponses": {
                "confirm-1": {"action": "accept", "content": {"confirm": true}},
                "not-asked": {"action": "accept", "content": {"confirm": false}}
            }}),
        )
        .token(&token)
        .send()
        .await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert_eq!(ack.result()["resultType"], "complete");
    let done = client.wait_terminal(&token, &id, 5_000).await;
    assert_eq!(
        done.result()["result"]["content"][0]["text"],
        "confirmed drop table"
    );
    let updated = sidecar
        .audit_event(|e| e["event"] == "task.updated")
        .await
        .expect("task.updated audited");
    assert_eq!(updated["detail"]["inputsForwarded"], 1);
    assert_eq!(updated["detail"]["inputsDropped"], 1);
}

#[tokio::test]
async fn cancel_is_recorded_forwarded_and_stops_the_work() {
    let (server, sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "write_rows",
        json!({"count": 1000, "intervalMs": 20, "label": "cancel-me"}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let ack = client.cancel_task(&token, &id).await;
    assert_eq!(ack.status, 200);
    assert_eq!(ack.result(), &json!({"resultType": "complete"}));
    let after = client.get_task(&token, &id).await;
    assert_eq!(after.result()["status"], "cancelled");

    let rows_now = server
        .debug("/_example/rows")
        .await
        .as_array()
        .unwrap()
        .len();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rows_later = server
        .debug("/_example/rows")
        .await
        .as_array()
        .unwrap()
        .len();
    assert_eq!(rows_now, rows_later, "rows kept landing after cancel");
    let upstream_status = server.debug("/_example/tasks").await[0]["status"].clone();
    assert_eq!(upstream_status, "cancelled");

    // A second cancel of a terminal task is the same empty ack.
    let again = client.cancel_task(&token, &id).await;
    assert_eq!(again.result(), &json!({"resultType": "complete"}));
    let cancelled = sidecar
        .audit_events_when(1, |e| e["event"] == "task.cancelled")
        .await
        .len();
    assert_eq!(cancelled, 1);
}

#[tokio::test]
async fn terminal_states_never_change_whatever_the_server_says_later() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "unstable_status",
        json!({"flipAfterMs": 200}),
    )
    .await;
    let first = client.wait_terminal(&token, &id, 5_000).await;
    assert_eq!(first.result()["status"], "completed");
    assert_eq!(
        first.result()["result"]["content"][0]["text"],
        "first answer"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..3 {
        let later = client.get_task(&token, &id).await;
        assert_eq!(later.result()["status"], "completed");
        assert_eq!(later.result()["result"], first.result()["result"]);
    }
    assert!(
        sidecar
            .audit_event(|e| e["event"] == "task.completed")
            .await
            .is_some()
    );
}

#[tokio::test]
async fn cancel_and_completion_racing_settle_on_one_terminal_state() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    for round in 0..8u64 {
        let id = support::create_task(
            &client,
            &token,
            "slow_compute",
            json!({"seconds": 0.15, "label": format!("r{round}")}),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(120 + round * 10)).await;
        let (c, g1, g2) = tokio::join!(
            client.cancel_task(&token, &id),
            client.get_task(&token, &id),
            client.get_task(&token, &id),
        );
        assert_eq!(c.status, 200);
        let _ = (g1, g2);
        let settled = client.wait_terminal(&token, &id, 5_000).await;
        let status = settled.result()["status"].as_str().unwrap().to_owned();
        assert!(status == "cancelled" || status == "completed", "{status}");
        for _ in 0..5 {
            let again = client.get_task(&token, &id).await;
            assert_eq!(again.result()["status"], status.as_str(), "round {round}");
            assert_eq!(again.result()["result"], settled.result()["result"]);
        }
    }
}

#[tokio::test]
async fn finished_but_unpolled_tasks_free_their_quota_slot() {
    let (_server, _sidecar, client) =
        support::start_behind_sidecar("  tasks:\n    concurrency: {perPrincipal: 2}\n").await;
    let token = alice().token();
    for _ in 0..2 {
        support::create_task(&client, &token, "slow_compute", json!({"seconds": 0.01})).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Nobody polled them, but they finished at the server: the quota check finds out.
    support::create_task(&client, &token, "slow_compute", json!({"seconds": 0.01})).await;
}

#[tokio::test]
async fn concurrency_quota_is_enforced_before_the_server_is_asked() {
    let (server, _sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    concurrency: {perPrincipal: 2}\n    minPollInterval: 1s\n",
    )
    .await;
    let token = alice().token();
    let a = support::create_task(&client, &token, "slow_compute", json!({"seconds": 10})).await;
    let b = support::create_task(&client, &token, "slow_compute", json!({"seconds": 10})).await;
    let over = client
        .call_tool(&token, "slow_compute", json!({"seconds": 10}))
        .await;
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(over.error_code(), Some(-31429));
    assert_eq!(over.body["error"]["data"]["scope"], "principal");
    assert_eq!(over.headers["retry-after"], "1");
    assert_eq!(
        server
            .debug("/_example/tasks")
            .await
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Another principal is not affected; a cancelled task frees a slot.
    support::create_task(
        &client,
        &User::new("bob", "tenant-a", "console").token(),
        "slow_compute",
        json!({"seconds": 10}),
    )
    .await;
    client.cancel_task(&token, &a).await;
    support::create_task(&client, &token, "slow_compute", json!({"seconds": 10})).await;
    client.cancel_task(&token, &b).await;
}

#[tokio::test]
async fn sse_answers_are_relayed_with_the_task_id_rewritten() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    let reply = client
        .request(
            "tools/call",
            json!({"name": "write_rows", "arguments": {"count": 2, "intervalMs": 20},
                   "_meta": {
                       "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                       "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
                       "progressToken": "p1"
                   }}),
        )
        .token(&token)
        .accept_sse()
        .send()
        .await;
    assert_eq!(reply.status, 200);
    assert!(reply.messages.len() >= 2, "{reply:?}");
    assert!(
        reply.messages[..reply.messages.len() - 1]
            .iter()
            .all(|m| m["method"] == "notifications/progress")
    );
    let id = reply.result()["taskId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("lgt_"), "{reply:?}");
    assert!(!reply.raw.contains("task-1"));
    let done = client.wait_terminal(&token, &id, 5_000).await;
    assert_eq!(done.result()["status"], "completed");
}

#[tokio::test]
async fn tasks_survive_a_kill_dash_nine_of_the_sidecar() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    let done_id =
        support::create_task(&client, &token, "slow_compute", json!({"seconds": 0.05})).await;
    client.wait_terminal(&token, &done_id, 5_000).await;
    let cancelled_id =
        support::create_task(&client, &token, "slow_compute", json!({"seconds": 30})).await;
    client.cancel_task(&token, &cancelled_id).await;
    let running_id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 0.8, "label": "survivor"}),
    )
    .await;
    // Created the instant before the kill: the CreateTaskResult was returned, so it must resolve.
    let last_id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 0.3, "label": "last"}),
    )
    .await;

    let sidecar = sidecar.restart_after_kill().await;
    let client = McpClient::new(&sidecar.url);

    let done = client.get_task(&token, &done_id).await;
    assert_eq!(done.result()["status"], "completed", "{done:?}");
    let cancelled = client.get_task(&token, &cancelled_id).await;
    assert_eq!(cancelled.result()["status"], "cancelled");
    let survivor = client.wait_terminal(&token, &running_id, 5_000).await;
    assert_eq!(
        survivor.result()["result"]["content"][0]["text"],
        "computed survivor"
    );
    let last = client.wait_terminal(&token, &last_id, 5_000).await;
    assert_eq!(last.result()["status"], "completed");
    // Ownership survives too.
    let bob = User::new("bob", "tenant-a", "console").token();
    assert_eq!(client.get_task(&bob, &running_id).await.status, 400);
}

#[tokio::test]
async fn policy_changes_apply_within_a_second_and_bad_files_are_ignored() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TASK_TOOLS).await;
    let token = alice().token();
    support::create_task(&client, &token, "slow_compute", json!({"seconds": 0.05})).await;

    let original = std::fs::read_to_string(sidecar.policy_file()).unwrap();
    std::fs::write(
        sidecar.policy_file(),
        original.replace("tools: [write_rows, slow_compute,", "tools: [write_rows,"),
    )
    .unwrap();
    // Probed by a principal of its own: until the reload applies, each probe creates a task
    // that counts against its creator's quota until the sidecar learns it ended, and how many
    // probes that takes depends on how fast the file watch fires — alice's quota must not.
    let prober = User::new("prober", "tenant-probe", "probe-client").token();
    let applied = support::eventually(Duration::from_millis(1500), async || {
        let r = client
            .call_tool(&prober, "slow_compute", json!({"seconds": 0.05}))
            .await;
        (r.result()["resultType"] == "complete").then_some(())
    })
    .await;
    assert!(applied.is_some(), "reload not applied:\n{}", sidecar.logs());

    std::fs::write(
        sidecar.policy_file(),
        "apiVersion: lifeguard.dev/v1alpha1\nkind: McpServerPolicy\nspec: {{{{",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        sidecar.logs().contains("policy file rejected"),
        "{}",
        sidecar.logs()
    );
    let still = client
        .call_tool(&token, "write_rows", json!({"count": 1, "intervalMs": 10}))
        .await;
    assert_eq!(
        still.result()["resultType"],
        "task",
        "last good policy stays in force: {still:?}\n{}",
        sidecar.logs()
    );
}

#[tokio::test]
async fn a_task_result_for_a_request_that_cannot_create_one_never_reaches_the_client() {
    let (server, sidecar, client) =
        support::start_behind_sidecar("  tasks:\n    tools: [rogue_task, slow_compute]\n").await;
    let token = alice().token();
    let undeclared = client
        .request(
            "tools/call",
            json!({"name": "rogue_task", "arguments": {"seconds": 30}}),
        )
        .token(&token)
        .without_tasks()
        .send()
        .await;
    assert_eq!(undeclared.error_code(), Some(-32603), "{undeclared:?}");
    assert!(!undeclared.raw.contains("task-"), "{undeclared:?}");

    let prompt = client
        .request("prompts/get", json!({"name": "rogue_task"}))
        .token(&token)
        .send()
        .await;
    assert_eq!(prompt.error_code(), Some(-32603), "{prompt:?}");
    assert!(prompt.body.get("result").is_none());

    // Both rogue tasks are cancelled at the server, and audited.
    let cancelled = support::eventually(Duration::from_secs(5), async || {
        let tasks = server.debug("/_example/tasks").await;
        let all = tasks.as_array()?.clone();
        (all.len() == 2 && all.iter().all(|t| t["status"] == "cancelled")).then_some(())
    })
    .await;
    assert!(
        cancelled.is_some(),
        "{}",
        server.debug("/_example/tasks").await
    );
    let refused = sidecar
        .audit_events_when(2, |e| e["event"] == "task.refused")
        .await
        .len();
    assert_eq!(refused, 2);
}
