//! What can go wrong inside the sidecar while it serves a request, and the one place each
//! failure becomes a client-visible JSON-RPC error, an HTTP status and a metric label.
//!
//! Denials (a caller refused by policy) are not errors: they have their own answers
//! (`respond::task_not_found`, `respond::unauthorized`, …). These are failures of the sidecar,
//! its ledger or the protected server. Internal detail goes to the log, never to the client.

use axum::response::Response;
use http::StatusCode;
use serde_json::Value;

use crate::ledger::LedgerError;
use crate::mcp::codes;
use crate::mcp::jsonrpc::{ErrorObject, error_message};
use crate::mcp::refusal::{Refusal, Remediation};
use crate::model::ModelError;
use crate::telemetry::metrics::{ReasonLabels, SidecarMetrics};

use super::respond;
use super::upstream::UpstreamError;

/// The answer while the ledger's database is out of reach (an outage or failover).
pub const LEDGER_UNAVAILABLE: &str = "The task ledger is unavailable; retry shortly";

/// The answer when the server accepted a task the ledger then could not record: the sidecar
/// cancelled it at the server, which may have started its work, so a blind retry may repeat it.
pub const NOT_RECORDED: &str = "The task could not be recorded, so it was cancelled at the MCP server, which may have \
     started its work";

/// A failure while serving one request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("task ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The server accepted a task but the ledger could not record it, so the sidecar cancelled
    /// it at the server. Not retryable as such: the server may have started its work.
    #[error("the task could not be recorded (cancelled at the server): {0}")]
    NotRecorded(LedgerError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("the MCP server's answer is not JSON")]
    NotJson,
    #[error("the MCP server returned a response that is not JSON-RPC")]
    NotJsonRpc,
    #[error("the MCP server's answer is not the response to this request")]
    ResponseMismatch,
    #[error("the MCP server's event stream broke its size bounds")]
    StreamTooLarge,
    #[error("the MCP server answered with a task ID recorded for another owner")]
    UpstreamTaskTaken,
    #[error("the audit trail cannot be written")]
    AuditUnavailable,
    #[error("the MCP server returned a malformed task")]
    MalformedTask,
    #[error("the MCP server answered with a task, which this request may not create")]
    UnexpectedTask,
    #[error("the MCP server asked for a capability this policy does not allow")]
    CapabilityNotAllowed,
    #[error("the MCP server did not open a stream")]
    NoStream,
    #[error("the MCP server did not acknowledge the subscription")]
    NoAcknowledgement,
}

impl Error {
    /// The HTTP status of the answer when the error is the whole response.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Ledger(e) | Self::NotRecorded(e) if e.is_unavailable() => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Ledger(_) | Self::NotRecorded(_) | Self::Model(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Self::AuditUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// What the client is told: generic for the sidecar's own failures, precise about what the
    /// server did wrong.
    pub fn error_object(&self) -> ErrorObject {
        let message = match self {
            Self::Ledger(e) if e.is_unavailable() => LEDGER_UNAVAILABLE,
            Self::Ledger(_) | Self::Model(_) => "Internal error",
            Self::NotRecorded(_) => NOT_RECORDED,
            Self::Upstream(_) => "The MCP server is unavailable",
            Self::NotJson => "The MCP server's answer is not JSON",
            Self::NotJsonRpc => "The MCP server returned a response that is not JSON-RPC",
            Self::ResponseMismatch => "The MCP server's answer does not match the request",
            Self::StreamTooLarge => "The MCP server's answer is too large",
            Self::UpstreamTaskTaken => "The MCP server returned a task that cannot be used",
            Self::AuditUnavailable => {
                "The audit trail cannot be written; new tasks are refused until it recovers"
            }
            Self::MalformedTask => "The MCP server returned a malformed task",
            Self::UnexpectedTask => {
                "The MCP server answered with a task, which this request may not create"
            }
            Self::CapabilityNotAllowed => {
                "The MCP server asked for a capability this policy does not allow"
            }
            Self::NoStream => "The MCP server did not open a stream",
            Self::NoAcknowledgement => "The MCP server did not acknowledge the subscription",
        };
        let error = ErrorObject::new(codes::INTERNAL_ERROR, message);
        let error = if self.retryable() {
            error.with_data(serde_json::json!({"retryable": true}))
        } else {
            error
        };
        error.with_refusal(&self.refusal())
    }

    /// The structured refusal (`error.data`): a stable reason, and `retry` only where the same
    /// request may pass shortly without repeating work (the ledger out of reach before anything
    /// reached the server, the audit trail not writable). Every other failure is `none`: the
    /// server may have started the work, so Lifeguard cannot say a retry is safe. Never names
    /// the policy (a failure, not a policy decision) and says nothing internal.
    pub fn refusal(&self) -> Refusal {
        let retry = |reason| {
            Refusal::new(
                reason,
                Remediation::Retry {
                    after_ms: respond::RETRY_SHORTLY_MS,
                },
            )
        };
        match self {
            Self::Ledger(e) if e.is_unavailable() => retry("ledger_unavailable"),
            Self::AuditUnavailable => retry("audit_unavailable"),
            Self::Ledger(_) | Self::Model(_) => Refusal::final_("internal_error"),
            Self::NotRecorded(_) => Refusal::final_("task_not_recorded"),
            other => Refusal::final_(other.metric_label()),
        }
    }

