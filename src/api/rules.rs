//! Messages of the invariants that the CRD's CEL rules and the policy compiler both enforce.
//!
//! One constant per invariant: the API server reports it when a CEL rule fails, and the compiler
//! (standalone mode, `lifeguard policy check`, the operator) reports the very same text, so a user
//! sees one message whichever layer caught the mistake.

pub const DURATION_POSITIVE: &str = "must be a positive duration such as 90s, 15m or 2h";
pub const MAX_TTL_AT_LEAST_DEFAULT: &str = "maxTtl must be at least defaultTtl";
pub const DEADLINE_MAX_AT_LEAST_DEFAULT: &str = "max must be at least default";
pub const DEADLINE_PER_TOOL_WITHIN_MAX: &str = "every perTool deadline must be at most max";
pub const ISSUER_ONE_JWKS_SOURCE: &str = "exactly one of jwksUri and jwksFile must be set";
pub const REQUIRED_INJECTION_NEEDS_SELECTOR: &str = "injection.required needs a non-empty selector: an empty one would refuse every pod of the namespace that cannot take a sidecar";
pub const AUDIT_FILE_NEEDS_PATH: &str = "path is required when sink is file";
pub const EXCEPTION_EXPIRES_AFTER_NOT_BEFORE: &str = "expiresAt must be later than notBefore";
pub const IMMUTABLE_POLICY_REF: &str = "policyRef is immutable; create a new exception instead";
pub const IMMUTABLE_CAPABILITY: &str = "capability is immutable; create a new exception instead";
pub const IMMUTABLE_REVOKED_IDENTITY: &str =
    "issuer, subject, tenant and client are immutable; create a new revocation instead";
pub const SAMPLING_NEEDS_MODEL_ROUTE: &str = "modelRoute is required for a sampling exception: name the model route (gateway route or model family) the approver approved for it";
pub const REDACT_DROP_POINTER: &str =
    "every drop entry must be a JSON pointer starting with '/', e.g. /structuredContent/ssn";
pub const REVOCATION_NAMES_SOMEONE: &str =
    "name at least one of subject, tenant and client: a revocation never covers a whole issuer";
pub const REVOKED_BEFORE_ONLY_LATER: &str = "revokedBefore may only move later";
pub const SECURITY_EVENT_SOURCE_FIELDS: &str =
    "a securityEvent source needs eventType, issuer and jti";
pub const SECRET_NAME_DNS_SUBDOMAIN: &str =
    "name must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-', '.'; at most 253 characters)";
pub const SECRET_DATA_KEY: &str = "key must be a Secret data key: letters, digits, '-', '_' and '.', not '.' and not starting with '..' (at most 253 characters)";
pub const OBJECT_POINTER: &str =
    "pointer must be a JSON pointer into the tool's arguments starting with '/', e.g. /projectId";
pub const AUTHORIZER_URL: &str =
    "url must use https (plain http only to a loopback authorizer, e.g. http://127.0.0.1:8181)";
pub const AUTHORIZER_TIMEOUT: &str = "timeout must be more than 0s and at most 30s";
pub const AUTHORIZER_CACHE_TTL: &str = "cacheTtl must be at most 10m";
pub const RATE_LIMIT_TOOL_NAME: &str =
    "every tool name in tools must be 1 to 128 characters long (an MCP tool name)";
