//! Result minimization (`tasks.results`), black box: what the server returned is redacted,
//! bounded or not kept at all before the ledger stores it, and every read returns exactly what
//! was stored.

use crate::support;

use serde_json::json;
use support::User;

const TOOLS: &str = "  tasks:\n    minPollInterval: 10ms\n    tools: [slow_compute]\n";

async fn completed_result(spec: &str, label: &str) -> (serde_json::Value, support::Sidecar) {
    let (_server, sidecar, client) = support::start_behind_sidecar(spec).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 0, "label": label}),
    )
    .await;
    let done = client.wait_terminal(&token, &id, 10_000).await;
    assert_eq!(done.result()["status"], "completed", "{done:?}");
    // A second read returns the same stored result.
    let again = client.get_task(&token, &id).await;
    assert_eq!(again.result()["result"], done.result()["result"]);
    (done.result().clone(), sidecar)
}

#[tokio::test]
async fn masks_and_pointers_apply_before_the_result_is_stored_and_every_read_sees_that() {
    let spec = format!(
        "{TOOLS}    results:\n      redact:\n        mask: ['acct-\\d+']\n        drop: [/isError]\n"
    );
    let (done, sidecar) = completed_result(&spec, "for acct-1234 and acct-99").await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        "computed for [redacted] and [redacted]"
    );
    assert_eq!(done["result"].get("isError"), None, "dropped by pointer");
    let completed = sidecar
        .audit_event(|e| e["event"] == "task.completed")
        .await
        .expect("task.completed audited");
    assert_eq!(completed["detail"]["resultMinimized"]["masked"], 2);
    assert_eq!(completed["detail"]["resultMinimized"]["dropped"], 1);
    let audit = serde_json::to_string(&sidecar.audit()).unwrap();
    assert!(
        !audit.contains("acct-1234"),
        "the audit never carries the masked text"
    );
}

#[tokio::test]
async fn a_result_over_max_bytes_is_withheld_as_an_error_result() {
    let spec = format!("{TOOLS}    results: {{maxBytes: 120}}\n");
    let (done, _sidecar) = completed_result(&spec, &"x".repeat(500)).await;
    assert_eq!(done["result"]["isError"], true, "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("limit of 120 (tasks.results.maxBytes)"),
        "{text}"
    );
    assert!(!text.contains("xxxxxxxx"), "{text}");
}

#[tokio::test]
async fn status_only_keeps_no_result_and_says_so() {
    let spec = format!("{TOOLS}    results: {{mode: statusOnly}}\n");
    let (done, _sidecar) = completed_result(&spec, "quarterly numbers").await;
    assert_eq!(done["result"]["content"], json!([]));
    let message = done["statusMessage"].as_str().unwrap_or_default();
    assert!(message.contains("statusOnly"), "{done}");
    assert!(!done.to_string().contains("quarterly numbers"), "{done}");
}

#[tokio::test]
async fn without_results_rules_the_result_is_kept_as_the_server_gave_it() {
    let (done, _sidecar) = completed_result(TOOLS, "acct-1234").await;
    assert_eq!(done["result"]["content"][0]["text"], "computed acct-1234");
    assert_eq!(done["result"]["isError"], false);
}

// Every other text the server supplies gets the same masks: a working or failed task's
// statusMessage, a failed task's error, a synchronous result (also the pointers and
// `statusOnly`), and every frame of a streamed synchronous answer. What the ledger stores is
// the masked text.

const MASKED_TOOLS: &str = "  tasks:\n    minPollInterval: 10ms\n    tools: [slow_compute, failing_job, confirm_action]\n    results:\n      redact:\n        mask: ['acct-\\d+']\n";

/// `(status_message, payload)` of every task the SQLite ledger holds.
fn ledger_texts(sidecar: &support::Sidecar) -> Vec<(Option<String>, Option<String>)> {
    let db = rusqlite::Connection::open_with_flags(
        &sidecar.ledger_path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("ledger opens");
    let mut rows = db
        .prepare("SELECT status_message, payload FROM tasks")
        .unwrap();
    rows.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test]
async fn a_working_tasks_status_message_is_masked_for_the_client_and_in_the_ledger() {
    let (_server, sidecar, client) = support::start_behind_sidecar(MASKED_TOOLS).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 30, "status": "reconciling acct-1234"}),
    )
    .await;
    let seen = support::eventually(std::time::Duration::from_secs(10), async || {
        let reply = client.get_task(&token, &id).await;
        assert!(!reply.raw.contains("acct-1234"), "{}", reply.raw);
        reply.result()["statusMessage"]
            .as_str()
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
    })
    .await;
    assert_eq!(seen.as_deref(), Some("reconciling [redacted]"));
    // The poll that reported it also cached it in the ledger: masked.
    let stored = ledger_texts(&sidecar);
    assert_eq!(
        stored,
        vec![(Some("reconciling [redacted]".to_owned()), None)],
        "{stored:?}"
    );
}