    /// Whether the same request may succeed shortly because the ledger is back: the answer then
    /// carries `error.data.retryable: true` (beside the structured refusal, which says `retry`).
    pub fn retryable(&self) -> bool {
        matches!(self, Self::Ledger(e) if e.is_unavailable())
    }

    /// Bounded label for the `errors` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Ledger(e) | Self::NotRecorded(e) => e.metric_label(),
            Self::Model(ModelError::Random(_)) => "random",
            Self::Upstream(UpstreamError::Timeout(_)) => "upstream_timeout",
            Self::Upstream(UpstreamError::Unreachable(_)) => "upstream_unreachable",
            Self::Upstream(UpstreamError::BadResponse(_)) => "upstream_bad_response",
            Self::NotJson => "upstream_not_json",
            Self::NotJsonRpc => "upstream_not_json_rpc",
            Self::ResponseMismatch => "upstream_response_mismatch",
            Self::StreamTooLarge => "upstream_stream_too_large",
            Self::UpstreamTaskTaken => "upstream_task_taken",
            Self::AuditUnavailable => "audit_unavailable",
            Self::MalformedTask => "upstream_malformed_task",
            Self::UnexpectedTask => "upstream_unexpected_task",
            Self::CapabilityNotAllowed => "capability_not_allowed",
            Self::NoStream => "upstream_no_stream",
            Self::NoAcknowledgement => "upstream_no_acknowledgement",
        }
    }

    /// The error as a JSON-RPC response message answering `id` (for answers that travel
    /// inside a stream, or are rewritten in place). Logged and counted.
    pub fn message(&self, metrics: &SidecarMetrics, id: &Value) -> Value {
        self.record(metrics);
        error_message(id, &self.error_object())
    }

    /// The error as the whole HTTP response to the request with `id`. Logged and counted.
    pub fn respond(&self, metrics: &SidecarMetrics, id: &Value) -> Response {
        self.record(metrics);
        let mut response = respond::rpc_error(self.http_status(), id, &self.error_object());
        respond::set_retry_after(&mut response, &self.refusal());
        response
    }

    fn record(&self, metrics: &SidecarMetrics) {
        match self {
            Self::Ledger(e) if e.is_unavailable() => {
                tracing::warn!(error = %self, "request failed")
            }
            Self::Ledger(_) | Self::NotRecorded(_) | Self::Model(_) => {
                tracing::error!(error = %self, "request failed")
            }
            _ => tracing::warn!(error = %self, "request failed"),
        }
        metrics
            .errors
            .get_or_create(&ReasonLabels {
                reason: self.metric_label(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn internal_failures_are_generic_and_server_failures_are_bad_gateway() {
        let ledger = Error::from(LedgerError::Closed);
        assert_eq!(ledger.http_status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(ledger.error_object().message, "Internal error");
        assert_eq!(ledger.metric_label(), "closed");

        assert_eq!(
            ledger.error_object().data,
            Some(serde_json::json!({"reason": "internal_error", "remediation": "none"}))
        );

        let outage = Error::from(LedgerError::unavailable(
            "get a ledger database connection",
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ));
        assert_eq!(outage.http_status(), StatusCode::SERVICE_UNAVAILABLE);
        let object = outage.error_object();
        assert_eq!(object.message, LEDGER_UNAVAILABLE);
        assert_eq!(
            object.data,
            Some(
                serde_json::json!({"retryable": true, "reason": "ledger_unavailable",
                                    "remediation": "retry", "retryAfterMs": 1000})
            )
        );
        assert_eq!(outage.metric_label(), "unavailable");
        let response = outage.respond(&SidecarMetrics::new(), &serde_json::json!(1));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");

        // After the server accepted the task: unavailable still, but not "retry shortly".
        let lost = Error::NotRecorded(LedgerError::unavailable(
            "confirm",
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        ));
        assert_eq!(lost.http_status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(lost.error_object().message, NOT_RECORDED);
        let data = lost.error_object().data.unwrap();
        assert_eq!(data["reason"], "task_not_recorded");
        assert_eq!(data["remediation"], "none");
        assert!(data.get("retryable").is_none() && data.get("retryAfterMs").is_none());
        let response = lost.respond(&SidecarMetrics::new(), &serde_json::json!(1));
        assert!(response.headers().get(http::header::RETRY_AFTER).is_none());

        let timeout = Error::from(UpstreamError::Timeout(Duration::from_secs(1)));
        assert_eq!(timeout.http_status(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            timeout.error_object().message,
            "The MCP server is unavailable"
        );
        assert_eq!(timeout.metric_label(), "upstream_timeout");
        assert_eq!(
            timeout.error_object().data,
            Some(serde_json::json!({"reason": "upstream_timeout", "remediation": "none"}))
        );

        // The audit trail not writable: retry, and the header agrees.
        let audit = Error::AuditUnavailable;
        assert_eq!(audit.error_object().data.unwrap()["retryAfterMs"], 1000);
        let response = audit.respond(&SidecarMetrics::new(), &serde_json::json!(1));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");

        let metrics = SidecarMetrics::new();
        let message = Error::MalformedTask.message(&metrics, &serde_json::json!(7));
        assert_eq!(message["id"], 7);
        assert_eq!(message["error"]["code"], codes::INTERNAL_ERROR);
        assert!(
            metrics
                .encode()
                .contains("lifeguard_errors_total{reason=\"upstream_malformed_task\"} 1")
        );
    }
}
