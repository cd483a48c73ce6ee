//! End-to-end tests of the example MCP server (`examples/example_server`), run as a separate
//! process and driven over HTTP: the protocol surface the Lifeguard sidecar relies on, plus the
//! deliberate weaknesses it is meant to hide (guessable IDs, a buggy terminal-state flip).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::client::{
    McpClient, PROTOCOL_VERSION as VERSION, Reply, RequestBuilder, TASKS_EXTENSION as TASKS,
    capabilities, request_meta,
};
use support::listen::ListenStream;

const SUB_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The example server, talked to directly, without a token.
struct Direct {
    server: support::ExampleServer,
    client: McpClient,
    next_id: AtomicU64,
}

impl Direct {
    fn start(extra: &[&str]) -> Self {
        let mut args = vec!["--poll-interval-ms", "100"];
        args.extend_from_slice(extra);
        let server = support::ExampleServer::start_with(&args);
        let client = McpClient::new(&server.url);
        Self {
            server,
            client,
            next_id: AtomicU64::new(1),
        }
    }

    /// A request with a fresh id. It carries no `Mcp-Method`/`Mcp-Name` unless a test adds
    /// them: this peer accepts their absence (and checks them when present).
    fn request(&self, method: &str, params: Value, tasks_ext: bool) -> RequestBuilder {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let request = self
            .client
            .request(method, params)
            .id(json!(id))
            .without_header("mcp-method")
            .without_header("mcp-name");
        if tasks_ext {
            request
        } else {
            request.without_tasks()
        }
    }

    /// One JSON-RPC call; the answer must echo the request id.
    async fn call(&self, method: &str, params: Value, tasks_ext: bool) -> Reply {
        let request = self.request(method, params, tasks_ext);
        let id = request.message()["id"].clone();
        let reply = request.send().await;
        assert_eq!(
            reply.body["id"], id,
            "response id echoes the request id: {reply:?}"
        );
        reply
    }

    /// A call that must succeed; returns `result`.
    async fn ok(&self, method: &str, params: Value, tasks_ext: bool) -> Value {
        let reply = self.call(method, params, tasks_ext).await;
        assert_eq!(reply.status, 200, "{method} failed: {}", reply.raw);
        reply.result().clone()
    }

    async fn tool(&self, name: &str, arguments: Value, tasks_ext: bool) -> Value {
        self.ok(
            "tools/call",
            json!({"name": name, "arguments": arguments}),
            tasks_ext,
        )
        .await
    }

    /// Starts a task-capable tool with the tasks extension and returns its task ID.
    async fn start_task(&self, name: &str, arguments: Value) -> String {
        let created = self.tool(name, arguments, true).await;
        assert_eq!(created["resultType"], "task", "{created}");
        assert_eq!(created["status"], "working");
        for key in ["createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"] {
            assert!(created.get(key).is_some(), "CreateTaskResult lacks {key}");
        }
        assert!(created.get("result").is_none() && created.get("task").is_none());
        created["taskId"].as_str().expect("taskId").to_owned()
    }

    async fn get_task(&self, task_id: &str) -> Value {
        let task = self.ok("tasks/get", json!({"taskId": task_id}), true).await;
        assert_eq!(task["resultType"], "complete");
        assert_eq!(task["taskId"], task_id);
        task
    }

    /// Polls tasks/get every 20 ms until `status` is reached (or fails after 5 s).
    async fn wait_status(&self, task_id: &str, status: &str) -> Value {
        let mut last = Value::Null;
        let reached = support::poll_until(LONG, Duration::from_millis(20), async || {
            let task = self.get_task(task_id).await;
            last = task.clone();
            (task["status"] == status).then_some(task)
        })
        .await;
        reached
            .unwrap_or_else(|| panic!("task {task_id} never reached {status}; last state {last}"))
    }

    async fn update(&self, task_id: &str, responses: Value) {
        let ack = self
            .ok(
                "tasks/update",
                json!({"taskId": task_id, "inputResponses": responses}),
                true,
            )
            .await;
        assert_eq!(ack, json!({"resultType": "complete"}));
    }

    async fn rows_of(&self, task_id: &str) -> Vec<Value> {
        self.server.rows_where("taskId", task_id).await
    }

    /// Opens `subscriptions/listen`; the answer must be an event stream.
    async fn listen(&self, id: Value, notifications: Value) -> ListenStream {
        let params = json!({"notifications": notifications});
        let stream = self
            .request("subscriptions/listen", params, true)
            .id(id)
            .accept_sse()
            .stream()
            .await;
        assert_eq!(stream.status, 200);
        assert_sse(&stream);
        stream
    }
}

fn assert_sse(stream: &ListenStream) {
    assert!(
        stream.content_type.starts_with("text/event-stream"),
        "content-type {}",
        stream.content_type
    );
}

/// The next frame of an event stream, which must be a `message` event; `None` on timeout or
/// end of stream.
async fn next_message(stream: &mut ListenStream, wait: Duration) -> Option<Value> {
    let frame = stream.next(wait).await?;
    assert_eq!(
        stream.last_event.as_deref(),
        Some("message"),
        "SSE event type is message: {frame}"
    );
    Some(frame)
}

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(5);

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

/// A 400 / -32602 "Invalid request parameters" naming `key` as the invalid input response.
fn assert_invalid_params(reply: &Reply, key: &str) {
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.error_code(), Some(-32602), "{reply:?}");
    assert_eq!(reply.body["error"]["message"], "Invalid request parameters");
    assert!(
        reply.body["error"]["data"]["inputResponses"][key].is_string(),
        "{reply:?}"
    );
}

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
