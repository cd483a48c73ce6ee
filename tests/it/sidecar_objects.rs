//! Object-level permission (`tasks.objects`), black box against the example authorizer: the
//! object a tool call names is stored with the task, and the authorizer is asked about it at
//! creation and on every get, update, cancel, result read and listen delivery, so a grant
//! revoked mid-run hides the task (and its result) from the next request on.

use crate::support;
use crate::support::alice;

use std::time::Duration;

use serde_json::{Value, json};
use support::User;
use support::authorizer::Authorizer;
use support::listen::ListenStream;

const ALICE_ON_X: &str = "grants:\n  - {subject: alice, issuer: 'https://idp.test', tenant: tenant-a, type: project, object: proj-x}\n";
const NOBODY: &str = "grants: []\n";

fn spec(authorizer: &Authorizer, cache_ttl: &str) -> String {
    format!(
        r#"  tasks:
    minPollInterval: 10ms
    tools: [slow_compute, write_rows]
    objects:
      authorizer: {{url: "{}", cacheTtl: {cache_ttl}}}
      tools:
        slow_compute: {{pointer: /label, type: project}}
        write_rows: {{pointer: /label, type: project}}
  listen:
    notifications: [taskIds]
"#,
        authorizer.url
    )
}

/// Polls `tasks/get` while it answers 200 and the task is unfinished; returns the first other
/// answer (or the last one after 15 s).
async fn poll_until_refused_or_done(
    client: &support::McpClient,
    token: &str,
    id: &str,
) -> support::client::Reply {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let reply = client.get_task(token, id).await;
        let unfinished = reply.status == 200 && reply.result()["status"] == "working";
        if !unfinished || std::time::Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_grant_revoked_mid_run_hides_the_task_and_its_result_until_granted_again() {
    let authorizer = Authorizer::start(ALICE_ON_X);
    let (_server, sidecar, client) = support::start_behind_sidecar(&spec(&authorizer, "0s")).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 1, "label": "proj-x"}),
    )
    .await;
    let running = client.get_task(&token, &id).await;
    assert_eq!(running.status, 200, "{running:?}");

    // Access to proj-x withdrawn: the owner's own task is "not found", exactly like an ID that
    // never existed.
    authorizer.set_grants(NOBODY);
    let refused = client.get_task(&token, &id).await;
    let forged = client
        .get_task(&token, &format!("lgt_{}", "Q".repeat(32)))
        .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.body_without_id(), forged.body_without_id());
    let cancel = client.cancel_task(&token, &id).await;
    assert_eq!(cancel.body_without_id(), forged.body_without_id());

    // Reading the task's state again, but not its result: once it completes, the result read
    // is refused on its own.
    authorizer
        .set_grants(&ALICE_ON_X.replace("object: proj-x}", "object: proj-x, actions: [read]}"));
    let done_but_refused = poll_until_refused_or_done(&client, &token, &id).await;
    assert_eq!(
        done_but_refused.body_without_id(),
        forged.body_without_id(),
        "the result of a completed task needs the result grant"
    );
    let last = authorizer.decisions().await.pop().unwrap();
    assert_eq!(last["question"]["action"], "result");
    assert_eq!(last["decision"], false);

    // Granted again: the task ran on and its result was kept.
    authorizer.set_grants(ALICE_ON_X);
    let done = client.get_task(&token, &id).await;
    assert_eq!(done.result()["status"], "completed", "{done:?}");
    assert_eq!(
        done.result()["result"]["content"][0]["text"],
        "computed proj-x"
    );

    // The audit names the object by a keyed digest, the same one on every event of the task.
    let created = sidecar
        .audit_event(|e| e["event"] == "task.created")
        .await
        .expect("task.created");
    let digest = created["detail"]["object"]
        .as_str()
        .expect("object digest")
        .to_owned();
    assert!(
        digest.starts_with("h:") && !digest.contains("proj-x"),
        "{digest}"
    );
    let denials = sidecar
        .audit_events_when(3, |e| {
            e["event"] == "task.denied" && e["reason"] == "object_denied"
        })
        .await;
    assert!(denials.len() >= 3, "{denials:?}");
    for denial in &denials {
        assert_eq!(denial["detail"]["object"], digest.as_str(), "{denial}");
        assert_eq!(
            denial["correlation_id"], created["correlation_id"],
            "{denial}"
        );
    }
    // Whoever may read the ledger can tell which digest is proj-x's.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(["audit", "digest", "--object-type", "project", "--ledger"])
        .arg(&sidecar.ledger_path)
        .arg("proj-x")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("proj-x\t{digest}\n")
    );
    let read = sidecar
        .audit_event(|e| e["event"] == "task.result_read")
        .await
        .expect("task.result_read");
    assert_eq!(read["detail"]["object"], digest.as_str());
    // The authorizer was never sent a credential or the task ID.
    let sent = serde_json::to_string(&authorizer.decisions().await).unwrap();
    assert!(!sent.contains(&token) && !sent.contains(&id), "{sent}");
}

