//! Sidecar III, capability half, black box: a server's `sampling/createMessage` and `roots/list`
//! input requests reach the client only under an Active, correctly signed CapabilityException
//! whose budgets still allow it; otherwise the client never sees them and the decision is
//! audited with its reason. A refused `roots/list` is answered `{"roots": []}` for the client
//! (the task or call goes on). A refused sampling request cannot be declined: a task ends
//! `failed` with the documented error (and is cancelled at the server), a multi round-trip call
//! gets that error instead of a result.

use crate::support;

use serde_json::{Value, json};
use std::time::Duration;
use support::User;
use support::capability::*;
use support::listen::ListenStream;

#[tokio::test]
async fn sampling_under_an_active_exception_reaches_the_declaring_client_within_budget() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({"rounds": 2, "maxTokens": 200})).await;

    let asking = next_state(&s.client, &token, &task).await;
    assert_eq!(asking["status"], "input_required", "{asking}");
    let request = &asking["inputRequests"]["sample-1"];
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["maxTokens"], 200);
    // The same poll without the capability declared on *this* request does not show it.
    let undeclared = get(&s.client, &token, &task, false, false).await;
    assert_eq!(undeclared["status"], "working", "{undeclared}");
    assert!(undeclared.get("inputRequests").is_none(), "{undeclared}");

    answer(&s.client, &token, &task, "sample-1", sample("first")).await;
    let asking = support::eventually(Duration::from_secs(10), async || {
        let state = next_state(&s.client, &token, &task).await;
        state["inputRequests"]
            .get("sample-2")
            .is_some()
            .then_some(state)
    })
    .await
    .expect("second round asked");
    assert_eq!(asking["status"], "input_required");
    answer(&s.client, &token, &task, "sample-2", sample("second")).await;
    let done = finish(&s.client, &token, &task).await;
    assert_eq!(result_text(&done), "first | second");

    s.sidecar
        .audit_events_when(2, |e| e["event"] == "capability.allowed")
        .await;
    let audit = s.sidecar.audit();
    let allowed: Vec<&Value> = audit
        .iter()
        .filter(|e| e["event"] == "capability.allowed")
        .collect();
    assert_eq!(
        allowed.len(),
        2,
        "one decision per input request: {audit:?}"
    );
    assert_eq!(allowed[0]["detail"]["approvalId"], "CHG-1");
    assert_eq!(allowed[0]["detail"]["exception"], "tests/ok");
    // The approved model route is recorded with every use.
    assert!(
        allowed
            .iter()
            .all(|e| e["detail"]["modelRoute"] == "test/route"),
        "{allowed:?}"
    );
    assert_eq!(allowed[0]["detail"]["budgetLeft"]["iterations"], 4);
    assert_eq!(allowed[1]["detail"]["budgetLeft"]["iterations"], 3);
    assert!(
        allowed[0]["detail"]["exceptionExpiresAt"]
            .as_str()
            .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()),
        "the allowance names when its exception expires: {allowed:?}"
    );
    // Each answer that reached the server is audited with a digest, under its allowance.
    let answered: Vec<&Value> = audit
        .iter()
        .filter(|e| e["event"] == "capability.answered")
        .collect();
    assert_eq!(answered.len(), 2, "{audit:?}");
    for event in &answered {
        assert_eq!(event["detail"]["capability"], "sampling/createMessage");
        assert_eq!(event["detail"]["approvalId"], "CHG-1");
        assert_eq!(event["detail"]["modelRoute"], "test/route");
        assert_eq!(
            event["detail"]["answer"]["sha256"].as_str().unwrap().len(),
            64
        );
        assert_eq!(
            event["correlation_id"], allowed[0]["correlation_id"],
            "one task, one ID"
        );
    }
    assert_ne!(
        answered[0]["detail"]["answer"]["sha256"], answered[1]["detail"]["answer"]["sha256"],
        "different answers, different digests"
    );
    let requested = audit
        .iter()
        .find(|e| e["event"] == "capability.requested")
        .expect("capability.requested audited");
    assert!(requested["detail"]["request"]["bytes"].as_u64().unwrap() > 0);
    let raw = std::fs::read_to_string(&s.sidecar.audit_path).unwrap();
    assert!(
        !raw.contains("quarterly") && !raw.contains("first"),
        "prompt or model output in the audit trail"
    );
    assert!(rejections_when(&s.sidecar, 0).await.is_empty());
    // Counted under the exception that allowed them (the dashboard's "by exception" panel).
    assert_eq!(
        s.sidecar
            .metric(
                "lifeguard_capability_decisions_total{capability=\"sampling\",decision=\"allow\",reason=\"exception\",exception=\"ok\"}"
            )
            .await,
        2.0
    );
}

