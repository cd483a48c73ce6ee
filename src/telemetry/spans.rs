//! The spans of an MCP hop, named and attributed after the OpenTelemetry semantic conventions for
//! MCP (`{mcp.method.name} {target}`, `mcp.method.name`, `gen_ai.tool.name`) and carried across
//! processes in W3C Trace Context headers (`traceparent`, `tracestate`).
//!
//! The spans of a request (its server span, the token check, the ledger and authorizer calls, the
//! client span of the hop upstream) are recorded with the OpenTelemetry API directly, not through
//! `tracing` spans and the `tracing-opentelemetry` bridge: on the request path the bridge's
//! bookkeeping (a registry slot, extensions, field visitors, enter and exit) cost more CPU than
//! the spans themselves. The span being served is the current OpenTelemetry
//! [`Context`](opentelemetry::Context), attached while the request's future is polled; spans made
//! through the bridge elsewhere (a revocation's, a listen delivery's) are activated as the current
//! context too, so everything here finds its parent in one place.
//!
//! Every function does nothing (and every span type holds nothing) when spans are not exported
//! ([`super::otel::exporting`]), so the request path does no tracing work without a collector.
//!
//! Only what is safe to show an operator is recorded: the method, and for `tools/call` the tool
//! name. `Mcp-Name` of a task request is a task ID, which never goes into a span.

use std::borrow::Cow;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::trace::{
    FutureExt as _, Span as _, SpanBuilder, SpanContext, SpanKind, Status, TraceContextExt,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, ContextGuard, KeyValue, Value};
use opentelemetry_http::HeaderExtractor;

use super::otel::tracer;
use super::trace_context;

const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// The one method whose `Mcp-Name` (the tool) may name a span. Telemetry sits below the
/// `mcp` wire module (it imports nothing of the crate), so the MCP method names it needs are
/// spelled here, as the MCP semantic conventions list them.
const TOOLS_CALL: &str = "tools/call";

fn header(headers: &HeaderMap, name: HeaderName) -> Option<&str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

/// The methods a span names without copying the name (those a sidecar sees most). A method
/// not listed is named all the same, by a copy.
const KNOWN_METHODS: &[&str] = &[
    TOOLS_CALL,
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "tasks/list",
    "tasks/result",
    "subscriptions/listen",
    "prompts/get",
    "resources/read",
    "tools/list",
    "prompts/list",
    "resources/list",
    "server/discover",
    "initialize",
    "ping",
    "logging/setLevel",
    "notifications/cancelled",
];

/// `method` as a name kept for the span: the constant for a known method, else a copy.
fn method_name(method: &str) -> Cow<'static, str> {
    match KNOWN_METHODS.iter().find(|known| **known == method) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(method.to_owned()),
    }
}

/// `(span name, method, tool)` from the MCP routing headers.
fn naming(headers: &HeaderMap) -> (Cow<'static, str>, Cow<'static, str>, Option<&str>) {
    let method = method_name(header(headers, MCP_METHOD).unwrap_or("mcp"));
    let tool = (method == TOOLS_CALL)
        .then(|| header(headers, MCP_NAME))
        .flatten();
    // Joined by hand: `format!` goes through the formatting machinery for two strings.
    let name = match tool {
        Some(tool) => {
            let mut name = String::with_capacity(method.len() + 1 + tool.len());
            name.push_str(&method);
            name.push(' ');
            name.push_str(tool);
            Cow::Owned(name)
        }
        None => method.clone(),
    };
    (name, method, tool)
}

/// Attribute values that repeat from request to request on a thread: the tool, the protocol
/// version, the policy's hash.
#[derive(Clone, Copy)]
enum Repeating {
    Tool = 0,
    ProtocolVersion = 1,
    PolicyHash = 2,
}

thread_local! {
    /// The last value of each [`Repeating`] attribute on this thread.
    static LAST_VALUES: RefCell<[Option<Arc<str>>; 3]> = const { RefCell::new([None, None, None]) };
}

