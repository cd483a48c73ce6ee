//! The bundled example MCP server, called directly: listen streams, event-stream answers, and
//! the input responses it accepts (typed like the official SDK's).

use crate::support;

use serde_json::{Value, json};
use std::time::Duration;
use support::example_server::*;

/// Like the official Python SDK, the server takes as an answer only the result type of the
/// request it answers; anything else is -32602 and the task keeps waiting for the same key.
#[tokio::test]
async fn input_responses_must_be_the_result_type_of_their_request() {
    let s = Direct::start(&[]);
    let sample =
        json!({"role": "assistant", "content": {"type": "text", "text": "s"}, "model": "m"});
    let cases = [
        (
            "list_roots",
            json!({}),
            "roots-1",
            json!({"error": {"code": -32603, "message": "declined"}}),
        ),
        ("list_roots", json!({}), "roots-1", json!({})),
        ("list_roots", json!({}), "roots-1", Value::Null),
        ("list_roots", json!({}), "roots-1", sample.clone()),
        (
            "list_roots",
            json!({}),
            "roots-1",
            json!({"roots": [{"uri": "/not/a/file/url"}]}),
        ),
        (
            "summarize_with_sampling",
            json!({"text": "t"}),
            "sample-1",
            json!({"error": {"code": -32603, "message": "declined"}}),
        ),
        (
            "summarize_with_sampling",
            json!({"text": "t"}),
            "sample-1",
            json!({"roots": []}),
        ),
        (
            "summarize_with_sampling",
            json!({"text": "t"}),
            "sample-1",
            json!({"action": "decline"}),
        ),
        (
            "summarize_with_sampling",
            json!({"text": "t"}),
            "sample-1",
            json!({"role": "assistant", "content": {"type": "text", "text": "no model"}}),
        ),
        (
            "confirm_action",
            json!({"action": "x"}),
            "confirm-1",
            json!({"error": {"code": -32603, "message": "declined"}}),
        ),
        (
            "confirm_action",
            json!({"action": "x"}),
            "confirm-1",
            json!({"action": "maybe"}),
        ),
    ];
    for (tool, args, key, answer) in cases {
        let id = s.start_task(tool, args).await;
        s.wait_status(&id, "input_required").await;
        let reply = s
            .call(
                "tasks/update",
                json!({"taskId": id, "inputResponses": {key: answer}}),
                true,
            )
            .await;
        assert_invalid_params(&reply, key);
        let still = s.get_task(&id).await;
        assert_eq!(
            still["status"], "input_required",
            "{tool} {answer}: {still}"
        );
        assert!(still["inputRequests"][key].is_object(), "{still}");
        s.ok("tasks/cancel", json!({"taskId": id}), true).await;
    }

    // An invalid answer beside a valid one: nothing is applied.
    let id = s.start_task("multi_input", json!({})).await;
    s.wait_status(&id, "input_required").await;
    let reply = s
        .call(
            "tasks/update",
            json!({"taskId": id, "inputResponses": {
                "name-1": {"action": "accept", "content": {"name": "Ada"}},
                "color-1": {"error": {"code": -1, "message": "no"}}
            }}),
            true,
        )
        .await;
    assert_invalid_params(&reply, "color-1");
    let keys: Vec<String> = s.get_task(&id).await["inputRequests"]
        .as_object()
        .expect("map")
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, ["color-1", "name-1"]);

    // Members the schema does not name are ignored; an empty root list is an answer.
    let id = s.start_task("list_roots", json!({})).await;
    s.wait_status(&id, "input_required").await;
    s.update(
        &id,
        json!({"roots-1": {"roots": [], "error": {"code": -1, "message": "ignored"}}}),
    )
    .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "0 roots");
}

/// Without a task, `list_roots` and `summarize_with_sampling` are multi round-trip requests:
/// `input_required` with a `requestState`, then the retry carrying `inputResponses`, which are
/// checked as strictly as on `tasks/update`.

