//! `McpServerPolicy`: how Lifeguard protects one MCP server.

use std::collections::BTreeMap;

use super::duration::PolicyDuration;
pub use super::jws_algorithm::JwsAlgorithm;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rules;
use super::secret_key_ref::SecretKeySelector;

/// Policy for one MCP server: who may call it and how fast, how its long-running Tasks are
/// bounded, what its `subscriptions/listen` streams may carry, and whether deprecated
/// server-to-client capabilities are allowed. Lifeguard sidecars in the pods matched by
/// `selector` enforce it on every request.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lifeguard.dev",
    version = "v1alpha1",
    kind = "McpServerPolicy",
    plural = "mcpserverpolicies",
    shortname = "mcpp",
    category = "lifeguard",
    namespaced,
    cel,
    status = "McpServerPolicyStatus",
    derive = "PartialEq",
    doc = "Policy for one MCP server: identity, request-rate limits, task bounds, listen filters and deprecated-capability gates, enforced by Lifeguard sidecars.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Resource", type_ = "string", json_path = ".spec.resource"),
    printcolumn(
        name = "Pods",
        type_ = "integer",
        description = "Pods matched by the selector",
        json_path = ".status.matchedPods"
    ),
    printcolumn(
        name = "In-Sync",
        type_ = "integer",
        description = "Sidecars running the current policy version",
        json_path = ".status.sidecarsInSync"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("!has(self.injection) || !has(self.injection.required) || !self.injection.required || (has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)")
        .message(rules::REQUIRED_INJECTION_NEEDS_SELECTOR)
)]
#[serde(rename_all = "camelCase")]
pub struct McpServerPolicySpec {
    /// Pods whose Lifeguard sidecars enforce this policy. At most one policy may select a pod.
    pub selector: LabelSelector,

    /// Canonical URI of the MCP server as clients address it, e.g.
    /// `https://reports.team-a.example.com/mcp`. Access tokens must be issued for it (RFC 8707
    /// audience binding) and it is advertised in `WWW-Authenticate` as the protected resource.
    /// Must be an absolute `https` URI (or `http` on a loopback host, for local development)
    /// without a fragment.
    #[schemars(length(min = 1, max = 2048))]
    pub resource: String,

    /// Which token issuers are trusted and how their claims map to Lifeguard's owner key.
    pub identity: IdentitySpec,

    /// What the protected container learns about each caller, and where it keeps task state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamSpec>,

    /// Where the sidecars of the selected pods keep their task ledger. Absent: each pod's
    /// sidecar keeps an embedded SQLite ledger of its own (the single-replica default). Set it
    /// when the server runs several replicas, so they share one PostgreSQL ledger and a task
    /// created through one replica can be read, updated and cancelled through any of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<LedgerSpec>,

    /// MCP protocol versions and browser origins accepted. Defaults accept only 2026-07-28 and
    /// requests without an `Origin` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ProtocolSpec>,

    /// Request-rate limits: token buckets per principal, tenant, client and server, for every
    /// request and per method class and tool. A request over a limit is refused with HTTP 429
    /// and `Retry-After` before it reaches the server. When absent, request rates are not
    /// limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<super::rate_limits::RateLimitsSpec>,

    /// Long-running Tasks (MCP Tasks extension). When absent, no request may become a task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TasksSpec>,

    /// `subscriptions/listen` streams. When absent, listen requests are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<ListenSpec>,

    /// Deprecated server-to-client capabilities. Both default to `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<CapabilitiesSpec>,

    /// Where the sidecar writes its audit trail and how much of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditSpec>,

    /// How the admission webhook treats pods this policy selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injection: Option<InjectionSpec>,
}

/// Sidecar injection for the pods a policy selects.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InjectionSpec {
    /// When true, a selected pod that cannot be injected (host network, opted out, no named
    /// MCP port, a probe the sidecar cannot carry) is refused at admission with the reason, so
    /// no MCP server runs unprotected by accident. Unset: the webhook's
    /// `defaults.injectionRequired` decides (false unless configured). Requires a non-empty
    /// selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
}

