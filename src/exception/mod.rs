//! Capability exceptions: the detached-JWS approval of a CapabilityException, how it is signed,
//! verified and evaluated at a point in time. Pure apart from the signing key handed in.
//!
//! Signed payload: the RFC 8785 (JCS) canonical JSON of the exception's `spec` without
//! `signature`, plus `namespace` and `policy` members, so the approval covers exactly what a
//! reviewer read and is bound to where it applies. The signature is a compact JWS with a
//! detached payload (`<header>..<signature>`), `alg: EdDSA`, `typ: lifeguard-exception+jws`,
//! `kid` naming the approver key.

pub mod approver_keys;
pub mod gate;
pub mod isolation;

pub use approver_keys::ApproverKeys;

use std::collections::BTreeSet;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jiff::Timestamp;
use jsonwebtoken::{Algorithm, EncodingKey};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{CapabilityExceptionSpec, ExceptionState};
use crate::identity::KeySet;
use crate::policy::jws_shape::{
    EXCEPTION_JWS_ALG, EXCEPTION_JWS_BINDING, EXCEPTION_JWS_TYP, parse_detached_jws,
};

/// Why signing failed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("the key is not a PEM-encoded Ed25519 private key")]
    BadKey,
    #[error("cannot canonicalize the grant: {0}")]
    Canonical(String),
    #[error("signing failed: {0}")]
    Signing(String),
}

/// The bytes an approver signs: JCS of the grant plus its binding.
pub fn signing_payload(spec: &CapabilityExceptionSpec, namespace: &str) -> Result<Vec<u8>, String> {
    bound_payload(spec, namespace, &spec.policy_ref.name)
}

/// The identity of the signed grant: `sha256:` and the base64url SHA-256 of exactly the bytes
/// an approver signs ([`signing_payload`]). Every object carrying the same approved grant (a
/// copy under another name) has the same key, and any change to the grant, which needs a new
/// signature, gives a new one. Budgets are counted by it.
pub fn grant_key(spec: &CapabilityExceptionSpec, namespace: &str) -> String {
    use sha2::{Digest, Sha256};
    // The payload of a deserialized spec always serializes; an empty payload cannot collide
    // with a real grant's.
    let payload = signing_payload(spec, namespace).unwrap_or_default();
    format!(
        "sha256:{}",
        URL_SAFE_NO_PAD.encode(Sha256::digest(&payload))
    )
}

/// The payload of `spec` as if it were bound to `namespace`/`policy` (`policyRef.name` included).
fn bound_payload(
    spec: &CapabilityExceptionSpec,
    namespace: &str,
    policy: &str,
) -> Result<Vec<u8>, String> {
    let mut grant = serde_json::to_value(spec).map_err(|e| e.to_string())?;
    let Some(object) = grant.as_object_mut() else {
        return Err("the spec is not an object".into());
    };
    object.remove("signature");
    object.insert("policyRef".into(), json!({"name": policy}));
    object.insert("namespace".into(), json!(namespace));
    object.insert("policy".into(), json!(policy));
    serde_jcs::to_vec(&grant).map_err(|e| e.to_string())
}

/// The protected header of an exception signature for `spec` in `namespace`.
pub fn signing_header(spec: &CapabilityExceptionSpec, namespace: &str, kid: &str) -> Value {
    json!({
        "alg": EXCEPTION_JWS_ALG,
        "kid": kid,
        "typ": EXCEPTION_JWS_TYP,
        EXCEPTION_JWS_BINDING: format!("{namespace}/{}", spec.policy_ref.name),
    })
}

fn signing_input(encoded_header: &str, payload: &[u8]) -> String {
    format!("{encoded_header}.{}", URL_SAFE_NO_PAD.encode(payload))
}

/// Signs a grant with an Ed25519 PEM key; returns the compact detached JWS for `signature`.
pub fn sign(
    spec: &CapabilityExceptionSpec,
    namespace: &str,
    key_pem: &[u8],
    kid: &str,
) -> Result<String, SignError> {
    let key = EncodingKey::from_ed_pem(key_pem).map_err(|_| SignError::BadKey)?;
    let header = signing_header(spec, namespace, kid);
    let header = serde_jcs::to_vec(&header).map_err(|e| SignError::Canonical(e.to_string()))?;
    let encoded_header = URL_SAFE_NO_PAD.encode(header);
    let payload = signing_payload(spec, namespace).map_err(SignError::Canonical)?;
    let signature = jsonwebtoken::crypto::sign(
        signing_input(&encoded_header, &payload).as_bytes(),
        &key,
        Algorithm::EdDSA,
    )
    .map_err(|e| SignError::Signing(e.to_string()))?;
    Ok(format!("{encoded_header}..{signature}"))
}

/// The approvers Lifeguard trusts: a JWKS of Ed25519 public keys, plus lists of withdrawn key
/// ids and approval ids (`revokedKeys`, `revokedApprovals` members of the same JSON document).
#[derive(Clone, Debug, Default)]
pub struct ApproverTrust {
    pub keys: KeySet,
    pub revoked_keys: BTreeSet<String>,
    pub revoked_approvals: BTreeSet<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TrustLists {
    #[serde(default)]
    revoked_keys: BTreeSet<String>,
    #[serde(default)]
    revoked_approvals: BTreeSet<String>,
}

/// Why an approver trust document was refused.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(transparent)]
    Keys(#[from] crate::identity::keys::KeySetError),
    #[error("revocation lists: {0}")]
    Lists(#[source] serde_json::Error),
}

impl ApproverTrust {
    /// Parses the trust document (a JWKS with optional `revokedKeys`/`revokedApprovals`).
    pub fn from_json(bytes: &[u8]) -> Result<Self, TrustError> {
        let keys = KeySet::from_jwks(bytes)?;
        let lists: TrustLists = serde_json::from_slice(bytes).map_err(TrustError::Lists)?;
        Ok(Self {
            keys,
            revoked_keys: lists.revoked_keys,
            revoked_approvals: lists.revoked_approvals,
        })
    }
}

/// One check of [`verify`], with its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOutcome {
    pub check: &'static str,
    /// `Err` carries what is wrong.
    pub result: Result<String, String>,
}

/// Everything known about an exception at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verification {
    pub checks: Vec<CheckOutcome>,
    pub state: ExceptionState,
    /// The approver key id, when the signature verified.
    pub approver: Option<String>,
    /// Bounded reason code for audit and metrics (`ok` when Active).
    pub reason: &'static str,
}

