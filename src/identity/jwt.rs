//! Local validation of bearer JWTs against a policy's trusted issuers. Pure: the caller passes
//! the issuers' current key sets and the time.

use std::collections::BTreeSet;
use std::sync::Arc;

use jsonwebtoken::Validation;
use jsonwebtoken::errors::ErrorKind;
use serde_json::{Map, Value};

use crate::model::{KeyBinding, Owner};
use crate::policy::{EffectivePolicy, TrustedIssuer};

use super::keys::{KeySet, to_jwt_algorithm};

/// Clock skew tolerated on `exp` and `nbf`.
pub const LEEWAY_SECS: u64 = 30;

/// A caller whose token validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub owner: Owner,
    pub scopes: BTreeSet<String>,
    /// `iat`, Unix seconds, when present.
    pub issued_at: Option<i64>,
    /// `exp`, Unix seconds.
    pub expires_at: i64,
    /// The key the token is bound to (its `cnf` claim), if any. Authentication passes a
    /// key-bound token only with a proof of that key, so on an authenticated request this is
    /// the key the caller proved.
    pub binding: Option<KeyBinding>,
}

impl Identity {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }
}

/// Why a token was refused. Clients see only "invalid_token" (the reason goes to the audit log
/// and metrics); the distinctions here are for operators.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token")]
    Missing,
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token's issuer is not trusted by this policy")]
    UntrustedIssuer,
    #[error("the token's algorithm is not allowed for its issuer")]
    DisallowedAlgorithm,
    #[error("no key of the issuer matches the token's key id")]
    UnknownKey { issuer: String, kid: Option<String> },
    #[error("the issuer's keys are not available")]
    KeysUnavailable,
    #[error("the signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token was not issued for this server")]
    WrongAudience,
    #[error("the token lacks the `{0}` claim")]
    MissingClaim(String),
    #[error("the token's principal has been revoked")]
    Revoked,
    #[error("more than one Authorization header")]
    MultipleCredentials,
    #[error("the token's cnf claim binds it to a key in a way this server cannot check")]
    UnsupportedConfirmation,
    #[error("a key-bound token was presented without proof of its key")]
    BoundTokenAsBearer,
    #[error("a token presented with the DPoP scheme is not bound to a DPoP key")]
    UnboundDpopToken,
    #[error("the token's issuer requires key-bound tokens")]
    ProofOfPossessionRequired,
    #[error(transparent)]
    Proof(#[from] super::dpop::ProofError),
    #[error("the DPoP proof could not be recorded against replay")]
    ProofNotRecorded,
    #[error("no client certificate from a trusted proxy for a certificate-bound token")]
    NoClientCertificate,
    #[error("the client certificate is not the one the token is bound to")]
    CertificateMismatch,
}

impl AuthError {
    /// Bounded label for metrics and the audit log.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing_token",
            Self::MultipleCredentials => "multiple_authorization",
            Self::Malformed => "malformed_token",
            Self::UntrustedIssuer => "untrusted_issuer",
            Self::DisallowedAlgorithm => "disallowed_algorithm",
            Self::UnknownKey { .. } => "unknown_key",
            Self::KeysUnavailable => "keys_unavailable",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongAudience => "wrong_audience",
            Self::MissingClaim(_) => "missing_claim",
            Self::Revoked => "revoked",
            Self::UnsupportedConfirmation => "unsupported_confirmation",
            Self::BoundTokenAsBearer => "bound_token_as_bearer",
            Self::UnboundDpopToken => "dpop_unbound_token",
            Self::ProofOfPossessionRequired => "pop_required",
            Self::Proof(e) => e.reason(),
            Self::ProofNotRecorded => "dpop_replay_cache_unavailable",
            Self::NoClientCertificate => "mtls_no_certificate",
            Self::CertificateMismatch => "mtls_certificate_mismatch",
        }
    }
}

/// How a token is presented (RFC 6750 `Bearer`, RFC 9449 `DPoP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Bearer,
    Dpop,
}

/// Extracts the scheme and token from an `Authorization` header value: `Bearer` or `DPoP`
/// (case-insensitive); any other scheme is no credential.
pub fn credential(header: Option<&[u8]>) -> Result<(Scheme, &str), AuthError> {
    let value =
        std::str::from_utf8(header.ok_or(AuthError::Missing)?).map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Malformed)?;
    let scheme = if scheme.eq_ignore_ascii_case("bearer") {
        Scheme::Bearer
    } else if scheme.eq_ignore_ascii_case("dpop") {
        Scheme::Dpop
    } else {
        return Err(AuthError::Missing);
    };
    let token = token.trim();
    if token.is_empty() || token.len() > 16 * 1024 {
        return Err(AuthError::Malformed);
    }
    Ok((scheme, token))
}

/// Extracts the bearer token from an `Authorization` header value.
pub fn bearer_token(header: Option<&[u8]>) -> Result<&str, AuthError> {
    let value =
        std::str::from_utf8(header.ok_or(AuthError::Missing)?).map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Missing);
    }
    let token = token.trim();
    if token.is_empty() || token.len() > 16 * 1024 {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}

