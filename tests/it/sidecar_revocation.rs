//! Revocation, black box: a PrincipalRevocation added to the standalone policy file refuses the
//! principal's old tokens, cancels the work they started and stops its writes; one naming a
//! whole tenant or a client application does the same for everyone it covers.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::listen::ListenStream;
use support::{McpClient, Sidecar, User};

const SPEC: &str = "  tasks:\n    minPollInterval: 50ms\n";

fn revocation(name: &str, subject: &str, reason: &str, revoked_before: jiff::Timestamp) -> String {
    format!(
        r#"---
apiVersion: lifeguard.dev/v1alpha1
kind: PrincipalRevocation
metadata: {{name: {name}}}
spec:
  issuer: {}
  subject: {subject}
  revokedBefore: "{revoked_before}"
  reason: {reason}
  source: {{kind: manual}}
"#,
        support::ISSUER
    )
}

fn append(sidecar: &Sidecar, text: &str) {
    let mut policy = std::fs::read_to_string(sidecar.policy_file()).unwrap();
    policy.push_str(text);
    // Write-and-rename, as kubectl, kubelet and editors do.
    let tmp = sidecar.policy_file().with_extension("tmp");
    std::fs::write(&tmp, policy).unwrap();
    std::fs::rename(&tmp, sidecar.policy_file()).unwrap();
}

/// The sidecar's `revocation.applied` audit event (waits for it).
async fn revocation_applied(sidecar: &Sidecar) -> serde_json::Value {
    sidecar
        .audit_event(|e| e["event"] == "revocation.applied")
        .await
        .expect("revocation.applied audited")
}

fn with_iat(user: &User, iat: i64) -> String {
    user.token_with(|c| {
        c["iat"] = json!(iat);
        c["nbf"] = json!(iat - 5);
    })
}

