//! `POST /mcp`: envelope validation and method dispatch.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::AppState;
use crate::jobs::{self, JobCtx};
use crate::rpc::{
    self, INVALID_REQUEST, META_SERVER_INFO, PARSE_ERROR, PROTOCOL_VERSION, RequestContext,
    RpcError, TASKS_EXT, error_reply, json_reply, result_envelope,
};
use crate::store::Outcome;
use crate::tools::{self, ToolCall};
use crate::{inputs, listen, streaming};

/// Freshness hint for the cacheable results (discover and the lists).
const CACHE_TTL_MS: u64 = 60_000;

/// GET and DELETE on /mcp: no legacy SSE stream, no sessions.
pub async fn method_not_allowed(
    State(state): State<AppState>,
    method: Method,
    version: axum::http::Version,
    headers: HeaderMap,
) -> Response {
    state
        .requests
        .record(method.as_str(), None, (None, None), &headers, version);
    (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "POST")]).into_response()
}

/// Browsers send `Origin`; only local origins are accepted (DNS-rebinding protection).
fn origin_allowed(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = if rest.starts_with('[') {
        rest.split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default()
    } else {
        rest.split(':').next().unwrap_or_default().to_owned()
    };
    matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
}

pub async fn post_mcp(
    State(state): State<AppState>,
    version: axum::http::Version,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: Result<Value, _> = serde_json::from_slice(&body);
    {
        let msg = parsed.as_ref().ok();
        let mcp_method = msg.and_then(|m| m.get("method")).and_then(Value::as_str);
        let task_id = msg
            .and_then(|m| m.get("params"))
            .and_then(|p| p.get("taskId"))
            .and_then(Value::as_str);
        let meta_traceparent = msg
            .and_then(|m| m.get("params"))
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get("traceparent"))
            .and_then(Value::as_str);
        state.requests.record(
            "POST",
            mcp_method,
            (task_id, meta_traceparent),
            &headers,
            version,
        );
    }
    if !origin_allowed(&headers) {
        return json_reply(
            StatusCode::FORBIDDEN,
            &rpc::error_envelope(
                &Value::Null,
                &RpcError::new(INVALID_REQUEST, "Origin not allowed"),
            ),
        );
    }
    let msg = match parsed {
        Ok(v) => v,
        Err(_) => return error_reply(&Value::Null, &RpcError::new(PARSE_ERROR, "Parse error")),
    };
    let obj = match msg {
        Value::Object(o) => o,
        Value::Array(_) => {
            return error_reply(
                &Value::Null,
                &RpcError::new(INVALID_REQUEST, "Batch requests are not supported"),
            );
        }
        _ => {
            return error_reply(
                &Value::Null,
                &RpcError::new(INVALID_REQUEST, "A JSON-RPC message must be an object"),
            );
        }
    };
    let id = match obj.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.clone()),
        None => None,
        Some(_) => {
            return error_reply(
                &Value::Null,
                &RpcError::new(INVALID_REQUEST, "id must be a string or a number"),
            );
        }
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return error_reply(
            &reply_id,
            &RpcError::new(INVALID_REQUEST, "jsonrpc must be \"2.0\""),
        );
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return error_reply(
            &reply_id,
            &RpcError::new(INVALID_REQUEST, "Expected a request with a string method"),
        );
    };
    let Some(id) = id else {
        // A notification: nothing to answer. The one client notification of 2026-07-28 stops
        // the requests in flight under the id it names.
        if method == "notifications/cancelled" {
            state.cancels.cancel(obj.get("params"), &headers);
        }
        return StatusCode::ACCEPTED.into_response();
    };
    let params = obj.get("params");
    let ctx = match rpc::check_request(&headers, method, params) {
        Ok(ctx) => ctx,
        Err(e) => return error_reply(&id, &e),
    };
    let params = params.cloned().unwrap_or(Value::Null);
    match dispatch(&state, &id, method, &params, &ctx).await {
        Ok(Reply::Result(result)) => json_reply(StatusCode::OK, &result_envelope(&id, result)),
        Ok(Reply::Stream(resp)) => resp,
        Err(e) => error_reply(&id, &e),
    }
}

enum Reply {
    Result(Value),
    Stream(Response),
}

