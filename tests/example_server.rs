//! End-to-end tests of the example MCP server (`examples/example_server`), run as a separate
//! process and driven over HTTP: the protocol surface the Lifeguard sidecar relies on, plus the
//! deliberate weaknesses it is meant to hide (guessable IDs, a buggy terminal-state flip).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

const VERSION: &str = "2026-07-28";
const TASKS: &str = "io.modelcontextprotocol/tasks";
const SUB_ID: &str = "io.modelcontextprotocol/subscriptionId";

fn example_binary() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // The lifeguard binary lives in target/<profile>/, examples in target/<profile>/examples/.
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_lifeguard"));
        let dir = bin
            .parent()
            .expect("CARGO_BIN_EXE_lifeguard has a parent directory");
        let path = dir
            .join("examples")
            .join(format!("example_server{}", std::env::consts::EXE_SUFFIX));
        // A plain `cargo test` builds examples first; `cargo test --test example_server` does
        // not. Build (or confirm up to date) here, same profile and target directory, so the
        // tests never run a stale binary.
        build_example(dir, &path);
        assert!(
            path.is_file(),
            "example server binary not found at {}; build it with \
             `cargo build --example example_server`",
            path.display()
        );
        path
    })
    .clone()
}

fn build_example(profile_dir: &Path, binary: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "--example",
        "example_server",
        "--manifest-path",
    ])
    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    match cmd.status() {
        Ok(status) => assert!(
            status.success(),
            "cargo build --example example_server failed"
        ),
        // No cargo at hand (test binary run directly): use whatever was built before.
        Err(e) => eprintln!(
            "could not run cargo ({e}); using {} as is",
            binary.display()
        ),
    }
}

/// A running example server; killed when dropped.
struct ExampleServer {
    child: Child,
    mcp_url: String,
    base: String,
    http: reqwest::Client,
    next_id: AtomicU64,
}

