//! `subscriptions/listen`: each stream is authorized on its own, bound to the caller's identity
//! and the request id, filtered to what the policy allows and the caller owns, and re-checked on
//! every event.

mod remote;
mod stream;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use http::header::{self, HeaderValue};
use serde_json::{Value, json};
use sse_stream::{Sse, SseBody};
use tokio::sync::mpsc;

use crate::audit::Decision;
use crate::mcp::jsonrpc::ErrorObject;
use crate::mcp::listen::{
    FilterError, ListenEvent, ListenFilter, acknowledgement, classify_event, final_result, listener,
};
use crate::mcp::refusal::{Refusal, Remediation};
use crate::mcp::{TASKS_EXTENSION, codes, methods};
use crate::model::TaskId;

use super::context::{Arrival, RequestContext};
use super::decisions::{Operation, authorize, holds_scopes};
use super::error::Error;
use super::forward::set_mcp_headers;
use super::object_access::object_verdict;
use super::objects::Action;
use super::respond;
use super::state::AppState;
use super::task_state::now_ms;
use super::upstream::{EventStream, UpstreamBody};

/// Frames buffered per stream before the listener counts as a slow consumer and is cut off:
/// memory per stream stays bounded whatever the server emits.
pub const STREAM_BUFFER: usize = 16;
/// How long the server may take to acknowledge a listen request.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Refuses a listen request, audited as `listen.denied` with `reason`, which is also the
/// refusal's `data.reason` (with `remediation`, and the policy).
fn deny(
    ctx: &RequestContext,
    app: &AppState,
    status: StatusCode,
    error: ErrorObject,
    reason: &'static str,
    remediation: Remediation,
) -> Response {
    app.audit
        .log(ctx.audit("listen.denied", Decision::Deny, reason));
    let refusal = Refusal::new(reason, remediation).policy(&ctx.policy.name);
    respond::refuse(status, &ctx.id(), error, &refusal)
}

/// The suggested wait before opening a stream again once the caller holds its maximum: the
/// slot frees when one of its streams ends, which no clock predicts, so this is a suggestion
/// (one poll interval, at least a second).
fn stream_retry_after_ms(ctx: &RequestContext) -> u64 {
    u64::try_from(ctx.policy.min_poll_ms())
        .unwrap_or(0)
        .max(respond::RETRY_SHORTLY_MS)
}

/// A response streaming `frames`: the listener's side of the stream.
fn sse_response(rx: mpsc::Receiver<Value>) -> Response {
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| {
            (
                Ok::<_, Infallible>(Sse::default().event("message").data(frame.to_string())),
                rx,
            )
        })
    });
    respond::event_stream(Body::new(SseBody::new(events)))
}

