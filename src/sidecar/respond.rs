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

/// A refusal the sidecar originates: `error` with `refusal`'s structured `data` merged in, and
/// `Retry-After` (whole seconds, rounded up) when the remediation is to retry, so the header and
/// `data.retryAfterMs` always agree.
pub fn refuse(status: StatusCode, id: &Value, error: ErrorObject, refusal: &Refusal) -> Response {
    let mut response = rpc_error(status, id, &error.with_refusal(refusal));
    set_retry_after(&mut response, refusal);
    response
}

/// `Retry-After` from `refusal` (nothing when its remediation is not to retry).
pub fn set_retry_after(response: &mut Response, refusal: &Refusal) {
    if let Some(seconds) = refusal.retry_after_secs() {
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
}

/// The suggested wait before retrying a condition that passes by itself (a policy still
/// loading, a ledger or authorizer out of reach, a home replica not answering): a second is
/// long enough for a hop or a reconnecting pool, short enough that a client does not wait on a
/// recovered service.
pub const RETRY_SHORTLY_MS: u64 = 1000;

/// The uniform refusal: `reason: task_not_found`, `remediation: none`, and nothing else (no
/// policy, nothing that would tell a foreign task, a denied object and an unknown ID apart).
pub fn task_not_found(id: &Value) -> Response {
    refuse(
        StatusCode::BAD_REQUEST,
        id,
        ErrorObject::new(codes::INVALID_PARAMS, TASK_NOT_FOUND),
        &Refusal::final_("task_not_found"),
    )
}

/// The object authorizer gave no decision (fail closed): retryable, and reached only by the
/// task's owner (the ownership check comes first) or by a creation, so it tells nobody else
/// anything.
pub fn authorizer_unavailable(id: &Value, policy: &str) -> Response {
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        ErrorObject::new(
            codes::INTERNAL_ERROR,
            "Authorization is unavailable right now; retry",
        ),
        &Refusal::new(
            "authorizer_unavailable",
            Remediation::Retry {
                after_ms: RETRY_SHORTLY_MS,
            },
        )
        .policy(policy),
    )
}

/// 503 for a condition that passes by itself (a policy still loading, a home replica not
/// answering): the message, `data.retryable: true` (kept from before structured refusals),
/// `reason`, `remediation: retry`, `retryAfterMs: 1000` and `Retry-After: 1`; the policy when
/// one is in force.
pub fn retry_shortly(
    id: &Value,
    message: &str,
    reason: &'static str,
    policy: Option<&str>,
) -> Response {
    let mut refusal = Refusal::new(
        reason,
        Remediation::Retry {
            after_ms: RETRY_SHORTLY_MS,
        },
    );
    if let Some(policy) = policy {
        refusal = refusal.policy(policy);
    }
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        id,
        ErrorObject::new(codes::INTERNAL_ERROR, message)
            .with_data(serde_json::json!({"retryable": true})),
        &refusal,
    )
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
    );
    refuse(StatusCode::TOO_MANY_REQUESTS, id, error, &refusal)
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
/// does not help probe keys, issuers or revocations. The body is a JSON-RPC error (`id` null
/// when the request was refused before its body was read) with `data.reason` as coarse as the
/// challenge — `missing_token`, `expired` or `invalid_token` — and `remediation:
/// reauthenticate`; it never names the policy. The challenge stays authoritative (SEP-2643).
pub fn unauthorized(metadata_url: &str, id: &Value, error: &AuthError) -> Response {
    let (challenge, reason, message) = match error {
        AuthError::Missing => (
            format!("Bearer resource_metadata=\"{metadata_url}\""),
            "missing_token",
            "Authentication required: send a bearer token",
        ),
        AuthError::Expired => (
            format!(
                "Bearer error=\"invalid_token\", error_description=\"The access token expired\", resource_metadata=\"{metadata_url}\""
            ),
            "expired",
            "The access token expired",
        ),
        _ => (
            format!(
                "Bearer error=\"invalid_token\", error_description=\"The access token is not valid for this server\", resource_metadata=\"{metadata_url}\""
            ),
            "invalid_token",
            "The access token is not valid for this server",
        ),
    };
    let mut response = refuse(
        StatusCode::UNAUTHORIZED,
        id,
        ErrorObject::new(codes::UNAUTHORIZED, message),
        &Refusal::new(reason, Remediation::Reauthenticate),
    );
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

/// What a `WWW-Authenticate: DPoP` challenge says besides its error (RFC 9449 §7.1).
pub struct DpopChallenge<'a> {
    pub metadata_url: &'a str,
    /// The accepted proof algorithms (`algs`), space-separated.
    pub algs: &'a str,
    /// Every trusted issuer requires key-bound tokens: the Bearer challenge is left out.
    pub required: bool,
    /// Some issuer requires key-bound tokens: a request without a token gets the DPoP
    /// challenge too.
    pub offered: bool,
    /// A fresh server nonce, sent as `DPoP-Nonce` (with `use_dpop_nonce`, and whenever the
    /// policy requires nonces).
    pub nonce: Option<String>,
}

