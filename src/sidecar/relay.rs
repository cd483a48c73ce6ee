//! Forwarding a client's request upstream and relaying the answer back, JSON or SSE, with the
//! final response passed through a [`FinalAction`] (where tasks are created or refused).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use http::header::HeaderMap;
use serde_json::Value;
use sse_stream::{Sse, SseBody};
use tokio::sync::Mutex;

use crate::audit::Decision;
use crate::mcp::codes;
use crate::mcp::jsonrpc::{ErrorObject, MessageKind, classify, error_message};
use crate::mcp::methods;
use crate::mcp::task::is_task_result;
use crate::telemetry::metrics::ReasonLabels;

use super::forward::client_request_headers;
use super::pipeline::RequestContext;
use super::respond;
use super::state::AppState;
use super::tasks::{PendingTask, confirm_created_task, refuse_unexpected_task};
use super::upstream::{UpstreamBody, UpstreamError};

/// What to do with the final response to a forwarded request.
pub enum FinalAction {
    /// The method cannot create tasks: a task result is refused.
    Plain,
    /// A `tools/call` allowed to become a task: a task result is confirmed in the ledger and
    /// rewritten; any other result releases the reservation.
    MayCreateTask(Box<PendingTask>),
}

/// Forwards a request that needs no special handling.
pub async fn forward_plain(app: Arc<AppState>, ctx: RequestContext) -> Response {
    let headers = client_request_headers(
        &ctx.headers,
        &ctx.identity,
        ctx.policy.effective.upstream_identity,
    );
    let body = ctx.body.clone();
    send_and_relay(app, Arc::new(ctx), headers, body, FinalAction::Plain).await
}

/// JSON-RPC error for an unreachable or misbehaving upstream.
pub fn upstream_failure(id: &Value, error: &UpstreamError) -> Response {
    tracing::warn!(%error, "upstream request failed");
    respond::rpc_error(
        StatusCode::BAD_GATEWAY,
        id,
        &ErrorObject::new(codes::INTERNAL_ERROR, "The MCP server is unavailable"),
    )
}

/// Sends `body` upstream and relays the response, applying `action` to the final response.
pub async fn send_and_relay(
    app: Arc<AppState>,
    ctx: Arc<RequestContext>,
    headers: HeaderMap,
    body: Bytes,
    action: FinalAction,
) -> Response {
    let id = ctx.id();
    let response = match app.upstream.send(headers, body).await {
        Ok(r) => r,
        Err(e) => return upstream_failure(&id, &e),
    };
    match response.body {
        UpstreamBody::Json(bytes) => {
            // Most answers are not tasks: those are passed on byte for byte, without building a
            // JSON tree. (A task answer to a request that may not create one is still caught:
            // the peek reads `result.resultType`.)
            if !peek_needs_inspection(&bytes) {
                drop(action); // releases a reservation that did not become a task
                return respond::raw_json(response.status, bytes);
            }
            let Ok(message) = serde_json::from_slice::<Value>(&bytes) else {
                return respond::rpc_error(
                    StatusCode::BAD_GATEWAY,
                    &id,
                    &ErrorObject::new(codes::INTERNAL_ERROR, "The MCP server's answer is not JSON"),
                );
            };
            let mut action = action;
            let message = finish_message(&app, &ctx, &mut action, message).await;
            respond::json(response.status, &message)
        }
        UpstreamBody::Sse(stream) => relay_sse(app, ctx, stream, action),
        UpstreamBody::Empty => respond::status(response.status),
        UpstreamBody::Other(_) if ctx.request.is_notification() => respond::status(response.status),
        UpstreamBody::Other(_) => respond::rpc_error(
            StatusCode::BAD_GATEWAY,
            &id,
            &ErrorObject::new(
                codes::INTERNAL_ERROR,
                "The MCP server returned a response that is not JSON-RPC",
            ),
        ),
    }
}

/// Applies `action` to the final response message.
async fn finish_message(
    app: &AppState,
    ctx: &RequestContext,
    action: &mut FinalAction,
    message: Value,
) -> Value {
    let id = ctx.id();
    if classify(&message, &id) != MessageKind::ResponseToRequest {
        return message;
    }
    let is_task = message.get("result").is_some_and(is_task_result);
    let asks_input = message
        .pointer("/result/resultType")
        .and_then(Value::as_str)
        == Some("input_required");
    if asks_input {
        return screen_request_inputs(app, ctx, message).await;
    }
    match action {
        FinalAction::Plain if is_task => refuse_unexpected_task(app, ctx, &message).await,
        FinalAction::Plain => message,
        FinalAction::MayCreateTask(pending) => {
            confirm_created_task(app, ctx, pending, message).await
        }
    }
}

