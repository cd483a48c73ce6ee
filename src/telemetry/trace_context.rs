//! W3C Trace Context carried in an MCP request's `params._meta` (`traceparent`, `tracestate`), as
//! the OpenTelemetry MCP semantic conventions recommend alongside the HTTP headers.
//!
//! Pure: reading a context out of a parsed message, and rewriting the `_meta` of a body the
//! sidecar forwards so the server sees the sidecar's hop there too, never the client's context
//! (which would skip the hop).

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use serde_json::{Map, Value};

pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
/// The headers by name, for the request path (a `&str` name is parsed at every lookup).
pub const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static(TRACEPARENT);
pub const TRACESTATE_HEADER: HeaderName = HeaderName::from_static(TRACESTATE);

/// A W3C Trace Context `traceparent` of version `00`: `00-<trace id>-<span id>-<flags>` in
/// lowercase hex, neither ID all zeros. Nothing else parses (no other version, no upper case,
/// no surrounding text), so a value someone wrote by hand either names a span or is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

fn lower_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

impl TraceParent {
    /// Parses a `traceparent`; `None` for anything but a valid version-00 value.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || version != "00" {
            return None;
        }
        let parsed = Self {
            trace_id: lower_hex::<16>(trace)?,
            span_id: lower_hex::<8>(span)?,
            flags: lower_hex::<1>(flags)?[0],
        };
        let zero = |bytes: &[u8]| bytes.iter().all(|b| *b == 0);
        (!zero(&parsed.trace_id) && !zero(&parsed.span_id)).then_some(parsed)
    }

    /// The trace ID in lowercase hex.
    pub fn trace_id(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The parent span ID in lowercase hex.
    pub fn span_id(&self) -> String {
        hex::encode(self.span_id)
    }

    /// The `traceparent` naming `context`, when it is valid.
    pub fn of(context: &SpanContext) -> Option<Self> {
        context.is_valid().then(|| Self {
            trace_id: context.trace_id().to_bytes(),
            span_id: context.span_id().to_bytes(),
            flags: context.trace_flags().to_u8(),
        })
    }

    /// The OpenTelemetry context whose (remote) span this names.
    pub fn context(&self) -> opentelemetry::Context {
        let span = SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        );
        opentelemetry::Context::new().with_remote_span_context(span)
    }
}

impl TraceParent {
    /// The `traceparent` as a header value (the text [`Display`](std::fmt::Display) writes).
    pub fn header_value(&self) -> http::HeaderValue {
        // "00-" + 32 hex + "-" + 16 hex + "-" + 2 hex.
        let mut text = [0u8; 55];
        text[..3].copy_from_slice(b"00-");
        let hex = |bytes: &[u8], out: &mut [u8]| {
            // Cannot fail: `out` is exactly twice as long as `bytes`.
            let _ = hex::encode_to_slice(bytes, out);
        };
        hex(&self.trace_id, &mut text[3..35]);
        text[35] = b'-';
        hex(&self.span_id, &mut text[36..52]);
        text[52] = b'-';
        hex(&[self.flags], &mut text[53..55]);
        // Cannot fail: lowercase hex and dashes are visible ASCII.
        http::HeaderValue::from_bytes(&text).expect("a traceparent is visible ASCII")
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        )
    }
}

/// A `params._meta` object as a propagation carrier: only string values are read.
pub struct MetaExtractor<'a>(pub &'a Map<String, Value>);

impl Extractor for MetaExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// `params._meta` of a JSON-RPC message, when it is an object.
pub fn meta_of(message: &Value) -> Option<&Map<String, Value>> {
    message.get("params")?.get("_meta")?.as_object()
}

/// Whether `params._meta` of `message` carries a `traceparent` (whatever its value).
fn carries_traceparent(message: &Value) -> bool {
    meta_of(message).is_some_and(|meta| meta.contains_key(TRACEPARENT))
}

