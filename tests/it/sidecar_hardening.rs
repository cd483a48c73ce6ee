//! Hardening, black box: regressions for the weaknesses an adversarial review found. The
//! example server's `rogue_reply` tool (examples/example_server/rogue.rs) plays the misbehaving
//! server; its full request log shows what did — and did not — reach the server.

use crate::support;
use crate::support::alice;

// Cancellations of other callers' requests (issue 28, item 10).
mod cancellation;

use std::time::Duration;

use serde_json::{Value, json};
use support::client::{capabilities, request_meta};
use support::listen::ListenStream;
use support::rogue::{Received, post_with_headers};
use support::{ExampleServer, User, fixture};

const SPEC: &str = "  tasks:\n    minPollInterval: 50ms\n";
const WAIT: Duration = Duration::from_secs(10);

/// The standard `_meta` plus a progress token.
fn meta_with_progress(token: &str) -> Value {
    let mut meta = request_meta(capabilities(true));
    meta["progressToken"] = json!(token);
    meta
}

/// The server's view of its tasks: `[(taskId, status)]`.
async fn upstream_tasks(server: &ExampleServer) -> Vec<(String, String)> {
    server
        .debug("/_example/tasks")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let field = |k: &str| t[k].as_str().unwrap().to_owned();
            (field("taskId"), field("status"))
        })
        .collect()
}

/// Sends `notifications/cancelled` naming `request_id`, as `token`.
async fn send_cancellation(
    client: &support::McpClient,
    token: &str,
    request_id: Value,
) -> support::client::Reply {
    let builder = client
        .request(
            "notifications/cancelled",
            json!({"requestId": request_id, "reason": "changed my mind"}),
        )
        .token(token);
    let mut message = builder.message();
    message.as_object_mut().unwrap().remove("id");
    builder.send_raw(message.to_string()).await
}

/// What the server received after the first `since` requests.
async fn received_since(server: &ExampleServer, since: usize) -> Vec<Received> {
    server.received().await.into_iter().skip(since).collect()
}

// 1. Only `notifications/cancelled` may come without an id.

#[tokio::test]
async fn requests_sent_without_an_id_are_refused_and_never_reach_the_server() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let owner = alice().token();
    let task = support::create_task(&client, &owner, "slow_compute", json!({"seconds": 60})).await;
    let (upstream_id, _) = upstream_tasks(&server).await.remove(0);
    // Another tenant knows (or guesses) the server's sequential task ID.
    let mallory = User::new("mallory", "tenant-b", "console").token();
    let before = server.received().await.len();

    let requests = [
        ("tasks/cancel", json!({"taskId": upstream_id})),
        (
            "tasks/update",
            json!({"taskId": upstream_id, "inputResponses": {"x": {"action": "accept"}}}),
        ),
        (
            "tools/call",
            json!({"name": "write_rows", "arguments": {"count": 1, "intervalMs": 1, "label": "ghost"}}),
        ),
    ];
    for (method, params) in requests {
        let builder = client.request(method, params).token(&mallory);
        let mut message = builder.message();
        message.as_object_mut().unwrap().remove("id");
        let reply = builder.send_raw(message.to_string()).await;
        assert_eq!(reply.status, 400, "{method}: {reply:?}");
        assert_eq!(reply.error_code(), Some(-32600), "{method}: {reply:?}");
    }
    // The one client notification of 2026-07-28 is accepted as a notification; it names no
    // request of mallory's in flight, so it goes no further (item 10 below).
    let cancelled = send_cancellation(&client, &mallory, json!(99)).await;
    assert_eq!(cancelled.status, 202, "{cancelled:?}");

    let methods: Vec<Option<String>> = received_since(&server, before)
        .await
        .iter()
        .map(|r| r.method().map(str::to_owned))
        .collect();
    assert!(
        methods.is_empty(),
        "nothing reached the server: {methods:?}"
    );
    assert!(server.rows_labelled("ghost").await.is_empty());
    assert_eq!(
        upstream_tasks(&server).await,
        [(upstream_id, "working".to_owned())],
        "the other tenant's task is untouched at the server"
    );
    let mine = client.get_task(&owner, &task).await;
    assert_eq!(mine.result()["status"], "working", "{mine:?}");
}

