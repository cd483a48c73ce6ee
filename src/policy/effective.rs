//! The compiled policy one sidecar enforces: every default applied, every field validated.
//!
//! `EffectivePolicy` is what crosses the wire from the operator to sidecars and what standalone
//! mode builds from a file, so it is plain data (serde) with small pure query methods.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::api::{
    AuditFailureMode, AuditSink, CapabilityExceptionSpec, CapabilityMode, CertificateHeaderFormat,
    ExceptionCapability, JwsAlgorithm, ListenNotification, PolicyDuration, ProofOfPossession,
    RevocationReason, UpstreamIdentity,
};

/// Where the protected container keeps its task state (`spec.upstream.taskState`).
pub use crate::api::UpstreamTaskState;

use super::uri_pattern::{PatternIdentity, UriPattern};

/// Namespace and name of a Kubernetes object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Everything a sidecar needs to protect one MCP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectivePolicy {
    /// The McpServerPolicy this was compiled from.
    pub policy: ObjectKey,
    /// Its `metadata.generation`, when known.
    pub generation: Option<i64>,
    /// Canonical server URI (required token audience, advertised resource).
    pub resource: String,
    pub issuers: Vec<TrustedIssuer>,
    /// `spec.identity.dpop`; `None`: the defaults ([`EffectivePolicy::dpop_rules`]). Left out of
    /// the serialization when absent, so policies without it keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpop: Option<DpopRules>,
    /// `spec.identity.clientCertificates`; `None`: certificate-bound tokens are refused. Left
    /// out of the serialization when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificates: Option<ClientCertificateRules>,
    /// What the protected container learns about callers.
    pub upstream_identity: UpstreamIdentity,
    /// Who answers requests about an existing task: the replica whose container created it
    /// (`perReplica`, others forward over the internal hop) or any replica (`shared`).
    /// Defaulted when absent, so a sidecar reads snapshots of operators that predate it.
    #[serde(default)]
    pub upstream_task_state: UpstreamTaskState,
    pub protocol: ProtocolRules,
    /// Request-rate limits (`spec.rateLimits`); `None`: no limit. Left out of the
    /// serialization when absent, so policies without limits keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<super::rate_limits::RateLimitRules>,
    /// `None`: no request may become a task.
    pub tasks: Option<TaskRules>,
    /// `None`: listen requests are refused.
    pub listen: Option<ListenRules>,
    pub capabilities: CapabilityRules,
    /// Exceptions that target this policy and passed structural validation. Signatures and
    /// validity windows are checked by the sidecar at every use.
    pub exceptions: Vec<GrantedException>,
    /// Revocations in force, cluster-wide.
    pub revocations: Vec<RevocationRule>,
    pub audit: AuditRules,
}

impl EffectivePolicy {
    /// Object-level permission (`tasks.objects`), when tasks are on and the policy names objects.
    pub fn object_rules(&self) -> Option<&ObjectRules> {
        self.tasks.as_ref().and_then(|t| t.objects.as_ref())
    }

    /// SHA-256 (hex) of the policy's canonical serialization: equal policies hash equally, so
    /// the operator and sidecars can tell whether they agree without comparing whole documents.
    pub fn hash(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        Self::hash_of_serialized(&bytes)
    }

    /// [`EffectivePolicy::hash`] of a policy already serialized with `serde_json` (to hash and
    /// keep one serialization instead of making two).
    pub fn hash_of_serialized(json: &[u8]) -> String {
        hex::encode(Sha256::digest(json))
    }

    /// How DPoP proofs are checked: the policy's rules, or the defaults.
    pub fn dpop_rules(&self) -> &DpopRules {
        static DEFAULT: std::sync::LazyLock<DpopRules> =
            std::sync::LazyLock::new(DpopRules::default);
        self.dpop.as_ref().unwrap_or(&DEFAULT)
    }

    /// Whether every trusted issuer requires key-bound tokens (advertised as
    /// `dpop_bound_access_tokens_required` in the protected resource metadata).
    pub fn requires_proof_of_possession(&self) -> bool {
        !self.issuers.is_empty()
            && self
                .issuers
                .iter()
                .all(|i| i.proof_of_possession == ProofOfPossession::Required)
    }

    /// The trusted issuer entry for an `iss` value, compared exactly.
    pub fn issuer(&self, iss: &str) -> Option<&TrustedIssuer> {
        self.issuers.iter().find(|i| i.issuer == iss)
    }
}

/// One trusted token issuer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustedIssuer {
    pub issuer: String,
    /// A token must carry at least one of these in `aud`.
    pub audiences: Vec<String>,
    pub keys: KeySource,
    pub algorithms: Vec<JwsAlgorithm>,
    pub claims: ClaimMap,
    /// Whether this issuer's tokens must be key-bound. Left out of the serialization when
    /// `optional`, so policies that never set it keep their hash.
    #[serde(default, skip_serializing_if = "is_optional")]
    pub proof_of_possession: ProofOfPossession,
}

