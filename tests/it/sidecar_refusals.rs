//! Refusals a client can act on, black box: every refusal the sidecar originates carries the
//! same structured `error.data` (`reason`, `remediation`, `retryAfterMs` with a `Retry-After`
//! that agrees, the policy where naming it discloses nothing, the SEP-2643 envelope where a
//! client can remedy an authorization denial), and the uniform "Task not found" stays byte for
//! byte the same whether the task is someone else's, its object is denied, or it never existed.
//! docs/sidecar.md, "Refusals", is the table these tests hold the sidecar to.

use crate::support;
use crate::support::{alice, bob};

use std::time::Duration;

use serde_json::{Value, json};
use support::User;
use support::authorizer::Authorizer;
use support::client::Reply;
use support::listen::ListenStream;

/// `namespace/name` of the tests' policy (`support::policy_yaml`).
const POLICY: &str = "tests/test-policy";

const SPEC: &str = r#"  tasks:
    tools: [slow_compute, failing_job]
    requiredScopes: {failing_job: [jobs:run]}
    minPollInterval: 1500ms
    concurrency: {perPrincipal: 1}
  listen:
    notifications: [toolsListChanged]
    maxStreamsPerPrincipal: 1
"#;

fn data(reply: &Reply) -> &Value {
    &reply.body["error"]["data"]
}

fn retry_after(reply: &Reply) -> Option<&str> {
    reply
        .headers
        .get("retry-after")
        .map(|v| v.to_str().unwrap())
}

fn challenge(reply: &Reply) -> &str {
    reply
        .headers
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap())
        .unwrap_or_default()
}

fn greet(client: &support::McpClient) -> support::client::RequestBuilder {
    client.request(
        "tools/call",
        json!({"name": "greet", "arguments": {"name": "x"}}),
    )
}

#[tokio::test]
async fn a_token_refused_says_reauthenticate_names_no_policy_and_keeps_its_challenge() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;

    let missing = greet(&client).send().await;
    assert_eq!(missing.status, 401, "{missing:?}");
    assert!(
        challenge(&missing).starts_with("Bearer resource_metadata="),
        "{missing:?}"
    );
    // Refused before the body is read: there is no id to echo.
    assert_eq!(
        missing.body,
        json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": -31401,
            "message": "Authentication required: send a bearer token",
            "data": {"reason": "missing_token", "remediation": "reauthenticate"}}})
    );
    assert_eq!(retry_after(&missing), None);

    let now = jiff::Timestamp::now().as_second();
    let expired_token = alice().token_with(|c| {
        c["iat"] = json!(now - 7200);
        c["nbf"] = json!(now - 7200);
        c["exp"] = json!(now - 3600);
    });
    let expired = greet(&client).token(&expired_token).send().await;
    assert_eq!(expired.status, 401, "{expired:?}");
    assert!(challenge(&expired).contains("The access token expired"));
    assert_eq!(
        data(&expired),
        &json!({"reason": "expired", "remediation": "reauthenticate"})
    );

    // Every other failure is one answer, byte for byte: nothing helps probe keys or issuers.
    let garbage = greet(&client).token("not-a-jwt").send().await;
    let wrong_audience = alice().token_with(|c| c["aud"] = json!("https://elsewhere.test"));
    let elsewhere = greet(&client).token(&wrong_audience).send().await;
    assert_eq!(garbage.status, 401, "{garbage:?}");
    assert_eq!(
        data(&garbage),
        &json!({"reason": "invalid_token", "remediation": "reauthenticate"})
    );
    assert_eq!(garbage.raw, elsewhere.raw);
    assert_eq!(challenge(&garbage), challenge(&elsewhere));
    assert!(challenge(&garbage).contains("error=\"invalid_token\""));

    assert!(
        server.requests("tools/call").await.is_empty(),
        "nothing refused reached the server"
    );
}

#[tokio::test]
async fn a_missing_scope_keeps_its_challenge_and_carries_the_sep_2643_envelope() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let expected = json!({
        "reason": "insufficient_scope",
        "remediation": "reauthenticate",
        "scope": "jobs:run",
        "policy": POLICY,
        "authorization": {"reason": "insufficient_authorization"},
    });

    let refused = client
        .request(
            "tools/call",
            json!({"name": "failing_job", "arguments": {}}),
        )
        .token(&alice().token())
        .id(json!("scoped"))
        .send()
        .await;
    assert_eq!(refused.status, 403, "{refused:?}");
    let header = challenge(&refused);
    assert!(
        header.contains("error=\"insufficient_scope\"") && header.contains("scope=\"jobs:run\""),
        "{header}"
    );
    assert_eq!(refused.body["id"], "scoped");
    assert_eq!(refused.error_code(), Some(-31403));
    assert_eq!(data(&refused), &expected);
    assert_eq!(retry_after(&refused), None);

    // The owner's own task, read with a token that lost the scope: the same refusal (ownership
    // is checked first, so nobody else ever sees it).
    let scoped = alice().with_scopes("jobs:run").token();
    let id = support::create_task(&client, &scoped, "failing_job", json!({})).await;
    let read = client.get_task(&alice().token(), &id).await;
    assert_eq!(read.status, 403, "{read:?}");
    assert_eq!(data(&read), &expected);
    // Someone else asking about it gets the uniform answer, not the scope.
    let foreign = client.get_task(&bob().token(), &id).await;
    assert_eq!(foreign.status, 400, "{foreign:?}");
    assert_eq!(
        data(&foreign),
        &json!({"reason": "task_not_found", "remediation": "none"})
    );
}

