//! Identity at minute forty, black box: under `upstream.identity: delegation` the server never
//! sees the user's token, only short-lived assertions the sidecar signs for one task (verified
//! here with the keys the sidecar publishes on its admin port), and `tasks.identityLease`
//! cancels a task whose owner stopped presenting a valid token.

use crate::support;

use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde_json::{Value, json};
use support::User;

const DELEGATING: &str = r#"  upstream: {identity: delegation}
  tasks:
    minPollInterval: 10ms
    tools: [slow_compute]
    requiredScopes: {slow_compute: [reports:run]}
    retention: {defaultTtl: 3h, maxTtl: 3h}
    deadline: {default: 2h, max: 2h}
"#;

/// The assertions the server received for `mcp_method`, oldest first.
async fn assertions(server: &support::ExampleServer, mcp_method: &str) -> Vec<String> {
    server
        .requests(mcp_method)
        .await
        .iter()
        .filter_map(|r| r["delegation"].as_str().map(str::to_owned))
        .collect()
}

/// Verifies `token` as the protected server would: against the sidecar's published keys.
async fn verify(sidecar: &support::Sidecar, token: &str) -> Value {
    let jwks: Value = reqwest::get(format!("{}/.well-known/jwks.json", sidecar.admin))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kid = decode_header(token).unwrap().kid.expect("kid");
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .unwrap_or_else(|| panic!("kid {kid} not in {jwks}"));
    assert_eq!(
        (jwk["kty"].as_str(), jwk["crv"].as_str()),
        (Some("OKP"), Some("Ed25519"))
    );
    let key = DecodingKey::from_ed_components(jwk["x"].as_str().unwrap()).unwrap();
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.set_audience(&[support::RESOURCE]);
    validation.set_issuer(&["lifeguard:sidecar:tests/test-policy"]);
    decode::<Value>(token, &key, &validation)
        .unwrap_or_else(|e| panic!("the assertion does not verify: {e}"))
        .claims
}

#[tokio::test]
async fn the_server_gets_a_verifiable_assertion_for_the_task_and_never_the_users_token() {
    let (server, sidecar, client) = support::start_behind_sidecar(DELEGATING).await;
    let alice = User::new("alice", "tenant-a", "console").with_scopes("reports:run files:read");
    let token = alice.token();
    let id = support::create_task(&client, &token, "slow_compute", json!({"seconds": 60})).await;
    // Past minPollInterval, so the poll is asked of the server (not answered from the ledger).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let poll = client.get_task(&token, &id).await;
    assert_eq!(poll.status, 200, "{poll:?}");

    let created = sidecar
        .audit_event(|e| e["event"] == "task.created")
        .await
        .expect("task.created");
    for method in ["tools/call", "tasks/get"] {
        let received = assertions(&server, method).await;
        assert!(!received.is_empty(), "no assertion with {method}");
        for assertion in received {
            assert_ne!(
                assertion, token,
                "the user's token never reaches the server"
            );
            let claims = verify(&sidecar, &assertion).await;
            assert_eq!(claims["sub"], "alice");
            assert_eq!(claims["orig_iss"], support::ISSUER);
            assert_eq!(claims["act"]["sub"], "lifeguard:sidecar:tests/test-policy");
            assert_eq!(claims["tenant"], "tenant-a");
            assert_eq!(claims["client_id"], "console");
            assert_eq!(claims["scope"], "reports:run", "only the tool's scopes");
            assert_eq!(claims["tool"], "slow_compute");
            assert_eq!(
                claims["lifeguard_task"], created["task"],
                "bound to the task"
            );
            let (iat, exp) = (
                claims["iat"].as_i64().unwrap(),
                claims["exp"].as_i64().unwrap(),
            );
            assert!(exp > iat && exp - iat <= 300, "short-lived: {claims}");
        }
    }
    let delegated = sidecar
        .audit_event(|e| e["event"] == "task.delegated")
        .await
        .expect("task.delegated");
    assert_eq!(
        delegated["detail"]["actor"],
        "lifeguard:sidecar:tests/test-policy"
    );
    assert_eq!(delegated["detail"]["scopes"], json!(["reports:run"]));

    // The owner comes back with a newer token: the delegation runs longer, audited; the same
    // token again extends nothing.
    let later = alice.token_with(|c| c["exp"] = json!(c["exp"].as_i64().unwrap() + 1800));
    assert_eq!(client.get_task(&later, &id).await.status, 200);
    assert_eq!(client.get_task(&later, &id).await.status, 200);
    let refreshed = sidecar
        .audit_events_when(1, |e| e["event"] == "task.identity_refreshed")
        .await;
    assert_eq!(refreshed.len(), 1, "{refreshed:?}");
    assert_eq!(
        refreshed[0]["detail"]["previousUntil"],
        delegated["detail"]["delegatedUntil"]
    );
    assert_ne!(
        refreshed[0]["detail"]["delegatedUntil"],
        delegated["detail"]["delegatedUntil"]
    );
}

#[tokio::test]
async fn a_task_whose_owner_stops_presenting_a_token_is_cancelled_when_its_lease_ends() {
    let spec =
        "  tasks:\n    minPollInterval: 10ms\n    identityLease: 2s\n    tools: [slow_compute]\n";
    let (_server, sidecar, client) = support::start_behind_sidecar(spec).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let abandoned =
        support::create_task(&client, &token, "slow_compute", json!({"seconds": 60})).await;
    let kept = support::create_task(&client, &token, "slow_compute", json!({"seconds": 60})).await;

    // The owner keeps polling one task and never comes back for the other.
    let cancelled = support::poll_until(
        Duration::from_secs(20),
        Duration::from_millis(200),
        async || {
            let poll = client.get_task(&token, &kept).await;
            assert_eq!(
                poll.result()["status"],
                "working",
                "the polled task lives on: {poll:?}"
            );
            sidecar
                .audit()
                .into_iter()
                .find(|e| e["event"] == "task.cancelled" && e["reason"] == "identity_lease_expired")
        },
    )
    .await
    .expect("the abandoned task is cancelled when its lease ends");
    assert_eq!(cancelled["tool"], "slow_compute");

    let ended = client.get_task(&token, &abandoned).await;
    assert_eq!(ended.result()["status"], "cancelled", "{ended:?}");
    let message = ended.result()["statusMessage"].as_str().unwrap_or_default();
    assert!(message.contains("tasks.identityLease"), "{message}");
    let still = client.get_task(&token, &kept).await;
    assert_eq!(still.result()["status"], "working", "{still:?}");
}

#[tokio::test]
async fn an_assertion_says_which_key_a_dpop_bound_caller_proved() {
    let (server, sidecar, _client) = support::start_behind_sidecar(DELEGATING).await;
    let mut client = support::dpop::DpopClient::start(&sidecar.url).await;
    let alice = User::new("alice", "tenant-a", "console").with_scopes("reports:run");
    let token = client.token_for(&alice);
    let created = client
        .call(
            &token,
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 60}}),
        )
        .await;
    assert_eq!(created.status, 200, "{created:?}");
    let received = assertions(&server, "tools/call").await;
    let claims = verify(&sidecar, received.last().expect("an assertion")).await;
    assert_eq!(claims["orig_cnf"], json!({"jkt": client.jkt}));
    assert_eq!(claims["sub"], "alice");
}