#[tokio::test]
async fn sampling_and_roots_as_multi_round_trip_requests() {
    let s = Direct::start(&[]);
    let call = |name: &str, extra: Value| {
        let mut params = json!({"name": name, "arguments": {"text": "t", "rounds": 2}});
        if name == "list_roots" {
            params["arguments"] = json!({});
        }
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        s.call("tools/call", params, false)
    };

    let first = call("list_roots", json!({})).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.result()["resultType"], "input_required");
    assert_eq!(
        first.result()["inputRequests"],
        json!({"roots-1": {"method": "roots/list", "params": {}}})
    );
    let state = first.result()["requestState"].clone();
    let refused = call(
        "list_roots",
        json!({"inputResponses": {"roots-1": {"error": {"code": -32603, "message": "declined"}}}, "requestState": state}),
    )
    .await;
    assert_invalid_params(&refused, "roots-1");
    // Anything a retry carries must be an InputResponse, even for a key nobody asked.
    let stray = call(
        "list_roots",
        json!({"inputResponses": {"roots-1": {"roots": []}, "other": {"error": {}}}, "requestState": state}),
    )
    .await;
    assert_invalid_params(&stray, "other");
    let again = call(
        "list_roots",
        json!({"inputResponses": {}, "requestState": state}),
    )
    .await;
    assert_eq!(again.result()["resultType"], "input_required", "{again:?}");
    let none = call(
        "list_roots",
        json!({"inputResponses": {"roots-1": {"roots": []}}, "requestState": state}),
    )
    .await;
    assert_eq!(none.result()["content"][0]["text"], "0 roots", "{none:?}");

    let first = call("summarize_with_sampling", json!({})).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.result()["resultType"], "input_required");
    let request = &first.result()["inputRequests"]["sample-1"];
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(
        request["params"]["messages"][0]["content"]["text"],
        "Summarize: t"
    );
    let state = first.result()["requestState"].clone();
    let refused = call(
        "summarize_with_sampling",
        json!({"inputResponses": {"sample-1": {"error": {"code": -32603, "message": "declined"}}}, "requestState": state}),
    )
    .await;
    assert_invalid_params(&refused, "sample-1");
    let wrong_type = call(
        "summarize_with_sampling",
        json!({"inputResponses": {"sample-1": {"roots": []}}, "requestState": state}),
    )
    .await;
    assert_invalid_params(&wrong_type, "sample-1");
    let answer = |text: &str| json!({"role": "assistant", "content": {"type": "text", "text": text}, "model": "m"});
    let second = call(
        "summarize_with_sampling",
        json!({"inputResponses": {"sample-1": answer("one")}, "requestState": state}),
    )
    .await;
    assert_eq!(
        second.result()["resultType"],
        "input_required",
        "{second:?}"
    );
    assert!(
        second.result()["inputRequests"]["sample-2"].is_object(),
        "{second:?}"
    );
    let done = call(
        "summarize_with_sampling",
        json!({"inputResponses": {"sample-2": answer("two")}, "requestState": second.result()["requestState"]}),
    )
    .await;
    assert_eq!(done.result()["resultType"], "complete", "{done:?}");
    assert_eq!(done.result()["content"][0]["text"], "one | two");
}

#[tokio::test]
async fn listen_acknowledges_first_with_subscription_id() {
    let s = Direct::start(&[]);
    for id in [json!(41), json!("sub-x")] {
        let mut sse = s
            .listen(
                id.clone(),
                json!({"toolsListChanged": true, "taskIds": ["task-404"], "unknownKey": true}),
            )
            .await;
        let ack = next_message(&mut sse, LONG).await.expect("ack frame");
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(ack["params"]["_meta"][SUB_ID], id);
        // Unknown task IDs are acknowledged too (existence is not revealed).
        assert_eq!(
            ack["params"]["notifications"],
            json!({"toolsListChanged": true, "taskIds": ["task-404"]})
        );
        s.server.emit(json!({"kind": "toolsListChanged"})).await;
        let n = next_message(&mut sse, LONG).await.expect("list_changed");
        assert_eq!(n["method"], "notifications/tools/list_changed");
        assert_eq!(n["params"]["_meta"][SUB_ID], id);
    }
    // Listeners are cleaned up when the client goes away.
    let cleaned = support::poll_until(LONG, Duration::from_millis(20), async || {
        (s.server.debug("/_example/listeners").await["active"] == 0).then_some(())
    })
    .await;
    assert!(cleaned.is_some(), "listen streams not cleaned up");
    // taskIds without declaring the tasks extension: an error, no stream.
    let reply = s
        .request(
            "subscriptions/listen",
            json!({"notifications": {"taskIds": ["task-1"]}}),
            false,
        )
        .id(json!(7))
        .send()
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), Some(-32021));
}

