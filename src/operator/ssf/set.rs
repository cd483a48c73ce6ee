//! Verification of a compact Security Event Token (RFC 8417 as SSF 1.0 profiles it). Pure: the
//! caller passes the transmitter's current keys and the time.
//!
//! Checked, in this order (each refusal names its RFC 8935 `err` code, see
//! [`SetError::err_code`]):
//! 1. three base64url parts; the header names an asymmetric algorithm (RS*, PS*, ES256/384,
//!    EdDSA: never `none`, never HMAC), `typ` is `secevent+jwt` (case-insensitive, optionally
//!    `application/`-prefixed), and no `crit` extension is asked for;
//! 2. the unverified `iss` is the expected transmitter (the caller picks it by that `iss`);
//! 3. the signature verifies with a key of the transmitter's key set (an unknown `kid` is
//!    [`SetError::UnknownKey`], so the caller may refetch the keys once and retry);
//! 4. claims: `aud` contains the receiver's audience; `iat` lies within
//!    [now − maxEventAge, now + [`MAX_FUTURE_SKEW`]]; `jti` present; `sub` and `exp` absent;
//!    `sub_id` a valid subject identifier; `events` an object of one to [`MAX_EVENTS_PER_SET`]
//!    event objects (SSF streams send one; the bound keeps what one SET can create small).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use serde_json::{Map, Value};

use crate::identity::KeySet;

use super::subject::SubjectId;

/// How far in the future a SET's `iat` may lie (clock skew between transmitter and receiver).
pub const MAX_FUTURE_SKEW: Duration = Duration::from_secs(300);
/// Largest compact SET accepted, by push or poll.
pub const MAX_SET_BYTES: usize = 64 * 1024;
/// Most events one SET may carry (SSF 1.0 SETs carry exactly one).
pub const MAX_EVENTS_PER_SET: usize = 8;
/// Longest `jti` accepted.
const MAX_JTI_LEN: usize = 1024;
/// Longest `iss` accepted (the PrincipalRevocation limit).
const MAX_ISSUER_LEN: usize = 2048;
/// Longest piece of unverified input quoted back in an error description.
const MAX_EXCERPT_CHARS: usize = 100;
/// Candidate keys tried for one SET without a `kid`.
const MAX_CANDIDATE_KEYS: usize = 8;

/// A SET whose signature and claims were checked.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifiedSet {
    /// `iss`: the transmitter.
    pub issuer: String,
    pub jti: String,
    /// `iat`, Unix seconds.
    pub iat: i64,
    /// `txn`, when present.
    pub txn: Option<String>,
    /// `sub_id`.
    pub subject: SubjectId,
    /// `events`: event type URI and event object, in URI order.
    pub events: Vec<(String, Value)>,
}

/// Why a SET was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    #[error("not a compact JWS: {0}")]
    Malformed(String),
    #[error("header typ must be secevent+jwt, found {0:?}")]
    WrongType(Option<String>),
    #[error("header asks for unsupported critical extensions")]
    CriticalExtension,
    #[error("algorithm {0} is not accepted; SETs must be signed with an asymmetric key")]
    DisallowedAlgorithm(String),
    #[error("issuer {0:?} is not a configured transmitter")]
    UnknownIssuer(String),
    #[error("issuer {0:?} is configured for another delivery method")]
    WrongDelivery(String),
    #[error("no key of the transmitter matches kid {0:?}")]
    UnknownKey(Option<String>),
    #[error("the signature does not verify")]
    BadSignature,
    #[error("aud does not contain this receiver's audience")]
    WrongAudience,
    #[error("the `{0}` claim is required")]
    MissingClaim(&'static str),
    #[error("the `{0}` claim is not allowed in a SET")]
    ForbiddenClaim(&'static str),
    #[error("the `{0}` claim is malformed")]
    InvalidClaim(&'static str),
    #[error("iat is older than the accepted event age")]
    TooOld,
    #[error("iat lies in the future")]
    FromTheFuture,
    #[error("sub_id: {0}")]
    InvalidSubject(String),
    #[error("events: {0}")]
    InvalidEvent(String),
    #[error("unsupported event {0}")]
    UnsupportedEvent(String),
    #[error("{0}")]
    AuthenticationFailed(&'static str),
    /// The transmitter used this `jti` before for a different event (another subject or other
    /// events). A `jti` names one SET (RFC 8417 §2.2), and Lifeguard names its objects after
    /// it, so the SET is refused rather than mistaken for a redelivery.
    #[error(
        "jti {0:?} was already used by this transmitter for a different event; send the event with a new jti"
    )]
    JtiReused(String),
}

impl SetError {
    /// The RFC 8935 / RFC 8936 error code a transmitter receives.
    pub fn err_code(&self) -> &'static str {
        match self {
            Self::DisallowedAlgorithm(_) | Self::UnknownKey(_) | Self::BadSignature => {
                "invalid_key"
            }
            Self::UnknownIssuer(_) | Self::WrongDelivery(_) => "invalid_issuer",
            Self::WrongAudience => "invalid_audience",
            Self::AuthenticationFailed(_) => "authentication_failed",
            Self::Malformed(_)
            | Self::WrongType(_)
            | Self::CriticalExtension
            | Self::MissingClaim(_)
            | Self::ForbiddenClaim(_)
            | Self::InvalidClaim(_)
            | Self::TooOld
            | Self::FromTheFuture
            | Self::InvalidSubject(_)
            | Self::InvalidEvent(_)
            | Self::UnsupportedEvent(_)
            | Self::JtiReused(_) => "invalid_request",
        }
    }

    /// Human-readable explanation sent along with the code.
    pub fn description(&self) -> String {
        self.to_string()
    }
}