#[tokio::test]
async fn a_request_that_can_never_pass_says_none() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();

    // Origin is judged before the token: the policy is not named.
    let origin = client
        .request("tools/list", json!({}))
        .token(&token)
        .header("origin", "https://evil.example")
        .send()
        .await;
    assert_eq!(origin.status, 403, "{origin:?}");
    assert_eq!(
        data(&origin),
        &json!({"reason": "bad_origin", "remediation": "none"})
    );

    // Protocol violations of an authenticated caller name the policy.
    let removed = client
        .request("tasks/list", json!({}))
        .token(&token)
        .send()
        .await;
    assert_eq!(removed.status, 404, "{removed:?}");
    assert_eq!(
        data(&removed),
        &json!({"reason": "removed_method", "remediation": "none", "policy": POLICY})
    );
    let old = client
        .request("tools/list", json!({}))
        .token(&token)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await;
    assert_eq!(old.status, 400, "{old:?}");
    // What the violation said before stays beside the refusal.
    assert_eq!(
        data(&old),
        &json!({"reason": "unsupported_version", "remediation": "none", "policy": POLICY,
                "requested": "2025-11-25", "supported": ["2026-07-28"]})
    );
    let envelope = client
        .request("tools/list", json!({}))
        .token(&token)
        .send_raw("{\"jsonrpc\": \"2.0\", \"id\": 1, ".into())
        .await;
    assert_eq!(envelope.status, 400, "{envelope:?}");
    assert_eq!(
        data(&envelope),
        &json!({"reason": "invalid_envelope", "remediation": "none", "policy": POLICY})
    );
    for reply in [&origin, &removed, &old, &envelope] {
        assert_eq!(retry_after(reply), None, "{reply:?}");
    }

    // Listen is not the only way to learn the filter is wrong: the same shape.
    let filter = client
        .request(
            "subscriptions/listen",
            json!({"notifications": {"noSuchNotification": true}}),
        )
        .token(&token)
        .accept_sse()
        .send()
        .await;
    assert_eq!(filter.status, 400, "{filter:?}");
    assert_eq!(
        data(&filter),
        &json!({"reason": "invalid_filter", "remediation": "none", "policy": POLICY})
    );
}

#[tokio::test]
async fn a_full_quota_suggests_a_wait_and_the_header_agrees() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = alice().token();
    support::create_task(&client, &token, "slow_compute", json!({"seconds": 30})).await;
    let over = client
        .call_tool(&token, "slow_compute", json!({"seconds": 30}))
        .await;
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(over.error_code(), Some(-31429));
    // One poll interval (1.5 s): a suggestion, the slot frees when a task ends.
    assert_eq!(
        data(&over),
        &json!({"reason": "quota", "remediation": "retry", "retryAfterMs": 1500,
                "scope": "principal", "policy": POLICY})
    );
    assert_eq!(retry_after(&over), Some("2"), "whole seconds, rounded up");

    let mut first = ListenStream::open(
        &client.url,
        &token,
        json!("s1"),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    first
        .next(Duration::from_secs(5))
        .await
        .expect("the first stream is acknowledged");
    let second = client
        .request(
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true}}),
        )
        .token(&token)
        .id(json!("s2"))
        .accept_sse()
        .send()
        .await;
    assert_eq!(second.status, 429, "{second:?}");
    assert_eq!(
        data(&second),
        &json!({"reason": "stream_quota", "remediation": "retry", "retryAfterMs": 1500,
                "scope": "streams", "policy": POLICY})
    );
    assert_eq!(retry_after(&second), Some("2"));
}

