//! Interop with software nobody here wrote: FastMCP's server (Tasks extension, in-memory
//! backend) behind the sidecar, driven by FastMCP's own task client with tokens minted by the
//! test harness; and FastMCP's answers to the sidecar's capability refusals (policy default:
//! sampling and roots denied), see docs/interop.md "Refusing sampling and roots".

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::client::{Reply, TASKS_EXTENSION, request_meta};
use support::python::{FastMcpServer, run_fastmcp_client, run_fastmcp_script};
use support::{McpClient, Sidecar, SidecarOptions, User};

const LENIENT: &str = "  tasks: {}\n  protocol:\n    allowMissingNameHeader: true\n";

#[tokio::test]
async fn fastmcp_client_drives_a_fastmcp_task_to_completion_through_the_sidecar() {
    let server = FastMcpServer::start().await;
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: LENIENT.into(),
            ..Default::default()
        },
    )
    .await;
    let alice = User::new("alice", "tenant-a", "interop");
    let (ok, lines, stderr) = run_fastmcp_client(&sidecar.url, &alice.token()).await;
    assert!(ok, "client failed:\n{stderr}\n{}", sidecar.logs());
    let task_id = lines[0]["taskId"].as_str().unwrap().to_owned();
    assert!(task_id.starts_with("lgt_"), "{lines:?}");
    assert_eq!(lines[1]["status"], "working");
    assert_eq!(lines[2]["data"], 42);

    let events: Vec<String> = sidecar
        .audit()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    for expected in ["task.created", "task.completed", "task.result_read"] {
        assert!(
            events.iter().any(|e| e == expected),
            "{expected} missing: {events:?}"
        );
    }

    // FastMCP without authentication shares one task key space; through the sidecar another
    // principal sees the finished task exactly like one that never existed.
    let client = McpClient::new(&sidecar.url);
    let bob = User::new("bob", "tenant-a", "interop").token();
    let stolen = client.get_task(&bob, &task_id).await;
    let nothing = client
        .get_task(&bob, &format!("lgt_{}", "B".repeat(32)))
        .await;
    assert_eq!(stolen.status, 400);
    assert_eq!(stolen.body_without_id(), nothing.body_without_id());
    let own = client.get_task(&alice.token(), &task_id).await;
    assert_eq!(own.result()["status"], "completed");
    assert_eq!(
        own.result()["result"]["structuredContent"]["result"],
        json!(42)
    );
}

#[tokio::test]
async fn without_the_compatibility_switch_a_missing_mcp_name_is_refused() {
    let server = FastMcpServer::start().await;
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: "  tasks: {}\n".into(),
            ..Default::default()
        },
    )
    .await;
    let (ok, lines, stderr) =
        run_fastmcp_client(&sidecar.url, &User::new("alice", "t", "interop").token()).await;
    assert!(
        !ok,
        "expected the strict default to refuse tasks/get without Mcp-Name: {lines:?}"
    );
    assert!(stderr.contains("Missing Mcp-Name header"), "{stderr}");
    // The task was created (tools/call carries Mcp-Name); only the follow-up was refused.
    assert_eq!(lines.len(), 1, "{lines:?}");
}

