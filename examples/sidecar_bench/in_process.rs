//! A sidecar and an MCP server in the benchmark's own process: `lifeguard::sidecar::run` (the
//! library code of the `lifeguard sidecar` binary) in front of a server that answers from
//! memory, both served on the caller's [`Workers`].
//!
//! Used by the hot-path phase of `sidecar_bench` and by `perf_gate` (which includes this file
//! by path): whatever either measures is the sidecar's own work, not a child process's.

// The hot path does not emit listen events; perf_gate does: what one leaves unused is not dead
// in the other.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::Json;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use lifeguard::runtime::http::ServerLimits;
use lifeguard::runtime::workers::Workers;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::client::{Conn, Endpoint, Template};
use crate::procs::{Keys, TASK_TOOL};

/// The `_meta` key every listen frame carries: the listen request's id.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The sidecar of this process, with `policy` (an `McpServerPolicy` document whose identity
/// reads `jwksFile: jwks.json`) in front of `upstream`; returns its MCP endpoint once it
/// answers.
pub async fn start_sidecar(
    dir: &Path,
    keys: &Keys,
    policy: &str,
    upstream: SocketAddr,
    workers: &Workers,
    shutdown: CancellationToken,
) -> Result<Endpoint> {
    std::fs::write(dir.join("jwks.json"), &keys.jwks).context("writing jwks.json")?;
    let policy_file = dir.join("policy.yaml");
    std::fs::write(&policy_file, policy).context("writing the policy")?;
    let listen = free_port()?;
    let config = lifeguard::sidecar::SidecarConfig {
        policy: lifeguard::sidecar::PolicySourceConfig::File {
            path: policy_file,
            approver_keys: None,
        },
        upstream: format!("http://{upstream}/mcp").parse()?,
        listen,
        ledger: lifeguard::ledger::LedgerLocation::Sqlite(dir.join("ledger.db")),
        ledger_scope: lifeguard::ledger::LedgerScope::local(),
        internal_listen: None,
        heartbeat_ttl: Duration::from_secs(30),
        internal_advertise: None,
        admin: None,
        audit_file: Some(dir.join("audit.jsonl")),
        upstream_timeout: Duration::from_secs(30),
        upstream_http2: lifeguard::sidecar::UpstreamHttp2::Never,
        cancel_confirm_timeout: Duration::from_secs(5),
        limits: ServerLimits {
            max_connections: 4096,
            max_connections_per_peer: 4096,
            ..Default::default()
        },
        app_probes: Default::default(),
        workers: Some(workers.clone()),
    };
    tokio::spawn(async move {
        if let Err(e) = lifeguard::sidecar::run(config, shutdown).await {
            eprintln!("the in-process sidecar stopped: {e:#}");
        }
    });
    let endpoint = Endpoint {
        addr: listen,
        path: "/mcp".into(),
    };
    // Under valgrind everything runs tens of times slower: a generous deadline.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        // Ready once a connection is accepted and the policy is in force (no 503).
        if let Ok(mut conn) = Conn::connect(listen).await {
            let probe = Template::mcp(
                &endpoint,
                "not-a-token",
                "tools/list",
                None,
                json!({}),
                false,
            );
            if let Ok(status) = conn.send(probe.bytes()).await
                && status == 401
            {
                return Ok(endpoint);
            }
        }
        if Instant::now() > deadline {
            bail!("the in-process sidecar never became ready");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn free_port() -> Result<SocketAddr> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(probe.local_addr()?)
}

/// An MCP server that answers from memory: `greet`, tasks of [`TASK_TOOL`] that never end
/// (reported working), and `subscriptions/listen` streams of the resource events
/// [`MemoryServer::emit`] sends.
pub struct MemoryServer {
    pub addr: SocketAddr,
    events: broadcast::Sender<String>,
}

impl MemoryServer {
    /// Serves on `workers` until `shutdown`.
    pub async fn start(workers: &Workers, shutdown: CancellationToken) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let next = Arc::new(AtomicU64::new(0));
        let (events, _) = broadcast::channel(1024);
        let subscribe = events.clone();
        let app = axum::Router::new().route(
            "/mcp",
            post(move |Json(request): Json<Value>| {
                let (next, subscribe) = (next.clone(), subscribe.clone());
                async move {
                    if request.get("method").and_then(Value::as_str) == Some("subscriptions/listen")
                    {
                        listen(&request, subscribe.subscribe())
                    } else {
                        Json(answer(&request, &next)).into_response()
                    }
                }
            }),
        );
        let limits = ServerLimits {
            max_connections: 4096,
            max_connections_per_peer: 4096,
            ..Default::default()
        };
        let metrics = lifeguard::runtime::http::ConnectionMetrics::default();
        tokio::spawn(lifeguard::runtime::http::serve_on(
            listener,
            app,
            limits,
            metrics,
            shutdown,
            workers.clone(),
        ));
        Ok(Self { addr, events })
    }

    /// A `notifications/resources/updated` event for `uri` to every open listen stream that
    /// subscribed to it; returns how many streams it was offered to.
    pub fn emit(&self, uri: &str) -> usize {
        self.events.send(uri.to_owned()).unwrap_or(0)
    }
}

/// A listen stream: the acknowledgement of the resource subscriptions asked for, then an
/// update for each emitted URI among them.
fn listen(request: &Value, events: broadcast::Receiver<String>) -> Response {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let uris: Vec<String> = request
        .pointer("/params/notifications/resourceSubscriptions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let ack = json!({
        "jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": {"resourceSubscriptions": uris}, "_meta": {SUBSCRIPTION_ID: id}},
    });
    let first = futures_util::stream::once(async move { sse(&ack) });
    let updates =
        futures_util::stream::unfold((events, uris, id), |(mut events, uris, id)| async move {
            loop {
                match events.recv().await {
                    Ok(uri) if uris.contains(&uri) => {
                        let frame = json!({
                            "jsonrpc": "2.0", "method": "notifications/resources/updated",
                            "params": {"uri": uri, "_meta": {SUBSCRIPTION_ID: id}},
                        });
                        return Some((sse(&frame), (events, uris, id)));
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
    Sse::new(first.chain(updates)).into_response()
}

fn sse(frame: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event("message").data(frame.to_string()))
}

const CREATED_AT: &str = "2026-12-02T00:00:00.000Z";

fn answer(request: &Value, next: &AtomicU64) -> Value {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let task = |task_id: &str, result_type: Option<&str>| {
        let mut state = json!({
            "taskId": task_id, "status": "working", "createdAt": CREATED_AT,
            "lastUpdatedAt": CREATED_AT, "ttlMs": 86_400_000, "pollIntervalMs": 500,
        });
        if let Some(t) = result_type {
            state["resultType"] = json!(t);
        }
        state
    };
    let result = match request.get("method").and_then(Value::as_str) {
        Some("tools/call") if request.pointer("/params/name") == Some(&json!(TASK_TOOL)) => {
            let n = next.fetch_add(1, Ordering::Relaxed);
            task(&format!("memory-task-{n}"), Some("task"))
        }
        Some("tools/call") => json!({"content": [{"type": "text", "text": "Hello, bench!"}]}),
        Some("tasks/get") => {
            let task_id = request
                .pointer("/params/taskId")
                .and_then(Value::as_str)
                .unwrap_or_default();
            task(task_id, None)
        }
        _ => json!({}),
    };
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}