fn is_optional(mode: &ProofOfPossession) -> bool {
    *mode == ProofOfPossession::Optional
}

/// How DPoP proofs are checked (`spec.identity.dpop`, defaults applied).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DpopRules {
    /// Accepted proof signature algorithms.
    pub algorithms: Vec<JwsAlgorithm>,
    /// How far a proof's `iat` may lie from now, either way, in seconds.
    pub proof_window_secs: u64,
    /// Every proof must carry a current server nonce.
    pub require_nonce: bool,
}

/// Where trusted proxies put the client's certificate (`spec.identity.clientCertificates`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificateRules {
    /// The header's name, lower case.
    pub header: String,
    pub format: CertificateHeaderFormat,
    /// Peers whose header is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl ClientCertificateRules {
    /// Whether a connection from `peer` may set the certificate header.
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.trusted_proxies.iter().any(|net| net.contains(&peer))
    }
}

impl DpopRules {
    /// The `iat` window without `spec.identity.dpop.proofWindow`: five minutes, as the MCP
    /// conformance suite's DPoP scenarios expect.
    pub const DEFAULT_PROOF_WINDOW_SECS: u64 = 300;
}

impl Default for DpopRules {
    fn default() -> Self {
        Self {
            algorithms: vec![
                JwsAlgorithm::ES256,
                JwsAlgorithm::ES384,
                JwsAlgorithm::EdDSA,
                JwsAlgorithm::PS256,
                JwsAlgorithm::RS256,
            ],
            proof_window_secs: Self::DEFAULT_PROOF_WINDOW_SECS,
            require_nonce: false,
        }
    }
}

/// Where an issuer's public keys come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KeySource {
    /// A JWKS URL (https, or http on loopback).
    JwksUri(String),
    /// A local JWKS file (standalone mode), as written in the policy.
    JwksFile(String),
}

/// Claim names for the owner key and scopes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimMap {
    pub subject: String,
    pub tenant: String,
    pub client: String,
    pub scopes: String,
}

/// Protocol acceptance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolRules {
    pub versions: Vec<String>,
    /// Empty: only requests without `Origin` are accepted.
    pub allowed_origins: Vec<String>,
    /// Accept a missing `Mcp-Name` header (never a mismatched one).
    pub allow_missing_name_header: bool,
}

/// Which tools may become tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolSet {
    All,
    Only(BTreeSet<String>),
}

/// Task bounds with defaults applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRules {
    pub tools: ToolSet,
    pub required_scopes: BTreeMap<String, BTreeSet<String>>,
    pub default_ttl: PolicyDuration,
    pub max_ttl: PolicyDuration,
    pub delete_result_after_retrieval: bool,
    pub default_deadline: PolicyDuration,
    pub max_deadline: PolicyDuration,
    pub per_tool_deadline: BTreeMap<String, PolicyDuration>,
    pub min_poll_interval: PolicyDuration,
    pub concurrency: ConcurrencyLimits,
    pub idempotency_window: PolicyDuration,
    pub derive_idempotency_key: bool,
    pub admin_cancel_scope: Option<String>,
    /// What is kept of completed results (`tasks.results`).
    #[serde(default)]
    pub results: ResultRules,
    /// `tasks.identityLease`; absent when tasks have no identity lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_lease: Option<PolicyDuration>,
    /// Object-level permission (`tasks.objects`); absent when the policy names no objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<ObjectRules>,
}

/// `tasks.objects` with defaults applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRules {
    pub authorizer: AuthorizerRules,
    /// Tool → where its arguments name its object.
    pub tools: BTreeMap<String, ObjectPointer>,
}

/// Where one tool's arguments name its object, and the resource type the authorizer is told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectPointer {
    pub pointer: String,
    pub resource_type: String,
}

/// The decision point of [`ObjectRules`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizerRules {
    pub url: String,
    pub format: crate::api::AuthorizerFormat,
    pub timeout: PolicyDuration,
    pub cache_ttl: PolicyDuration,
    pub cache_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
}

impl ObjectRules {
    /// Where `tool`'s arguments name its object, when they do.
    pub fn for_tool(&self, tool: &str) -> Option<&ObjectPointer> {
        self.tools.get(tool)
    }
}

/// `tasks.results` with defaults applied. The mask patterns are kept as text (the policy
/// travels as JSON); the compiler checked that each is a valid regular expression.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultRules {
    pub mode: crate::api::ResultMode,
    pub max_bytes: Option<u32>,
    pub drop: Vec<String>,
    pub mask: Vec<String>,
}

impl ResultRules {
    /// Whether results pass through untouched.
    pub fn keeps_everything(&self) -> bool {
        self.mode == crate::api::ResultMode::Full
            && self.max_bytes.is_none()
            && self.drop.is_empty()
            && self.mask.is_empty()
    }
}

impl TaskRules {
    /// Whether `tool` may run as a task.
    pub fn allows_tool(&self, tool: &str) -> bool {
        match &self.tools {
            ToolSet::All => true,
            ToolSet::Only(tools) => tools.contains(tool),
        }
    }

