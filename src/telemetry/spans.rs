//! The spans of an MCP hop, named and attributed after the OpenTelemetry semantic conventions for
//! MCP (`{mcp.method.name} {target}`, `mcp.method.name`, `gen_ai.tool.name`) and carried across
//! processes in W3C Trace Context headers (`traceparent`, `tracestate`).
//!
//! Every function returns [`tracing::Span::none`] and does nothing when spans are not exported
//! ([`super::otel::exporting`]), so the request path does no tracing work without a collector.
//!
//! Only what is safe to show an operator is recorded: the method, and for `tools/call` the tool
//! name. `Mcp-Name` of a task request is a task ID, which never goes into a span.

use std::time::SystemTime;

use http::HeaderMap;
use opentelemetry::KeyValue;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::otel::exporting;
use super::trace_context;

const MCP_METHOD: &str = "mcp-method";
const MCP_NAME: &str = "mcp-name";
/// The one method whose `Mcp-Name` (the tool) may name a span.
const TOOLS_CALL: &str = "tools/call";

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

/// `(span name, method, tool)` from the MCP routing headers.
fn naming(headers: &HeaderMap) -> (String, String, Option<String>) {
    let method = header(headers, MCP_METHOD).unwrap_or("mcp").to_owned();
    let tool = (method == TOOLS_CALL)
        .then(|| header(headers, MCP_NAME).map(str::to_owned))
        .flatten();
    let name = match &tool {
        Some(tool) => format!("{method} {tool}"),
        None => method.clone(),
    };
    (name, method, tool)
}

/// The server span of a request that arrived with `headers`: a child of the caller's span when
/// `traceparent` names one, else the root of a new trace (as the sampler decides).
pub fn server(headers: &HeaderMap) -> Span {
    if !exporting() {
        return Span::none();
    }
    let (name, method, tool) = naming(headers);
    let span = tracing::info_span!(
        target: "lifeguard::mcp",
        "mcp.server",
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = Empty,
        mcp.method.name = %method,
        gen_ai.tool.name = tool.as_deref(),
        gen_ai.operation.name = tool.is_some().then_some("execute_tool"),
        mcp.protocol.version = header(headers, "mcp-protocol-version"),
        network.transport = "tcp",
        network.protocol.name = "http",
        jsonrpc.request.id = Empty,
        http.response.status_code = Empty,
        rpc.response.status_code = Empty,
        error.r#type = Empty,
        lifeguard.decision = Empty,
        lifeguard.reason = Empty,
        lifeguard.policy.hash = Empty,
        lifeguard.task = Empty,
    );
    continue_caller_trace(&span, headers);
    span
}

/// The caller's context named by `traceparent`/`tracestate` in `headers` (empty without one).
fn header_context(headers: &HeaderMap) -> opentelemetry::Context {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(headers))
    })
}

/// Makes the just-created `span` a child of the caller's span named by `traceparent` in
/// `headers` (no parent without one).
fn continue_caller_trace(span: &Span, headers: &HeaderMap) {
    // Cannot fail: the span was just made and the layer is installed whenever spans are exported.
    let _ = span.set_parent(header_context(headers));
}

/// Continues the caller's trace from the request's `params._meta` (`traceparent`,
/// `tracestate`) when its headers named none: the server `span` of a request whose body was just
/// parsed becomes a child of the span named there. The header wins when both name a context.
///
/// Call it before the span is first entered or given a child (the pipeline enters it only once
/// the body is parsed, or earlier to refuse a request, whose span then has the header's parent
/// or none): a started span's parent cannot change.
pub fn continue_meta_trace(span: &Span, headers: &HeaderMap, message: &serde_json::Value) {
    if span.is_none() {
        return;
    }
    if header_context(headers).span().span_context().is_valid() {
        return;
    }
    let Some(meta) = trace_context::meta_of(message) else {
        return;
    };
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&trace_context::MetaExtractor(meta))
    });
    if parent.span().span_context().is_valid() {
        // Cannot fail before the span started (above).
        let _ = span.set_parent(parent);
    }
}

