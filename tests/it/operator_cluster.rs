//! The whole system with no cluster: the API emulator, the real operator, and real sidecars in
//! cluster mode in front of example MCP servers. A policy applied reaches every sidecar; a
//! spec change changes enforcement everywhere; a PrincipalRevocation (written by hand or from a
//! security event, pushed or polled) cancels the principal's tasks on every sidecar and status
//! reports completion; the operator dying mid-stream leaves enforcement in place.

use crate::support;
use crate::support::{alice, bob};

use std::time::Duration;

use serde_json::{Value, json};
use support::User;
use support::cluster::{APP, Cluster, NS, SetSigner, policy};
use support::eventually;
use support::ssf::{
    ACCOUNT_DISABLED, ACCOUNT_ENABLED, AUDIENCE, SECOND_TRANSMITTER, TRANSMITTER, event_set,
    push_set, revocation_names, two_push_transmitters,
};

const WAIT: Duration = Duration::from_secs(30);
const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

/// A token issued a minute ago (so a revocation "before now" covers it).
fn older_token(user: &User) -> String {
    let now = jiff::Timestamp::now().as_second();
    user.token_with(|c| {
        c["iat"] = json!(now - 60);
        c["nbf"] = json!(now - 65);
    })
}

fn policy_path() -> String {
    format!("/apis/lifeguard.dev/v1alpha1/namespaces/{NS}/mcpserverpolicies/{APP}")
}

fn revocation_path(name: &str) -> String {
    format!("/apis/lifeguard.dev/v1alpha1/principalrevocations/{name}")
}

fn operator_config(poll_endpoint: Option<&str>) -> String {
    let jwks = std::fs::read_to_string(support::fixture("keys/issuer-b-jwks.json")).unwrap();
    let jwks: Value = serde_json::from_str(&jwks).unwrap();
    let delivery = match poll_endpoint {
        Some(endpoint) => {
            format!("delivery: poll\n      pollEndpoint: {endpoint}\n      pollInterval: 1s")
        }
        None => {
            "delivery: push\n      pushAuthorization: {secretName: idp-push, key: token}".into()
        }
    };
    format!(
        "securityEvents:\n  audience: {AUDIENCE}\n  transmitters:\n    - issuer: {TRANSMITTER}\n      jwks: {jwks}\n      {delivery}\n"
    )
}

async fn running_task(cluster: &Cluster, index: usize, token: &str) -> String {
    support::create_task(
        &cluster.members[index].client,
        token,
        "write_rows",
        json!({"count": 100000, "intervalMs": 20, "label": format!("alice-{index}")}),
    )
    .await
}

async fn wait_cancelled(cluster: &Cluster, index: usize, task: &str) {
    let member = &cluster.members[index];
    let token = alice().token();
    let cancelled = eventually(WAIT, async || {
        let r = member.client.get_task(&token, task).await;
        (r.result()["status"] == "cancelled").then_some(())
    })
    .await;
    assert!(
        cancelled.is_some(),
        "task on {} never read cancelled:\n{}",
        member.pod.name,
        member.sidecar.logs()
    );
}

/// Waits until no sidecar runs `slow_compute` as a task any more (the policy lost it).
async fn every_sidecar_stops_running_slow_compute_as_a_task(cluster: &Cluster) {
    for member in &cluster.members {
        let refused = eventually(WAIT, async || {
            let r = member
                .client
                .call_tool(&alice().token(), "slow_compute", json!({"seconds": 0.01}))
                .await;
            (r.status == 200 && r.result()["resultType"] != "task").then_some(())
        })
        .await;
        assert!(
            refused.is_some(),
            "{} still runs slow_compute as a task:\n{}",
            member.pod.name,
            member.sidecar.logs()
        );
    }
}

