//! Observation endpoints for tests and demos (plain JSON, not MCP), and the request log.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::rpc::now_ms;
use crate::store::Event;

const REQUEST_LOG_LEN: usize = 200;

/// The last [`REQUEST_LOG_LEN`] requests to `/mcp`. The Authorization header is recorded only
/// as present/absent, never its value — except a Lifeguard delegation assertion (a JWT whose
/// header says `typ: lifeguard-delegation+jwt`), kept as `delegation` so tests can verify what
/// the sidecar signed. A user's own token is never recorded.
#[derive(Default)]
pub struct RequestLog(Mutex<VecDeque<Value>>);

/// The bearer of `headers` when it is a Lifeguard delegation assertion.
fn delegation_assertion(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let header = bearer.split('.').next()?;
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .ok()?;
    let header: Value = serde_json::from_slice(&decoded).ok()?;
    (header["typ"] == "lifeguard-delegation+jwt").then(|| bearer.to_owned())
}

impl RequestLog {
    pub fn record(
        &self,
        http_method: &str,
        mcp_method: Option<&str>,
        (task_id, meta_traceparent): (Option<&str>, Option<&str>),
        headers: &HeaderMap,
        version: axum::http::Version,
    ) {
        let lifeguard: Map<String, Value> = headers
            .iter()
            .filter(|(name, _)| name.as_str().starts_with("lifeguard-"))
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    json!(String::from_utf8_lossy(value.as_bytes())),
                )
            })
            .collect();
        let entry = json!({
            "method": http_method,
            "mcpMethod": mcp_method,
            "taskId": task_id,
            "authorization": headers.contains_key(axum::http::header::AUTHORIZATION),
            "delegation": delegation_assertion(headers),
            "lifeguard": lifeguard,
            "httpVersion": format!("{version:?}"),
            // W3C Trace Context, so tests can check whose span the caller made this request in.
            "traceparent": headers.get("traceparent").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            // ...and the one in `params._meta`, where the MCP conventions carry it too.
            "metaTraceparent": meta_traceparent,
            "atMs": now_ms(),
        });
        let mut log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() >= REQUEST_LOG_LEN {
            log.pop_front();
        }
        log.push_back(entry);
    }

    fn snapshot(&self) -> Vec<Value> {
        let log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().cloned().collect()
    }
}

/// `GET /_example/rows`
pub async fn rows(State(state): State<AppState>) -> Json<Vec<Value>> {
    Json(state.store.rows())
}

/// `GET /_example/requests`
pub async fn requests(State(state): State<AppState>) -> Json<Vec<Value>> {
    Json(state.requests.snapshot())
}

/// `GET /_example/tasks`: the upstream truth, `[{taskId, status}]`.
pub async fn tasks(State(state): State<AppState>) -> Json<Vec<Value>> {
    Json(state.store.brief_list())
}

/// `GET /_example/listeners`: how many listen streams are open.
pub async fn listeners(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"active": state.listeners.load(Ordering::SeqCst)}))
}

fn bad_request(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": message}))).into_response()
}

/// `POST /_example/emit {"kind": ..., "uri"?: ..., "count"?: N}`: pushes a notification (N
/// times) to the listen
/// streams subscribed to it.
pub async fn emit(State(state): State<AppState>, body: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return bad_request("body must be JSON");
    };
    let event = match body.get("kind").and_then(Value::as_str) {
        Some("toolsListChanged") => Event::ToolsListChanged,
        Some("promptsListChanged") => Event::PromptsListChanged,
        Some("resourcesListChanged") => Event::ResourcesListChanged,
        Some("resourceUpdated") => match body.get("uri").and_then(Value::as_str) {
            Some(uri) => Event::ResourceUpdated {
                uri: uri.to_owned(),
            },
            None => return bad_request("resourceUpdated needs a string `uri`"),
        },
        _ => {
            return bad_request(
                "kind must be toolsListChanged, promptsListChanged, resourcesListChanged or \
                 resourceUpdated",
            );
        }
    };
    // `count` repeats the notification (for flooding a slow listener), yielding now and then so
    // listeners keep up with the broadcast channel instead of lagging.
    let count = body
        .get("count")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .min(1_000_000);
    if count == 1 {
        state.store.emit(event);
    } else {
        let store = state.store.clone();
        tokio::spawn(async move {
            for i in 0..count {
                store.emit(event.clone());
                if i % 32 == 31 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
        });
    }
    Json(json!({"ok": true, "count": count})).into_response()
}
