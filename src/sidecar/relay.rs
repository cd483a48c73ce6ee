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
use crate::mcp::strict_json::{self, StrictJsonError};
use crate::mcp::task::peek_response;

use super::capability_screen::screen_request_inputs;
use super::context::RequestContext;
use super::decisions::{FinalAnswer, JsonAnswer, classify_final, judge_json_answer};
use super::error::Error;
use super::logging_gate::{count_dropped_message, logging_allowed};
use super::minimize;
use super::respond;
use super::server_tasks::cancel_orphan;
use super::state::AppState;
use super::upstream::broke_bound;
use super::upstream::{EventStream, UpstreamBody};

/// What becomes of a final answer that says the request became a task. Dropping the step
/// without calling it means the request did not become a task.
#[async_trait]
pub trait FinalStep: Send + 'static {
    /// Returns the message to send the client instead of `message` (a `resultType: task`
    /// response to this request), or the failure to answer with (the whole response when the
    /// answer was JSON, an error in its place when it was streamed).
    async fn on_task(
        &mut self,
        app: &AppState,
        ctx: &RequestContext,
        message: Value,
    ) -> Result<Value, Error>;
}

/// The final step of every request that may not create a task: a task result is refused.
pub struct RefuseTasks;

#[async_trait]
impl FinalStep for RefuseTasks {
    /// The client gets an error, the server is asked to cancel the task, and the event is
    /// audited.
    async fn on_task(
        &mut self,
        app: &AppState,
        ctx: &RequestContext,
        message: Value,
    ) -> Result<Value, Error> {
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
        Ok(Error::UnexpectedTask.message(&app.metrics, &ctx.id()))
    }
}

/// Forwards a request that needs no special handling.
pub async fn forward_plain(app: Arc<AppState>, ctx: RequestContext) -> Response {
    let mut headers = ctx.upstream_headers();
    super::delegate::attach(&app, &ctx, &mut headers, None, None);
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
        UpstreamBody::Json(_) if ctx.request.is_notification() => {
            // A notification has no response: only the status is passed on.
            respond::status(response.status)
        }
        UpstreamBody::Json(bytes) => {
            // Most answers are the plain response to this request: those are passed on byte
            // for byte, without building a JSON tree.
            match judge_json_answer(peek_response(&bytes).as_ref(), &id) {
                JsonAnswer::PassRaw if !minimize::rewrites_answer(&ctx) => {
                    drop(step); // releases a reservation that did not become a task
                    return respond::raw_json(response.status, bytes);
                }
                JsonAnswer::Refuse => return refuse_mismatch(&app, &ctx),
                JsonAnswer::PassRaw | JsonAnswer::Inspect => {}
            }
            let message = match strict_json::from_slice(&bytes) {
                Ok(message) => message,
                Err(StrictJsonError::DuplicateKey(_)) => {
                    app.metrics.anomaly("duplicate_key");
                    return refuse_mismatch(&app, &ctx);
                }
                Err(StrictJsonError::Syntax(_)) => {
                    return Error::NotJson.respond(&app.metrics, &id);
                }
            };
            if classify_final(&message, &id) == FinalAnswer::NotTheResponse {
                return refuse_mismatch(&app, &ctx);
            }
            let mut step = step;
            match finish_message(&app, &ctx, &mut step, message).await {
                Ok(message) => respond::json(response.status, &message),
                Err(e) => e.respond(&app.metrics, &id),
            }
        }
        UpstreamBody::Sse(stream) => relay_sse(app, ctx, stream, step),
        UpstreamBody::Empty => respond::status(response.status),
        UpstreamBody::Other if ctx.request.is_notification() => respond::status(response.status),
        UpstreamBody::Other => Error::NotJsonRpc.respond(&app.metrics, &id),
    }
}

/// Refuses a JSON answer that is not exactly the response to this request: nothing of it
/// reaches the client (not its input requests, not a task it names).
fn refuse_mismatch(app: &AppState, ctx: &RequestContext) -> Response {
    app.metrics.anomaly("response_mismatch");
    app.audit
        .log(ctx.audit("request.anomaly", Decision::Deny, "response_mismatch"));
    Error::ResponseMismatch.respond(&app.metrics, &ctx.id())
}

/// The message to send the client for the server's message: the final answer goes through
/// the gate (input requests) or `step` (tasks); anything else passes.
async fn finish_message<S: FinalStep>(
    app: &AppState,
    ctx: &RequestContext,
    step: &mut S,
    message: Value,
) -> Result<Value, Error> {
    // `tasks.results` masks a new task's state before the ledger records it, input requests
    // after they passed the gate.
    Ok(match classify_final(&message, &ctx.id()) {
        FinalAnswer::InputRequired => {
            minimize::call_answer(ctx, screen_request_inputs(app, ctx, message).await)
        }
        FinalAnswer::Task => {
            step.on_task(app, ctx, minimize::call_answer(ctx, message))
                .await?
        }
        FinalAnswer::NotTheResponse | FinalAnswer::Plain => minimize::call_answer(ctx, message),
    })
}

