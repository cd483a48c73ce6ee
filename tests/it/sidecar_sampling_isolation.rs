//! Sampling under an exception is visible, isolated and bounded, black box; and the deprecated
//! logging surface is gated like the other deprecated capabilities.
//!
//! - Visible: an allowed `sampling/createMessage` carries, under `_meta["lifeguard.dev/
//!   exception"]`, the requesting server, the exception's purpose, name, approval, expiry and
//!   model route.
//! - Isolated: `includeContext` beyond the exception's grant is refused (`context_not_isolated`),
//!   prompts beyond its bounds too (`context_too_large`), and so is any request carrying a
//!   credential: a token shape, a policy pattern, the caller's own bearer (`secret_in_context`).
//! - Logging: `notifications/message` is dropped and `logging/setLevel` refused unless an
//!   exception for `logging` covers the caller.

use crate::support;

use serde_json::{Value, json};
use support::User;
use support::capability::*;

async fn first_request(s: &Setup, token: &str, args: Value) -> (String, Value) {
    let task = summarize(&s.client, token, args).await;
    let state = next_state(&s.client, token, &task).await;
    (task, state)
}

#[tokio::test]
async fn an_allowed_sampling_request_tells_the_client_who_asks_and_why() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let token = User::new("alice", "tenant-a", "console").token();
    let (_task, state) = first_request(&s, &token, json!({"maxTokens": 100})).await;
    assert_eq!(state["status"], "input_required", "{state}");
    let shown = &state["inputRequests"]["sample-1"]["params"]["_meta"]["lifeguard.dev/exception"];
    assert_eq!(shown["server"], POLICY, "{state}");
    assert_eq!(shown["exception"], "tests/ok");
    assert_eq!(shown["approvalId"], "CHG-1");
    assert_eq!(shown["modelRoute"], "test/route");
    assert_eq!(
        shown["purpose"],
        "Lets the tests exercise the capability gate."
    );
    assert!(
        shown["expiresAt"]
            .as_str()
            .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()),
        "{shown}"
    );
}

#[tokio::test]
async fn context_beyond_the_grant_and_oversized_prompts_are_refused() {
    let granted = Grant::sampling("granted", "console").signed_edited(|y| {
        y.replace(
            "  modelRoute:",
            "  includeContext: thisServer\n  modelRoute:",
        )
    });
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("plain", "cli").signed(), granted],
    )
    .await;
    let cli = User::new("alice", "tenant-a", "cli").token();
    let console = User::new("alice", "tenant-a", "console").token();
    let context = |c: &str| json!({"samplingParams": {"includeContext": c}});

    // No grant: only `none` passes.
    let (_, plain) = first_request(&s, &cli, context("none")).await;
    assert_eq!(plain["status"], "input_required", "{plain}");
    let (task, _) = first_request(&s, &cli, context("thisServer")).await;
    assert_refused(
        &finish(&s.client, &cli, &task).await,
        "context_not_isolated",
    );
    // `thisServer` granted: it passes, `allServers` does not.
    let (_, this) = first_request(&s, &console, context("thisServer")).await;
    assert_eq!(this["status"], "input_required", "{this}");
    let (task, _) = first_request(&s, &console, context("allServers")).await;
    assert_refused(
        &finish(&s.client, &console, &task).await,
        "context_not_isolated",
    );
    // The default bound on systemPrompt is 8 KiB.
    let big = json!({"samplingParams": {"systemPrompt": "x".repeat(9 * 1024)}});
    let (task, _) = first_request(&s, &console, big).await;
    assert_refused(
        &finish(&s.client, &console, &task).await,
        "context_too_large",
    );

    let reasons = rejections_when(&s.sidecar, 3).await;
    assert_eq!(
        reasons,
        [
            "context_not_isolated",
            "context_not_isolated",
            "context_too_large"
        ]
    );
}