    /// Scopes needed to create, read, update or cancel a task of `tool`.
    pub fn scopes_for(&self, tool: &str) -> impl Iterator<Item = &str> {
        self.required_scopes
            .get(tool)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// The server-enforced lifetime of a task of `tool`.
    pub fn deadline_for(&self, tool: &str) -> Duration {
        self.per_tool_deadline
            .get(tool)
            .unwrap_or(&self.default_deadline)
            .get()
    }

    /// The TTL given to a client when the server stated `requested` (`None` = no TTL stated or
    /// unlimited): the server's value clamped to `maxTtl`, or `defaultTtl`.
    pub fn effective_ttl(&self, requested: Option<Duration>) -> Duration {
        match requested {
            Some(ttl) => ttl.min(self.max_ttl.get()),
            None => self.default_ttl.get(),
        }
    }
}

/// Concurrency quotas on non-terminal tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConcurrencyLimits {
    pub per_principal: u32,
    pub per_tenant: u32,
    pub per_client: u32,
    pub per_server: u32,
}

/// Listen stream rules with defaults applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenRules {
    pub notifications: BTreeSet<ListenNotification>,
    pub resource_patterns: Vec<UriPattern>,
    pub max_streams_per_principal: u32,
    pub max_stream_duration: PolicyDuration,
}

impl ListenRules {
    /// Whether a stream of the listener `who` may subscribe to updates of `uri` (templated
    /// patterns are expanded from `who`).
    pub fn allows_resource(&self, uri: &str, who: &PatternIdentity<'_>) -> bool {
        self.notifications
            .contains(&ListenNotification::ResourceSubscriptions)
            && self.resource_patterns.iter().any(|p| p.matches(uri, who))
    }
}

/// Deprecated capability gates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityRules {
    pub sampling: CapabilityMode,
    pub roots: CapabilityMode,
    #[serde(default = "deny")]
    pub logging: CapabilityMode,
    /// Extra secret-scanner patterns (checked to compile by the compiler).
    #[serde(default)]
    pub secret_patterns: Vec<String>,
}

fn deny() -> CapabilityMode {
    CapabilityMode::Deny
}

impl CapabilityRules {
    /// The mode for one capability.
    pub fn mode(&self, capability: ExceptionCapability) -> CapabilityMode {
        match capability {
            ExceptionCapability::Sampling => self.sampling,
            ExceptionCapability::Roots => self.roots,
            ExceptionCapability::Logging => self.logging,
        }
    }
}

/// A structurally valid CapabilityException targeting this policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantedException {
    pub exception: ObjectKey,
    /// The whole grant: the signature covers it, so the sidecar re-verifies from these fields.
    pub spec: CapabilityExceptionSpec,
    pub not_before: Timestamp,
    pub expires_at: Timestamp,
}

impl GrantedException {
    /// Validity at `now`: not before `notBefore`, strictly before `expiresAt`.
    pub fn window_contains(&self, now: Timestamp) -> bool {
        self.not_before <= now && now < self.expires_at
    }
}

/// A PrincipalRevocation in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevocationRule {
    pub name: String,
    pub issuer: String,
    /// `None`: every subject of the tenant and/or client named.
    pub subject: Option<String>,
    pub tenant: Option<String>,
    pub client: Option<String>,
    pub revoked_before: Timestamp,
    pub reason: RevocationReason,
}

impl RevocationRule {
    /// Whether this revocation covers the identity: same issuer, and every one of subject,
    /// tenant and client it names. One that names none of them covers nobody (it is refused by
    /// validation; a whole issuer is never revoked by accident).
    pub fn covers(&self, issuer: &str, subject: &str, tenant: &str, client: &str) -> bool {
        self.names_someone()
            && self.issuer == issuer
            && self.subject.as_deref().is_none_or(|s| s == subject)
            && self.tenant.as_deref().is_none_or(|t| t == tenant)
            && self.client.as_deref().is_none_or(|c| c == client)
    }

    /// Whether it names a subject, a tenant or a client.
    pub fn names_someone(&self) -> bool {
        self.subject.is_some() || self.tenant.is_some() || self.client.is_some()
    }

    /// Whether a token of a covered identity issued at `issued_at` is refused. Tokens without
    /// `iat` are treated as issued at the epoch, so they are always refused.
    pub fn refuses_token_issued_at(&self, issued_at: Option<Timestamp>) -> bool {
        self.reason.refuses_all_tokens() || issued_at.is_none_or(|iat| iat <= self.revoked_before)
    }
}

/// Audit settings with defaults applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRules {
    pub sink: AuditSink,
    pub path: Option<String>,
    pub status_read_sample_percent: u8,
    /// What serving does while audit events cannot be written.
    pub on_failure: AuditFailureMode,
    /// Subjects and tenants are written as keyed digests.
    #[serde(default)]
    pub identity_digests: bool,
}