/// Validates `token` against the policy: trusted issuer (exact `iss`), allowed asymmetric
/// algorithm, signature by one of the issuer's keys, `aud` containing an accepted audience,
/// `exp`/`nbf` within [`LEEWAY_SECS`], and the claims that make up the owner key.
///
/// `keys` returns the current key set of an issuer. An unknown `kid` yields
/// [`AuthError::UnknownKey`], so the caller can refresh that issuer's keys and try once more.
pub fn validate_token(
    token: &str,
    policy: &EffectivePolicy,
    keys: &dyn Fn(&TrustedIssuer) -> Option<Arc<KeySet>>,
    now_secs: u64,
) -> Result<Identity, AuthError> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Malformed)?;
    // The issuer decides which keys and algorithms apply, so it is read before verification;
    // nothing else from the unverified payload is used.
    let unverified: Map<String, Value> =
        jsonwebtoken::dangerous::insecure_decode_claims(token).map_err(|_| AuthError::Malformed)?;
    let iss = unverified
        .get("iss")
        .and_then(Value::as_str)
        .ok_or_else(|| AuthError::MissingClaim("iss".into()))?;
    let issuer = policy.issuer(iss).ok_or(AuthError::UntrustedIssuer)?;
    if !issuer
        .algorithms
        .iter()
        .any(|a| to_jwt_algorithm(*a) == header.alg)
    {
        return Err(AuthError::DisallowedAlgorithm);
    }
    let key_set = keys(issuer).ok_or(AuthError::KeysUnavailable)?;
    let candidates = key_set.candidates(header.kid.as_deref(), header.alg);
    if candidates.is_empty() {
        return Err(AuthError::UnknownKey {
            issuer: issuer.issuer.clone(),
            kid: header.kid.clone(),
        });
    }

    let mut validation = Validation::new(header.alg);
    validation.set_issuer(&[&issuer.issuer]);
    validation.set_audience(&issuer.audiences);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    validation.validate_nbf = true;
    validation.leeway = LEEWAY_SECS;

    let mut last_error = AuthError::BadSignature;
    let claims = candidates
        .iter()
        .take(8)
        .find_map(|candidate| {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &candidate.key, &validation) {
                Ok(data) => Some(data.claims),
                Err(e) => {
                    last_error = match e.kind() {
                        ErrorKind::ExpiredSignature => AuthError::Expired,
                        ErrorKind::ImmatureSignature => AuthError::NotYetValid,
                        ErrorKind::InvalidAudience => AuthError::WrongAudience,
                        ErrorKind::InvalidIssuer => AuthError::UntrustedIssuer,
                        ErrorKind::MissingRequiredClaim(c) => AuthError::MissingClaim(c.clone()),
                        ErrorKind::InvalidAlgorithm => AuthError::DisallowedAlgorithm,
                        _ => AuthError::BadSignature,
                    };
                    None
                }
            }
        })
        .ok_or(last_error)?;

    // jsonwebtoken checks exp against its own clock; re-check against the caller's `now` so
    // decisions stay consistent with the rest of the request (and testable).
    let expires_at = claims
        .get("exp")
        .and_then(Value::as_i64)
        .ok_or_else(|| AuthError::MissingClaim("exp".into()))?;
    if expires_at.saturating_add(LEEWAY_SECS as i64) < now_secs as i64 {
        return Err(AuthError::Expired);
    }
    identity_from_claims(&claims, issuer, expires_at)
}

fn claim_str<'a>(claims: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    claims
        .get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn identity_from_claims(
    claims: &Map<String, Value>,
    issuer: &TrustedIssuer,
    expires_at: i64,
) -> Result<Identity, AuthError> {
    let names = &issuer.claims;
    let subject = claim_str(claims, &names.subject)
        .ok_or_else(|| AuthError::MissingClaim(names.subject.clone()))?;
    let tenant = claim_str(claims, &names.tenant).unwrap_or_default();
    let client = claim_str(claims, &names.client)
        .or_else(|| claim_str(claims, "azp"))
        .unwrap_or_default();
    let scopes = match claims.get(&names.scopes) {
        Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => BTreeSet::new(),
    };
    let binding = confirmation(claims)?;
    Ok(Identity {
        owner: Owner {
            issuer: issuer.issuer.clone(),
            subject: subject.to_owned(),
            tenant: tenant.to_owned(),
            client: client.to_owned(),
        },
        scopes,
        issued_at: claims.get("iat").and_then(Value::as_i64),
        expires_at,
        binding,
    })
}

/// The key a token is bound to, from its `cnf` claim (RFC 7800): `jkt` (DPoP, RFC 9449) or
/// `x5t#S256` (a client certificate, RFC 8705). A `cnf` naming neither, or both, or with values
/// that are not strings, refuses the token: accepting it as a bearer token would drop a binding
/// its issuer meant to hold.
fn confirmation(claims: &Map<String, Value>) -> Result<Option<KeyBinding>, AuthError> {
    let Some(cnf) = claims.get("cnf") else {
        return Ok(None);
    };
    let cnf = cnf.as_object().ok_or(AuthError::UnsupportedConfirmation)?;
    let member = |name: &str| -> Result<Option<String>, AuthError> {
        match cnf.get(name) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 128 => Ok(Some(s.clone())),
            Some(_) => Err(AuthError::UnsupportedConfirmation),
        }
    };
    match (member("jkt")?, member("x5t#S256")?) {
        (Some(jkt), None) => Ok(Some(KeyBinding::Dpop { jkt })),
        (None, Some(x5t_s256)) => Ok(Some(KeyBinding::Mtls { x5t_s256 })),
        _ => Err(AuthError::UnsupportedConfirmation),
    }
}

#[cfg(test)]
#[path = "jwt_tests.rs"]
mod tests;