// 2. An upstream JSON answer must be exactly the response to this request.

#[tokio::test]
async fn answers_that_are_not_exactly_the_response_to_the_request_are_refused() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();
    for kind in [
        "id_as_string",
        "id_as_float",
        "batch",
        "task_id_as_string",
        "sampling_id_as_string",
    ] {
        let counted = sidecar.anomalies("response_mismatch").await;
        let reply = client
            .request(
                "tools/call",
                json!({"name": "rogue_reply", "arguments": {"kind": kind}}),
            )
            .id(json!(7))
            .token(&token)
            .send()
            .await;
        assert_eq!(reply.status, 502, "{kind}: {reply:?}");
        assert_eq!(reply.error_code(), Some(-32603), "{kind}: {reply:?}");
        assert_eq!(reply.body["id"], 7, "{kind}: {reply:?}");
        for leaked in [
            "rogue-answer",
            "rogue-upstream-task-1",
            "sampling/createMessage",
            "rogue-sample",
            "rogue prompt",
        ] {
            assert!(!reply.raw.contains(leaked), "{kind}: {leaked} leaked");
        }
        assert_eq!(
            sidecar.anomalies("response_mismatch").await,
            counted + 1.0,
            "{kind}: counted as an anomaly"
        );
    }
    // The answer to the right id, of the right type, passes.
    let fine = client
        .call_tool(&token, "greet", json!({"name": "Ann"}))
        .await;
    assert_eq!(fine.result()["content"][0]["text"], "Hello, Ann!");
}

// 3. Duplicate JSON keys.

#[tokio::test]
async fn client_bodies_with_duplicate_keys_are_refused_before_the_server() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();
    let meta = request_meta(capabilities(true));
    // Each body with the method and params the (last-key-wins) headers were built from.
    let cases = [
        (
            "tools/list",
            json!({}),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","params":{{"taskId":"task-1","_meta":{meta}}},"method":"tools/list"}}"#
            ),
        ),
        (
            "tools/call",
            json!({"name": "greet"}),
            format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"write_rows","arguments":{{"name":"x","count":1,"intervalMs":1,"label":"dup"}},"_meta":{meta},"name":"greet"}}}}"#
            ),
        ),
        (
            "tools/call",
            json!({"name": "greet"}),
            format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"greet","arguments":{{"name":"x","name":"y"}},"_meta":{meta}}}}}"#
            ),
        ),
    ];
    let before = server.received().await.len();
    for (method, params, body) in cases {
        let reply = client
            .request(method, params)
            .token(&token)
            .send_raw(body.clone())
            .await;
        assert_eq!(reply.status, 400, "{body}: {reply:?}");
        assert_eq!(reply.error_code(), Some(-32600), "{body}: {reply:?}");
    }
    assert!(
        received_since(&server, before).await.is_empty(),
        "nothing reached the server"
    );
    assert!(server.rows_labelled("dup").await.is_empty());
}

#[tokio::test]
async fn upstream_answers_with_a_duplicated_key_are_refused() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();
    for kind in ["duplicate_id", "duplicate_result"] {
        let reply = client
            .call_tool(&token, "rogue_reply", json!({"kind": kind}))
            .await;
        assert_eq!(reply.status, 502, "{kind}: {reply:?}");
        assert_eq!(reply.error_code(), Some(-32603), "{kind}: {reply:?}");
        assert!(!reply.raw.contains("rogue-"), "{kind}: {reply:?}");
    }
    assert_eq!(sidecar.anomalies("duplicate_key").await, 2.0);
    assert_eq!(sidecar.anomalies("response_mismatch").await, 2.0);
}