/// `text` as an attribute value shared with the spans before it while it stays the same (the
/// same tool called again, the same policy): a reference count instead of a copy made here,
/// another made by the exporter's copy of the batch, and a free on the exporter's thread.
fn repeating(attribute: Repeating, text: &str) -> Value {
    let shared = LAST_VALUES.with(|last| {
        let mut last = last.borrow_mut();
        let slot = &mut last[attribute as usize];
        match slot {
            Some(shared) if **shared == *text => shared.clone(),
            _ => {
                let shared: Arc<str> = Arc::from(text);
                *slot = Some(shared.clone());
                shared
            }
        }
    });
    Value::String(shared.into())
}

/// The caller's context named by `traceparent`/`tracestate` in `headers` (empty without one:
/// most requests, which then skip the propagator and its lock).
fn header_context(headers: &HeaderMap) -> Context {
    if !headers.contains_key(trace_context::TRACEPARENT_HEADER) {
        return Context::new();
    }
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(headers))
    })
}

/// Writes `traceparent`/`tracestate` naming `span` into `headers`, replacing any there (what
/// the W3C propagator writes, without a detour through the global propagator and formatting).
fn inject(span: &SpanContext, headers: &mut HeaderMap) {
    headers.remove(trace_context::TRACESTATE_HEADER);
    let Some(traceparent) = trace_context::TraceParent::of(span) else {
        headers.remove(trace_context::TRACEPARENT_HEADER);
        return;
    };
    headers.insert(
        trace_context::TRACEPARENT_HEADER,
        traceparent.header_value(),
    );
    // Most traces carry no state: compared first, so no empty header text is built.
    if *span.trace_state() == TraceState::NONE {
        return;
    }
    let state = span.trace_state().header();
    if !state.is_empty()
        && let Ok(value) = HeaderValue::from_str(&state)
    {
        headers.insert(trace_context::TRACESTATE_HEADER, value);
    }
}

/// Polls a future the caller has pinned where it lives, with `context` current while it is
/// polled (nothing is attached when traces are not exported).
///
/// It borrows the future rather than owning it: the request's future is several KiB, and a
/// wrapper owning it (`FutureExt::with_context`) is one more copy of it per request, and makes
/// every future around it that much larger. The caller pins the future in its own state
/// (`std::pin::pin!`), where it is built.
pub struct InContext<'a, F> {
    future: Pin<&'a mut F>,
    context: Option<Context>,
}

impl<F: Future> Future for InContext<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let _current = this.context.clone().map(Context::attach);
        this.future.as_mut().poll(cx)
    }
}

/// The server span of a request to `POST /mcp`. Made when the request arrives (its start time
/// is then), started once its parent is known: the caller's span named by `traceparent`, or by
/// the body's `params._meta` when the headers name none ([`ServerSpan::continue_meta_trace`]).
/// A request refused before its body is parsed starts it with the header's parent, or none.
///
/// Attributes recorded before it starts go on the span when it starts. It ends in
/// [`ServerSpan::finish`] (or when dropped).
pub struct ServerSpan(Option<Mutex<ServerState>>);

enum ServerState {
    /// Not started: the span to start and the parent the headers name (maybe none).
    Pending {
        builder: Box<SpanBuilder>,
        parent: Context,
    },
    /// Started: the context whose span it is (the parent's context with this span in it).
    Started(Context),
}

impl ServerSpan {
    /// A span that records nothing (traces are not exported).
    pub const fn none() -> Self {
        Self(None)
    }

