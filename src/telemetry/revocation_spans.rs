//! The spans of a revocation's trace, from where the revocation enters Lifeguard to every
//! sidecar that applies it:
//!
//! - `lifeguard.revocation` (operator): a security event recorded as a PrincipalRevocation (a
//!   child of the push request's span), or the first sight of one a person applied (a new
//!   trace). Its context is what travels: the W3C `traceparent` of this span.
//! - `lifeguard.revocation.distribute` (operator, producer): a snapshot carrying the revocation
//!   sent to one sidecar.
//! - `lifeguard.revocation.apply` (sidecar): the revocation applied; the `tasks/cancel`
//!   requests it sends upstream are its children.
//! - `lifeguard.revocation.propagated` (operator): the last targeted sidecar acknowledged.
//!
//! The context crosses processes as a `traceparent` string (on the object and in the
//! snapshot), never as anything the receiver trusts beyond linking spans: [`TraceParent`]
//! parses it strictly and a value that does not parse is ignored.
//!
//! Every function returns [`tracing::Span::none`] and does nothing when spans are not exported
//! ([`super::otel::exporting`]). Attributes name the revocation (its object name) and its reason,
//! never the principal it revokes.

use opentelemetry::trace::TraceContextExt;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::otel::exporting;
pub use super::trace_context::TraceParent;

/// The `traceparent` naming `span` (with its sampling decision), for the object and the
/// snapshot; `None` when `span` is not exported.
pub fn traceparent_of(span: &Span) -> Option<String> {
    if span.is_none() {
        return None;
    }
    TraceParent::of(span.context().span().span_context()).map(|t| t.to_string())
}

/// The parent of a span about to be made in another process's trace: `None` (and no span is
/// made, not even a root) when spans are not exported or `traceparent` does not parse.
fn remote_parent(traceparent: &str) -> Option<TraceParent> {
    exporting()
        .then(|| TraceParent::parse(traceparent))
        .flatten()
}

/// Makes the just-created `span` a child of the span `parent` names.
fn continue_trace(span: Span, parent: TraceParent) -> Span {
    // Cannot fail: the span was just made and the layer is installed whenever spans are
    // exported.
    let _ = span.set_parent(parent.context());
    span
}

/// `lifeguard.revocation` for a revocation a security event asks for: a child of the current
/// span (the push request's, or none for a poll, which then starts a trace).
pub fn received(name: &str, reason: &str) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(
        target: "lifeguard::revocation",
        "lifeguard.revocation",
        otel.kind = "internal",
        otel.status_code = Empty,
        lifeguard.revocation.name = %name,
        lifeguard.revocation.reason = %reason,
        lifeguard.revocation.source = "securityEvent",
        lifeguard.revocation.outcome = Empty,
    )
}

/// Records on a [`received`] span whether the object was `created` or already `existed` (a
/// redelivery), or that recording it failed.
pub fn recorded(span: &Span, outcome: &'static str, failed: bool) {
    if span.is_none() {
        return;
    }
    span.record("lifeguard.revocation.outcome", outcome);
    if failed {
        span.record("otel.status_code", "ERROR");
    }
}

/// `lifeguard.revocation` for a revocation the operator found without a trace (a person
/// applied it): the root of a new trace, sampled as the configured sampler decides.
pub fn started(name: &str, reason: &str) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(
        target: "lifeguard::revocation",
        parent: None,
        "lifeguard.revocation",
        otel.kind = "internal",
        otel.status_code = Empty,
        lifeguard.revocation.name = %name,
        lifeguard.revocation.reason = %reason,
        lifeguard.revocation.source = "object",
        lifeguard.revocation.annotated = Empty,
    )
}

/// Records on a [`started`] span whether the operator wrote its `traceparent` onto the object.
pub fn annotated(span: &Span, written: bool) {
    if !span.is_none() {
        span.record("lifeguard.revocation.annotated", written);
    }
}

/// `lifeguard.revocation.distribute`: the snapshot `version` carrying revocation `name` sent to
/// the sidecar of pod `namespace/pod`, in the trace `traceparent` names (none when it does not
/// parse). It ends when dropped: it marks the moment, it does not time the write.
pub fn distributed(
    name: &str,
    traceparent: &str,
    namespace: &str,
    pod: &str,
    version: u64,
) -> Span {
    let Some(parent) = remote_parent(traceparent) else {
        return Span::none();
    };
    let span = tracing::info_span!(
        target: "lifeguard::revocation",
        parent: None,
        "lifeguard.revocation.distribute",
        otel.kind = "producer",
        lifeguard.revocation.name = %name,
        lifeguard.snapshot.version = version,
        k8s.namespace.name = %namespace,
        k8s.pod.name = %pod,
    );
    continue_trace(span, parent)
}