/// FastMCP's client through a per-tool rate limit: the 429 reaches the application as the
/// library's `MCPError` with the structured data intact (`rate_limited`, `retry`, an integer
/// `retryAfterMs`, the policy), and a client that waits that long gets its next call through.
#[tokio::test]
async fn a_fastmcp_client_reads_a_rate_limit_refusal_and_gets_through_after_the_wait() {
    let server = FastMcpServer::start().await;
    let spec = format!(
        "{LENIENT}  rateLimits:\n    tools:\n      echo: {{perPrincipal: {{requestsPerSecond: 0.5, burst: 2}}}}\n"
    );
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec,
            ..Default::default()
        },
    )
    .await;
    let alice = User::new("alice", "tenant-a", "interop");
    let (ok, lines, stderr) =
        run_fastmcp_script("fastmcp_rate_limited.py", &sidecar.url, &alice.token()).await;
    assert!(ok, "client failed:\n{stderr}\n{}", sidecar.logs());
    // The burst passed (a slow machine may see a token refill in between, never fewer).
    let passed = lines.iter().filter(|l| l["event"] == "ok").count();
    assert!(passed >= 2, "{lines:?}");
    let refused = lines
        .iter()
        .find(|l| l["event"] == "refused")
        .unwrap_or_else(|| panic!("no refusal: {lines:?}"));
    assert_eq!(refused["code"], -31430, "{refused}");
    let data = &refused["data"];
    assert_eq!(data["reason"], "rate_limited", "{data}");
    assert_eq!(data["remediation"], "retry", "{data}");
    assert_eq!(data["policy"], POLICY, "{data}");
    let wait = data["retryAfterMs"]
        .as_u64()
        .expect("an integer retryAfterMs");
    assert!(wait > 0 && wait <= 2_000, "one token at 0.5/s: {data}");
    let last = lines.last().expect("lines");
    assert_eq!(last["event"], "ok_after_wait", "{lines:?}");
    assert_eq!(last["data"], "after the wait", "{lines:?}");
}

/// The policy the sidecar runs under, as refusals name it.
const POLICY: &str = "tests/test-policy";

/// FastMCP's `fastmcp_server.py` behind a sidecar whose policy has no `capabilities` (sampling
/// and roots denied, the default), and a client of the sidecar.
async fn behind_the_default_policy() -> (FastMcpServer, Sidecar, McpClient) {
    let server = FastMcpServer::start().await;
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: LENIENT.into(),
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    (server, sidecar, client)
}

/// A client that supports sampling and roots (so only the policy refuses them), with or
/// without the Tasks extension. Its requests accept event streams too, as FastMCP requires
/// (406 otherwise).
fn meta(tasks: bool) -> Value {
    let mut caps = json!({"sampling": {}, "roots": {}});
    if tasks {
        caps["extensions"] = json!({TASKS_EXTENSION: {}});
    }
    request_meta(caps)
}

async fn call(client: &McpClient, token: &str, tool: &str, tasks: bool) -> Reply {
    client
        .request(
            "tools/call",
            json!({"name": tool, "arguments": {}, "_meta": meta(tasks)}),
        )
        .token(token)
        .accept_sse()
        .send()
        .await
}

/// Asserts that no message of `reply` shows the client an input request.
fn never_asked(reply: &Reply) {
    assert!(
        !reply.raw.contains("inputRequests") && !reply.raw.contains("input_required"),
        "the client saw an input request: {reply:?}"
    );
}

/// The message of a refused sampling request.
fn refusal_message() -> String {
    format!(
        "The MCP server asked for sampling/createMessage, which the Lifeguard policy {POLICY} does not allow"
    )
}

/// Polls `tasks/get` (declaring sampling and roots) until the task ends; asserts no poll showed
/// the client an input request.
async fn task_end(client: &McpClient, token: &str, task: &str) -> Value {
    support::eventually(Duration::from_secs(20), async || {
        let reply = client
            .request("tasks/get", json!({"taskId": task, "_meta": meta(true)}))
            .token(token)
            .accept_sse()
            .send()
            .await;
        assert_eq!(reply.status, 200, "{reply:?}");
        never_asked(&reply);
        let state = reply.result().clone();
        let status = state["status"].as_str().unwrap_or_default();
        ["completed", "failed", "cancelled"]
            .contains(&status)
            .then_some(state)
    })
    .await
    .expect("the task ends within 20 s")
}

/// A task of `tool`; asserts the creation showed no input request.
async fn start_task(client: &McpClient, token: &str, tool: &str) -> String {
    let created = call(client, token, tool, true).await;
    assert_eq!(created.status, 200, "{created:?}");
    assert_eq!(created.result()["resultType"], "task", "{created:?}");
    never_asked(&created);
    created.result()["taskId"].as_str().unwrap().to_owned()
}

