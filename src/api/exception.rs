//! `CapabilityException`: a signed, expiring, budgeted grant for a deprecated capability.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rules;

/// Lets one MCP server ask the listed clients for a capability deprecated in MCP 2026-07-28
/// (`sampling/createMessage` or `roots/list`), within limits, for a bounded time. Every field
/// except `signature` is the grant a reviewer reads in a pull request; `signature` is an approver's
/// detached JWS over the grant bound to this namespace and policy, so a copy elsewhere is invalid.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lifeguard.dev",
    version = "v1alpha1",
    kind = "CapabilityException",
    plural = "capabilityexceptions",
    shortname = "mcpex",
    category = "lifeguard",
    namespaced,
    cel,
    status = "CapabilityExceptionStatus",
    derive = "PartialEq",
    doc = "A signed, expiring, budgeted exception that lets one MCP server use a deprecated capability (sampling, roots) with named clients.",
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Policy", type_ = "string", json_path = ".spec.policyRef.name"),
    printcolumn(name = "Capability", type_ = "string", json_path = ".spec.capability"),
    // `string`, not `date`: kubectl shows a `date` column as the time since it, and a future
    // expiry as `<invalid>`.
    printcolumn(name = "Expires", type_ = "string", json_path = ".spec.expiresAt"),
    printcolumn(
        name = "Approver",
        type_ = "string",
        json_path = ".status.approver",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.expiresAt > self.notBefore")
        .message(rules::EXCEPTION_EXPIRES_AFTER_NOT_BEFORE)
        .field_path(".expiresAt"),
    validation = Rule::new("self.capability != 'sampling' || has(self.modelRoute)")
        .message(rules::SAMPLING_NEEDS_MODEL_ROUTE)
        .field_path(".modelRoute")
)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityExceptionSpec {
    /// The McpServerPolicy, in this namespace, whose server may use the capability.
    #[x_kube(validation = Rule::new("self == oldSelf").message(rules::IMMUTABLE_POLICY_REF))]
    pub policy_ref: PolicyRef,

    /// The deprecated capability granted.
    #[x_kube(validation = Rule::new("self == oldSelf").message(rules::IMMUTABLE_CAPABILITY))]
    pub capability: ExceptionCapability,

    /// OAuth client ids that may be asked. The request must come from one of them.
    #[schemars(length(min = 1, max = 64))]
    pub clients: Vec<String>,

    /// When set, only these principals (issuer + subject) may be asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principals: Option<Vec<PrincipalRef>>,

    /// When set, only principals of these tenants may be asked. A tenant is named with its
    /// issuer: the same tenant id from another issuer is another tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<TenantRef>>,

    /// Why the server needs the capability, in words shown to the people who approve and use it.
    #[schemars(length(min = 1, max = 1024))]
    pub purpose: String,

    /// The model route approved for sampling requests under this exception (recorded with every
    /// use and shown to the client; e.g. the gateway route or model family the client should
    /// use). Required for `sampling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub model_route: Option<String>,

    /// Budgets that bound every use.
    pub limits: ExceptionLimits,

    /// Tools a sampling request may offer to the model (sampling with tools). Empty means none.
    #[serde(default)]
    pub allowed_tools: Vec<String>,

    /// Context a sampling request may ask the client to include (`includeContext`):
    /// `thisServer`, or `allServers` (which allows `thisServer` too). Absent: only `none` (or no
    /// `includeContext`) passes; anything else is refused as `context_not_isolated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_context: Option<IncludeContextGrant>,

    /// Start of validity (RFC 3339).
    pub not_before: Time,

    /// End of validity (RFC 3339). Takes effect on the second, without a reload.
    pub expires_at: Time,

    /// Identifier of the approval record (change ticket, review) behind this exception.
    #[schemars(length(min = 1, max = 256))]
    pub approval_id: String,

    /// Compact JWS with detached payload (`<header>..<signature>`): EdDSA, `typ`
    /// `lifeguard-exception+jws`, `kid` naming an approver key. The payload is the RFC 8785
    /// canonical JSON of this spec without `signature`, plus `namespace` and `policy`.
    #[schemars(length(min = 1, max = 4096))]
    pub signature: String,
}

/// How much of the client's context a sampling request may ask for.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum IncludeContextGrant {
    ThisServer,
    AllServers,
}

/// Reference to an McpServerPolicy in the same namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRef {
    /// Name of the McpServerPolicy.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Deprecated capabilities that can be granted.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum ExceptionCapability {
    /// `sampling/createMessage` input requests.
    Sampling,
    /// `roots/list` input requests.
    Roots,
    /// Server log messages: `notifications/message` on the caller's response streams and the
    /// caller's `logging/setLevel` (under `capabilities.logging: exception`).
    Logging,
}

/// One principal: issuer plus subject.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalRef {
    /// Token issuer (`iss`).
    #[schemars(length(min = 1, max = 2048))]
    pub issuer: String,
    /// Subject at that issuer.
    #[schemars(length(min = 1, max = 1024))]
    pub subject: String,
}

/// One tenant: issuer plus tenant id (the tenant claim's value at that issuer).
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct TenantRef {
    /// Token issuer (`iss`).
    #[schemars(length(min = 1, max = 2048))]
    pub issuer: String,
    /// Tenant id at that issuer.
    #[schemars(length(min = 1, max = 1024))]
    pub tenant: String,
}

/// Budgets of a CapabilityException.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExceptionLimits {
    /// Largest `maxTokens` one sampling request may ask for.
    #[schemars(range(min = 1, max = 10_000_000))]
    pub max_tokens: u32,
    /// Most requests of this capability within one task.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_iterations_per_task: u32,
    /// Most requests per minute under this exception, across all tasks and clients.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_requests_per_minute: u32,
    /// Sampling: the most cost units all requests under this grant may spend over its
    /// validity, across tasks and clients. A request costs the `maxTokens` it asks for
    /// (reserved when it is allowed); one that would go past the budget is refused
    /// (`cost_budget`). Absent: no cost budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_cost_units: Option<u64>,
    /// Largest `systemPrompt` of a sampling request, in bytes (UTF-8). Default 8192.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_048_576))]
    pub max_system_prompt_bytes: Option<u32>,
    /// Largest `messages` of a sampling request, in bytes of their JSON. Default 65536.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4_194_304))]
    pub max_message_bytes: Option<u32>,
}

/// Lifecycle state of an exception as last evaluated.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExceptionState {
    Active,
    Expired,
    Invalid,
    NotYetValid,
}

/// Observed state of a CapabilityException.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityExceptionStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Active, Expired, Invalid or NotYetValid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ExceptionState>,
    /// Key id (`kid`) of the approver whose signature verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// `Ready` and `SignatureVerified`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