// 4. Upstream event streams are bounded.

#[tokio::test]
async fn an_oversized_upstream_event_ends_the_stream_with_an_error() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();
    let reply = client
        .request(
            "tools/call",
            json!({"name": "rogue_reply", "arguments": {"kind": "huge_event", "mib": 33},
                   "_meta": meta_with_progress("big")}),
        )
        .id(json!(7))
        .token(&token)
        .accept_sse()
        .send()
        .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        &reply.raw[..reply.raw.len().min(500)]
    );
    assert!(
        reply.raw.len() < 1024 * 1024,
        "nothing of the oversized event is relayed ({} bytes)",
        reply.raw.len()
    );
    let (last, before_last) = reply.messages.split_last().expect("some events");
    assert_eq!(last["id"], 7, "{last}");
    assert_eq!(last["error"]["code"], -32603, "{last}");
    assert_eq!(
        last["error"]["message"], "The MCP server's answer is too large",
        "{last}"
    );
    assert!(
        before_last
            .iter()
            .all(|m| m["method"] == "notifications/progress" && m["params"]["progress"] == 1),
        "only the small progress event came before the error: {before_last:?}"
    );
    assert!(
        !reply.raw.contains("rogue-answer"),
        "no result after the error"
    );
    assert_eq!(sidecar.anomalies("upstream_stream_too_large").await, 1.0);
    // The sidecar is still up and serving.
    let next = client
        .call_tool(&token, "greet", json!({"name": "Ann"}))
        .await;
    assert_eq!(next.result()["content"][0]["text"], "Hello, Ann!");
}

// 5. Listen resource URIs must be plain.

#[tokio::test]
async fn listen_resource_uris_with_dot_segments_or_encoded_separators_are_refused() {
    let spec = format!(
        "{SPEC}  listen:\n    notifications: [resourceSubscriptions]\n    resourceSubscriptions: {{allow: [\"example://team-a/*\"]}}\n"
    );
    let (server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let token = alice().token();
    let listens = async || {
        server
            .received()
            .await
            .iter()
            .filter(|r| r.method() == Some("subscriptions/listen"))
            .count()
    };
    for uri in [
        "example://team-a/../team-b/secret",
        "example://team-a/%2e%2e/team-b/secret",
        "example://team-a/%2E%2E/team-b/secret",
        "example://team-a%2f..%2fteam-b/secret",
        "example://team-a/..\\team-b\\secret",
        "example://team-a\\..\\team-b/secret",
        "example://team-a/./secret",
    ] {
        let stream = ListenStream::open(
            &client.url,
            &token,
            json!(1),
            json!({"resourceSubscriptions": [uri]}),
            true,
        )
        .await;
        assert_eq!(stream.status, 400, "{uri}");
        let body = stream.body().await;
        assert_eq!(body["error"]["code"], -32602, "{uri}: {body}");
    }
    assert_eq!(listens().await, 0, "no listen request reached the server");
    // A plain URI under the allowed prefix opens.
    let mut fine = ListenStream::open(
        &client.url,
        &token,
        json!(2),
        json!({"resourceSubscriptions": ["example://team-a/report"]}),
        true,
    )
    .await;
    assert_eq!(fine.status, 200);
    let ack = fine.next(WAIT).await.expect("acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(listens().await, 1);
}

// 6. Listen-only notifications never travel on a request's stream.

#[tokio::test]
async fn listen_only_notifications_are_not_relayed_on_a_tools_call_stream() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let reply = client
        .request(
            "tools/call",
            json!({"name": "rogue_reply", "arguments": {"kind": "listen_notifications"},
                   "_meta": meta_with_progress("p")}),
        )
        .id(json!(7))
        .token(&alice().token())
        .accept_sse()
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let methods: Vec<&str> = reply
        .messages
        .iter()
        .map(|m| m["method"].as_str().unwrap_or("(response)"))
        .collect();
    assert_eq!(
        methods,
        [
            "notifications/progress",
            "notifications/progress",
            "(response)"
        ],
        "{}",
        reply.raw
    );
    assert_eq!(reply.body["result"]["content"][0]["text"], "rogue-answer");
    for leaked in ["rogue-upstream-task-2", "example://rogue/updated"] {
        assert!(!reply.raw.contains(leaked), "{leaked} relayed");
    }
    assert_eq!(
        sidecar
            .anomalies("listen_notification_on_request_stream")
            .await,
        2.0
    );
}

// 7. One Authorization header per request.

#[tokio::test]
async fn two_authorization_headers_are_refused_and_never_forwarded() {
    let spec = format!("{SPEC}  upstream:\n    identity: forwardToken\n");
    let (server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let alice = format!("Bearer {}", alice().token());
    let mallory = format!(
        "Bearer {}",
        User::new("mallory", "tenant-b", "console").token()
    );
    let message = client
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {"name": "Ann"}}),
        )
        .message();
    let routing = [("mcp-method", "tools/call"), ("mcp-name", "greet")];
    let before = server.received().await.len();
    for pair in [[&alice, &mallory], [&mallory, &alice], [&alice, &alice]] {
        let mut headers = routing.to_vec();
        headers.extend(pair.iter().map(|t| ("authorization", t.as_str())));
        let (status, body) = post_with_headers(&client, &headers, &message).await;
        assert_eq!(status, 401, "{body}");
    }
    assert!(
        received_since(&server, before).await.is_empty(),
        "no request with two tokens reached the server"
    );
    // One token passes and, in this mode, is forwarded alone.
    let mut headers = routing.to_vec();
    headers.push(("authorization", alice.as_str()));
    let (status, body) = post_with_headers(&client, &headers, &message).await;
    assert_eq!(status, 200, "{body}");
    let received = received_since(&server, before).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].authorizations(), 1);
}

