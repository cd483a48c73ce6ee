//! Result minimization (`tasks.results`), black box: what the server returned is redacted,
//! bounded or not kept at all before the ledger stores it, and every read returns exactly what
//! was stored.

mod support;

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
