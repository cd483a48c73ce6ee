//! The structure of an exception signature: a compact JWS with a detached payload.
//!
//! Only the shape is checked here (it is pure and needs no keys); cryptographic verification
//! against the approver key set happens where the keys are.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// The `typ` header every exception signature carries, so a JWS minted for another purpose with
/// the same key can never pass as an exception approval.
pub const EXCEPTION_JWS_TYP: &str = "lifeguard-exception+jws";
/// The only accepted algorithm (Ed25519).
pub const EXCEPTION_JWS_ALG: &str = "EdDSA";

/// The protected header of an exception signature.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExceptionJwsHeader {
    pub alg: String,
    pub typ: Option<String>,
    pub kid: Option<String>,
    pub crit: Option<Vec<String>>,
    /// `<namespace>/<policy>` the approver signed the grant for (see [`EXCEPTION_JWS_BINDING`]).
    #[serde(rename = "lifeguard.dev/binding")]
    pub binding: Option<String>,
}

/// The protected-header parameter naming where an approval applies, `<namespace>/<policy>`.
/// It is covered by the signature, and the same binding is part of the signed payload; it lets a
/// verifier tell a genuine approval applied to the wrong server from a forged or edited one.
pub const EXCEPTION_JWS_BINDING: &str = "lifeguard.dev/binding";

/// The parts of a detached compact JWS: the encoded header (part of the signing input), the
/// decoded header, and the raw signature bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetachedJws {
    pub encoded_header: String,
    pub header: ExceptionJwsHeader,
    pub kid: String,
    pub signature: Vec<u8>,
}

/// Why a signature is structurally unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwsShapeError {
    #[error("signature must be a compact JWS with a detached payload: <header>..<signature>")]
    NotCompact,
    #[error("signature must have a detached payload (the middle part must be empty)")]
    PayloadNotDetached,
    #[error("signature header is not base64url-encoded JSON")]
    BadHeader,
    #[error("signature algorithm must be EdDSA, found `{0}`")]
    WrongAlgorithm(String),
    #[error("signature header typ must be `lifeguard-exception+jws`")]
    WrongType,
    #[error("signature header must name the approver key in `kid`")]
    MissingKid,
    #[error("signature header has critical extensions Lifeguard does not understand")]
    UnknownCritical,
    #[error("signature value is not a base64url-encoded 64-byte Ed25519 signature")]
    BadSignatureValue,
}

/// Parses and checks the shape of `<header>..<signature>`.
pub fn parse_detached_jws(compact: &str) -> Result<DetachedJws, JwsShapeError> {
    let parts: Vec<&str> = compact.trim().split('.').collect();
    let [encoded_header, payload, signature] = parts.as_slice() else {
        return Err(JwsShapeError::NotCompact);
    };
    if !payload.is_empty() {
        return Err(JwsShapeError::PayloadNotDetached);
    }
    let header_bytes = URL_SAFE_NO_PAD
        .decode(encoded_header)
        .map_err(|_| JwsShapeError::BadHeader)?;
    let header: ExceptionJwsHeader =
        serde_json::from_slice(&header_bytes).map_err(|_| JwsShapeError::BadHeader)?;
    if header.alg != EXCEPTION_JWS_ALG {
        return Err(JwsShapeError::WrongAlgorithm(header.alg));
    }
    if header.typ.as_deref() != Some(EXCEPTION_JWS_TYP) {
        return Err(JwsShapeError::WrongType);
    }
    if header.crit.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(JwsShapeError::UnknownCritical);
    }
    let kid = match header.kid.as_deref() {
        Some(kid) if !kid.trim().is_empty() => kid.to_owned(),
        _ => return Err(JwsShapeError::MissingKid),
    };
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| JwsShapeError::BadSignatureValue)?;
    if signature.len() != 64 {
        return Err(JwsShapeError::BadSignatureValue);
    }
    Ok(DetachedJws {
        encoded_header: (*encoded_header).to_owned(),
        header,
        kid,
        signature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        URL_SAFE_NO_PAD.encode(s)
    }

    fn sig() -> String {
        URL_SAFE_NO_PAD.encode([7u8; 64])
    }

    #[test]
    fn accepts_a_well_formed_detached_jws() {
        let h = b64(r#"{"alg":"EdDSA","typ":"lifeguard-exception+jws","kid":"approver-1"}"#);
        let jws = parse_detached_jws(&format!("{h}..{}", sig())).unwrap();
        assert_eq!(jws.kid, "approver-1");
        assert_eq!(jws.encoded_header, h);
        assert_eq!(jws.signature.len(), 64);
    }

    #[test]
    fn rejects_each_structural_defect() {
        let good = b64(r#"{"alg":"EdDSA","typ":"lifeguard-exception+jws","kid":"k"}"#);
        let cases = [
            ("only.two".to_owned(), JwsShapeError::NotCompact),
            (
                format!("{good}.eyJ9.{}", sig()),
                JwsShapeError::PayloadNotDetached,
            ),
            (format!("!!..{}", sig()), JwsShapeError::BadHeader),
            (
                format!(
                    "{}..{}",
                    b64(r#"{"alg":"HS256","typ":"lifeguard-exception+jws","kid":"k"}"#),
                    sig()
                ),
                JwsShapeError::WrongAlgorithm("HS256".into()),
            ),
            (
                format!("{}..{}", b64(r#"{"alg":"EdDSA","kid":"k"}"#), sig()),
                JwsShapeError::WrongType,
            ),
            (
                format!(
                    "{}..{}",
                    b64(r#"{"alg":"EdDSA","typ":"lifeguard-exception+jws"}"#),
                    sig()
                ),
                JwsShapeError::MissingKid,
            ),
            (
                format!(
                    "{}..{}",
                    b64(
                        r#"{"alg":"EdDSA","typ":"lifeguard-exception+jws","kid":"k","crit":["b64"]}"#
                    ),
                    sig()
                ),
                JwsShapeError::UnknownCritical,
            ),
            (format!("{good}..AAAA"), JwsShapeError::BadSignatureValue),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_detached_jws(&input), Err(expected), "input {input}");
        }
    }
}
