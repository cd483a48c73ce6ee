//! DPoP proofs (RFC 9449): the checks of §4.3 a resource server makes on the `DPoP` header of a
//! request that presents a DPoP-bound access token. Pure: the caller passes the request's
//! method and URI, the token, the time, the policy's rules and (when nonces are required) how
//! to recognise a current nonce. Replay is the caller's to refuse, with
//! [`VerifiedProof::replay_digest`] and [`VerifiedProof::valid_until`]: the cache is IO.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::policy::DpopRules;

use super::dpop_signature::{ProofKeys, SignatureError, parse_key, verify_with};

/// Longest proof accepted: an RSA-4096 key in the header and a few claims fit well within it.
pub const MAX_PROOF_BYTES: usize = 8 * 1024;
/// Longest `jti` accepted (RFC 9449 asks for at least 96 bits of randomness, which is 16 to 32
/// characters in any usual encoding).
pub const MAX_JTI_BYTES: usize = 256;
/// Longest nonce accepted in a proof.
pub const MAX_NONCE_BYTES: usize = 256;
/// The JWT `typ` of a DPoP proof.
pub const PROOF_TYPE: &str = "dpop+jwt";

/// JWK members that carry private or symmetric key material: a proof's `jwk` must be a public
/// key, so any of these refuses it.
const PRIVATE_MEMBERS: &[&str] = &["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

/// Why a proof was refused. Clients see `invalid_dpop_proof` (or `use_dpop_nonce`) with a short
/// description; the distinctions are for the audit log and metrics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the request has no DPoP proof")]
    Missing,
    #[error("the request has more than one DPoP header")]
    Multiple,
    #[error("the DPoP proof is not a well-formed JWT")]
    Malformed,
    #[error("the DPoP proof's typ is not dpop+jwt")]
    WrongType,
    #[error("the DPoP proof's algorithm is not accepted")]
    DisallowedAlgorithm,
    #[error("the DPoP proof's jwk is missing, private or not a usable public key")]
    BadKey,
    #[error("the DPoP proof's signature does not verify")]
    BadSignature,
    #[error("the DPoP proof lacks a valid `{0}` claim")]
    MissingClaim(&'static str),
    #[error("the DPoP proof was made for another HTTP method")]
    WrongMethod,
    #[error("the DPoP proof was made for another URI")]
    WrongUri,
    #[error("the DPoP proof's iat is outside the accepted window")]
    Stale,
    #[error("the DPoP proof's ath is not the hash of the access token")]
    WrongTokenHash,
    #[error("the DPoP proof's key is not the key the access token is bound to")]
    KeyMismatch,
    #[error("the DPoP proof carries no nonce, or one that is no longer current")]
    NonceRequired,
    #[error("the DPoP proof was used before")]
    Replayed,
}

impl ProofError {
    /// Bounded label for metrics and the audit log.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "dpop_missing",
            Self::Multiple => "dpop_multiple",
            Self::Malformed => "dpop_malformed",
            Self::WrongType => "dpop_wrong_type",
            Self::DisallowedAlgorithm => "dpop_disallowed_algorithm",
            Self::BadKey => "dpop_bad_key",
            Self::BadSignature => "dpop_bad_signature",
            Self::MissingClaim(_) => "dpop_missing_claim",
            Self::WrongMethod => "dpop_wrong_method",
            Self::WrongUri => "dpop_wrong_uri",
            Self::Stale => "dpop_stale",
            Self::WrongTokenHash => "dpop_wrong_ath",
            Self::KeyMismatch => "dpop_key_mismatch",
            Self::NonceRequired => "dpop_nonce_required",
            Self::Replayed => "dpop_replayed",
        }
    }

    /// The RFC 9449 §7.1 error code of the challenge: `use_dpop_nonce` asks the client to
    /// retry with the nonce it is given; everything else is `invalid_dpop_proof`.
    pub fn error_code(&self) -> &'static str {
        match self {
            Self::NonceRequired => "use_dpop_nonce",
            _ => "invalid_dpop_proof",
        }
    }
}

