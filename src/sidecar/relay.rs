//! Forwarding a client's request upstream and relaying the answer back, JSON or SSE.
//!
//! Relaying knows nothing about tasks: when the final answer says the request became a task,
//! it hands the answer to the request's [`FinalStep`] (task creation implements one; every
//! other request uses [`RefuseTasks`]). Input requests outside tasks pass the capability gate.

use std::convert::Infallible;
use std::sync::Arc;

use async_trait::async_trait;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::header::HeaderMap;
use serde_json::Value;
use sse_stream::{Sse, SseBody};
use tokio::sync::Mutex;

use crate::audit::Decision;
use crate::mcp::jsonrpc::{MessageKind, classify};
use crate::mcp::methods;
use crate::mcp::task::peek_result_type;

use super::capability_screen::screen_request_inputs;
use super::context::RequestContext;
use super::decisions::{FinalAnswer, classify_final};
use super::error::Error;
use super::respond;
use super::server_tasks::cancel_orphan;
use super::state::AppState;
use super::upstream::UpstreamBody;

/// What becomes of a final answer that says the request became a task. Dropping the step
/// without calling it means the request did not become a task.
#[async_trait]
pub trait FinalStep: Send + 'static {
    /// Returns the message to send the client instead of `message` (a `resultType: task`
    /// response to this request).
    async fn on_task(&mut self, app: &AppState, ctx: &RequestContext, message: Value) -> Value;
}

/// The final step of every request that may not create a task: a task result is refused.
pub struct RefuseTasks;

#[async_trait]
impl FinalStep for RefuseTasks {
    /// The client gets an error, the server is asked to cancel the task, and the event is
    /// audited.
    async fn on_task(&mut self, app: &AppState, ctx: &RequestContext, message: Value) -> Value {
        app.metrics.anomaly("unexpected_task");
        app.audit.log(
            ctx.audit("task.refused", Decision::Deny, "task_not_allowed")
                .detail("method", ctx.request.method.clone()),
        );
        if let Some(upstream_id) = message.pointer("/result/taskId").and_then(Value::as_str) {
            cancel_orphan(
                &app.upstream,
                &ctx.identity,
                upstream_id,
                &ctx.correlation_id,
                "task_not_allowed",
            );
        }
        Error::UnexpectedTask.message(&app.metrics, &ctx.id())
    }
}

/// Forwards a request that needs no special handling.
pub async fn forward_plain(app: Arc<AppState>, ctx: RequestContext) -> Response {
    let headers = ctx.upstream_headers();
    let body = ctx.body.clone();
    send_and_relay(app, Arc::new(ctx), headers, body, RefuseTasks).await
}

/// Sends `body` upstream and relays the response, passing a task answer to `step`.
pub async fn send_and_relay<S: FinalStep>(
    app: Arc<AppState>,
    ctx: Arc<RequestContext>,
    headers: HeaderMap,
    body: Bytes,
    step: S,
) -> Response {
    let id = ctx.id();
    let response = match app.upstream.send(headers, body).await {
        Ok(r) => r,
        Err(e) => return Error::from(e).respond(&app.metrics, &id),
    };
    match response.body {
        UpstreamBody::Json(bytes) => {
            // Most answers are neither tasks nor input requests: those are passed on byte for
            // byte, without building a JSON tree.
            if peek_result_type(&bytes).is_some_and(|t| !t.needs_inspection()) {
                drop(step); // releases a reservation that did not become a task
                return respond::raw_json(response.status, bytes);
            }
            let Ok(message) = serde_json::from_slice::<Value>(&bytes) else {
                return Error::NotJson.respond(&app.metrics, &id);
            };
            let mut step = step;
            let message = finish_message(&app, &ctx, &mut step, message).await;
            respond::json(response.status, &message)
        }
        UpstreamBody::Sse(stream) => relay_sse(app, ctx, stream, step),
        UpstreamBody::Empty => respond::status(response.status),
        UpstreamBody::Other if ctx.request.is_notification() => respond::status(response.status),
        UpstreamBody::Other => Error::NotJsonRpc.respond(&app.metrics, &id),
    }
}

/// The message to send the client for the server's message: the final answer goes through
/// the gate (input requests) or `step` (tasks); anything else passes.
async fn finish_message<S: FinalStep>(
    app: &AppState,
    ctx: &RequestContext,
    step: &mut S,
    message: Value,
) -> Value {
    match classify_final(&message, &ctx.id()) {
        FinalAnswer::InputRequired => screen_request_inputs(app, ctx, message).await,
        FinalAnswer::Task => step.on_task(app, ctx, message).await,
        FinalAnswer::NotTheResponse | FinalAnswer::Plain => message,
    }
}

/// Relays an SSE response: notifications pass (except kinds that never belong on a request
/// stream), the final response goes through [`finish_message`], server-to-client requests
/// (which MCP 2026-07-28 servers must not send) are dropped. Event ids and retry hints are
/// dropped: stateless MCP has no resumption.
fn relay_sse<S: FinalStep>(
    app: Arc<AppState>,
    ctx: Arc<RequestContext>,
    stream: sse_stream::SseStream<hyper::body::Incoming>,
    step: S,
) -> Response {
    let step = Arc::new(Mutex::new(step));
    let events = stream
        .then(move |event| {
            let app = app.clone();
            let ctx = ctx.clone();
            let step = step.clone();
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
                    app.metrics.anomaly("non_json_event");
                    return None;
                };
                let out = match classify(&message, &ctx.id()) {
                    MessageKind::ResponseToRequest => {
                        let mut step = step.lock().await;
                        finish_message(&app, &ctx, &mut *step, message).await
                    }
                    MessageKind::Notification => {
                        let method = message.get("method").and_then(Value::as_str);
                        if method == Some(methods::NOTIFICATION_TASKS) {
                            // Task state belongs on listen streams, filtered per owner.
                            app.metrics.anomaly("task_notification_on_request_stream");
                            return None;
                        }
                        message
                    }
                    MessageKind::ServerRequest => {
                        app.metrics.anomaly("server_to_client_request");
                        app.audit.log(ctx.audit(
                            "request.anomaly",
                            Decision::Deny,
                            "server_to_client_request",
                        ));
                        return None;
                    }
                    MessageKind::ForeignResponse | MessageKind::Invalid => {
                        app.metrics.anomaly("foreign_message");
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