async fn dispatch(
    state: &AppState,
    id: &Value,
    method: &str,
    params: &Value,
    ctx: &RequestContext,
) -> Result<Reply, RpcError> {
    let ok = |v: Value| Ok(Reply::Result(v));
    match method {
        "server/discover" => ok(discover()),
        "logging/setLevel" => {
            let level = params
                .get("level")
                .and_then(Value::as_str)
                .ok_or_else(|| RpcError::invalid_params("`level` must be a string"))?;
            *state.log_level.lock().unwrap_or_else(|e| e.into_inner()) = Some(level.to_owned());
            ok(json!({"resultType": "complete"}))
        }
        "tools/list" => ok(json!({
            "resultType": "complete",
            "tools": tools::list(),
            "ttlMs": CACHE_TTL_MS,
            "cacheScope": "public",
        })),
        "tools/call" => tools_call(state, id, params, ctx).await,
        "resources/list" => ok(json!({
            "resultType": "complete",
            "resources": [{
                "uri": "example://rows",
                "name": "rows",
                "description": "The rows written by write_rows, as JSON.",
                "mimeType": "application/json",
            }],
            "ttlMs": CACHE_TTL_MS,
            "cacheScope": "public",
        })),
        "resources/read" => read_resource(state, params).map(Reply::Result),
        "prompts/list" => ok(json!({
            "resultType": "complete",
            "prompts": [{
                "name": "greeting",
                "description": "Ask the model to greet someone.",
                "arguments": [{"name": "name", "required": true}],
            }],
            "ttlMs": CACHE_TTL_MS,
            "cacheScope": "public",
        })),
        "prompts/get" if params.get("name").and_then(Value::as_str) == Some("rogue_task") => {
            // Deliberately wrong: no method but tools/call may create a task.
            let (task_id, created, wake) = state.store.create();
            jobs::spawn_task(
                state.store.clone(),
                task_id,
                wake,
                ToolCall::Rogue { seconds: 5.0 },
            );
            ok(created)
        }
        "prompts/get" => get_prompt(params).map(Reply::Result),
        "tasks/get" | "tasks/update" | "tasks/cancel" => {
            if !ctx.tasks_ext {
                return Err(RpcError::tasks_extension_required());
            }
            if method == "tasks/get" {
                wait_if_slow(state, params).await;
            }
            task_method(state, method, params).map(Reply::Result)
        }
        "subscriptions/listen" => Ok(Reply::Stream(listen::listen(state, id, params, ctx)?)),
        // tasks/list and tasks/result were removed from the protocol: like any other unknown
        // method they are -32601 (HTTP 404).
        other => Err(RpcError::method_not_found(other)),
    }
}

fn discover() -> Value {
    let server_info = json!({"name": "lifeguard-example-server", "version": "0.1.0"});
    json!({
        "resultType": "complete",
        "supportedVersions": [PROTOCOL_VERSION],
        "capabilities": {
            "tools": {"listChanged": true},
            "resources": {"subscribe": true, "listChanged": true},
            "prompts": {"listChanged": true},
            "extensions": {TASKS_EXT: {}},
        },
        "serverInfo": server_info,
        "ttlMs": CACHE_TTL_MS,
        "cacheScope": "public",
        "_meta": {META_SERVER_INFO: server_info},
    })
}

fn read_resource(state: &AppState, params: &Value) -> Result<Value, RpcError> {
    let uri = params
        .get("uri")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params("resources/read requires a string `uri`"))?;
    if uri != "example://rows" {
        return Err(RpcError::invalid_params("Resource not found").with_data(json!({"uri": uri})));
    }
    Ok(json!({
        "resultType": "complete",
        "contents": [{
            "uri": uri,
            "mimeType": "application/json",
            "text": Value::Array(state.store.rows()).to_string(),
        }],
        "ttlMs": 0,
        "cacheScope": "public",
    }))
}

fn get_prompt(params: &Value) -> Result<Value, RpcError> {
    let name = params.get("name").and_then(Value::as_str);
    if name != Some("greeting") {
        return Err(RpcError::invalid_params(format!(
            "Unknown prompt: {}",
            name.unwrap_or("")
        )));
    }
    let who = params
        .get("arguments")
        .and_then(|a| a.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params("Missing required argument: name"))?;
    Ok(json!({
        "resultType": "complete",
        "messages": [{"role": "user", "content": {"type": "text", "text": format!("Please greet {who}.")}}],
    }))
}

