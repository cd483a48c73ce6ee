//! One open listen stream: reads the server's events, re-checks each one against the
//! subscription, the policy in force and the ledger, and delivers it to the listener, until
//! something ends the stream.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::SelectAll;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use crate::audit::Decision;
use crate::ledger::TaskRecord;
use crate::mcp::listen::{ListenEvent, ListenFilter, classify_event, final_result, listener, tag};
use crate::mcp::task::{parse_reported_state, present_task, replace_task_id};
use crate::model::TaskId;
use crate::telemetry::metrics::ReasonLabels;
use crate::telemetry::task_spans;

use super::super::capability_screen::{Recipient, Screening, screen_task_state};
use super::super::context::RequestContext;
use super::super::decisions::{Operation, Report, authorize, holds_scopes, task_view};
use super::super::minimize;
use super::super::objects::Action;
use super::super::state::AppState;
use super::super::stream_registry::{CloseReason, StreamSlot};
use super::super::task_state::{end_for_server_report, now_ms, settle_terminal};
use super::super::upstream::EventStream;
use super::super::upstream::broke_bound;

pub(super) struct Pump {
    pub app: Arc<AppState>,
    pub ctx: Arc<RequestContext>,
    pub slot: StreamSlot,
    pub tx: mpsc::Sender<Value>,
    /// The server's events; `None` when only tasks homed elsewhere were subscribed.
    pub events: Option<EventStream>,
    /// Frames from the home replicas of subscribed tasks homed elsewhere (already in the
    /// sidecar's task IDs and screened there).
    pub remote: SelectAll<EventStream>,
    /// The subscribed tasks homed elsewhere (sidecar IDs).
    pub remote_ids: BTreeSet<String>,
    /// What the server was asked for and acknowledged, in its task IDs.
    pub upstream_filter: ListenFilter,
    /// What the listener was acknowledged, in the sidecar's task IDs.
    pub client_filter: ListenFilter,
    /// Server task ID → sidecar task ID, for the subscribed tasks.
    pub to_sidecar: HashMap<String, TaskId>,
    /// The tools of the subscribed tasks: a policy change that requires scopes the listener's
    /// token lacks for any of them closes the stream.
    pub task_tools: Vec<String>,
    pub max_duration: Duration,
    /// The listen request's span (`traceparent`), when traces are exported: each delivery
    /// about a task is its child, linked to the span that created the task.
    pub trace: Option<String>,
}

enum Step {
    Continue,
    /// A server event to check before it is delivered.
    Filter(Value),
    Close(CloseReason),
}

