//! `subscriptions/listen`: a long-lived SSE stream of the notifications a client opted in to.
//!
//! The first frame is always `notifications/subscriptions/acknowledged`; every frame carries
//! `_meta["io.modelcontextprotocol/subscriptionId"]` = the listen request's JSON-RPC id, exactly
//! as sent. Progress and log messages never go on this stream.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::AppState;
use crate::rpc::{META_SUBSCRIPTION_ID, RequestContext, RpcError, notification, result_envelope};
use crate::store::{Event, Store};

/// What the client asked for, restricted to what this server honours.
#[derive(Debug, Default)]
struct Filter {
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: Vec<String>,
    task_ids: Option<Vec<String>>,
}

impl Filter {
    fn parse(params: &Value, ctx: &RequestContext) -> Result<Self, RpcError> {
        let n = params
            .get("notifications")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                RpcError::invalid_params("subscriptions/listen requires an object `notifications`")
            })?;
        let flag = |key: &str| match n.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(RpcError::invalid_params(format!(
                "notifications.{key} must be a boolean"
            ))),
        };
        let strings = |key: &str| match n.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .map(Some)
                .ok_or_else(|| {
                    RpcError::invalid_params(format!(
                        "notifications.{key} must be an array of strings"
                    ))
                }),
            Some(_) => Err(RpcError::invalid_params(format!(
                "notifications.{key} must be an array of strings"
            ))),
        };
        let filter = Filter {
            tools: flag("toolsListChanged")?,
            prompts: flag("promptsListChanged")?,
            resources: flag("resourcesListChanged")?,
            uris: strings("resourceSubscriptions")?.unwrap_or_default(),
            task_ids: strings("taskIds")?,
        };
        if filter.task_ids.is_some() && !ctx.tasks_ext {
            return Err(RpcError::tasks_extension_required());
        }
        Ok(filter)
    }

    /// The acknowledged subset. Unknown task IDs are acknowledged too: whether a task exists is
    /// not revealed here.
    fn ack(&self, raw: Option<&Map<String, Value>>) -> Value {
        let mut out = Map::new();
        let mut flag = |key: &str, on: bool| {
            if on {
                out.insert(key.into(), json!(true));
            }
        };
        flag("toolsListChanged", self.tools);
        flag("promptsListChanged", self.prompts);
        flag("resourcesListChanged", self.resources);
        if raw.is_some_and(|r| r.contains_key("resourceSubscriptions")) {
            out.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        if let Some(ids) = &self.task_ids {
            out.insert("taskIds".into(), json!(ids));
        }
        Value::Object(out)
    }
}

/// Counts open listen streams (for `/_example/listeners`); decremented on drop, i.e. when the
/// client disconnects or the stream ends.
pub struct ListenerGuard(Arc<AtomicUsize>);

impl ListenerGuard {
    pub fn new(counter: Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for ListenerGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Listener {
    id: Value,
    filter: Filter,
    task_set: HashSet<String>,
    uri_set: HashSet<String>,
    rx: broadcast::Receiver<Event>,
    store: Arc<Store>,
    deadline: Option<Instant>,
    shutdown: watch::Receiver<bool>,
    pending: VecDeque<Value>,
    done: bool,
    /// Ends the stream when a `notifications/cancelled` names the listen request.
    cancelled: crate::cancels::Registered,
    _guard: ListenerGuard,
}

impl Listener {
    fn meta(&self) -> Value {
        json!({META_SUBSCRIPTION_ID: self.id})
    }

    fn with_meta(&self, method: &str, mut params: Value) -> Value {
        params["_meta"] = self.meta();
        notification(method, params)
    }

    /// The frame for an event, when this subscriber asked for it.
    fn frame_for(&self, event: Event) -> Option<Value> {
        match event {
            Event::Task { task_id, state } if self.task_set.contains(&task_id) => {
                Some(self.with_meta("notifications/tasks", state))
            }
            Event::ToolsListChanged if self.filter.tools => {
                Some(self.with_meta("notifications/tools/list_changed", json!({})))
            }
            Event::PromptsListChanged if self.filter.prompts => {
                Some(self.with_meta("notifications/prompts/list_changed", json!({})))
            }
            Event::ResourcesListChanged if self.filter.resources => {
                Some(self.with_meta("notifications/resources/list_changed", json!({})))
            }
            Event::ResourceUpdated { uri } if self.uri_set.contains(&uri) => {
                Some(self.with_meta("notifications/resources/updated", json!({"uri": uri})))
            }
            _ => None,
        }
    }

    /// After falling behind, re-send the current state of every subscribed task that exists so
    /// the subscriber still converges on the latest state.
    fn resync(&mut self) {
        for id in self.filter.task_ids.iter().flatten() {
            if let Some(state) = self.store.get(id) {
                let frame = self.with_meta("notifications/tasks", state);
                self.pending.push_back(frame);
            }
        }
    }

    /// The graceful end: a `subscriptions/listen` result carrying the subscription id.
    fn closing_frame(&mut self) -> Value {
        self.done = true;
        result_envelope(
            &self.id,
            json!({"resultType": "complete", "_meta": self.meta()}),
        )
    }

    async fn next_frame(&mut self) -> Option<Value> {
        if let Some(frame) = self.pending.pop_front() {
            return Some(frame);
        }
        if self.done {
            return None;
        }
        loop {
            if *self.shutdown.borrow() {
                return Some(self.closing_frame());
            }
            let deadline = self.deadline;
            let until_deadline = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let cancelled = self.cancelled.token.clone();
            tokio::select! {
                () = cancelled.cancelled() => {
                    self.done = true;
                    return None;
                }
                received = self.rx.recv() => match received {
                    Ok(event) => {
                        if let Some(frame) = self.frame_for(event) {
                            return Some(frame);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "listen stream lagged; resyncing task states");
                        self.resync();
                        if let Some(frame) = self.pending.pop_front() {
                            return Some(frame);
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                () = until_deadline => return Some(self.closing_frame()),
                changed = self.shutdown.changed() => {
                    if changed.is_err() || *self.shutdown.borrow() {
                        return Some(self.closing_frame());
                    }
                }
            }
        }
    }
}

fn sse_event(frame: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event("message").data(frame.to_string()))
}

/// Validates the filter (errors are plain JSON-RPC errors, before any stream starts), then
/// answers with the SSE stream.
pub fn listen(
    state: &AppState,
    id: &Value,
    params: &Value,
    ctx: &RequestContext,
) -> Result<Response, RpcError> {
    let filter = Filter::parse(params, ctx)?;
    // Subscribe before acknowledging so that nothing after the ack can be missed.
    let rx = state.store.subscribe();
    let mut listener = Listener {
        id: id.clone(),
        task_set: filter.task_ids.iter().flatten().cloned().collect(),
        uri_set: filter.uris.iter().cloned().collect(),
        filter,
        rx,
        store: state.store.clone(),
        deadline: state.max_listen.map(|d| Instant::now() + d),
        shutdown: state.shutdown.clone(),
        pending: VecDeque::new(),
        done: false,
        cancelled: state.cancels.register(id),
        _guard: ListenerGuard::new(state.listeners.clone()),
    };
    let ack = listener
        .filter
        .ack(params.get("notifications").and_then(Value::as_object));
    let ack_frame = listener.with_meta(
        "notifications/subscriptions/acknowledged",
        json!({"notifications": ack}),
    );
    listener.pending.push_back(ack_frame);
    let frames = stream::unfold(listener, |mut l| async move {
        let frame = l.next_frame().await?;
        Some((sse_event(&frame), l))
    });
    Ok(Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
