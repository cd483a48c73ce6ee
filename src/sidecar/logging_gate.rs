//! The deprecated logging surface (`capabilities.logging`): server log messages
//! (`notifications/message`) reach a caller, and a caller's `logging/setLevel` reaches the
//! server, only under `exception` and an Active, verified CapabilityException for `logging`
//! that covers the caller (client, principals, tenants). Under `deny` (the default) log
//! messages are dropped from response streams and `logging/setLevel` is refused.

use axum::response::Response;
use http::StatusCode;

use crate::api::{CapabilityMode, ExceptionCapability};
use crate::audit::Decision;
use crate::exception::gate::{Rejection, covers_caller};
use crate::exception::{ApproverTrust, verify};
use crate::mcp::jsonrpc::ErrorObject;
use crate::model::Owner;
use crate::telemetry::metrics::CapabilityLabels;

use super::active_policy::ActivePolicy;
use super::capability_refusal::structured;
use super::context::RequestContext;
use super::respond;
use super::state::AppState;

/// The method a client sets the server's log level with.
pub const SET_LEVEL: &str = "logging/setLevel";

/// Whether `owner` may see server log messages and set the log level under `policy`.
pub fn logging_allowed(policy: &ActivePolicy, owner: &Owner) -> Result<(), Rejection> {
    if policy.effective.capabilities.logging == CapabilityMode::Deny {
        return Err(Rejection::NoException);
    }
    let empty = ApproverTrust::default();
    let trust = policy.trust.as_ref().unwrap_or(&empty);
    let now = jiff::Timestamp::now();
    let mut best = Rejection::NoException;
    for exception in policy
        .effective
        .exceptions
        .iter()
        .filter(|e| e.spec.capability == ExceptionCapability::Logging)
    {
        let verification = || verify(&exception.spec, &exception.exception.namespace, trust, now);
        match covers_caller(exception, verification, owner) {
            Ok(()) => return Ok(()),
            Err(reason) => best = best.most_specific(reason),
        }
    }
    Err(best)
}

/// Counts a log message dropped from `ctx`'s response stream.
pub fn count_dropped_message(app: &AppState, reason: Rejection) {
    app.metrics
        .capability_decisions
        .get_or_create(&CapabilityLabels {
            capability: "logging",
            decision: "deny",
            reason: reason.as_str(),
            exception: String::new(),
        })
        .inc();
}

/// `logging/setLevel` when the policy does not allow it for the caller: refused with
/// -32601 and HTTP 404, as MCP answers a method that is not available; audited. The
/// structured refusal names the gate's reason, and what to ask for (see
/// [`capability_refusal::structured`](super::capability_refusal::structured)).
pub fn refuse_set_level(app: &AppState, ctx: &RequestContext, reason: Rejection) -> Response {
    count_dropped_message(app, reason);
    app.audit.log(
        ctx.audit("capability.rejected", Decision::Deny, reason.as_str())
            .detail("capability", SET_LEVEL),
    );
    let error = ErrorObject::new(
        crate::mcp::codes::METHOD_NOT_FOUND,
        format!(
            "{SET_LEVEL} is not allowed by the Lifeguard policy {}",
            ctx.policy.name
        ),
    );
    let refusal = structured(
        ExceptionCapability::Logging,
        ctx.policy
            .effective
            .capabilities
            .mode(ExceptionCapability::Logging),
        reason,
        &ctx.policy.name,
    );
    respond::refuse(StatusCode::NOT_FOUND, &ctx.id(), error, &refusal)
}
