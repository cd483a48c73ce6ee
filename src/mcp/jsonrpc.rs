//! JSON-RPC 2.0 envelopes: parsing one request per POST, building results and errors.

use serde_json::{Map, Value, json};

use super::codes;

/// One JSON-RPC message from a client, with the parsed body kept whole so unknown fields can be
/// forwarded untouched.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// `None` for notifications.
    pub id: Option<Value>,
    pub method: String,
    /// The whole message as parsed.
    pub message: Value,
}

impl Request {
    /// `params`, when it is an object.
    pub fn params(&self) -> Option<&Map<String, Value>> {
        self.message.get("params").and_then(Value::as_object)
    }

    /// `params[key]` as a string.
    pub fn param_str(&self, key: &str) -> Option<&str> {
        self.params()
            .and_then(|p| p.get(key))
            .and_then(Value::as_str)
    }

    /// `params._meta[key]`.
    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.params()
            .and_then(|p| p.get("_meta"))
            .and_then(Value::as_object)
            .and_then(|m| m.get(key))
    }

    /// The id to answer with (`null` for notifications and unparseable ids).
    pub fn response_id(&self) -> Value {
        self.id.clone().unwrap_or(Value::Null)
    }

    pub fn is_notification(&self) -> bool {
        self.id.is_none()
    }
}

/// Whether a numeric id can be answered with the very number the client sent (JSON-RPC
/// requires the id echoed unchanged): 64-bit integers, and doubles below 2^53 in magnitude or
/// with a fraction. An integral double beyond 2^53 was an integer literal no 64-bit type holds
/// (`123456789012345678901234567890`): its digits are already lost.
fn echoes_exactly(n: &serde_json::Number) -> bool {
    if n.is_i64() || n.is_u64() {
        return true;
    }
    n.as_f64()
        .is_some_and(|x| x.is_finite() && (x.fract() != 0.0 || x.abs() < 9_007_199_254_740_992.0))
}