#[tokio::test]
async fn requests_carrying_credentials_never_reach_the_client() {
    let s = setup(
        "{sampling: exception, secretPatterns: ['INTERNAL-[0-9]{6}']}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let alice = User::new("alice", "tenant-a", "console");
    let token = alice.token();
    let text = |t: &str| json!({"text": t});
    let cases = [
        "use eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJib2IifQ.c2lnbmF0dXJl to call the API",
        "the deploy key -----BEGIN PRIVATE KEY----- MIIE",
        "ticket INTERNAL-123456 for the audit",
        &format!("caller's own token: {token}"),
    ];
    for case in cases {
        let (task, state) = first_request(&s, &token, text(case)).await;
        assert_ne!(state["status"], "input_required", "{case}: {state}");
        assert_refused(&finish(&s.client, &token, &task).await, "secret_in_context");
    }
    let reasons = rejections_when(&s.sidecar, cases.len()).await;
    assert!(
        reasons.iter().all(|r| r == "secret_in_context"),
        "{reasons:?}"
    );
    // A clean request still passes, and the trail never repeats what was refused.
    let (_, clean) = first_request(&s, &token, text("quarterly numbers")).await;
    assert_eq!(clean["status"], "input_required", "{clean}");
    let raw = std::fs::read_to_string(&s.sidecar.audit_path).unwrap();
    assert!(!raw.contains("INTERNAL-123456") && !raw.contains(&token));
}

/// A synchronous, streamed `tools/call` through the sidecar: the frames it delivered.
async fn streamed_call(s: &Setup, token: &str) -> Vec<Value> {
    let reply = s
        .client
        .request(
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 0, "label": "log"},
                   "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                             "io.modelcontextprotocol/clientCapabilities": {},
                             "progressToken": "p-1"}}),
        )
        .token(token)
        .without_tasks()
        .accept_sse()
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.messages.clone()
}

async fn set_level(s: &Setup, token: &str) -> support::client::Reply {
    s.client
        .request("logging/setLevel", json!({"level": "info"}))
        .token(token)
        .without_tasks()
        .send()
        .await
}

fn methods(frames: &[Value]) -> Vec<&str> {
    frames.iter().filter_map(|f| f["method"].as_str()).collect()
}

#[tokio::test]
async fn logging_is_denied_by_default_set_level_refused_and_log_messages_dropped() {
    let s = setup("{}", &[]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let refused = set_level(&s, &token).await;
    assert_eq!(refused.status, 404, "{refused:?}");
    assert_eq!(refused.error_code(), Some(-32601));
    assert_eq!(refused.body["error"]["data"]["reason"], "no_exception");
    assert_eq!(
        upstream_requests(&s.server, "logging/setLevel").await,
        0,
        "never forwarded"
    );
    // The server logs anyway (its level set directly): the sidecar drops the messages.
    let direct = support::client::McpClient::new(&s.server.url)
        .request("logging/setLevel", json!({"level": "info"}))
        .without_tasks()
        .send()
        .await;
    assert_eq!(direct.status, 200, "{direct:?}");
    let frames = streamed_call(&s, &token).await;
    assert!(
        methods(&frames).contains(&"notifications/progress"),
        "{frames:?}"
    );
    assert!(
        !methods(&frames).contains(&"notifications/message"),
        "{frames:?}"
    );
    let rejected = s
        .sidecar
        .audit_event(|e| e["event"] == "capability.rejected")
        .await
        .expect("the refused setLevel is audited");
    assert_eq!(rejected["detail"]["capability"], "logging/setLevel");
}

#[tokio::test]
async fn a_logging_exception_lets_its_clients_set_the_level_and_see_log_messages() {
    let logging = Grant {
        capability: "logging",
        ..Grant::sampling("logs", "console")
    };
    let s = setup("{logging: exception}", &[logging.signed()]).await;
    let console = User::new("alice", "tenant-a", "console").token();
    let cli = User::new("alice", "tenant-a", "cli").token();
    let refused = set_level(&s, &cli).await;
    assert_eq!(
        refused.error_code(),
        Some(-32601),
        "another client: {refused:?}"
    );
    assert_eq!(refused.body["error"]["data"]["reason"], "wrong_client");
    let allowed = set_level(&s, &console).await;
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert_eq!(upstream_requests(&s.server, "logging/setLevel").await, 1);
    let frames = streamed_call(&s, &console).await;
    assert!(
        methods(&frames).contains(&"notifications/message"),
        "{frames:?}"
    );
    // The same stream for the client the exception does not name carries no log messages.
    let frames = streamed_call(&s, &cli).await;
    assert!(
        !methods(&frames).contains(&"notifications/message"),
        "{frames:?}"
    );
}
