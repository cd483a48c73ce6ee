//! A lean HTTP/1.1 load client: one keep-alive TCP connection per `Conn`, requests pre-built as
//! bytes (only the fixed-width JSON-RPC id is patched per request, or, for requests that differ
//! by more, each built whole beforehand: [`Prebuilt`]), responses framed by Content-Length or
//! chunked encoding. The same code drives the direct and the sidecar runs.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const PROTOCOL_VERSION: &str = "2026-07-28";
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// First JSON-RPC id; ids stay 10 digits wide so the request length never changes.
const ID_BASE: u64 = 1_000_000_000;
const ID_SPAN: u64 = 8_999_999_999;
/// Longest a single request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where requests go: `http://ADDR/mcp`.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub path: String,
}

impl Endpoint {
    /// Parses `http://127.0.0.1:PORT/path`.
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("not an http:// URL: {url}"))?;
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let addr = host
            .parse()
            .with_context(|| format!("not an IP:port address: {host}"))?;
        Ok(Self {
            addr,
            path: path.to_owned(),
        })
    }
}

/// One MCP request, serialized once. `set_id` rewrites the id digits in place.
#[derive(Clone)]
pub struct Template {
    bytes: Vec<u8>,
    id_at: usize,
}

/// `params._meta` of a 2026-07-28 request; `tasks` declares the Tasks extension.
pub fn meta(tasks: bool) -> Value {
    let caps = if tasks {
        json!({"extensions": {TASKS_EXTENSION: {}}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": caps,
    })
}

/// How a request proves who sends it.
#[derive(Clone, Copy)]
pub enum Credential<'a> {
    /// `Authorization: Bearer <token>`.
    Bearer(&'a str),
    /// `Authorization: DPoP <token>` and `DPoP: <proof>` (RFC 9449): a token bound to a key,
    /// and a proof of that key made for this one request.
    Dpop { token: &'a str, proof: &'a str },
}

impl Credential<'_> {
    /// The request's header lines, each ending in CRLF.
    fn headers(self) -> String {
        match self {
            Self::Bearer(token) => format!("Authorization: Bearer {token}\r\n"),
            Self::Dpop { token, proof } => {
                format!("Authorization: DPoP {token}\r\nDPoP: {proof}\r\n")
            }
        }
    }
}

impl Template {
    /// A POST of `method` with `params` (to which `_meta` is added), the mirrored `Mcp-Method`
    /// and `Mcp-Name` headers, and the bearer token.
    pub fn mcp(
        endpoint: &Endpoint,
        token: &str,
        method: &str,
        name: Option<&str>,
        params: Value,
        tasks: bool,
    ) -> Self {
        Self::mcp_as(
            endpoint,
            Credential::Bearer(token),
            method,
            name,
            params,
            tasks,
        )
    }

    /// [`Template::mcp`] with any credential.
    pub fn mcp_as(
        endpoint: &Endpoint,
        credential: Credential<'_>,
        method: &str,
        name: Option<&str>,
        mut params: Value,
        tasks: bool,
    ) -> Self {
        params["_meta"] = meta(tasks);
        let body = json!({"jsonrpc": "2.0", "id": ID_BASE, "method": method, "params": params})
            .to_string();
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {}\r\n\
             Mcp-Method: {}\r\n",
            endpoint.path, endpoint.addr, PROTOCOL_VERSION, method
        );
        if let Some(name) = name {
            head.push_str(&format!("Mcp-Name: {name}\r\n"));
        }
        head.push_str(&credential.headers());
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let marker = format!("\"id\":{ID_BASE}");
        // The body was just serialized with this id, so the marker is present.
        let id_in_body = body.find(&marker).unwrap_or(0) + "\"id\":".len();
        let id_at = head.len() + id_in_body;
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.as_bytes());
        Self { bytes, id_at }
    }

    /// `tools/call` of `tool`.
    pub fn tool_call(
        endpoint: &Endpoint,
        token: &str,
        tool: &str,
        args: Value,
        tasks: bool,
    ) -> Self {
        Self::tool_call_as(endpoint, Credential::Bearer(token), tool, args, tasks)
    }

    /// [`Template::tool_call`] with any credential.
    pub fn tool_call_as(
        endpoint: &Endpoint,
        credential: Credential<'_>,
        tool: &str,
        args: Value,
        tasks: bool,
    ) -> Self {
        Self::mcp_as(
            endpoint,
            credential,
            "tools/call",
            Some(tool),
            json!({"name": tool, "arguments": args}),
            tasks,
        )
    }

    /// `tasks/get` of `task_id`.
    pub fn task_get(endpoint: &Endpoint, token: &str, task_id: &str) -> Self {
        Self::mcp(
            endpoint,
            token,
            "tasks/get",
            Some(task_id),
            json!({"taskId": task_id}),
            true,
        )
    }

    /// Sets the JSON-RPC id (`n` is folded into the 10-digit range).
    pub fn set_id(&mut self, n: u64) {
        let id = ID_BASE + n % ID_SPAN;
        let digits = id.to_string();
        self.bytes[self.id_at..self.id_at + digits.len()].copy_from_slice(digits.as_bytes());
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// What one connection of a load sends: the bytes of its `n`th request, or `None` when it has
/// nothing left to send (the connection then stops).
pub trait Requests: Send + 'static {
    fn next(&mut self, n: u64) -> Option<&[u8]>;
}

