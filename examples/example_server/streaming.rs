//! `tools/call` answered as an SSE stream scoped to the request: `notifications/progress` frames
//! carrying the request's progressToken, then the JSON-RPC response as the last frame.
//!
//! Used when the request's `Accept` includes `text/event-stream` and `_meta.progressToken` is
//! set. Closing the stream cancels a synchronous run (the job is aborted).

use std::convert::Infallible;
use std::pin::pin;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::AppState;
use crate::jobs::{self, JobCtx, Progress};
use crate::mcp::rpc_error_from;
use crate::rpc::{RpcError, error_envelope, notification, result_envelope};
use crate::store::Outcome;
use crate::tools::ToolCall;

/// Aborts the producer when the response stream is dropped (client went away).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn progress_frame(token: &Value, progress: u64, total: Option<u64>, message: &str) -> Value {
    let mut params = json!({"progressToken": token, "progress": progress, "message": message});
    if let Some(total) = total {
        params["total"] = json!(total);
    }
    notification("notifications/progress", params)
}

pub fn tools_call_sse(
    state: &AppState,
    id: Value,
    call: ToolCall,
    as_task: bool,
    token: Value,
) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    let store = state.store.clone();
    // Once a client set a log level, synchronous runs also log (the deprecated logging
    // surface, for intermediaries' tests).
    let logging = state
        .log_level
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let producer = tokio::spawn(async move {
        // Sending fails only when the client is gone; the producer is then aborted anyway.
        let send = |frame: Value| {
            let _ = tx.send(frame);
        };
        if as_task {
            send(progress_frame(&token, 1, Some(3), "accepted"));
            tokio::time::sleep(Duration::from_millis(20)).await;
            send(progress_frame(&token, 2, Some(3), "arguments validated"));
            tokio::time::sleep(Duration::from_millis(20)).await;
            // Create and start the task without an await in between, so an abort cannot leave
            // a created task without its job.
            let (task_id, created, wake) = store.create();
            jobs::spawn_task(store.clone(), task_id, wake, call);
            send(progress_frame(&token, 3, Some(3), "task created"));
            send(result_envelope(&id, created));
            return;
        }
        send(progress_frame(&token, 0, None, "started"));
        if let Some(level) = &logging {
            send(notification(
                "notifications/message",
                json!({"level": level, "logger": "example_server", "data": "run started"}),
            ));
        }
        let (ptx, mut prx) = mpsc::unbounded_channel::<Progress>();
        let ctx = JobCtx {
            store,
            task: None,
            progress: Some(ptx),
        };
        let mut job = pin!(jobs::run(&call, &ctx));
        let outcome = loop {
            tokio::select! {
                outcome = &mut job => break outcome,
                Some((n, total, message)) = prx.recv() => {
                    send(progress_frame(&token, n, total, &message));
                }
            }
        };
        while let Ok((n, total, message)) = prx.try_recv() {
            send(progress_frame(&token, n, total, &message));
        }
        let last = match outcome {
            Outcome::Done(result) => result_envelope(&id, result),
            Outcome::Failed(error) => error_envelope(&id, &rpc_error_from(&error)),
            Outcome::Cancelled => error_envelope(&id, &RpcError::new(-32603, "Cancelled")),
        };
        send(last);
    });
    let frames = stream::unfold((rx, AbortOnDrop(producer)), |(mut rx, guard)| async move {
        let frame = rx.recv().await?;
        let event: Result<SseEvent, Infallible> =
            Ok(SseEvent::default().event("message").data(frame.to_string()));
        Some((event, (rx, guard)))
    });
    Sse::new(frames).into_response()
}
