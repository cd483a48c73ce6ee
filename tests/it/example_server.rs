//! End-to-end tests of the example MCP server (`examples/example_server`), run as a separate
//! process and driven over HTTP: the protocol surface the Lifeguard sidecar relies on, plus the
//! deliberate weaknesses it is meant to hide (guessable IDs, a buggy terminal-state flip).

use crate::support;

use serde_json::json;
use std::time::Duration;
use support::example_server::*;

#[tokio::test]
async fn discover_list_and_greet() {
    let s = Direct::start(&[]);
    let d = s.ok("server/discover", json!({}), false).await;
    assert_eq!(d["resultType"], "complete");
    assert_eq!(d["supportedVersions"], json!([VERSION]));
    assert_eq!(d["capabilities"]["extensions"][TASKS], json!({}));
    assert_eq!(d["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(d["capabilities"]["resources"]["subscribe"], true);
    assert_eq!(d["serverInfo"]["name"], "lifeguard-example-server");

    let tools = s.ok("tools/list", json!({}), false).await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for name in ["greet", "write_rows", "confirm_action", "unstable_status"] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    assert!(tools["tools"][0]["inputSchema"]["type"] == "object");

    // greet is synchronous, with or without the tasks extension.
    for ext in [false, true] {
        let r = s.tool("greet", json!({"name": "Ada"}), ext).await;
        assert_eq!(
            r,
            json!({"resultType": "complete", "content": [{"type": "text", "text": "Hello, Ada!"}], "isError": false})
        );
    }
    // Task-capable tools run synchronously without the extension.
    let r = s
        .tool(
            "slow_compute",
            json!({"seconds": 0.05, "label": "x"}),
            false,
        )
        .await;
    assert_eq!(r["resultType"], "complete");
    assert_eq!(r["content"][0]["text"], "computed x");
    assert!(
        s.server
            .debug("/_example/tasks")
            .await
            .as_array()
            .expect("list")
            .is_empty()
    );
}

#[tokio::test]
async fn write_rows_task_completes_with_guessable_id() {
    let s = Direct::start(&[]);
    let id = s
        .start_task(
            "write_rows",
            json!({"count": 3, "intervalMs": 30, "label": "t"}),
        )
        .await;
    // Deliberately guessable upstream IDs: the first task is task-1.
    assert_eq!(id, "task-1");
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "wrote 3 rows");
    assert_eq!(done["result"]["isError"], false);
    let rows = s.rows_of(&id).await;
    let numbers: Vec<u64> = rows.iter().filter_map(|r| r["row"].as_u64()).collect();
    assert_eq!(numbers, vec![1, 2, 3]);
    assert!(rows.iter().all(|r| r["label"] == "t" && r["atMs"].is_u64()));
    let second = s.start_task("slow_compute", json!({"seconds": 0})).await;
    assert_eq!(second, "task-2");
    let tasks = s.server.debug("/_example/tasks").await;
    assert_eq!(tasks[0], json!({"taskId": "task-1", "status": "completed"}));
}

#[tokio::test]
async fn cancel_stops_rows() {
    let s = Direct::start(&[]);
    let interval = 50;
    let id = s
        .start_task("write_rows", json!({"count": 200, "intervalMs": interval}))
        .await;
    let rows = support::poll_until(LONG, Duration::from_millis(10), async || {
        (s.rows_of(&id).await.len() >= 2).then_some(())
    })
    .await;
    assert!(rows.is_some(), "rows never appeared");
    let ack = s.ok("tasks/cancel", json!({"taskId": id}), true).await;
    assert_eq!(ack, json!({"resultType": "complete"}));
    let after_cancel = s.rows_of(&id).await.len();
    let task = s.get_task(&id).await;
    assert_eq!(task["status"], "cancelled");
    assert_eq!(task["statusMessage"], "Cancelled by request");

    tokio::time::sleep(Duration::from_millis(3 * interval)).await;
    assert_eq!(
        s.rows_of(&id).await.len(),
        after_cancel,
        "a row was written after cancel"
    );
    // Cancelling a terminal task: same ack, no change.
    let again = s.ok("tasks/cancel", json!({"taskId": id}), true).await;
    assert_eq!(again, json!({"resultType": "complete"}));
    assert_eq!(s.get_task(&id).await["status"], "cancelled");
}

#[tokio::test]
async fn confirm_action_input_flow() {
    let s = Direct::start(&[]);
    let id = s
        .start_task("confirm_action", json!({"action": "deploy"}))
        .await;
    let waiting = s.wait_status(&id, "input_required").await;
    assert_eq!(
        waiting["inputRequests"],
        json!({"confirm-1": {"method": "elicitation/create", "params": {
            "message": "Really deploy?",
            "requestedSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}
        }}})
    );
    // Unknown keys are ignored.
    s.update(&id, json!({"nope-1": {"action": "accept"}})).await;
    assert_eq!(s.get_task(&id).await["status"], "input_required");
    s.update(
        &id,
        json!({"confirm-1": {"action": "accept", "content": {"confirm": true}}}),
    )
    .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "confirmed deploy");
    assert!(done.get("inputRequests").is_none());

    let id = s
        .start_task("confirm_action", json!({"action": "drop db"}))
        .await;
    s.wait_status(&id, "input_required").await;
    s.update(&id, json!({"confirm-1": {"action": "decline"}}))
        .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "declined drop db");

    // Input tools cannot run without the tasks extension.
    let reply = s
        .call(
            "tools/call",
            json!({"name": "confirm_action", "arguments": {"action": "x"}}),
            false,
        )
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), Some(-32021));
    assert_eq!(
        reply.body["error"]["data"]["requiredCapabilities"],
        json!({"extensions": {TASKS: {}}})
    );
}

