//! Event-stream answers (`subscriptions/listen`) read frame by frame, with timeouts, and
//! recorded like any other exchange once the probe lets go of them.

use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::Value;

use super::probe::{BODY_LIMIT, Exchange, Probe, ReceivedAnswer, SentRequest, truncate};

/// An event-stream answer read frame by frame.
pub struct Stream<'a> {
    probe: &'a Probe,
    label: String,
    request: SentRequest,
    response: Option<reqwest::Response>,
    error: Option<String>,
    pub status: u16,
    pub headers: HeaderMap,
    buffer: String,
    raw: String,
    frames: Vec<Value>,
    started: Instant,
}

impl<'a> Stream<'a> {
    /// The answer to `request` (or the transport `error` that prevented one).
    pub(super) fn new(
        probe: &'a Probe,
        label: String,
        request: SentRequest,
        response: Option<reqwest::Response>,
        error: Option<String>,
        started: Instant,
    ) -> Self {
        let status = response.as_ref().map_or(0, |r| r.status().as_u16());
        let headers = response
            .as_ref()
            .map(|r| r.headers().clone())
            .unwrap_or_default();
        Self {
            probe,
            label,
            request,
            response,
            error,
            status,
            headers,
            buffer: String::new(),
            raw: String::new(),
            frames: Vec::new(),
            started,
        }
    }

    /// The next frame carrying JSON data, or `None` when the stream ended or nothing arrived
    /// within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(frame) = self.take_frame() {
                self.frames.push(frame.clone());
                return Some(frame);
            }
            let response = self.response.as_mut()?;
            let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
                Ok(Ok(Some(chunk))) => chunk,
                Ok(_) => {
                    // The stream ended (or broke): nothing more will come.
                    self.response = None;
                    return None;
                }
                Err(_) => return None,
            };
            let text = String::from_utf8_lossy(&chunk).into_owned();
            self.raw.push_str(&text);
            self.buffer.push_str(&text);
        }
    }

    /// Whether the answer has ended (or never started).
    pub fn ended(&self) -> bool {
        self.response.is_none() && !self.buffer.contains("\n\n")
    }

    /// Frames until the stream ends or `quiet` passes without one.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Value> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next(quiet).await {
            frames.push(frame);
        }
        frames
    }

    /// A plain JSON answer (a refused listen), read whole; an answer that turns out to be an
    /// open stream is given 5 s, then dropped (its frames stay in the record).
    pub async fn body(&mut self) -> Value {
        if let Some(response) = self.response.take() {
            match tokio::time::timeout(Duration::from_secs(5), response.text()).await {
                Ok(Ok(text)) => self.raw.push_str(&text),
                Ok(Err(_)) => {}
                Err(_) => self
                    .raw
                    .push_str("… (still open after 5 s; closed by the probe)"),
            }
        }
        serde_json::from_str(&self.raw).unwrap_or(Value::Null)
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
            if let Ok(frame) = serde_json::from_str(&data.join("\n")) {
                return Some(frame);
            }
        }
    }

    /// Closes the stream (the client goes away) and returns what it carried.
    pub fn finish(self) -> Exchange {
        let (body, truncated) = truncate(&self.probe.redact(&self.raw), BODY_LIMIT * 2);
        let answer = self.error.is_none().then(|| ReceivedAnswer {
            status: self.status,
            headers: self
                .headers
                .iter()
                .map(|(k, v)| {
                    let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (k.as_str().to_owned(), v)
                })
                .collect(),
            body,
            truncated,
        });
        Exchange {
            label: self.label,
            request: self.request,
            answer,
            error: self.error,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
        }
    }
}