// 8. Identity headers are stripped with `_` read as `-`.

#[tokio::test]
async fn underscore_spellings_of_identity_headers_never_reach_the_server() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let reply = client
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {"name": "Ann"}}),
        )
        .token(&alice().token())
        .header("Lifeguard_Subject", "mallory")
        .header("Lifeguard_Tenant", "tenant-mallory")
        .header("lifeguard_initiator", "sidecar")
        .header("Lifeguard_Issuer", "https://mallory.test")
        .header("Mcp_Session_Id", "mallory-session")
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let received = server.received().await;
    let call = received
        .iter()
        .rfind(|r| r.method() == Some("tools/call"))
        .expect("the call reached the server");
    let set_by_sidecar = [
        "lifeguard-issuer",
        "lifeguard-subject",
        "lifeguard-tenant",
        "lifeguard-client",
        "lifeguard-scopes",
        "lifeguard-initiator",
    ];
    for (name, value) in call.headers() {
        let normalized = name.replace('_', "-");
        if normalized.starts_with("lifeguard-") {
            assert!(
                set_by_sidecar.contains(&name.as_str()),
                "{name}: {value} reached the server"
            );
        }
        assert_ne!(normalized, "mcp-session-id", "{name}: {value}");
        assert!(!value.contains("mallory"), "{name}: {value}");
    }
    let header = |name: &str| call.header(name).unwrap_or_default();
    assert_eq!(header("lifeguard-subject"), "alice");
    assert_eq!(header("lifeguard-tenant"), "tenant-a");
    assert_eq!(header("lifeguard-issuer"), support::ISSUER);
    assert_eq!(header("lifeguard-initiator"), "client");
}

// 9. Over-quota reconciliation is paced per principal.

