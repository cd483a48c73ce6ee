//! `POST /ssf/push`: RFC 8935 push delivery.
//!
//! 1. `Content-Type` must be `application/secevent+jwt` (parameters ignored). When every push
//!    transmitter has `pushAuthorization`, the request must carry one of their bearer tokens
//!    *before a byte of the body is read* (else `authentication_failed`); the body is then
//!    read, at most [`MAX_PUSH_BODY`] bytes within the listener's body read timeout.
//! 2. The header is checked (algorithm, `typ`), then the transmitter is found by the SET's
//!    unverified `iss`; when it has `pushAuthorization`,
//!    the request must carry that bearer token (compared in constant time), else
//!    `authentication_failed`.
//! 3. The SET is verified and applied through the receiver.
//!
//! Answers: `202 Accepted` (empty body) only once the sink recorded the SET, or when it was
//! accepted before; `400` with `{"err", "description"}` for a refusal, which the transmitter
//! must not retry; `503` with `Retry-After` when Lifeguard cannot record the SET right now
//! (the cluster API, the transmitter's keys or the push secret is unavailable). RFC 8935
//! defines no code for "try again later", and a 4xx would make the transmitter drop a
//! revocation Lifeguard never recorded, so a plain 503 asks for redelivery instead.
//!
//! A transmitter over its own limits (`revocationsPerMinute`, `maxRevocations`) gets `429 Too
//! Many Requests` with `Retry-After` and a JSON `{"description"}` saying which limit; like a
//! 503 it asks for redelivery later (RFC 6585), and nothing was recorded. A SET that reuses
//! an earlier SET's `jti` for a different event is refused with `400 invalid_request`.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use sha2::{Digest, Sha256};

use crate::runtime::http::{BodyError, BodyReadTimeout, read_body};

use super::config::SecretKeyRef;
use super::receiver::{Deferral, Outcome, SsfReceiver, Via};
use super::set::{MAX_SET_BYTES, SetError, excerpt, parse_header, unverified_issuer};

/// Path of the push endpoint.
pub const PUSH_PATH: &str = "/ssf/push";
/// Largest request body accepted.
pub const MAX_PUSH_BODY: usize = MAX_SET_BYTES;
/// `Retry-After` of a 503, in seconds.
const RETRY_AFTER_SECS: &str = "10";
/// `Retry-After` of a 429 for `maxRevocations`: revocations expire or are deleted slowly.
const LIMIT_RETRY_AFTER_SECS: u64 = 60;

/// The push endpoint, to be served by the operator (behind its TLS ingress).
pub fn router(receiver: Arc<SsfReceiver>) -> Router {
    Router::new()
        .route(PUSH_PATH, post(push))
        .layer(axum::middleware::from_fn(
            crate::telemetry::spans::http_server,
        ))
        .with_state(receiver)
}

async fn push(
    State(receiver): State<Arc<SsfReceiver>>,
    timeout: BodyReadTimeout,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let refuse = |error: SetError| {
        receiver
            .metrics()
            .count("push", "refused", error.err_code());
        tracing::info!(err = error.err_code(), %error, "pushed security event refused");
        refusal(&error)
    };
    if !is_set_media_type(&headers) {
        return refuse(SetError::Malformed(
            "Content-Type must be application/secevent+jwt".into(),
        ));
    }
    match authenticate_before_body(&receiver, &headers).await {
        Ok(()) => {}
        Err(PushAuth::Refused(reason)) => return refuse(SetError::AuthenticationFailed(reason)),
        Err(PushAuth::Unavailable) => {
            receiver
                .metrics()
                .count("push", "deferred", "secret_unavailable");
            return unavailable();
        }
    }
    let bytes = match read_body(body, MAX_PUSH_BODY, timeout).await {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge) => {
            return refuse(SetError::Malformed(format!(
                "the body is larger than {MAX_PUSH_BODY} bytes"
            )));
        }
        Err(BodyError::TimedOut | BodyError::Unreadable) => {
            return refuse(SetError::Malformed("the body could not be read".into()));
        }
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return refuse(SetError::Malformed("the body is not UTF-8".into()));
    };
    let compact = text.trim_ascii();
    let issuer = match parse_header(compact).and_then(|_| unverified_issuer(compact)) {
        Ok(issuer) => issuer,
        Err(error) => return refuse(error),
    };
    let Some(transmitter) = receiver.transmitter(&issuer) else {
        return refuse(SetError::UnknownIssuer(excerpt(&issuer)));
    };
    if let Some(secret) = &transmitter.push_authorization {
        match authenticate(&receiver, secret, &headers).await {
            Ok(()) => {}
            Err(PushAuth::Refused(reason)) => {
                return refuse(SetError::AuthenticationFailed(reason));
            }
            Err(PushAuth::Unavailable) => {
                receiver
                    .metrics()
                    .count("push", "deferred", "secret_unavailable");
                return unavailable();
            }
        }
    }
    match receiver.receive(compact, Via::Push).await {
        Outcome::Accepted { .. } | Outcome::Duplicate { .. } => {
            StatusCode::ACCEPTED.into_response()
        }
        Outcome::Refused(error) => refusal(&error),
        Outcome::Deferred(deferral @ Deferral::RateLimited(wait)) => {
            too_many(&deferral, wait.as_secs().max(1))
        }
        Outcome::Deferred(deferral @ Deferral::LimitReached { .. }) => {
            too_many(&deferral, LIMIT_RETRY_AFTER_SECS)
        }
        Outcome::Deferred(_) => unavailable(),
    }
}

