//! The request pipeline of `POST /mcp`: policy in force → Origin → token → envelope → protocol
//! checks → the method's handler. Each stage either passes facts on or answers.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use futures_util::future::BoxFuture;
use http::StatusCode;
use http::header::{self, HeaderMap};
use serde_json::Value;

use crate::audit::{AuditEvent, Decision};
use crate::identity::dpop::ProofError;
use crate::identity::{AuthError, Identity, Scheme, credential, validate_token};
use crate::mcp::checks::{CheckOptions, RequestKind, check_request};
use crate::mcp::codes;
use crate::mcp::jsonrpc::{ErrorObject, MAX_REQUEST_BYTES, parse_request};
use crate::mcp::refusal::{Refusal, Remediation};
use crate::runtime::http::{BodyError, BodyReadTimeout, PeerAddr, read_body};
use crate::telemetry::metrics::RateLimitedLabels;
use crate::telemetry::spans::{self, ServerSpan};

use super::active_policy::ActivePolicy;
use super::context::{Arrival, RequestContext, new_correlation_id};
use super::possession::Unproven;
use super::revocation::revocation_of;
use super::state::AppState;
use super::{client_cancel, in_flight, listen, logging_gate, relay, respond, tasks};

fn method_label(method: &str) -> &'static str {
    use crate::mcp::methods::*;
    match method {
        TOOLS_CALL => TOOLS_CALL,
        TASKS_GET => TASKS_GET,
        TASKS_UPDATE => TASKS_UPDATE,
        TASKS_CANCEL => TASKS_CANCEL,
        LISTEN => LISTEN,
        "server/discover" => "server/discover",
        "tools/list" => "tools/list",
        _ => "other",
    }
}

/// Everything before the body is read is decided from the headers alone, so a caller without a
/// valid token never gets its body read.
///
/// The request's future is boxed here and the router is handed a pointer: axum moves a
/// handler's future by value through each of its layers (tower's `MapFuture` in every boxed
/// route service), and the pipeline's future is kilobytes of async state (docs/design.md, "A
/// request's future is boxed once").
pub fn handle_mcp(
    State(app): State<Arc<AppState>>,
    body_timeout: BodyReadTimeout,
    peer: Option<PeerAddr>,
    headers: HeaderMap,
    body: Body,
) -> BoxFuture<'static, Response> {
    Box::pin(serve(
        app,
        body_timeout,
        headers,
        body,
        Arrival::Client,
        peer,
    ))
}

/// Removes the client-certificate header (`identity.clientCertificates.header`) of a client's
/// request from a peer that is not a trusted proxy, before anything reads it: only the proxy
/// that ended the client's TLS connection may say which certificate it presented. What
/// remains is what the internal hop forwards, so the home replica of a forwarded request
/// believes it.
fn drop_untrusted_certificate(
    app: &AppState,
    policy: &crate::policy::EffectivePolicy,
    peer: Option<PeerAddr>,
    headers: &mut HeaderMap,
) {
    let Some(rules) = &policy.client_certificates else {
        return;
    };
    let trusted = peer.is_some_and(|PeerAddr(addr)| rules.trusts(addr.ip()));
    if !trusted && headers.remove(rules.header.as_str()).is_some() {
        app.metrics.anomaly("untrusted_certificate_header");
        tracing::warn!(
            peer = ?peer.map(|p| p.0),
            header = rules.header,
            "a client certificate header from a peer that is not a trusted proxy was removed"
        );
    }
}

/// The pipeline for a request that arrived as `arrival` says (from a client, or forwarded by
/// another replica over the internal hop, which authenticated the hop itself); `peer` is the
/// client's connection peer (none for the hop).
pub async fn serve(
    app: Arc<AppState>,
    body_timeout: BodyReadTimeout,
    headers: HeaderMap,
    body: Body,
    arrival: Arrival,
    peer: Option<PeerAddr>,
) -> Response {
    // The request's server span (none unless traces are exported), continuing the caller's
    // trace from `traceparent`, or from the body's `_meta` once it is parsed: it starts only
    // then (or to record a refusal), because a started span's parent is fixed.
    let span = spans::server(&headers);
    let response = serve_in_span(app, body_timeout, headers, body, arrival, peer, &span).await;
    span.finish(&response);
    response
}