#[tokio::test]
async fn creation_asks_about_the_object_the_arguments_name() {
    let authorizer = Authorizer::start(ALICE_ON_X);
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec(&authorizer, "0s")).await;
    let bob = User::new("bob", "tenant-a", "console").token();
    let refused = client
        .call_tool(
            &bob,
            "slow_compute",
            json!({"seconds": 0, "label": "proj-x"}),
        )
        .await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(refused.error_code(), Some(-31403), "{refused:?}");
    let asked = authorizer.decisions().await;
    assert_eq!(asked.len(), 1, "{asked:?}");
    let request = &asked[0]["request"];
    assert_eq!(request["subject"]["id"], "bob");
    assert_eq!(
        request["subject"]["properties"]["issuer"],
        "https://idp.test"
    );
    assert_eq!(request["subject"]["properties"]["tenant"], "tenant-a");
    assert_eq!(request["subject"]["properties"]["client"], "console");
    assert_eq!(
        request["resource"],
        json!({"type": "project", "id": "proj-x",
        "properties": {"tool": "slow_compute", "server": "tests/test-policy"}})
    );
    assert_eq!(request["action"]["name"], "create");

    // A listed tool whose arguments do not name the object is refused before anyone is asked.
    let missing = client
        .call_tool(&alice().token(), "slow_compute", json!({"seconds": 0}))
        .await;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert_eq!(missing.error_code(), Some(-32602));
    let message = missing.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("/label"), "{message}");
    // A tool the policy names no object for is not asked about.
    let greeting = client
        .call_tool(&alice().token(), "greet", json!({"name": "a"}))
        .await;
    assert_eq!(greeting.status, 200, "{greeting:?}");
    assert_eq!(authorizer.decisions().await.len(), 1);

    let allowed = client
        .call_tool(
            &alice().token(),
            "slow_compute",
            json!({"seconds": 0, "label": "proj-x"}),
        )
        .await;
    assert_eq!(allowed.result()["resultType"], "task", "{allowed:?}");
}

#[tokio::test]
async fn without_a_decision_nothing_is_allowed_but_strangers_still_see_not_found() {
    let mut authorizer = Authorizer::start(ALICE_ON_X);
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec(&authorizer, "0s")).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 0, "label": "proj-x"}),
    )
    .await;
    authorizer.stop();

    let create = client
        .call_tool(
            &token,
            "slow_compute",
            json!({"seconds": 0, "label": "proj-x"}),
        )
        .await;
    assert_eq!(create.status, 503, "{create:?}");
    assert!(create.body.get("result").is_none());
    let get = client.get_task(&token, &id).await;
    assert_eq!(get.status, 503, "{get:?}");
    assert!(get.body.get("result").is_none(), "{get:?}");
    // The ownership check comes first: someone else's request never reaches the authorizer
    // and gets the uniform answer.
    let bob = User::new("bob", "tenant-a", "console").token();
    let foreign = client.get_task(&bob, &id).await;
    let forged = client
        .get_task(&bob, &format!("lgt_{}", "Q".repeat(32)))
        .await;
    assert_eq!(foreign.status, 400);
    assert_eq!(foreign.body_without_id(), forged.body_without_id());
}

