//! Sidecar III, listen half, black box: every `subscriptions/listen` stream is acknowledged
//! first, tagged with its subscription id, filtered to what the policy allows and the listener
//! owns, and closed when its token, its policy or its principal's access ends.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::User;
use support::listen::ListenStream;

const SUB_ID: &str = "io.modelcontextprotocol/subscriptionId";
const SPEC: &str = r#"  tasks:
    minPollInterval: 50ms
  listen:
    notifications: [toolsListChanged, resourcesListChanged, resourceSubscriptions, taskIds]
    resourceSubscriptions: {allow: ["example://team-a/*"]}
    maxStreamsPerPrincipal: 3
    maxStreamDuration: 30s
"#;

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(5);

/// An abruptly closed listener's stream ends: the next event finds nobody to deliver to and
/// the sidecar audits `listen.closed` with reason `client_closed`.
async fn assert_client_close_noticed(
    server: &support::process::ExampleServer,
    sidecar: &support::process::Sidecar,
) {
    let closed = support::eventually(LONG, async || {
        server.emit(json!({"kind": "toolsListChanged"})).await;
        sidecar
            .audit()
            .into_iter()
            .find(|e| e["event"] == "listen.closed" && e["reason"] == "client_closed")
    })
    .await;
    assert!(closed.is_some(), "abrupt close not noticed");
}

#[tokio::test]
async fn the_acknowledgement_comes_first_and_every_frame_carries_the_subscription_id() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = User::new("alice", "tenant-a", "console").token();
    for id in [json!(42), json!("sub-α")] {
        let mut stream = ListenStream::open(
            &client.url,
            &token,
            id.clone(),
            json!({"toolsListChanged": true, "resourceSubscriptions": ["example://team-a/r1"]}),
            true,
        )
        .await;
        assert_eq!(stream.status, 200);
        let ack = stream.next(LONG).await.expect("acknowledgement");
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(ack["params"]["_meta"][SUB_ID], id);
        assert_eq!(
            ack["params"]["notifications"],
            json!({"toolsListChanged": true, "resourceSubscriptions": ["example://team-a/r1"]})
        );
        server.emit(json!({"kind": "toolsListChanged"})).await;
        let event = stream.next(LONG).await.expect("tools list changed");
        assert_eq!(event["method"], "notifications/tools/list_changed");
        assert_eq!(event["params"]["_meta"][SUB_ID], id);
    }
}

#[tokio::test]
async fn filters_are_narrowed_to_what_the_policy_allows_and_the_listener_owns() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-a", "console").token();
    let alices_task =
        support::create_task(&client, &alice, "slow_compute", json!({"seconds": 30})).await;
    let bobs_task =
        support::create_task(&client, &bob, "slow_compute", json!({"seconds": 30})).await;
    let forged = format!("lgt_{}", "Q".repeat(32));

    let mut stream = ListenStream::open(
        &client.url,
        &alice,
        json!(1),
        json!({
            "promptsListChanged": true,               // not allowed by the policy
            "resourceSubscriptions": ["example://team-a/mine", "example://team-b/theirs"],
            "taskIds": [alices_task, bobs_task, forged],
        }),
        true,
    )
    .await;
    let ack = stream.next(LONG).await.expect("acknowledgement");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": ["example://team-a/mine"], "taskIds": [alices_task]}),
        "foreign and forged task IDs are dropped alike, and so are foreign URIs"
    );
    // Events for what was dropped never arrive.
    server.emit(json!({"kind": "promptsListChanged"})).await;
    server
        .emit(json!({"kind": "resourceUpdated", "uri": "example://team-b/theirs"}))
        .await;
    server
        .emit(json!({"kind": "resourceUpdated", "uri": "example://team-a/mine"}))
        .await;
    let event = stream.next(LONG).await.expect("allowed resource update");
    assert_eq!(event["params"]["uri"], "example://team-a/mine");
    client.cancel_task(&bob, &bobs_task).await;
    assert!(
        stream.next(SHORT).await.is_none(),
        "nothing about bob's task"
    );
}