/// A JSON-RPC error object.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorObject {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl ErrorObject {
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

    /// Adds `refusal`'s structured members to `data` (keeping what is there).
    pub fn with_refusal(mut self, refusal: &super::refusal::Refusal) -> Self {
        self.data = Some(refusal.merged_into(self.data.take()));
        self
    }

    pub fn to_value(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

/// Upper bound on a request body; MCP requests are small, and a bound protects memory.
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Parses one JSON-RPC request or notification. Batches are not part of MCP 2026-07-28.
/// Object keys must be unique at every depth (see [`super::strict_json`]).
pub fn parse_request(body: &[u8]) -> Result<Request, ErrorObject> {
    let message = match super::strict_json::from_slice(body) {
        Ok(message) => message,
        Err(super::strict_json::StrictJsonError::DuplicateKey(key)) => {
            return Err(ErrorObject::new(
                codes::INVALID_REQUEST,
                format!("Invalid Request: the key {key:?} appears twice in one object"),
            ));
        }
        Err(super::strict_json::StrictJsonError::Syntax(_)) => {
            return Err(ErrorObject::new(
                codes::PARSE_ERROR,
                "Parse error: body is not JSON",
            ));
        }
    };
    let object = match &message {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(ErrorObject::new(
                codes::INVALID_REQUEST,
                "Invalid Request: batches are not supported; send one message per request",
            ));
        }
        _ => {
            return Err(ErrorObject::new(
                codes::INVALID_REQUEST,
                "Invalid Request: not a JSON-RPC object",
            ));
        }
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(ErrorObject::new(
            codes::INVALID_REQUEST,
            "Invalid Request: jsonrpc must be \"2.0\"",
        ));
    }
    let method = object
        .get("method")
        .and_then(Value::as_str)
        .ok_or_else(|| ErrorObject::new(codes::INVALID_REQUEST, "Invalid Request: no method"))?
        .to_owned();
    let id = match object.get("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(id @ Value::Number(n)) if echoes_exactly(n) => Some(id.clone()),
        Some(Value::Number(_)) => {
            return Err(ErrorObject::new(
                codes::INVALID_REQUEST,
                "Invalid Request: a numeric id must be an integer of at most 64 bits, or a \
                 number a double holds exactly",
            ));
        }
        Some(_) => {
            return Err(ErrorObject::new(
                codes::INVALID_REQUEST,
                "Invalid Request: id must be a string or a number",
            ));
        }
    };
    if let Some(params) = object.get("params")
        && !params.is_object()
    {
        return Err(ErrorObject::new(
            codes::INVALID_REQUEST,
            "Invalid Request: params must be an object",
        ));
    }
    Ok(Request {
        id,
        method,
        message,
    })
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`
pub fn result_message(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// `{"jsonrpc":"2.0","id":…,"error":…}`
pub fn error_message(id: &Value, error: &ErrorObject) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error.to_value()})
}

/// What an upstream message is, relative to the request being answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    /// A response (result or error) to the request with this id.
    ResponseToRequest,
    /// A response with another id (should not happen on a per-request stream).
    ForeignResponse,
    /// A notification (`method`, no `id`).
    Notification,
    /// A request from the server to the client: MCP 2026-07-28 servers never send these.
    ServerRequest,
    /// Not a JSON-RPC message.
    Invalid,
}

/// Classifies an upstream message against the id of the request it answers.
pub fn classify(message: &Value, request_id: &Value) -> MessageKind {
    let Some(object) = message.as_object() else {
        return MessageKind::Invalid;
    };
    let has_method = object.get("method").is_some_and(Value::is_string);
    let id = object.get("id");
    match (has_method, id) {
        (true, None) => MessageKind::Notification,
        (true, Some(_)) => MessageKind::ServerRequest,
        (false, Some(id)) if object.contains_key("result") || object.contains_key("error") => {
            if id == request_id {
                MessageKind::ResponseToRequest
            } else {
                MessageKind::ForeignResponse
            }
        }
        _ => MessageKind::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests_and_notifications() {
        let r = parse_request(br#"{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{}}"#)
            .unwrap();
        assert_eq!(r.id, Some(json!(7)));
        assert_eq!(r.method, "tools/list");
        let n = parse_request(br#"{"jsonrpc":"2.0","method":"notifications/x"}"#).unwrap();
        assert!(n.is_notification());
        assert_eq!(n.response_id(), Value::Null);
    }

    #[test]
    fn rejects_malformed_envelopes_with_the_right_code() {
        let cases: [(&[u8], i64); 7] = [
            (
                br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"m"}"#,
                codes::INVALID_REQUEST,
            ),
            (b"{", codes::PARSE_ERROR),
            (b"[]", codes::INVALID_REQUEST),
            (
                br#"{"jsonrpc":"1.0","id":1,"method":"m"}"#,
                codes::INVALID_REQUEST,
            ),
            (br#"{"jsonrpc":"2.0","id":1}"#, codes::INVALID_REQUEST),
            (
                br#"{"jsonrpc":"2.0","id":{},"method":"m"}"#,
                codes::INVALID_REQUEST,
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1]}"#,
                codes::INVALID_REQUEST,
            ),
        ];
        for (body, code) in cases {
            assert_eq!(parse_request(body).unwrap_err().code, code, "{body:?}");
        }
        let widest = parse_request(br#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"m"}"#)
            .expect("a u64 id is an integer id");
        assert_eq!(widest.response_id().to_string(), "18446744073709551615");
        let negative =
            parse_request(br#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"m"}"#)
                .expect("an i64 id is an integer id");
        assert_eq!(negative.response_id().to_string(), "-9223372036854775808");
        let fraction = parse_request(br#"{"jsonrpc":"2.0","id":7.5,"method":"m"}"#)
            .expect("JSON-RPC allows fractional ids");
        assert_eq!(fraction.response_id().to_string(), "7.5");
    }

    #[test]
    fn classifies_upstream_messages() {
        let id = json!("a");
        assert_eq!(
            classify(&json!({"jsonrpc":"2.0","id":"a","result":{}}), &id),
            MessageKind::ResponseToRequest
        );
        assert_eq!(
            classify(&json!({"jsonrpc":"2.0","id":"b","error":{}}), &id),
            MessageKind::ForeignResponse
        );
        assert_eq!(
            classify(
                &json!({"jsonrpc":"2.0","method":"notifications/progress"}),
                &id
            ),
            MessageKind::Notification
        );
        assert_eq!(
            classify(
                &json!({"jsonrpc":"2.0","id":1,"method":"sampling/createMessage"}),
                &id
            ),
            MessageKind::ServerRequest
        );
        assert_eq!(classify(&json!(3), &id), MessageKind::Invalid);
    }
}