#[tokio::test]
async fn without_an_exception_the_client_never_sees_sampling_and_the_task_fails() {
    // `deny` (the default) needs no exception to refuse; an exception for it changes nothing.
    let s = setup("{}", &[Grant::sampling("ignored", "console").signed()]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({})).await;
    let done = ends_without_asking(&s.client, &token, &task).await;
    assert_refused(&done, "no_exception");
    // The end is recorded: every later read is the same.
    assert_eq!(get(&s.client, &token, &task, true, true).await, done);
    assert_eq!(refusal_trails(&s.sidecar, 1).await, ["no_exception"]);
    let rejected = s
        .sidecar
        .audit()
        .into_iter()
        .find(|e| e["event"] == "capability.rejected")
        .unwrap();
    assert_eq!(rejected["subject"], "alice");
    // The server is asked to stop the task, and no made-up answer is sent to it.
    assert_eq!(upstream_statuses(&s.server).await, ["cancelled"]);
    assert_eq!(
        sidecar_requests(&s.server, "tasks/cancel", "capability_refused").await,
        1
    );
    assert_eq!(upstream_requests(&s.server, "tasks/update").await, 0);
}

#[tokio::test]
async fn exceptions_out_of_force_or_for_someone_else_are_refused_with_their_reason() {
    let expired = Grant {
        not_before: at(-7200),
        expires_at: at(-3600),
        ..Grant::sampling("expired", "expired-app")
    };
    let early = Grant {
        not_before: at(3600),
        expires_at: at(7200),
        ..Grant::sampling("early", "early-app")
    };
    let exceptions = [
        expired.signed(),
        early.signed(),
        // A key that is not the approver's, claiming the approver's kid.
        Grant::sampling("forged", "forged-app").signed_with(&attacker_key(), APPROVER_KID, "tests"),
        Grant::sampling("stranger", "stranger-app").signed_with(
            &approver_key(),
            "nobody-we-know",
            "tests",
        ),
        // A genuine approval for a server in another namespace, copied here.
        Grant::sampling("copied", "copied-app").signed_with(
            &approver_key(),
            APPROVER_KID,
            "elsewhere",
        ),
        Grant::sampling("console-only", "console").signed(),
    ];
    let s = setup("{sampling: exception}", &exceptions).await;
    let cases = [
        ("expired-app", "expired"),
        ("early-app", "not_yet_valid"),
        ("forged-app", "bad_signature"),
        ("stranger-app", "unknown_key"),
        ("copied-app", "wrong_server"),
        ("unlisted-app", "wrong_client"),
    ];
    for (n, (client_id, reason)) in cases.into_iter().enumerate() {
        let token = User::new("alice", "tenant-a", client_id).token();
        let task = summarize(&s.client, &token, json!({})).await;
        let done = ends_without_asking(&s.client, &token, &task).await;
        assert_refused(&done, reason);
        assert_eq!(
            rejections_when(&s.sidecar, n + 1)
                .await
                .last()
                .map(String::as_str),
            Some(reason),
            "{client_id}"
        );
    }
    let reasons: Vec<&str> = cases.iter().map(|(_, r)| *r).collect();
    assert_eq!(refusal_trails(&s.sidecar, cases.len()).await, reasons);
    // A refusal names no exception: none allowed it.
    for reason in &reasons {
        let sample = format!(
            "lifeguard_capability_decisions_total{{capability=\"sampling\",decision=\"deny\",reason=\"{reason}\",exception=\"\"}}"
        );
        assert_eq!(s.sidecar.metric(&sample).await, 1.0, "{sample}");
    }
    assert_eq!(
        upstream_statuses(&s.server).await,
        vec!["cancelled"; cases.len()]
    );
    // The load reported each exception that is not in force.
    let logs = s.sidecar.logs();
    for name in [
        "tests/expired",
        "tests/early",
        "tests/forged",
        "tests/copied",
    ] {
        assert!(
            logs.lines()
                .any(|l| l.contains(name) && l.contains("not in force")),
            "{name} not reported at load:\n{logs}"
        );
    }
}