/// Relays an SSE response: notifications pass (except kinds that never belong on a request
/// stream), the final response goes through `action`, server-to-client requests (which MCP
/// 2026-07-28 servers must not send) are dropped. Event ids and retry hints are dropped:
/// stateless MCP has no resumption.
fn relay_sse(
    app: Arc<AppState>,
    ctx: Arc<RequestContext>,
    stream: sse_stream::SseStream<hyper::body::Incoming>,
    action: FinalAction,
) -> Response {
    let action = Arc::new(Mutex::new(action));
    let events = stream
        .then(move |event| {
            let app = app.clone();
            let ctx = ctx.clone();
            let action = action.clone();
            async move {
                let event = match event {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed event from the MCP server");
                        return None;
                    }
                };
                let data = event.data?;
                let Ok(message) = serde_json::from_str::<Value>(&data) else {
                    anomaly(&app, "non_json_event");
                    return None;
                };
                let id = ctx.id();
                let out = match classify(&message, &id) {
                    MessageKind::ResponseToRequest => {
                        let mut action = action.lock().await;
                        finish_message(&app, &ctx, &mut action, message).await
                    }
                    MessageKind::Notification => {
                        let method = message.get("method").and_then(Value::as_str);
                        if method == Some(methods::NOTIFICATION_TASKS) {
                            // Task state belongs on listen streams, filtered per owner.
                            anomaly(&app, "task_notification_on_request_stream");
                            return None;
                        }
                        message
                    }
                    MessageKind::ServerRequest => {
                        anomaly(&app, "server_to_client_request");
                        app.audit.log(ctx.audit(
                            "request.anomaly",
                            Decision::Deny,
                            "server_to_client_request",
                        ));
                        return None;
                    }
                    MessageKind::ForeignResponse | MessageKind::Invalid => {
                        anomaly(&app, "foreign_message");
                        return None;
                    }
                };
                let mut sse = Sse::default().data(out.to_string());
                sse.event = event.event;
                Some(Ok::<_, Infallible>(sse))
            }
        })
        .filter_map(|e| async move { e });
    respond::event_stream(Body::new(SseBody::new(events)))
}

/// Most times the sidecar answers refused input requests for the client before it gives up.
const MAX_DECLINE_ROUNDS: usize = 3;

/// Screens the input requests of an `input_required` answer outside a task (multi round-trip
/// requests). When the gate refuses any of them, the client sees none of this round: the
/// sidecar retries the request upstream itself, with a decline for each refused key and the
/// server's `requestState`, so the server learns the answer and can go on (complete, or ask
/// again for what it still needs). Decisions are scoped to this client request (its correlation
/// id), so a key asked again in a later round is not charged twice.
async fn screen_request_inputs(app: &AppState, ctx: &RequestContext, mut message: Value) -> Value {
    for _ in 0..=MAX_DECLINE_ROUNDS {
        let Some(requests) = message
            .pointer_mut("/result/inputRequests")
            .and_then(Value::as_object_mut)
        else {
            return message;
        };
        let carrier = crate::sidecar::capability::Carrier {
            scope: &ctx.correlation_id,
            owner: &ctx.identity.owner,
            declared: &ctx.facts.capabilities,
            protocol_version: &ctx.facts.protocol_version,
            correlation_id: &ctx.correlation_id,
            policy_name: &ctx.policy.name,
        };
        let screened = app.gate.screen(
            &ctx.policy.effective,
            ctx.policy.trust.as_ref(),
            &carrier,
            requests,
        );
        screened.count(&app.metrics);
        for event in screened.events {
            app.audit.log(event);
        }
        if screened.refused.is_empty() {
            return message;
        }
        let declines: serde_json::Map<String, Value> = screened
            .refused
            .into_iter()
            .map(|(key, method, reason)| {
                (key, crate::sidecar::capability::decline(&method, reason))
            })
            .collect();
        let request_state = message
            .pointer("/result/requestState")
            .cloned()
            .unwrap_or(Value::Null);
        let Some(retry) = decline_retry(ctx, declines, request_state) else {
            break;
        };
        let headers = client_request_headers(
            &ctx.headers,
            &ctx.identity,
            ctx.policy.effective.upstream_identity,
        );
        message = match app.upstream.call(headers, &retry).await {
            Ok((_, answer)) => answer,
            Err(e) => {
                tracing::warn!(error = %e, "retrying with capability declines failed");
                break;
            }
        };
        if message
            .pointer("/result/resultType")
            .and_then(Value::as_str)
            != Some("input_required")
        {
            return message;
        }
    }
    error_value(
        &ctx.id(),
        codes::INTERNAL_ERROR,
        "The MCP server asked for a capability this policy does not allow",
    )
}

/// The client's request again, answering with `declines` under the server's `requestState`.
fn decline_retry(
    ctx: &RequestContext,
    declines: serde_json::Map<String, Value>,
    request_state: Value,
) -> Option<Value> {
    let mut retry: Value = serde_json::from_slice(&ctx.body).ok()?;
    let params = retry.get_mut("params")?.as_object_mut()?;
    params.insert("inputResponses".into(), Value::Object(declines));
    if request_state.is_null() {
        params.remove("requestState");
    } else {
        params.insert("requestState".into(), request_state);
    }
    Some(retry)
}

/// Whether a JSON-RPC response's `result.resultType` is `task` or `input_required` (answers the
/// sidecar must look into), read without building a tree. Unparseable bodies take the careful
/// path too.
pub fn peek_needs_inspection(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow, default)]
        result: Option<PeekResult<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct PeekResult<'a> {
        #[serde(rename = "resultType", borrow, default)]
        result_type: Option<std::borrow::Cow<'a, str>>,
    }
    match serde_json::from_slice::<Peek<'_>>(bytes) {
        Ok(peek) => peek
            .result
            .and_then(|r| r.result_type)
            .is_some_and(|t| t == "task" || t == "input_required"),
        Err(_) => true,
    }
}

pub fn anomaly(app: &AppState, reason: &'static str) {
    app.metrics
        .anomalies
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

/// An error message answering `id`.
pub fn error_value(id: &Value, code: i64, message: &str) -> Value {
    error_message(id, &ErrorObject::new(code, message))
}
