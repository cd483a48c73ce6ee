//! Refusals a client can act on: the structured `error.data` every refusal Lifeguard originates
//! carries, so a client can tell "retry in 3 s" from "get another token" from "ask for an
//! exception" from "this will never work" without reading an English message.
//!
//! ```json
//! {"reason": "rate_limited", "remediation": "retry", "retryAfterMs": 1200,
//!  "policy": "team-a/reports"}
//! ```
//!
//! - `reason`: stable, snake_case, the same word the audit trail and the
//!   `lifeguard_denials_total{reason}` metric use.
//! - `remediation`: `retry` (with `retryAfterMs`, an integer), `reauthenticate`,
//!   `requestException` (with `exceptionCapability`: what a CapabilityException would grant;
//!   `capability` was already taken by the capability refusals' own `data.capability`, the
//!   input request's method), or `none`.
//! - `policy`: `namespace/name` of the McpServerPolicy that refused, only where naming it tells
//!   the caller nothing it could not know (never on a uniform denial).
//! - `authorization`: for refusals on authorization grounds the client can remedy (a missing
//!   scope, a capability needing an exception), the envelope of the draft MCP proposal for
//!   structured authorization denials (SEP-2643): `reason: "insufficient_authorization"` and
//!   `remediationHints` (a hint of type `lifeguard.dev/capability-exception` names what to
//!   ask for; clients ignore hint types they do not know). Where an HTTP challenge
//!   (`WWW-Authenticate`) is present it stays authoritative, as the proposal says.
//!
//! Pure: the shape only. Which refusal gets which remediation is decided where it is made.

use serde_json::{Map, Value, json};

/// The SEP-2643 hint type naming the capability exception that would allow the request.
pub const CAPABILITY_EXCEPTION_HINT: &str = "lifeguard.dev/capability-exception";

/// What the client can do about a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remediation {
    /// The same request may succeed after `after_ms` milliseconds.
    Retry { after_ms: u64 },
    /// A different token may succeed: a fresh one, or one with more scopes.
    Reauthenticate,
    /// The request needs a CapabilityException for `capability` on the refusing policy.
    RequestException { capability: String },
    /// Nothing the client can change makes this request succeed.
    None,
}

impl Remediation {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Retry { .. } => "retry",
            Self::Reauthenticate => "reauthenticate",
            Self::RequestException { .. } => "requestException",
            Self::None => "none",
        }
    }
}

/// A refusal's structured description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Stable reason (`rate_limited`, `insufficient_scope`, `task_not_found`, …).
    pub reason: &'static str,
    pub remediation: Remediation,
    /// `namespace/name` of the refusing policy, where naming it discloses nothing.
    pub policy: Option<String>,
    /// Whether this is an authorization denial the client can remedy (SEP-2643 envelope).
    pub authorization: bool,
}

impl Refusal {
    pub fn new(reason: &'static str, remediation: Remediation) -> Self {
        Self {
            reason,
            remediation,
            policy: None,
            authorization: false,
        }
    }

    /// A refusal nothing the client does can change, and that names nothing.
    pub fn final_(reason: &'static str) -> Self {
        Self::new(reason, Remediation::None)
    }

    /// Names the refusing policy.
    pub fn policy(mut self, policy: impl Into<String>) -> Self {
        self.policy = Some(policy.into());
        self
    }

    /// Marks the refusal as an authorization denial (SEP-2643 envelope).
    pub fn authorization(mut self) -> Self {
        self.authorization = true;
        self
    }

