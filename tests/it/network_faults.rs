//! Network faults, black box: the sidecars, their MCP servers, a PostgreSQL server of the test's
//! own and the control plane on separate addresses in network namespaces (`support::netns`),
//! with the links between them cut, delayed and made lossy (netem) while a load runs, and
//! PostgreSQL restarted mid-run; plus a SQLite ledger whose disk fills up. The invariants: no
//! acknowledged task lost, no task served to anyone but its owner, creation fails closed while
//! the ledger is out of reach (never a task upstream without a ledger row) and recovers
//! after, a sidecar cut from its control plane keeps enforcing what it had, a partitioned home
//! replica costs a retryable 503. Tests skip (loudly) only where the kernel refuses
//! namespaces, and fail then under `CI`.

use crate::support;

mod control_plane;
mod disk_full;
mod hop;
mod ledger;

use std::time::Duration;

use serde_json::json;
use support::McpClient;

/// The policy of every scenario: write_rows as a task, polls every 10 ms, room for the load.
const SPEC: &str = "  tasks:\n    tools: [write_rows, slow_compute]\n    minPollInterval: 10ms\n    concurrency: {perPrincipal: 500, perTenant: 500, perClient: 500, perServer: 500}\n";

/// Longest a single request may take before the test calls it hung (a guard against hangs,
/// not a timing check).
const HANG: Duration = Duration::from_secs(60);

/// A task a client was told about: its ID, its owner's token, the other user's token.
#[derive(Clone, Debug)]
struct Acked {
    id: String,
    label: String,
    owner: String,
    other: String,
}

/// `write_rows` of `count` rows labelled `label` through `client`; `Ok(id)` when the answer
/// acknowledged a task, `Err(reply)` otherwise. A request that does not answer at all within
/// [`HANG`] fails the test.
async fn create(
    client: &McpClient,
    token: &str,
    label: &str,
) -> Result<String, support::client::Reply> {
    let reply = tokio::time::timeout(
        HANG,
        client.call_tool(
            token,
            "write_rows",
            json!({"count": 2, "intervalMs": 5, "label": label}),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("creating {label} hung for {HANG:?}"));
    match reply.result()["taskId"].as_str() {
        Some(id) if reply.status == 200 => Ok(id.to_owned()),
        _ => Err(reply),
    }
}

/// `request`'s answer; a request that does not answer within [`HANG`] fails the test as hung.
async fn answered<T>(what: &str, request: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG, request)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer for {HANG:?} (hung)"))
}

/// How a creation was refused while the ledger was out of reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// Before anything reached the server: the retryable 503.
    Retryable,
    /// After the server accepted the task, which the ledger then could not record: cancelled
    /// at the server, and said so (a 503 without retry advice: the server may have started).
    NotRecorded,
}

/// Asserts that `reply` refused a creation in one of the two honest ways (never with a task ID)
/// and says which.
fn refusal(reply: &support::client::Reply, what: &str) -> Refusal {
    if reply.body["error"]["message"]
        == "The task could not be recorded, so it was cancelled at the MCP server, which may have started its work"
    {
        assert_eq!(reply.status, 503, "{what}: {reply:?}");
        assert!(
            reply.body["error"]["data"]["retryable"].is_null(),
            "{what}: {reply:?}"
        );
        assert!(
            reply.headers.get("retry-after").is_none(),
            "{what}: {reply:?}"
        );
        assert!(reply.result().get("taskId").is_none(), "{what}: {reply:?}");
        Refusal::NotRecorded
    } else {
        reply.assert_retryable_503(what);
        Refusal::Retryable
    }
}

/// Every acknowledged task: its owner reads it to the end through `clients` (any of them), and
/// the other user is told "Task not found" by every client.
async fn owners_only_and_none_lost(clients: &[McpClient], acked: &[Acked]) {
    for (n, task) in acked.iter().enumerate() {
        let client = &clients[n % clients.len()];
        let done = support::eventually(Duration::from_secs(30), async || {
            let read = client.get_task(&task.owner, &task.id).await;
            assert_ne!(
                read.status, 404,
                "acknowledged task lost: {task:?} {read:?}"
            );
            assert!(
                read.body.get("error").is_none() || read.status == 503,
                "acknowledged task {task:?} not served to its owner: {read:?}"
            );
            let status = read.result()["status"].as_str().map(str::to_owned);
            (status.as_deref() == Some("completed")).then_some(read)
        })
        .await;
        assert!(done.is_some(), "{task:?} never completed for its owner");
        for other in clients {
            let read = other.get_task(&task.other, &task.id).await;
            assert_eq!(
                read.body["error"]["message"], "Task not found",
                "a task served to someone not its owner: {task:?} {read:?}"
            );
        }
    }
}