async fn serve_in_span(
    app: Arc<AppState>,
    body_timeout: BodyReadTimeout,
    mut headers: HeaderMap,
    body: Body,
    arrival: Arrival,
    peer: Option<PeerAddr>,
    span: &ServerSpan,
) -> Response {
    let correlation_id = new_correlation_id();
    let Some(policy) = app.policy() else {
        // Fail closed: without a policy there is nothing to enforce, so nothing passes.
        return match app.standby() {
            // No policy selects this server: waiting does not change that (remediation none).
            Some(reason) => respond::refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                &Value::Null,
                ErrorObject::new(
                    codes::INTERNAL_ERROR,
                    format!("Nothing is enabled here: {reason}"),
                ),
                &Refusal::final_("standby"),
            ),
            // A policy is on its way (the file is read, the first snapshot streamed): say so,
            // and when to ask again.
            None => respond::retry_shortly(
                &Value::Null,
                "No policy is loaded yet",
                "policy_loading",
                None,
            ),
        };
    };

    if arrival == Arrival::Client {
        drop_untrusted_certificate(&app, &policy.effective, peer, &mut headers);
    }

    if let Some(origin) = headers.get(header::ORIGIN) {
        let allowed = origin.to_str().is_ok_and(|o| {
            policy
                .effective
                .protocol
                .allowed_origins
                .iter()
                .any(|a| a == o)
        });
        if !allowed {
            deny_metric(&app, "bad_origin");
            let event = AuditEvent::new(
                "request.denied",
                &correlation_id,
                policy.stamp(),
                Decision::Deny,
                "bad_origin",
            );
            span.in_scope(|| app.denials.log(&app.audit, event, None, Instant::now()));
            // Refused before authentication: names no policy.
            return respond::refuse(
                StatusCode::FORBIDDEN,
                &Value::Null,
                ErrorObject::new(codes::INVALID_REQUEST, "Origin not allowed"),
                &Refusal::final_("bad_origin"),
            );
        }
    }

    let auth_started = spans::now(span);
    let (authenticated, from_cache) = authenticate(&app, &policy, &headers, &arrival).await;
    let auth_ended = spans::now(span);
    // A token the cache answered took no time worth a span of its own; a validation (keys,
    // perhaps a refetch) and every refusal get one.
    let auth_span = |outcome: &str| {
        if !(from_cache && outcome == "ok") {
            spans::authenticated(span, auth_started, auth_ended, outcome);
        }
    };
    let (identity, scheme) = match authenticated {
        Ok(authenticated) => authenticated,
        Err(refused) => {
            let error = &refused.error;
            auth_span(error.reason());
            let _in_span = span.enter();
            deny_metric(&app, error.reason());
            let event = AuditEvent::new(
                "auth.denied",
                &correlation_id,
                policy.stamp(),
                Decision::Deny,
                error.reason(),
            );
            match refused.revoked.as_deref() {
                // A revoked principal is named, with the revocation that refused it.
                Some((identity, revocation)) => app.denials.log(
                    &app.audit,
                    event
                        .owner(&identity.owner)
                        .detail("revocation", revocation.clone()),
                    Some(&identity.owner),
                    Instant::now(),
                ),
                None => app.denials.log(&app.audit, event, None, Instant::now()),
            }
            // The body is not read, so the answer has no id to echo.
            return refused.respond(&app, &policy);
        }
    };
    // Refusals from here on are of a known principal.
    let refuse = |reason: &'static str| {
        let _in_span = span.enter();
        deny_metric(&app, reason);
        let event = AuditEvent::new(
            "request.denied",
            &correlation_id,
            policy.stamp(),
            Decision::Deny,
            reason,
        )
        .owner(&identity.owner);
        app.denials
            .log(&app.audit, event, Some(&identity.owner), Instant::now());
    };

    let body = match read_body(body, MAX_REQUEST_BYTES, body_timeout).await {
        Ok(body) => body,
        Err(error) => return body_refused(error, body_timeout, &policy.name, refuse),
    };
    let request = match parse_request(&body) {
        Ok(r) => r,
        Err(error) => {
            auth_span("ok");
            refuse("invalid_envelope");
            let refusal = Refusal::final_("invalid_envelope").policy(&policy.name);
            return respond::refuse(StatusCode::BAD_REQUEST, &Value::Null, error, &refusal);
        }
    };
    // The caller's trace may be named in the body; from here on the span has started.
    span.continue_meta_trace(&request.message);
    span.request_id(request.id.as_ref());
    auth_span("ok");
    let method = method_label(&request.method);

    let options = CheckOptions {
        accepted_versions: &policy.effective.protocol.versions,
        allow_missing_name: policy.effective.protocol.allow_missing_name_header,
    };
    let facts = match check_request(&headers, &request, options) {
        Ok(facts) => facts,
        Err(violation) => {
            refuse(violation.reason());
            app.metrics.request(method, "deny");
            let (status, error) = violation.to_error();
            let refusal = violation.refusal().policy(&policy.name);
            return respond::refuse(status, &request.response_id(), error, &refusal);
        }
    };

    // Request-rate limits: charged once, where the client's request arrived (a request
    // forwarded by another replica was charged there).
    if arrival == Arrival::Client
        && let Some(limits) = &policy.effective.rate_limits
    {
        let tool = match &facts.kind {
            RequestKind::ToolsCall { tool } => Some(tool.as_str()),
            _ => None,
        };
        let charges =
            super::rate_limit::charges::charges_for(limits, &identity.owner, &request.method, tool);
        if let Err(refused) = app.rate_limits.admit(&charges, &app.metrics).await {
            let charge = &charges[refused.charge];
            let _in_span = span.enter();
            app.metrics
                .rate_limited
                .get_or_create(&RateLimitedLabels {
                    scope: charge.scope.label(),
                    reason: charge.family.label(),
                })
                .inc();
            deny_metric(&app, "rate_limited");
            app.metrics.request(method, "deny");
            // One line per principal and minute (the denial summary), never one per request.
            let event = AuditEvent::new(
                "request.denied",
                &correlation_id,
                policy.stamp(),
                Decision::Deny,
                "rate_limited",
            )
            .owner(&identity.owner)
            .detail("scope", charge.scope.label())
            .detail("limit", charge.family.label())
            .detail("retryAfterMs", refused.retry_after_ms);
            app.denials
                .log(&app.audit, event, Some(&identity.owner), Instant::now());
            return respond::rate_limited(
                &request.response_id(),
                refused.retry_after_ms,
                &policy.effective.policy.to_string(),
            );
        }
    }

    let policy_for_nonce = policy.clone();
    let dpop_scheme = scheme == Scheme::Dpop;
    let ctx = RequestContext {
        correlation_id,
        policy,
        identity,
        request,
        facts,
        headers,
        body,
        arrival,
    };
    // In flight until answered: only its caller may cancel it at the server.
    let in_flight = app.in_flight.enter(&ctx.identity.owner, &ctx.id());
    let dispatched = std::pin::pin!(dispatch(&app, ctx));
    let response = span.run(dispatched).await;
    let decision = if response.status().is_success() || response.status() == StatusCode::ACCEPTED {
        "allow"
    } else {
        "deny"
    };
    app.metrics.request(method, decision);
    let response = with_fresh_nonce(&app, &policy_for_nonce, dpop_scheme, response);
    in_flight::hold_until_answered(response, in_flight)
}