#[tokio::test]
async fn the_capability_must_be_declared_on_the_request_that_would_carry_it() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({})).await;
    // Polls declaring only the tasks extension are not shown the sampling request and do not
    // decide it (a client that cannot answer must not end the task for one that can): the task
    // keeps waiting, and nothing is audited as allowed or rejected.
    let waiting = support::eventually(Duration::from_secs(10), async || {
        let state = get(&s.client, &token, &task, false, false).await;
        assert!(state.get("inputRequests").is_none(), "{state}");
        (state["status"] == "working" && state["statusMessage"] == "Waiting for a sample")
            .then_some(state)
    })
    .await
    .expect("the task waits for a sample, with the request hidden");
    assert!(waiting.get("error").is_none(), "{waiting}");
    let again = get(&s.client, &token, &task, false, false).await;
    assert_eq!(again["status"], "working", "{again}");
    // The poll that declares sampling is shown the request (the exception allows it).
    let shown = get(&s.client, &token, &task, true, false).await;
    assert_eq!(shown["status"], "input_required", "{shown}");
    let requests = shown["inputRequests"].as_object().expect("input requests");
    assert_eq!(requests.len(), 1, "{shown}");
    assert!(
        requests
            .values()
            .all(|r| r["method"] == "sampling/createMessage"),
        "{shown}"
    );
    assert!(
        s.sidecar
            .audit()
            .iter()
            .all(|e| e["event"] != "capability.rejected"),
        "nothing was rejected"
    );
}

