//! `PrincipalRevocation`: an identity whose tokens and work must stop, cluster-wide.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rules;

/// Revokes identities on every MCP server Lifeguard protects: tokens issued at or before
/// `revokedBefore` are refused, their unfinished tasks are cancelled and their listen streams
/// closed. What it covers, always within one issuer: one principal (`subject`, optionally
/// narrowed to a `tenant` or `client`), a whole tenant (`tenant` without `subject`), or a
/// client application (`client` without `subject`, e.g. withdrawn consent; with `tenant`, that
/// application in that tenant). Written by people, GitOps, or the operator's security-event
/// (SSF/CAEP/RISC) receiver.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lifeguard.dev",
    version = "v1alpha1",
    kind = "PrincipalRevocation",
    plural = "principalrevocations",
    shortname = "mcprev",
    category = "lifeguard",
    cel,
    status = "PrincipalRevocationStatus",
    derive = "PartialEq",
    doc = "Revokes a principal's tokens, tasks and listen streams on every MCP server protected by Lifeguard.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Subject", type_ = "string", json_path = ".spec.subject"),
    printcolumn(
        name = "Tenant",
        type_ = "string",
        json_path = ".spec.tenant",
        priority = 1
    ),
    printcolumn(
        name = "Client",
        type_ = "string",
        json_path = ".spec.client",
        priority = 1
    ),
    printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason"),
    printcolumn(
        name = "Acked",
        type_ = "integer",
        description = "Sidecars that applied the revocation",
        json_path = ".status.acknowledgedSidecars"
    ),
    printcolumn(
        name = "Propagation-ms",
        type_ = "integer",
        json_path = ".status.propagationMillis",
        priority = 1
    ),
    // `string`, not `date`: kubectl shows a future `date` as `<invalid>`.
    printcolumn(
        name = "Expires",
        type_ = "string",
        json_path = ".spec.expiresAt",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("has(self.subject) || has(self.tenant) || has(self.client)")
        .message(rules::REVOCATION_NAMES_SOMEONE),
    validation = Rule::new("self.issuer == oldSelf.issuer && has(self.subject) == has(oldSelf.subject) && (!has(self.subject) || self.subject == oldSelf.subject) && has(self.tenant) == has(oldSelf.tenant) && (!has(self.tenant) || self.tenant == oldSelf.tenant) && has(self.client) == has(oldSelf.client) && (!has(self.client) || self.client == oldSelf.client)")
        .message(rules::IMMUTABLE_REVOKED_IDENTITY),
    validation = Rule::new("self.revokedBefore >= oldSelf.revokedBefore")
        .message(rules::REVOKED_BEFORE_ONLY_LATER)
        .field_path(".revokedBefore")
)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalRevocationSpec {
    /// Token issuer (`iss`) of the revoked principal.
    #[schemars(length(min = 1, max = 2048))]
    pub issuer: String,

    /// Subject (`sub`, or the policy's subject claim) of the revoked principal. Without it the
    /// revocation covers every subject of the `tenant` and/or `client` it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub subject: Option<String>,

    /// The tenant (the policy's tenant claim): with `subject`, only the principal's tokens and
    /// tasks in this tenant are revoked; without it, the whole tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub tenant: Option<String>,

    /// The OAuth client (the policy's client claim): with `subject`, only the principal's tokens
    /// and tasks through this client are revoked; without it, everyone's through this client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub client: Option<String>,

    /// Tokens issued (`iat`) at or before this instant are refused. For `accountDisabled` and
    /// `accountPurged` every token is refused while this object exists.
    pub revoked_before: Time,

    /// Why the principal was revoked; decides whether fresh tokens work again.
    pub reason: RevocationReason,

    /// Who asked for the revocation.
    pub source: RevocationSource,

    /// When this object may be garbage-collected (normally after the longest token lifetime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
}

/// Reasons, after the CAEP/RISC event vocabulary.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum RevocationReason {
    /// Sessions ended; tokens issued later work again.
    SessionRevoked,
    /// Password or credential changed; tokens issued later work again.
    CredentialChange,
    /// The account is disabled: every token is refused until this object is removed.
    AccountDisabled,
    /// The account is gone: every token is refused until this object is removed.
    AccountPurged,
    /// A credential leaked; tokens issued later work again.
    CredentialCompromise,
    /// An administrator ended the principal's work; tokens issued later work again.
    AdminAction,
}

impl RevocationReason {
    /// Whether fresh tokens (issued after `revokedBefore`) are refused too.
    pub fn refuses_all_tokens(self) -> bool {
        matches!(self, Self::AccountDisabled | Self::AccountPurged)
    }
}

/// Origin of a revocation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("self.kind != 'securityEvent' || (has(self.eventType) && has(self.issuer) && has(self.jti))")
        .message(rules::SECURITY_EVENT_SOURCE_FIELDS)
)]
pub struct RevocationSource {
    /// `manual` (a person or GitOps) or `securityEvent` (an SSF/CAEP/RISC event).
    pub kind: RevocationSourceKind,
    /// Security event type URI, e.g.
    /// `https://schemas.openid.net/secevent/caep/event-type/session-revoked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Issuer of the security event token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// `jti` of the security event token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    /// `txn` of the security event token, linking events of one transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<String>,
}

/// Kinds of revocation source.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RevocationSourceKind {
    Manual,
    SecurityEvent,
}

/// Observed propagation of a revocation, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalRevocationStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and `Propagated`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Sidecars that must apply the revocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_sidecars: Option<i32>,
    /// Sidecars that applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged_sidecars: Option<i32>,
    /// Tasks cancelled because of it, summed over sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_cancelled: Option<i64>,
    /// Listen streams closed because of it, summed over sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams_closed: Option<i64>,
    /// When the last targeted sidecar acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Milliseconds from the object's creation to `completedAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propagation_millis: Option<i64>,
}