#[tokio::test]
async fn decisions_are_reused_within_the_cache_ttl() {
    let authorizer = Authorizer::start(ALICE_ON_X);
    let (_server, _sidecar, client) =
        support::start_behind_sidecar(&spec(&authorizer, "10m")).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        json!({"seconds": 30, "label": "proj-x"}),
    )
    .await;
    for _ in 0..3 {
        let reply = client.get_task(&token, &id).await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    // Revoked, but the cached allow still answers for its TTL: the bound a policy chooses.
    authorizer.set_grants(NOBODY);
    let cached = client.get_task(&token, &id).await;
    assert_eq!(cached.status, 200, "{cached:?}");
    assert_eq!(authorizer.actions().await, ["create", "read"]);
}

/// Every frame the stream carries within `window` (however many arrive).
async fn frames_for(stream: &mut ListenStream, window: Duration) -> Vec<Value> {
    let end = std::time::Instant::now() + window;
    let mut frames = Vec::new();
    while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
        match stream.next(left).await {
            Some(frame) => frames.push(frame),
            None => break,
        }
    }
    frames
}

#[tokio::test]
async fn listen_streams_stop_delivering_a_task_whose_object_was_withdrawn() {
    let authorizer = Authorizer::start(ALICE_ON_X);
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec(&authorizer, "0s")).await;
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "write_rows",
        json!({"count": 60, "intervalMs": 100, "label": "proj-x"}),
    )
    .await;
    let task_frames = |frames: &[Value]| {
        frames
            .iter()
            .filter(|f| f["method"] == "notifications/tasks")
            .count()
    };
    let mut stream = ListenStream::open(
        &client.url,
        &token,
        json!(1),
        json!({"taskIds": [id]}),
        true,
    )
    .await;
    let ack = stream
        .next(Duration::from_secs(5))
        .await
        .expect("acknowledgement");
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([id]));
    let granted = frames_for(&mut stream, Duration::from_millis(500)).await;
    assert!(task_frames(&granted) > 0, "{granted:?}");

    authorizer.set_grants(NOBODY);
    // Frames already on their way when the grant went are let through; after that, none,
    // while the task writes on (60 rows, one every 100 ms).
    let _in_flight = frames_for(&mut stream, Duration::from_millis(300)).await;
    let withdrawn = frames_for(&mut stream, Duration::from_millis(800)).await;
    assert_eq!(task_frames(&withdrawn), 0, "{withdrawn:?}");
    let listen_denials = authorizer
        .decisions()
        .await
        .iter()
        .filter(|d| d["question"]["action"] == "listen" && d["decision"] == false)
        .count();
    assert!(
        listen_denials > 0,
        "{:?} {granted:?}",
        authorizer.actions().await
    );

    // A new stream is not acknowledged the task at all.
    let mut again = ListenStream::open(
        &client.url,
        &token,
        json!(2),
        json!({"taskIds": [id]}),
        true,
    )
    .await;
    let ack = again
        .next(Duration::from_secs(5))
        .await
        .expect("acknowledgement");
    let acknowledged = &ack["params"]["notifications"]["taskIds"];
    assert!(
        acknowledged.is_null() || acknowledged == &json!([]),
        "{ack}"
    );
}

#[tokio::test]
async fn a_subject_access_review_authorizer_decides_the_same_way() {
    let authorizer = Authorizer::start(ALICE_ON_X);
    let url = format!(
        "{}/apis/authorization.k8s.io/v1/subjectaccessreviews",
        authorizer.base
    );
    let spec = spec(&authorizer, "0s").replace(
        &format!("url: \"{}\"", authorizer.url),
        &format!("url: \"{url}\", format: subjectAccessReview"),
    );
    let (_server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let id = support::create_task(
        &client,
        &alice().token(),
        "slow_compute",
        json!({"seconds": 30, "label": "proj-x"}),
    )
    .await;
    assert_eq!(client.get_task(&alice().token(), &id).await.status, 200);
    let bob = User::new("bob", "tenant-a", "console").token();
    let refused = client
        .call_tool(
            &bob,
            "slow_compute",
            json!({"seconds": 0, "label": "proj-x"}),
        )
        .await;
    assert_eq!(refused.status, 403);
    let reviews = authorizer.decisions().await;
    assert_eq!(reviews[0]["request"]["kind"], "SubjectAccessReview");
    assert_eq!(
        reviews[0]["request"]["spec"]["resourceAttributes"],
        json!({"group": "lifeguard.dev", "resource": "project", "name": "proj-x", "verb": "create"})
    );
    assert_eq!(reviews.last().unwrap()["request"]["spec"]["user"], "bob");
}