/// Token issuers trusted for this server.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdentitySpec {
    /// Trusted issuers. A token is accepted when its `iss` equals one entry's `issuer` exactly and
    /// it validates against that entry's keys.
    #[schemars(length(min = 1, max = 16))]
    pub issuers: Vec<IssuerSpec>,

    /// How DPoP proofs (RFC 9449) are checked for key-bound tokens of every issuer: accepted
    /// algorithms, the `iat` window, server nonces. Defaults apply when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpop: Option<super::proof_of_possession::DpopSpec>,

    /// Where a trusted proxy passes the client's TLS certificate, so that certificate-bound
    /// tokens (RFC 8705, `cnf["x5t#S256"]`) can be checked. Absent: such tokens are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificates: Option<super::proof_of_possession::ClientCertificatesSpec>,
}

/// One trusted OAuth 2.1 / OpenID Connect token issuer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("has(self.jwksUri) != has(self.jwksFile)").message(rules::ISSUER_ONE_JWKS_SOURCE)
)]
pub struct IssuerSpec {
    /// Issuer identifier, compared byte for byte with the token's `iss` claim.
    #[schemars(length(min = 1, max = 2048))]
    pub issuer: String,

    /// Accepted `aud` values; a token must carry at least one. Defaults to `[spec.resource]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audiences: Option<Vec<String>>,

    /// HTTPS URL of the issuer's JSON Web Key Set. `http` is accepted only for loopback hosts.
    /// Keys are cached, refreshed in the background and refetched (rate-limited) on an unknown `kid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,

    /// Path of a local JWKS file. Standalone mode only (`lifeguard sidecar --policy`); relative
    /// paths are resolved against the policy file's directory. Rejected by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<String>,

    /// Signature algorithms accepted from this issuer. Defaults to RS256, PS256, ES256 and EdDSA.
    /// `none` and HMAC algorithms are never accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithms: Option<Vec<JwsAlgorithm>>,

    /// Names of the claims that carry the owner's identity. Defaults: subject `sub`, tenant `tid`,
    /// client `client_id`, scopes `scope`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<ClaimNames>,

    /// `optional` (default): bearer tokens are accepted, and a token bound to a key (`cnf.jkt`,
    /// sent with `Authorization: DPoP` and a `DPoP` proof) must prove that key on every
    /// request. `required`: every token must be key-bound and proven; a plain bearer token
    /// gets HTTP 401 with `WWW-Authenticate: DPoP`. Either way a task created with a key-bound
    /// token is bound to the key: only requests proving the same key may touch it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof_of_possession: Option<super::proof_of_possession::ProofOfPossession>,
}

/// Claim names used to build the owner key (issuer + subject, tenant, client) and read scopes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimNames {
    /// Claim holding the subject. Default `sub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub subject: Option<String>,
    /// Claim holding the tenant. Default `tid`. Tokens without it belong to the empty tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub tenant: Option<String>,
    /// Claim holding the OAuth client id. Default `client_id`; `azp` is used when it is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub client: Option<String>,
    /// Claim holding the granted scopes, as a space-separated string or an array. Default `scope`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub scopes: Option<String>,
}

/// How requests are handed to the protected MCP container.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSpec {
    /// `identityHeaders` (default): the container receives `Lifeguard-Issuer`,
    /// `Lifeguard-Subject`, `Lifeguard-Tenant`, `Lifeguard-Client` and `Lifeguard-Scopes` headers
    /// set by the sidecar (clients can never set them) and no bearer token. `forwardToken`: the
    /// validated token is also passed on, over loopback only, for servers that check tokens
    /// themselves (it invites servers to keep tokens: prefer `delegation`). `delegation`: no
    /// client token either; instead every request a client makes carries
    /// `Authorization: Bearer` with a short-lived assertion the sidecar signs (`sub` the owner,
    /// `act` the sidecar, the task, one tenant, the tool's scopes, `exp` at most the task's
    /// deadline and the owner's own token expiry), verifiable with the keys the sidecar
    /// publishes at `/.well-known/jwks.json` on its admin port. Requests the sidecar makes on
    /// its own (deadline, revocation and admin cancels) never carry a token or an assertion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<UpstreamIdentity>,

    /// Where the protected container keeps its task state, which decides who answers a
    /// request about an existing task when the server runs several replicas. `perReplica`
    /// (default): each replica's container keeps its own task state, so requests about a task
    /// are answered by the replica that created it; the other replicas' sidecars forward them
    /// to it over the internal hop (needs `spec.ledger`, which tells them where the task lives).
    /// `shared`: the containers share their task state (e.g. backed by Redis), so any replica
    /// asks its own container. `shared` without `spec.ledger` gets a warning: the per-pod
    /// SQLite ledgers would still not know each other's tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_state: Option<UpstreamTaskState>,
}

