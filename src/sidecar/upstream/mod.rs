//! The connection to the protected MCP server over loopback: pooled HTTP/1.1, or HTTP/2 where
//! the server speaks it and `--upstream-http2` says so ([`multiplexed`]); bounded bodies, JSON
//! and SSE responses told apart.

mod bounded_body;
mod multiplexed;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use sse_stream::SseStream;

use crate::mcp::jsonrpc::{MessageKind, classify};

pub use bounded_body::{BoundedEvents, StreamBounds, broke_bound, largest_upstream_event};
pub use multiplexed::MultiplexedPool;

/// Which requests reach the protected server over HTTP/2 (cleartext, prior knowledge) instead
/// of HTTP/1.1. Only for servers that accept HTTP/2 without an upgrade (hyper, axum, Go's
/// `h2c`, Envoy, …): a server that speaks only HTTP/1.1 refuses every such request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UpstreamHttp2 {
    /// HTTP/1.1 for everything: every MCP server speaks it.
    #[default]
    Never,
    /// `subscriptions/listen` streams share HTTP/2 connections; requests stay on HTTP/1.1
    /// (a kept-alive HTTP/1.1 connection costs the least per short request).
    Listen,
    /// Everything over HTTP/2.
    Always,
}

/// Largest JSON response accepted from the upstream.
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// An upstream event stream, parsed as it arrives.
pub type EventStream = std::pin::Pin<Box<SseStream<BoundedEvents>>>;

/// A response from the protected server.
pub enum UpstreamBody {
    /// `application/json`, as received (bounded); parse on demand.
    Json(Bytes),
    /// `text/event-stream`, not yet read; bounded per event and (for request streams) in total.
    Sse(EventStream),
    /// No body (e.g. 202 for a notification).
    Empty,
    /// Anything else (read, bounded, and dropped).
    Other,
}

pub struct UpstreamResponse {
    pub status: StatusCode,
    pub body: UpstreamBody,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot reach the MCP server: {0}")]
    Unreachable(String),
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the MCP server's response is unreadable: {0}")]
    BadResponse(String),
}

impl From<multiplexed::MultiplexError> for UpstreamError {
    fn from(error: multiplexed::MultiplexError) -> Self {
        Self::Unreachable(error.to_string())
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The pooled client each worker thread uses for one [`Upstream`].
///
/// hyper's pool is one mutex-guarded list of idle connections: shared by every worker, each
/// request's checkout and return would meet all other workers' there, and a connection made on
/// one worker would be driven there while its requests come from all the others (a cross-thread
/// wake-up per request). So each thread that sends upstream gets a pool of its own — the model
/// of proxies that run a worker per core with its own connection pools — and a connection's
/// task starts on the thread that made it, next to the requests that use it.
struct ThreadClients {
    clients: Vec<ThreadClient>,
}

/// This thread's connections to one [`Upstream`].
#[derive(Clone)]
struct ThreadClient {
    /// The `Upstream` it belongs to, and whether that `Upstream` still exists.
    id: u64,
    alive: std::sync::Weak<()>,
    http1: HttpClient,
    http2: MultiplexedPool,
}

thread_local! {
    static THREAD_CLIENTS: std::cell::RefCell<ThreadClients> =
        const { std::cell::RefCell::new(ThreadClients { clients: Vec::new() }) };
}

fn new_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(256)
        .build(connector)
}

#[derive(Clone)]
pub struct Upstream {
    /// Tells the thread-local clients of this upstream apart from those of others (several
    /// sidecars in one test process) and lets them be dropped with it.
    id: u64,
    alive: std::sync::Arc<()>,
    uri: Uri,
    timeout: Duration,
    metrics: Option<crate::telemetry::striped::StripedHistogram>,
    http2: UpstreamHttp2,
}

/// How one request travels.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Http1,
    Http2,
}