/// What a request is checked against.
pub struct ProofCheck<'a> {
    /// The request's HTTP method (`htm`).
    pub method: &'a str,
    /// The URI the client addressed (`htu`): the policy's `resource`, which is what clients
    /// address whether or not an ingress sits in front.
    pub target_uri: &'a str,
    /// The access token presented with the proof (`ath` is its hash).
    pub access_token: &'a str,
    /// The key thumbprint the token is bound to (`cnf.jkt`).
    pub bound_jkt: &'a str,
    pub now_secs: i64,
    pub rules: &'a DpopRules,
    /// When nonces are required: whether a nonce is current.
    pub nonce: Option<&'a dyn Fn(&str) -> bool>,
    /// Keys earlier proofs verified with, reused instead of built again, and kept.
    pub keys: Option<&'a ProofKeys>,
}

/// A proof that passed every check but replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedProof {
    /// The proof key's RFC 7638 thumbprint (equal to the token's `cnf.jkt`).
    pub jkt: String,
    pub jti: String,
    /// Unix seconds after which the proof's `iat` leaves the window: its `jti` must be
    /// remembered until then, and can be forgotten after.
    pub valid_until: i64,
}

impl VerifiedProof {
    /// The replay cache's key for this proof: SHA-256 over the key's thumbprint and the `jti`,
    /// so equal `jti`s of different keys never collide and the cache holds no client input.
    pub fn replay_digest(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(self.jkt.as_bytes());
        hasher.update([0u8]);
        hasher.update(self.jti.as_bytes());
        hasher.finalize().into()
    }
}

/// Checks one DPoP proof against the request, the token and the policy's rules, as RFC 9449
/// §4.3 lists them: one well-formed JWT, `typ`, an accepted asymmetric `alg`, a public `jwk`
/// whose thumbprint is the token's `cnf.jkt` (checked before the signature, the costly step),
/// the signature by that key, `htm`, `htu`, `iat` within the window, a `jti`, the nonce when
/// required, and `ath`.
pub fn verify_proof(proof: &str, check: &ProofCheck<'_>) -> Result<VerifiedProof, ProofError> {
    if proof.is_empty() || proof.len() > MAX_PROOF_BYTES {
        return Err(ProofError::Malformed);
    }
    let parts = Parts::of(proof)?;
    let header = parts.header()?;
    if !header
        .get("typ")
        .and_then(Value::as_str)
        .is_some_and(|t| t.eq_ignore_ascii_case(PROOF_TYPE))
    {
        return Err(ProofError::WrongType);
    }
    // The policy's list is both the allow-list and the parser: a name not in it is refused.
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .and_then(|name| {
            check
                .rules
                .algorithms
                .iter()
                .copied()
                .find(|a| a.as_str() == name)
        })
        .ok_or(ProofError::DisallowedAlgorithm)?;
    let jwk = header
        .get("jwk")
        .and_then(Value::as_object)
        .ok_or(ProofError::BadKey)?;
    if PRIVATE_MEMBERS.iter().any(|m| jwk.contains_key(*m)) {
        return Err(ProofError::BadKey);
    }
    let jkt = thumbprint(jwk).ok_or(ProofError::BadKey)?;
    // Before the signature (the expensive step): a proof of any key but the token's is refused
    // for the price of one SHA-256.
    if jkt != check.bound_jkt {
        return Err(ProofError::KeyMismatch);
    }
    let signature = URL_SAFE_NO_PAD
        .decode(parts.signature)
        .map_err(|_| ProofError::BadSignature)?;
    let as_proof_error = |e| match e {
        SignatureError::BadKey => ProofError::BadKey,
        SignatureError::BadSignature => ProofError::BadSignature,
    };
    let message = parts.signing_input.as_bytes();
    match check.keys.and_then(|keys| keys.get(alg, &jkt)) {
        Some(key) => verify_with(&key, message, &signature).map_err(as_proof_error)?,
        None => {
            let key = parse_key(alg, jwk).map_err(as_proof_error)?;
            verify_with(&key, message, &signature).map_err(as_proof_error)?;
            if let Some(keys) = check.keys {
                keys.insert(alg, jkt.clone(), std::sync::Arc::new(key));
            }
        }
    }
    // Only a signed payload is read.
    let claims = parts.claims()?;

    let htm = claim_str(&claims, "htm").ok_or(ProofError::MissingClaim("htm"))?;
    if htm != check.method {
        return Err(ProofError::WrongMethod);
    }
    let htu = claim_str(&claims, "htu").ok_or(ProofError::MissingClaim("htu"))?;
    if !same_target(htu, check.target_uri) {
        return Err(ProofError::WrongUri);
    }
    let iat = claims
        .get("iat")
        .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)))
        .ok_or(ProofError::MissingClaim("iat"))?;
    let window = i64::try_from(check.rules.proof_window_secs).unwrap_or(i64::MAX);
    if iat.abs_diff(check.now_secs) > window.unsigned_abs() {
        return Err(ProofError::Stale);
    }
    let jti = claim_str(&claims, "jti")
        .filter(|j| j.len() <= MAX_JTI_BYTES)
        .ok_or(ProofError::MissingClaim("jti"))?;
    if let Some(is_current) = check.nonce {
        let nonce = claim_str(&claims, "nonce").filter(|n| n.len() <= MAX_NONCE_BYTES);
        if !nonce.is_some_and(is_current) {
            return Err(ProofError::NonceRequired);
        }
    }
    let ath = claim_str(&claims, "ath").ok_or(ProofError::MissingClaim("ath"))?;
    if ath != token_hash(check.access_token) {
        return Err(ProofError::WrongTokenHash);
    }
    Ok(VerifiedProof {
        jkt,
        jti: jti.to_owned(),
        valid_until: iat.saturating_add(window),
    })
}

