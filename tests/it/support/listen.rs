//! A reader of event-stream answers for tests, `subscriptions/listen` above all: it reads SSE
//! frames one by one, with timeouts.

use std::time::Duration;

use serde_json::{Value, json};

use super::client::{McpClient, capabilities, request_meta};

pub struct ListenStream {
    response: reqwest::Response,
    buffer: String,
    pub status: u16,
    /// The answer's `Content-Type`.
    pub content_type: String,
    /// The `event:` field of the frame `next` returned last (`None` when it had none).
    pub last_event: Option<String>,
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
        Self::open_declaring(url, token, id, notifications, capabilities(declare_tasks)).await
    }

    /// Opens a stream declaring `caps` as the request's client capabilities.
    pub async fn open_declaring(
        url: &str,
        token: &str,
        id: Value,
        notifications: Value,
        caps: Value,
    ) -> Self {
        let params = json!({"notifications": notifications, "_meta": request_meta(caps)});
        McpClient::new(url)
            .request("subscriptions/listen", params)
            .id(id)
            .token(token)
            .accept_sse()
            .stream()
            .await
    }

    /// Reads the frames of `response` as they arrive.
    pub fn from_response(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Self {
            response,
            buffer: String::new(),
            status,
            content_type,
            last_event: None,
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

    /// The next complete frame carrying data; frames without data (comments, keep-alives) are
    /// skipped. Data that is not JSON fails the test: every MCP message is JSON.
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
            self.last_event = block
                .lines()
                .find_map(|l| l.strip_prefix("event:"))
                .map(|e| e.trim().to_owned());
            let frame = serde_json::from_str(&data.join("\n"))
                .unwrap_or_else(|e| panic!("SSE frame data is not JSON ({e}): {block}"));
            return Some(frame);
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