#[tokio::test]
async fn a_refused_capability_says_which_exception_to_ask_for_only_where_one_would_help() {
    // Under `deny` (the default) no exception helps.
    let denied = support::capability::setup("{}", &[]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let set_level = |s: &support::capability::Setup| {
        s.client
            .request("logging/setLevel", json!({"level": "info"}))
            .token(&token)
            .without_tasks()
    };
    let refused = set_level(&denied).send().await;
    assert_eq!(refused.status, 404, "{refused:?}");
    assert_eq!(refused.error_code(), Some(-32601));
    assert_eq!(
        data(&refused),
        &json!({"reason": "no_exception", "remediation": "none", "policy": POLICY})
    );

    // Under `exception` a CapabilityException for `logging` on this policy would allow it.
    let by_exception = support::capability::setup("{logging: exception}", &[]).await;
    let refused = set_level(&by_exception).send().await;
    assert_eq!(refused.status, 404, "{refused:?}");
    assert_eq!(
        data(&refused),
        &json!({
            "reason": "no_exception",
            "remediation": "requestException",
            "exceptionCapability": "logging",
            "policy": POLICY,
            "authorization": {
                "reason": "insufficient_authorization",
                "remediationHints": [{"type": "lifeguard.dev/capability-exception",
                                      "capability": "logging", "policy": POLICY}],
            },
        })
    );
    assert_eq!(retry_after(&refused), None);
}

const ALICE_ON_X: &str = "grants:\n  - {subject: alice, issuer: 'https://idp.test', tenant: tenant-a, type: project, object: proj-x}\n";
const NOBODY: &str = "grants: []\n";

#[tokio::test]
async fn the_three_uniform_denials_stay_byte_identical_and_name_nothing() {
    let mut authorizer = Authorizer::start(ALICE_ON_X);
    let spec = format!(
        r#"  tasks:
    minPollInterval: 10ms
    tools: [slow_compute]
    objects:
      authorizer: {{url: "{}", cacheTtl: 0s}}
      tools:
        slow_compute: {{pointer: /label, type: project}}
"#,
        authorizer.url
    );
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 30, "label": "proj-x"}),
    )
    .await;
    let ask = |token: String, task: String| {
        let client = client.clone();
        async move {
            client
                .request("tasks/get", json!({"taskId": task}))
                .token(&token)
                .id(json!(7))
                .send()
                .await
        }
    };

    let foreign = ask(bob().token(), id.clone()).await;
    let unknown = ask(token.clone(), format!("lgt_{}", "Q".repeat(32))).await;
    authorizer.set_grants(NOBODY);
    let object_denied = ask(token.clone(), id.clone()).await;

    assert_eq!(
        foreign.body,
        json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "Task not found",
               "data": {"reason": "task_not_found", "remediation": "none"}}})
    );
    let header_names = |r: &Reply| {
        let mut names: Vec<String> = r
            .headers
            .keys()
            .filter(|n| n.as_str() != "date")
            .map(|n| n.to_string())
            .collect();
        names.sort();
        names
    };
    for (what, reply) in [("unknown", &unknown), ("object denied", &object_denied)] {
        assert_eq!(reply.status, foreign.status, "{what}: {reply:?}");
        assert_eq!(reply.raw, foreign.raw, "{what}: byte for byte");
        assert_eq!(header_names(reply), header_names(&foreign), "{what}");
    }
    assert_eq!(retry_after(&foreign), None);

    // Refused at creation the caller learns nothing it did not send: the policy is named.
    let created = client
        .call_tool(
            &token,
            "slow_compute",
            json!({"seconds": 0, "label": "proj-x"}),
        )
        .await;
    assert_eq!(created.status, 403, "{created:?}");
    assert_eq!(created.error_code(), Some(-31403));
    assert_eq!(
        data(&created),
        &json!({"reason": "object_denied", "remediation": "none", "policy": POLICY})
    );

    // No decision to be had: retry, for the creator and for the task's owner alike.
    authorizer.stop();
    let unavailable = json!({"reason": "authorizer_unavailable", "remediation": "retry",
                             "retryAfterMs": 1000, "policy": POLICY});
    let create = client
        .call_tool(
            &token,
            "slow_compute",
            json!({"seconds": 0, "label": "proj-x"}),
        )
        .await;
    assert_eq!(create.status, 503, "{create:?}");
    assert_eq!(data(&create), &unavailable);
    assert_eq!(retry_after(&create), Some("1"));
    let read = ask(token.clone(), id.clone()).await;
    assert_eq!(read.status, 503, "{read:?}");
    assert_eq!(data(&read), &unavailable);
    assert_eq!(retry_after(&read), Some("1"));
    // The stranger still gets the uniform answer, unchanged.
    assert_eq!(ask(bob().token(), id).await.raw, foreign.raw);
}

#[tokio::test]
async fn a_task_the_sidecar_ended_at_its_deadline_says_so_in_its_error() {
    let (_server, _sidecar, client) = support::start_behind_sidecar(
        "  tasks:\n    deadline: {default: 1s}\n    minPollInterval: 10ms\n",
    )
    .await;
    let token = alice().token();
    let id = support::create_task(&client, &token, "slow_compute", json!({"seconds": 30})).await;
    let done = client.wait_terminal(&token, &id, 15_000).await;
    assert_eq!(done.result()["status"], "failed", "{done:?}");
    assert_eq!(
        done.result()["error"]["data"],
        json!({"reason": "deadline", "remediation": "none"}),
        "{done:?}"
    );
}