    /// Whether this records nothing.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut ServerState) -> T) -> Option<T> {
        let state = self.0.as_ref()?;
        let mut state = state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(f(&mut state))
    }

    /// Starts the span (if it has not started) with `parent`, or the headers' parent when
    /// `parent` names no span; returns its context.
    fn start(state: &mut ServerState, parent: Option<Context>) -> Context {
        let (builder, from_headers) = match state {
            ServerState::Started(context) => return context.clone(),
            ServerState::Pending { builder, parent } => (builder, parent),
        };
        let parent = parent.unwrap_or_else(|| std::mem::take(from_headers));
        let builder = std::mem::replace(builder.as_mut(), SpanBuilder::from_name(""));
        let context = match tracer() {
            Some(tracer) => {
                let span = builder.start_with_context(tracer, &parent);
                parent.with_span(span)
            }
            None => parent,
        };
        *state = ServerState::Started(context.clone());
        context
    }

    /// The span's context (starting it with the headers' parent if it had not started); `None`
    /// when traces are not exported.
    pub fn context(&self) -> Option<Context> {
        self.with_state(|state| Self::start(state, None))
    }

    /// Makes the span current until the guard is dropped (for refusals logged from synchronous
    /// code: the audit trail's decision lands on the span). Never hold it across an `.await`.
    pub fn enter(&self) -> Option<ContextGuard> {
        self.context().map(Context::attach)
    }

    /// Runs `f` with the span current.
    pub fn in_scope<T>(&self, f: impl FnOnce() -> T) -> T {
        let _current = self.enter();
        f()
    }

    /// Polls `future` (pinned by the caller) with the span current, so the spans it makes are
    /// the request's children.
    pub fn run<'a, F: Future>(&self, future: Pin<&'a mut F>) -> InContext<'a, F> {
        InContext {
            future,
            context: self.context(),
        }
    }

    /// Continues the caller's trace from the request's `params._meta` (`traceparent`,
    /// `tracestate`) when its headers named none, and starts the span. The header wins when both
    /// name a context. Call it once the body is parsed, before anything else makes the span
    /// current: a started span's parent cannot change.
    pub fn continue_meta_trace(&self, message: &serde_json::Value) {
        self.with_state(|state| {
            let ServerState::Pending { parent, .. } = state else {
                return;
            };
            let from_meta = (!parent.span().span_context().is_valid())
                .then(|| trace_context::meta_of(message))
                .flatten()
                .map(|meta| {
                    opentelemetry::global::get_text_map_propagator(|propagator| {
                        propagator.extract(&trace_context::MetaExtractor(meta))
                    })
                })
                .filter(|context| context.span().span_context().is_valid());
            Self::start(state, from_meta);
        });
    }

    /// Records `attribute`: on the span, or kept for it until it starts.
    fn record(&self, attribute: KeyValue) {
        self.with_state(|state| match state {
            ServerState::Pending { builder, .. } => builder
                .attributes
                .get_or_insert_with(Vec::new)
                .push(attribute),
            ServerState::Started(context) => context.span().set_attribute(attribute),
        });
    }

    /// Records the JSON-RPC `id` of the request (`jsonrpc.request.id`, as a string; the audit
    /// trail's correlation ID is the same value). A notification has none.
    pub fn request_id(&self, id: Option<&serde_json::Value>) {
        let Some(id) = id.filter(|_| !self.is_none()) else {
            return;
        };
        self.record(KeyValue::new("jsonrpc.request.id", request_id_text(id)));
    }

    /// Records the outcome of the request and ends the span: the HTTP status and, for a
    /// JSON-RPC error the sidecar answered, its code as `rpc.response.status_code` and
    /// `error.type` (as the OpenTelemetry MCP conventions ask). A 5xx also marks the span's
    /// status `ERROR`.
    pub fn finish(&self, response: &axum::response::Response) {
        let Some(context) = self.context() else {
            return;
        };
        let span = context.span();
        let status = response.status().as_u16();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if let Some(RpcErrorCode(code)) = response.extensions().get::<RpcErrorCode>() {
            span.set_attribute(KeyValue::new("rpc.response.status_code", code.to_string()));
            span.set_attribute(KeyValue::new("error.type", code.to_string()));
        } else if status >= 500 {
            span.set_attribute(KeyValue::new("error.type", status.to_string()));
        }
        if status >= 500 {
            span.set_status(Status::error(""));
        }
        span.end();
    }
}

/// The server span of a request that arrived with `headers`, not yet started
/// ([`ServerSpan`]): a child of the caller's span when `traceparent` names one, else (unless
/// the body's `_meta` names one) the root of a new trace, as the sampler decides.
pub fn server(headers: &HeaderMap) -> ServerSpan {
    if tracer().is_none() {
        return ServerSpan::none();
    }
    let (name, method, tool) = naming(headers);
    let mut attributes = Vec::with_capacity(12);
    attributes.push(KeyValue::new("mcp.method.name", method));
    if let Some(tool) = tool {
        attributes.push(KeyValue::new(
            "gen_ai.tool.name",
            repeating(Repeating::Tool, tool),
        ));
        attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
    }
    if let Some(version) = header(headers, MCP_PROTOCOL_VERSION) {
        attributes.push(KeyValue::new(
            "mcp.protocol.version",
            repeating(Repeating::ProtocolVersion, version),
        ));
    }
    attributes.push(KeyValue::new("network.transport", "tcp"));
    attributes.push(KeyValue::new("network.protocol.name", "http"));
    let builder = SpanBuilder::from_name(name)
        .with_kind(SpanKind::Server)
        .with_start_time(SystemTime::now())
        .with_attributes(attributes);
    ServerSpan(Some(Mutex::new(ServerState::Pending {
        builder: Box::new(builder),
        parent: header_context(headers),
    })))
}

