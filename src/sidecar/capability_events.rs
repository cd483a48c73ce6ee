//! The audit lines of the capability gate: each decision (`capability.requested`, then
//! `capability.allowed` or `capability.rejected`), a client's answer on its way to the server
//! (`capability.answered`) and an allowance whose task ended unanswered (`capability.lapsed`).
//! Requests and answers appear only as size and SHA-256, never their text.

use serde_json::{Value, json};

use crate::api::ExceptionCapability;
use crate::audit::{AuditEvent, Decision, summarize};

use super::capability::{Carrier, Lapsed, Verdict};

pub(super) fn audit_events(
    carrier: &Carrier<'_>,
    capability: ExceptionCapability,
    params: &Value,
    verdict: &Verdict,
) -> Vec<AuditEvent> {
    let name = crate::exception::gate::capability_key(capability);
    let base = |event: &'static str, decision: Decision, reason: &'static str| {
        AuditEvent::new(
            event,
            carrier.correlation_id,
            carrier.policy,
            decision,
            reason,
        )
        .owner(carrier.owner)
        .detail("capability", name)
    };
    let requested = base("capability.requested", Decision::Record, "input_request")
        .detail("request", summarize(params));
    let outcome = match verdict {
        Verdict::Allowed {
            exception,
            approval_id,
            model_route,
            expires_at,
            budget_left,
            ..
        } => base("capability.allowed", Decision::Allow, "exception")
            .detail("exception", exception.to_string())
            .detail("approvalId", approval_id.clone())
            .detail("modelRoute", json!(model_route))
            .detail("exceptionExpiresAt", expires_at.clone())
            .detail(
                "budgetLeft",
                match budget_left {
                    Some(left) => {
                        let mut value =
                            json!({"iterations": left.iterations, "perMinute": left.per_minute});
                        if let Some(cost) = left.cost_units {
                            value["costUnits"] = json!(cost);
                        }
                        value
                    }
                    None => Value::Null,
                },
            ),
        Verdict::Rejected(reason) => base("capability.rejected", Decision::Deny, reason.as_str()),
    };
    vec![requested, outcome]
}

/// `capability.answered`: a client's answer to an allowed input request is on its way to the
/// server. The answer itself never appears: its size and SHA-256 do, with the allowance it
/// answers (exception, approval, model route, expiry), so a reviewer can match what the model
/// said to what was approved.
pub fn answered_event(
    base: AuditEvent,
    allowance: &Verdict,
    capability_method: &str,
    answer: &Value,
) -> Option<AuditEvent> {
    let Verdict::Allowed {
        exception,
        approval_id,
        model_route,
        expires_at,
        ..
    } = allowance
    else {
        return None;
    };
    Some(
        base.detail("capability", capability_method)
            .detail("exception", exception.to_string())
            .detail("approvalId", approval_id.clone())
            .detail("modelRoute", json!(model_route))
            .detail("exceptionExpiresAt", expires_at.clone())
            .detail("answer", summarize(answer)),
    )
}

/// `capability.lapsed`: an allowed input request whose task ended (`end_reason`) before any
/// answer reached the server. Names the allowance it was given, like `capability.answered`.
pub fn lapsed_event(base: AuditEvent, lapsed: &Lapsed, end_reason: &str) -> Option<AuditEvent> {
    let Verdict::Allowed {
        exception,
        approval_id,
        model_route,
        expires_at,
        ..
    } = &lapsed.allowance
    else {
        return None;
    };
    Some(
        base.detail("inputKey", lapsed.key.clone())
            .detail("exception", exception.to_string())
            .detail("approvalId", approval_id.clone())
            .detail("modelRoute", json!(model_route))
            .detail("exceptionExpiresAt", expires_at.clone())
            .detail("endReason", end_reason.to_owned()),
    )
}
