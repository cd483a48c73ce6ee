//! JSON-RPC plumbing: error codes, response envelopes, the per-request `_meta` and header checks
//! of revision 2026-07-28, and a few small helpers (timestamps).

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Map, Value, json};

pub const PROTOCOL_VERSION: &str = "2026-07-28";
pub const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
pub const HEADER_MISMATCH: i64 = -32020;
pub const MISSING_CAPABILITY: i64 = -32021;
pub const UNSUPPORTED_VERSION: i64 = -32022;

/// A JSON-RPC error object.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("Method not found: {method}"))
    }

    /// -32021 naming the tasks extension as the missing capability.
    pub fn tasks_extension_required() -> Self {
        Self::new(MISSING_CAPABILITY, "Missing required client capability").with_data(json!({
            "requiredCapabilities": {"extensions": {TASKS_EXT: {}}}
        }))
    }

    pub fn to_json(&self) -> Value {
        let mut obj = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            obj["data"] = data.clone();
        }
        obj
    }

    /// The HTTP status that accompanies this error on Streamable HTTP.
    pub fn http_status(&self) -> StatusCode {
        match self.code {
            METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            INTERNAL_ERROR => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// `{"jsonrpc":"2.0","id":..,"result":..}`
pub fn result_envelope(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// `{"jsonrpc":"2.0","id":..,"error":..}` (id is `null` when the request's id is unknown).
pub fn error_envelope(id: &Value, err: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": err.to_json()})
}

/// A notification frame.
pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// An `application/json` reply for a single JSON-RPC response.
pub fn json_reply(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub fn error_reply(id: &Value, err: &RpcError) -> Response {
    json_reply(err.http_status(), &error_envelope(id, err))
}

/// What the per-request `_meta` declared that the server cares about.
#[derive(Debug, Clone, Default)]
pub struct RequestContext {
    /// Whether `clientCapabilities.extensions["io.modelcontextprotocol/tasks"]` is present.
    pub tasks_ext: bool,
    /// `_meta.progressToken`, when given.
    pub progress_token: Option<Value>,
    /// Whether the `Accept` header allows `text/event-stream`.
    pub accepts_sse: bool,
}

/// Reads a header as UTF-8, decoding the `=?base64?...?=` form used for non-header-safe values.
fn header_text(headers: &HeaderMap, name: &str) -> Option<Result<String, ()>> {
    let raw = headers.get(name)?;
    let Ok(text) = raw.to_str() else {
        return Some(Err(()));
    };
    let text = text.trim();
    if let Some(inner) = text
        .strip_prefix("=?base64?")
        .and_then(|t| t.strip_suffix("?="))
    {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(inner)
            .ok()
            .and_then(|b| String::from_utf8(b).ok());
        return Some(decoded.ok_or(()));
    }
    Some(Ok(text.to_owned()))
}

/// Checks the protocol version header/meta pair, the required capabilities key and, when the
/// client sent them, the `Mcp-Method` / `Mcp-Name` routing headers.
///
/// Header problems (missing, malformed, or different from the body) are -32020; missing `_meta`
/// keys are -32602; a well-formed but unsupported version is -32022.
pub fn check_request(
    headers: &HeaderMap,
    method: &str,
    params: Option<&Value>,
) -> Result<RequestContext, RpcError> {
    let params = match params {
        None => {
            return Err(RpcError::invalid_params(
                "Missing params (params._meta is required)",
            ));
        }
        Some(Value::Object(p)) => p,
        Some(_) => return Err(RpcError::invalid_params("params must be an object")),
    };
    let meta = match params.get("_meta") {
        Some(Value::Object(m)) => m,
        Some(_) => return Err(RpcError::invalid_params("params._meta must be an object")),
        None => return Err(RpcError::invalid_params("Missing params._meta")),
    };
    let body_version = match meta.get(META_PROTOCOL_VERSION) {
        Some(Value::String(v)) => v.as_str(),
        Some(_) => {
            return Err(RpcError::invalid_params(format!(
                "_meta[\"{META_PROTOCOL_VERSION}\"] must be a string"
            )));
        }
        None => {
            return Err(RpcError::invalid_params(format!(
                "Missing _meta[\"{META_PROTOCOL_VERSION}\"]"
            )));
        }
    };
    let header_version = match header_text(headers, "mcp-protocol-version") {
        None => {
            return Err(RpcError::new(
                HEADER_MISMATCH,
                "Missing MCP-Protocol-Version header",
            ));
        }
        Some(Err(())) => {
            return Err(RpcError::new(
                HEADER_MISMATCH,
                "Malformed MCP-Protocol-Version header",
            ));
        }
        Some(Ok(v)) => v,
    };
    if header_version != body_version {
        return Err(RpcError::new(
            HEADER_MISMATCH,
            format!(
                "MCP-Protocol-Version header ({header_version}) differs from \
                 _meta[\"{META_PROTOCOL_VERSION}\"] ({body_version})"
            ),
        ));
    }
    if body_version != PROTOCOL_VERSION {
        return Err(
            RpcError::new(UNSUPPORTED_VERSION, "Unsupported protocol version").with_data(json!({
                "supported": [PROTOCOL_VERSION],
                "requested": body_version,
            })),
        );
    }
    let caps = match meta.get(META_CLIENT_CAPABILITIES) {
        Some(Value::Object(c)) => c,
        Some(_) => {
            return Err(RpcError::invalid_params(format!(
                "_meta[\"{META_CLIENT_CAPABILITIES}\"] must be an object"
            )));
        }
        None => {
            return Err(RpcError::invalid_params(format!(
                "Missing _meta[\"{META_CLIENT_CAPABILITIES}\"]"
            )));
        }
    };
    check_routing_headers(headers, method, params)?;

    let tasks_ext = caps
        .get("extensions")
        .and_then(Value::as_object)
        .is_some_and(|e| e.contains_key(TASKS_EXT));
    let progress_token = meta
        .get("progressToken")
        .filter(|t| t.is_string() || t.is_number())
        .cloned();
    let accepts_sse = headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/event-stream"));
    Ok(RequestContext {
        tasks_ext,
        progress_token,
        accepts_sse,
    })
}

/// `Mcp-Method` and `Mcp-Name` are validated only when present (this peer is lenient about
/// their absence, strict about a disagreement with the body).
fn check_routing_headers(
    headers: &HeaderMap,
    method: &str,
    params: &Map<String, Value>,
) -> Result<(), RpcError> {
    match header_text(headers, "mcp-method") {
        None => {}
        Some(Ok(m)) if m == method => {}
        Some(_) => {
            return Err(RpcError::new(
                HEADER_MISMATCH,
                "Mcp-Method header differs from the request method",
            ));
        }
    }
    let name_field = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    if let Some(field) = name_field {
        match header_text(headers, "mcp-name") {
            None => {}
            Some(Ok(n)) if params.get(field).and_then(Value::as_str) == Some(n.as_str()) => {}
            Some(_) => {
                return Err(RpcError::new(
                    HEADER_MISMATCH,
                    format!("Mcp-Name header differs from params.{field}"),
                ));
            }
        }
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// ISO 8601 / RFC 3339 UTC timestamp with milliseconds, e.g. `2026-08-11T10:30:00.123Z`.
pub fn iso8601(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil-from-days (proleptic Gregorian), after H. Hinnant.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

#[cfg(test)]
mod tests {
    use super::iso8601;

    #[test]
    fn formats_timestamps() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso8601(1_785_196_800_000), "2026-07-28T00:00:00.000Z");
    }
}