/// The parts of a SET header the receiver acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetHeader {
    pub alg: Algorithm,
    pub kid: Option<String>,
}

fn split(token: &str) -> Result<[&str; 3], SetError> {
    if token.len() > MAX_SET_BYTES {
        return Err(SetError::Malformed(format!(
            "longer than {MAX_SET_BYTES} bytes"
        )));
    }
    let mut parts = token.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(p), Some(s), None) if !h.is_empty() && !p.is_empty() => Ok([h, p, s]),
        _ => Err(SetError::Malformed(
            "expected three dot-separated parts".into(),
        )),
    }
}

fn decode_json(part: &str, what: &str) -> Result<Map<String, Value>, SetError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| SetError::Malformed(format!("the {what} is not base64url")))?;
    serde_json::from_slice(&bytes)
        .map_err(|_| SetError::Malformed(format!("the {what} is not a JSON object")))
}

fn accepted_algorithm(alg: &str) -> Option<Algorithm> {
    Some(match alg {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// Unverified input, shortened for an error description or a log line.
pub(crate) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(MAX_EXCERPT_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

fn is_set_type(typ: &str) -> bool {
    let lower = typ.to_ascii_lowercase();
    lower.strip_prefix("application/").unwrap_or(&lower) == "secevent+jwt"
}

/// Checks the header (step 1 of the module documentation).
pub fn parse_header(token: &str) -> Result<SetHeader, SetError> {
    let [header, _, _] = split(token)?;
    let header = decode_json(header, "header")?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or_else(|| SetError::Malformed("the header has no alg".into()))?;
    let alg = accepted_algorithm(alg).ok_or_else(|| SetError::DisallowedAlgorithm(excerpt(alg)))?;
    let typ = header.get("typ").and_then(Value::as_str);
    if !typ.is_some_and(is_set_type) {
        return Err(SetError::WrongType(typ.map(excerpt)));
    }
    if header.contains_key("crit") {
        return Err(SetError::CriticalExtension);
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(SetError::Malformed("kid is not a string".into())),
    };
    Ok(SetHeader { alg, kid })
}

/// The `iss` claim, before any verification: only to pick the transmitter (and its keys and
/// push credentials). Nothing else of an unverified SET is used.
pub fn unverified_issuer(token: &str) -> Result<String, SetError> {
    let [_, payload, _] = split(token)?;
    let claims = decode_json(payload, "payload")?;
    match claims.get("iss") {
        Some(Value::String(iss)) if !iss.is_empty() && iss.len() <= MAX_ISSUER_LEN => {
            Ok(iss.clone())
        }
        None => Err(SetError::MissingClaim("iss")),
        Some(_) => Err(SetError::InvalidClaim("iss")),
    }
}

/// What a SET must satisfy besides its signature.
#[derive(Clone, Copy, Debug)]
pub struct SetRules<'a> {
    /// The transmitter whose keys are passed.
    pub issuer: &'a str,
    /// The receiver's audience.
    pub audience: &'a str,
    pub max_event_age: Duration,
}

/// Verifies `token` (see the module documentation). `now` is Unix seconds.
pub fn verify_set(
    token: &str,
    rules: &SetRules<'_>,
    keys: &KeySet,
    now: i64,
) -> Result<VerifiedSet, SetError> {
    let header = parse_header(token)?;
    let issuer = unverified_issuer(token)?;
    if issuer != rules.issuer {
        return Err(SetError::UnknownIssuer(issuer));
    }
    verify_signature(token, &header, keys)?;
    let [_, payload, _] = split(token)?;
    check_claims(decode_json(payload, "payload")?, rules, now)
}

fn verify_signature(token: &str, header: &SetHeader, keys: &KeySet) -> Result<(), SetError> {
    let candidates = keys.candidates(header.kid.as_deref(), header.alg);
    if candidates.is_empty() {
        return Err(SetError::UnknownKey(header.kid.clone()));
    }
    // `split` guarantees two dots; the signed message is everything before the last one.
    let (message, signature) = token
        .rsplit_once('.')
        .ok_or_else(|| SetError::Malformed("no signature".into()))?;
    let verified = candidates.iter().take(MAX_CANDIDATE_KEYS).any(|candidate| {
        jsonwebtoken::crypto::verify(signature, message.as_bytes(), &candidate.key, header.alg)
            .unwrap_or(false)
    });
    if verified {
        Ok(())
    } else {
        Err(SetError::BadSignature)
    }
}

fn check_claims(
    mut claims: Map<String, Value>,
    rules: &SetRules<'_>,
    now: i64,
) -> Result<VerifiedSet, SetError> {
    match claims.get("aud") {
        None => return Err(SetError::MissingClaim("aud")),
        Some(Value::String(aud)) if aud == rules.audience => {}
        Some(Value::Array(auds)) if auds.iter().any(|a| a.as_str() == Some(rules.audience)) => {}
        Some(Value::String(_) | Value::Array(_)) => return Err(SetError::WrongAudience),
        Some(_) => return Err(SetError::InvalidClaim("aud")),
    }
    for forbidden in ["sub", "exp"] {
        if claims.contains_key(forbidden) {
            return Err(SetError::ForbiddenClaim(forbidden));
        }
    }
    let iat = match claims.get("iat") {
        None => return Err(SetError::MissingClaim("iat")),
        Some(value) => numeric_date(value).ok_or(SetError::InvalidClaim("iat"))?,
    };
    let max_age = i64::try_from(rules.max_event_age.as_secs()).unwrap_or(i64::MAX);
    if iat < now.saturating_sub(max_age) {
        return Err(SetError::TooOld);
    }
    if iat > now.saturating_add(MAX_FUTURE_SKEW.as_secs() as i64) {
        return Err(SetError::FromTheFuture);
    }
    let jti = match claims.remove("jti") {
        None => return Err(SetError::MissingClaim("jti")),
        Some(Value::String(jti)) if !jti.is_empty() && jti.len() <= MAX_JTI_LEN => jti,
        Some(_) => return Err(SetError::InvalidClaim("jti")),
    };
    let txn = match claims.remove("txn") {
        None => None,
        Some(Value::String(txn)) => Some(txn),
        Some(_) => return Err(SetError::InvalidClaim("txn")),
    };
    let subject = match claims.get("sub_id") {
        None => return Err(SetError::MissingClaim("sub_id")),
        Some(value) => SubjectId::parse(value).map_err(SetError::InvalidSubject)?,
    };
    let events = match claims.remove("events") {
        None => return Err(SetError::MissingClaim("events")),
        Some(Value::Object(events)) if !events.is_empty() => events,
        Some(_) => {
            return Err(SetError::InvalidEvent(
                "must be an object with at least one event".into(),
            ));
        }
    };
    if events.len() > MAX_EVENTS_PER_SET {
        return Err(SetError::InvalidEvent(format!(
            "{} events; at most {MAX_EVENTS_PER_SET} per SET",
            events.len()
        )));
    }
    if let Some((uri, _)) = events.iter().find(|(_, event)| !event.is_object()) {
        return Err(SetError::InvalidEvent(format!(
            "{uri} is not a JSON object"
        )));
    }
    let issuer = rules.issuer.to_owned();
    Ok(VerifiedSet {
        issuer,
        jti,
        iat,
        txn,
        subject,
        events: events.into_iter().collect(),
    })
}

/// A JWT NumericDate: seconds, possibly fractional (truncated).
pub(crate) fn numeric_date(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.is_finite() && f.abs() < 1e15)
            .map(|f| f as i64)
    })
}

#[cfg(test)]
#[path = "set_tests.rs"]
mod tests;