#[tokio::test]
async fn multi_input_partial_answers() {
    let s = Direct::start(&[]);
    let id = s.start_task("multi_input", json!({})).await;
    let waiting = s.wait_status(&id, "input_required").await;
    let keys: Vec<&String> = waiting["inputRequests"]
        .as_object()
        .expect("map")
        .keys()
        .collect();
    assert_eq!(keys, ["color-1", "name-1"]);

    s.update(
        &id,
        json!({"name-1": {"action": "accept", "content": {"name": "Ada"}}}),
    )
    .await;
    let partial = s.get_task(&id).await;
    assert_eq!(partial["status"], "input_required");
    let keys: Vec<&String> = partial["inputRequests"]
        .as_object()
        .expect("map")
        .keys()
        .collect();
    assert_eq!(keys, ["color-1"]);

    s.update(
        &id,
        json!({
            "name-1": {"action": "accept", "content": {"name": "ignored"}},
            "color-1": {"action": "accept", "content": {"color": "blue"}}
        }),
    )
    .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(
        done["result"]["content"][0]["text"],
        "name: Ada, color: blue"
    );
}

#[tokio::test]
async fn sampling_and_roots() {
    let s = Direct::start(&[]);
    let id = s
        .start_task(
            "summarize_with_sampling",
            json!({"text": "long text", "maxTokens": 42}),
        )
        .await;
    let waiting = s.wait_status(&id, "input_required").await;
    let req = &waiting["inputRequests"]["sample-1"];
    assert_eq!(req["method"], "sampling/createMessage");
    assert_eq!(req["params"]["maxTokens"], 42);
    assert_eq!(
        req["params"]["messages"][0]["content"]["text"],
        "Summarize: long text"
    );
    s.update(
        &id,
        json!({"sample-1": {"role": "assistant", "content": {"type": "text", "text": "short"}, "model": "m"}}),
    )
    .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "short");

    let id = s
        .start_task("summarize_with_sampling", json!({"text": "t"}))
        .await;
    s.wait_status(&id, "input_required").await;
    // No refusal exists for sampling: an error object is not a CreateMessageResult.
    let refused = s
        .call(
            "tasks/update",
            json!({"taskId": id, "inputResponses": {"sample-1": {"error": {"code": -1, "message": "no"}}}}),
            true,
        )
        .await;
    assert_invalid_params(&refused, "sample-1");
    let still = s.get_task(&id).await;
    assert_eq!(still["status"], "input_required", "{still}");
    assert!(still["inputRequests"]["sample-1"].is_object(), "{still}");
    s.update(
        &id,
        json!({"sample-1": {"role": "assistant", "content": [{"type": "text", "text": "in a block"}], "model": "m"}}),
    )
    .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "in a block");
    assert_eq!(done["result"]["isError"], false);

    let id = s.start_task("list_roots", json!({})).await;
    let waiting = s.wait_status(&id, "input_required").await;
    assert_eq!(
        waiting["inputRequests"],
        json!({"roots-1": {"method": "roots/list", "params": {}}})
    );
    s.update(
        &id,
        json!({"roots-1": {"roots": [{"uri": "file:///a"}, {"uri": "file:///b"}]}}),
    )
    .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "2 roots");
}

