//! The signature of a DPoP proof, checked with aws-lc-rs against the public JWK in the proof's
//! own header: the key is built from the JWK's members directly, with no intermediate key
//! object, into a [`ParsedPublicKey`] — which [`ProofKeys`] keeps, so a client's next proof
//! with the same key is checked without building the key again (for RSA that includes the
//! Montgomery setup of the modulus).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lc_rs::signature::{self, ParsedPublicKey, RsaPublicKeyComponents};
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
    verify_with(&parse_key(alg, jwk)?, message, signature)
}

/// Verifies `signature` over `message` with a key [`parse_key`] built.
pub fn verify_with(
    key: &ParsedPublicKey,
    message: &[u8],
    signature: &[u8],
) -> Result<(), SignatureError> {
    key.verify_sig(message, signature)
        .map_err(|_| SignatureError::BadSignature)
}

/// The public key `jwk`, for `alg`: its `kty` (and `crv`) must be the algorithm's, and its
/// members a valid key of the algorithm's size.
pub fn parse_key(
    alg: JwsAlgorithm,
    jwk: &Map<String, Value>,
) -> Result<ParsedPublicKey, SignatureError> {
    let parsed = match alg {
        JwsAlgorithm::ES256 => ec(jwk, "P-256", 32, &signature::ECDSA_P256_SHA256_FIXED)?,
        JwsAlgorithm::ES384 => ec(jwk, "P-384", 48, &signature::ECDSA_P384_SHA384_FIXED)?,
        JwsAlgorithm::EdDSA => {
            if member_str(jwk, "kty")? != "OKP" || member_str(jwk, "crv")? != "Ed25519" {
                return Err(SignatureError::BadKey);
            }
            ParsedPublicKey::new(&signature::ED25519, member(jwk, "x")?)
        }
        JwsAlgorithm::RS256 => rsa(jwk, &signature::RSA_PKCS1_2048_8192_SHA256)?,
        JwsAlgorithm::RS384 => rsa(jwk, &signature::RSA_PKCS1_2048_8192_SHA384)?,
        JwsAlgorithm::RS512 => rsa(jwk, &signature::RSA_PKCS1_2048_8192_SHA512)?,
        JwsAlgorithm::PS256 => rsa(jwk, &signature::RSA_PSS_2048_8192_SHA256)?,
        JwsAlgorithm::PS384 => rsa(jwk, &signature::RSA_PSS_2048_8192_SHA384)?,
        JwsAlgorithm::PS512 => rsa(jwk, &signature::RSA_PSS_2048_8192_SHA512)?,
    };
    parsed.map_err(|_| SignatureError::BadKey)
}

/// Most keys [`ProofKeys`] holds; when full it starts again empty.
pub const MAX_PROOF_KEYS: usize = 4_096;

/// Public keys of proofs that verified, by algorithm and RFC 7638 thumbprint.
///
/// Only a key whose thumbprint is the `cnf.jkt` of a token that validated is looked up or
/// added (the proof's key is compared with the token's binding before its signature is
/// checked), and a thumbprint is a SHA-256 over the key's required members: an entry found
/// under the thumbprint of a proof's JWK is that JWK's key. Keys are added only after a
/// signature verified with them. Bounded by [`MAX_PROOF_KEYS`], so a flood of tokens bound to
/// ever new keys costs a parse per proof, as without the cache, and no memory.
#[derive(Default)]
pub struct ProofKeys {
    keys: Mutex<HashMap<String, (JwsAlgorithm, Arc<ParsedPublicKey>)>>,
}

impl ProofKeys {
    /// The key of `alg` with thumbprint `jkt`, if a proof verified with it.
    pub fn get(&self, alg: JwsAlgorithm, jkt: &str) -> Option<Arc<ParsedPublicKey>> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        match keys.get(jkt) {
            Some((kept, key)) if *kept == alg => Some(Arc::clone(key)),
            _ => None,
        }
    }

    /// Keeps a key a proof verified with.
    pub fn insert(&self, alg: JwsAlgorithm, jkt: String, key: Arc<ParsedPublicKey>) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.len() >= MAX_PROOF_KEYS {
            keys.clear();
        }
        keys.insert(jkt, (alg, key));
    }

    /// The algorithm and thumbprint of every key held.
    pub fn thumbprints(&self) -> Vec<(JwsAlgorithm, String)> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.iter()
            .map(|(jkt, (alg, _))| (*alg, jkt.clone()))
            .collect()
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An EC public key of curve `crv` from `x` and `y` (each `size` bytes), as the uncompressed
/// point aws-lc-rs reads.
fn ec(
    jwk: &Map<String, Value>,
    crv: &str,
    size: usize,
    algorithm: &'static signature::EcdsaVerificationAlgorithm,
) -> Result<Result<ParsedPublicKey, aws_lc_rs::error::KeyRejected>, SignatureError> {
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
    Ok(ParsedPublicKey::new(algorithm, point))
}

fn rsa(
    jwk: &Map<String, Value>,
    params: &'static signature::RsaParameters,
) -> Result<Result<ParsedPublicKey, aws_lc_rs::error::KeyRejected>, SignatureError> {
    if member_str(jwk, "kty")? != "RSA" {
        return Err(SignatureError::BadKey);
    }
    let components = RsaPublicKeyComponents {
        n: member(jwk, "n")?,
        e: member(jwk, "e")?,
    };
    Ok(components.to_parsed_public_key(params))
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
