//! Verification keys of one issuer, parsed from a JSON Web Key Set.

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};

use crate::api::JwsAlgorithm;

/// One usable public key.
#[derive(Clone)]
pub struct VerificationKey {
    pub kid: Option<String>,
    /// The algorithm the JWK pins, if it names one.
    pub alg: Option<Algorithm>,
    pub family: AlgorithmFamily,
    pub key: DecodingKey,
}

/// The usable keys of one JWKS. Symmetric (`oct`) keys and encryption keys are dropped: a
/// JWKS issuer is trusted for asymmetric signatures only, so a published HMAC secret can never
/// be used to mint tokens.
#[derive(Clone, Default)]
pub struct KeySet {
    keys: Vec<VerificationKey>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|k| (&k.kid, k.alg)))
            .finish()
    }
}

/// Why a JWKS document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    #[error("not a JSON Web Key Set: {0}")]
    NotJwks(String),
    #[error("the key set contains no usable signature key")]
    NoUsableKeys,
}

fn algorithm_of(alg: &KeyAlgorithm) -> Option<Algorithm> {
    Some(match alg {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

impl KeySet {
    /// Parses a JWKS document, keeping only asymmetric signature keys.
    pub fn from_jwks(bytes: &[u8]) -> Result<Self, KeySetError> {
        let set: JwkSet =
            serde_json::from_slice(bytes).map_err(|e| KeySetError::NotJwks(e.to_string()))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            if matches!(
                jwk.common.public_key_use,
                Some(PublicKeyUse::Encryption) | Some(PublicKeyUse::Other(_))
            ) {
                continue;
            }
            let family = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => AlgorithmFamily::Rsa,
                AlgorithmParameters::EllipticCurve(_) => AlgorithmFamily::Ec,
                AlgorithmParameters::OctetKeyPair(_) => AlgorithmFamily::Ed,
                _ => continue,
            };
            let alg = match &jwk.common.key_algorithm {
                None => None,
                Some(a) => match algorithm_of(a) {
                    Some(alg) => Some(alg),
                    // A key pinned to HMAC or an encryption algorithm is not a signature key.
                    None => continue,
                },
            };
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            keys.push(VerificationKey {
                kid: jwk.common.key_id.clone(),
                alg,
                family,
                key,
            });
        }
        if keys.is_empty() {
            return Err(KeySetError::NoUsableKeys);
        }
        Ok(Self { keys })
    }

    /// Candidate keys for a token header: the key with that `kid`, or without a `kid` every key
    /// that fits the algorithm. Keys pinned to another algorithm never match.
    pub fn candidates(&self, kid: Option<&str>, alg: Algorithm) -> Vec<&VerificationKey> {
        self.keys
            .iter()
            .filter(|k| k.family == alg.family() && k.alg.is_none_or(|a| a == alg))
            .filter(|k| match kid {
                Some(kid) => k.kid.as_deref() == Some(kid),
                None => true,
            })
            .collect()
    }

    /// Whether any key carries this `kid` (used to decide whether to refetch the set).
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The jsonwebtoken algorithm of a policy's algorithm name.
pub fn to_jwt_algorithm(alg: JwsAlgorithm) -> Algorithm {
    match alg {
        JwsAlgorithm::RS256 => Algorithm::RS256,
        JwsAlgorithm::RS384 => Algorithm::RS384,
        JwsAlgorithm::RS512 => Algorithm::RS512,
        JwsAlgorithm::PS256 => Algorithm::PS256,
        JwsAlgorithm::PS384 => Algorithm::PS384,
        JwsAlgorithm::PS512 => Algorithm::PS512,
        JwsAlgorithm::ES256 => Algorithm::ES256,
        JwsAlgorithm::ES384 => Algorithm::ES384,
        JwsAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An Ed25519 public key (RFC 8037 appendix A.2).
    const ED_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    #[test]
    fn keeps_signature_keys_and_drops_symmetric_ones() {
        let jwks = format!(
            r#"{{"keys":[
                {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","kid":"ed","alg":"EdDSA","use":"sig"}},
                {{"kty":"oct","k":"c2VjcmV0","kid":"hmac","alg":"HS256"}},
                {{"kty":"OKP","crv":"Ed25519","x":"{ED_X}","kid":"enc","use":"enc"}}
            ]}}"#
        );
        let set = KeySet::from_jwks(jwks.as_bytes()).unwrap();
        assert_eq!(set.len(), 1);
        assert!(set.has_kid("ed"));
        assert!(!set.has_kid("hmac"));
        assert_eq!(set.candidates(Some("ed"), Algorithm::EdDSA).len(), 1);
        assert!(set.candidates(Some("ed"), Algorithm::RS256).is_empty());
        assert!(set.candidates(Some("hmac"), Algorithm::HS256).is_empty());
        assert_eq!(set.candidates(None, Algorithm::EdDSA).len(), 1);
    }

    #[test]
    fn refuses_sets_without_usable_keys() {
        assert_eq!(
            KeySet::from_jwks(br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#).unwrap_err(),
            KeySetError::NoUsableKeys
        );
        assert!(matches!(
            KeySet::from_jwks(b"not json"),
            Err(KeySetError::NotJwks(_))
        ));
    }
}
