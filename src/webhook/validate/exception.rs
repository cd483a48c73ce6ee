//! CapabilityException: the approver's signature and binding, checked with the verification
//! code the operator and the sidecar run ([`crate::exception::verify`]).

use std::sync::Arc;

use jiff::Timestamp;

use crate::api::{CapabilityException, ExceptionState, McpServerPolicy};
use crate::exception::{ApproverKeys, verify};
use crate::policy::problem::{Problems, Severity};
use crate::policy::validate as compiler;

use super::{Findings, Verdict, reasons};

/// Denies an exception whose signature is malformed, does not verify, names an unknown or
/// revoked key, belongs to a revoked approval or is bound to another namespace or policy, or
/// that the compiler refuses; denies every exception while the webhook has no usable approver
/// keys (fail closed). Warns when the policy it names does not exist, when it has expired or
/// is not yet valid, and when it is valid for more than 90 days. On an UPDATE that leaves the
/// spec unchanged the denials are warnings (the request introduces none of them).
///
/// `namespace` is the request's; `policies_in_namespace` are the McpServerPolicies there.
pub fn validate_exception(
    new: &CapabilityException,
    old: Option<&CapabilityException>,
    namespace: &str,
    keys: &ApproverKeys,
    policies_in_namespace: &[Arc<McpServerPolicy>],
    now: Timestamp,
) -> Verdict {
    let mut findings = Findings::default();
    match keys {
        ApproverKeys::Missing => findings.deny(
            reasons::NO_APPROVER_KEYS,
            "spec.signature: approver keys: the webhook has no approver keys (the approverKeys Secret or its key is missing), so no signature can be verified and every CapabilityException is refused (fail closed)",
        ),
        ApproverKeys::Unusable(why) => findings.deny(
            reasons::NO_APPROVER_KEYS,
            format!(
                "spec.signature: approver keys: the webhook's approver keys are unusable ({why}), so no signature can be verified and every CapabilityException is refused (fail closed)"
            ),
        ),
        ApproverKeys::Loaded { trust, .. } => {
            let v = verify(&new.spec, namespace, trust, now);
            match v.state {
                ExceptionState::Invalid => {
                    if let Some((check, why)) = v
                        .checks
                        .iter()
                        .find_map(|c| c.result.as_ref().err().map(|e| (c.check, e)))
                    {
                        findings.deny(
                            signature_reason(check, v.reason),
                            format!("spec.signature: {check}: {why}"),
                        );
                    }
                }
                ExceptionState::NotYetValid => findings.warn(
                    reasons::NOT_YET_VALID,
                    format!(
                        "spec.notBefore: the exception is not valid before {}; it grants nothing until then",
                        new.spec.not_before.0
                    ),
                ),
                ExceptionState::Expired => findings.warn(
                    reasons::EXPIRED,
                    format!(
                        "spec.expiresAt: the exception expired at {}; it grants nothing",
                        new.spec.expires_at.0
                    ),
                ),
                ExceptionState::Active => {}
            }
        }
    }

    let mut problems = Problems::new();
    compiler::validate_exception(new, &mut problems);
    // `verify` reports the signature's structure with its own label.
    for problem in problems
        .into_vec()
        .into_iter()
        .filter(|p| p.path != "spec.signature")
    {
        let message = format!("{}: {}", problem.path, problem.message);
        match problem.severity {
            Severity::Error => findings.deny(reasons::INVALID_SPEC, message),
            // The compiler's only warning on `spec.expiresAt` is the 90-day one.
            Severity::Warning if problem.path == "spec.expiresAt" => {
                findings.warn(reasons::LONG_VALIDITY, message)
            }
            Severity::Warning => findings.warn(reasons::SPEC_WARNING, message),
        }
    }

    let policy = new.spec.policy_ref.name.as_str();
    if !policies_in_namespace
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some(policy))
    {
        findings.warn(
            reasons::POLICY_MISSING,
            format!(
                "spec.policyRef.name: no McpServerPolicy `{policy}` in namespace `{namespace}`; the exception stays Invalid (PolicyNotFound) until one exists"
            ),
        );
    }

    let unchanged = old.is_some_and(|old| old.spec == new.spec);
    findings.introduced_unless(unchanged).verdict()
}

/// The label of a failed signature check: `check` is the first failed check's name, `code`
/// [`crate::exception::Verification::reason`].
fn signature_reason(check: &str, code: &str) -> &'static str {
    match (check, code) {
        ("structure", _) => reasons::BAD_STRUCTURE,
        (_, "unknown_key") => reasons::UNKNOWN_KEY,
        (_, "key_revoked") => reasons::REVOKED_KEY,
        (_, "approval_revoked") => reasons::REVOKED_APPROVAL,
        (_, "wrong_server") => reasons::BINDING_MISMATCH,
        _ => reasons::BAD_SIGNATURE,
    }
}
