//! A task's story across requests. A task outlives the `tools/call` that created it by minutes
//! or hours, and every later request about it (`tasks/get`, `tasks/update`, `tasks/cancel`, a
//! listen delivery, a cancellation retried from the outbox) is its own trace, or another
//! trace's part. The context of the creating span is kept in the ledger row
//! ([`crate::ledger::TaskRecord::trace`]) and each of those spans carries a span link to it, so
//! a trace viewer can show the task as one story.
//!
//! - [`current_traceparent`]: the context to keep (the creating `tools/call` span's, or the
//!   span that asks for a cancellation).
//! - [`link_task`]: the current span links to the task's creating span.
//! - [`delivery`]: a listen stream's delivery about a task, in the listener's trace.
//! - [`outbox_cancel`]: a cancellation retried from the outbox, continuing the trace of whoever
//!   asked for it (a revocation's apply span, the owner's `tasks/cancel`).
//!
//! The stored context is parsed strictly ([`TraceParent::parse`]); a value that does not parse
//! links nothing. Every function does nothing (and returns [`Span::none`]) when spans are not
//! exported.

use opentelemetry::KeyValue;
use opentelemetry::trace::TraceContextExt;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::otel::exporting;
use super::trace_context::TraceParent;

/// The attribute on every link to a task's creating span.
const LINK_KIND: &str = "lifeguard.link";
const CREATED_BY: &str = "task.created";

/// The `traceparent` of the current span (with its sampling decision), to keep in the ledger;
/// `None` when spans are not exported or no span is current.
pub fn current_traceparent() -> Option<String> {
    if !exporting() {
        return None;
    }
    opentelemetry::Context::map_current(|context| {
        TraceParent::of(context.span().span_context()).map(|t| t.to_string())
    })
}

/// The link to the task's creating span named by `trace` (the ledger's value).
fn creation_link(
    trace: Option<&str>,
) -> Option<(opentelemetry::trace::SpanContext, Vec<KeyValue>)> {
    let created = trace.and_then(TraceParent::parse)?;
    Some((
        created.context().span().span_context().clone(),
        vec![KeyValue::new(LINK_KIND, CREATED_BY)],
    ))
}

/// Links `span` to the task's creating span named by `trace` (the ledger's value).
fn link(span: &Span, trace: Option<&str>) {
    if span.is_none() {
        return;
    }
    if let Some((context, attributes)) = creation_link(trace) {
        span.add_link_with_attributes(context, attributes);
    }
}

/// The current span (the request's) links to the span that created the task, named by the
/// task's `trace` in the ledger.
pub fn link_task(trace: Option<&str>) {
    if !exporting() {
        return;
    }
    let Some((created, attributes)) = creation_link(trace) else {
        return;
    };
    opentelemetry::Context::map_current(|context| {
        if context.has_active_span() {
            context.span().add_link(created, attributes);
        }
    });
}

/// The span of a listen stream's delivery of `method` about a task: a child of the listen
/// request's span named by `listen` (the trace the listener started), linked to the task's
/// creating span named by `task`. Its `lifeguard.decision` says whether the frame was delivered.
pub fn delivery(listen: Option<&str>, method: &str, task: Option<&str>) -> Span {
    if !exporting() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: "lifeguard::mcp",
        "mcp.listen.delivery",
        otel.name = %method,
        otel.kind = "producer",
        mcp.method.name = %method,
        lifeguard.decision = Empty,
        lifeguard.task = Empty,
    );
    if let Some(parent) = listen.and_then(TraceParent::parse) {
        // Cannot fail: the span was just made and the layer is installed whenever spans are
        // exported.
        let _ = span.set_parent(parent.context());
    }
    link(&span, task);
    span
}

/// Records on a delivery `span` whether its frame was `delivered` and the keyed hash of its
/// task (as the audit trail writes it).
pub fn delivered(span: &Span, delivered: bool, task_hash: &str) {
    if span.is_none() {
        return;
    }
    span.record(
        "lifeguard.decision",
        if delivered { "deliver" } else { "drop" },
    );
    span.record("lifeguard.task", task_hash);
}

/// The span of one outbox attempt to carry a cancellation (`reason`) to the server: a child of
/// the span that asked for it, named by the intent's `requested` context (a new trace without
/// one, e.g. a deadline found by the sweeper), linked to the task's creating span. The upstream
/// `tasks/cancel` and its check are its children.
pub fn outbox_cancel(requested: Option<&str>, task: Option<&str>, reason: &str) -> Span {
    if !exporting() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: "lifeguard::mcp",
        "lifeguard.cancel.retry",
        otel.name = "lifeguard.cancel.retry",
        otel.kind = "internal",
        lifeguard.reason = %reason,
    );
    if let Some(parent) = requested.and_then(TraceParent::parse) {
        // Cannot fail: as above.
        let _ = span.set_parent(parent.context());
    }
    link(&span, task);
    span
}