#[tokio::test]
async fn failing_job_and_unstable_status() {
    let s = Direct::start(&[]);
    let id = s.start_task("failing_job", json!({"afterMs": 10})).await;
    let failed = s.wait_status(&id, "failed").await;
    assert_eq!(
        failed["error"],
        json!({"code": -32603, "message": "job failed on purpose"})
    );
    assert!(failed.get("result").is_none());

    // The deliberately buggy tool: completed first, then its stored state flips to failed.
    let id = s
        .start_task("unstable_status", json!({"flipAfterMs": 200}))
        .await;
    let first = s.wait_status(&id, "completed").await;
    assert_eq!(first["result"]["content"][0]["text"], "first answer");
    let flipped = s.wait_status(&id, "failed").await;
    assert_eq!(
        flipped["error"],
        json!({"code": -32603, "message": "changed my mind"})
    );
}

#[tokio::test]
async fn protocol_errors() {
    let s = Direct::start(&[]);
    let reply = s
        .call("tasks/get", json!({"taskId": "task-999"}), true)
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), Some(-32602));
    assert_eq!(reply.body["error"]["message"], "Task not found: task-999");
    // Mcp-Name, when sent, must match params.taskId (the base64 form is decoded first).
    for (name, code) in [("task-8", -32020), ("=?base64?dGFzay03?=", -32602)] {
        let reply = s
            .request("tasks/get", json!({"taskId": "task-7"}), true)
            .header("mcp-method", "tasks/get")
            .header("mcp-name", name)
            .send()
            .await;
        assert_eq!(reply.status, 400);
        assert_eq!(reply.error_code(), Some(code));
    }
    // tasks/* without declaring the extension.
    let reply = s
        .call("tasks/get", json!({"taskId": "task-1"}), false)
        .await;
    assert_eq!((reply.status, reply.error_code()), (400, Some(-32021)));
    for method in ["tasks/list", "tasks/result", "initialize", "no/such"] {
        let reply = s.call(method, json!({}), true).await;
        assert_eq!(reply.status, 404, "{method}");
        assert_eq!(reply.error_code(), Some(-32601));
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = reqwest::Client::new()
            .request(method, &s.server.url)
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status(), reqwest::StatusCode::METHOD_NOT_ALLOWED);
    }
    // Missing MCP-Protocol-Version header.
    let reply = s
        .request("server/discover", json!({}), false)
        .without_header("mcp-protocol-version")
        .send()
        .await;
    assert_eq!(reply.status, 400);
    assert!(reply.error_code().is_some(), "{reply:?}");
    // Unsupported version (header and body agree).
    let mut old = request_meta(capabilities(false));
    old["io.modelcontextprotocol/protocolVersion"] = json!("2025-11-25");
    let reply = s
        .request("server/discover", json!({"_meta": old}), false)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), Some(-32022));
    assert_eq!(
        reply.body["error"]["data"],
        json!({"supported": [VERSION], "requested": "2025-11-25"})
    );
    // Missing clientCapabilities.
    let mut no_caps = request_meta(capabilities(false));
    no_caps
        .as_object_mut()
        .expect("meta")
        .remove("io.modelcontextprotocol/clientCapabilities");
    let reply = s
        .request("server/discover", json!({"_meta": no_caps}), false)
        .send()
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), Some(-32602));

    let raw = |text: &str| {
        s.request("server/discover", json!({}), false)
            .send_raw(text.to_owned())
    };
    let reply = raw("{not json").await;
    assert_eq!((reply.status, reply.error_code()), (400, Some(-32700)));
    let reply = raw("[]").await;
    assert_eq!((reply.status, reply.error_code()), (400, Some(-32600)));
    let reply = raw(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#).await;
    assert_eq!(reply.status, 202);
    assert!(reply.raw.is_empty(), "{reply:?}");
}

#[tokio::test]
async fn request_log_records_headers_but_not_secrets() {
    let s = Direct::start(&[]);
    let reply = s
        .request("server/discover", json!({}), false)
        .token("secret-token-value")
        .header("lifeguard-owner", "alice")
        .send()
        .await;
    assert_eq!(reply.status, 200);
    let log = s.server.debug("/_example/requests").await;
    let text = log.to_string();
    assert!(
        !text.contains("secret-token-value"),
        "authorization value leaked: {text}"
    );
    let entry = &log[0];
    assert_eq!(entry["method"], "POST");
    assert_eq!(entry["mcpMethod"], "server/discover");
    assert_eq!(entry["authorization"], true);
    assert_eq!(entry["lifeguard"], json!({"lifeguard-owner": "alice"}));
}