impl Drop for ExampleServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ExampleServer {
    fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(example_binary())
            .args(["--listen", "127.0.0.1:0", "--poll-interval-ms", "100"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start example server");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("listening on ") {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let mcp_url = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("example server did not print its URL");
            }
        };
        let base = mcp_url.trim_end_matches("/mcp").to_owned();
        Self {
            child,
            mcp_url,
            base,
            http: reqwest::Client::new(),
            next_id: AtomicU64::new(1),
        }
    }

    fn meta(tasks_ext: bool) -> Value {
        let caps = if tasks_ext {
            json!({"extensions": {TASKS: {}}})
        } else {
            json!({})
        };
        json!({
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities": caps,
        })
    }

    /// Builds a request body with the required `_meta` merged into `params`.
    fn body(&self, id: Value, method: &str, mut params: Value, tasks_ext: bool) -> Value {
        let mut meta = Self::meta(tasks_ext);
        if let Some(extra) = params.get("_meta").and_then(Value::as_object) {
            for (k, v) in extra {
                meta[k] = v.clone();
            }
        }
        params["_meta"] = meta;
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    async fn post(&self, body: &Value) -> reqwest::Response {
        self.http
            .post(&self.mcp_url)
            .header("MCP-Protocol-Version", VERSION)
            .header("Accept", "application/json")
            .json(body)
            .send()
            .await
            .expect("POST /mcp")
    }

    /// One JSON-RPC call; returns the HTTP status and the whole response envelope.
    async fn call(&self, method: &str, params: Value, tasks_ext: bool) -> (StatusCode, Value) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let resp = self
            .post(&self.body(json!(id), method, params, tasks_ext))
            .await;
        let status = resp.status();
        let body: Value = resp.json().await.expect("JSON response body");
        assert_eq!(body["id"], json!(id), "response id echoes the request id");
        (status, body)
    }

    /// A call that must succeed; returns `result`.
    async fn ok(&self, method: &str, params: Value, tasks_ext: bool) -> Value {
        let (status, body) = self.call(method, params, tasks_ext).await;
        assert_eq!(status, StatusCode::OK, "{method} failed: {body}");
        body["result"].clone()
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

    /// Polls tasks/get until `status` is reached (or fails after 5 s).
    async fn wait_status(&self, task_id: &str, status: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let task = self.get_task(task_id).await;
            if task["status"] == status {
                return task;
            }
            assert!(
                Instant::now() < deadline,
                "task {task_id} never reached {status}; last state {task}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

    async fn debug(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("GET debug endpoint")
            .json()
            .await
            .expect("debug JSON")
    }

    async fn rows_of(&self, task_id: &str) -> Vec<Value> {
        let rows = self.debug("/_example/rows").await;
        rows.as_array()
            .expect("rows array")
            .iter()
            .filter(|r| r["taskId"] == task_id)
            .cloned()
            .collect()
    }

    async fn emit(&self, event: Value) {
        let resp = self
            .http
            .post(format!("{}/_example/emit", self.base))
            .json(&event)
            .send()
            .await
            .expect("POST emit");
        assert_eq!(resp.status(), StatusCode::OK);
    }

    /// Opens `subscriptions/listen` and returns the SSE reader.
    async fn listen(&self, id: Value, notifications: Value) -> Sse {
        let body = self.body(
            id,
            "subscriptions/listen",
            json!({"notifications": notifications}),
            true,
        );
        let resp = self
            .http
            .post(&self.mcp_url)
            .header("MCP-Protocol-Version", VERSION)
            .header("Accept", "application/json, text/event-stream")
            .json(&body)
            .send()
            .await
            .expect("POST listen");
        assert_eq!(resp.status(), StatusCode::OK);
        Sse::new(resp)
    }
}

/// Minimal SSE reader on top of `reqwest::Response::chunk`.
struct Sse {
    resp: reqwest::Response,
    buf: String,
}

impl Sse {
    fn new(resp: reqwest::Response) -> Self {
        let ctype = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            ctype.starts_with("text/event-stream"),
            "content-type {ctype}"
        );
        Self {
            resp,
            buf: String::new(),
        }
    }

    /// The next JSON-RPC message, or `None` on timeout / end of stream.
    async fn next(&mut self, wait: Duration) -> Option<Value> {
        let read = async {
            loop {
                if let Some(pos) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..pos + 2).collect();
                    let data: Vec<&str> = block
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(|d| d.strip_prefix(' ').unwrap_or(d))
                        .collect();
                    if data.is_empty() {
                        continue; // comment / keep-alive
                    }
                    assert!(
                        block.lines().any(|l| l == "event: message"),
                        "SSE event type is message: {block}"
                    );
                    return Some(serde_json::from_str(&data.join("\n")).expect("JSON frame"));
                }
                match self.resp.chunk().await {
                    Ok(Some(chunk)) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
                    _ => return None,
                }
            }
        };
        tokio::time::timeout(wait, read).await.ok().flatten()
    }
}

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(5);

#[tokio::test]
async fn discover_list_and_greet() {
    let s = ExampleServer::start(&[]);
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
        s.debug("/_example/tasks")
            .await
            .as_array()
            .expect("list")
            .is_empty()
    );
}

#[tokio::test]
async fn write_rows_task_completes_with_guessable_id() {
    let s = ExampleServer::start(&[]);
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
    let tasks = s.debug("/_example/tasks").await;
    assert_eq!(tasks[0], json!({"taskId": "task-1", "status": "completed"}));
}

#[tokio::test]
async fn cancel_stops_rows() {
    let s = ExampleServer::start(&[]);
    let interval = 50;
    let id = s
        .start_task("write_rows", json!({"count": 200, "intervalMs": interval}))
        .await;
    let deadline = Instant::now() + LONG;
    while s.rows_of(&id).await.len() < 2 {
        assert!(Instant::now() < deadline, "rows never appeared");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    let s = ExampleServer::start(&[]);
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
    let (status, body) = s
        .call(
            "tools/call",
            json!({"name": "confirm_action", "arguments": {"action": "x"}}),
            false,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], -32021);
    assert_eq!(
        body["error"]["data"]["requiredCapabilities"],
        json!({"extensions": {TASKS: {}}})
    );
}