/// `lifeguard.revocation.apply`: the sidecar applying revocation `name`, in the trace
/// `traceparent` names; none without one (or when it does not parse). Run the application
/// inside it, so the requests it sends upstream are its children.
pub fn apply(name: &str, traceparent: Option<&str>) -> Span {
    let Some(parent) = traceparent.and_then(remote_parent) else {
        return Span::none();
    };
    let span = tracing::info_span!(
        target: "lifeguard::revocation",
        parent: None,
        "lifeguard.revocation.apply",
        otel.kind = "internal",
        otel.status_code = Empty,
        lifeguard.revocation.name = %name,
        lifeguard.revocation.tasks_cancelled = Empty,
        lifeguard.revocation.streams_closed = Empty,
    );
    continue_trace(span, parent)
}

/// Records what applying the revocation did on its [`apply`] span; `None`: the application
/// failed and is tried again (in a span of its own).
pub fn applied(span: &Span, counts: Option<(u64, u64)>) {
    if span.is_none() {
        return;
    }
    match counts {
        Some((tasks, streams)) => {
            span.record("lifeguard.revocation.tasks_cancelled", tasks);
            span.record("lifeguard.revocation.streams_closed", streams);
        }
        None => {
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// What the operator recorded when the last targeted sidecar acknowledged a revocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Propagated {
    pub propagation_millis: i64,
    pub target_sidecars: i64,
    pub acknowledged_sidecars: i64,
    pub tasks_cancelled: i64,
}

/// `lifeguard.revocation.propagated`: revocation `name` reached every targeted sidecar (the
/// status's `completedAt`), in the trace `traceparent` names. A point in time, with the
/// propagation time status records.
pub fn propagated(name: &str, traceparent: &str, done: Propagated) {
    let Some(parent) = remote_parent(traceparent) else {
        return;
    };
    let span = tracing::info_span!(
        target: "lifeguard::revocation",
        parent: None,
        "lifeguard.revocation.propagated",
        otel.kind = "internal",
        lifeguard.revocation.name = %name,
        lifeguard.revocation.propagation_ms = done.propagation_millis,
        lifeguard.revocation.target_sidecars = done.target_sidecars,
        lifeguard.revocation.acknowledged_sidecars = done.acknowledged_sidecars,
        lifeguard.revocation.tasks_cancelled = done.tasks_cancelled,
    );
    drop(continue_trace(span, parent));
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_version_00_traceparent_parses_and_prints_back_as_it_was() {
        let parsed = TraceParent::parse(VALID).expect("valid");
        assert_eq!(parsed.to_string(), VALID);
        assert_eq!(parsed.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.span_id(), "00f067aa0ba902b7");
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(
            TraceParent::parse(unsampled).unwrap().to_string(),
            unsampled
        );
    }

    #[test]
    fn anything_else_is_ignored() {
        for value in [
            "",
            "garbage",
            // Upper case, another version, the reserved version, surrounding text.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            // Wrong lengths, non-hex digits.
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // All-zero IDs name no span.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            assert_eq!(TraceParent::parse(value), None, "{value:?} parsed");
        }
    }

    #[test]
    fn the_otel_context_names_the_same_span_as_a_remote_parent() {
        let parsed = TraceParent::parse(VALID).unwrap();
        let context = parsed.context();
        let span = context.span();
        let remote = span.span_context();
        assert!(remote.is_remote() && remote.is_sampled());
        assert_eq!(TraceParent::of(remote), Some(parsed));
    }

    #[test]
    fn without_export_no_span_is_made_and_nothing_travels() {
        // No OTel pipeline is installed in unit tests: exporting() is false.
        assert!(received("r", "sessionRevoked").is_none());
        assert!(started("r", "adminAction").is_none());
        assert!(apply("r", Some(VALID)).is_none());
        assert!(distributed("r", VALID, "ns", "pod", 1).is_none());
        assert_eq!(traceparent_of(&Span::none()), None);
    }
}
