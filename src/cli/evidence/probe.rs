//! The probe's side of the wire: tokens minted for made-up principals, MCP 2026-07-28 requests
//! that a check can bend in any way, and a record of every request and answer with each token
//! replaced by its label (`Bearer <alice token>`), so a report can be published. Event-stream
//! answers (`subscriptions/listen`) are read frame by frame, with timeouts, and recorded like
//! any other exchange once the probe lets go of them ([`Stream`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use serde_json::{Value, json};

use super::call::Call;

/// How much of an answer body a report keeps.
pub(super) const BODY_LIMIT: usize = 3000;

/// One made-up caller: the claims that make up its owner key.
#[derive(Clone, Debug)]
pub struct Principal {
    /// How the report names its token: `<alice token>`.
    pub label: &'static str,
    pub subject: &'static str,
    pub tenant: &'static str,
    pub client: &'static str,
}

/// Signs probe tokens with the issuer key the target trusts.
pub struct Minter {
    key: Vec<u8>,
    alg: Algorithm,
    kid: Option<String>,
    pub issuer: String,
    pub audience: String,
    scope: String,
}

impl Minter {
    /// Checks the key by minting one token.
    pub fn new(
        key: Vec<u8>,
        alg: Algorithm,
        kid: Option<String>,
        issuer: String,
        audience: String,
        scope: String,
    ) -> Result<Self> {
        let minter = Self {
            key,
            alg,
            kid,
            issuer,
            audience,
            scope,
        };
        minter
            .sign(&json!({"sub": "probe"}))
            .context("--key cannot sign tokens")?;
        Ok(minter)
    }

    /// A token of `who`, valid for an hour, with claims adjusted by `edit`.
    pub fn token_with(&self, who: &Principal, edit: impl FnOnce(&mut Value)) -> Result<String> {
        let now = jiff::Timestamp::now().as_second();
        let mut claims = json!({
            "iss": self.issuer, "aud": self.audience, "sub": who.subject,
            "tid": who.tenant, "client_id": who.client, "scope": self.scope,
            "iat": now, "nbf": now - 5, "exp": now + 3600,
        });
        edit(&mut claims);
        self.sign(&claims)
    }

    fn sign(&self, claims: &Value) -> Result<String> {
        Ok(lifeguard::identity::mint::mint_token(
            &self.key,
            self.alg,
            self.kid.as_deref(),
            claims,
        )?)
    }
}

/// A request as the report shows it.
#[derive(Clone, Debug, Serialize)]
pub struct SentRequest {
    pub method: &'static str,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// An answer as the report shows it (the body cut at a few kilobytes).
#[derive(Clone, Debug, Serialize)]
pub struct ReceivedAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// One request and what came back (or why nothing did).
#[derive(Clone, Debug, Serialize)]
pub struct Exchange {
    /// What the request tries, in words.
    pub label: String,
    pub request: SentRequest,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<ReceivedAnswer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Wall time of the exchange, for the reader; no verdict depends on it.
    pub elapsed_ms: u64,
}

/// What a check inspects of an answer: status, headers, the whole body, and its JSON.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    /// 0 when the request failed at the transport.
    pub status: u16,
    pub headers: HeaderMap,
    pub raw: String,
    /// The JSON body, or the last message of an event stream.
    pub json: Value,
}

impl Answer {
    pub fn result(&self) -> &Value {
        &self.json["result"]
    }

    pub fn error_code(&self) -> Option<i64> {
        self.json["error"]["code"].as_i64()
    }

    /// The JSON body without its `id`, for comparing answers to different requests.
    pub fn body_without_id(&self) -> Value {
        let mut body = self.json.clone();
        if let Some(o) = body.as_object_mut() {
            o.remove("id");
        }
        body
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Header names, without those that differ by nature between any two answers.
    pub fn header_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .headers
            .keys()
            .map(|k| k.as_str().to_owned())
            .filter(|k| k != "date" && k != "content-length")
            .collect();
        names.sort();
        names
    }

    /// `tasks/get` status of a task answer.
    pub fn task_status(&self) -> &str {
        self.result()["status"].as_str().unwrap_or_default()
    }
}

/// The HTTP client of the target, with the labels of the tokens it was given.
pub struct Probe {
    pub target: url::Url,
    http: reqwest::Client,
    labels: Mutex<Vec<(String, String)>>,
}