/// Where the protected container keeps its task state.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum UpstreamTaskState {
    #[default]
    PerReplica,
    Shared,
}

/// The task ledger shared by the replicas of one MCP server.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LedgerSpec {
    /// A key of a Secret in the policy's namespace holding the PostgreSQL connection URL
    /// (`postgres://…`). The admission webhook passes the reference to the injected sidecar
    /// as `env[].valueFrom.secretKeyRef`; the kubelet of each pod resolves it, and a pod whose
    /// Secret or key is missing does not start (`CreateContainerConfigError`). Lifeguard
    /// itself never reads the Secret.
    pub connection_secret_ref: SecretKeySelector,
}

/// What identifies the caller to the protected container.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum UpstreamIdentity {
    IdentityHeaders,
    ForwardToken,
    Delegation,
}

/// Protocol-level acceptance rules.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolSpec {
    /// Accepted `MCP-Protocol-Version` values. Default `["2026-07-28"]`. Versions older than
    /// 2026-07-28 are rejected: they would let a client downgrade a dual-era server into its
    /// session mode, where headers are not validated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<String>>,
    /// Browser origins allowed in the `Origin` header (scheme://host[:port]). Requests carrying
    /// any other `Origin` get HTTP 403. Requests without `Origin` (non-browser clients) are allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_origins: Option<Vec<String>>,
    /// Accept requests that omit the `Mcp-Name` header (a present one must still equal the
    /// body). Default `false`. A compatibility switch for clients that do not yet mirror the
    /// task ID on `tasks/get`, `tasks/update` and `tasks/cancel` (the official Python SDK 2.3);
    /// the sidecar always sends the header to the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_missing_name_header: Option<bool>,
}

/// Runtime bounds of MCP Tasks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TasksSpec {
    /// Whether any tool call may become a task. Default `true` when this section is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Tools allowed to run as tasks. Omitted means every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,

    /// Scopes a token must carry, per tool, to create the task AND for every later read, update
    /// and cancel of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 256))]
    pub required_scopes: Option<BTreeMap<String, Vec<String>>>,

    /// How long finished tasks and their results are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,

    /// Server-enforced maximum lifetime of a task; the client cannot extend it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DeadlineSpec>,

    /// Lower bound on `pollIntervalMs` given to clients. Faster polls may be answered from the
    /// ledger's cached state without reaching the server. Default `2s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub min_poll_interval: Option<PolicyDuration>,

    /// Limits on tasks that have not reached a terminal state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencySpec>,

    /// Deduplication of repeated task creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencySpec>,

    /// Scope that lets a token cancel tasks of other principals in its own tenant. Unset means
    /// nobody can cancel another principal's task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub admin_cancel_scope: Option<String>,

    /// What the sidecar keeps and returns of the server's output: a completed task's result
    /// (stored), a synchronous `tools/call` result, and, for masks, every other text the
    /// server supplies. Default: everything as the server gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<ResultsSpec>,

    /// How long a task may go without its owner presenting a valid token (on any request about
    /// it); past it the task is cancelled with reason `identity_lease_expired`. Unset: no
    /// lease (the deadline alone bounds the task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub identity_lease: Option<PolicyDuration>,

    /// Object-level permission: per tool, the object its arguments name (stored with the
    /// task), and the external authorizer asked about it at creation and on every get,
    /// update, cancel, result read and listen delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<super::objects::ObjectsSpec>,
}