fn session_revoked_set(jti: &str, subject: &str) -> Value {
    let now = jiff::Timestamp::now().as_second();
    json!({
        "iss": TRANSMITTER, "aud": AUDIENCE, "iat": now, "jti": jti,
        "sub_id": {"format": "iss_sub", "iss": support::ISSUER, "sub": subject},
        "events": {SESSION_REVOKED: {"event_timestamp": now - 1, "initiating_entity": "policy"}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policy_spec_changes_and_revocations_reach_ten_sidecars_and_status_says_so() {
    let cluster = Cluster::start(10, None).await;
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows, slow_compute"))
        .await;
    cluster.all_ready_with("ready: policy").await;
    cluster
        .wait_for(&policy_path(), "all sidecars in sync", |o| {
            o["status"]["sidecarsInSync"] == 10 && o["status"]["matchedPods"] == 10
        })
        .await;

    // Alice runs a task on every sidecar; bob one on the first.
    let token = older_token(&alice());
    let mut tasks = Vec::new();
    for i in 0..10 {
        tasks.push(running_task(&cluster, i, &token).await);
    }
    let bobs = support::create_task(
        &cluster.members[0].client,
        &older_token(&bob()),
        "write_rows",
        json!({"count": 100000, "intervalMs": 20, "label": "bob"}),
    )
    .await;

    // A spec change: slow_compute no longer runs as a task, on every sidecar.
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows"))
        .await;
    every_sidecar_stops_running_slow_compute_as_a_task(&cluster).await;
    let object = cluster
        .wait_for(&policy_path(), "in sync with the new spec", |o| {
            o["status"]["sidecarsInSync"] == 10
                && o["status"]["observedGeneration"] == o["metadata"]["generation"]
                && o["metadata"]["generation"].as_i64() >= Some(2)
        })
        .await;
    let ready = object["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");

    // Alice is revoked by hand: her tasks end everywhere, bob's does not.
    // Covers the minute-old token, not fresh ones.
    let revoked_before = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(5);
    cluster
        .emulator
        .apply_yaml(&format!(
            "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {{name: alice-by-hand}}\nspec:\n  issuer: {}\n  subject: alice\n  revokedBefore: \"{revoked_before}\"\n  reason: sessionRevoked\n  source: {{kind: manual}}\n",
            support::ISSUER
        ))
        .await;
    for (i, task) in tasks.iter().enumerate() {
        wait_cancelled(&cluster, i, task).await;
    }
    let status = cluster
        .wait_for(&revocation_path("alice-by-hand"), "propagated", |o| {
            o["status"]["completedAt"].is_string()
        })
        .await["status"]
        .clone();
    assert_eq!(status["targetSidecars"], 10);
    assert_eq!(status["acknowledgedSidecars"], 10);
    assert_eq!(status["tasksCancelled"], 10);
    assert!(status["propagationMillis"].as_i64().unwrap() >= 0);
    let bob_now = cluster.members[0]
        .client
        .get_task(&bob().token(), &bobs)
        .await;
    assert_eq!(bob_now.result()["status"], "working", "{bob_now:?}");
    // Alice's old token is refused; a fresh one works again (session revocation).
    let refused = cluster.members[3]
        .client
        .call_tool(&token, "write_rows", json!({"count": 1}))
        .await;
    assert_eq!(refused.status, 401, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_security_event_becomes_a_revocation_that_cancels_tasks_and_refusals_name_the_error()
 {
    let cluster = Cluster::start(2, Some(&operator_config(None))).await;
    cluster
        .emulator
        .apply_yaml(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: idp-push, namespace: lifeguard-system}\nstringData: {token: push-secret}\n",
        )
        .await;
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows"))
        .await;
    cluster.all_ready_with("ready: policy").await;
    let token = older_token(&alice());
    let tasks = [
        running_task(&cluster, 0, &token).await,
        running_task(&cluster, 1, &token).await,
    ];

    let signer = SetSigner::default();
    let http = cluster.operator.ca.client();
    let push = |body: String, bearer: Option<&'static str>| {
        let mut request = http
            .post(format!("{}/ssf/push", cluster.operator.url))
            .header("content-type", "application/secevent+jwt")
            .body(body);
        if let Some(b) = bearer {
            request = request.bearer_auth(b);
        }
        request.send()
    };
    let set = signer.sign(
        &session_revoked_set("jti-1", "alice"),
        "test-b-ed-1",
        "secevent+jwt",
    );
    let accepted = push(set.clone(), Some("push-secret")).await.unwrap();
    assert_eq!(accepted.status(), 202, "{}", cluster.operator.logs());
    // 202 means the PrincipalRevocation exists already.
    let revocations = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    let items = revocations["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{revocations}");
    let name = items[0]["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(items[0]["spec"]["subject"], "alice");
    assert_eq!(items[0]["spec"]["source"]["kind"], "securityEvent");
    for (i, task) in tasks.iter().enumerate() {
        wait_cancelled(&cluster, i, task).await;
    }
    cluster
        .wait_for(&revocation_path(&name), "propagated", |o| {
            o["status"]["acknowledgedSidecars"] == 2 && o["status"]["completedAt"].is_string()
        })
        .await;

    // A replay is accepted and changes nothing.
    let replay = push(set, Some("push-secret")).await.unwrap();
    assert_eq!(replay.status(), 202);
    let after = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    assert_eq!(after["items"].as_array().unwrap().len(), 1);

    // Refusals carry the registered error codes.
    let now = jiff::Timestamp::now().as_second();
    let base = session_revoked_set("jti-2", "bob");
    let with = |key: &str, value: Value| {
        let mut c = base.clone();
        c[key] = value;
        c
    };
    let attacker_key = std::fs::read(support::fixture("keys/attacker-ed25519.pem")).unwrap();
    let forged = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some("test-b-ed-1".into());
        header.typ = Some("secevent+jwt".into());
        jsonwebtoken::encode(
            &header,
            &base,
            &jsonwebtoken::EncodingKey::from_ed_pem(&attacker_key).unwrap(),
        )
        .unwrap()
    };
    let hmac = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.typ = Some("secevent+jwt".into());
        jsonwebtoken::encode(
            &header,
            &base,
            &jsonwebtoken::EncodingKey::from_secret(b"push-secret").unwrap(),
        )
        .unwrap()
    };
    let unsigned = {
        use base64::Engine;
        let b64 =
            |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!(
            "{}.{}.",
            b64(&json!({"alg": "none", "typ": "secevent+jwt"})),
            b64(&base)
        )
    };
    let cases: Vec<(&str, String, Option<&'static str>, &str)> = vec![
        (
            "forged signature",
            forged,
            Some("push-secret"),
            "invalid_key",
        ),
        ("alg none", unsigned, Some("push-secret"), "invalid_key"),
        ("HMAC", hmac, Some("push-secret"), "invalid_key"),
        (
            "unknown kid",
            signer.sign(&base, "nobody", "secevent+jwt"),
            Some("push-secret"),
            "invalid_key",
        ),
        (
            "wrong typ",
            signer.sign(&base, "test-b-ed-1", "JWT"),
            Some("push-secret"),
            "invalid_request",
        ),
        (
            "expired",
            signer.sign(
                &with("iat", json!(now - 86_400)),
                "test-b-ed-1",
                "secevent+jwt",
            ),
            Some("push-secret"),
            "invalid_request",
        ),
        (
            "wrong audience",
            signer.sign(
                &with("aud", json!("https://elsewhere.test")),
                "test-b-ed-1",
                "secevent+jwt",
            ),
            Some("push-secret"),
            "invalid_audience",
        ),
        (
            "wrong issuer",
            signer.sign(
                &with("iss", json!("https://stranger.test")),
                "test-b-ed-1",
                "secevent+jwt",
            ),
            Some("push-secret"),
            "invalid_issuer",
        ),
        (
            "no bearer",
            signer.sign(&base, "test-b-ed-1", "secevent+jwt"),
            None,
            "authentication_failed",
        ),
        (
            "wrong bearer",
            signer.sign(&base, "test-b-ed-1", "secevent+jwt"),
            Some("guess"),
            "authentication_failed",
        ),
        (
            "not a JWT",
            "garbage".into(),
            Some("push-secret"),
            "invalid_request",
        ),
    ];
    for (what, body, bearer, err) in cases {
        let response = push(body, bearer).await.unwrap();
        assert_eq!(response.status(), 400, "{what}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["err"], err, "{what}: {answer}");
    }
    let after = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    assert_eq!(
        after["items"].as_array().unwrap().len(),
        1,
        "a refused SET created nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_security_event_becomes_a_revocation_and_is_acknowledged_only_after() {
    use std::sync::{Arc, Mutex};
    // A transmitter serving one SET until it is acknowledged (RFC 8936), recording acks.
    let signer = SetSigner::default();
    let set = signer.sign(
        &session_revoked_set("jti-poll-1", "alice"),
        "test-b-ed-1",
        "secevent+jwt",
    );
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = acked.clone();
    // The SET is offered only once the test has a running task to see cancelled.
    let offering = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let offer = offering.clone();
    let router = axum::Router::new().route(
        "/poll",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let record = record.clone();
            let set = set.clone();
            let offer = offer.clone();
            async move {
                let mut acks = record.lock().unwrap();
                for jti in body["ack"].as_array().cloned().unwrap_or_default() {
                    acks.push(jti.as_str().unwrap_or_default().to_owned());
                }
                let sets = if acks.iter().any(|a| a == "jti-poll-1")
                    || !offer.load(std::sync::atomic::Ordering::SeqCst)
                {
                    json!({})
                } else {
                    json!({"jti-poll-1": set})
                };
                axum::Json(json!({"sets": sets, "moreAvailable": false}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/poll", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    let cluster = Cluster::start(1, Some(&operator_config(Some(&endpoint)))).await;
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows"))
        .await;
    cluster.all_ready_with("ready: policy").await;
    let token = older_token(&alice());
    let task = running_task(&cluster, 0, &token).await;
    assert!(acked.lock().unwrap().is_empty());
    offering.store(true, std::sync::atomic::Ordering::SeqCst);
    wait_cancelled(&cluster, 0, &task).await;
    let revocations = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    assert_eq!(revocations["items"].as_array().unwrap().len(), 1);
    let acks = eventually(WAIT, async || {
        let a = acked.lock().unwrap().clone();
        (!a.is_empty()).then_some(a)
    })
    .await
    .expect("the SET was acknowledged");
    assert_eq!(acks, vec!["jti-poll-1".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_keep_enforcing_while_the_operator_is_killed_and_resync_when_it_returns() {
    let mut cluster = Cluster::start(2, None).await;
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows, slow_compute"))
        .await;
    cluster.all_ready_with("ready: policy").await;

    cluster.operator.kill_hard();
    // Still enforcing the last snapshot: tasks run, unauthenticated requests are refused.
    for member in &cluster.members {
        let task = support::create_task(
            &member.client,
            &alice().token(),
            "slow_compute",
            json!({"seconds": 0.05}),
        )
        .await;
        assert!(!task.is_empty());
        let anonymous = member
            .client
            .call_tool("", "write_rows", json!({"count": 1}))
            .await;
        assert_eq!(anonymous.status, 401);
        let ready = reqwest::get(format!("{}/ready", member.sidecar.admin))
            .await
            .unwrap();
        assert_eq!(ready.status(), 200);
    }
    // The policy changes while the operator is down; once it is back, every sidecar gets it.
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows"))
        .await;
    cluster.operator.restart().await;
    every_sidecar_stops_running_slow_compute_as_a_task(&cluster).await;
    cluster
        .wait_for(&policy_path(), "in sync after the restart", |o| {
            o["status"]["sidecarsInSync"] == 2
                && o["metadata"]["generation"].as_i64() >= Some(2)
                && o["status"]["observedGeneration"] == o["metadata"]["generation"]
        })
        .await;
}

/// Waits until `user`'s fresh token gets `status` from the first sidecar.
async fn fresh_token_answers(cluster: &Cluster, user: &User, status: u16) {
    let member = &cluster.members[0];
    let seen = eventually(WAIT, async || {
        let r = member
            .client
            .call_tool(&user.token(), "write_rows", json!({"count": 1}))
            .await;
        (r.status == status).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "{}'s fresh token never got {status}:\n{}",
        user.subject,
        member.sidecar.logs()
    );
}

/// Issue 28, item 1: a revocation is lifted only by the transmitter whose event created it
/// (and only when that transmitter has `liftRevocations`), never by a second transmitter and
/// never by any event when a person wrote it, even with a forged security-event source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_transmitter_that_disabled_an_account_can_enable_it_and_no_event_lifts_a_persons_block()
 {
    let config = two_push_transmitters(&["liftRevocations: true"], &["liftRevocations: true"]);
    let cluster = Cluster::start(1, Some(&config)).await;
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows"))
        .await;
    cluster.all_ready_with("ready: policy").await;

    // The first transmitter disables alice: every token of hers is refused.
    let disabled = push_set(
        &cluster,
        event_set(TRANSMITTER, "d-1", "alice", ACCOUNT_DISABLED),
    )
    .await;
    assert_eq!(disabled.status(), 202, "{}", cluster.operator.logs());
    let names = revocation_names(&cluster).await;
    assert_eq!(names.len(), 1, "{names:?}");
    fresh_token_answers(&cluster, &alice(), 401).await;

    // The second transmitter (trusted, signing correctly) enables her: nothing is lifted.
    // 202 is answered only after the sink ran, so the object's presence now is the outcome.
    let enabled = push_set(
        &cluster,
        event_set(SECOND_TRANSMITTER, "e-1", "alice", ACCOUNT_ENABLED),
    )
    .await;
    assert_eq!(enabled.status(), 202, "{}", cluster.operator.logs());
    assert_eq!(
        revocation_names(&cluster).await,
        names,
        "another transmitter lifted the block"
    );
    fresh_token_answers(&cluster, &alice(), 401).await;

    // A person's block of bob, written with a forged security-event source and label naming
    // the first transmitter: that transmitter's account-enabled does not lift it.
    cluster
        .emulator
        .apply_yaml(&format!(
            "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata:\n  name: bob-blocked\n  labels: {{lifeguard.dev/source: security-event}}\nspec:\n  issuer: {}\n  subject: bob\n  revokedBefore: \"2026-01-01T00:00:00Z\"\n  reason: accountDisabled\n  source: {{kind: securityEvent, issuer: \"{TRANSMITTER}\", jti: d-1, eventType: \"{ACCOUNT_DISABLED}\"}}\n",
            support::ISSUER
        ))
        .await;
    let bob_enabled = push_set(
        &cluster,
        event_set(TRANSMITTER, "e-2", "bob", ACCOUNT_ENABLED),
    )
    .await;
    assert_eq!(bob_enabled.status(), 202, "{}", cluster.operator.logs());
    assert!(
        revocation_names(&cluster)
            .await
            .contains(&"bob-blocked".to_owned()),
        "an event lifted a person's block"
    );

    // The transmitter that disabled alice enables her: the block is lifted, tokens work again.
    let lifted = push_set(
        &cluster,
        event_set(TRANSMITTER, "e-3", "alice", ACCOUNT_ENABLED),
    )
    .await;
    assert_eq!(lifted.status(), 202, "{}", cluster.operator.logs());
    assert_eq!(
        revocation_names(&cluster).await,
        vec!["bob-blocked".to_owned()]
    );
    fresh_token_answers(&cluster, &alice(), 200).await;
}

/// Issue 28, item 9: a SET reusing an accepted SET's `jti` for another subject is refused with
/// `invalid_request` (it used to get 202 and do nothing), also after an operator restart
/// forgot the accepted ids; the first event's revocation stays and a redelivery still gets 202.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_reusing_a_jti_for_another_subject_is_refused_not_silently_dropped() {
    let mut cluster = Cluster::start(1, Some(&two_push_transmitters(&[], &[]))).await;
    let first = event_set(TRANSMITTER, "jti-reused", "alice", SESSION_REVOKED);
    assert_eq!(push_set(&cluster, first.clone()).await.status(), 202);
    let names = revocation_names(&cluster).await;
    assert_eq!(names.len(), 1);

    let check_refused = async |cluster: &Cluster| {
        let reused = push_set(
            cluster,
            event_set(TRANSMITTER, "jti-reused", "bob", SESSION_REVOKED),
        )
        .await;
        assert_eq!(reused.status(), 400, "{}", cluster.operator.logs());
        let answer: Value = reused.json().await.unwrap();
        assert_eq!(answer["err"], "invalid_request", "{answer}");
        assert!(
            answer["description"].as_str().unwrap().contains("jti"),
            "{answer}"
        );
    };
    check_refused(&cluster).await;
    // The same jti at another transmitter is another SET.
    let elsewhere = event_set(SECOND_TRANSMITTER, "jti-reused", "bob", SESSION_REVOKED);
    assert_eq!(push_set(&cluster, elsewhere).await.status(), 202);
    assert_eq!(revocation_names(&cluster).await.len(), 2);

    // A restarted operator remembers nothing; the stored object proves the reuse.
    cluster.operator.restart().await;
    check_refused(&cluster).await;
    assert_eq!(
        push_set(&cluster, first).await.status(),
        202,
        "a redelivery"
    );
    let after = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    let subjects: Vec<&str> = after["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["spec"]["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects.len(), 2, "{after}");
    assert_eq!(
        after["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["metadata"]["name"] == names[0].as_str())
            .unwrap()["spec"]["subject"],
        "alice"
    );
}

/// Issue 28, item 14: a transmitter creating revocations in a burst is throttled (429 with
/// Retry-After, nothing recorded, so it delivers again), and the revocations its events may
/// keep are bounded by `maxRevocations` (429, a metric, a log) until some are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transmitter_is_rate_limited_and_bounded_in_the_revocations_it_creates() {
    let config = two_push_transmitters(
        &["revocationBurst: 3", "revocationsPerMinute: 1"],
        &["maxRevocations: 2"],
    );
    let cluster = Cluster::start(1, Some(&config)).await;

    // The burst passes, the next revocation waits.
    for i in 0..3 {
        let set = event_set(
            TRANSMITTER,
            &format!("burst-{i}"),
            &format!("user-{i}"),
            SESSION_REVOKED,
        );
        assert_eq!(
            push_set(&cluster, set).await.status(),
            202,
            "{}",
            cluster.operator.logs()
        );
    }
    let throttled = push_set(
        &cluster,
        event_set(TRANSMITTER, "burst-3", "user-3", SESSION_REVOKED),
    )
    .await;
    assert_eq!(throttled.status(), 429, "{}", cluster.operator.logs());
    let retry_after: u64 = throttled.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    assert_eq!(
        revocation_names(&cluster).await.len(),
        3,
        "a throttled SET records nothing"
    );
    // A non-revoking SET is not throttled.
    let enable = event_set(TRANSMITTER, "enable-1", "user-0", ACCOUNT_ENABLED);
    assert_eq!(push_set(&cluster, enable).await.status(), 202);

    // The second transmitter may keep two revocations; the third waits until one is deleted.
    // Signed once each: a redelivery is the same SET.
    let bounded: Vec<String> = (0..3)
        .map(|i| {
            event_set(
                SECOND_TRANSMITTER,
                &format!("max-{i}"),
                &format!("max-{i}"),
                ACCOUNT_DISABLED,
            )
        })
        .collect();
    for set in &bounded[..2] {
        assert_eq!(push_set(&cluster, set.clone()).await.status(), 202);
    }
    let over = push_set(&cluster, bounded[2].clone()).await;
    assert_eq!(over.status(), 429, "{}", cluster.operator.logs());
    assert!(over.headers().contains_key("retry-after"));
    let answer: Value = over.json().await.unwrap();
    assert!(
        answer["description"]
            .as_str()
            .unwrap()
            .contains("maxRevocations"),
        "{answer}"
    );
    assert_eq!(revocation_names(&cluster).await.len(), 5);
    let counted = cluster
        .operator
        .metric("lifeguard_operator_ssf_sets_received_total{delivery=\"push\",result=\"deferred\",err=\"revocation_limit\"}")
        .await;
    assert_eq!(counted, Some(1.0));
    assert!(cluster.operator.logs().contains("maxRevocations"));
    // A redelivery of an accepted SET is still answered 202 at the limit.
    assert_eq!(push_set(&cluster, bounded[0].clone()).await.status(), 202);

    // A person deletes one of them: the waiting SET is recorded on redelivery.
    let list = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    let victim = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["spec"]["source"]["issuer"] == SECOND_TRANSMITTER)
        .unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let deleted = cluster
        .emulator
        .send(
            http::Method::DELETE,
            &revocation_path(&victim),
            "application/json",
            None,
        )
        .await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    assert_eq!(
        push_set(&cluster, bounded[2].clone()).await.status(),
        202,
        "{}",
        cluster.operator.logs()
    );
    assert_eq!(revocation_names(&cluster).await.len(), 5);
}
