//! Interop with software nobody here wrote: FastMCP's server (Tasks extension, in-memory
//! backend) behind the sidecar, driven by FastMCP's own task client with tokens minted by the
//! test harness.

mod support;

use serde_json::json;
use support::python::{FastMcpServer, run_fastmcp_client};
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