#[tokio::test]
async fn a_failed_tasks_status_message_and_error_are_masked_for_the_client_and_in_the_ledger() {
    let (_server, sidecar, client) = support::start_behind_sidecar(MASKED_TOOLS).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &token,
        "failing_job",
        json!({"afterMs": 0, "message": "card acct-5678 declined"}),
    )
    .await;
    let done = client.wait_terminal(&token, &id, 10_000).await;
    assert_eq!(done.result()["status"], "failed", "{done:?}");
    assert_eq!(done.result()["statusMessage"], "card [redacted] declined");
    assert!(!done.raw.contains("acct-5678"), "{}", done.raw);
    assert!(
        done.raw.matches("card [redacted] declined").count() >= 2,
        "the statusMessage and the error, masked: {}",
        done.raw
    );
    let stored = ledger_texts(&sidecar);
    assert_eq!(stored.len(), 1, "{stored:?}");
    let (message, payload) = &stored[0];
    assert_eq!(message.as_deref(), Some("card [redacted] declined"));
    let error: serde_json::Value = serde_json::from_str(payload.as_deref().unwrap()).unwrap();
    assert_eq!(error["message"], "card [redacted] declined", "{error}");
}

#[tokio::test]
async fn input_requests_reach_the_client_masked_and_their_method_intact() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(MASKED_TOOLS).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &token,
        "confirm_action",
        json!({"action": "close acct-1234"}),
    )
    .await;
    let waiting = support::eventually(std::time::Duration::from_secs(10), async || {
        let reply = client.get_task(&token, &id).await;
        assert!(!reply.raw.contains("acct-1234"), "{}", reply.raw);
        (reply.result()["status"] == "input_required").then_some(reply)
    })
    .await
    .expect("the task asks for input");
    let request = &waiting.result()["inputRequests"]["confirm-1"];
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert_eq!(request["params"]["message"], "Really close [redacted]?");
}

#[tokio::test]
async fn a_synchronous_result_gets_the_pointers_and_masks() {
    let spec = format!("{MASKED_TOOLS}        drop: [/isError]\n");
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let reply = client
        .call_tool(&token, "greet", json!({"name": "acct-1234"}))
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.result()["content"][0]["text"], "Hello, [redacted]!");
    assert_eq!(reply.result().get("isError"), None, "dropped by pointer");
    assert!(!reply.raw.contains("acct-1234"), "{}", reply.raw);
}

#[tokio::test]
async fn status_only_withholds_a_synchronous_calls_output_too() {
    let spec = format!("{TOOLS}    results: {{mode: statusOnly}}\n");
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let reply = client
        .call_tool(&token, "greet", json!({"name": "quarterly numbers"}))
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let result = reply.result();
    assert!(!reply.raw.contains("quarterly numbers"), "{}", reply.raw);
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("statusOnly"), "{result}");
    assert_eq!(
        result["isError"], false,
        "whether it failed is status: kept"
    );
}

#[tokio::test]
async fn every_frame_of_a_streamed_synchronous_answer_is_masked() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(MASKED_TOOLS).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let mut meta = support::client::request_meta(support::client::capabilities(false));
    meta["progressToken"] = json!("p-acct-1");
    let reply = client
        .request(
            "tools/call",
            json!({"name": "slow_compute",
                   "arguments": {"seconds": 0, "label": "acct-1234", "status": "reading acct-5678"},
                   "_meta": meta}),
        )
        .token(&token)
        .without_tasks()
        .accept_sse()
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let progress: Vec<&serde_json::Value> = reply
        .messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(
        progress
            .iter()
            .any(|m| m["params"]["message"] == "reading [redacted]"),
        "{:?}",
        reply.messages
    );
    assert!(
        progress
            .iter()
            .all(|m| m["params"]["progressToken"] == "p-acct-1"),
        "the client's progress token is never masked: {progress:?}"
    );
    assert_eq!(
        reply.body["result"]["content"][0]["text"],
        "computed [redacted]"
    );
    assert!(!reply.raw.contains("acct-1234"), "{}", reply.raw);
    assert!(!reply.raw.contains("acct-5678"), "{}", reply.raw);
}

#[tokio::test]
async fn without_results_rules_the_ledger_keeps_the_servers_text() {
    // The ledger check above can see a leak: without rules the text is stored as given.
    let (_server, sidecar, client) = support::start_behind_sidecar(TOOLS).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 30, "status": "reconciling acct-1234"}),
    )
    .await;
    let seen = support::eventually(std::time::Duration::from_secs(10), async || {
        let reply = client.get_task(&token, &id).await;
        reply.result()["statusMessage"].as_str().map(str::to_owned)
    })
    .await;
    assert_eq!(seen.as_deref(), Some("reconciling acct-1234"));
    assert_eq!(
        ledger_texts(&sidecar),
        vec![(Some("reconciling acct-1234".to_owned()), None)]
    );
}
