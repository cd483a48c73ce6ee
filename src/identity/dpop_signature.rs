//! The signature of a DPoP proof, checked with aws-lc-rs against the public JWK in the proof's
//! own header: the key is built from the JWK's members directly, once, with no intermediate
//! key object (every proof brings its key, so nothing could be cached across proofs).

use aws_lc_rs::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value};

use crate::api::JwsAlgorithm;

/// Why a signature was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureError {
    /// The JWK is not a key of the algorithm's type and size.
    BadKey,
    /// The signature does not verify with the key.
    BadSignature,
}

/// Verifies `signature` over `message` with the public key `jwk`, for `alg`.
pub fn verify_signature(
    alg: JwsAlgorithm,
    jwk: &Map<String, Value>,
    message: &[u8],
    signature: &[u8],
) -> Result<(), SignatureError> {
    let verified =
        match alg {
            JwsAlgorithm::ES256 => ec(jwk, "P-256", 32, &signature::ECDSA_P256_SHA256_FIXED)?
                .verify(message, signature),
            JwsAlgorithm::ES384 => ec(jwk, "P-384", 48, &signature::ECDSA_P384_SHA384_FIXED)?
                .verify(message, signature),
            JwsAlgorithm::EdDSA => {
                let x = member(jwk, "x")?;
                if member_str(jwk, "kty")? != "OKP" || member_str(jwk, "crv")? != "Ed25519" {
                    return Err(SignatureError::BadKey);
                }
                UnparsedPublicKey::new(&signature::ED25519, x).verify(message, signature)
            }
            JwsAlgorithm::RS256 => {
                rsa(jwk)?.verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, signature)
            }
            JwsAlgorithm::RS384 => {
                rsa(jwk)?.verify(&signature::RSA_PKCS1_2048_8192_SHA384, message, signature)
            }
            JwsAlgorithm::RS512 => {
                rsa(jwk)?.verify(&signature::RSA_PKCS1_2048_8192_SHA512, message, signature)
            }
            JwsAlgorithm::PS256 => {
                rsa(jwk)?.verify(&signature::RSA_PSS_2048_8192_SHA256, message, signature)
            }
            JwsAlgorithm::PS384 => {
                rsa(jwk)?.verify(&signature::RSA_PSS_2048_8192_SHA384, message, signature)
            }
            JwsAlgorithm::PS512 => {
                rsa(jwk)?.verify(&signature::RSA_PSS_2048_8192_SHA512, message, signature)
            }
        };
    verified.map_err(|_| SignatureError::BadSignature)
}

/// An EC public key of curve `crv` from `x` and `y` (each `size` bytes), as the uncompressed
/// point aws-lc-rs reads.
fn ec(
    jwk: &Map<String, Value>,
    crv: &str,
    size: usize,
    algorithm: &'static signature::EcdsaVerificationAlgorithm,
) -> Result<UnparsedPublicKey<Vec<u8>>, SignatureError> {
    if member_str(jwk, "kty")? != "EC" || member_str(jwk, "crv")? != crv {
        return Err(SignatureError::BadKey);
    }
    let (x, y) = (member(jwk, "x")?, member(jwk, "y")?);
    if x.len() != size || y.len() != size {
        return Err(SignatureError::BadKey);
    }
    let mut point = Vec::with_capacity(1 + 2 * size);
    point.push(0x04);
    point.extend_from_slice(&x);
    point.extend_from_slice(&y);
    Ok(UnparsedPublicKey::new(algorithm, point))
}

fn rsa(jwk: &Map<String, Value>) -> Result<RsaPublicKeyComponents<Vec<u8>>, SignatureError> {
    if member_str(jwk, "kty")? != "RSA" {
        return Err(SignatureError::BadKey);
    }
    Ok(RsaPublicKeyComponents {
        n: member(jwk, "n")?,
        e: member(jwk, "e")?,
    })
}

fn member_str<'a>(jwk: &'a Map<String, Value>, name: &str) -> Result<&'a str, SignatureError> {
    jwk.get(name)
        .and_then(Value::as_str)
        .ok_or(SignatureError::BadKey)
}

/// A base64url member's bytes.
fn member(jwk: &Map<String, Value>, name: &str) -> Result<Vec<u8>, SignatureError> {
    URL_SAFE_NO_PAD
        .decode(member_str(jwk, name)?)
        .map_err(|_| SignatureError::BadKey)
}
