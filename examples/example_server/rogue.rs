//! Rogue behaviour for the sidecar's hardening tests, kept apart from the well-behaved server:
//!
//! - a full request log (`GET /_example/rogue/requests`): every `POST /mcp` with all its header
//!   names and values (Authorization values redacted, but counted) and its body, so tests can
//!   prove what did — and did not — reach the server;
//! - the tool `rogue_reply`, answered here before the normal dispatch, which breaks the protocol
//!   the way `arguments.kind` says (see [`rogue_reply`]). It is not listed by `tools/list`;
//! - `tasks/cancel` sent as a notification (without `id`) is executed, as JSON-RPC servers that
//!   run notifications do (the well-behaved dispatch ignores notifications).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Mutex;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};

use crate::AppState;

const LOG_LEN: usize = 1000;
/// Request bodies are read whole up to this size (larger ones are answered 413 here).
const MAX_BODY: usize = 16 * 1024 * 1024;
/// The name of the rogue tool.
pub const ROGUE_TOOL: &str = "rogue_reply";

static LOG: Mutex<VecDeque<Value>> = Mutex::new(VecDeque::new());

/// `GET /_example/rogue/requests`: `[{headers: [[name, value]…], authorizations, body}]`.
pub async fn requests() -> Json<Vec<Value>> {
    let log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    Json(log.iter().cloned().collect())
}

fn record(headers: &HeaderMap, body: &[u8]) {
    let pairs: Vec<Value> = headers
        .iter()
        .map(|(name, value)| {
            let value = if name == header::AUTHORIZATION {
                "<redacted>".to_owned()
            } else {
                String::from_utf8_lossy(value.as_bytes()).into_owned()
            };
            json!([name.as_str(), value])
        })
        .collect();
    let entry = json!({
        "headers": pairs,
        "authorizations": headers.get_all(header::AUTHORIZATION).iter().count(),
        "body": serde_json::from_slice::<Value>(body).unwrap_or(Value::Null),
        "raw": String::from_utf8_lossy(&body[..body.len().min(64 * 1024)]),
    });
    let mut log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    if log.len() >= LOG_LEN {
        log.pop_front();
    }
    log.push_back(entry);
}

/// Middleware in front of every route: logs `POST /mcp`, answers `rogue_reply` calls and
/// executes `tasks/cancel` notifications.
pub async fn intercept(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || request.uri().path() != "/mcp" {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    record(&parts.headers, &bytes);
    if let Ok(message) = serde_json::from_slice::<Value>(&bytes) {
        if message["method"] == "tools/call" && message["params"]["name"] == ROGUE_TOOL {
            return rogue_reply(&message);
        }
        if message.get("id").is_none() && message["method"] == "tasks/cancel" {
            if let Some(task_id) = message["params"]["taskId"].as_str() {
                state.store.cancel(task_id);
            }
            return StatusCode::ACCEPTED.into_response();
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn text_result(text: &str) -> Value {
    json!({"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": false})
}

/// The same id as another JSON type: a number as a string, a string as a number (or with a
/// trailing space when it is not numeric).
fn retyped(id: &Value) -> Value {
    match id {
        Value::Number(n) => Value::String(n.to_string()),
        Value::String(s) => s
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(format!("{s} "))),
        other => other.clone(),
    }
}

fn json_text(text: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response()
}

fn sse_frame(message: &Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

fn sse(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream")],
        body,
    )
        .into_response()
}

fn progress(token: &Value, n: u64) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/progress",
           "params": {"progressToken": token, "progress": n, "message": format!("rogue progress {n}")}})
}

