//! How a refused capability input request is told to the server: `roots/list` gets an answer
//! that reveals nothing, `sampling/createMessage` cannot be declined (the task or call ends
//! with [`unanswerable_error`]).

use serde_json::{Value, json};

use crate::api::{CapabilityMode, ExceptionCapability};
use crate::exception::gate::{Rejection, capability_key, capability_of};
use crate::mcp::jsonrpc::ErrorObject;

use crate::policy::CapabilityRules;

/// How the server learns that a refused input request will not be answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// An answer that reveals nothing and that the 2026-07-28 schema and the official SDKs
    /// accept: `roots/list` → `{"roots": []}` (no roots shared).
    Answer(Value),
    /// No refusal exists that servers accept (`sampling/createMessage`: the schema has no
    /// error or decline form, and any accepted shape would be made-up model output). The
    /// request cannot go on: a task fails, a synchronous call gets an error. See
    /// docs/interop.md for what was measured.
    Unanswerable,
}

/// The refusal of an input request for `capability_method`.
pub fn refusal(capability_method: &str) -> Refusal {
    match capability_of(capability_method) {
        Some(ExceptionCapability::Roots) => Refusal::Answer(json!({"roots": []})),
        _ => Refusal::Unanswerable,
    }
}

/// The error a request or task ends with when the server asked for a capability the policy
/// refuses and that cannot be declined. `data.method` is the input request's method,
/// `data.capability` the capability to ask an exception for (see [`structured`]).
pub fn unanswerable_error(
    capability_method: &str,
    reason: Rejection,
    capabilities: &CapabilityRules,
    policy_name: &str,
) -> Value {
    let mut error = ErrorObject::new(
        crate::mcp::codes::INTERNAL_ERROR,
        format!(
            "The MCP server asked for {capability_method}, which the Lifeguard policy {policy_name} does not allow"
        ),
    )
    .with_data(json!({"capability": capability_method}));
    if let Some(capability) = capability_of(capability_method) {
        let mode = capabilities.mode(capability);
        error = error.with_refusal(&structured(capability, mode, reason, policy_name));
    }
    error.to_value()
}

/// The structured refusal of a deprecated capability (sampling, roots, logging) for the
/// gate's `reason`: under `exception` mode a CapabilityException for `capability` on `policy`
/// would allow it (`requestException`, with the SEP-2643 envelope naming what to ask for);
/// under `deny` no exception helps, nor when the request carries a credential (no exception
/// ever lets one through): `none`. The reason is the gate's own (`no_exception`,
/// `wrong_client`, `token_budget`, …), the word the audit trail and
/// `lifeguard_capability_decisions_total{reason}` use.
pub fn structured(
    capability: ExceptionCapability,
    mode: CapabilityMode,
    reason: Rejection,
    policy_name: &str,
) -> crate::mcp::refusal::Refusal {
    use crate::mcp::refusal::{Refusal, Remediation};
    let remediable = mode == CapabilityMode::Exception && reason != Rejection::SecretInContext;
    if remediable {
        Refusal::new(
            reason.as_str(),
            Remediation::RequestException {
                capability: capability_key(capability).to_owned(),
            },
        )
        .policy(policy_name)
        .authorization()
    } else {
        Refusal::final_(reason.as_str()).policy(policy_name)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::exception::gate::Rejection;

    fn policy(sampling: CapabilityMode) -> CapabilityRules {
        let mut effective = crate::policy::testing::with_tasks("    enabled: true\n");
        effective.capabilities.sampling = sampling;
        effective.capabilities
    }

    #[test]
    fn roots_are_refused_with_an_empty_list_and_sampling_cannot_be() {
        assert_eq!(refusal("roots/list"), Refusal::Answer(json!({"roots": []})));
        assert_eq!(refusal("sampling/createMessage"), Refusal::Unanswerable);
        let e = unanswerable_error(
            "sampling/createMessage",
            Rejection::NoException,
            &policy(CapabilityMode::Deny),
            "team-a/reports",
        );
        assert_eq!(e["code"], crate::mcp::codes::INTERNAL_ERROR);
        assert!(e["message"].as_str().unwrap().contains("team-a/reports"));
        // Under `deny` no exception helps.
        assert_eq!(
            e["data"],
            json!({"reason": "no_exception", "remediation": "none",
                   "capability": "sampling/createMessage", "policy": "team-a/reports"})
        );
    }

    #[test]
    fn under_exception_mode_the_refusal_says_which_exception_to_ask_for() {
        let e = unanswerable_error(
            "sampling/createMessage",
            Rejection::WrongClient,
            &policy(CapabilityMode::Exception),
            "team-a/reports",
        );
        assert_eq!(
            e["data"],
            json!({
                "reason": "wrong_client",
                "remediation": "requestException",
                "exceptionCapability": "sampling",
                "capability": "sampling/createMessage",
                "policy": "team-a/reports",
                "authorization": {
                    "reason": "insufficient_authorization",
                    "remediationHints": [{"type": "lifeguard.dev/capability-exception",
                        "capability": "sampling", "policy": "team-a/reports"}],
                },
            })
        );
        // No exception lets a credential through.
        let secret = structured(
            ExceptionCapability::Sampling,
            CapabilityMode::Exception,
            Rejection::SecretInContext,
            "team-a/reports",
        );
        assert_eq!(secret.remediation, crate::mcp::refusal::Remediation::None);
        assert!(!secret.authorization);
    }
}