/// 401 for a request presented with the DPoP scheme, or refused for want of proof of
/// possession: a `WWW-Authenticate: DPoP` challenge whose error says what to do —
/// `use_dpop_nonce` (retry with the `DPoP-Nonce` given), `invalid_dpop_proof` (with the rule
/// the proof broke: the client made the proof, so naming the rule discloses nothing), or
/// `invalid_token` (the token is bound to a key but shown as a bearer token, is not bound but
/// shown with DPoP, or its issuer requires binding; every other token failure gets the same
/// generic description as the Bearer challenge). Requests refused without DPoP in play get
/// [`unauthorized`]'s Bearer challenge, with a DPoP challenge beside it when an issuer requires
/// key-bound tokens (alone when all do).
pub fn unauthorized_dpop(
    challenge: &DpopChallenge<'_>,
    id: &Value,
    error: &AuthError,
    dpop_scheme: bool,
) -> Response {
    let dpop_error: Option<(&str, String, &'static str)> = match error {
        AuthError::Proof(proof) => Some((
            proof.error_code(),
            capitalised(&proof.to_string()),
            proof.error_code(),
        )),
        AuthError::BoundTokenAsBearer => Some((
            "invalid_token",
            "The access token is bound to a key: present it with the DPoP scheme and a DPoP proof"
                .into(),
            "invalid_token",
        )),
        AuthError::UnboundDpopToken => Some((
            "invalid_token",
            "The access token is not bound to a DPoP key".into(),
            "invalid_token",
        )),
        AuthError::ProofOfPossessionRequired => Some((
            "invalid_token",
            "This server requires DPoP-bound access tokens".into(),
            "invalid_token",
        )),
        AuthError::Missing if !dpop_scheme => None,
        AuthError::Expired if dpop_scheme => Some((
            "invalid_token",
            "The access token expired".into(),
            "expired",
        )),
        _ if dpop_scheme => Some((
            "invalid_token",
            "The access token is not valid for this server".into(),
            "invalid_token",
        )),
        _ => None,
    };
    let bare = format!(
        "DPoP algs=\"{}\", resource_metadata=\"{}\"",
        challenge.algs, challenge.metadata_url
    );
    let mut response = match dpop_error {
        Some((code, description, reason)) => {
            let remediation = if code == "use_dpop_nonce" {
                Remediation::Retry { after_ms: 0 }
            } else {
                Remediation::Reauthenticate
            };
            let mut response = refuse(
                StatusCode::UNAUTHORIZED,
                id,
                ErrorObject::new(codes::UNAUTHORIZED, description.clone()),
                &Refusal::new(reason, remediation),
            );
            let value = format!(
                "DPoP error=\"{code}\", error_description=\"{description}\", algs=\"{}\", resource_metadata=\"{}\"",
                challenge.algs, challenge.metadata_url
            );
            if let Ok(v) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
            response
        }
        None => {
            let mut response = unauthorized(challenge.metadata_url, id, error);
            if challenge.required {
                response.headers_mut().remove(header::WWW_AUTHENTICATE);
            }
            if (challenge.offered || challenge.required)
                && let Ok(v) = HeaderValue::from_str(&bare)
            {
                response.headers_mut().append(header::WWW_AUTHENTICATE, v);
            }
            response
        }
    };
    if let Some(nonce) = &challenge.nonce
        && let Ok(v) = HeaderValue::from_str(nonce)
    {
        response.headers_mut().insert(DPOP_NONCE, v);
    }
    response
}