/// A response to a DPoP request under a policy requiring nonces carries the nonce to use next
/// (RFC 9449 §8.2), so a client never needs a refusal to learn it.
fn with_fresh_nonce(
    app: &AppState,
    policy: &ActivePolicy,
    dpop_scheme: bool,
    mut response: Response,
) -> Response {
    if dpop_scheme
        && let Some(nonce) = app.possession.nonce(&policy.effective, now_secs())
        && let Ok(value) = http::HeaderValue::from_str(&nonce)
    {
        response.headers_mut().insert(respond::DPOP_NONCE, value);
    }
    response
}

fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Hands a request that passed every check to its method's handler.
///
/// This future is as large as its largest arm, and every request's future holds it: the arms
/// that most requests take (`tools/call`, `tasks/get`, what is relayed as it is) are held
/// inline, the others boxed (`tasks/update` and `tasks/cancel`, a listen stream that lives for
/// minutes, `notifications/cancelled`), at one allocation each when they run.
async fn dispatch(app: &Arc<AppState>, ctx: RequestContext) -> Response {
    match ctx.facts.kind.clone() {
        RequestKind::ToolsCall { tool } => tasks::call_tool(app.clone(), ctx, tool).await,
        RequestKind::TaskGet { task_id } => tasks::get(app, &ctx, &task_id).await,
        RequestKind::TaskUpdate { task_id } => Box::pin(tasks::update(app, &ctx, &task_id)).await,
        RequestKind::TaskCancel { task_id } => Box::pin(tasks::cancel(app, &ctx, &task_id)).await,
        RequestKind::Listen => Box::pin(listen::listen(app.clone(), ctx)).await,
        RequestKind::Other if ctx.request.method == logging_gate::SET_LEVEL => {
            match logging_gate::logging_allowed(&ctx.policy, &ctx.identity.owner) {
                Ok(()) => relay::forward_plain(app.clone(), ctx).await,
                Err(reason) => logging_gate::refuse_set_level(app, &ctx, reason),
            }
        }
        RequestKind::Other if ctx.request.method == client_cancel::CANCELLED => {
            Box::pin(client_cancel::cancelled(app.clone(), ctx)).await
        }
        RequestKind::Other => relay::forward_plain(app.clone(), ctx).await,
    }
}

