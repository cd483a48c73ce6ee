//! HTTP responses the sidecar produces itself.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{self, HeaderValue};
use serde_json::Value;

use crate::identity::AuthError;
use crate::mcp::codes;
use crate::mcp::jsonrpc::{ErrorObject, error_message, result_message};
use crate::mcp::refusal::{Refusal, Remediation};

/// The one answer for every task ID a caller may not see: unknown, expired, purged, or owned by
/// another subject, tenant or client. Same status, same body (apart from the request id), same
/// code path length: existence is information.
pub const TASK_NOT_FOUND: &str = "Task not found";

pub fn json(status: StatusCode, value: &Value) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// A JSON body passed on as received.
pub fn raw_json(status: StatusCode, body: bytes::Bytes) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

pub fn rpc_result(id: &Value, result: Value) -> Response {
    json(StatusCode::OK, &result_message(id, result))
}

/// A JSON-RPC error answer; its code rides along as a response extension for the request's span.
pub fn rpc_error(status: StatusCode, id: &Value, error: &ErrorObject) -> Response {
    let mut response = json(status, &error_message(id, error));
    if crate::telemetry::otel::exporting() {
        response
            .extensions_mut()
            .insert(crate::telemetry::spans::RpcErrorCode(error.code));
    }
    response
}

pub fn task_not_found(id: &Value) -> Response {
    rpc_error(
        StatusCode::BAD_REQUEST,
        id,
        &ErrorObject::new(codes::INVALID_PARAMS, TASK_NOT_FOUND),
    )
}

/// The object authorizer gave no decision (fail closed): retryable, and reached only by the
/// task's owner (the ownership check comes first), so it tells nobody else anything.
pub fn authorizer_unavailable(id: &Value) -> Response {
    let mut response = rpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        &ErrorObject::new(
            codes::INTERNAL_ERROR,
            "Authorization is unavailable right now; retry",
        ),
    );
    add_retry_after(&mut response);
    response
}

/// 503 for a condition that passes by itself (a policy still loading, a home replica not
/// answering): the message, a `data.retryable: true` a client can act on, and `Retry-After: 1`.
pub fn retry_shortly(id: &Value, message: &str) -> Response {
    let mut response = rpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        &ErrorObject::new(codes::INTERNAL_ERROR, message)
            .with_data(serde_json::json!({"retryable": true})),
    );
    add_retry_after(&mut response);
    response
}

/// A refusal by a request-rate limit: 429, `Retry-After` in whole seconds (rounded up) and the
/// structured data with `retryAfterMs`, naming the policy whose limit it is.
pub fn rate_limited(id: &Value, retry_after_ms: u64, policy: &str) -> Response {
    let refusal = Refusal::new(
        "rate_limited",
        Remediation::Retry {
            after_ms: retry_after_ms,
        },
    )
    .policy(policy);
    let error = ErrorObject::new(
        codes::RATE_LIMITED,
        format!("Too many requests: retry in {retry_after_ms} ms"),
    )
    .with_refusal(&refusal);
    let mut response = rpc_error(StatusCode::TOO_MANY_REQUESTS, id, &error);
    if let Some(seconds) = refusal.retry_after_secs() {
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// `Retry-After: 1` on a retryable refusal: a second is long enough for a hop or a
/// reconnecting pool, short enough that a client does not wait on a recovered service.
pub fn add_retry_after(response: &mut Response) {
    response.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
}

/// `https://host/path` → `https://host/.well-known/oauth-protected-resource/path` (RFC 9728).
pub fn resource_metadata_url(resource: &str) -> String {
    match url::Url::parse(resource) {
        Ok(url) => {
            let mut base = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
            if let Some(port) = url.port() {
                base.push_str(&format!(":{port}"));
            }
            let path = url.path().trim_end_matches('/');
            format!("{base}/.well-known/oauth-protected-resource{path}")
        }
        Err(_) => String::new(),
    }
}

/// 401 with `WWW-Authenticate: Bearer …` (RFC 6750, RFC 9728). A missing token gets no error
/// code; every other failure is `invalid_token` with one generic description, so the response
/// does not help probe keys, issuers or revocations.
pub fn unauthorized(metadata_url: &str, error: &AuthError) -> Response {
    let challenge = match error {
        AuthError::Missing => format!("Bearer resource_metadata=\"{metadata_url}\""),
        AuthError::Expired => format!(
            "Bearer error=\"invalid_token\", error_description=\"The access token expired\", resource_metadata=\"{metadata_url}\""
        ),
        _ => format!(
            "Bearer error=\"invalid_token\", error_description=\"The access token is not valid for this server\", resource_metadata=\"{metadata_url}\""
        ),
    };
    let body = match error {
        AuthError::Missing => serde_json::json!({"error": "unauthorized"}),
        _ => serde_json::json!({"error": "invalid_token"}),
    };
    let mut response = json(StatusCode::UNAUTHORIZED, &body);
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// 403 `insufficient_scope` naming the scopes the operation needs.
pub fn insufficient_scope(metadata_url: &str, scopes: &[&str]) -> Response {
    let scope = scopes.join(" ");
    let challenge = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{metadata_url}\""
    );
    let mut response = json(
        StatusCode::FORBIDDEN,
        &serde_json::json!({"error": "insufficient_scope", "scope": scope}),
    );
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// A plain status with an empty body.
/// A `text/event-stream` answer with `body` (SSE events).
pub fn event_stream(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        )
        .header(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"))
        .body(body)
        .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR))
}

pub fn status(code: StatusCode) -> Response {
    Response::builder()
        .status(code)
        .body(Body::empty())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_url_follows_rfc_9728() {
        assert_eq!(
            resource_metadata_url("https://reports.example.com/mcp"),
            "https://reports.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            resource_metadata_url("http://127.0.0.1:8080/mcp/"),
            "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"
        );
    }

    #[test]
    fn challenges_do_not_reveal_why_a_token_failed() {
        let url = "https://x/.well-known/oauth-protected-resource/mcp";
        let bad_sig = unauthorized(url, &AuthError::BadSignature);
        let revoked = unauthorized(url, &AuthError::Revoked);
        assert_eq!(
            bad_sig.headers().get(header::WWW_AUTHENTICATE),
            revoked.headers().get(header::WWW_AUTHENTICATE)
        );
        let missing = unauthorized(url, &AuthError::Missing);
        let h = missing
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .unwrap()
            .to_str()
            .unwrap();
        assert!(!h.contains("error="));
        assert!(h.contains("resource_metadata=\"https://x/"));
    }
}
