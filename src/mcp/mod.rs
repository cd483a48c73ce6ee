//! The MCP 2026-07-28 wire as a proxy needs it: names, JSON-RPC envelopes, the per-request
//! protocol checks, and the task shapes. Pure: no IO.
//!
//! Messages are handled as `serde_json::Value` rather than typed SDK models on purpose: a proxy
//! must forward every field it does not understand untouched, and must keep working when a
//! peer follows a slightly different draft. Typed views are provided only for the fields
//! Lifeguard decides on.

pub mod checks;
pub mod header_value;
pub mod jsonrpc;
pub mod listen;
pub mod refusal;
pub mod strict_json;
pub mod task;
pub mod task_wire;

/// The protocol revision Lifeguard enforces.
pub const PROTOCOL_VERSION: &str = "2026-07-28";

/// Extension id of the Tasks extension.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// `_meta` keys.
pub mod meta {
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
}

/// HTTP header names (lowercase, as `http` stores them).
pub mod headers {
    pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
    pub const METHOD: &str = "mcp-method";
    pub const NAME: &str = "mcp-name";
    pub const PARAM_PREFIX: &str = "mcp-param-";
    pub const SESSION_ID: &str = "mcp-session-id";
    pub const LAST_EVENT_ID: &str = "last-event-id";
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
}

/// Method names Lifeguard treats specially.
pub mod methods {
    pub const TOOLS_CALL: &str = "tools/call";
    pub const PROMPTS_GET: &str = "prompts/get";
    pub const RESOURCES_READ: &str = "resources/read";
    pub const TASKS_GET: &str = "tasks/get";
    pub const TASKS_UPDATE: &str = "tasks/update";
    pub const TASKS_CANCEL: &str = "tasks/cancel";
    pub const TASKS_LIST: &str = "tasks/list";
    pub const TASKS_RESULT: &str = "tasks/result";
    pub const LISTEN: &str = "subscriptions/listen";
    pub const NOTIFICATION_TASKS: &str = "notifications/tasks";
    pub const NOTIFICATION_PROGRESS: &str = "notifications/progress";
    pub const NOTIFICATION_MESSAGE: &str = "notifications/message";
}

/// JSON-RPC error codes used by MCP 2026-07-28.
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const HEADER_MISMATCH: i64 = -32020;
    pub const MISSING_CAPABILITY: i64 = -32021;
    pub const UNSUPPORTED_VERSION: i64 = -32022;
    /// An exhausted concurrency quota (tasks or listen streams). Outside the ranges JSON-RPC
    /// (-32768…-32000) and MCP reserve; `data.scope` names the quota.
    pub const QUOTA_EXCEEDED: i64 = -31429;
    /// The object authorizer (`tasks.objects`) refused the object a `tools/call` names. In the
    /// same Lifeguard range as [`QUOTA_EXCEEDED`].
    pub const OBJECT_FORBIDDEN: i64 = -31403;
    /// A token without a scope the operation needs (HTTP 403 `insufficient_scope`). The same
    /// code as [`OBJECT_FORBIDDEN`]: both are HTTP 403 refusals of an authenticated caller, and
    /// `data.reason` tells them apart. SEP-2643's own code is not assigned yet.
    pub const INSUFFICIENT_SCOPE: i64 = -31403;
    /// No valid token (HTTP 401 with `WWW-Authenticate`): missing, expired, or not valid here.
    pub const UNAUTHORIZED: i64 = -31401;
    /// A request-rate limit (`spec.rateLimits`) refused the request: HTTP 429, `Retry-After`,
    /// `data.retryAfterMs`. In the same Lifeguard range.
    pub const RATE_LIMITED: i64 = -31430;
}