/// The wall clock for a child span recorded after the fact under `span` (not read when spans
/// are not exported).
pub fn now(span: &ServerSpan) -> SystemTime {
    if span.is_none() {
        SystemTime::UNIX_EPOCH
    } else {
        SystemTime::now()
    }
}

/// A child of the request's server `span` for the token check that ran from `started` to
/// `ended` (cache lookup or validation, a refetch of the issuer's keys, the revocation check),
/// with its `outcome` (`ok`, or the refusal's reason). It is recorded after the fact, with its
/// own timestamps, because the check runs before the body names the caller's trace.
pub fn authenticated(span: &ServerSpan, started: SystemTime, ended: SystemTime, outcome: &str) {
    let (Some(tracer), Some(parent)) = (tracer(), span.context()) else {
        return;
    };
    let mut child = tracer
        .span_builder("lifeguard.authenticate")
        .with_kind(SpanKind::Internal)
        .with_start_time(started)
        .with_attributes([KeyValue::new("lifeguard.auth.outcome", outcome.to_owned())])
        .start_with_context(tracer, &parent);
    child.end_with_timestamp(ended);
}

/// Axum middleware: a server span for each request of a control-plane endpoint (the webhook's
/// admission reviews, the operator's Security Event pushes), named `{METHOD} {path}` after the
/// HTTP conventions, continuing the caller's `traceparent`, with the response status. The
/// handler runs with the span current.
pub async fn http_server(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(tracer) = tracer() else {
        return next.run(request).await;
    };
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let parent = header_context(request.headers());
    let span = tracer
        .span_builder(format!("{method} {path}"))
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("http.request.method", method),
            KeyValue::new("url.path", path),
        ])
        .start_with_context(tracer, &parent);
    let context = parent.with_span(span);
    let response = next.run(request).with_context(context.clone()).await;
    let span = context.span();
    let status = response.status().as_u16();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if status >= 500 {
        span.set_status(Status::error(""));
        span.set_attribute(KeyValue::new("error.type", status.to_string()));
    }
    span.end();
    response
}

/// The JSON-RPC error code of an answer the sidecar made itself, carried as a response
/// extension so the request's span can record it without reading the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcErrorCode(pub i64);

/// The longest `jsonrpc.request.id` recorded (a client chooses it; longer ones are cut).
const MAX_REQUEST_ID: usize = 128;

/// A JSON-RPC `id` as the text recorded (a string as it is, anything else as JSON), cut to
/// [`MAX_REQUEST_ID`] characters.
fn request_id_text(id: &serde_json::Value) -> String {
    let mut text = match id {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        // A number's own formatting, not a serializer writing one value.
        serde_json::Value::Number(n) => n.to_string(),
        other => other.to_string(),
    };
    if let Some((at, _)) = text.char_indices().nth(MAX_REQUEST_ID) {
        text.truncate(at);
    }
    text
}

/// A child span of the request's (the hop upstream, a ledger call): ends when dropped.
pub struct ChildSpan(Option<opentelemetry_sdk::trace::Span>);

impl ChildSpan {
    /// Whether this records nothing (traces are not exported).
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }
}

/// The client span of a request the sidecar sends upstream with `headers` (a child of the
/// current span), whose context replaces any `traceparent`/`tracestate` in `headers`, so the
/// MCP server's own spans join the trace with this span as their parent. Without export the
/// headers are left as they are (a caller's `traceparent` passes through, as it always has).
pub fn client(headers: &mut HeaderMap) -> ChildSpan {
    let Some(tracer) = tracer() else {
        return ChildSpan(None);
    };
    let (name, method, tool) = naming(headers);
    let mut attributes = Vec::with_capacity(2);
    attributes.push(KeyValue::new("mcp.method.name", method));
    if let Some(tool) = tool {
        attributes.push(KeyValue::new(
            "gen_ai.tool.name",
            repeating(Repeating::Tool, tool),
        ));
    }
    let span = Context::map_current(|parent| {
        tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(tracer, parent)
    });
    inject(span.span_context(), headers);
    ChildSpan(Some(span))
}