fn too_many(deferral: &Deferral, retry_after_secs: u64) -> Response {
    let body = serde_json::json!({"description": deferral.to_string()});
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, retry_after_secs.to_string())],
        axum::Json(body),
    )
        .into_response()
}

fn is_set_media_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/secevent+jwt")
}

fn refusal(error: &SetError) -> Response {
    let body = serde_json::json!({"err": error.err_code(), "description": error.description()});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, RETRY_AFTER_SECS)],
    )
        .into_response()
}

enum PushAuth {
    Refused(&'static str),
    Unavailable,
}

/// Authentication before the body: when every push transmitter requires a bearer token, the
/// request must carry one of theirs. Which transmitter sent the SET is known only from the
/// body, so the token is checked against the SET's issuer again once the body is read.
async fn authenticate_before_body(
    receiver: &SsfReceiver,
    headers: &HeaderMap,
) -> Result<(), PushAuth> {
    let mut secrets = Vec::new();
    for transmitter in receiver.push_transmitters() {
        match &transmitter.push_authorization {
            Some(secret) => secrets.push(secret),
            // A transmitter without a token may push: nothing to check before the body.
            None => return Ok(()),
        }
    }
    let mut outcome = Ok(());
    for secret in secrets {
        match authenticate(receiver, secret, headers).await {
            Ok(()) => return Ok(()),
            Err(PushAuth::Unavailable) => outcome = Err(PushAuth::Unavailable),
            Err(refused) if outcome.is_ok() => outcome = Err(refused),
            Err(_) => {}
        }
    }
    outcome
}

async fn authenticate(
    receiver: &SsfReceiver,
    secret: &SecretKeyRef,
    headers: &HeaderMap,
) -> Result<(), PushAuth> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let presented = match (values.next(), values.next()) {
        (Some(value), None) => crate::identity::bearer_token(Some(value.as_bytes()))
            .map_err(|_| PushAuth::Refused("the Authorization header is not a bearer token"))?,
        (None, _) => return Err(PushAuth::Refused("no bearer token")),
        (Some(_), Some(_)) => return Err(PushAuth::Refused("more than one Authorization header")),
    };
    let expected = receiver.secrets().get(secret).await.map_err(|error| {
        tracing::warn!(%error, secret = %secret.secret_name, "cannot read the push authorization secret");
        PushAuth::Unavailable
    })?;
    let Some(expected) = expected else {
        tracing::warn!(secret = %secret.secret_name, key = %secret.key, "the push authorization secret does not exist");
        return Err(PushAuth::Unavailable);
    };
    if same_secret(presented, &expected) {
        return Ok(());
    }
    // The secret may have been rotated since it was cached.
    match receiver.secrets().reread(secret).await {
        Ok(Some(fresh)) if same_secret(presented, &fresh) => Ok(()),
        Ok(_) => Err(PushAuth::Refused(
            "the bearer token is not the expected one",
        )),
        Err(_) => Err(PushAuth::Unavailable),
    }
}

/// Compares two secrets in time independent of where they differ: both are hashed first, so
/// the comparison always runs over 32 bytes and not even the length leaks.
fn same_secret(presented: &str, expected: &str) -> bool {
    let (a, b) = (Sha256::digest(presented), Sha256::digest(expected));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
#[path = "push_tests.rs"]
mod tests;