/// Notifications that belong to one request and may travel on its response stream. Everything
/// else a server may emit (`notifications/tasks`, `*/list_changed`, `resources/updated`,
/// subscription acknowledgements) is listen-only: on a request stream it would bypass every
/// listen filter.
const PER_REQUEST_NOTIFICATIONS: &[&str] = &[
    methods::NOTIFICATION_PROGRESS,
    methods::NOTIFICATION_MESSAGE,
];

/// Relays an SSE response: per-request notifications pass, the final response goes through [`finish_message`], server-to-client requests
/// (which MCP 2026-07-28 servers must not send) are dropped. Event ids and retry hints are
/// dropped: stateless MCP has no resumption.
fn relay_sse<S: FinalStep>(
    app: Arc<AppState>,
    ctx: Arc<RequestContext>,
    stream: EventStream,
    step: S,
) -> Response {
    let step = Arc::new(Mutex::new(step));
    let events = stream
        .then(move |event| {
            let app = app.clone();
            let ctx = ctx.clone();
            let step = step.clone();
            async move { relay_event(&app, &ctx, &step, event).await }
        })
        // A step that ends the stream is the last one delivered.
        .scan(false, |ended, step| {
            if *ended {
                return std::future::ready(None);
            }
            std::future::ready(Some(match step {
                Relayed::Event(sse) => Some(Ok::<_, Infallible>(sse)),
                Relayed::Last(sse) => {
                    *ended = true;
                    Some(Ok(sse))
                }
                Relayed::Nothing => None,
            }))
        })
        .filter_map(std::future::ready);
    respond::event_stream(Body::new(SseBody::new(events)))
}

/// What one upstream event becomes on the client's stream.
enum Relayed {
    Event(Sse),
    /// The stream ends after this event.
    Last(Sse),
    Nothing,
}

async fn relay_event<S: FinalStep>(
    app: &AppState,
    ctx: &RequestContext,
    step: &Mutex<S>,
    event: Result<Sse, sse_stream::Error>,
) -> Relayed {
    let event = match event {
        Ok(e) => e,
        Err(e) if broke_bound(&e) => {
            // The server sent more than a request's answer may be: the client gets an error
            // in place of the answer, and the stream ends.
            app.metrics.anomaly("upstream_stream_too_large");
            app.audit.log(ctx.audit(
                "request.anomaly",
                Decision::Deny,
                "upstream_stream_too_large",
            ));
            let error = Error::StreamTooLarge.message(&app.metrics, &ctx.id());
            return Relayed::Last(Sse::default().event("message").data(error.to_string()));
        }
        Err(e) => {
            tracing::warn!(error = %e, "malformed event from the MCP server");
            return Relayed::Nothing;
        }
    };
    let Some(data) = event.data else {
        return Relayed::Nothing;
    };
    let Ok(message) = crate::mcp::strict_json::from_str(&data) else {
        app.metrics.anomaly("non_json_event");
        return Relayed::Nothing;
    };
    let out = match classify(&message, &ctx.id()) {
        MessageKind::ResponseToRequest => {
            let mut step = step.lock().await;
            match finish_message(app, ctx, &mut *step, message).await {
                Ok(message) => message,
                Err(e) => e.message(&app.metrics, &ctx.id()),
            }
        }
        MessageKind::Notification => {
            let method = message.get("method").and_then(Value::as_str);
            if !method.is_some_and(|m| PER_REQUEST_NOTIFICATIONS.contains(&m)) {
                // Task state and change notifications belong on listen streams, filtered per
                // owner and subscription.
                app.metrics
                    .anomaly(if method == Some(methods::NOTIFICATION_TASKS) {
                        "task_notification_on_request_stream"
                    } else {
                        "listen_notification_on_request_stream"
                    });
                return Relayed::Nothing;
            }
            if method == Some(methods::NOTIFICATION_MESSAGE)
                && let Err(reason) = logging_allowed(&ctx.policy, &ctx.identity.owner)
            {
                count_dropped_message(app, reason);
                return Relayed::Nothing;
            }
            let mut message = message;
            minimize::call_notification(ctx, &mut message);
            message
        }
        MessageKind::ServerRequest => {
            app.metrics.anomaly("server_to_client_request");
            app.audit.log(ctx.audit(
                "request.anomaly",
                Decision::Deny,
                "server_to_client_request",
            ));
            return Relayed::Nothing;
        }
        MessageKind::ForeignResponse | MessageKind::Invalid => {
            app.metrics.anomaly("foreign_message");
            return Relayed::Nothing;
        }
    };
    let mut sse = Sse::default().data(out.to_string());
    sse.event = event.event;
    Relayed::Event(sse)
}