    /// Whole seconds for `Retry-After` (rounded up), when the remediation is to retry.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.remediation {
            Remediation::Retry { after_ms } => Some(after_ms.div_ceil(1000).max(1)),
            _ => None,
        }
    }

    /// The `error.data` members.
    pub fn data(&self) -> Map<String, Value> {
        let mut data = Map::new();
        data.insert("reason".into(), json!(self.reason));
        data.insert("remediation".into(), json!(self.remediation.as_str()));
        match &self.remediation {
            Remediation::Retry { after_ms } => {
                data.insert("retryAfterMs".into(), json!(after_ms));
            }
            Remediation::RequestException { capability } => {
                data.insert("exceptionCapability".into(), json!(capability));
            }
            Remediation::Reauthenticate | Remediation::None => {}
        }
        if let Some(policy) = &self.policy {
            data.insert("policy".into(), json!(policy));
        }
        if self.authorization {
            let mut envelope = json!({"reason": "insufficient_authorization"});
            if let Remediation::RequestException { capability } = &self.remediation {
                let mut hint = json!({"type": CAPABILITY_EXCEPTION_HINT, "capability": capability});
                if let Some(policy) = &self.policy {
                    hint["policy"] = json!(policy);
                }
                envelope["remediationHints"] = json!([hint]);
            }
            data.insert("authorization".into(), envelope);
        }
        data
    }

    /// `existing` (an error's `data`, if any) with this refusal's members added; members
    /// already there are kept (an object) or the old value moves under `detail` (anything else).
    pub fn merged_into(&self, existing: Option<Value>) -> Value {
        let mut data = self.data();
        match existing {
            Some(Value::Object(old)) => {
                for (key, value) in old {
                    data.entry(key).or_insert(value);
                }
            }
            Some(other) => {
                data.insert("detail".into(), other);
            }
            None => {}
        }
        Value::Object(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limit_says_when_to_retry_in_milliseconds_and_whole_seconds() {
        let refusal = Refusal::new("rate_limited", Remediation::Retry { after_ms: 1200 })
            .policy("team-a/reports");
        assert_eq!(
            Value::Object(refusal.data()),
            json!({"reason": "rate_limited", "remediation": "retry", "retryAfterMs": 1200,
                   "policy": "team-a/reports"})
        );
        assert_eq!(refusal.retry_after_secs(), Some(2));
        let soon = Refusal::new("rate_limited", Remediation::Retry { after_ms: 1 });
        assert_eq!(soon.retry_after_secs(), Some(1));
        let exact = Refusal::new("rate_limited", Remediation::Retry { after_ms: 3000 });
        assert_eq!(exact.retry_after_secs(), Some(3));
    }

    #[test]
    fn a_capability_refusal_names_the_exception_to_ask_for_in_the_sep_2643_envelope() {
        let refusal = Refusal::new(
            "capability_denied",
            Remediation::RequestException {
                capability: "sampling".into(),
            },
        )
        .policy("team-a/reports")
        .authorization();
        assert_eq!(
            Value::Object(refusal.data()),
            json!({
                "reason": "capability_denied",
                "remediation": "requestException",
                "exceptionCapability": "sampling",
                "policy": "team-a/reports",
                "authorization": {
                    "reason": "insufficient_authorization",
                    "remediationHints": [{"type": CAPABILITY_EXCEPTION_HINT,
                        "capability": "sampling", "policy": "team-a/reports"}],
                },
            })
        );
        assert_eq!(refusal.retry_after_secs(), None);
    }

    #[test]
    fn a_final_refusal_names_nothing() {
        assert_eq!(
            Value::Object(Refusal::final_("task_not_found").data()),
            json!({"reason": "task_not_found", "remediation": "none"})
        );
    }

    #[test]
    fn existing_data_is_kept_beside_the_refusal() {
        let refusal = Refusal::new("policy_loading", Remediation::Retry { after_ms: 1000 });
        assert_eq!(
            refusal.merged_into(Some(json!({"retryable": true, "reason": "other"}))),
            json!({"reason": "policy_loading", "remediation": "retry", "retryAfterMs": 1000,
                   "retryable": true})
        );
        assert_eq!(
            refusal.merged_into(Some(json!("text")))["detail"],
            json!("text")
        );
    }
}