#[tokio::test]
async fn refused_creations_reconcile_with_the_server_at_most_once_per_principal() {
    let spec = "  tasks:\n    concurrency: {perPrincipal: 1}\n    minPollInterval: 10ms\n";
    let (server, _sidecar, client) = support::start_behind_sidecar(spec).await;
    let token = alice().token();
    support::create_task(&client, &token, "slow_compute", json!({"seconds": 60})).await;
    for _ in 0..10 {
        let over = client
            .call_tool(&token, "slow_compute", json!({"seconds": 60}))
            .await;
        assert_eq!(over.status, 429, "{over:?}");
    }
    assert_eq!(upstream_tasks(&server).await.len(), 1);
    let reconciliations = server
        .received()
        .await
        .iter()
        .filter(|r| {
            r.method() == Some("tasks/get")
                && r.header("lifeguard-initiator").as_deref() == Some("sidecar")
                && r.header("lifeguard-initiator-reason").as_deref() == Some("reconcile")
        })
        .count();
    assert_eq!(
        reconciliations, 1,
        "ten refused creations in a row ask the server about the one task once"
    );
}

// 10. A tenant is (issuer, tenant); no tenant is nobody's tenant.

#[tokio::test]
async fn admin_cancel_needs_the_owners_issuer_and_a_tenant() {
    const ISSUER_B: &str = "https://idp-b.test";
    const ADMIN: &str = "lifeguard:tasks:admin";
    let spec = format!(
        "      - issuer: {ISSUER_B}\n        jwksFile: {}\n  tasks:\n    adminCancelScope: {ADMIN}\n    minPollInterval: 50ms\n",
        fixture("keys/issuer-b-jwks.json").display()
    );
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let of_b = |u: User| {
        u.token_of_issuer(
            ISSUER_B,
            &fixture("keys/issuer-b-ed25519.pem"),
            "test-b-ed-1",
        )
    };
    let owner = User::new("alice", "t1", "console").token();
    let tenantless_owner = User::new("solo", "", "console").token();
    let task = support::create_task(&client, &owner, "slow_compute", json!({"seconds": 60})).await;
    let tenantless_task = support::create_task(
        &client,
        &tenantless_owner,
        "slow_compute",
        json!({"seconds": 60}),
    )
    .await;
    let unknown = format!("lgt_{}", "Q".repeat(32));

    let admin_of_b = of_b(User::new("ops", "t1", "ops-cli").with_scopes(ADMIN));
    // Issuer B's admin is a principal here: its own tasks work.
    support::create_task(&client, &admin_of_b, "slow_compute", json!({"seconds": 60})).await;
    let tenantless_admin = User::new("root", "", "ops-cli").with_scopes(ADMIN).token();
    let reference = client.cancel_task(&admin_of_b, &unknown).await;
    assert_eq!(
        (reference.status, reference.error_code()),
        (400, Some(-32602))
    );
    for (who, admin, id, owner) in [
        ("same tid, other issuer", &admin_of_b, &task, &owner),
        (
            "tenant-less admin, tenant-less owner",
            &tenantless_admin,
            &tenantless_task,
            &tenantless_owner,
        ),
    ] {
        let denied = client.cancel_task(admin, id).await;
        assert_eq!(denied.status, reference.status, "{who}: {denied:?}");
        assert_eq!(
            denied.body_without_id(),
            reference.body_without_id(),
            "{who}: the uniform Task not found"
        );
        let still = client.get_task(owner, id).await;
        assert_eq!(still.result()["status"], "working", "{who}: {still:?}");
    }
    // The same tid under the owner's issuer is the owner's tenant: its admin may cancel.
    let admin_of_a = User::new("ops", "t1", "ops-cli").with_scopes(ADMIN).token();
    let cancelled = client.cancel_task(&admin_of_a, &task).await;
    assert_eq!(cancelled.result(), &json!({"resultType": "complete"}));
}

// 11. Answers to input requests the gate has not decided never reach the server.

