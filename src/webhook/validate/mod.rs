//! Validating admission for McpServerPolicy, CapabilityException and PrincipalRevocation:
//! the checks CEL cannot express.
//!
//! Every check is a pure function over the admitted object, the object it replaces (on UPDATE)
//! and a read-only [`ClusterView`] the server fills from its watch caches; each returns a
//! [`Verdict`]. [`validate_request`] deserializes an AdmissionReview's objects and routes them.
//!
//! - [`validate_exception`]: the approver's signature, verified by [`crate::exception::verify`]
//!   (the code the operator and the sidecar run), plus the compiler's per-object checks.
//! - [`validate_policy`]: the policy compiler ([`crate::policy::compile()`], as `lifeguard policy
//!   check` runs it), the selector's syntax, and selectors that overlap another policy's
//!   ([`selectors_overlap`]).
//! - [`validate_revocation`]: the compiler's checks plus cut-off and expiry sanity.
//!
//! # Rules shared by every check
//!
//! - **Only what a request introduces is denied.** On an UPDATE that leaves the checked part
//!   unchanged (the spec of an exception or revocation, a policy's spec or selector, an overlap
//!   that the old selector already had) a failed check is a warning instead of a denial, so
//!   labels, annotations and finalizers of an object that has since become invalid (a revoked
//!   approver key, a new overlapping policy) can still be edited and the object deleted. Those
//!   objects are already reported by the operator (status conditions); the webhook's job is to
//!   stop new mistakes at the door.
//! - **Without usable approver keys, exceptions are denied (fail closed).** When the configured
//!   Secret is missing, lacks the key, or holds no usable JWKS, the webhook cannot tell a
//!   genuine approval from a forged one; it denies every CapabilityException it would have to
//!   verify (reason `no_approver_keys`) rather than admit unverified grants. The operator would
//!   mark them `Invalid` (`NoTrustedKeys`) anyway, so nothing that could take effect is refused.
//! - **Messages name the check and what is wrong**, prefixed with the field path; a denial
//!   lists every failed check, separated by `; `.
//! - **[`Verdict::reason`] is a bounded metric label** (see [`reasons`]): the first denial's
//!   label when denied; otherwise the first warning's label, or `ok`.

mod exception;
mod policy;
mod revocation;
mod selector;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{CapabilityException, McpServerPolicy, PrincipalRevocation};
use crate::exception::ApproverKeys;

pub use exception::validate_exception;
pub use policy::validate_policy;
pub use revocation::{CLOCK_SKEW, LONGEST_TOKEN_LIFETIME, validate_revocation};
pub use selector::{overlap_witness, selector_problems, selectors_overlap};

/// The bounded set of [`Verdict::reason`] labels.
pub mod reasons {
    /// Allowed with no warning.
    pub const OK: &str = "ok";
    /// DELETE or CONNECT: nothing to validate.
    pub const IGNORED_OPERATION: &str = "ignored_operation";
    /// A kind this webhook does not validate (a misconfigured webhook rule).
    pub const UNSUPPORTED_KIND: &str = "unsupported_kind";
    /// An operation other than CREATE, UPDATE, DELETE or CONNECT.
    pub const UNSUPPORTED_OPERATION: &str = "unsupported_operation";
    /// The object does not deserialize, lacks a namespace, or its signature is not a
    /// well-formed detached JWS.
    pub const BAD_STRUCTURE: &str = "bad_structure";
    /// An error of the policy compiler (the same as `lifeguard policy check` reports).
    pub const INVALID_SPEC: &str = "invalid_spec";
    /// A warning of the policy compiler.
    pub const SPEC_WARNING: &str = "spec_warning";
    /// The webhook has no usable approver keys.
    pub const NO_APPROVER_KEYS: &str = "no_approver_keys";
    /// The signature does not verify over the grant.
    pub const BAD_SIGNATURE: &str = "bad_signature";
    /// The signature's `kid` is not a trusted approver key.
    pub const UNKNOWN_KEY: &str = "unknown_key";
    /// The signature's `kid` is on the `revokedKeys` list.
    pub const REVOKED_KEY: &str = "revoked_key";
    /// The `approvalId` is on the `revokedApprovals` list.
    pub const REVOKED_APPROVAL: &str = "revoked_approval";
    /// A genuine approval for another namespace or policy.
    pub const BINDING_MISMATCH: &str = "binding_mismatch";
    /// `policyRef` names no McpServerPolicy in the namespace.
    pub const POLICY_MISSING: &str = "policy_missing";
    /// The exception's `expiresAt` has passed.
    pub const EXPIRED: &str = "expired";
    /// The exception's `notBefore` is still ahead.
    pub const NOT_YET_VALID: &str = "not_yet_valid";
    /// The exception is valid for more than 90 days.
    pub const LONG_VALIDITY: &str = "long_validity";
    /// A `matchExpressions` entry Kubernetes would refuse.
    pub const INVALID_SELECTOR: &str = "invalid_selector";
    /// The selector contradicts itself: no pod can match it.
    pub const SELECTOR_MATCHES_NOTHING: &str = "selector_matches_nothing";
    /// The selector overlaps another policy's in the namespace.
    pub const SELECTOR_OVERLAP: &str = "selector_overlap";
    /// `revokedBefore` is further in the future than the clock skew allows.
    pub const REVOKED_BEFORE_IN_FUTURE: &str = "revoked_before_in_future";
    /// `revokedBefore` is older than any token still in use.
    pub const REVOKED_BEFORE_STALE: &str = "revoked_before_stale";
    /// The revocation's `expiresAt` has passed: the operator deletes it at once.
    pub const ALREADY_EXPIRED: &str = "already_expired";
    /// An identity field with leading or trailing whitespace.
    pub const WHITESPACE: &str = "whitespace";