impl Pump {
    pub async fn run(mut self) {
        let started = Instant::now();
        let end_by_duration = started + self.max_duration;
        let token_left = (self.ctx.identity.expires_at - jiff::Timestamp::now().as_second()).max(0);
        let end_by_token = started + Duration::from_secs(token_left as u64);
        // One timer for whichever ends the stream first (the token wins a tie).
        let (deadline_at, deadline_reason) = if end_by_token <= end_by_duration {
            (end_by_token, CloseReason::TokenExpired)
        } else {
            (end_by_duration, CloseReason::MaxDuration)
        };
        let deadline = tokio::time::sleep_until(deadline_at);
        tokio::pin!(deadline);
        let mut policy = self.app.policy.clone();
        policy.borrow_and_update();
        let mut delivered = 0u64;
        let mut dropped = 0u64;
        let reason = loop {
            let step = tokio::select! {
                _ = self.app.shutdown.cancelled() => Step::Close(CloseReason::Shutdown),
                changed = self.slot.close.changed() => match (changed, *self.slot.close.borrow()) {
                    (Ok(()), Some(reason)) => Step::Close(reason),
                    _ => Step::Continue,
                },
                _ = &mut deadline => Step::Close(deadline_reason),
                changed = policy.changed() => {
                    let still = changed.is_ok() && policy.borrow_and_update().as_ref().is_some_and(|p| {
                        p.effective.listen.as_ref().is_some_and(|rules| self.client_filter.survives(rules, &listener(&self.ctx.identity.owner)))
                            && self.task_tools.iter().all(|tool| {
                                holds_scopes(p.effective.tasks.as_ref(), &self.ctx.identity, tool)
                            })
                    });
                    if still { Step::Continue } else { Step::Close(CloseReason::PolicyChanged) }
                }
                _ = self.tx.closed() => Step::Close(CloseReason::ClientClosed),
                Some(event) = self.remote.next() => {
                    match event.ok().and_then(|e| e.data).and_then(|d| crate::mcp::strict_json::from_str(&d).ok()) {
                        Some(frame) => match self.remote_frame(frame) {
                            Some(frame) => match self.tx.try_send(frame) {
                                Ok(()) => { delivered += 1; Step::Continue }
                                Err(mpsc::error::TrySendError::Full(_)) => Step::Close(CloseReason::SlowConsumer),
                                Err(mpsc::error::TrySendError::Closed(_)) => Step::Close(CloseReason::ClientClosed),
                            },
                            None => { dropped += 1; Step::Continue }
                        },
                        None => { dropped += 1; Step::Continue }
                    }
                }
                _ = std::future::ready(()), if self.events.is_none() && self.remote.is_empty() => {
                    Step::Close(CloseReason::UpstreamEnded)
                }
                event = next_event(&mut self.events) => match event {
                    Some(Ok(event)) => match event.data.and_then(|d| crate::mcp::strict_json::from_str(&d).ok()) {
                        Some(frame) => Step::Filter(frame),
                        None => { dropped += 1; Step::Continue }
                    },
                    Some(Err(e)) if broke_bound(&e) => {
                        self.app.metrics.anomaly("upstream_event_too_large");
                        Step::Close(CloseReason::UpstreamTooLarge)
                    }
                    Some(Err(_)) | None => Step::Close(CloseReason::UpstreamEnded),
                },
            };
            let step = match step {
                // Filtering awaits the ledger and the authorizer: boxed, so the stream's task
                // does not carry that future's state for hours while it waits for events.
                Step::Filter(frame) => match Box::pin(self.filter(frame)).await {
                    Some(frame) => match self.tx.try_send(frame) {
                        Ok(()) => {
                            delivered += 1;
                            Step::Continue
                        }
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            Step::Close(CloseReason::SlowConsumer)
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            Step::Close(CloseReason::ClientClosed)
                        }
                    },
                    None => {
                        dropped += 1;
                        Step::Continue
                    }
                },
                other => other,
            };
            if let Step::Close(reason) = step {
                break reason;
            }
        };
        if reason.graceful() {
            let _ = self.tx.try_send(final_result(&self.ctx.id()));
        }
        self.app
            .metrics
            .listen_closed
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
        self.app.audit.log(
            self.ctx
                .audit("listen.closed", Decision::Record, reason.as_str())
                .detail("delivered", delivered)
                .detail("dropped", dropped)
                .detail("openMs", started.elapsed().as_millis() as u64),
        );
    }

    /// The frame to deliver for a home replica's frame about a task homed there, or `None` to
    /// drop it. The home replica authorized, screened and translated it; here it is only
    /// checked to be about a subscribed task and tagged with this subscription.
    fn remote_frame(&self, mut frame: Value) -> Option<Value> {
        match classify_event(&frame) {
            ListenEvent::Task(id) if self.remote_ids.contains(&id) => {
                tag(&mut frame, &self.ctx.id());
                Some(frame)
            }
            _ => None,
        }
    }

    /// The frame to deliver for a server event, or `None` to drop it.
    async fn filter(&self, frame: Value) -> Option<Value> {
        let event = classify_event(&frame);
        if !self.upstream_filter.admits(&event) {
            return None;
        }
        let mut frame = match event {
            ListenEvent::Task(upstream_id) => self.task_frame(&upstream_id, frame).await?,
            // Only notification kinds the subscription admits get here; the policy in force is
            // re-checked by the policy watcher, which ends the stream when it withdraws them.
            _ => frame,
        };
        tag(&mut frame, &self.ctx.id());
        Some(frame)
    }

    /// A `notifications/tasks` frame, re-checked against the ledger and the policy in force:
    /// the task must still exist, belong to the listener, and the listener's token must still
    /// hold the scopes its tool requires; its IDs are the sidecar's; a terminal state is the
    /// ledger's. Streams never carry a task's result or error: those are read with `tasks/get`,
    /// where read-once results and the result audit apply.
    async fn task_frame(&self, upstream_id: &str, frame: Value) -> Option<Value> {
        let id = self.to_sidecar.get(upstream_id)?;
        let record = self.app.ledger.get(id).await.ok().flatten()?;
        let method = frame
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or("notification");
        let span = task_spans::delivery(self.trace.as_deref(), method, record.trace.as_deref());
        let screened = self
            .screen_task_frame(id, record, upstream_id, frame)
            .instrument(span.clone())
            .await;
        if !span.is_none() {
            task_spans::delivered(&span, screened.is_some(), &self.app.hasher.hash(id));
        }
        screened
    }

    /// [`Self::task_frame`] once the task's `record` is read.
    async fn screen_task_frame(
        &self,
        id: &TaskId,
        mut record: TaskRecord,
        upstream_id: &str,
        mut frame: Value,
    ) -> Option<Value> {
        authorize(
            Some(&record),
            &self.ctx.identity,
            Operation::Read,
            None,
            now_ms(),
        )
        .ok()?;
        let policy = self.app.policy()?;
        if !holds_scopes(
            policy.effective.tasks.as_ref(),
            &self.ctx.identity,
            &record.tool,
        ) {
            return None;
        }
        // Every delivery about a task is an operation on its object (`tasks.objects`).
        let objects = policy.effective.object_rules();
        let verdict = self
            .app
            .objects
            .for_task(
                objects,
                &policy.name,
                &self.ctx.identity,
                &record,
                Action::Listen,
                &self.app.metrics,
            )
            .await;
        if !verdict.allowed() {
            return None;
        }
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        // The server reporting an end teaches the ledger (first terminal write wins).
        let reported = parse_reported_state(&params);
        let finish = match (&reported, record.status.is_terminal()) {
            (Some(state), false) => {
                end_for_server_report(&self.app, &record, Report::State(state)).await
            }
            _ => None,
        };
        if let Some(finish) = finish
            && let Some(settled) = settle_terminal(
                &self.app,
                &self.ctx.policy,
                &self.ctx.correlation_id,
                &record,
                finish,
            )
            .await
        {
            record = settled.record;
        }
        let params = if record.status.is_terminal() {
            self.terminal_params(&record)
        } else {
            let mut params = params;
            present_task(&mut params, upstream_id, id.as_str(), record.ttl_ms, None);
            if let Some(intent) = &record.cancel {
                params["statusMessage"] = serde_json::json!(intent.pending_message);
            }
            strip_payload(&mut params);
            // Input requests inside notifications pass the same gate as in tasks/get, judged
            // by what the listen request declared.
            let screening = screen_task_state(
                &self.app,
                &self.ctx.policy,
                &record,
                &Recipient::of(&self.ctx),
                &mut params,
            )
            .await;
            match screening {
                Screening::Deliver => {
                    minimize::task_state(&policy, &mut params);
                    params
                }
                Screening::TaskFailed(failed) => self.terminal_params(&failed),
            }
        };
        let meta = frame.pointer("/params/_meta").cloned().map(|mut meta| {
            replace_task_id(&mut meta, upstream_id, id.as_str());
            minimize::task_state(&policy, &mut meta);
            meta
        });
        frame["params"] = params;
        if let Some(meta) = meta {
            frame["params"]["_meta"] = meta;
        }
        Some(frame)
    }

    /// A terminal state from the ledger, without its result or error.
    fn terminal_params(&self, record: &TaskRecord) -> Value {
        task_view(record, self.ctx.policy.min_poll_ms()).notification_params(None)
    }
}

/// The next event of the server's stream; never, without one.
async fn next_event(
    events: &mut Option<EventStream>,
) -> Option<Result<sse_stream::Sse, sse_stream::Error>> {
    match events {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

/// Removes a task state's `result` and `error` (a server may send them on any frame).
fn strip_payload(params: &mut Value) {
    if let Some(o) = params.as_object_mut() {
        o.remove("result");
        o.remove("error");
    }
}