#[tokio::test]
async fn two_principals_never_see_each_others_task_events() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-a", "console").token();
    // Both tasks wait for a confirmation, so neither can finish before the streams are open:
    // every status change the test reads happens after both acknowledgements.
    let a = waiting_for_confirmation(&client, &alice, "a").await;
    let b = waiting_for_confirmation(&client, &bob, "b").await;
    let mut alice_stream = ListenStream::open(
        &client.url,
        &alice,
        json!("a"),
        json!({"taskIds": [a, b]}),
        true,
    )
    .await;
    let mut bob_stream = ListenStream::open(
        &client.url,
        &bob,
        json!("b"),
        json!({"taskIds": [a, b]}),
        true,
    )
    .await;
    // Each acknowledgement lists only the listener's own task: the other was dropped.
    for (stream, own) in [(&mut alice_stream, &a), (&mut bob_stream, &b)] {
        let ack = stream.next(LONG).await.expect("acknowledgement");
        assert_eq!(
            ack["method"], "notifications/subscriptions/acknowledged",
            "{ack}"
        );
        assert_eq!(
            ack["params"]["notifications"]["taskIds"],
            json!([own]),
            "{ack}"
        );
    }
    confirm(&client, &alice, &a).await;
    confirm(&client, &bob, &b).await;
    let alice_frames = read_until_completed(&mut alice_stream).await;
    let bob_frames = read_until_completed(&mut bob_stream).await;
    let task_ids = |frames: &[Value]| -> Vec<String> {
        frames
            .iter()
            .filter(|f| f["method"] == "notifications/tasks")
            .map(|f| f["params"]["taskId"].as_str().unwrap().to_owned())
            .collect()
    };
    let seen_by_alice = task_ids(&alice_frames);
    let seen_by_bob = task_ids(&bob_frames);
    assert!(
        !seen_by_alice.is_empty() && seen_by_alice.iter().all(|t| *t == a),
        "{seen_by_alice:?}"
    );
    assert!(
        !seen_by_bob.is_empty() && seen_by_bob.iter().all(|t| *t == b),
        "{seen_by_bob:?}"
    );
    let raw = serde_json::to_string(&alice_frames).unwrap();
    assert!(!raw.contains("task-"), "upstream IDs leaked: {raw}");
    // The last state alice saw is the completion, in her IDs; listen streams carry status
    // only, never a result or an error: the result is read with tasks/get.
    let last = alice_frames
        .iter()
        .rev()
        .find(|f| f["method"] == "notifications/tasks")
        .unwrap();
    assert_eq!(last["params"]["status"], "completed");
    for frames in [&alice_frames, &bob_frames] {
        assert!(
            frames
                .iter()
                .all(|f| f["params"].get("result").is_none() && f["params"].get("error").is_none()),
            "a listen stream carried a result or an error: {frames:?}"
        );
    }
    let read = client.get_task(&alice, &a).await;
    assert_eq!(read.result()["status"], "completed", "{read:?}");
    assert_eq!(read.result()["result"]["content"][0]["text"], "confirmed a");
}

/// Starts a `confirm_action` task and polls until it asks for its confirmation.
async fn waiting_for_confirmation(
    client: &support::McpClient,
    token: &str,
    action: &str,
) -> String {
    let id = support::create_task(client, token, "confirm_action", json!({"action": action})).await;
    support::eventually(LONG, async || {
        let r = client.get_task(token, &id).await;
        (r.result()["status"] == "input_required").then_some(())
    })
    .await
    .expect("the task asks for confirmation");
    id
}

async fn confirm(client: &support::McpClient, token: &str, task: &str) {
    let reply = client
        .request(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {
                "confirm-1": {"action": "accept", "content": {"confirm": true}}
            }}),
        )
        .token(token)
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
}

/// Every frame up to this stream's `completed` task notification (each within 5 s), then
/// whatever else arrives in a 900 ms quiet window: a notification about someone else's task
/// would be in one or the other.
async fn read_until_completed(stream: &mut ListenStream) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Some(frame) = stream.next(LONG).await {
        let completed =
            frame["method"] == "notifications/tasks" && frame["params"]["status"] == "completed";
        frames.push(frame);
        if completed {
            break;
        }
    }
    frames.extend(stream.drain(Duration::from_millis(900)).await);
    frames
}