/// `ath`: base64url SHA-256 of the access token's ASCII (RFC 9449 §4.2).
pub fn token_hash(access_token: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(access_token.as_bytes()))
}

/// The RFC 7638 thumbprint (SHA-256, base64url) of a public JWK: the hash of its required
/// members, in lexicographic order, as compact JSON. `None` for a key type other than EC, RSA
/// and OKP, or a required member that is missing or not a string.
pub fn thumbprint(jwk: &Map<String, Value>) -> Option<String> {
    let members: &[&str] = match jwk.get("kty")?.as_str()? {
        "EC" => &["crv", "kty", "x", "y"],
        "RSA" => &["e", "kty", "n"],
        "OKP" => &["crv", "kty", "x"],
        _ => return None,
    };
    let mut canonical = Map::new();
    for member in members {
        let value = jwk.get(*member)?.as_str()?;
        canonical.insert((*member).to_owned(), Value::String(value.to_owned()));
    }
    // serde_json's map keeps keys sorted (no `preserve_order`), which is the order RFC 7638
    // asks for; the test below pins it.
    let json = serde_json::to_vec(&canonical).ok()?;
    Some(URL_SAFE_NO_PAD.encode(Sha256::digest(&json)))
}

/// A compact JWS split at its dots: the signing input (header and payload, encoded) and the
/// encoded signature.
struct Parts<'a> {
    signing_input: &'a str,
    header: &'a str,
    claims: &'a str,
    signature: &'a str,
}

impl<'a> Parts<'a> {
    fn of(proof: &'a str) -> Result<Self, ProofError> {
        let mut dots = proof.match_indices('.').map(|(i, _)| i);
        let (Some(first), Some(second), None) = (dots.next(), dots.next(), dots.next()) else {
            return Err(ProofError::Malformed);
        };
        Ok(Self {
            signing_input: &proof[..second],
            header: &proof[..first],
            claims: &proof[first + 1..second],
            signature: &proof[second + 1..],
        })
    }

    /// The JOSE header as JSON, every member kept: jsonwebtoken's `Header` would drop the
    /// private key parts of `jwk` that must be seen to be refused.
    fn header(&self) -> Result<Map<String, Value>, ProofError> {
        json_object(self.header)
    }

    fn claims(&self) -> Result<Map<String, Value>, ProofError> {
        json_object(self.claims)
    }
}

fn json_object(encoded: &str) -> Result<Map<String, Value>, ProofError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|_| ProofError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| ProofError::Malformed)
}

fn claim_str<'a>(claims: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    claims
        .get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Whether `htu` names `target` (RFC 9449 §4.3 step 9): both parsed and normalised (scheme and
/// host case, default ports, dot segments), query and fragment ignored; no user info.
fn same_target(htu: &str, target: &str) -> bool {
    // What clients send: the policy's `resource` as it is written.
    if htu == target && !htu.contains('@') {
        return true;
    }
    let (Ok(htu), Ok(target)) = (url::Url::parse(htu), url::Url::parse(target)) else {
        return false;
    };
    htu.scheme() == target.scheme()
        && htu.host_str() == target.host_str()
        && htu.port_or_known_default() == target.port_or_known_default()
        && htu.path() == target.path()
        && htu.username().is_empty()
        && htu.password().is_none()
}

#[cfg(test)]
#[path = "dpop_tests.rs"]
mod tests;
