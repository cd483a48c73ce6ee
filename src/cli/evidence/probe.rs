//! The probe's side of the wire: tokens minted for made-up principals, MCP 2026-07-28 requests
//! that a check can bend in any way, and a record of every request and answer with each token
//! replaced by its label (`Bearer <alice token>`), so a report can be published.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use serde_json::{Value, json};

pub const PROTOCOL_VERSION: &str = "2026-07-28";
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// How much of an answer body a report keeps.
const BODY_LIMIT: usize = 3000;

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

/// One MCP request under construction: a conforming 2026-07-28 request unless a check bends it.
#[derive(Clone, Debug)]
pub struct Call {
    pub label: String,
    method: String,
    params: Value,
    /// `None`: sent as a notification (no `id` member).
    id: Option<Value>,
    token: Option<String>,
    tasks: bool,
    meta: bool,
    headers: Vec<(String, String)>,
    removed: Vec<String>,
    raw_body: Option<String>,
    sse: bool,
}

impl Call {
    pub fn new(label: impl Into<String>, method: &str, params: Value) -> Self {
        Self {
            label: label.into(),
            method: method.to_owned(),
            params,
            id: Some(json!(1)),
            token: None,
            tasks: true,
            meta: true,
            headers: Vec::new(),
            removed: Vec::new(),
            raw_body: None,
            sse: false,
        }
    }

    /// `tools/call` of `tool` by a task-capable client.
    pub fn tool(label: impl Into<String>, tool: &str, arguments: Value) -> Self {
        Self::new(
            label,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        )
    }

    /// `tasks/get`, `tasks/cancel` or `tasks/update` of `task_id`.
    pub fn task(label: impl Into<String>, method: &str, task_id: &str) -> Self {
        let mut params = json!({"taskId": task_id});
        if method == "tasks/update" {
            params["inputResponses"] =
                json!({"confirm-1": {"action": "accept", "content": {"confirm": true}}});
        }
        Self::new(label, method, params)
    }

    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    pub fn id(mut self, id: Value) -> Self {
        self.id = Some(id);
        self
    }

    /// Sent without an `id`: a notification.
    pub fn notification(mut self) -> Self {
        self.id = None;
        self
    }

    /// Declare no Tasks extension in this request's capabilities.
    pub fn without_tasks(mut self) -> Self {
        self.tasks = false;
        self
    }

    /// Send `params` exactly as given, without the standard `_meta`.
    pub fn without_meta(mut self) -> Self {
        self.meta = false;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.removed.push(name.to_ascii_lowercase());
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn without_header(mut self, name: &str) -> Self {
        self.removed.push(name.to_ascii_lowercase());
        self
    }

    /// Send these bytes as the body instead of the message (headers still follow the call).
    pub fn raw_body(mut self, body: String) -> Self {
        self.raw_body = Some(body);
        self
    }

    pub fn accept_sse(mut self) -> Self {
        self.sse = true;
        self
    }

    /// The JSON-RPC message: the standard `_meta` is added unless the params carry one.
    pub fn message(&self) -> Value {
        let mut params = self.params.clone();
        if self.meta && params.get("_meta").is_none() {
            params["_meta"] = request_meta(self.tasks);
        }
        let mut message = json!({"jsonrpc": "2.0", "method": self.method, "params": params});
        if let Some(id) = &self.id {
            message["id"] = id.clone();
        }
        message
    }

    fn body(&self) -> String {
        self.raw_body
            .clone()
            .unwrap_or_else(|| self.message().to_string())
    }

    fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            (
                "accept".to_owned(),
                if self.sse {
                    "application/json, text/event-stream".to_owned()
                } else {
                    "application/json".to_owned()
                },
            ),
            (
                "mcp-protocol-version".to_owned(),
                PROTOCOL_VERSION.to_owned(),
            ),
            ("mcp-method".to_owned(), self.method.clone()),
        ];
        let name = match self.method.as_str() {
            "tools/call" | "prompts/get" => self.params["name"].as_str(),
            "resources/read" => self.params["uri"].as_str(),
            "tasks/get" | "tasks/update" | "tasks/cancel" => self.params["taskId"].as_str(),
            _ => None,
        };
        if let Some(name) = name {
            h.push(("mcp-name".to_owned(), mirrored_header_value(name)));
        }
        if let Some(token) = &self.token {
            h.push(("authorization".to_owned(), format!("Bearer {token}")));
        }
        h.retain(|(k, _)| !self.removed.contains(k));
        h.extend(self.headers.iter().cloned());
        h
    }
}

