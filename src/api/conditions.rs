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
/// PrincipalRevocation: every targeted sidecar applied the revocation.
pub const PROPAGATED: &str = "Propagated";

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
}