#[tokio::test]
async fn a_sampling_request_hidden_in_a_task_notification_is_screened_too() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let allowed = User::new("alice", "tenant-a", "console").token();
    let refused = User::new("bob", "tenant-a", "other-app").token();
    let caps = meta(true, false)["io.modelcontextprotocol/clientCapabilities"].clone();
    for (token, expect_shown) in [(&allowed, true), (&refused, false)] {
        // Nobody polls: the only way the input request can travel is the listen stream.
        let task = summarize(&s.client, token, json!({"delayMs": 300})).await;
        let mut stream = ListenStream::open_declaring(
            &s.client.url,
            token,
            json!("l"),
            json!({"taskIds": [task]}),
            caps.clone(),
        )
        .await;
        assert_eq!(stream.status, 200);
        let mut frames = Vec::new();
        // Read until the task asks or ends (the stream may stay open).
        while let Some(frame) = stream.next(Duration::from_secs(5)).await {
            let status = frame["params"]["status"].as_str().unwrap_or_default();
            let settled = frame["method"] == "notifications/tasks"
                && ["input_required", "failed", "completed", "cancelled"].contains(&status);
            frames.push(frame);
            if settled {
                break;
            }
        }
        let raw = serde_json::to_string(&frames).unwrap();
        let last = frames.last().unwrap_or_else(|| panic!("{raw}"));
        assert_eq!(last["method"], "notifications/tasks", "{raw}");
        let shown = frames.iter().any(|f| {
            f["params"]["inputRequests"]
                .as_object()
                .is_some_and(|r| r.values().any(|r| r["method"] == "sampling/createMessage"))
        });
        assert_eq!(shown, expect_shown, "{raw}");
        assert_eq!(raw.contains("inputRequests"), expect_shown, "{raw}");
        if expect_shown {
            assert_eq!(last["params"]["status"], "input_required", "{raw}");
            answer(&s.client, token, &task, "sample-1", sample("seen")).await;
            // The completion comes by the stream, its result only by tasks/get.
            let completed = support::eventually(Duration::from_secs(10), async || {
                let frame = stream.next(Duration::from_millis(200)).await?;
                (frame["params"]["status"] == "completed").then_some(frame)
            })
            .await
            .expect("completion notified");
            assert!(completed["params"].get("result").is_none(), "{completed}");
            assert_eq!(
                result_text(&get(&s.client, token, &task, true, false).await),
                "seen"
            );
        } else {
            // The stream tells that the task failed and why, without the error object.
            assert_eq!(last["params"]["status"], "failed", "{raw}");
            assert_eq!(last["params"]["statusMessage"], json!(refusal_message()));
            assert_refused(
                &get(&s.client, token, &task, true, false).await,
                "wrong_client",
            );
        }
        assert!(
            frames
                .iter()
                .all(|f| f["params"].get("result").is_none() && f["params"].get("error").is_none()),
            "{raw}"
        );
    }
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["wrong_client"]);
    assert_eq!(refusal_trails(&s.sidecar, 1).await, ["wrong_client"]);
}

#[tokio::test]
async fn sampling_in_a_multi_round_trip_request_passes_the_gate_or_ends_the_call_with_an_error() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let console = User::new("alice", "tenant-a", "console").token();
    let stranger = User::new("alice", "tenant-a", "other-app").token();
    // No task: the client declares sampling only.
    let mut no_task = meta(true, false);
    no_task["io.modelcontextprotocol/clientCapabilities"] = json!({"sampling": {}});
    let call = |token: &str, extra: Value| {
        let mut params = json!({"name": "summarize_with_sampling",
                                "arguments": {"text": "quarterly numbers", "maxTokens": 100},
                                "_meta": no_task});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        s.client.request("tools/call", params).token(token).send()
    };

    // Under the exception: the client is asked, answers by retrying, and gets the result.
    let first = call(&console, json!({})).await;
    assert_eq!(first.result()["resultType"], "input_required", "{first:?}");
    let request = &first.result()["inputRequests"]["sample-1"];
    assert_eq!(request["method"], "sampling/createMessage", "{first:?}");
    let done = call(
        &console,
        json!({"inputResponses": {"sample-1": sample("margin 57%")},
               "requestState": first.result()["requestState"]}),
    )
    .await;
    assert_eq!(call_text(done.result()), "margin 57%", "{done:?}");
    let calls_before = upstream_requests(&s.server, "tools/call").await;
    assert_eq!(calls_before, 2);

    // Another client: never asked, nothing retried upstream, the call ends with the error.
    let refused = call(&stranger, json!({})).await;
    assert_eq!(refused.status, 200, "{refused:?}");
    assert!(refused.body.get("result").is_none(), "{refused:?}");
    support::capability::assert_refusal_error(&refused.body["error"], "wrong_client");
    assert!(!refused.raw.contains("inputRequests"), "{refused:?}");
    assert_eq!(
        upstream_requests(&s.server, "tools/call").await,
        calls_before + 1,
        "the refused call was retried upstream"
    );
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["wrong_client"]);
    let failed = s
        .sidecar
        .audit_event(|e| e["event"] == "request.failed")
        .await
        .expect("request.failed audited");
    assert_eq!(failed["reason"], "capability_refused");
    assert_eq!(failed["decision"], "deny");
    assert_eq!(failed["detail"]["capability"], "sampling/createMessage");
    assert_eq!(failed["client"], "other-app");
    let audit = s.sidecar.audit();
    let order: Vec<&str> = audit
        .iter()
        .filter(|e| e["correlation_id"] == failed["correlation_id"])
        .filter_map(|e| e["event"].as_str())
        .filter(|e| e.starts_with("capability.") || *e == "request.failed")
        .collect();
    assert_eq!(
        order,
        [
            "capability.requested",
            "capability.rejected",
            "request.failed"
        ]
    );
}