/// Records an audit event's `decision` (`allow`, `deny`, `record`) and `reason`, the policy hash
/// it was decided under and the keyed hash of its task (as the audit trail writes it, never the
/// task ID) on the current span (the request's), so traces and the audit trail agree.
pub fn audit(decision: &'static str, reason: &'static str, policy_hash: &str, task: Option<&str>) {
    if tracer().is_none() {
        return;
    }
    Context::map_current(|context| {
        if !context.has_active_span() {
            return;
        }
        let span = context.span();
        span.set_attribute(KeyValue::new("lifeguard.decision", decision));
        span.set_attribute(KeyValue::new("lifeguard.reason", reason));
        if !policy_hash.is_empty() {
            span.set_attribute(KeyValue::new(
                "lifeguard.policy.hash",
                repeating(Repeating::PolicyHash, policy_hash),
            ));
        }
        if let Some(task) = task {
            span.set_attribute(KeyValue::new("lifeguard.task", task.to_owned()));
        }
    });
}

/// A child of the current span for the object authorizer's decision
/// (`lifeguard.authorize`, kind client): answered from the cache or asked over HTTP
/// ([`Authorizing::decided`] records which, and the decision, and ends it). Never names the
/// object or the principal.
pub struct Authorizing(Option<Context>);

/// Starts the [`Authorizing`] span for `action`.
pub fn authorizer(action: &str) -> Authorizing {
    let Some(tracer) = tracer() else {
        return Authorizing(None);
    };
    Authorizing(Some(Context::map_current(|parent| {
        let span = tracer
            .span_builder("lifeguard.authorize")
            .with_kind(SpanKind::Client)
            .with_attributes([KeyValue::new("lifeguard.action", action.to_owned())])
            .start_with_context(tracer, parent);
        parent.with_span(span)
    })))
}

impl Authorizing {
    /// Polls `future` (the question over HTTP, pinned by the caller) with this span current,
    /// so the request it sends names this span as its parent ([`current_context_headers`]).
    pub fn run<'a, F: Future>(&self, future: Pin<&'a mut F>) -> InContext<'a, F> {
        InContext {
            future,
            context: self.0.clone(),
        }
    }

    /// Records where the decision came from (`cache` or `authorizer`) and what it was (`allow`,
    /// `deny`, or `error` when the authorizer gave none: an `ERROR` span), and ends the span.
    pub fn decided(&self, source: &'static str, decision: &'static str) {
        let Some(context) = &self.0 else {
            return;
        };
        let span = context.span();
        span.set_attribute(KeyValue::new("lifeguard.authorizer.source", source));
        span.set_attribute(KeyValue::new("lifeguard.decision", decision));
        if decision == "error" {
            span.set_status(Status::error(""));
            span.set_attribute(KeyValue::new("error.type", "authorizer_unavailable"));
        }
        span.end();
    }
}

/// `traceparent`/`tracestate` naming the current span, for a request the sidecar sends to a
/// service other than the MCP server (the object authorizer), so its spans join the trace.
/// Empty when spans are not exported.
pub fn current_context_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    if tracer().is_some() {
        Context::map_current(|context| inject(context.span().span_context(), &mut headers));
    }
    headers
}