    /// Every label, for metrics pre-registration and the docs test.
    pub const ALL: &[&str] = &[
        OK,
        IGNORED_OPERATION,
        UNSUPPORTED_KIND,
        UNSUPPORTED_OPERATION,
        BAD_STRUCTURE,
        INVALID_SPEC,
        SPEC_WARNING,
        NO_APPROVER_KEYS,
        BAD_SIGNATURE,
        UNKNOWN_KEY,
        REVOKED_KEY,
        REVOKED_APPROVAL,
        BINDING_MISMATCH,
        POLICY_MISSING,
        EXPIRED,
        NOT_YET_VALID,
        LONG_VALIDITY,
        INVALID_SELECTOR,
        SELECTOR_MATCHES_NOTHING,
        SELECTOR_OVERLAP,
        REVOKED_BEFORE_IN_FUTURE,
        REVOKED_BEFORE_STALE,
        ALREADY_EXPIRED,
        WHITESPACE,
    ];
}

/// The answer to one admission request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// Why the request is denied (every failed check, `; `-separated); `None` when allowed.
    pub message: Option<String>,
    /// Admission warnings (kubectl prints them), allowed or not.
    pub warnings: Vec<String>,
    /// Bounded metric label, one of [`reasons::ALL`].
    pub reason: &'static str,
}

impl Verdict {
    /// Allowed, no warnings, with `reason`.
    pub fn allow(reason: &'static str) -> Self {
        Self {
            allowed: true,
            message: None,
            warnings: Vec::new(),
            reason,
        }
    }

    /// Denied for one reason.
    pub fn deny(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            allowed: false,
            message: Some(message.into()),
            warnings: Vec::new(),
            reason,
        }
    }
}