/// One template, sent again and again with a new id each time.
impl Requests for Template {
    fn next(&mut self, n: u64) -> Option<&[u8]> {
        self.set_id(n);
        Some(self.bytes())
    }
}

/// Requests built beforehand, each sent once, in order: for requests that differ by more than
/// their id (a DPoP proof is good for one request), made before a measurement so that making
/// them is not measured.
pub struct Prebuilt {
    requests: Vec<Vec<u8>>,
    sent: usize,
}

impl Prebuilt {
    pub fn new(requests: Vec<Vec<u8>>) -> Self {
        Self { requests, sent: 0 }
    }
}

impl Requests for Prebuilt {
    fn next(&mut self, _n: u64) -> Option<&[u8]> {
        let request = self.requests.get(self.sent)?;
        self.sent += 1;
        Some(request)
    }
}

/// A keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    scratch: Box<[u8]>,
    body: Vec<u8>,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(16 * 1024),
            scratch: vec![0u8; 16 * 1024].into_boxed_slice(),
            body: Vec::with_capacity(4096),
        })
    }

    /// Body of the last response.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The last body as JSON (outside timed sections).
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// Sends one request and reads its response; returns the HTTP status.
    pub async fn send(&mut self, request: &[u8]) -> Result<u16> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(request)).await {
            Ok(r) => r,
            Err(_) => bail!("no response within {REQUEST_TIMEOUT:?}"),
        }
    }

    async fn exchange(&mut self, request: &[u8]) -> Result<u16> {
        self.stream.write_all(request).await.context("write")?;
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).context("response head")?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("status line")?;
        let mut length = None;
        let mut chunked = false;
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.to_ascii_lowercase().contains("chunked");
            }
        }
        self.buf.drain(..head_end);
        self.body.clear();
        if chunked {
            self.read_chunked().await?;
        } else {
            let n = match length {
                Some(n) => n,
                None if status == 204 || status == 304 || (100..200).contains(&status) => 0,
                None => {
                    // Delimited by the end of the connection.
                    while self.read_more().await? > 0 {}
                    self.buf.len()
                }
            };
            while self.buf.len() < n {
                self.fill().await?;
            }
            self.body.extend_from_slice(&self.buf[..n]);
            self.buf.drain(..n);
        }
        Ok(status)
    }

    async fn read_chunked(&mut self) -> Result<()> {
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buf, b"\r\n") {
                    break i;
                }
                self.fill().await?;
            };
            let size_text = std::str::from_utf8(&self.buf[..line_end]).context("chunk size")?;
            let size_text = size_text.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_text, 16).context("chunk size")?;
            self.buf.drain(..line_end + 2);
            if size == 0 {
                // Trailers (none expected) end with an empty line.
                loop {
                    if let Some(i) = find(&self.buf, b"\r\n") {
                        self.buf.drain(..i + 2);
                        if i == 0 {
                            return Ok(());
                        }
                        continue;
                    }
                    self.fill().await?;
                }
            }
            while self.buf.len() < size + 2 {
                self.fill().await?;
            }
            self.body.extend_from_slice(&self.buf[..size]);
            self.buf.drain(..size + 2);
        }
    }

    async fn fill(&mut self) -> Result<()> {
        if self.read_more().await? == 0 {
            bail!("connection closed by the server");
        }
        Ok(())
    }

    async fn read_more(&mut self) -> Result<usize> {
        let n = self.stream.read(&mut self.scratch).await.context("read")?;
        self.buf.extend_from_slice(&self.scratch[..n]);
        Ok(n)
    }
}

/// Whether a response is a JSON-RPC success: HTTP 200, a `result`, and not a tool error.
pub fn is_success(status: u16, body: &[u8]) -> bool {
    status == 200
        && find(body, b"\"result\"").is_some()
        && find(body, b"\"isError\":true").is_none()
}

/// Whether a response is the sidecar's rate-limit refusal: HTTP 429 with `reason:
/// "rate_limited"` in the JSON-RPC error's data.
pub fn is_rate_limited(status: u16, body: &[u8]) -> bool {
    status == 429 && find(body, b"\"reason\":\"rate_limited\"").is_some()
}

/// A short description of a failed response, for the error report.
pub fn describe_failure(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
    format!("HTTP {status}: {text}")
}

/// Sends one request and times it, from the first byte written to the last byte read.
pub async fn timed(conn: &mut Conn, request: &[u8]) -> Result<(u16, u64)> {
    let started = Instant::now();
    let status = conn.send(request).await?;
    Ok((status, started.elapsed().as_nanos() as u64))
}

/// A one-off GET (admin endpoints), on its own connection.
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut conn = Conn::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let status = conn.send(request.as_bytes()).await?;
    Ok((status, String::from_utf8_lossy(conn.body()).into_owned()))
}