impl Probe {
    pub fn new(target: url::Url) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(32)
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            target,
            http,
            labels: Mutex::new(Vec::new()),
        })
    }

    /// Refuses to start against a target that does not answer HTTP at all.
    pub async fn preflight(&self) -> Result<()> {
        let answer = self
            .http
            .post(self.target.clone())
            .header("content-type", "application/json")
            .body("{}")
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(e) => bail!(
                "cannot reach --target {}: {}; is the sidecar running there?",
                self.target,
                error_chain(&e)
            ),
        }
    }

    /// Names `token` in the report as `<label>`.
    pub fn label(&self, token: &str, label: &str) {
        if let Ok(mut labels) = self.labels.lock() {
            labels.push((token.to_owned(), label.to_owned()));
        }
    }

    pub(super) fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        if let Ok(labels) = self.labels.lock() {
            for (token, label) in labels.iter() {
                out = out.replace(token.as_str(), &format!("<{label}>"));
            }
        }
        // A token the probe did not label (a check's one-off) is still never printed.
        if let Some(rest) = out.strip_prefix("Bearer ")
            && rest.matches('.').count() == 2
        {
            return "Bearer <unlabelled token>".to_owned();
        }
        out
    }

    fn sent(&self, call: &Call, body: &str) -> SentRequest {
        SentRequest {
            method: "POST",
            url: self.target.to_string(),
            headers: call
                .headers()
                .into_iter()
                .map(|(k, v)| {
                    let v = self.redact(&v);
                    (k, v)
                })
                .collect(),
            body: self.redact(body),
        }
    }

    async fn post(&self, call: &Call, body: String) -> reqwest::Result<reqwest::Response> {
        let mut headers = HeaderMap::new();
        for (name, value) in call.headers() {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.append(n, v);
            }
        }
        self.http
            .post(self.target.clone())
            .headers(headers)
            .body(body)
            .send()
            .await
    }

    /// Sends `call` and reads the whole answer.
    pub async fn send(&self, call: &Call) -> (Exchange, Answer) {
        let body = call.body();
        let request = self.sent(call, &body);
        let start = Instant::now();
        let outcome = match self.post(call, body).await {
            Ok(response) => {
                let status = response.status().as_u16();
                let headers = response.headers().clone();
                match response.text().await {
                    Ok(raw) => Ok(answer_of(status, headers, raw)),
                    Err(e) => Err(error_chain(&e)),
                }
            }
            Err(e) => Err(error_chain(&e)),
        };
        let elapsed_ms = start.elapsed().as_millis() as u64;
        match outcome {
            Ok(answer) => (
                Exchange {
                    label: call.label.clone(),
                    request,
                    answer: Some(self.received(&answer)),
                    error: None,
                    elapsed_ms,
                },
                answer,
            ),
            Err(error) => (
                Exchange {
                    label: call.label.clone(),
                    request,
                    answer: None,
                    error: Some(error),
                    elapsed_ms,
                },
                Answer::default(),
            ),
        }
    }

    fn received(&self, answer: &Answer) -> ReceivedAnswer {
        let (body, truncated) = truncate(&self.redact(&answer.raw), BODY_LIMIT);
        ReceivedAnswer {
            status: answer.status,
            headers: answer
                .headers
                .iter()
                .map(|(k, v)| {
                    let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
                    (k.as_str().to_owned(), v)
                })
                .collect(),
            body,
            truncated,
        }
    }

    /// Sends `call` and returns the answer as a stream of event frames (`subscriptions/listen`).
    pub async fn open_stream(&self, call: &Call) -> Stream<'_> {
        let body = call.body();
        let request = self.sent(call, &body);
        let started = Instant::now();
        let (response, error) = match self.post(call, body).await {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(error_chain(&e))),
        };
        Stream::new(self, call.label.clone(), request, response, error, started)
    }

    /// `GET` of a plain JSON endpoint (the example server's debug API).
    pub async fn get_json(&self, url: url::Url) -> Result<Value> {
        let response = self
            .http
            .get(url.clone())
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        response.json().await.with_context(|| format!("GET {url}"))
    }

    /// `POST` of a JSON body to a plain endpoint (the example server's `/_example/emit`).
    pub async fn post_json(&self, url: url::Url, body: &Value) -> Result<u16> {
        let response = self
            .http
            .post(url.clone())
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        Ok(response.status().as_u16())
    }
}

fn answer_of(status: u16, headers: HeaderMap, raw: String) -> Answer {
    let is_sse = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let messages: Vec<Value> = if is_sse {
        raw.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else {
        serde_json::from_str(&raw).into_iter().collect()
    };
    Answer {
        status,
        headers,
        json: messages.last().cloned().unwrap_or(Value::Null),
        raw,
    }
}

pub(super) fn truncate(text: &str, limit: usize) -> (String, bool) {
    if text.len() <= limit {
        return (text.to_owned(), false);
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (
        format!("{}… ({} bytes in all)", &text[..end], text.len()),
        true,
    )
}

/// An error with its causes, one line: "error sending request: connection refused".
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

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
    fn new(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_replaced_by_their_labels() {
        let probe = Probe::new("http://127.0.0.1:1/mcp".parse().unwrap()).unwrap();
        probe.label("aaa.bbb.ccc", "alice token");
        assert_eq!(probe.redact("Bearer aaa.bbb.ccc"), "Bearer <alice token>");
        assert_eq!(
            probe.redact("Bearer xxx.yyy.zzz"),
            "Bearer <unlabelled token>"
        );
    }
}
