//! Cancellation that tells the truth: a cancelled task reads `cancelled` only once the server
//! confirms it stopped; until then it keeps its quota slot and says the cancellation is
//! pending; work that finishes anyway is recorded as finished; a server that never confirms
//! gets the task ended as unconfirmed after `--cancel-confirm-timeout`.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::{ExampleServer, McpClient, Sidecar, SidecarOptions, User};

const SPEC: &str = "  tasks:\n    concurrency: {perPrincipal: 1}\n    minPollInterval: 1ms\n";
const WAIT: Duration = Duration::from_secs(20);

async fn start(confirm_timeout: &str) -> (ExampleServer, Sidecar, McpClient) {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: SPEC.into(),
            args: vec!["--cancel-confirm-timeout".into(), confirm_timeout.into()],
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    (server, sidecar, client)
}

/// The example server's view of its only task.
async fn upstream_task(server: &ExampleServer) -> serde_json::Value {
    server.debug("/_example/tasks").await[0].clone()
}

fn events(sidecar: &Sidecar) -> Vec<String> {
    sidecar
        .audit()
        .iter()
        .filter(|e| e["event"].as_str().is_some_and(|n| n.starts_with("task.")))
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_cooperative_server_confirms_and_the_task_reads_cancelled() {
    let (server, sidecar, client) = start("1m").await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "write_rows",
        json!({"count": 1000, "intervalMs": 20, "label": "coop"}),
    )
    .await;
    let ack = client.cancel_task(&alice, &id).await;
    assert_eq!(ack.result(), &json!({"resultType": "complete"}));
    // The server stopped and said so before the acknowledgement: the task reads cancelled.
    let read = client.get_task(&alice, &id).await;
    assert_eq!(read.result()["status"], "cancelled", "{read:?}");
    assert_eq!(read.result()["statusMessage"], "Cancelled by its owner");
    assert_eq!(upstream_task(&server).await["status"], "cancelled");
    let trail = sidecar
        .audit_events_when(2, |e| {
            e["event"] == "task.cancel_requested" || e["event"] == "task.cancelled"
        })
        .await;
    let names: Vec<_> = trail.iter().map(|e| e["event"].clone()).collect();
    assert_eq!(
        names,
        ["task.cancel_requested", "task.cancelled"],
        "{trail:?}"
    );
    // The slot is free again.
    support::create_task(&client, &alice, "write_rows", json!({"count": 1})).await;
}

#[tokio::test]
async fn until_the_server_confirms_the_task_holds_its_slot_and_work_that_finishes_is_recorded() {
    let (server, sidecar, client) = start("1m").await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "write_rows",
        json!({"count": 40, "intervalMs": 25, "label": "stubborn", "ignoreCancel": true}),
    )
    .await;
    let ack = client.cancel_task(&alice, &id).await;
    assert_eq!(ack.result(), &json!({"resultType": "complete"}));
    // Not cancelled: the worker ignored it and is still writing.
    let read = client.get_task(&alice, &id).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");
    let message = read.result()["statusMessage"].as_str().unwrap_or_default();
    assert!(message.contains("cancellation requested"), "{message}");
    let upstream = upstream_task(&server).await;
    assert!(
        upstream["ignoredCancels"].as_u64() >= Some(1),
        "{upstream}\n{}",
        sidecar.logs()
    );
    // Its quota slot is still held: the next creation is refused.
    let refused = client
        .call_tool(&alice, "write_rows", json!({"count": 1}))
        .await;
    assert_eq!(refused.status, 429, "{refused:?}");
    // The work finished anyway, and that is what the task says.
    let done = support::eventually(WAIT, async || {
        let r = client.get_task(&alice, &id).await;
        (r.result()["status"] != "working").then_some(r)
    })
    .await
    .expect("the task ends");
    assert_eq!(done.result()["status"], "completed", "{done:?}");
    assert_eq!(server.rows_labelled("stubborn").await.len(), 40);
    let names = events(&sidecar);
    assert!(
        names.contains(&"task.cancel_requested".to_owned()),
        "{names:?}"
    );
    assert!(names.contains(&"task.completed".to_owned()), "{names:?}");
    assert!(!names.contains(&"task.cancelled".to_owned()), "{names:?}");
}

#[tokio::test]
async fn a_server_that_never_confirms_gets_the_task_ended_as_unconfirmed() {
    let (server, sidecar, client) = start("2s").await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "write_rows",
        json!({"count": 100000, "intervalMs": 50, "label": "never", "ignoreCancel": true}),
    )
    .await;
    client.cancel_task(&alice, &id).await;
    let ended = support::eventually(WAIT, async || {
        let r = client.get_task(&alice, &id).await;
        (r.result()["status"] != "working").then_some(r)
    })
    .await
    .expect("the sidecar stops waiting");
    assert_eq!(ended.result()["status"], "cancelled", "{ended:?}");
    let message = ended.result()["statusMessage"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Cancelled by its owner") && message.contains("did not confirm"),
        "{message}"
    );
    let unconfirmed = sidecar
        .audit_event(|e| e["event"] == "task.cancel_unconfirmed")
        .await
        .expect("task.cancel_unconfirmed audited");
    assert_eq!(unconfirmed["reason"], "owner_cancel");
    // The sidecar asked more than once before it gave up (the outbox retries).
    assert!(
        upstream_task(&server).await["ignoredCancels"].as_u64() >= Some(2),
        "{}",
        upstream_task(&server).await
    );
    // Its slot is free now.
    support::create_task(&client, &alice, "write_rows", json!({"count": 1})).await;
    assert!(!events(&sidecar).contains(&"task.cancelled".to_owned()));
}

#[tokio::test]
async fn a_poll_in_flight_when_the_deadline_cancels_reads_the_deadline_not_a_plain_cancel() {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: "  tasks:\n    deadline: {default: 1s}\n    minPollInterval: 1ms\n".into(),
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    let alice = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "write_rows",
        json!({"count": 1000, "intervalMs": 50, "slowPolls": true}),
    )
    .await;
    // The poll was read from the ledger before the deadline; the server answers it only once
    // the deadline's cancel reached it, with its own plain "cancelled". The sidecar records
    // the end it asked for.
    let read = client.get_task(&alice, &id).await;
    assert_eq!(read.result()["status"], "failed", "{read:?}");
    let message = read.result()["statusMessage"].as_str().unwrap_or_default();
    assert!(message.starts_with("Deadline exceeded"), "{read:?}");
    assert_eq!(upstream_task(&server).await["status"], "cancelled");
    let ended = sidecar
        .audit_event(|e| e["event"] == "task.cancelled")
        .await
        .expect("the end is audited");
    assert_eq!(ended["reason"], "deadline", "{ended}");
}