fn deny_metric(app: &AppState, reason: &'static str) {
    app.metrics.denial(reason);
}

/// The answer to an authenticated request whose body could not be read.
fn body_refused(
    error: BodyError,
    timeout: BodyReadTimeout,
    policy: &str,
    refuse: impl Fn(&'static str),
) -> Response {
    let (status, reason, message) = match error {
        BodyError::TooLarge => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("Request body exceeds {} bytes", MAX_REQUEST_BYTES),
        ),
        BodyError::TimedOut => (
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "Request body not received within {} s",
                timeout.0.as_secs_f64()
            ),
        ),
        BodyError::Unreadable => (
            StatusCode::BAD_REQUEST,
            "body_unreadable",
            "Request body could not be read".to_owned(),
        ),
    };
    refuse(reason);
    let error = ErrorObject::new(codes::INVALID_REQUEST, message);
    respond::refuse(
        status,
        &Value::Null,
        error,
        &body_refusal(reason).policy(policy),
    )
}

/// What a client can do about a body that could not be read: one too large will never pass;
/// one that came too slowly or broke off may pass when sent again.
fn body_refusal(reason: &'static str) -> Refusal {
    match reason {
        "body_too_large" => Refusal::final_(reason),
        _ => Refusal::new(
            reason,
            Remediation::Retry {
                after_ms: respond::RETRY_SHORTLY_MS,
            },
        ),
    }
}

/// Why a request was not authenticated.
struct Refused {
    error: AuthError,
    /// For a valid token of a revoked principal: who, and the revocation that refused it.
    revoked: Option<Box<(Identity, String)>>,
    /// The token came with the DPoP scheme: the challenge is DPoP's.
    dpop_scheme: bool,
    /// The proof could not be recorded against replay (503, not 401).
    unavailable: bool,
}

impl From<AuthError> for Refused {
    fn from(error: AuthError) -> Self {
        Self {
            error,
            revoked: None,
            dpop_scheme: false,
            unavailable: false,
        }
    }
}