/// Handles `subscriptions/listen`.
pub async fn listen(app: Arc<AppState>, ctx: RequestContext) -> Response {
    let Some(rules) = ctx.policy.effective.listen.clone() else {
        return deny(
            &ctx,
            &app,
            StatusCode::NOT_FOUND,
            ErrorObject::new(
                codes::METHOD_NOT_FOUND,
                "subscriptions/listen is not enabled for this server",
            ),
            "not_enabled",
            Remediation::None,
        );
    };
    let asked = match ListenFilter::parse_request(
        ctx.request.params().and_then(|p| p.get("notifications")),
        ctx.facts.declares_tasks,
    ) {
        Ok(f) => f,
        Err(FilterError::TaskIdsWithoutExtension) => {
            return deny(
                &ctx,
                &app,
                StatusCode::BAD_REQUEST,
                ErrorObject::new(
                    codes::MISSING_CAPABILITY,
                    FilterError::TaskIdsWithoutExtension.to_string(),
                )
                .with_data(json!({"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})),
                "missing_tasks_capability",
                Remediation::None,
            );
        }
        Err(e) => {
            return deny(
                &ctx,
                &app,
                StatusCode::BAD_REQUEST,
                ErrorObject::new(codes::INVALID_PARAMS, format!("Invalid params: {e}")),
                "invalid_filter",
                Remediation::None,
            );
        }
    };
    let mut allowed = asked.allowed_by(&rules, &listener(&ctx.identity.owner));

    // Task IDs: only tasks this caller owns, in the server's IDs. Foreign and unknown IDs are
    // dropped alike, so the acknowledgement cannot tell them apart.
    // Tasks whose tool needs scopes this token lacks are dropped the same way.
    let mut to_sidecar: HashMap<String, TaskId> = HashMap::new();
    let mut task_tools = Vec::new();
    // Unfinished tasks homed on other replicas (per-replica server state): subscribed there.
    let mut remote: BTreeMap<String, Vec<TaskId>> = BTreeMap::new();
    let now = now_ms();
    let tasks_rules = ctx.policy.effective.tasks.as_ref();
    for id in std::mem::take(&mut allowed.task_ids) {
        let id = TaskId::from_string(id);
        let record = app.ledger.get(&id).await.ok().flatten();
        if authorize(record.as_ref(), &ctx.identity, Operation::Read, None, now).is_ok()
            && let Some(record) = record
            && holds_scopes(tasks_rules, &ctx.identity, &record.tool)
            && object_verdict(&app, &ctx, &record, Action::Listen)
                .await
                .allowed()
        {
            // Subscribing with a valid token is a request about the task: its identity lease
            // (and delegation) move forward as for a poll.
            super::delegate::renew(&app, &ctx, &record).await;
            if let Some(home) = app.replica.remote_home(&ctx.policy, &record) {
                if ctx.arrival == Arrival::Client && !record.status.is_terminal() {
                    remote
                        .entry(home.to_owned())
                        .or_default()
                        .push(record.id.clone());
                    task_tools.push(record.tool);
                }
                continue;
            }
            allowed.task_ids.insert(record.upstream_id.clone());
            task_tools.push(record.tool);
            to_sidecar.insert(record.upstream_id, id);
        }
    }

    let Some(slot) = app.streams.open(
        &ctx.identity.owner,
        ctx.identity.issued_at,
        rules.max_streams_per_principal,
    ) else {
        return deny(
            &ctx,
            &app,
            StatusCode::TOO_MANY_REQUESTS,
            ErrorObject::new(codes::QUOTA_EXCEEDED, "Too many open listen streams")
                .with_data(json!({"scope": "streams"})),
            "stream_quota",
            Remediation::Retry {
                after_ms: stream_retry_after_ms(&ctx),
            },
        );
    };

    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let subscription_id = ctx.id();
    if allowed.is_empty() && remote.is_empty() {
        // Nothing the caller may receive: acknowledge the empty subscription and end.
        let _ = tx.try_send(acknowledgement(&ListenFilter::default(), &subscription_id));
        let _ = tx.try_send(final_result(&subscription_id));
        app.audit
            .log(ctx.audit("listen.closed", Decision::Allow, "nothing_to_deliver"));
        drop(slot);
        return sse_response(rx);
    }

    let (events, upstream_filter) = if allowed.is_empty() {
        // Only tasks homed elsewhere: this replica's server is not asked.
        (None, ListenFilter::default())
    } else {
        match subscribe_upstream(&app, &ctx, &allowed, &subscription_id).await {
            Ok(subscribed) => subscribed,
            Err(response) => return response,
        }
    };
    let mut client_filter =
        upstream_filter.map_task_ids(|u| to_sidecar.get(u).map(|id| id.as_str().to_owned()));
    let mut remote_frames = Vec::new();
    let mut remote_ids = std::collections::BTreeSet::new();
    for (home, ids) in &remote {
        if let Some(subscription) = remote::subscribe(&app, &ctx, home, ids).await {
            client_filter
                .task_ids
                .extend(subscription.acknowledged.iter().cloned());
            remote_ids.extend(subscription.acknowledged);
            remote_frames.push(subscription.frames);
        }
    }
    let _ = tx.try_send(acknowledgement(&client_filter, &subscription_id));
    app.audit.log(
        ctx.audit("listen.opened", Decision::Allow, "accepted")
            .detail("toolsListChanged", client_filter.tools_list_changed)
            .detail("promptsListChanged", client_filter.prompts_list_changed)
            .detail("resourcesListChanged", client_filter.resources_list_changed)
            .detail(
                "resourceSubscriptions",
                json!(client_filter.resource_subscriptions),
            )
            .detail("tasks", client_filter.task_ids.len())
            .detail(
                "dropped",
                asked.entries().saturating_sub(client_filter.entries()),
            ),
    );

    // The stream may stay open for hours: it keeps what its events need, not the request's
    // body (whose bytes would pin the connection's whole first read buffer) nor its parsed
    // message.
    let mut ctx = ctx;
    ctx.body = Bytes::new();
    ctx.request.message = Value::Null;
    let pump = stream::Pump {
        app: app.clone(),
        ctx: Arc::new(ctx),
        slot,
        tx,
        events,
        upstream_filter,
        client_filter,
        remote: futures_util::stream::select_all(remote_frames),
        remote_ids,
        to_sidecar,
        task_tools,
        max_duration: rules.max_stream_duration.get(),
        trace: crate::telemetry::task_spans::current_traceparent(),
    };
    tokio::spawn(pump.run());
    sse_response(rx)
}

/// Subscribes at this replica's server to what `allowed` names (in the server's task IDs):
/// its events, and what it acknowledged of the filter. An error is the answer to give.
async fn subscribe_upstream(
    app: &AppState,
    ctx: &RequestContext,
    allowed: &ListenFilter,
    subscription_id: &Value,
) -> Result<(Option<EventStream>, ListenFilter), Response> {
    let mut message = ctx.request.message.clone();
    message["params"]["notifications"] = allowed.to_wire();
    let mut headers = ctx.upstream_headers();
    super::delegate::attach(app, ctx, &mut headers, None, None);
    set_mcp_headers(&mut headers, methods::LISTEN, None);
    headers.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    let body = Bytes::from(serde_json::to_vec(&message).unwrap_or_default());
    let upstream = match app.upstream.send_listen(headers, body).await {
        Ok(r) => r,
        Err(e) => return Err(Error::from(e).respond(&app.metrics, subscription_id)),
    };
    let mut events = match upstream.body {
        UpstreamBody::Sse(events) => events,
        UpstreamBody::Json(bytes) => {
            // The server refused the listen request: pass its error on.
            return Err(respond::raw_json(upstream.status, bytes));
        }
        _ => return Err(Error::NoStream.respond(&app.metrics, subscription_id)),
    };

    // The server's acknowledgement must come first; nothing is forwarded before it.
    let acked = tokio::time::timeout(ACK_TIMEOUT, async {
        while let Some(event) = events.next().await {
            let Ok(event) = event else { return None };
            let Some(data) = event.data else { continue };
            let Ok(frame) = crate::mcp::strict_json::from_str(&data) else {
                continue;
            };
            if classify_event(&frame) == ListenEvent::Acknowledged {
                return Some(ListenFilter::parse_ack(
                    frame.pointer("/params/notifications"),
                ));
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    let Some(upstream_ack) = acked else {
        return Err(Error::NoAcknowledgement.respond(&app.metrics, subscription_id));
    };
    Ok((Some(events), allowed.intersect(&upstream_ack)))
}
