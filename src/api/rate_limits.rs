//! `spec.rateLimits`: how fast requests may arrive, as token buckets per principal, tenant,
//! client and server, for every request and, in addition, per method class and per tool.
//!
//! The compiled form (defaults applied) is [`crate::policy::rate_limits::RateLimitRules`].

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rules;

/// Most tools one policy may limit individually.
pub const MAX_TOOL_LIMITS: u32 = 256;
/// Longest tool name a per-tool limit may name (the MCP specification's bound on tool names).
pub const MAX_TOOL_NAME_CHARS: usize = 128;
/// Slowest rate a bucket may refill at: one request in 1000 seconds.
pub const MIN_REQUESTS_PER_SECOND: f64 = 0.001;
/// Fastest rate a bucket may refill at.
pub const MAX_REQUESTS_PER_SECOND: f64 = 1_000_000.0;
/// Largest burst a bucket may hold.
pub const MAX_BURST: u32 = 1_000_000;

/// Request-rate limits: token buckets that every request is charged against before it reaches
/// the server. A request takes one token from every bucket that applies to it: the four
/// top-level buckets for every request, the bucket of its method class (`methods`) and, for
/// `tools/call`, the bucket of the tool it calls (`tools`). It is admitted only when every one
/// of them has a token (a refused request takes none) and is otherwise refused with HTTP 429,
/// `Retry-After` and JSON-RPC error data `{reason: rate_limited, remediation: retry,
/// retryAfterMs}`. Omitted buckets do not limit. With a PostgreSQL ledger (`spec.ledger`) the
/// buckets are shared by every replica of the server; with the embedded SQLite ledger each
/// sidecar keeps its own.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("!has(self.tools) || self.tools.all(t, size(t) >= 1 && size(t) <= 128)")
        .message(rules::RATE_LIMIT_TOOL_NAME)
        .field_path(".tools")
)]
pub struct RateLimitsSpec {
    /// Every request of one principal (token issuer + subject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_principal: Option<BucketSpec>,
    /// Every request of one tenant (issuer + tenant claim). Requests whose token carries no
    /// tenant are not counted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_tenant: Option<BucketSpec>,
    /// Every request of one OAuth client (issuer + client claim). Requests whose token names no
    /// client are not counted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client: Option<BucketSpec>,
    /// Every request to the server, whoever sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_server: Option<BucketSpec>,
    /// Buckets for one class of requests, charged in addition to the top-level ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<MethodLimitsSpec>,
    /// Buckets for `tools/call` of one tool, keyed by the tool's name (1 to 128 characters),
    /// charged in addition to the top-level and `methods.toolsCall` ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = MAX_TOOL_LIMITS))]
    pub tools: Option<BTreeMap<String, ScopedLimitsSpec>>,
}

/// Buckets per method class.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MethodLimitsSpec {
    /// `tools/call` requests (every tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_call: Option<ScopedLimitsSpec>,
    /// Task polling: `tasks/get`, `tasks/list` and `tasks/result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_reads: Option<ScopedLimitsSpec>,
    /// Stream opens: `subscriptions/listen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_opens: Option<ScopedLimitsSpec>,
}

/// The buckets of one method class or one tool, per scope as at the top level of
/// `rateLimits`. Omitted buckets do not limit.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScopedLimitsSpec {
    /// Per principal (issuer + subject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_principal: Option<BucketSpec>,
    /// Per tenant (issuer + tenant); requests without a tenant are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_tenant: Option<BucketSpec>,
    /// Per OAuth client (issuer + client); requests without a client are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client: Option<BucketSpec>,
    /// For the whole server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_server: Option<BucketSpec>,
}

/// One token bucket: it holds at most `burst` tokens and gains `requestsPerSecond` tokens a
/// second; each request takes one. A full bucket admits `burst` requests at once, then
/// `requestsPerSecond` on average.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BucketSpec {
    /// Sustained rate, in requests per second: from 0.001 to 1000000, fractions allowed
    /// (`0.5` is one request every two seconds).
    #[schemars(range(min = 0.001, max = 1_000_000))]
    pub requests_per_second: f64,
    /// Most requests admitted at once after a quiet spell: from 1 to 1000000. Default: the
    /// rate rounded up, and at least 1 (`requestsPerSecond: 0.5` gives 1, `2.5` gives 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub burst: Option<u32>,
}

impl ScopedLimitsSpec {
    /// The four buckets with their field names.
    pub fn buckets(&self) -> [(&'static str, Option<&BucketSpec>); 4] {
        [
            ("perPrincipal", self.per_principal.as_ref()),
            ("perTenant", self.per_tenant.as_ref()),
            ("perClient", self.per_client.as_ref()),
            ("perServer", self.per_server.as_ref()),
        ]
    }
}

impl RateLimitsSpec {
    /// The top-level buckets as one scoped family.
    pub fn top_level(&self) -> ScopedLimitsSpec {
        ScopedLimitsSpec {
            per_principal: self.per_principal,
            per_tenant: self.per_tenant,
            per_client: self.per_client,
            per_server: self.per_server,
        }
    }
}

impl MethodLimitsSpec {
    /// The three classes with their field names.
    pub fn classes(&self) -> [(&'static str, Option<&ScopedLimitsSpec>); 3] {
        [
            ("toolsCall", self.tools_call.as_ref()),
            ("taskReads", self.task_reads.as_ref()),
            ("listenOpens", self.listen_opens.as_ref()),
        ]
    }
}
