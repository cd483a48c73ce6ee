//! Condition types and reasons written into the status of Lifeguard objects.
//!
//! Kept as constants so the operator, tests and docs spell them one way.

/// Summary condition on every Lifeguard object: the object is fully in effect.
pub const READY: &str = "Ready";
/// McpServerPolicy: the spec (with its exceptions and revocations) compiled into a policy.
pub const COMPILED: &str = "Compiled";
/// McpServerPolicy: every matched sidecar acknowledged the current policy version.
pub const SIDECARS_IN_SYNC: &str = "SidecarsInSync";
/// CapabilityException: the signature verified against a trusted approver key.
pub const SIGNATURE_VERIFIED: &str = "SignatureVerified";
/// CapabilityException ("abnormal-true"): another object in the namespace carries the same
/// signed grant (a copy under another name). They share one budget; the copies are flagged.
pub const DUPLICATE_GRANT: &str = "DuplicateGrant";
/// PrincipalRevocation: every targeted sidecar applied the revocation.
pub const PROPAGATED: &str = "Propagated";
/// McpServerPolicy: another, older policy selects some of the same pods (and wins them).
pub const CONFLICT: &str = "Conflict";
/// kstatus: the operator is still working towards the spec (sidecars not yet in sync, a
/// revocation still propagating, an exception not yet valid). "Abnormal-true": `False` when
/// nothing is left to do.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: the operator cannot make progress without a change to the object (the spec does
/// not compile, an exception's signature does not verify or it has expired). `False` otherwise.
pub const STALLED: &str = "Stalled";

pub mod reasons {
    pub const PROGRAMMED: &str = "Programmed";
    pub const VALID: &str = "Valid";
    pub const INVALID: &str = "Invalid";
    pub const ALL_IN_SYNC: &str = "AllInSync";
    pub const PENDING: &str = "Pending";
    pub const NO_MATCHING_PODS: &str = "NoMatchingPods";
    pub const VERIFIED: &str = "Verified";
    pub const BAD_SIGNATURE: &str = "BadSignature";
    pub const UNKNOWN_KEY: &str = "UnknownKey";
    pub const EXPIRED: &str = "Expired";
    pub const NOT_YET_VALID: &str = "NotYetValid";
    pub const APPLIED: &str = "Applied";
    /// CapabilityException: the McpServerPolicy it names does not exist.
    pub const POLICY_NOT_FOUND: &str = "PolicyNotFound";
    /// CapabilityException: the operator has no approver keys (Secret missing or unusable).
    pub const NO_TRUSTED_KEYS: &str = "NoTrustedKeys";
    /// CapabilityException: the signing key is on the revoked-keys list.
    pub const KEY_REVOKED: &str = "KeyRevoked";
    /// CapabilityException: the signature binds another namespace or policy.
    pub const WRONG_SERVER: &str = "WrongServer";
    /// CapabilityException: the approval id is on the revoked-approvals list.
    pub const APPROVAL_REVOKED: &str = "ApprovalRevoked";
    /// CapabilityException: the spec breaks a rule the CRD's CEL rules and the compiler
    /// enforce (e.g. a sampling exception without `modelRoute`); it grants nothing.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// CapabilityException: another object carries the same signed grant.
    pub const DUPLICATE_GRANT: &str = "DuplicateGrant";
    /// CapabilityException: no other object carries its signed grant.
    pub const UNIQUE_GRANT: &str = "UniqueGrant";
    /// CapabilityException: verified and inside its validity window.
    pub const ACTIVE: &str = "Active";
    /// McpServerPolicy: the spec does not compile.
    pub const COMPILE_ERROR: &str = "CompileError";
    /// McpServerPolicy: an older policy selects some of this policy's pods.
    pub const OVERLAPPING_SELECTOR: &str = "OverlappingSelector";
    /// McpServerPolicy: no other policy selects its pods.
    pub const NO_CONFLICT: &str = "NoConflict";
    /// PrincipalRevocation: some targeted sidecars have not acknowledged yet.
    pub const PROPAGATING: &str = "Propagating";
}