/// The `_meta` a 2026-07-28 client sends with every request.
pub fn request_meta(tasks: bool) -> Value {
    let capabilities = if tasks {
        json!({"extensions": {TASKS_EXTENSION: {}}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

/// A mirrored `Mcp-Name` value: as is when it is visible ASCII, else `=?base64?…?=`.
fn mirrored_header_value(value: &str) -> String {
    use base64::Engine;
    if value.bytes().all(|b| (0x20..0x7f).contains(&b)) && value.trim() == value {
        value.to_owned()
    } else {
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        format!("=?base64?{encoded}?=")
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

    fn redact(&self, text: &str) -> String {
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
        let status = response.as_ref().map_or(0, |r| r.status().as_u16());
        let headers = response
            .as_ref()
            .map(|r| r.headers().clone())
            .unwrap_or_default();
        Stream {
            probe: self,
            label: call.label.clone(),
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

impl Stream<'_> {
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
            let chunk = tokio::time::timeout_at(deadline, response.chunk())
                .await
                .ok()?
                .ok()??;
            let text = String::from_utf8_lossy(&chunk).into_owned();
            self.raw.push_str(&text);
            self.buffer.push_str(&text);
        }
    }

    /// Frames until the stream ends or `quiet` passes without one.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Value> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next(quiet).await {
            frames.push(frame);
        }
        frames
    }

    /// A plain JSON answer (a refused listen): read whole.
    pub async fn body(&mut self) -> Value {
        if let Some(response) = self.response.take()
            && let Ok(text) = response.text().await
        {
            self.raw.push_str(&text);
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

/// The sidecar's admin port.
pub struct Admin {
    base: url::Url,
    http: reqwest::Client,
}

impl Admin {
    /// Confirms the admin port answers `/ready`.
    pub async fn connect(base: url::Url) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        let admin = Self { base, http };
        let (status, body) = admin
            .ready()
            .await
            .with_context(|| format!("cannot reach --admin {}", admin.base))?;
        if status != 200 {
            bail!(
                "the sidecar at --admin {} is not ready ({status}: {body})",
                admin.base
            );
        }
        Ok(admin)
    }

    /// `GET /ready`: status and body.
    pub async fn ready(&self) -> Result<(u16, String)> {
        let url = self.base.join("ready")?;
        let response = self.http.get(url).send().await.map_err(|e| {
            anyhow::anyhow!("GET /ready: {}", error_chain(&e)) // a clear cause, not a debug dump
        })?;
        let status = response.status().as_u16();
        Ok((status, response.text().await.unwrap_or_default()))
    }

    /// The policy hash `/ready` reports (`ready: policy NS/NAME HASH…`).
    pub async fn policy_hash(&self) -> Option<String> {
        let (_, body) = self.ready().await.ok()?;
        ready_hash(&body)
    }
}

/// The hash in a `/ready` body: `ready: policy <namespace/name> <hash>[; …]`.
pub fn ready_hash(body: &str) -> Option<String> {
    let rest = body.strip_prefix("ready: policy ")?;
    let mut words = rest.split([' ', ';']).filter(|w| !w.is_empty());
    words.next()?;
    words.next().map(str::to_owned)
}

fn truncate(text: &str, limit: usize) -> (String, bool) {
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
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_bodies_name_the_hash() {
        assert_eq!(
            ready_hash("ready: policy default/evidence abc123").as_deref(),
            Some("abc123")
        );
        assert_eq!(
            ready_hash("ready: policy a/b ff00; control plane connected").as_deref(),
            Some("ff00")
        );
        assert_eq!(ready_hash("no policy loaded"), None);
    }

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

    #[test]
    fn non_ascii_names_are_mirrored_in_base64() {
        assert_eq!(mirrored_header_value("lgt_abc"), "lgt_abc");
        assert!(mirrored_header_value("tâche").starts_with("=?base64?"));
    }
}