/// Result minimization: applied to a completed task's result before the ledger stores it, so
/// what is returned later is exactly what was stored; to a synchronous result before it is
/// returned; and (masks) to every other text the server supplies.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResultsSpec {
    /// `full` (default) stores the result, minimized by `redact` and `maxBytes`; `statusOnly`
    /// stores none: the task reports `completed` with an empty result and a statusMessage
    /// saying the policy keeps no results (for tools whose output is delivered elsewhere), and
    /// a synchronous call returns no output either (only whether it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ResultMode>,

    /// Largest result kept, in bytes of its JSON after redaction. A larger one is replaced by
    /// an error result (`isError: true`) saying how large it was. Default: no limit of its own
    /// (the upstream body limit applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_bytes: Option<u32>,

    /// What to remove or mask before the result is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redact: Option<RedactSpec>,
}

/// Redaction rules of [`ResultsSpec`].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("!has(self.drop) || self.drop.all(p, p.startsWith('/'))")
        .message(rules::REDACT_DROP_POINTER)
        .field_path(".drop")
)]
pub struct RedactSpec {
    /// JSON pointers (RFC 6901) into the CallToolResult to remove (before it is stored, or
    /// returned by a synchronous call), e.g. `/structuredContent/customer/ssn`. A pointer that
    /// names nothing is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub drop: Option<Vec<String>>,

    /// Regular expressions (Rust `regex` syntax); every match inside any string of the result,
    /// and of every other text the server supplies (statusMessage, errors, input requests,
    /// notifications of a call), is replaced by `[redacted]`, e.g. `\b\d{3}-\d{2}-\d{4}\b`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub mask: Option<Vec<String>>,
}

/// Whether completed results are kept.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum ResultMode {
    #[default]
    Full,
    StatusOnly,
}

/// Task retention. `ttlMs` given to clients counts from creation; after it the task is purged and
/// answers exactly like an unknown task.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("!has(self.defaultTtl) || !has(self.maxTtl) || duration(self.maxTtl) >= duration(self.defaultTtl)")
        .message(rules::MAX_TTL_AT_LEAST_DEFAULT)
        .field_path(".maxTtl")
)]
pub struct RetentionSpec {
    /// TTL used when the server does not state one. Default `15m` (or `maxTtl` if smaller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub default_ttl: Option<PolicyDuration>,
    /// Upper bound on any TTL; a longer TTL from the server is clamped. Default: `defaultTtl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub max_ttl: Option<PolicyDuration>,
    /// When `true`, a completed task's result is returned to its owner once; later reads report
    /// the task as completed without the result. Default `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_result_after_retrieval: Option<bool>,
}

/// Task deadlines. When a deadline passes the sidecar fails the task ("deadline exceeded") and
/// asks the server to cancel it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("!has(self.default) || !has(self.max) || duration(self.max) >= duration(self.default)")
        .message(rules::DEADLINE_MAX_AT_LEAST_DEFAULT)
        .field_path(".max"),
    validation = Rule::new("!has(self.max) || !has(self.perTool) || self.perTool.all(t, duration(self.perTool[t]) <= duration(self.max))")
        .message(rules::DEADLINE_PER_TOOL_WITHIN_MAX)
        .field_path(".perTool")
)]
pub struct DeadlineSpec {
    /// Deadline of every task without a per-tool deadline. Default `30m` (or `max` if smaller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub default: Option<PolicyDuration>,
    /// Upper bound for every deadline in this policy. Default `2h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub max: Option<PolicyDuration>,
    /// Deadlines for specific tools, each at most `max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 256))]
    pub per_tool: Option<BTreeMap<String, PolicyDuration>>,
}

/// Concurrency quotas on non-terminal tasks, counted atomically in the task ledger.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConcurrencySpec {
    /// Per issuer+subject. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub per_principal: Option<u32>,
    /// Per tenant. Default 50.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub per_tenant: Option<u32>,
    /// Per OAuth client. Default 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub per_client: Option<u32>,
    /// For the whole server. Default 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub per_server: Option<u32>,
}

/// Idempotent task creation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IdempotencySpec {
    /// How long a key maps to the task it created. Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub window: Option<PolicyDuration>,
    /// Without an `Idempotency-Key` header, derive the key from owner, client, tool and the
    /// canonicalized arguments. Default `false`: identical calls are distinct tasks unless the
    /// client sends a key. A header key always wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derive_from_request: Option<bool>,
}

