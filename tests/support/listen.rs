//! A listen-stream client for tests: sends `subscriptions/listen` and reads SSE frames one by
//! one, with timeouts.

use std::time::Duration;

use serde_json::{Value, json};

pub struct ListenStream {
    response: reqwest::Response,
    buffer: String,
    pub status: u16,
}

impl ListenStream {
    /// Opens a stream with `notifications` as the filter.
    pub async fn open(
        url: &str,
        token: &str,
        id: Value,
        notifications: Value,
        declare_tasks: bool,
    ) -> Self {
        let caps = if declare_tasks {
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
        } else {
            json!({})
        };
        Self::open_declaring(url, token, id, notifications, caps).await
    }

    /// Opens a stream declaring `caps` as the request's client capabilities.
    pub async fn open_declaring(
        url: &str,
        token: &str,
        id: Value,
        notifications: Value,
        caps: Value,
    ) -> Self {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {
            "notifications": notifications,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": caps}}});
        let response = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "subscriptions/listen")
            .header("authorization", format!("Bearer {token}"))
            .body(body.to_string())
            .send()
            .await
            .expect("listen request");
        let status = response.status().as_u16();
        Self {
            response,
            buffer: String::new(),
            status,
        }
    }

    /// The next frame, or `None` when the stream ended or nothing came within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(frame) = self.take_frame() {
                return Some(frame);
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .ok()?
                .ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Reads the whole remaining body (for JSON error answers).
    pub async fn body(self) -> Value {
        serde_json::from_str(&self.response.text().await.unwrap_or_default()).unwrap_or(Value::Null)
    }

    fn take_frame(&mut self) -> Option<Value> {
        loop {
            let end = self.buffer.find("\n\n")?;
            let block: String = self.buffer.drain(..end + 2).collect();
            let data: Vec<&str> = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if data.is_empty() {
                continue;
            }
            if let Ok(v) = serde_json::from_str(&data.join("\n")) {
                return Some(v);
            }
        }
    }

    /// Frames until the stream ends or `timeout` passes with nothing new.
    pub async fn drain(&mut self, timeout: Duration) -> Vec<Value> {
        let mut frames = Vec::new();
        while let Some(f) = self.next(timeout).await {
            frames.push(f);
        }
        frames
    }
}