/// Failed checks collected while validating one object, each with its label.
#[derive(Debug, Default)]
struct Findings {
    denials: Vec<(&'static str, String)>,
    warnings: Vec<(&'static str, String)>,
}

impl Findings {
    fn deny(&mut self, reason: &'static str, message: impl Into<String>) {
        self.denials.push((reason, message.into()));
    }

    fn warn(&mut self, reason: &'static str, message: impl Into<String>) {
        self.warnings.push((reason, message.into()));
    }

    /// These findings concern something the request leaves as it was: report its denials as
    /// warnings.
    fn pre_existing(mut self) -> Self {
        let denials = std::mem::take(&mut self.denials);
        self.warnings.extend(
            denials
                .into_iter()
                .map(|(reason, message)| (reason, format!("{message} (unchanged by this update)"))),
        );
        self
    }

    /// `pre_existing` when `unchanged`, as is otherwise.
    fn introduced_unless(self, unchanged: bool) -> Self {
        if unchanged { self.pre_existing() } else { self }
    }

    fn extend(&mut self, other: Findings) {
        self.denials.extend(other.denials);
        self.warnings.extend(other.warnings);
    }

    fn verdict(self) -> Verdict {
        let warnings: Vec<String> = self.warnings.iter().map(|(_, m)| m.clone()).collect();
        match self.denials.first() {
            Some((reason, _)) => Verdict {
                allowed: false,
                reason,
                message: Some(
                    self.denials
                        .iter()
                        .map(|(_, m)| m.as_str())
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                warnings,
            },
            None => Verdict {
                allowed: true,
                message: None,
                reason: self.warnings.first().map_or(reasons::OK, |(r, _)| r),
                warnings,
            },
        }
    }
}

/// What the validators read from the cluster; the server answers from its watch caches.
pub trait ClusterView {
    /// Every McpServerPolicy in `namespace`.
    fn policies_in(&self, namespace: &str) -> Vec<Arc<McpServerPolicy>>;
    /// The approver keys as last read from the configured Secret.
    fn approver_keys(&self) -> ApproverKeys;
}

/// Validates one AdmissionReview request: `kind` is `request.kind.kind`, `operation` is
/// `request.operation`, `namespace` is `request.namespace`, `object` and `old_object` are
/// `request.object` and `request.oldObject`.
pub fn validate_request(
    kind: &str,
    operation: &str,
    namespace: Option<&str>,
    object: &Value,
    old_object: Option<&Value>,
    view: &dyn ClusterView,
    now: Timestamp,
) -> Verdict {
    match operation {
        "CREATE" | "UPDATE" => {}
        "DELETE" | "CONNECT" => return Verdict::allow(reasons::IGNORED_OPERATION),
        other => {
            return Verdict::deny(
                reasons::UNSUPPORTED_OPERATION,
                format!("operation `{other}` is not one of CREATE, UPDATE, DELETE, CONNECT"),
            );
        }
    }
    // The API server always sends `oldObject` on UPDATE; without it (or when it no longer
    // deserializes) the request is judged as a CREATE, which is the stricter reading.
    let old_object = old_object.filter(|_| operation == "UPDATE");
    let namespace_for = |object: &Value| -> Result<String, Verdict> {
        namespace
            .or_else(|| {
                object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
            })
            .filter(|ns| !ns.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                Verdict::deny(
                    reasons::BAD_STRUCTURE,
                    format!("{kind}: the request names no namespace for a namespaced object"),
                )
            })
    };
    let result = match kind {
        "McpServerPolicy" => parse::<McpServerPolicy>(kind, object).and_then(|new| {
            let namespace = namespace_for(object)?;
            let old = old_object.and_then(|o| parse::<McpServerPolicy>(kind, o).ok());
            Ok(validate_policy(
                &new,
                old.as_ref(),
                &view.policies_in(&namespace),
            ))
        }),
        "CapabilityException" => parse::<CapabilityException>(kind, object).and_then(|new| {
            let namespace = namespace_for(object)?;
            let old = old_object.and_then(|o| parse::<CapabilityException>(kind, o).ok());
            Ok(validate_exception(
                &new,
                old.as_ref(),
                &namespace,
                &view.approver_keys(),
                &view.policies_in(&namespace),
                now,
            ))
        }),
        "PrincipalRevocation" => parse::<PrincipalRevocation>(kind, object).map(|new| {
            let old = old_object.and_then(|o| parse::<PrincipalRevocation>(kind, o).ok());
            validate_revocation(&new, old.as_ref(), now)
        }),
        other => Err(Verdict::deny(
            reasons::UNSUPPORTED_KIND,
            format!(
                "kind `{other}` is not validated by this webhook (McpServerPolicy, CapabilityException, PrincipalRevocation); check the ValidatingWebhookConfiguration's rules"
            ),
        )),
    };
    result.unwrap_or_else(|denied| denied)
}

/// Deserializes `value`, naming the field path of the first structure error.
fn parse<T: DeserializeOwned>(kind: &str, value: &Value) -> Result<T, Verdict> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let what = e.into_inner();
        Verdict::deny(
            reasons::BAD_STRUCTURE,
            if path == "." {
                format!("{kind}: {what}")
            } else {
                format!("{kind}: {path}: {what}")
            },
        )
    })
}