/// Which notification types a listen stream may carry.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub enum ListenNotification {
    ToolsListChanged,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceSubscriptions,
    TaskIds,
}

/// `subscriptions/listen` rules.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenSpec {
    /// Notification types clients may subscribe to. Default: toolsListChanged,
    /// promptsListChanged, resourcesListChanged and taskIds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<Vec<ListenNotification>>,
    /// Resource URIs a stream may subscribe to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_subscriptions: Option<ResourceSubscriptionsSpec>,
    /// Open streams per issuer+subject. Default 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub max_streams_per_principal: Option<u32>,
    /// Longest life of one stream; the client re-listens after it. Default `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message(rules::DURATION_POSITIVE))]
    pub max_stream_duration: Option<PolicyDuration>,
}

/// Allowed resource subscription URIs.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSubscriptionsSpec {
    /// URI patterns. `*` matches any run of characters (including `/`); everything else matches
    /// literally and the whole URI must match. Example: `reports://team-a/*`.
    #[serde(default)]
    pub allow: Vec<String>,
}

/// Gates for server-to-client capabilities deprecated in MCP 2026-07-28.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapabilitiesSpec {
    /// `sampling/createMessage` input requests. `deny` (default): never reach the client, the
    /// server receives a decline. `exception`: allowed only under an Active, signed
    /// CapabilityException that matches the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<CapabilityMode>,
    /// `roots/list` input requests. `deny` (default) or `exception`, as for `sampling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<CapabilityMode>,
    /// Server logging (deprecated in 2026-07-28). `deny` (default): `notifications/message` is
    /// dropped from response streams and `logging/setLevel` is refused. `exception`: both pass
    /// for callers an Active CapabilityException for `logging` covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<CapabilityMode>,
    /// More patterns (regular expressions) the secret scanner refuses in sampling requests,
    /// besides its built-in token shapes and the caller's own bearer token
    /// (`secret_in_context`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub secret_patterns: Vec<String>,
}

/// How a deprecated capability is treated.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum CapabilityMode {
    Deny,
    Exception,
}

/// Audit trail settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("!has(self.sink) || self.sink != 'file' || has(self.path)")
        .message(rules::AUDIT_FILE_NEEDS_PATH)
        .field_path(".path")
)]
pub struct AuditSpec {
    /// Where audit events go. Default `stdout` (JSON lines). The sidecar's `--audit-file` flag
    /// overrides this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<AuditSink>,
    /// File path for `sink: file`, inside the sidecar container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Percentage (0-100) of `task.status_read` events written. Default 100. Result reads,
    /// denials and every lifecycle event are never sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub status_read_sample_percent: Option<u8>,
    /// What the sidecar does while audit events cannot be written (the sink fails or its
    /// queue overflows). `failClosed` (default): new tasks and capability allowances are
    /// refused and `/ready` fails until writes succeed again. `failOpen`: requests are served
    /// and the loss is only counted (`lifeguard_audit_write_errors_total`,
    /// `lifeguard_audit_dropped_total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<AuditFailureMode>,
    /// Write subjects and tenants as keyed digests (`h:` + 32 hex characters, HMAC-SHA-256
    /// under a key kept in the ledger) instead of in the clear, in every event and its detail.
    /// Events still correlate by principal; `lifeguard audit digest` tells whoever
    /// may read the ledger which digest is whose. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_digests: Option<bool>,
}

/// What an unwritable audit trail does to serving.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum AuditFailureMode {
    FailClosed,
    FailOpen,
}

/// Audit sink kinds.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum AuditSink {
    Stdout,
    File,
}

/// Observed state of an McpServerPolicy, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct McpServerPolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Compiled`, `SidecarsInSync` and `Conflict` (another, older policy selects some
    /// of the same pods), each with its own `observedGeneration`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Pods matched by `spec.selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_pods: Option<i32>,
    /// Matched sidecars that acknowledged the current policy version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecars_in_sync: Option<i32>,
    /// SHA-256 of the compiled policy the sidecars should be running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hash: Option<String>,
}
