//! Listening to tasks homed on other replicas: the part of a subscription about them is itself
//! a `subscriptions/listen`, forwarded over the internal hop to each home replica, which
//! authorizes it, subscribes to its own server and delivers the frames in the sidecar's task
//! IDs, screened as any listen stream there. This replica merges those frames into the
//! listener's stream. No database polling: a remote task's notification arrives as fast as a
//! local one, plus one hop.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use http::header;
use serde_json::json;
use sse_stream::SseStream;

use crate::mcp::listen::{ListenEvent, ListenFilter, classify_event};
use crate::model::TaskId;

use super::super::context::RequestContext;
use super::super::state::AppState;
use super::super::upstream::EventStream;
use super::super::upstream::{BoundedEvents, StreamBounds};

/// How long a home replica may take to acknowledge a forwarded subscription.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// A subscription held at a task's home replica.
pub(super) struct RemoteSubscription {
    /// The task IDs (the sidecar's) the home replica acknowledged.
    pub acknowledged: BTreeSet<String>,
    /// Its frames after the acknowledgement.
    pub frames: EventStream,
}

/// Subscribes at `home` to `ids` on behalf of the listener in `ctx`; `None` when the home does
/// not answer or acknowledge (those tasks are then left out of the acknowledgement, so the
/// listener knows to poll them).
pub(super) async fn subscribe(
    app: &AppState,
    ctx: &RequestContext,
    home: &str,
    ids: &[TaskId],
) -> Option<RemoteSubscription> {
    let hop = app.replica.hop.as_ref()?;
    let mut message = ctx.request.message.clone();
    message["params"]["notifications"] =
        json!({"taskIds": ids.iter().map(TaskId::as_str).collect::<Vec<_>>()});
    let body = Bytes::from(serde_json::to_vec(&message).ok()?);
    let response = match hop
        .send(app.ledger.as_ref(), home, &ctx.headers, body)
        .await
    {
        Ok(response) => response,
        Err(e) => {
            tracing::warn!(error = %e, "subscribing at a task's home replica failed");
            return None;
        }
    };
    let is_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if response.status() != StatusCode::OK || !is_stream {
        tracing::warn!(status = %response.status(), "a home replica refused a forwarded listen");
        return None;
    }
    let mut frames: EventStream = Box::pin(SseStream::new(BoundedEvents::new(
        response.into_body(),
        StreamBounds::LISTEN,
    )));
    let acknowledged = tokio::time::timeout(ACK_TIMEOUT, async {
        while let Some(event) = frames.next().await {
            let data = event.ok()?.data?;
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
    .flatten()?;
    let asked: BTreeSet<&str> = ids.iter().map(TaskId::as_str).collect();
    let acknowledged = acknowledged
        .task_ids
        .into_iter()
        .filter(|id| asked.contains(id.as_str()))
        .collect();
    Some(RemoteSubscription {
        acknowledged,
        frames,
    })
}
