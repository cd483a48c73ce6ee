//! An audit trail that cannot be written: under `audit.onFailure: failClosed` (the default) the
//! sidecar refuses new tasks and fails `/ready` while writes fail; under `failOpen` it serves
//! and only counts the loss. The sink is `/dev/full`, where every write fails with ENOSPC.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::{ExampleServer, McpClient, Sidecar, SidecarOptions, User};

/// A sidecar whose `--audit-file` is `/dev/full`.
async fn with_unwritable_audit(spec: &str) -> (ExampleServer, Sidecar, McpClient) {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: spec.into(),
            ..Default::default()
        },
    )
    .await;
    let audit_path = sidecar.audit_path.clone();
    let mut sidecar = sidecar;
    sidecar.kill_hard();
    std::fs::remove_file(&audit_path).ok();
    std::os::unix::fs::symlink("/dev/full", &audit_path).expect("symlink to /dev/full");
    let sidecar = sidecar.restart_after_kill().await;
    let client = McpClient::new(&sidecar.url);
    // Something to audit: a request without a token.
    let denied = client.call_tool("", "greet", json!({"name": "x"})).await;
    assert_eq!(denied.status, 401);
    (server, sidecar, client)
}

#[tokio::test]
async fn fail_closed_refuses_new_tasks_and_fails_readiness() {
    let (_server, sidecar, client) = with_unwritable_audit("  tasks: {}\n").await;
    let unready = support::eventually(Duration::from_secs(10), async || {
        let r = reqwest::get(format!("{}/ready", sidecar.admin))
            .await
            .ok()?;
        (r.status() == 503).then_some(r.text().await.unwrap_or_default())
    })
    .await
    .expect("/ready fails while the trail cannot be written");
    assert!(unready.contains("audit"), "{unready}");
    assert!(sidecar.metric("lifeguard_audit_write_errors_total").await >= 1.0);

    let alice = User::new("alice", "tenant-a", "console").token();
    let refused = client
        .call_tool(&alice, "write_rows", json!({"count": 1}))
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.error_code(), Some(-32603));
    // What creates nothing to audit still works.
    let tools = client
        .request("tools/list", json!({}))
        .token(&alice)
        .send()
        .await;
    assert_eq!(tools.status, 200, "{tools:?}");
}

#[tokio::test]
async fn fail_open_serves_and_counts_the_loss() {
    let (_server, sidecar, client) =
        with_unwritable_audit("  tasks: {}\n  audit: {onFailure: failOpen}\n").await;
    support::eventually(Duration::from_secs(10), async || {
        (sidecar.metric("lifeguard_audit_write_errors_total").await >= 1.0).then_some(())
    })
    .await
    .expect("the failed write is counted");
    let ready = reqwest::get(format!("{}/ready", sidecar.admin))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let alice = User::new("alice", "tenant-a", "console").token();
    support::create_task(&client, &alice, "write_rows", json!({"count": 1})).await;
}