#[tokio::test]
async fn multi_input_partial_answers() {
    let s = ExampleServer::start(&[]);
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
    let s = ExampleServer::start(&[]);
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
    s.update(
        &id,
        json!({"sample-1": {"error": {"code": -1, "message": "no"}}}),
    )
    .await;
    let done = s.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "summary declined");
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
    let s = ExampleServer::start(&[]);
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
    let s = ExampleServer::start(&[]);
    let (status, body) = s
        .call("tasks/get", json!({"taskId": "task-999"}), true)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], -32602);
    assert_eq!(body["error"]["message"], "Task not found: task-999");
    // Mcp-Name, when sent, must match params.taskId (the base64 form is decoded first).
    let body = s.body(json!(10), "tasks/get", json!({"taskId": "task-7"}), true);
    for (name, code) in [("task-8", -32020), ("=?base64?dGFzay03?=", -32602)] {
        let resp = s
            .http
            .post(&s.mcp_url)
            .header("MCP-Protocol-Version", VERSION)
            .header("Mcp-Method", "tasks/get")
            .header("Mcp-Name", name)
            .json(&body)
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            resp.json::<Value>().await.expect("json")["error"]["code"],
            code
        );
    }
    // tasks/* without declaring the extension.
    let (status, body) = s
        .call("tasks/get", json!({"taskId": "task-1"}), false)
        .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (StatusCode::BAD_REQUEST, json!(-32021))
    );
    for method in ["tasks/list", "tasks/result", "initialize", "no/such"] {
        let (status, body) = s.call(method, json!({}), true).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
        assert_eq!(body["error"]["code"], -32601);
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = s
            .http
            .request(method, &s.mcp_url)
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    // Missing MCP-Protocol-Version header.
    let body = s.body(json!(1), "server/discover", json!({}), false);
    let resp = s
        .http
        .post(&s.mcp_url)
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.expect("json");
    assert!(err["error"]["code"].is_i64());
    // Unsupported version (header and body agree).
    let mut old = s.body(json!(2), "server/discover", json!({}), false);
    old["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2025-11-25");
    let resp = s
        .http
        .post(&s.mcp_url)
        .header("MCP-Protocol-Version", "2025-11-25")
        .json(&old)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["code"], -32022);
    assert_eq!(
        err["error"]["data"],
        json!({"supported": [VERSION], "requested": "2025-11-25"})
    );
    // Missing clientCapabilities.
    let mut no_caps = s.body(json!(3), "server/discover", json!({}), false);
    no_caps["params"]["_meta"]
        .as_object_mut()
        .expect("meta")
        .remove("io.modelcontextprotocol/clientCapabilities");
    let resp = s.post(&no_caps).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        resp.json::<Value>().await.expect("json")["error"]["code"],
        -32602
    );

    let raw = |text: &'static str| {
        s.http
            .post(&s.mcp_url)
            .header("MCP-Protocol-Version", VERSION)
            .header("Content-Type", "application/json")
            .body(text)
            .send()
    };
    let resp = raw("{not json").await.expect("post");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        resp.json::<Value>().await.expect("json")["error"]["code"],
        -32700
    );
    let resp = raw("[]").await.expect("post");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        resp.json::<Value>().await.expect("json")["error"]["code"],
        -32600
    );
    let resp = raw(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#)
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert!(resp.bytes().await.expect("body").is_empty());
}

#[tokio::test]
async fn request_log_records_headers_but_not_secrets() {
    let s = ExampleServer::start(&[]);
    let body = s.body(json!(1), "server/discover", json!({}), false);
    let resp = s
        .http
        .post(&s.mcp_url)
        .header("MCP-Protocol-Version", VERSION)
        .header("Authorization", "Bearer secret-token-value")
        .header("Lifeguard-Owner", "alice")
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::OK);
    let log = s.debug("/_example/requests").await;
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
    let s = ExampleServer::start(&[]);
    for id in [json!(41), json!("sub-x")] {
        let mut sse = s
            .listen(
                id.clone(),
                json!({"toolsListChanged": true, "taskIds": ["task-404"], "unknownKey": true}),
            )
            .await;
        let ack = sse.next(LONG).await.expect("ack frame");
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
        assert_eq!(ack["params"]["_meta"][SUB_ID], id);
        // Unknown task IDs are acknowledged too (existence is not revealed).
        assert_eq!(
            ack["params"]["notifications"],
            json!({"toolsListChanged": true, "taskIds": ["task-404"]})
        );
        s.emit(json!({"kind": "toolsListChanged"})).await;
        let n = sse.next(LONG).await.expect("list_changed");
        assert_eq!(n["method"], "notifications/tools/list_changed");
        assert_eq!(n["params"]["_meta"][SUB_ID], id);
    }
    // Listeners are cleaned up when the client goes away.
    let deadline = Instant::now() + LONG;
    while s.debug("/_example/listeners").await["active"] != 0 {
        assert!(Instant::now() < deadline, "listen streams not cleaned up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // taskIds without declaring the tasks extension: an error, no stream.
    let mut body = s.body(
        json!(7),
        "subscriptions/listen",
        json!({"notifications": {"taskIds": ["task-1"]}}),
        false,
    );
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let resp = s.post(&body).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["code"], -32021);
}

