//! Helpers of the example server's own tests: a direct client with per-call checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[allow(unused_imports)]
pub use crate::support::client::{
    McpClient, PROTOCOL_VERSION as VERSION, Reply, RequestBuilder, TASKS_EXTENSION as TASKS,
    capabilities, request_meta,
};
pub use crate::support::listen::ListenStream;
use serde_json::{Value, json};

pub const SUB_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The example server, talked to directly, without a token.
pub struct Direct {
    pub server: crate::support::ExampleServer,
    pub client: McpClient,
    pub next_id: AtomicU64,
}

impl Direct {
    pub fn start(extra: &[&str]) -> Self {
        let mut args = vec!["--poll-interval-ms", "100"];
        args.extend_from_slice(extra);
        let server = crate::support::ExampleServer::start_with(&args);
        let client = McpClient::new(&server.url);
        Self {
            server,
            client,
            next_id: AtomicU64::new(1),
        }
    }

    /// A request with a fresh id. It carries no `Mcp-Method`/`Mcp-Name` unless a test adds
    /// them: this peer accepts their absence (and checks them when present).
    pub fn request(&self, method: &str, params: Value, tasks_ext: bool) -> RequestBuilder {
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
    pub async fn call(&self, method: &str, params: Value, tasks_ext: bool) -> Reply {
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
    pub async fn ok(&self, method: &str, params: Value, tasks_ext: bool) -> Value {
        let reply = self.call(method, params, tasks_ext).await;
        assert_eq!(reply.status, 200, "{method} failed: {}", reply.raw);
        reply.result().clone()
    }

    pub async fn tool(&self, name: &str, arguments: Value, tasks_ext: bool) -> Value {
        self.ok(
            "tools/call",
            json!({"name": name, "arguments": arguments}),
            tasks_ext,
        )
        .await
    }

    /// Starts a task-capable tool with the tasks extension and returns its task ID.
    pub async fn start_task(&self, name: &str, arguments: Value) -> String {
        let created = self.tool(name, arguments, true).await;
        assert_eq!(created["resultType"], "task", "{created}");
        assert_eq!(created["status"], "working");
        for key in ["createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"] {
            assert!(created.get(key).is_some(), "CreateTaskResult lacks {key}");
        }
        assert!(created.get("result").is_none() && created.get("task").is_none());
        created["taskId"].as_str().expect("taskId").to_owned()
    }

    pub async fn get_task(&self, task_id: &str) -> Value {
        let task = self.ok("tasks/get", json!({"taskId": task_id}), true).await;
        assert_eq!(task["resultType"], "complete");
        assert_eq!(task["taskId"], task_id);
        task
    }

    /// Polls tasks/get every 20 ms until `status` is reached (or fails after 5 s).
    pub async fn wait_status(&self, task_id: &str, status: &str) -> Value {
        let mut last = Value::Null;
        let reached = crate::support::poll_until(LONG, Duration::from_millis(20), async || {
            let task = self.get_task(task_id).await;
            last = task.clone();
            (task["status"] == status).then_some(task)
        })
        .await;
        reached
            .unwrap_or_else(|| panic!("task {task_id} never reached {status}; last state {last}"))
    }

    pub async fn update(&self, task_id: &str, responses: Value) {
        let ack = self
            .ok(
                "tasks/update",
                json!({"taskId": task_id, "inputResponses": responses}),
                true,
            )
            .await;
        assert_eq!(ack, json!({"resultType": "complete"}));
    }

    pub async fn rows_of(&self, task_id: &str) -> Vec<Value> {
        self.server.rows_where("taskId", task_id).await
    }

    /// Opens `subscriptions/listen`; the answer must be an event stream.
    pub async fn listen(&self, id: Value, notifications: Value) -> ListenStream {
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

pub fn assert_sse(stream: &ListenStream) {
    assert!(
        stream.content_type.starts_with("text/event-stream"),
        "content-type {}",
        stream.content_type
    );
}

/// The next frame of an event stream, which must be a `message` event; `None` on timeout or
/// end of stream.
pub async fn next_message(stream: &mut ListenStream, wait: Duration) -> Option<Value> {
    let frame = stream.next(wait).await?;
    assert_eq!(
        stream.last_event.as_deref(),
        Some("message"),
        "SSE event type is message: {frame}"
    );
    Some(frame)
}

pub const SHORT: Duration = Duration::from_millis(300);
pub const LONG: Duration = Duration::from_secs(5);

/// A 400 / -32602 "Invalid request parameters" naming `key` as the invalid input response.
pub fn assert_invalid_params(reply: &Reply, key: &str) {
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.error_code(), Some(-32602), "{reply:?}");
    assert_eq!(reply.body["error"]["message"], "Invalid request parameters");
    assert!(
        reply.body["error"]["data"]["inputResponses"][key].is_string(),
        "{reply:?}"
    );
}