/// The reasons of the `capability.rejected` events for `capability`, once `count` were written.
async fn rejections(sidecar: &Sidecar, capability: &str, count: usize) -> Vec<String> {
    sidecar
        .audit_events_when(count, |e| {
            e["event"] == "capability.rejected" && e["detail"]["capability"] == capability
        })
        .await
        .iter()
        .map(|e| e["reason"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_refused_roots_request_in_a_synchronous_call_is_answered_with_no_roots() {
    let (_server, sidecar, client) = behind_the_default_policy().await;
    let token = User::new("alice", "tenant-a", "interop").token();
    let reply = call(&client, &token, "ask_roots", false).await;
    assert_eq!(reply.status, 200, "{reply:?}\n{}", sidecar.logs());
    never_asked(&reply);
    assert_eq!(reply.result()["resultType"], "complete", "{reply:?}");
    // FastMCP's tool reports what it received: an empty ListRootsResult, from the sidecar.
    assert_eq!(
        reply.result()["content"][0]["text"],
        r#"ListRootsResult {"roots":[]}"#,
        "{reply:?}"
    );
    assert_eq!(rejections(&sidecar, "roots", 1).await, ["no_exception"]);
}

#[tokio::test]
async fn a_refused_sampling_request_in_a_synchronous_call_ends_it_with_the_documented_error() {
    let (_server, sidecar, client) = behind_the_default_policy().await;
    let token = User::new("alice", "tenant-a", "interop").token();
    let reply = call(&client, &token, "ask_sampling", false).await;
    assert_eq!(reply.status, 200, "{reply:?}\n{}", sidecar.logs());
    never_asked(&reply);
    assert!(reply.body.get("result").is_none(), "{reply:?}");
    support::capability::assert_refusal_error(&reply.body["error"], "no_exception");
    assert_eq!(rejections(&sidecar, "sampling", 1).await, ["no_exception"]);
    let failed = sidecar
        .audit_event(|e| e["event"] == "request.failed")
        .await
        .expect("request.failed audited");
    assert_eq!(failed["reason"], "capability_refused");
    assert_eq!(failed["detail"]["capability"], "sampling/createMessage");
}

#[tokio::test]
async fn a_task_whose_roots_request_is_refused_completes_with_no_roots() {
    let (_server, sidecar, client) = behind_the_default_policy().await;
    let token = User::new("alice", "tenant-a", "interop").token();
    let task = start_task(&client, &token, "ask_roots_task").await;
    let done = task_end(&client, &token, &task).await;
    assert_eq!(done["status"], "completed", "{done}\n{}", sidecar.logs());
    let text = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(text, r#"ListRootsResult {"roots":[]}"#, "{done}");
    assert_eq!(rejections(&sidecar, "roots", 1).await, ["no_exception"]);
    assert!(
        sidecar
            .audit_event(|e| e["event"] == "task.completed")
            .await
            .is_some()
    );
}

#[tokio::test]
async fn a_task_whose_sampling_request_is_refused_fails_with_the_documented_error() {
    let (_server, sidecar, client) = behind_the_default_policy().await;
    let token = User::new("alice", "tenant-a", "interop").token();
    let task = start_task(&client, &token, "ask_sampling_task").await;
    let done = task_end(&client, &token, &task).await;
    assert_eq!(done["status"], "failed", "{done}\n{}", sidecar.logs());
    assert_eq!(done["statusMessage"], json!(refusal_message()), "{done}");
    support::capability::assert_refusal_error(&done["error"], "no_exception");
    assert!(done.get("result").is_none(), "{done}");
    // Audited in order: the request, its rejection, the task's end.
    let failed = sidecar
        .audit_event(|e| e["event"] == "task.failed")
        .await
        .expect("task.failed audited");
    assert_eq!(failed["reason"], "capability_refused");
    let trail: Vec<String> = sidecar
        .audit()
        .iter()
        .filter(|e| e["task"] == failed["task"])
        .filter_map(|e| e["event"].as_str().map(str::to_owned))
        .filter(|e| e.starts_with("capability.") || e == "task.failed")
        .collect();
    assert_eq!(
        trail,
        ["capability.requested", "capability.rejected", "task.failed"]
    );
    assert_eq!(rejections(&sidecar, "sampling", 1).await, ["no_exception"]);
    // The end is recorded: a later read is the same failure.
    assert_eq!(task_end(&client, &token, &task).await, done);
}