/// The header carrying a server nonce (RFC 9449 §8).
pub const DPOP_NONCE: &str = "dpop-nonce";

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// 403 `insufficient_scope` naming the scopes the operation needs, in the challenge and in
/// `data.scope`; `remediation: reauthenticate` (a token with those scopes), the policy that
/// requires them, and the SEP-2643 `authorization` envelope. Reached only by the caller the
/// operation is about (on a task, its owner: ownership is checked first).
pub fn insufficient_scope(
    metadata_url: &str,
    id: &Value,
    scopes: &[&str],
    policy: &str,
) -> Response {
    let scope = scopes.join(" ");
    let challenge = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{metadata_url}\""
    );
    let mut response = refuse(
        StatusCode::FORBIDDEN,
        id,
        ErrorObject::new(
            codes::INSUFFICIENT_SCOPE,
            format!("Insufficient scope: this operation needs {scope}"),
        )
        .with_data(serde_json::json!({"scope": scope})),
        &Refusal::new("insufficient_scope", Remediation::Reauthenticate)
            .policy(policy)
            .authorization(),
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

    async fn body(response: Response) -> Value {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn retry_after(response: &Response) -> Option<&str> {
        response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn challenges_do_not_reveal_why_a_token_failed() {
        let url = "https://x/.well-known/oauth-protected-resource/mcp";
        let bad_sig = unauthorized(url, &Value::Null, &AuthError::BadSignature);
        let revoked = unauthorized(url, &Value::Null, &AuthError::Revoked);
        assert_eq!(
            bad_sig.headers().get(header::WWW_AUTHENTICATE),
            revoked.headers().get(header::WWW_AUTHENTICATE)
        );
        assert_eq!(body(bad_sig).await, body(revoked).await);
        let missing = unauthorized(url, &Value::Null, &AuthError::Missing);
        let h = missing
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .unwrap()
            .to_str()
            .unwrap();
        assert!(!h.contains("error="));
        assert!(h.contains("resource_metadata=\"https://x/"));
    }

    #[tokio::test]
    async fn a_401_is_a_json_rpc_error_saying_reauthenticate_and_naming_no_policy() {
        let url = "https://x/.well-known/oauth-protected-resource/mcp";
        for (error, reason) in [
            (AuthError::Missing, "missing_token"),
            (AuthError::Expired, "expired"),
            (AuthError::Revoked, "invalid_token"),
            (AuthError::KeysUnavailable, "invalid_token"),
        ] {
            let response = unauthorized(url, &Value::Null, &error);
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
            assert!(response.headers().contains_key(header::WWW_AUTHENTICATE));
            assert_eq!(retry_after(&response), None);
            let body = body(response).await;
            assert_eq!(body["id"], Value::Null);
            assert_eq!(body["error"]["code"], codes::UNAUTHORIZED);
            assert_eq!(
                body["error"]["data"],
                serde_json::json!({"reason": reason, "remediation": "reauthenticate"}),
                "{error:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_missing_scope_keeps_its_challenge_and_carries_the_sep_2643_envelope() {
        let url = "https://x/.well-known/oauth-protected-resource/mcp";
        let response = insufficient_scope(
            url,
            &serde_json::json!(7),
            &["compute:run", "reports:read"],
            "team-a/reports",
        );
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            response.headers()[header::WWW_AUTHENTICATE],
            format!(
                "Bearer error=\"insufficient_scope\", scope=\"compute:run reports:read\", resource_metadata=\"{url}\""
            )
        );
        let body = body(response).await;
        assert_eq!(body["id"], 7);
        assert_eq!(body["error"]["code"], codes::INSUFFICIENT_SCOPE);
        assert_eq!(
            body["error"]["data"],
            serde_json::json!({
                "reason": "insufficient_scope",
                "remediation": "reauthenticate",
                "scope": "compute:run reports:read",
                "policy": "team-a/reports",
                "authorization": {"reason": "insufficient_authorization"},
            })
        );
    }

    #[tokio::test]
    async fn the_uniform_refusal_names_nothing() {
        let response = task_not_found(&serde_json::json!("a"));
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(retry_after(&response), None);
        assert_eq!(
            body(response).await,
            serde_json::json!({"jsonrpc": "2.0", "id": "a", "error": {
                "code": codes::INVALID_PARAMS, "message": TASK_NOT_FOUND,
                "data": {"reason": "task_not_found", "remediation": "none"}}})
        );
    }

    #[tokio::test]
    async fn retry_after_and_retry_after_ms_agree() {
        let shortly = retry_shortly(&Value::Null, "wait", "policy_loading", None);
        assert_eq!(shortly.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after(&shortly), Some("1"));
        assert_eq!(
            body(shortly).await["error"]["data"],
            serde_json::json!({"retryable": true, "reason": "policy_loading",
                               "remediation": "retry", "retryAfterMs": 1000})
        );
        let authorizer = authorizer_unavailable(&serde_json::json!(1), "team-a/reports");
        assert_eq!(retry_after(&authorizer), Some("1"));
        let data = &body(authorizer).await["error"]["data"];
        assert_eq!(data["reason"], "authorizer_unavailable");
        assert_eq!(data["retryAfterMs"], 1000);
        assert_eq!(data["policy"], "team-a/reports");
        let limited = rate_limited(&serde_json::json!(1), 2_001, "team-a/reports");
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&limited), Some("3"));
        assert_eq!(body(limited).await["error"]["data"]["retryAfterMs"], 2_001);
    }
}