async fn tools_call(
    state: &AppState,
    id: &Value,
    params: &Value,
    ctx: &RequestContext,
) -> Result<Reply, RpcError> {
    let call = tools::parse(params)?;
    // As the Python SDK validates the params before the tool runs: whatever a retried request
    // carries must be an InputResponse (the tool checks the keys it asked for by their type).
    inputs::check_retry(params, &[])?;
    // `rogue_task` ignores what the client declared: the bug the sidecar must catch.
    let as_task = (call.task_capable() && ctx.tasks_ext) || matches!(call, ToolCall::Rogue { .. });
    if !as_task && call.task_only() {
        return Err(RpcError::tasks_extension_required());
    }
    if !as_task {
        match &call {
            ToolCall::ListRoots => return Ok(Reply::Result(jobs::roots_round_trip(params)?)),
            ToolCall::Summarize {
                text,
                max_tokens,
                rounds,
                tools,
                extra,
                ..
            } => {
                let reply =
                    jobs::summarize_round_trip(params, text, *max_tokens, *rounds, tools, extra)?;
                return Ok(Reply::Result(reply));
            }
            _ => {}
        }
    }
    if ctx.accepts_sse
        && let Some(token) = &ctx.progress_token
    {
        return Ok(Reply::Stream(streaming::tools_call_sse(
            state,
            id.clone(),
            call,
            as_task,
            token.clone(),
        )));
    }
    if as_task {
        let (task_id, created, wake) = state.store.create();
        if let ToolCall::WriteRows {
            ignore_cancel,
            slow_polls,
            ..
        } = &call
        {
            if *ignore_cancel {
                state.store.ignore_cancel(&task_id);
            }
            if *slow_polls {
                state.store.slow_polls(&task_id);
            }
        }
        if let ToolCall::Summarize {
            ignore_cancel: true,
            ..
        } = &call
        {
            state.store.ignore_cancel(&task_id);
        }
        jobs::spawn_task(state.store.clone(), task_id, wake, call);
        return Ok(Reply::Result(created));
    }
    let job = JobCtx {
        store: state.store.clone(),
        task: None,
        progress: None,
    };
    // A synchronous run stops when a `notifications/cancelled` names its id.
    let registered = state.cancels.register(id);
    let outcome = tokio::select! {
        outcome = jobs::run(&call, &job) => outcome,
        () = registered.token.cancelled() => {
            return Err(RpcError::new(crate::cancels::REQUEST_CANCELLED, "Request cancelled"));
        }
    };
    match outcome {
        Outcome::Done(result) => Ok(Reply::Result(result)),
        Outcome::Failed(error) => Err(rpc_error_from(&error)),
        Outcome::Cancelled => Err(RpcError::new(rpc::INTERNAL_ERROR, "Cancelled")),
    }
}

/// Turns a stored JSON-RPC error object back into an [`RpcError`].
pub fn rpc_error_from(error: &Value) -> RpcError {
    let code = error
        .get("code")
        .and_then(Value::as_i64)
        .unwrap_or(rpc::INTERNAL_ERROR);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("Internal error");
    let mut e = RpcError::new(code, message);
    e.data = error.get("data").cloned();
    e
}

/// Paces `tasks/get` on a `slowPolls` task: a poll that arrives before the task is cancelled
/// is answered the moment it is (at most 30 s later); one that arrives after waits 200 ms, so
/// the poll that was in flight answers first.
async fn wait_if_slow(state: &AppState, params: &Value) {
    let Some(task_id) = params.get("taskId").and_then(Value::as_str) else {
        return;
    };
    let mut changes = state.store.subscribe();
    match state.store.slow_poll_cancelled(task_id) {
        None => return,
        Some(true) => {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            return;
        }
        Some(false) => {}
    }
    let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while state.store.slow_poll_cancelled(task_id) == Some(false) {
        match tokio::time::timeout_at(give_up, changes.recv()).await {
            Err(_) | Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => return,
            Ok(_) => {}
        }
    }
}

fn task_method(state: &AppState, method: &str, params: &Value) -> Result<Value, RpcError> {
    let task_id = params
        .get("taskId")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("{method} requires a string `taskId`")))?;
    let not_found = || RpcError::invalid_params(format!("Task not found: {task_id}"));
    match method {
        "tasks/get" => {
            let mut state = state.store.get(task_id).ok_or_else(not_found)?;
            state["resultType"] = json!("complete");
            Ok(state)
        }
        "tasks/update" => {
            let responses = params
                .get("inputResponses")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    RpcError::invalid_params("tasks/update requires an object `inputResponses`")
                })?;
            state
                .store
                .update(task_id, responses)
                .ok_or_else(not_found)?
                .map_err(inputs::invalid)?;
            Ok(json!({"resultType": "complete"}))
        }
        _ => {
            state.store.cancel(task_id).ok_or_else(not_found)?;
            Ok(json!({"resultType": "complete"}))
        }
    }
}