/// The wall clock for a child span recorded after the fact under `span` (not read when spans
/// are not exported).
pub fn now(span: &Span) -> SystemTime {
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
pub fn authenticated(span: &Span, started: SystemTime, ended: SystemTime, outcome: &str) {
    let Some(tracer) = super::otel::tracer().filter(|_| !span.is_none()) else {
        return;
    };
    use opentelemetry::trace::{Span as _, SpanKind, Tracer as _};
    let parent = span.context();
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
/// HTTP conventions, continuing the caller's `traceparent`, with the response status.
pub async fn http_server(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if !exporting() {
        return next.run(request).await;
    }
    let route = format!("{} {}", request.method(), request.uri().path());
    let span = tracing::info_span!(
        target: "lifeguard::http",
        "http.server",
        otel.name = %route,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %request.method(),
        url.path = %request.uri().path(),
        http.response.status_code = Empty,
        error.r#type = Empty,
        lifeguard.decision = Empty,
        lifeguard.reason = Empty,
        lifeguard.policy.hash = Empty,
        lifeguard.task = Empty,
    );
    continue_caller_trace(&span, request.headers());
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    finish_http_server(&span, response.status().as_u16());
    response
}

/// The JSON-RPC error code of an answer the sidecar made itself, carried as a response
/// extension so the request's span can record it without reading the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcErrorCode(pub i64);

/// The longest `jsonrpc.request.id` recorded (a client chooses it; longer ones are cut).
const MAX_REQUEST_ID: usize = 128;

/// Records the JSON-RPC `id` of the request on its server `span` (`jsonrpc.request.id`, as a
/// string; the audit trail's correlation ID is the same value). A notification has none.
pub fn request_id(span: &Span, id: Option<&serde_json::Value>) {
    let Some(id) = id.filter(|_| !span.is_none()) else {
        return;
    };
    let text = match id {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    let cut = text
        .char_indices()
        .nth(MAX_REQUEST_ID)
        .map_or(text.as_str(), |(at, _)| &text[..at]);
    span.record("jsonrpc.request.id", cut);
}

/// Records the outcome of the request on its server `span`: the HTTP status and, for a
/// JSON-RPC error the sidecar answered, its code as `rpc.response.status_code` and `error.type`
/// (as the OpenTelemetry MCP conventions ask). A 5xx also marks the span's status `ERROR`.
pub fn finish_server(span: &Span, response: &axum::response::Response) {
    if span.is_none() {
        return;
    }
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    if let Some(RpcErrorCode(code)) = response.extensions().get::<RpcErrorCode>() {
        span.record("rpc.response.status_code", code.to_string());
        span.record("error.type", code.to_string());
    } else if status >= 500 {
        span.record("error.type", status.to_string());
    }
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

fn finish_http_server(span: &Span, status: u16) {
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", status.to_string());
    }
}

/// The client span of a request the sidecar sends upstream with `headers` (a child of the
/// current span), whose context replaces any `traceparent`/`tracestate` in `headers`, so the
/// MCP server's own spans join the trace with this span as their parent. Without export the
/// headers are left as they are (a caller's `traceparent` passes through, as it always has).
pub fn client(headers: &mut HeaderMap) -> Span {
    if !exporting() {
        return Span::none();
    }
    let (name, method, tool) = naming(headers);
    let span = tracing::info_span!(
        target: "lifeguard::mcp",
        "mcp.client",
        otel.name = %name,
        otel.kind = "client",
        mcp.method.name = %method,
        gen_ai.tool.name = tool.as_deref(),
    );
    let context = span.context();
    headers.remove("traceparent");
    headers.remove("tracestate");
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut HeaderInjector(headers))
    });
    span
}

/// Records an audit event's `decision` (`allow`, `deny`, `record`) and `reason`, the policy hash
/// it was decided under and the keyed hash of its task (as the audit trail writes it, never the
/// task ID) on the current request's span, so traces and the audit trail agree.
pub fn audit(decision: &str, reason: &str, policy_hash: &str, task: Option<&str>) {
    if !exporting() {
        return;
    }
    let span = Span::current();
    span.record("lifeguard.decision", decision);
    span.record("lifeguard.reason", reason);
    if !policy_hash.is_empty() {
        span.record("lifeguard.policy.hash", policy_hash);
    }
    if let Some(task) = task {
        span.record("lifeguard.task", task);
    }
}

/// A child of the current span for the object authorizer's decision about `action`
/// (`lifeguard.authorize`, kind client): answered from the cache or asked over HTTP
/// ([`authorized`] records which, and the decision). Never names the object or the principal.
pub fn authorizer(action: &str) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(
        target: "lifeguard::mcp",
        "lifeguard.authorize",
        otel.name = "lifeguard.authorize",
        otel.kind = "client",
        otel.status_code = Empty,
        lifeguard.action = %action,
        lifeguard.authorizer.source = Empty,
        lifeguard.decision = Empty,
        error.r#type = Empty,
    )
}

/// Records on an authorizer `span` where the decision came from (`cache` or `authorizer`) and
/// what it was (`allow`, `deny`, or `error` when the authorizer gave none: an `ERROR` span).
pub fn authorized(span: &Span, source: &str, decision: &str) {
    if span.is_none() {
        return;
    }
    span.record("lifeguard.authorizer.source", source);
    span.record("lifeguard.decision", decision);
    if decision == "error" {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", "authorizer_unavailable");
    }
}

/// `traceparent`/`tracestate` naming the current span, for a request the sidecar sends to a
/// service other than the MCP server (the object authorizer), so its spans join the trace.
/// Empty when spans are not exported.
pub fn current_context_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    if exporting() {
        let context = Span::current().context();
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut HeaderInjector(&mut headers))
        });
    }
    headers
}