/// Verifies an exception's signature and evaluates its validity window at `now`.
pub fn verify(
    spec: &CapabilityExceptionSpec,
    namespace: &str,
    trust: &ApproverTrust,
    now: Timestamp,
) -> Verification {
    let mut checks = Vec::new();
    let mut outcome = |check: &'static str, result: Result<String, String>| {
        let ok = result.is_ok();
        checks.push(CheckOutcome { check, result });
        ok
    };
    let invalid = |checks: Vec<CheckOutcome>, reason| Verification {
        checks,
        state: ExceptionState::Invalid,
        approver: None,
        reason,
    };

    let jws = match parse_detached_jws(&spec.signature) {
        Ok(jws) => {
            outcome(
                "structure",
                Ok(format!(
                    "compact JWS, detached payload, {EXCEPTION_JWS_ALG}, typ {EXCEPTION_JWS_TYP}"
                )),
            );
            jws
        }
        Err(e) => {
            outcome("structure", Err(e.to_string()));
            return invalid(checks, "bad_signature");
        }
    };
    let candidates = trust.keys.candidates(Some(&jws.kid), Algorithm::EdDSA);
    let Some(key) = candidates.first() else {
        outcome(
            "approver key",
            Err(format!("kid `{}` is not a trusted approver key", jws.kid)),
        );
        return invalid(checks, "unknown_key");
    };
    outcome("approver key", Ok(format!("kid `{}` is trusted", jws.kid)));
    if trust.revoked_keys.contains(&jws.kid) {
        outcome(
            "key not revoked",
            Err(format!("key `{}` has been revoked", jws.kid)),
        );
        return invalid(checks, "key_revoked");
    }
    outcome("key not revoked", Ok("not on the revoked-key list".into()));
    // Verify over the binding the approver signed (from the header), then compare it with where
    // the exception is: a genuine approval copied to another server is `wrong_server`, anything
    // edited or forged is `bad_signature`.
    let Some((signed_namespace, signed_policy)) = jws
        .header
        .binding
        .as_deref()
        .and_then(|b| b.split_once('/'))
    else {
        outcome(
            "signature",
            Err(format!(
                "the header has no `{EXCEPTION_JWS_BINDING}` naming <namespace>/<policy>"
            )),
        );
        return invalid(checks, "bad_signature");
    };
    let payload = match bound_payload(spec, signed_namespace, signed_policy) {
        Ok(p) => p,
        Err(e) => {
            outcome(
                "signature",
                Err(format!("cannot canonicalize the grant: {e}")),
            );
            return invalid(checks, "bad_signature");
        }
    };
    let signature = URL_SAFE_NO_PAD.encode(&jws.signature);
    let verified = jsonwebtoken::crypto::verify(
        &signature,
        signing_input(&jws.encoded_header, &payload).as_bytes(),
        &key.key,
        Algorithm::EdDSA,
    )
    .unwrap_or(false);
    if !verified {
        outcome(
            "signature",
            Err(
                "does not verify over this grant (edited after approval, or signed by another key)"
                    .into(),
            ),
        );
        return invalid(checks, "bad_signature");
    }
    outcome(
        "signature",
        Ok("verifies over the canonical grant and its binding".into()),
    );
    if (signed_namespace, signed_policy) != (namespace, spec.policy_ref.name.as_str()) {
        outcome(
            "binding",
            Err(format!(
                "approved for policy `{signed_policy}` in namespace `{signed_namespace}`, found for policy `{}` in namespace `{namespace}`",
                spec.policy_ref.name
            )),
        );
        return invalid(checks, "wrong_server");
    }
    outcome(
        "binding",
        Ok(format!(
            "policy `{signed_policy}` in namespace `{signed_namespace}`"
        )),
    );
    if trust.revoked_approvals.contains(&spec.approval_id) {
        outcome(
            "approval not revoked",
            Err(format!("approval `{}` has been revoked", spec.approval_id)),
        );
        return invalid(checks, "approval_revoked");
    }
    outcome(
        "approval not revoked",
        Ok("not on the revoked-approval list".into()),
    );
    let (state, reason) = if now < spec.not_before.0 {
        outcome(
            "valid now",
            Err(format!("not valid before {}", spec.not_before.0)),
        );
        (ExceptionState::NotYetValid, "not_yet_valid")
    } else if now >= spec.expires_at.0 {
        outcome(
            "valid now",
            Err(format!("expired at {}", spec.expires_at.0)),
        );
        (ExceptionState::Expired, "expired")
    } else {
        outcome("valid now", Ok(format!("until {}", spec.expires_at.0)));
        (ExceptionState::Active, "ok")
    };
    Verification {
        checks,
        state,
        approver: Some(jws.kid),
        reason,
    }
}

/// The header of a signature, for display (`lifeguard exception verify`).
pub fn describe_header(signature: &str) -> Option<Value> {
    let header = signature.split('.').next()?;
    let bytes = URL_SAFE_NO_PAD.decode(header).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