/// A child span of the current span (when it records) for a ledger operation `name` on
/// `system` (`sqlite` or `postgresql`, as the OpenTelemetry database conventions name them),
/// ending when dropped. `None` outside any span, so background work records nothing.
pub fn ledger(name: &'static str, system: &'static str, remote: bool) -> ChildSpan {
    let Some(tracer) = tracer() else {
        return ChildSpan(None);
    };
    ChildSpan(Context::map_current(|parent| {
        parent.span().is_recording().then(|| {
            tracer
                .span_builder(format!("ledger {name}"))
                .with_kind(if remote {
                    SpanKind::Client
                } else {
                    SpanKind::Internal
                })
                .with_attributes([
                    KeyValue::new("db.system.name", system),
                    KeyValue::new("db.operation.name", name),
                ])
                .start_with_context(tracer, parent)
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(value: &Value) -> &str {
        match value {
            Value::String(text) => text.as_str(),
            other => panic!("not a string: {other:?}"),
        }
    }

    #[test]
    fn a_repeating_value_is_shared_while_it_stays_the_same_and_replaced_when_it_changes() {
        let first = repeating(Repeating::Tool, "greet");
        let again = repeating(Repeating::Tool, "greet");
        assert_eq!(shared(&first), "greet");
        // The same allocation: the second value is the first one's reference count.
        assert!(std::ptr::eq(shared(&first), shared(&again)));
        let other = repeating(Repeating::Tool, "search");
        assert_eq!(shared(&other), "search");
        assert!(!std::ptr::eq(shared(&first), shared(&other)));
        // Each attribute keeps its own: a policy hash equal to the tool's text is its own value.
        let hash = repeating(Repeating::PolicyHash, "search");
        assert_eq!(shared(&hash), "search");
        assert!(!std::ptr::eq(shared(&hash), shared(&other)));
    }

    #[test]
    fn a_span_is_named_after_the_method_and_for_tools_call_the_tool() {
        let mut headers = HeaderMap::new();
        headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
        headers.insert(MCP_NAME, HeaderValue::from_static("greet"));
        let (name, method, tool) = naming(&headers);
        assert_eq!(
            (name.as_ref(), method.as_ref(), tool),
            ("tools/call greet", "tools/call", Some("greet"))
        );

        // The name of anything but a tool call is the method alone: a task ID never names a span.
        headers.insert(MCP_METHOD, HeaderValue::from_static("tasks/get"));
        headers.insert(MCP_NAME, HeaderValue::from_static("task-7f3a"));
        let (name, method, tool) = naming(&headers);
        assert_eq!(
            (name.as_ref(), method.as_ref(), tool),
            ("tasks/get", "tasks/get", None)
        );
        assert!(
            matches!(name, Cow::Borrowed(_)),
            "a known method is named without a copy"
        );

        let none = HeaderMap::new();
        let (name, _, tool) = naming(&none);
        assert_eq!((name.as_ref(), tool), ("mcp", None));
    }

    #[test]
    fn the_hops_context_replaces_the_callers_and_carries_a_trace_state_only_when_there_is_one() {
        use opentelemetry::trace::{SpanId, TraceFlags, TraceId};
        let context = |state: TraceState| {
            SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                TraceFlags::SAMPLED,
                false,
                state,
            )
        };
        let callers = || {
            let mut headers = HeaderMap::new();
            headers.insert(
                trace_context::TRACEPARENT_HEADER,
                HeaderValue::from_static("00-11111111111111111111111111111111-2222222222222222-01"),
            );
            headers.insert(
                trace_context::TRACESTATE_HEADER,
                HeaderValue::from_static("caller=1"),
            );
            headers
        };

        let mut headers = callers();
        inject(&context(TraceState::NONE), &mut headers);
        assert_eq!(
            headers[trace_context::TRACEPARENT_HEADER],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert!(
            !headers.contains_key(trace_context::TRACESTATE_HEADER),
            "{headers:?}"
        );

        let mut headers = callers();
        let state = TraceState::from_key_value([("vendor", "7")]).unwrap();
        inject(&context(state), &mut headers);
        assert_eq!(headers[trace_context::TRACESTATE_HEADER], "vendor=7");

        // No valid span: neither header is left for the server to trust.
        let mut headers = callers();
        inject(&SpanContext::empty_context(), &mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }

    #[test]
    fn a_request_id_is_recorded_as_text_cut_at_its_limit() {
        assert_eq!(request_id_text(&serde_json::json!(7)), "7");
        assert_eq!(request_id_text(&serde_json::json!(-12.5)), "-12.5");
        assert_eq!(request_id_text(&serde_json::json!("abc")), "abc");
        assert_eq!(request_id_text(&serde_json::Value::Null), "");
        let long = "é".repeat(MAX_REQUEST_ID + 10);
        assert_eq!(
            request_id_text(&serde_json::json!(long)).chars().count(),
            MAX_REQUEST_ID
        );
    }
}