/// `rogue_reply` answers as `arguments.kind` says:
///
/// - `id_as_string` / `id_as_float`: a complete result whose id is the request's as another JSON
///   type (`"7"`) / as a float (`7.0`);
/// - `batch`: the right response, wrapped in an array;
/// - `task_id_as_string`: a `resultType: task` answer (upstream task `rogue-upstream-task-1`)
///   with the retyped id;
/// - `sampling_id_as_string`: an `input_required` answer asking `sampling/createMessage`
///   (key `rogue-sample`) with the retyped id;
/// - `duplicate_id` / `duplicate_result`: the right response with `id` / `result` twice;
/// - `huge_event`: an event stream: a progress notification, one progress notification of
///   `mib` MiB (default 33; streamed, never held in memory), then the result;
/// - `listen_notifications`: an event stream: progress, `notifications/tools/list_changed`,
///   `notifications/resources/updated`, `notifications/tasks`, progress, then the result.
///
/// The results carry the text `rogue-answer`; unknown kinds are -32602.
fn rogue_reply(message: &Value) -> Response {
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let args = &message["params"]["arguments"];
    let token = message["params"]["_meta"]["progressToken"].clone();
    let answer = text_result("rogue-answer");
    let respond = |id: Value, result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    match args["kind"].as_str().unwrap_or_default() {
        "id_as_string" => Json(respond(retyped(&id), answer)).into_response(),
        "id_as_float" => {
            let float = id.as_f64().map(Value::from).unwrap_or(id);
            Json(respond(float, answer)).into_response()
        }
        "batch" => Json(json!([respond(id, answer)])).into_response(),
        "task_id_as_string" => Json(respond(
            retyped(&id),
            json!({
                "resultType": "task", "taskId": "rogue-upstream-task-1", "status": "working",
                "createdAt": "2026-07-28T00:00:00.000Z", "lastUpdatedAt": "2026-07-28T00:00:00.000Z",
                "ttlMs": 60_000, "pollIntervalMs": 500,
            }),
        ))
        .into_response(),
        // A server that deduplicates by arguments: every call gets the same upstream task.
        "same_task_for_everyone" => Json(respond(
            id,
            json!({
                "resultType": "task", "taskId": "rogue-shared-task", "status": "working",
                "createdAt": "2026-07-28T00:00:00.000Z", "lastUpdatedAt": "2026-07-28T00:00:00.000Z",
                "ttlMs": 60_000, "pollIntervalMs": 500,
            }),
        ))
        .into_response(),
        "task_asking_for_sampling" => Json(respond(
            id,
            json!({
                "resultType": "task", "taskId": "rogue-asking-task", "status": "input_required",
                "createdAt": "2026-07-28T00:00:00.000Z", "lastUpdatedAt": "2026-07-28T00:00:00.000Z",
                "ttlMs": 60_000, "pollIntervalMs": 500,
                "inputRequests": {"born-asking": {"method": "sampling/createMessage", "params": {
                    "messages": [{"role": "user", "content": {"type": "text", "text": "rogue prompt"}}],
                    "maxTokens": 10,
                }}},
            }),
        ))
        .into_response(),
        "sampling_id_as_string" => Json(respond(
            retyped(&id),
            json!({
                "resultType": "input_required",
                "inputRequests": {"rogue-sample": {"method": "sampling/createMessage", "params": {
                    "messages": [{"role": "user", "content": {"type": "text", "text": "rogue prompt"}}],
                    "maxTokens": 10,
                }}},
                "requestState": "rogue-state",
            }),
        ))
        .into_response(),
        "duplicate_id" => json_text(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"id":{id},"result":{answer}}}"#
        )),
        "duplicate_result" => json_text(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{answer},"result":{}}}"#,
            text_result("rogue-second-answer")
        )),
        "huge_event" => {
            let mib = args["mib"].as_u64().unwrap_or(33);
            let chunk = Bytes::from(vec![b'x'; 1024 * 1024]);
            let head = format!(
                r#"event: message{nl}data: {{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":2,"message":""#,
                nl = '\n'
            );
            let frames = [sse_frame(&progress(&token, 1)), Bytes::from(head)]
                .into_iter()
                .chain(std::iter::repeat_n(chunk, usize::try_from(mib).unwrap_or(0)))
                .chain([
                    Bytes::from_static(b"\"}}\n\n"),
                    sse_frame(&respond(id, answer)),
                ])
                .map(Ok::<_, Infallible>);
            sse(Body::from_stream(stream::iter(frames)))
        }
        "listen_notifications" => {
            let frames = [
                progress(&token, 1),
                json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed", "params": {}}),
                json!({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                       "params": {"uri": "example://rogue/updated"}}),
                json!({"jsonrpc": "2.0", "method": "notifications/tasks",
                       "params": {"taskId": "rogue-upstream-task-2", "status": "working",
                                  "createdAt": "2026-07-28T00:00:00.000Z",
                                  "lastUpdatedAt": "2026-07-28T00:00:00.000Z", "ttlMs": 60_000}}),
                progress(&token, 2),
                respond(id, answer),
            ]
            .iter()
            .map(|m| Ok::<_, Infallible>(sse_frame(m)))
            .collect::<Vec<_>>();
            sse(Body::from_stream(stream::iter(frames)))
        }
        other => Json(json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": -32602, "message": format!("Unknown rogue kind: {other}")}}))
        .into_response(),
    }
}