impl Upstream {
    /// `uri` is the MCP endpoint of the protected server (`http://127.0.0.1:PORT/mcp`);
    /// `timeout` bounds the wait for response headers.
    pub fn new(
        uri: Uri,
        timeout: Duration,
        metrics: Option<crate::telemetry::striped::StripedHistogram>,
    ) -> Self {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            alive: std::sync::Arc::new(()),
            uri,
            timeout,
            metrics,
            http2: UpstreamHttp2::Never,
        }
    }

    /// Sends the requests `http2` names over HTTP/2 (see [`UpstreamHttp2`]).
    pub fn with_http2(self, http2: UpstreamHttp2) -> Self {
        Self { http2, ..self }
    }

    /// This thread's clients of this upstream (made on first use).
    fn client(&self) -> ThreadClient {
        THREAD_CLIENTS.with(|cell| {
            let mut clients = cell.borrow_mut();
            if let Some(client) = clients.clients.iter().find(|c| c.id == self.id) {
                return client.clone();
            }
            // Clients of upstreams that no longer exist are dropped with their idle connections.
            clients.clients.retain(|c| c.alive.strong_count() > 0);
            let client = ThreadClient {
                id: self.id,
                alive: std::sync::Arc::downgrade(&self.alive),
                http1: new_client(),
                http2: MultiplexedPool::default(),
            };
            clients.clients.push(client.clone());
            client
        })
    }

    /// POSTs one message and classifies the response; an event stream answers this one
    /// request ([`StreamBounds::REQUEST`]).
    pub async fn send(
        &self,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let transport = match self.http2 {
            UpstreamHttp2::Always => Transport::Http2,
            UpstreamHttp2::Never | UpstreamHttp2::Listen => Transport::Http1,
        };
        self.send_on(transport, headers, body, StreamBounds::REQUEST)
            .await
    }

    /// POSTs a `subscriptions/listen` request; its event stream gets [`StreamBounds::LISTEN`].
    pub async fn send_listen(
        &self,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let transport = match self.http2 {
            UpstreamHttp2::Never => Transport::Http1,
            UpstreamHttp2::Listen | UpstreamHttp2::Always => Transport::Http2,
        };
        self.send_on(transport, headers, body, StreamBounds::LISTEN)
            .await
    }

    async fn send_on(
        &self,
        transport: Transport,
        headers: HeaderMap,
        body: Bytes,
        bounds: StreamBounds,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let mut headers = headers;
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // The client span of this hop (none unless traces are exported, and then the server
        // gets its context as `traceparent`, never the caller's, which passes through as it is
        // otherwise) — and in the body's `_meta` too where the caller put one there.
        let span = crate::telemetry::spans::client(&mut headers);
        let body = if span.is_none() {
            body
        } else {
            crate::telemetry::trace_context::with_hop_context(&body, &headers).unwrap_or(body)
        };
        let mut request = http::Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .body(Full::new(body))
            .map_err(|e| UpstreamError::Unreachable(e.to_string()))?;
        *request.headers_mut() = headers;
        let started = Instant::now();
        let client = self.client();
        let sent = async {
            match transport {
                Transport::Http1 => client
                    .http1
                    .request(request)
                    .await
                    .map(|response| (response, None))
                    .map_err(|e| UpstreamError::Unreachable(e.to_string())),
                Transport::Http2 => {
                    let (response, lease) = client.http2.send(request).await?;
                    Ok((response, Some(lease)))
                }
            }
        };
        let answered = tokio::time::timeout(self.timeout, sent).await;
        // The client span ends once the server's answer (its headers) arrived, or did not.
        drop(span);
        let (response, lease) = answered.map_err(|_| UpstreamError::Timeout(self.timeout))??;
        if let Some(h) = &self.metrics {
            h.observe(started.elapsed().as_secs_f64());
        }
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let body = response.into_body();
        if content_type.starts_with("text/event-stream") {
            return Ok(UpstreamResponse {
                status,
                body: UpstreamBody::Sse(Box::pin(SseStream::new(
                    BoundedEvents::new(body, bounds).keeping(lease),
                ))),
            });
        }
        let bytes = Limited::new(body, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| UpstreamError::BadResponse(e.to_string()))?
            .to_bytes();
        let body = if bytes.is_empty() {
            UpstreamBody::Empty
        } else if content_type.starts_with("application/json") {
            UpstreamBody::Json(bytes)
        } else {
            UpstreamBody::Other
        };
        Ok(UpstreamResponse { status, body })
    }

    /// Sends a JSON-RPC request the sidecar built and returns the response message to it,
    /// reading an SSE stream up to that response if the server streams.
    pub async fn call(
        &self,
        headers: HeaderMap,
        message: &Value,
    ) -> Result<(StatusCode, Value), UpstreamError> {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let (status, answer) = self.call_answer(headers, message).await?;
        let value = match answer {
            Answer::Json(bytes) => response_message(&bytes, &id)?,
            Answer::Message(value) => value,
        };
        Ok((status, value))
    }

    /// Like [`Self::call`], but a JSON answer comes back unparsed, for callers that can read
    /// what they need without a tree (they fall back to [`response_message`]).
    pub async fn call_answer(
        &self,
        headers: HeaderMap,
        message: &Value,
    ) -> Result<(StatusCode, Answer), UpstreamError> {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let body = Bytes::from(serde_json::to_vec(message).unwrap_or_default());
        let response = self.send(headers, body).await?;
        match response.body {
            UpstreamBody::Json(bytes) => Ok((response.status, Answer::Json(bytes))),
            UpstreamBody::Sse(mut stream) => {
                while let Some(event) = stream.next().await {
                    let event = event.map_err(|e| UpstreamError::BadResponse(e.to_string()))?;
                    let Some(data) = event.data else { continue };
                    let Ok(value) = crate::mcp::strict_json::from_str(&data) else {
                        continue;
                    };
                    if classify(&value, &id) == MessageKind::ResponseToRequest {
                        return Ok((response.status, Answer::Message(value)));
                    }
                }
                Err(UpstreamError::BadResponse(
                    "the event stream ended without a response".into(),
                ))
            }
            UpstreamBody::Empty | UpstreamBody::Other => Err(UpstreamError::BadResponse(format!(
                "HTTP {} without a JSON-RPC response",
                response.status
            ))),
        }
    }
}

/// The server's answer to a request the sidecar sent.
pub enum Answer {
    /// A JSON body, not yet parsed: [`response_message`] reads it.
    Json(Bytes),
    /// The response found in an event stream, parsed strictly.
    Message(Value),
}

/// The response message in a JSON answer: parsed strictly, and exactly the response to the
/// request `id` (same id, same JSON type), or an error.
pub fn response_message(bytes: &[u8], id: &Value) -> Result<Value, UpstreamError> {
    let value = crate::mcp::strict_json::from_slice(bytes)
        .map_err(|e| UpstreamError::BadResponse(e.to_string()))?;
    if classify(&value, id) != MessageKind::ResponseToRequest {
        return Err(UpstreamError::BadResponse(
            "the answer is not the response to this request".into(),
        ));
    }
    Ok(value)
}