impl Refused {
    /// The answer: 401 with the challenge the scheme and policy call for, or 503 when the
    /// replay cache could not record a proof.
    fn respond(&self, app: &AppState, policy: &ActivePolicy) -> Response {
        if self.unavailable {
            return respond::retry_shortly(
                &Value::Null,
                "The DPoP replay cache is unavailable",
                "proof_cache_unavailable",
                None,
            );
        }
        let effective = &policy.effective;
        let rules = effective.dpop_rules();
        let algs: Vec<&str> = rules.algorithms.iter().map(|a| a.as_str()).collect();
        let nonce = matches!(self.error, AuthError::Proof(ProofError::NonceRequired))
            .then(|| app.possession.nonce(effective, now_secs()))
            .flatten();
        let challenge = respond::DpopChallenge {
            metadata_url: &policy.resource_metadata_url,
            algs: &algs.join(" "),
            required: effective.requires_proof_of_possession(),
            offered: effective
                .issuers
                .iter()
                .any(|i| i.proof_of_possession == crate::api::ProofOfPossession::Required),
            nonce,
        };
        respond::unauthorized_dpop(&challenge, &Value::Null, &self.error, self.dpop_scheme)
    }
}

/// The caller's identity from the request's token and how the token was presented, refusing
/// revoked principals and key-bound tokens without proof of their key, and whether the token
/// cache answered (a token validated before and not yet expired) rather than a validation.
async fn authenticate(
    app: &AppState,
    policy: &ActivePolicy,
    headers: &HeaderMap,
    arrival: &Arrival,
) -> (Result<(Identity, Scheme), Refused>, bool) {
    let now_secs = jiff::Timestamp::now().as_second().max(0) as u64;
    let (scheme, token) = match single_credential(headers) {
        Ok(credential) => credential,
        Err(refused) => return (Err(refused), false),
    };
    let (identity, from_cache) = match policy.tokens.get(token, now_secs) {
        Some(identity) => (check_revocations(policy, identity), true),
        None => (validate(policy, token, now_secs).await, false),
    };
    let proven = match identity {
        Ok(identity) => app
            .possession
            .check(
                &policy.effective,
                headers,
                (scheme, token),
                &identity,
                *arrival == Arrival::Client,
                now_secs as i64,
            )
            .await
            .map(|()| (identity, scheme))
            .map_err(|unproven| match unproven {
                Unproven::Refused(error) => Refused::from(error),
                Unproven::Unavailable => Refused {
                    unavailable: true,
                    ..Refused::from(AuthError::ProofNotRecorded)
                },
            }),
        Err(refused) => Err(refused),
    };
    let proven = proven.map_err(|refused| Refused {
        dpop_scheme: scheme == Scheme::Dpop,
        ..refused
    });
    (proven, from_cache)
}

/// The one token of a request, and its scheme.
fn single_credential(headers: &HeaderMap) -> Result<(Scheme, &str), Refused> {
    // One credential per request: with two, which one was checked and which one the server
    // reads (forwardToken mode) could differ.
    let mut authorizations = headers.get_all(header::AUTHORIZATION).iter();
    let first = authorizations.next();
    if authorizations.next().is_some() {
        return Err(AuthError::MultipleCredentials.into());
    }
    Ok(credential(first.map(|v| v.as_bytes()))?)
}

/// Validates a token the cache did not know against the policy (refetching the issuer's keys
/// once, rate limited, when the token names an unknown key), caches the identity and refuses
/// revoked principals.
async fn validate(policy: &ActivePolicy, token: &str, now_secs: u64) -> Result<Identity, Refused> {
    let keys = |issuer: &crate::policy::TrustedIssuer| policy.keys.keys_for(issuer);
    let identity = match validate_token(token, &policy.effective, &keys, now_secs) {
        Err(AuthError::UnknownKey { issuer, .. }) => {
            let refreshed = match policy.keys.store(&issuer) {
                Some(store) => store.refresh_for_unknown_key().await,
                None => false,
            };
            if !refreshed {
                return Err(AuthError::UnknownKey { issuer, kid: None }.into());
            }
            validate_token(token, &policy.effective, &keys, now_secs)?
        }
        other => other?,
    };
    policy.tokens.insert(token, &identity);
    check_revocations(policy, identity)
}

/// Refuses tokens of a revoked principal issued at or before the revocation (or all tokens,
/// for account-level revocations).
fn check_revocations(policy: &ActivePolicy, identity: Identity) -> Result<Identity, Refused> {
    match revocation_of(policy, &identity) {
        Some(rule) => Err(Refused {
            revoked: Some(Box::new((identity, rule.name.clone()))),
            ..Refused::from(AuthError::Revoked)
        }),
        None => Ok(identity),
    }
}
