//! How a refused capability input request is told to the server: `roots/list` gets an answer
//! that reveals nothing, `sampling/createMessage` cannot be declined (the task or call ends
//! with [`unanswerable_error`]).

use serde_json::{Value, json};

use crate::api::ExceptionCapability;
use crate::exception::gate::{Rejection, capability_of};

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
/// refuses and that cannot be declined.
pub fn unanswerable_error(capability_method: &str, reason: Rejection, policy_name: &str) -> Value {
    json!({
        "code": crate::mcp::codes::INTERNAL_ERROR,
        "message": format!(
            "The MCP server asked for {capability_method}, which the Lifeguard policy {policy_name} does not allow"
        ),
        "data": {
            "capability": capability_method,
            "reason": reason.as_str(),
            "policy": policy_name,
        },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::exception::gate::Rejection;

    #[test]
    fn roots_are_refused_with_an_empty_list_and_sampling_cannot_be() {
        assert_eq!(refusal("roots/list"), Refusal::Answer(json!({"roots": []})));
        assert_eq!(refusal("sampling/createMessage"), Refusal::Unanswerable);
        let e = unanswerable_error(
            "sampling/createMessage",
            Rejection::NoException,
            "team-a/reports",
        );
        assert_eq!(e["code"], crate::mcp::codes::INTERNAL_ERROR);
        assert_eq!(e["data"]["reason"], "no_exception");
        assert!(e["message"].as_str().unwrap().contains("team-a/reports"));
    }
}