#[tokio::test]
async fn an_answer_to_an_undecided_sampling_request_is_not_forwarded() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();
    let mut meta = request_meta(capabilities(true));
    meta["io.modelcontextprotocol/clientCapabilities"]["sampling"] = json!({});
    let reply = client
        .request(
            "tools/call",
            json!({"name": "summarize_with_sampling", "arguments": {"text": "numbers"}, "_meta": meta}),
        )
        .token(&token)
        .send()
        .await;
    let task = reply.result()["taskId"]
        .as_str()
        .expect("a task")
        .to_owned();
    // The server asks for a sample; the client never saw that request (no tasks/get).
    let asked = support::eventually(WAIT, async || {
        let tasks = upstream_tasks(&server).await;
        (tasks.first()?.1 == "input_required").then_some(())
    })
    .await;
    assert!(asked.is_some(), "the server never asked for input");
    let forged = json!({"role": "assistant", "model": "m",
                        "content": {"type": "text", "text": "forged summary"}});
    let update = client
        .request(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {"sample-1": forged}}),
        )
        .token(&token)
        .send()
        .await;
    assert_eq!(update.status, 200, "{update:?}");
    assert_eq!(update.result()["resultType"], "complete", "{update:?}");
    let forwarded: Vec<Received> = server
        .received()
        .await
        .into_iter()
        .filter(|r| !r.body()["params"]["inputResponses"]["sample-1"].is_null())
        .collect();
    assert!(
        forwarded.is_empty(),
        "the answer reached the server: {forwarded:?}"
    );
    assert!(
        !server
            .debug("/_example/tasks")
            .await
            .to_string()
            .contains("completed"),
        "the task did not complete with the forged sample"
    );
}

// Input requests inside a CreateTaskResult pass the capability gate too.

#[tokio::test]
async fn a_task_born_asking_for_sampling_never_shows_the_request() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();
    let reply = client
        .call_tool(
            &token,
            "rogue_reply",
            json!({"kind": "task_asking_for_sampling"}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let created = reply.result();
    assert_eq!(created["resultType"], "task", "{reply:?}");
    assert!(created.get("inputRequests").is_none(), "{reply:?}");
    assert!(!reply.raw.contains("rogue prompt"), "{reply:?}");
    // Sampling cannot be declined: the task failed at birth, and says why.
    assert_eq!(created["status"], "failed", "{reply:?}");
    let task = created["taskId"].as_str().unwrap();
    let read = client.get_task(&token, task).await;
    assert_eq!(read.result()["status"], "failed", "{read:?}");
    assert_eq!(read.result()["error"]["data"]["reason"], "no_exception");
    sidecar
        .audit_event(|e| e["event"] == "capability.rejected")
        .await
        .expect("the refusal is audited");
}

// An upstream task ID belongs to one owner.

#[tokio::test]
async fn an_upstream_task_of_another_owner_is_never_handed_out() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = alice().token();
    let other_tenant = User::new("alice", "tenant-b", "console").token();
    let same = json!({"kind": "same_task_for_everyone"});
    let first = client.call_tool(&alice, "rogue_reply", same.clone()).await;
    assert_eq!(first.result()["resultType"], "task", "{first:?}");
    let mine = first.result()["taskId"].as_str().unwrap().to_owned();
    // Another owner handed the same upstream task: refused, nothing of it shown.
    let theirs = client
        .call_tool(&other_tenant, "rogue_reply", same.clone())
        .await;
    assert_eq!(theirs.status, 502, "{theirs:?}");
    assert_eq!(theirs.error_code(), Some(-32603), "{theirs:?}");
    assert!(!theirs.raw.contains(&mine) && !theirs.raw.contains("rogue-shared-task"));
    assert_eq!(
        sidecar.anomalies("upstream_task_of_another_owner").await,
        1.0
    );
    // The same owner asking again gets the task it already has.
    let again = client.call_tool(&alice, "rogue_reply", same).await;
    assert_eq!(again.result()["taskId"], mine.as_str(), "{again:?}");
}
