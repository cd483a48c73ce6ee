//! Refusals anyone can cause are audited without letting an attacker write the trail: one line
//! per kind and period (exact counts in metrics), per principal once authenticated; a foreign
//! Origin gets a JSON-RPC error like every other refusal.

use crate::support;

use serde_json::json;
use support::User;

const SPEC: &str = "  tasks: {}\n";

/// `lifeguard_denials_total{reason="<reason>"}`.
async fn denials(sidecar: &support::Sidecar, reason: &str) -> f64 {
    sidecar
        .metric(&format!("lifeguard_denials_total{{reason=\"{reason}\"}}"))
        .await
}

#[tokio::test]
async fn unauthenticated_floods_write_one_audit_line_and_exact_metrics() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    for _ in 0..25 {
        let r = client
            .request("tools/call", json!({"name": "greet", "arguments": {}}))
            .send()
            .await;
        assert_eq!(r.status, 401);
    }
    assert_eq!(denials(&sidecar, "missing_token").await, 25.0);
    // A later, different refusal is written, and proves the earlier lines have landed.
    let bad = client
        .call_tool("not-a-jwt", "greet", json!({"name": "x"}))
        .await;
    assert_eq!(bad.status, 401);
    sidecar
        .audit_event(|e| e["event"] == "auth.denied" && e["reason"] == "malformed_token")
        .await
        .expect("malformed token audited");
    let missing = sidecar
        .audit()
        .into_iter()
        .filter(|e| e["event"] == "auth.denied" && e["reason"] == "missing_token")
        .count();
    assert_eq!(missing, 1, "one line per kind and period");
}

#[tokio::test]
async fn protocol_refusals_are_audited_per_principal() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let mallory = User::new("mallory", "tenant-a", "console").token();
    let alice = User::new("alice", "tenant-a", "console").token();
    for token in [&mallory, &mallory, &mallory, &alice] {
        // tasks/list was removed in 2026-07-28: a protocol refusal.
        let r = client
            .request("tasks/list", json!({}))
            .token(token)
            .send()
            .await;
        assert_eq!(r.status, 404, "{r:?}");
    }
    let alice_line = sidecar
        .audit_event(|e| e["event"] == "request.denied" && e["subject"] == "alice")
        .await
        .expect("alice's refusal audited");
    assert_eq!(alice_line["reason"], "removed_method");
    let mallory_lines = sidecar
        .audit()
        .into_iter()
        .filter(|e| e["event"] == "request.denied" && e["subject"] == "mallory")
        .count();
    assert_eq!(mallory_lines, 1, "rate-limited per principal");
    assert_eq!(denials(&sidecar, "removed_method").await, 4.0);
}

#[tokio::test]
async fn a_foreign_origin_gets_a_json_rpc_error_and_is_audited() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let r = client
        .request("tools/list", json!({}))
        .token(&alice)
        .header("origin", "https://evil.example")
        .send()
        .await;
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.error_code(), Some(-32600), "{r:?}");
    assert_eq!(r.body["jsonrpc"], "2.0");
    sidecar
        .audit_event(|e| e["event"] == "request.denied" && e["reason"] == "bad_origin")
        .await
        .expect("origin refusal audited");
}
