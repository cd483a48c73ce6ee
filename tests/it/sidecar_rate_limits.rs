//! Request-rate limits (`spec.rateLimits`), black box: a request over a limit is refused with
//! 429, `Retry-After` and the structured data a client acts on, never reaches the server, and
//! takes no token; limits count per principal, tenant, client and server, per method class and
//! per tool; refusals are counted exactly in a metric and audited once per principal and
//! minute. Across replicas on PostgreSQL, in `scale_out_rate_limits`.
//!
//! Rates are fractional and tiny (0.001 a second: a token per 1000 s), so no token refills
//! during a test and every count below is exact, however slow the machine.

use crate::support;

use serde_json::{Value, json};
use support::client::Reply;
use support::{ExampleServer, McpClient, Sidecar, User, alice, bob};

const POLICY: &str = "tests/test-policy";

/// One token per 1000 s and a burst of `burst`.
fn bucket(burst: u32) -> String {
    format!("{{requestsPerSecond: 0.001, burst: {burst}}}")
}

async fn greet(client: &McpClient, user: &User) -> Reply {
    client
        .call_tool(&user.token(), "greet", json!({"name": "x"}))
        .await
}

/// Asserts `reply` is the rate-limit refusal: 429, a whole-second `Retry-After` agreeing with
/// `retryAfterMs`, and the structured data.
fn assert_rate_limited(reply: &Reply) {
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_eq!(reply.error_code(), Some(-31430), "{reply:?}");
    let data = &reply.body["error"]["data"];
    assert_eq!(data["reason"], "rate_limited", "{reply:?}");
    assert_eq!(data["remediation"], "retry", "{reply:?}");
    assert_eq!(data["policy"], POLICY, "{reply:?}");
    let retry_ms = data["retryAfterMs"]
        .as_u64()
        .expect("retryAfterMs is an integer");
    assert!(retry_ms > 0);
    let header: u64 = reply.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in whole seconds");
    assert_eq!(header, retry_ms.div_ceil(1000));
}

async fn metric(sidecar: &Sidecar, sample: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", sidecar.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Over its own limit a principal is refused with everything it needs to retry; the server
/// never sees the refused calls; another principal is not affected.
#[tokio::test]
async fn a_principal_over_its_limit_is_told_when_to_retry_and_the_server_never_sees_it() {
    let spec = format!("  rateLimits:\n    perPrincipal: {}\n", bucket(3));
    let (server, sidecar, client) = support::start_behind_sidecar(&spec).await;
    for _ in 0..3 {
        let reply = greet(&client, &alice()).await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    for _ in 0..4 {
        assert_rate_limited(&greet(&client, &alice()).await);
    }
    assert_eq!(server.requests("tools/call").await.len(), 3);
    // bob has a bucket of his own.
    assert_eq!(greet(&client, &bob()).await.status, 200);

    assert_eq!(
        metric(
            &sidecar,
            "lifeguard_rate_limited_total{scope=\"principal\",reason=\"all\"}"
        )
        .await,
        4.0
    );
    // One audit line for alice's refusals this minute, not one per request.
    let audited: Vec<Value> = sidecar
        .audit()
        .into_iter()
        .filter(|e| e["event"] == "request.denied" && e["reason"] == "rate_limited")
        .collect();
    assert_eq!(audited.len(), 1, "{audited:#?}");
    assert_eq!(audited[0]["subject"], "alice", "{audited:#?}");
    assert_eq!(audited[0]["detail"]["scope"], "principal", "{audited:#?}");
}

/// A refused request takes no token from the buckets that had one: when the server's bucket
/// is empty, alice's own bucket keeps its tokens.
#[tokio::test]
async fn a_refused_request_takes_no_token_and_the_server_scope_counts_everyone() {
    let spec = format!(
        "  rateLimits:\n    perPrincipal: {}\n    perServer: {}\n",
        bucket(2),
        bucket(2)
    );
    let (_server, sidecar, client) = support::start_behind_sidecar(&spec).await;
    assert_eq!(greet(&client, &bob()).await.status, 200);
    assert_eq!(greet(&client, &bob()).await.status, 200);
    // The server's two tokens are spent (by bob): alice is refused, server-wide.
    for _ in 0..3 {
        assert_rate_limited(&greet(&client, &alice()).await);
    }
    assert_eq!(
        metric(
            &sidecar,
            "lifeguard_rate_limited_total{scope=\"server\",reason=\"all\"}"
        )
        .await,
        3.0
    );
    assert_eq!(
        metric(
            &sidecar,
            "lifeguard_rate_limited_total{scope=\"principal\",reason=\"all\"}"
        )
        .await,
        0.0
    );
}

/// Tenant and client scopes count every principal of the tenant or client.
#[tokio::test]
async fn tenants_and_clients_share_their_buckets() {
    let spec = format!("  rateLimits:\n    perTenant: {}\n", bucket(2));
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let carol = User::new("carol", "tenant-b", "console");
    assert_eq!(greet(&client, &alice()).await.status, 200);
    assert_eq!(greet(&client, &bob()).await.status, 200);
    // alice and bob are both of tenant-a: its bucket is empty; carol's tenant is not.
    assert_rate_limited(&greet(&client, &alice()).await);
    assert_eq!(greet(&client, &carol).await.status, 200);

    let spec = format!("  rateLimits:\n    perClient: {}\n", bucket(1));
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let same_client = User::new("dave", "tenant-b", "console");
    let other_client = User::new("erin", "tenant-a", "cli");
    assert_eq!(greet(&client, &alice()).await.status, 200);
    assert_rate_limited(&greet(&client, &same_client).await);
    assert_eq!(greet(&client, &other_client).await.status, 200);
}

/// A tool's limit counts only calls of that tool; a method class's only its methods.
#[tokio::test]
async fn tool_and_method_limits_count_only_what_they_name() {
    let spec = format!(
        "  tasks:\n    tools: [write_rows]\n    minPollInterval: 1ms\n  rateLimits:\n    tools:\n      greet: {{perPrincipal: {}}}\n    methods:\n      taskReads: {{perPrincipal: {}}}\n",
        bucket(1),
        bucket(2)
    );
    let (_server, sidecar, client) = support::start_behind_sidecar(&spec).await;
    assert_eq!(greet(&client, &alice()).await.status, 200);
    assert_rate_limited(&greet(&client, &alice()).await);
    // Other tools and methods are not limited by greet's bucket.
    let id =
        support::create_task(&client, &alice().token(), "write_rows", json!({"count": 1})).await;
    assert_eq!(client.get_task(&alice().token(), &id).await.status, 200);
    assert_eq!(client.get_task(&alice().token(), &id).await.status, 200);
    // Polls have a limit of their own; cancelling is not a read.
    assert_rate_limited(&client.get_task(&alice().token(), &id).await);
    assert_eq!(client.cancel_task(&alice().token(), &id).await.status, 200);
    assert_eq!(
        metric(
            &sidecar,
            "lifeguard_rate_limited_total{scope=\"principal\",reason=\"tool\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &sidecar,
            "lifeguard_rate_limited_total{scope=\"principal\",reason=\"task_reads\"}"
        )
        .await,
        1.0
    );
}

/// Without `rateLimits` nothing is limited (the policy's hash is what it was).
#[tokio::test]
async fn without_rate_limits_nothing_is_limited() {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(&server.url, support::SidecarOptions::default()).await;
    let client = McpClient::new(&sidecar.url);
    for _ in 0..20 {
        assert_eq!(greet(&client, &alice()).await.status, 200);
    }
}