#[tokio::test]
async fn roots_follow_the_same_gate_in_tasks_and_in_multi_round_trip_requests() {
    let roots = Grant {
        capability: "roots",
        ..Grant::sampling("roots", "console")
    };
    let s = setup("{roots: exception}", &[roots.signed()]).await;
    let console = User::new("alice", "tenant-a", "console").token();
    let stranger = User::new("alice", "tenant-a", "other-app").token();

    // As a task: shown to the approved client, answered, counted.
    let reply = s
        .client
        .request(
            "tools/call",
            json!({"name": "list_roots", "arguments": {}, "_meta": meta(false, true)}),
        )
        .token(&console)
        .send()
        .await;
    let task = reply.result()["taskId"].as_str().unwrap().to_owned();
    let asking = next_state(&s.client, &console, &task).await;
    assert_eq!(asking["inputRequests"]["roots-1"]["method"], "roots/list");
    let listed = json!({"roots": [{"uri": "file:///srv/secret-a"}, {"uri": "file:///srv/b"}]});
    answer(&s.client, &console, &task, "roots-1", listed.clone()).await;
    let done = finish(&s.client, &console, &task).await;
    assert_eq!(result_text(&done), "2 roots");

    // As a task for another client: never asked; the sidecar answers the server with no roots
    // itself, and the task completes.
    let reply = s
        .client
        .request(
            "tools/call",
            json!({"name": "list_roots", "arguments": {}, "_meta": meta(false, true)}),
        )
        .token(&stranger)
        .send()
        .await;
    let task = reply.result()["taskId"].as_str().unwrap().to_owned();
    let done = support::eventually(Duration::from_secs(10), async || {
        let state = get(&s.client, &stranger, &task, false, true).await;
        assert_ne!(state["status"], "input_required", "{state}");
        (state["status"] != "working").then_some(state)
    })
    .await
    .expect("the task ends");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(result_text(&done), "0 roots");
    assert_eq!(
        sidecar_requests(&s.server, "tasks/update", "capability_declined").await,
        1
    );

    // Multi round-trip (no task): the approved client gets `input_required` and retries.
    let mrtr =
        |token: &str, params: Value| s.client.request("tools/call", params).token(token).send();
    let mut no_task = meta(false, true);
    no_task["io.modelcontextprotocol/clientCapabilities"] = json!({"roots": {}});
    let first = mrtr(
        &console,
        json!({"name": "list_roots", "arguments": {}, "_meta": no_task}),
    )
    .await;
    assert_eq!(first.result()["resultType"], "input_required", "{first:?}");
    assert_eq!(
        first.result()["inputRequests"]["roots-1"]["method"],
        "roots/list"
    );
    let retry = mrtr(
        &console,
        json!({"name": "list_roots", "arguments": {}, "_meta": no_task,
               "inputResponses": {"roots-1": {"roots": [{"uri": "file:///srv/c"}]}},
               "requestState": first.result()["requestState"]}),
    )
    .await;
    assert_eq!(call_text(retry.result()), "1 roots");

    // Another client: never asked; the sidecar retries the call with no roots itself, so the
    // client gets the server's complete answer in one request.
    let calls_before = upstream_requests(&s.server, "tools/call").await;
    let refused = mrtr(
        &stranger,
        json!({"name": "list_roots", "arguments": {}, "_meta": no_task}),
    )
    .await;
    assert_eq!(refused.status, 200, "{refused:?}");
    assert_eq!(refused.result()["resultType"], "complete", "{refused:?}");
    assert_eq!(call_text(refused.result()), "0 roots");
    assert_eq!(
        upstream_requests(&s.server, "tools/call").await,
        calls_before + 2,
        "the call and the sidecar's retry with no roots"
    );
    assert_eq!(
        rejections_when(&s.sidecar, 2).await,
        ["wrong_client", "wrong_client"]
    );
    // Roots refusals fail nothing.
    assert!(
        !s.sidecar
            .audit()
            .iter()
            .any(|e| e["reason"] == "capability_refused"),
        "{:?}",
        s.sidecar.audit()
    );
    let raw = std::fs::read_to_string(&s.sidecar.audit_path).unwrap();
    assert!(!raw.contains("/srv/"), "root paths in the audit trail");
}