#[tokio::test]
async fn listen_delivers_only_subscribed_tasks() {
    let s = ExampleServer::start(&[]);
    // Guessable IDs make it possible to subscribe before the task exists.
    let mut sse = s
        .listen(json!("tasks-sub"), json!({"taskIds": ["task-2"]}))
        .await;
    assert_eq!(
        sse.next(LONG).await.expect("ack")["method"],
        "notifications/subscriptions/acknowledged"
    );
    let other = s.start_task("slow_compute", json!({"seconds": 0.05})).await;
    let watched = s
        .start_task("confirm_action", json!({"action": "ship"}))
        .await;
    assert_eq!((other.as_str(), watched.as_str()), ("task-1", "task-2"));
    s.wait_status(&other, "completed").await;

    let waiting = sse.next(LONG).await.expect("input_required notification");
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
    while let Some(frame) = sse.next(LONG).await {
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
    assert!(sse.next(SHORT).await.is_none(), "nothing else expected");
}

#[tokio::test]
async fn listen_resource_updates_only_for_subscribed_uris() {
    let s = ExampleServer::start(&[]);
    let mut sse = s
        .listen(json!(5), json!({"resourceSubscriptions": ["file:///a"]}))
        .await;
    let ack = sse.next(LONG).await.expect("ack");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": ["file:///a"]})
    );
    s.emit(json!({"kind": "resourceUpdated", "uri": "file:///b"}))
        .await;
    s.emit(json!({"kind": "toolsListChanged"})).await;
    s.emit(json!({"kind": "resourceUpdated", "uri": "file:///a"}))
        .await;
    let n = sse.next(LONG).await.expect("resource update");
    assert_eq!(n["method"], "notifications/resources/updated");
    assert_eq!(n["params"]["uri"], "file:///a");
    assert_eq!(n["params"]["_meta"][SUB_ID], 5);
    assert!(sse.next(SHORT).await.is_none());
}

#[tokio::test]
async fn listen_ends_after_max_listen_secs() {
    let s = ExampleServer::start(&["--max-listen-secs", "1"]);
    let mut sse = s
        .listen(json!(9), json!({"promptsListChanged": true}))
        .await;
    assert!(sse.next(LONG).await.is_some());
    let end = sse.next(LONG).await.expect("closing result");
    assert_eq!(end["id"], 9);
    assert_eq!(
        end["result"],
        json!({"resultType": "complete", "_meta": {SUB_ID: 9}})
    );
    assert!(sse.next(SHORT).await.is_none());
}

#[tokio::test]
async fn tools_call_over_sse_sends_progress_then_result() {
    let s = ExampleServer::start(&[]);
    let body = s.body(
        json!("call-1"),
        "tools/call",
        json!({"name": "slow_compute", "arguments": {"seconds": 0.05}, "_meta": {"progressToken": "p-1"}}),
        true,
    );
    let resp = s
        .http
        .post(&s.mcp_url)
        .header("MCP-Protocol-Version", VERSION)
        .header("Accept", "application/json, text/event-stream")
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut sse = Sse::new(resp);
    let mut frames = Vec::new();
    while let Some(frame) = sse.next(LONG).await {
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
    let plain = s.body(
        json!(2),
        "tools/call",
        json!({"name": "greet", "arguments": {"name": "x"}}),
        true,
    );
    let resp = s
        .http
        .post(&s.mcp_url)
        .header("MCP-Protocol-Version", VERSION)
        .header("Accept", "application/json, text/event-stream")
        .json(&plain)
        .send()
        .await
        .expect("post");
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(ctype.starts_with("application/json"), "{ctype}");
}