#[tokio::test]
async fn a_session_revocation_stops_old_tokens_and_their_work_but_not_fresh_ones() {
    let (server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = User::new("alice", "tenant-a", "console");
    let bob = User::new("bob", "tenant-a", "console");
    let now = jiff::Timestamp::now().as_second();
    let old_token = with_iat(&alice, now - 60);
    let bob_token = bob.token();

    let alice_task = client
        .call_tool(
            &old_token,
            "write_rows",
            json!({"count": 1000, "intervalMs": 20, "label": "alice"}),
        )
        .await
        .result()["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let bob_task = client
        .call_tool(
            &bob_token,
            "write_rows",
            json!({"count": 1000, "intervalMs": 20, "label": "bob"}),
        )
        .await
        .result()["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let revoked_before = jiff::Timestamp::from_second(now - 10).unwrap();
    append(
        &sidecar,
        &revocation("alice-session", "alice", "sessionRevoked", revoked_before),
    );

    // The old token is refused…
    let refused = support::eventually(Duration::from_secs(10), async || {
        let r = client.get_task(&old_token, &alice_task).await;
        (r.status == 401).then_some(())
    })
    .await;
    assert!(
        refused.is_some(),
        "old token still accepted:\n{}",
        sidecar.logs()
    );
    // …and her task reads cancelled (to a fresh token, issued after revokedBefore).
    let fresh = alice.token();
    let cancelled = support::eventually(Duration::from_secs(10), async || {
        let r = client.get_task(&fresh, &alice_task).await;
        (r.result()["status"] == "cancelled").then_some(r)
    })
    .await
    .expect("task cancelled by the revocation");
    let message = cancelled.result()["statusMessage"].as_str().unwrap();
    assert!(message.contains("revoked"), "{message}");

    // No row lands after that, plus one server poll interval; Bob is untouched.
    let at_cancel = server.rows_labelled("alice").await.len();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(server.rows_labelled("alice").await.len(), at_cancel);
    assert!(!server.rows_labelled("bob").await.is_empty());
    let bobs = client.get_task(&bob_token, &bob_task).await;
    assert_eq!(bobs.result()["status"], "working");

    // A fresh token works again (session-revocation semantics) and can start new work, which
    // the revocation does not touch.
    let new_task = client
        .call_tool(&fresh, "slow_compute", json!({"seconds": 30}))
        .await;
    assert_eq!(new_task.result()["resultType"], "task", "{new_task:?}");

    let applied = revocation_applied(&sidecar).await;
    assert_eq!(applied["detail"]["tasksCancelled"], 1);
    assert_eq!(applied["detail"]["revocation"], "alice-session");
    // The refusal names the principal and the revocation that refused it.
    let denied = sidecar
        .audit_event(|e| e["event"] == "auth.denied" && e["reason"] == "revoked")
        .await
        .expect("auth.denied audited");
    assert_eq!(denied["subject"], "alice");
    assert_eq!(denied["detail"]["revocation"], "alice-session");
    client.cancel_task(&bob_token, &bob_task).await;
}

#[tokio::test]
async fn an_account_disabled_revocation_refuses_every_token_until_removed() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = User::new("alice", "tenant-a", "console");
    let task = client
        .call_tool(&alice.token(), "slow_compute", json!({"seconds": 30}))
        .await
        .result()["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let original = std::fs::read_to_string(sidecar.policy_file()).unwrap();
    append(
        &sidecar,
        &revocation(
            "alice-disabled",
            "alice",
            "accountDisabled",
            jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600),
        ),
    );
    let refused = support::eventually(Duration::from_secs(2), async || {
        // Even a token minted right now.
        let r = client.get_task(&alice.token(), &task).await;
        (r.status == 401).then_some(())
    })
    .await;
    assert!(refused.is_some());

    // Removing the object lets her back in; the task stays cancelled.
    let tmp = sidecar.policy_file().with_extension("tmp");
    std::fs::write(&tmp, original).unwrap();
    std::fs::rename(&tmp, sidecar.policy_file()).unwrap();
    let back = support::eventually(Duration::from_secs(2), async || {
        let r = client.get_task(&alice.token(), &task).await;
        (r.status == 200).then_some(r)
    })
    .await
    .expect("token accepted again after the revocation was removed");
    assert_eq!(back.result()["status"], "cancelled");
}

#[tokio::test]
async fn owner_cancel_stops_writes_before_the_task_reads_cancelled_plus_one_interval() {
    let (server, _sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let token = User::new("alice", "t", "c").token();
    for round in 0..3 {
        let label = format!("owner-{round}");
        let id = client
            .call_tool(
                &token,
                "write_rows",
                json!({"count": 1000, "intervalMs": 10, "label": label}),
            )
            .await
            .result()["taskId"]
            .as_str()
            .unwrap()
            .to_owned();
        tokio::time::sleep(Duration::from_millis(50 + round * 30)).await;
        client.cancel_task(&token, &id).await;
        assert_eq!(
            client.get_task(&token, &id).await.result()["status"],
            "cancelled"
        );
        let at_cancel = server.rows_labelled(&label).await.len();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            server.rows_labelled(&label).await.len(),
            at_cancel,
            "round {round}"
        );
    }
}

/// A revocation of everyone a `scope` (YAML lines under `spec:`) covers.
fn scoped_revocation(name: &str, scope: &str, revoked_before: jiff::Timestamp) -> String {
    format!(
        r#"---
apiVersion: lifeguard.dev/v1alpha1
kind: PrincipalRevocation
metadata: {{name: {name}}}
spec:
  issuer: {}
{scope}
  revokedBefore: "{revoked_before}"
  reason: adminAction
  source: {{kind: manual}}
"#,
        support::ISSUER
    )
}

async fn start_writing(client: &McpClient, token: &str, label: &str) -> String {
    let created = client
        .call_tool(
            token,
            "write_rows",
            json!({"count": 1000, "intervalMs": 20, "label": label}),
        )
        .await;
    created.result()["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{label}: no task: {created:?}"))
        .to_owned()
}

async fn reads_cancelled(client: &McpClient, token: &str, task: &str) -> bool {
    support::eventually(Duration::from_secs(10), async || {
        let r = client.get_task(token, task).await;
        (r.result()["status"] == "cancelled").then_some(())
    })
    .await
    .is_some()
}

#[tokio::test]
async fn a_tenant_revocation_cancels_every_subjects_tasks_and_streams_in_that_tenant_only() {
    let spec = format!("{SPEC}  listen:\n    notifications: [toolsListChanged]\n");
    let (_server, sidecar, client) = support::start_behind_sidecar(&spec).await;
    let now = jiff::Timestamp::now().as_second();
    let alice = User::new("alice", "tenant-a", "console");
    let bob = User::new("bob", "tenant-a", "cli");
    let carol = User::new("carol", "tenant-b", "console");
    let (alice_old, bob_old, carol_old) = (
        with_iat(&alice, now - 60),
        with_iat(&bob, now - 60),
        with_iat(&carol, now - 60),
    );
    let alice_task = start_writing(&client, &alice_old, "alice").await;
    let bob_task = start_writing(&client, &bob_old, "bob").await;
    let carol_task = start_writing(&client, &carol_old, "carol").await;
    let mut bob_stream = ListenStream::open(
        &client.url,
        &bob_old,
        json!("b"),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    let mut carol_stream = ListenStream::open(
        &client.url,
        &carol_old,
        json!("c"),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    bob_stream.next(Duration::from_secs(5)).await.expect("ack");
    carol_stream
        .next(Duration::from_secs(5))
        .await
        .expect("ack");

    let revoked_before = jiff::Timestamp::from_second(now - 10).unwrap();
    append(
        &sidecar,
        &scoped_revocation("tenant-a-offboarded", "  tenant: tenant-a", revoked_before),
    );

    // Both subjects of tenant-a: old tokens refused, tasks cancelled, stream closed.
    let refused = support::eventually(Duration::from_secs(10), async || {
        let r = client.get_task(&bob_old, &bob_task).await;
        (r.status == 401).then_some(())
    })
    .await;
    assert!(refused.is_some(), "bob's old token still accepted");
    assert!(reads_cancelled(&client, &alice.token(), &alice_task).await);
    assert!(reads_cancelled(&client, &bob.token(), &bob_task).await);
    let frames = bob_stream.drain(Duration::from_secs(3)).await;
    assert_eq!(
        frames.last().map(|f| f["id"].clone()),
        Some(json!("b")),
        "{frames:?}"
    );
    // tenant-b is untouched: the same kind of old token still works, the task runs.
    let carols = client.get_task(&carol_old, &carol_task).await;
    assert_eq!(carols.status, 200, "{carols:?}");
    assert_eq!(carols.result()["status"], "working");

    let applied = revocation_applied(&sidecar).await;
    assert_eq!(applied["detail"]["tasksCancelled"], 2);
    assert_eq!(applied["detail"]["streamsClosed"], 1);
    assert_eq!(applied["detail"]["tenant"], "tenant-a");
    assert_eq!(applied["detail"]["subject"], json!(null));
    // One stream closed (bob's): carol's, opened with a token as old, stays open.
    assert!(
        carol_stream
            .next(Duration::from_millis(300))
            .await
            .is_none(),
        "carol's stream ended"
    );
    client.cancel_task(&carol_old, &carol_task).await;
}

#[tokio::test]
async fn a_client_application_revocation_cancels_the_work_started_through_it_only() {
    let (_server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let now = jiff::Timestamp::now().as_second();
    let alice_console = User::new("alice", "tenant-a", "console");
    let alice_cli = User::new("alice", "tenant-a", "cli");
    let dave_console = User::new("dave", "tenant-b", "console");
    let via_console = start_writing(&client, &with_iat(&alice_console, now - 60), "a1").await;
    let via_cli_token = with_iat(&alice_cli, now - 60);
    let via_cli = start_writing(&client, &via_cli_token, "a2").await;
    let daves = start_writing(&client, &with_iat(&dave_console, now - 60), "d").await;

    let revoked_before = jiff::Timestamp::from_second(now - 10).unwrap();
    append(
        &sidecar,
        &scoped_revocation(
            "console-consent-withdrawn",
            "  client: console",
            revoked_before,
        ),
    );

    assert!(reads_cancelled(&client, &alice_console.token(), &via_console).await);
    assert!(reads_cancelled(&client, &dave_console.token(), &daves).await);
    let untouched = client.get_task(&via_cli_token, &via_cli).await;
    assert_eq!(untouched.status, 200, "{untouched:?}");
    assert_eq!(untouched.result()["status"], "working");
    let applied = revocation_applied(&sidecar).await;
    assert_eq!(applied["detail"]["tasksCancelled"], 2);
    assert_eq!(applied["detail"]["client"], "console");
    client.cancel_task(&via_cli_token, &via_cli).await;
}

/// Work that finishes at the server after its owner was revoked (the server ignores the
/// cancellation, and reports `completed` with a result) keeps nothing for the revoked owner:
/// the task ends cancelled for the revocation, without its result, and only the cancellation
/// and its confirmation went to the server on her behalf.
#[tokio::test]
async fn work_that_finishes_after_a_revocation_keeps_no_result_for_the_revoked_owner() {
    let (server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = User::new("alice", "tenant-a", "console");
    let now = jiff::Timestamp::now().as_second();
    let old_token = with_iat(&alice, now - 60);
    let created = client
        .call_tool(
            &old_token,
            "write_rows",
            json!({"count": 120, "intervalMs": 25, "label": "late", "ignoreCancel": true}),
        )
        .await;
    let task = created.result()["taskId"].as_str().unwrap().to_owned();

    let revoked_before = jiff::Timestamp::from_second(now - 10).unwrap();
    append(
        &sidecar,
        &revocation("alice-late", "alice", "sessionRevoked", revoked_before),
    );
    let refused = support::eventually(Duration::from_secs(10), async || {
        let r = client.get_task(&old_token, &task).await;
        (r.status == 401).then_some(())
    })
    .await;
    assert!(refused.is_some(), "old token still accepted");
    revocation_applied(&sidecar).await;
    let upstream = server.debug("/_example/tasks").await[0].clone();
    assert_eq!(
        upstream["status"], "working",
        "precondition: the revocation landed before the work ended: {upstream}"
    );
    let upstream_id = upstream["taskId"].as_str().unwrap().to_owned();

    // The server ignores the cancellation and completes the work, result and all.
    let completed = support::eventually(Duration::from_secs(20), async || {
        let t = server.debug("/_example/tasks").await[0].clone();
        (t["status"] == "completed").then_some(())
    })
    .await;
    assert!(completed.is_some(), "the server finished the work");

    // Alice, with a fresh token, reads the task: cancelled for the revocation, no result.
    let fresh = alice.token();
    let read = support::eventually(Duration::from_secs(10), async || {
        let r = client.get_task(&fresh, &task).await;
        (r.result()["status"] != "working").then_some(r)
    })
    .await
    .expect("the task ends");
    assert_eq!(read.result()["status"], "cancelled", "{read:?}");
    let message = read.result()["statusMessage"].as_str().unwrap_or_default();
    assert!(message.contains("revoked"), "{message}");
    assert!(read.result().get("result").is_none(), "{read:?}");
    let ended = sidecar
        .audit_event(|e| {
            e["event"].as_str().is_some_and(|n| n.starts_with("task."))
                && e["detail"]["endReason"].is_string()
        })
        .await
        .expect("the end is audited");
    assert_eq!(ended["detail"]["endReason"], "revocation", "{ended}");
    assert!(ended["detail"].get("result").is_none(), "{ended}");

    // What the sidecar itself sent about the task: the cancellation and its confirmation only.
    let own: Vec<(String, String)> = server
        .debug("/_example/requests")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["taskId"] == upstream_id.as_str()
                && r["lifeguard"]["lifeguard-initiator"] == "sidecar"
        })
        .map(|r| {
            (
                r["mcpMethod"].as_str().unwrap_or_default().to_owned(),
                r["lifeguard"]["lifeguard-initiator-reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert!(!own.is_empty(), "the sidecar asked the server to stop");
    for (method, reason) in &own {
        assert!(
            matches!(
                (method.as_str(), reason.as_str()),
                ("tasks/cancel", "revocation" | "cancel_unconfirmed")
                    | ("tasks/get", "cancel_check")
            ),
            "{own:?}"
        );
    }
}

/// After a revocation, the sidecar's reconciliation does not poll the revoked task on its
/// owner's behalf: a fresh token over its quota (the revoked task holds its slot until the
/// server confirms the cancellation) triggers no `tasks/get` for it but the outbox's.
#[tokio::test]
async fn a_revoked_task_is_not_reconciled_on_its_owners_behalf() {
    let spec = "  tasks:\n    concurrency: {perPrincipal: 1}\n    minPollInterval: 10ms\n";
    let (server, sidecar, client) = support::start_behind_sidecar(spec).await;
    let alice = User::new("alice", "tenant-a", "console");
    let now = jiff::Timestamp::now().as_second();
    let old_token = with_iat(&alice, now - 60);
    let created = client
        .call_tool(
            &old_token,
            "write_rows",
            json!({"count": 2000, "intervalMs": 25, "label": "held", "ignoreCancel": true}),
        )
        .await;
    assert_eq!(created.result()["resultType"], "task", "{created:?}");
    let revoked_before = jiff::Timestamp::from_second(now - 10).unwrap();
    append(
        &sidecar,
        &revocation("alice-held", "alice", "sessionRevoked", revoked_before),
    );
    revocation_applied(&sidecar).await;

    // Her fresh token is over quota: the cancelled-but-unconfirmed task holds the slot.
    let fresh = alice.token();
    let over = client
        .call_tool(&fresh, "slow_compute", json!({"seconds": 60}))
        .await;
    assert_eq!(over.status, 429, "{over:?}");
    let reasons: Vec<String> = server
        .received()
        .await
        .iter()
        .filter(|r| {
            r.method() == Some("tasks/get")
                && r.header("lifeguard-initiator").as_deref() == Some("sidecar")
        })
        .filter_map(|r| r.header("lifeguard-initiator-reason"))
        .collect();
    assert!(
        reasons.iter().all(|r| r == "cancel_check"),
        "only the cancellation's confirmation asked about the task: {reasons:?}"
    );
    assert!(
        sidecar
            .metric("lifeguard_anomalies_total{reason=\"revoked_owner_request_withheld\"}")
            .await
            >= 1.0
    );
}