#[tokio::test]
async fn invalid_filters_and_undeclared_task_ids_are_refused() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let undeclared = ListenStream::open(
        &client.url,
        &token,
        json!(1),
        json!({"taskIds": ["x"]}),
        false,
    )
    .await;
    assert_eq!(undeclared.status, 400);
    let body = undeclared.body().await;
    assert_eq!(body["error"]["code"], -32021);
    let unknown = ListenStream::open(
        &client.url,
        &token,
        json!(2),
        json!({"everything": true}),
        true,
    )
    .await;
    assert_eq!(unknown.status, 400);
    assert_eq!(unknown.body().await["error"]["code"], -32602);
    assert!(
        sidecar
            .audit()
            .iter()
            .any(|e| e["event"] == "listen.denied")
    );
}

#[tokio::test]
async fn streams_are_capped_per_principal_and_closed_ends_free_the_slot() {
    let (server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let mut open = Vec::new();
    for i in 0..3 {
        let mut s = ListenStream::open(
            &client.url,
            &token,
            json!(i),
            json!({"toolsListChanged": true}),
            true,
        )
        .await;
        s.next(LONG).await.expect("ack");
        open.push(s);
    }
    let fourth = ListenStream::open(
        &client.url,
        &token,
        json!(9),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    assert_eq!(fourth.status, 429);
    // An abrupt close (the client just goes away) frees the slot and the upstream stream.
    drop(open.pop());
    let reopened = support::eventually(LONG, async || {
        let mut s = ListenStream::open(
            &client.url,
            &token,
            json!(10),
            json!({"toolsListChanged": true}),
            true,
        )
        .await;
        (s.status == 200 && s.next(LONG).await.is_some()).then_some(s)
    })
    .await;
    assert!(reopened.is_some());
    assert_client_close_noticed(&server, &sidecar).await;
}

#[tokio::test]
async fn token_expiry_and_max_duration_end_streams_gracefully() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(
        &SPEC.replace("maxStreamDuration: 30s", "maxStreamDuration: 1s"),
    )
    .await;
    let user = User::new("alice", "tenant-a", "console");
    let mut by_duration = ListenStream::open(
        &client.url,
        &user.token(),
        json!("d"),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    let expiring = user.token_with(|c| c["exp"] = json!(jiff::Timestamp::now().as_second() + 1));
    let mut by_token = ListenStream::open(
        &client.url,
        &expiring,
        json!("t"),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    for (stream, id) in [(&mut by_duration, "d"), (&mut by_token, "t")] {
        let frames = stream.drain(Duration::from_secs(3)).await;
        let last = frames.last().expect("frames");
        assert_eq!(last["id"], id, "{frames:?}");
        assert_eq!(last["result"]["resultType"], "complete");
        assert_eq!(last["result"]["_meta"][SUB_ID], id);
    }
}

#[tokio::test]
async fn revocation_and_policy_withdrawal_close_streams() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let now = jiff::Timestamp::now().as_second();
    let alice = User::new("alice", "tenant-a", "console");
    let old = alice.token_with(|c| c["iat"] = json!(now - 60));
    let bob = User::new("bob", "tenant-a", "console").token();
    let mut alice_stream = ListenStream::open(
        &client.url,
        &old,
        json!("a"),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    let mut bob_stream = ListenStream::open(
        &client.url,
        &bob,
        json!("b"),
        json!({"resourceSubscriptions": ["example://team-a/x"]}),
        true,
    )
    .await;
    alice_stream.next(LONG).await.expect("ack");
    bob_stream.next(LONG).await.expect("ack");

    let policy = std::fs::read_to_string(sidecar.policy_file()).unwrap();
    let revoked = format!(
        "{policy}---\napiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {{name: alice}}\nspec:\n  issuer: {}\n  subject: alice\n  revokedBefore: \"{}\"\n  reason: sessionRevoked\n  source: {{kind: manual}}\n",
        support::ISSUER,
        jiff::Timestamp::from_second(now - 10).unwrap()
    );
    let tmp = sidecar.policy_file().with_extension("tmp");
    std::fs::write(&tmp, &revoked).unwrap();
    std::fs::rename(&tmp, sidecar.policy_file()).unwrap();
    let frames = alice_stream.drain(Duration::from_secs(2)).await;
    assert_eq!(
        frames.last().map(|f| f["id"].clone()),
        Some(json!("a")),
        "{frames:?}"
    );

    // The policy stops allowing bob's resource subscriptions: his stream ends.
    let withdrawn = revoked.replace("example://team-a/*", "example://team-c/*");
    std::fs::write(&tmp, withdrawn).unwrap();
    std::fs::rename(&tmp, sidecar.policy_file()).unwrap();
    let frames = bob_stream.drain(Duration::from_secs(2)).await;
    assert_eq!(
        frames.last().map(|f| f["id"].clone()),
        Some(json!("b")),
        "{frames:?}"
    );
    let closed = sidecar
        .audit_events_when(2, |e| e["event"] == "listen.closed")
        .await;
    let reasons: Vec<&str> = closed
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert!(reasons.contains(&"revoked"), "{reasons:?}");
    assert!(reasons.contains(&"policy_changed"), "{reasons:?}");
    let applied = sidecar
        .audit()
        .into_iter()
        .find(|e| e["event"] == "revocation.applied")
        .unwrap();
    assert_eq!(applied["detail"]["streamsClosed"], 1);
}

#[tokio::test]
async fn a_slow_consumer_is_cut_off_with_bounded_buffering() {
    let (server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let mut stream = ListenStream::open(
        &client.url,
        &token,
        json!(1),
        json!({"resourceSubscriptions": ["example://team-a/flood"]}),
        true,
    )
    .await;
    stream.next(LONG).await.expect("ack");
    // Flood without reading.
    server
        .emit(json!({"kind": "resourceUpdated", "uri": "example://team-a/flood", "count": 200000}))
        .await;
    let cut = support::eventually(Duration::from_secs(60), async || {
        sidecar
            .audit()
            .into_iter()
            .find(|e| e["event"] == "listen.closed" && e["reason"] == "slow_consumer")
    })
    .await;
    assert!(cut.is_some(), "slow consumer never cut off");
}

#[tokio::test]
async fn a_token_without_the_tools_scopes_gets_no_task_events() {
    let spec = SPEC.replace(
        "    minPollInterval: 50ms\n",
        "    minPollInterval: 50ms\n    requiredScopes: {write_rows: [rows:write]}\n",
    );
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let writer = User::new("alice", "tenant-a", "console")
        .with_scopes("rows:write")
        .token();
    let reader = User::new("alice", "tenant-a", "console").token();
    let task = support::create_task(
        &client,
        &writer,
        "write_rows",
        json!({"count": 5, "intervalMs": 100, "label": "scoped"}),
    )
    .await;
    // The same principal without the scope is refused on tasks/get…
    assert_eq!(client.get_task(&reader, &task).await.status, 403);
    // …and a stream opened with that token drops the task like a foreign one.
    let mut stream = ListenStream::open(
        &client.url,
        &reader,
        json!("s"),
        json!({"taskIds": [task], "toolsListChanged": true}),
        true,
    )
    .await;
    let ack = stream.next(LONG).await.expect("acknowledgement");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "{ack}"
    );
    while let Some(frame) = stream.next(Duration::from_secs(1)).await {
        assert_ne!(frame["method"], "notifications/tasks", "{frame}");
    }
}

#[tokio::test]
async fn templated_subscription_patterns_partition_resources_per_tenant_and_subject() {
    let spec = "  tasks:\n    minPollInterval: 10ms\n  listen:\n    notifications: [resourceSubscriptions]\n    resourceSubscriptions: {allow: [\"example://{tenant}/*\", \"files://{subject}/*\"]}\n";
    let (server, _sidecar, client) = support::start_behind_sidecar(spec).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let carol = User::new("carol", "tenant-b", "console").token();
    let asked = json!({"resourceSubscriptions": [
        "example://tenant-a/q3", "example://tenant-b/q3", "files://alice/notes", "files://carol/notes"
    ]});
    let mut alices = ListenStream::open(&client.url, &alice, json!("a"), asked.clone(), true).await;
    let mut carols = ListenStream::open(&client.url, &carol, json!("c"), asked, true).await;
    let ack = alices.next(LONG).await.expect("alice's acknowledgement");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": ["example://tenant-a/q3", "files://alice/notes"]})
    );
    let ack = carols.next(LONG).await.expect("carol's acknowledgement");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": ["example://tenant-b/q3", "files://carol/notes"]})
    );
    server
        .emit(json!({"kind": "resourceUpdated", "uri": "example://tenant-b/q3"}))
        .await;
    let event = carols.next(LONG).await.expect("carol's update");
    assert_eq!(event["params"]["uri"], "example://tenant-b/q3");
    assert!(
        alices.next(SHORT).await.is_none(),
        "alice hears nothing of tenant-b"
    );
}

#[tokio::test]
async fn with_upstream_http2_listen_streams_reach_the_server_over_http2_and_requests_over_http1() {
    let server = support::process::ExampleServer::start();
    let sidecar = support::process::Sidecar::start(
        &server.url,
        support::process::SidecarOptions {
            spec: SPEC.to_owned(),
            args: vec!["--upstream-http2".into(), "listen".into()],
            ..Default::default()
        },
    )
    .await;
    let client = support::client::McpClient::new(&sidecar.url);
    let mut streams = Vec::new();
    for (i, user) in ["alice", "bob", "carol"].into_iter().enumerate() {
        let token = User::new(user, "tenant-a", "console").token();
        let mut stream = ListenStream::open(
            &client.url,
            &token,
            json!(i),
            json!({"toolsListChanged": true}),
            true,
        )
        .await;
        assert_eq!(stream.status, 200, "{user}");
        let ack = stream.next(LONG).await.expect("acknowledgement");
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        streams.push((user, stream));
    }
    let token = User::new("alice", "tenant-a", "console").token();
    let reply = client
        .call_tool(&token, "greet", json!({"name": "h2"}))
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");

    server.emit(json!({"kind": "toolsListChanged"})).await;
    for (user, stream) in &mut streams {
        let event = stream
            .next(LONG)
            .await
            .unwrap_or_else(|| panic!("{user}: no event"));
        assert_eq!(
            event["method"], "notifications/tools/list_changed",
            "{user}"
        );
    }

    let versions = |method: &'static str| {
        let server = &server;
        async move {
            server
                .requests(method)
                .await
                .into_iter()
                .map(|r| r["httpVersion"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(versions("subscriptions/listen").await, vec!["HTTP/2.0"; 3]);
    assert_eq!(versions("tools/call").await, vec!["HTTP/1.1"; 1]);

    // A stream whose client goes away still ends at the server: its HTTP/2 stream is reset.
    drop(streams.pop());
    assert_client_close_noticed(&server, &sidecar).await;
}

/// `tasks.results` masks reach listen streams: a working task's `statusMessage` in a
/// `notifications/tasks` frame is masked as in `tasks/get` (and the terminal frame, from the
/// ledger, carries the masked text the ledger stored).
#[tokio::test]
async fn task_frames_carry_the_status_message_as_tasks_results_masks_it() {
    let spec = "  tasks:\n    minPollInterval: 50ms\n    results: {redact: {mask: ['acct-\\d+']}}\n  listen:\n    notifications: [taskIds]\n    maxStreamDuration: 30s\n";
    let (_server, _sidecar, client) = support::start_behind_sidecar(spec).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 1, "status": "reconciling acct-1234"}),
    )
    .await;
    let mut stream = ListenStream::open(
        &client.url,
        &token,
        json!("m"),
        json!({"taskIds": [task]}),
        true,
    )
    .await;
    let mut frames = Vec::new();
    while let Some(frame) = stream.next(LONG).await {
        let done = frame["params"]["status"] == "completed";
        frames.push(frame);
        if done {
            break;
        }
    }
    let raw = serde_json::to_string(&frames).unwrap();
    assert!(!raw.contains("acct-1234"), "{raw}");
    assert!(
        frames.iter().any(|f| f["method"] == "notifications/tasks"
            && f["params"]["status"] == "working"
            && f["params"]["statusMessage"] == "reconciling [redacted]"),
        "{frames:?}"
    );
}