/// The body to send upstream in place of `body` when its `params._meta` carries a
/// `traceparent`: the same message with `_meta.traceparent` (and `tracestate`) replaced by the
/// values in `headers` — the sidecar's client span, just injected there. `None` (send `body` as
/// it is) when the body names no `traceparent`, is not a JSON object, or `headers` carry none.
pub fn with_hop_context(body: &[u8], headers: &HeaderMap) -> Option<Bytes> {
    // Most bodies never mention it: one scan instead of a parse.
    if !mentions_traceparent(body) {
        return None;
    }
    let traceparent = headers.get(TRACEPARENT_HEADER)?.to_str().ok()?;
    let mut message: Value = serde_json::from_slice(body).ok()?;
    if !carries_traceparent(&message) {
        return None;
    }
    let meta = message
        .get_mut("params")
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut)?;
    meta.insert(TRACEPARENT.into(), Value::String(traceparent.to_owned()));
    match headers.get(TRACESTATE_HEADER).and_then(|v| v.to_str().ok()) {
        Some(state) => {
            meta.insert(TRACESTATE.into(), Value::String(state.to_owned()));
        }
        None => {
            meta.remove(TRACESTATE);
        }
    }
    serde_json::to_vec(&message).ok().map(Bytes::from)
}

/// Whether `body` holds the JSON key `"traceparent"` anywhere (a cheap first look: the parse
/// decides). The searcher is built once: building it is most of the cost of a short body's
/// search.
fn mentions_traceparent(body: &[u8]) -> bool {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"traceparent\""));
    FINDER.find(body).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::json;

    const OURS: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";

    fn hop_headers(state: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(OURS));
        if let Some(state) = state {
            headers.insert(TRACESTATE, HeaderValue::from_str(state).unwrap());
        }
        headers
    }

    fn body(meta: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "greet", "arguments": {"traceparent": "an argument"}, "_meta": meta}
        }))
        .unwrap()
    }

    #[test]
    fn the_header_value_is_the_traceparent_text_and_parses_back() {
        for text in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000001-ffffffffffffffff-00",
        ] {
            let parsed = TraceParent::parse(text).unwrap();
            assert_eq!(parsed.header_value().to_str().unwrap(), text);
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn the_clients_meta_context_is_replaced_by_the_hops() {
        let sent = body(json!({
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "client=1",
            "progressToken": 3
        }));
        let rewritten = with_hop_context(&sent, &hop_headers(Some("lifeguard=1"))).unwrap();
        let message: Value = serde_json::from_slice(&rewritten).unwrap();
        let meta = meta_of(&message).unwrap();
        assert_eq!(meta[TRACEPARENT], OURS);
        assert_eq!(meta[TRACESTATE], "lifeguard=1");
        // Everything else is as the client sent it, the arguments included.
        assert_eq!(meta["progressToken"], 3);
        assert_eq!(message["params"]["arguments"]["traceparent"], "an argument");
        assert_eq!(message["id"], 7);
    }

    #[test]
    fn a_clients_tracestate_does_not_outlive_its_traceparent() {
        let sent = body(json!({"traceparent": "00-aa-bb-01", "tracestate": "client=1"}));
        let rewritten = with_hop_context(&sent, &hop_headers(None)).unwrap();
        let message: Value = serde_json::from_slice(&rewritten).unwrap();
        assert!(!meta_of(&message).unwrap().contains_key(TRACESTATE));
    }

    #[test]
    fn bodies_without_a_meta_traceparent_are_sent_as_they_are() {
        let headers = hop_headers(None);
        // Only in the arguments, not in _meta.
        assert!(with_hop_context(&body(json!({"progressToken": 1})), &headers).is_none());
        assert!(with_hop_context(b"{\"traceparent\": 1", &headers).is_none());
        assert!(with_hop_context(b"[\"traceparent\"]", &headers).is_none());
        // Without a hop context there is nothing to put there.
        let sent = body(json!({"traceparent": "00-aa-bb-01"}));
        assert!(with_hop_context(&sent, &HeaderMap::new()).is_none());
    }

    #[test]
    fn the_meta_carrier_reads_strings_only() {
        let message = json!({"params": {"_meta": {"traceparent": "x", "tracestate": 5}}});
        let meta = meta_of(&message).unwrap();
        let carrier = MetaExtractor(meta);
        assert_eq!(carrier.get(TRACEPARENT), Some("x"));
        assert_eq!(carrier.get(TRACESTATE), None);
        assert!(meta_of(&json!({"params": {"_meta": []}})).is_none());
    }
}