#[tokio::test]
async fn listen_delivers_only_subscribed_tasks() {
    let s = Direct::start(&[]);
    // Guessable IDs make it possible to subscribe before the task exists.
    let mut sse = s
        .listen(json!("tasks-sub"), json!({"taskIds": ["task-2"]}))
        .await;
    assert_eq!(
        next_message(&mut sse, LONG).await.expect("ack")["method"],
        "notifications/subscriptions/acknowledged"
    );
    let other = s.start_task("slow_compute", json!({"seconds": 0.05})).await;
    let watched = s
        .start_task("confirm_action", json!({"action": "ship"}))
        .await;
    assert_eq!((other.as_str(), watched.as_str()), ("task-1", "task-2"));
    s.wait_status(&other, "completed").await;

    let waiting = next_message(&mut sse, LONG)
        .await
        .expect("input_required notification");
    assert_eq!(waiting["method"], "notifications/tasks");
    assert_eq!(waiting["params"]["taskId"], "task-2");
    assert_eq!(waiting["params"]["status"], "input_required");
    assert!(waiting["params"]["inputRequests"]["confirm-1"].is_object());
    assert_eq!(waiting["params"]["_meta"][SUB_ID], "tasks-sub");

    s.update(
        &watched,
        json!({"confirm-1": {"action": "accept", "content": {"confirm": true}}}),
    )
    .await;
    let mut last = Value::Null;
    while let Some(frame) = next_message(&mut sse, LONG).await {
        assert_eq!(
            frame["params"]["taskId"], "task-2",
            "unsubscribed task leaked: {frame}"
        );
        assert_eq!(frame["params"]["_meta"][SUB_ID], "tasks-sub");
        let done = frame["params"]["status"] == "completed";
        last = frame;
        if done {
            break;
        }
    }
    assert_eq!(
        last["params"]["result"]["content"][0]["text"],
        "confirmed ship"
    );
    assert!(last["params"].get("resultType").is_none());
    assert!(
        next_message(&mut sse, SHORT).await.is_none(),
        "nothing else expected"
    );
}

#[tokio::test]
async fn listen_resource_updates_only_for_subscribed_uris() {
    let s = Direct::start(&[]);
    let mut sse = s
        .listen(json!(5), json!({"resourceSubscriptions": ["file:///a"]}))
        .await;
    let ack = next_message(&mut sse, LONG).await.expect("ack");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": ["file:///a"]})
    );
    s.server
        .emit(json!({"kind": "resourceUpdated", "uri": "file:///b"}))
        .await;
    s.server.emit(json!({"kind": "toolsListChanged"})).await;
    s.server
        .emit(json!({"kind": "resourceUpdated", "uri": "file:///a"}))
        .await;
    let n = next_message(&mut sse, LONG).await.expect("resource update");
    assert_eq!(n["method"], "notifications/resources/updated");
    assert_eq!(n["params"]["uri"], "file:///a");
    assert_eq!(n["params"]["_meta"][SUB_ID], 5);
    assert!(next_message(&mut sse, SHORT).await.is_none());
}

#[tokio::test]
async fn listen_ends_after_max_listen_secs() {
    let s = Direct::start(&["--max-listen-secs", "1"]);
    let mut sse = s
        .listen(json!(9), json!({"promptsListChanged": true}))
        .await;
    assert!(next_message(&mut sse, LONG).await.is_some());
    let end = next_message(&mut sse, LONG).await.expect("closing result");
    assert_eq!(end["id"], 9);
    assert_eq!(
        end["result"],
        json!({"resultType": "complete", "_meta": {SUB_ID: 9}})
    );
    assert!(next_message(&mut sse, SHORT).await.is_none());
}

#[tokio::test]
async fn tools_call_over_sse_sends_progress_then_result() {
    let s = Direct::start(&[]);
    let mut meta = request_meta(capabilities(true));
    meta["progressToken"] = json!("p-1");
    let mut sse = s
        .request(
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 0.05}, "_meta": meta}),
            true,
        )
        .id(json!("call-1"))
        .accept_sse()
        .stream()
        .await;
    assert_eq!(sse.status, 200);
    assert_sse(&sse);
    let mut frames = Vec::new();
    while let Some(frame) = next_message(&mut sse, LONG).await {
        frames.push(frame);
    }
    let (last, progress) = frames.split_last().expect("frames");
    assert!(
        progress.len() >= 2,
        "expected a few progress frames: {frames:?}"
    );
    for p in progress {
        assert_eq!(p["method"], "notifications/progress");
        assert_eq!(p["params"]["progressToken"], "p-1");
    }
    assert_eq!(last["id"], "call-1");
    assert_eq!(last["result"]["resultType"], "task");
    let task_id = last["result"]["taskId"].as_str().expect("taskId");
    let done = s.wait_status(task_id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "computed ");

    // Without a progressToken the same request is answered as plain JSON.
    let plain = s
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {"name": "x"}}),
            true,
        )
        .accept_sse()
        .send()
        .await;
    let ctype = plain
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(ctype.starts_with("application/json"), "{ctype}");
}
