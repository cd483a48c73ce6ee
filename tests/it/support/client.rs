//! A minimal MCP 2026-07-28 client for black-box tests: it sends exactly what a conforming
//! client sends, and lets a test break any part of it.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::listen::ListenStream;

pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
pub const PROTOCOL_VERSION: &str = "2026-07-28";

/// Client capabilities declaring the Tasks extension, or nothing.
pub fn capabilities(tasks: bool) -> Value {
    if tasks {
        json!({"extensions": {TASKS_EXTENSION: {}}})
    } else {
        json!({})
    }
}

/// The `_meta` a 2026-07-28 client sends with every request, declaring `caps`.
pub fn request_meta(caps: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": caps,
    })
}

#[derive(Clone)]
pub struct McpClient {
    pub url: String,
    http: reqwest::Client,
}

/// A reply: HTTP status, headers, and the JSON-RPC response (the last message of an SSE stream).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
    /// Every message of an SSE response (just `body` for JSON).
    pub messages: Vec<Value>,
    pub raw: String,
}

impl Reply {
    pub fn result(&self) -> &Value {
        &self.body["result"]
    }

    pub fn error_code(&self) -> Option<i64> {
        self.body["error"]["code"].as_i64()
    }

    /// Asserts that this is the sidecar's retryable refusal (no policy yet, ledger out of
    /// reach, home replica unreachable): 503, `error.data.retryable: true`, `Retry-After: 1`,
    /// and no result.
    pub fn assert_retryable_503(&self, what: &str) {
        assert_eq!(self.status, 503, "{what}: {self:?}");
        assert_eq!(
            self.body["error"]["data"]["retryable"], true,
            "{what}: {self:?}"
        );
        assert_eq!(
            self.headers.get("retry-after").map(|v| v.as_bytes()),
            Some(&b"1"[..]),
            "{what}: {self:?}"
        );
        assert!(self.body.get("result").is_none(), "{what}: {self:?}");
    }

    /// The body without the id, to compare denials byte for byte.
    pub fn body_without_id(&self) -> Value {
        let mut b = self.body.clone();
        if let Some(o) = b.as_object_mut() {
            o.remove("id");
        }
        b
    }
}

/// One request under construction.
pub struct RequestBuilder {
    client: McpClient,
    method: String,
    params: Value,
    token: Option<String>,
    tasks: bool,
    id: Value,
    extra_headers: Vec<(String, String)>,
    removed_headers: Vec<String>,
    accept_sse: bool,
}

impl McpClient {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .unwrap(),
        }
    }

    /// A client that speaks HTTP/2 by prior knowledge (cleartext, no upgrade), every request a
    /// stream of one connection.
    pub fn http2(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            http: reqwest::Client::builder()
                .http2_prior_knowledge()
                .build()
                .unwrap(),
        }
    }

    pub fn request(&self, method: &str, params: Value) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            method: method.to_owned(),
            params,
            token: None,
            tasks: true,
            id: json!(1),
            extra_headers: vec![],
            removed_headers: vec![],
            accept_sse: false,
        }
    }

    /// `tools/call` of `tool` as a task-capable client.
    pub async fn call_tool(&self, token: &str, tool: &str, arguments: Value) -> Reply {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
            .token(token)
            .send()
            .await
    }

    pub async fn task(&self, token: &str, method: &str, task_id: &str) -> Reply {
        self.request(method, json!({"taskId": task_id}))
            .token(token)
            .send()
            .await
    }

    pub async fn get_task(&self, token: &str, task_id: &str) -> Reply {
        self.task(token, "tasks/get", task_id).await
    }

    pub async fn cancel_task(&self, token: &str, task_id: &str) -> Reply {
        self.task(token, "tasks/cancel", task_id).await
    }

    /// Polls `tasks/get` until the status is terminal (or the timeout passes).
    pub async fn wait_terminal(&self, token: &str, task_id: &str, timeout_ms: u64) -> Reply {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
        loop {
            let reply = self.get_task(token, task_id).await;
            let status = reply.result()["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if ["completed", "failed", "cancelled"].contains(&status.as_str())
                || reply.status != 200
                || std::time::Instant::now() >= deadline
            {
                return reply;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

impl RequestBuilder {
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    /// Do not declare the Tasks extension on this request.
    pub fn without_tasks(mut self) -> Self {
        self.tasks = false;
        self
    }

    pub fn id(mut self, id: Value) -> Self {
        self.id = id;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.extra_headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn without_header(mut self, name: &str) -> Self {
        self.removed_headers.push(name.to_ascii_lowercase());
        self
    }

    pub fn accept_sse(mut self) -> Self {
        self.accept_sse = true;
        self
    }

    /// The JSON-RPC message this builder sends: `params` as given when they carry a `_meta`,
    /// else with the standard one added.
    pub fn message(&self) -> Value {
        let mut params = self.params.clone();
        if params.get("_meta").is_none() {
            params["_meta"] = request_meta(capabilities(self.tasks));
        }
        json!({"jsonrpc": "2.0", "id": self.id, "method": self.method, "params": params})
    }

    fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let accept = if self.accept_sse {
            "application/json, text/event-stream"
        } else {
            "application/json"
        };
        h.insert("accept", HeaderValue::from_static(accept));
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static(PROTOCOL_VERSION),
        );
        h.insert("mcp-method", HeaderValue::from_str(&self.method).unwrap());
        let name = match self.method.as_str() {
            "tools/call" | "prompts/get" => self.params["name"].as_str(),
            "resources/read" => self.params["uri"].as_str(),
            "tasks/get" | "tasks/update" | "tasks/cancel" => self.params["taskId"].as_str(),
            _ => None,
        };
        if let Some(name) = name
            && let Ok(v) = HeaderValue::from_str(name)
        {
            h.insert("mcp-name", v);
        }
        if let Some(token) = &self.token {
            h.insert(
                "authorization",
                HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            );
        }
        for name in &self.removed_headers {
            h.remove(name.as_str());
        }
        for (name, value) in &self.extra_headers {
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    pub async fn send(self) -> Reply {
        let body = self.message().to_string();
        self.send_raw(body).await
    }

    pub async fn send_raw(self, body: String) -> Reply {
        let response = self.post(body).await;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let is_sse = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let raw = response.text().await.unwrap_or_default();
        let messages: Vec<Value> = if is_sse {
            raw.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str(d.trim()).ok())
                .collect()
        } else {
            serde_json::from_str(&raw).into_iter().collect()
        };
        let body = messages.last().cloned().unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            body,
            messages,
            raw,
        }
    }

    /// Sends the request and reads the answer frame by frame as it arrives (for answers that
    /// stay open, such as `subscriptions/listen`, or to look at each SSE frame).
    pub async fn stream(self) -> ListenStream {
        let body = self.message().to_string();
        ListenStream::from_response(self.post(body).await)
    }

    async fn post(self, body: String) -> reqwest::Response {
        self.client
            .http
            .post(&self.client.url)
            .headers(self.headers())
            .body(body)
            .send()
            .await
            .expect("HTTP request")
    }
}