#[tokio::test]
async fn an_allowed_sampling_request_never_answered_is_audited_when_its_task_ends() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("lapsing", "console").signed()],
    )
    .await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({})).await;
    let state = next_state(&s.client, &token, &task).await;
    assert!(state["inputRequests"].get("sample-1").is_some(), "{state}");
    // The owner cancels instead of answering: the allowance lapses with the task.
    let ack = s.client.cancel_task(&token, &task).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert_eq!(
        finish(&s.client, &token, &task).await["status"],
        "cancelled"
    );
    let lapsed = s
        .sidecar
        .audit_events_when(1, |e| e["event"] == "capability.lapsed")
        .await;
    assert_eq!(lapsed.len(), 1, "{:?}", s.sidecar.audit());
    let detail = &lapsed[0]["detail"];
    assert_eq!(detail["inputKey"], "sample-1");
    assert_eq!(detail["exception"], "tests/lapsing");
    assert_eq!(detail["approvalId"], "CHG-1");
    assert_eq!(detail["modelRoute"], "test/route");
    assert_eq!(detail["endReason"], "owner_cancel");
    assert_eq!(lapsed[0]["reason"], "unanswered");

    // An answered request does not lapse.
    let answered = summarize(&s.client, &token, json!({})).await;
    next_state(&s.client, &token, &answered).await;
    answer(&s.client, &token, &answered, "sample-1", sample("done")).await;
    assert_eq!(
        finish(&s.client, &token, &answered).await["status"],
        "completed"
    );
    s.sidecar
        .audit_events_when(2, |e| e["event"] == "task.completed")
        .await;
    let lapses = s
        .sidecar
        .audit()
        .iter()
        .filter(|e| e["event"] == "capability.lapsed")
        .count();
    assert_eq!(lapses, 1);
}

#[tokio::test]
async fn an_answer_is_not_forwarded_while_a_cancel_of_its_task_is_pending() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("cancelled", "console").signed()],
    )
    .await;
    let token = User::new("alice", "tenant-a", "console").token();
    // The server ignores tasks/cancel, so the cancellation stays pending.
    let task = summarize(&s.client, &token, json!({"ignoreCancel": true})).await;
    let state = next_state(&s.client, &token, &task).await;
    assert!(state["inputRequests"].get("sample-1").is_some(), "{state}");
    let ack = s.client.cancel_task(&token, &task).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    answer(&s.client, &token, &task, "sample-1", sample("model output")).await;
    let updated = s
        .sidecar
        .audit_events_when(1, |e| e["event"] == "task.updated")
        .await;
    assert_eq!(updated[0]["reason"], "cancel_pending", "{updated:?}");
    assert_eq!(updated[0]["detail"]["inputsDropped"], 1);
    assert_eq!(upstream_requests(&s.server, "tasks/update").await, 0);
    assert!(
        s.sidecar
            .audit()
            .iter()
            .all(|e| e["event"] != "capability.answered"),
        "{:?}",
        s.sidecar.audit()
    );
}
