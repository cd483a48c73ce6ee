//! Signing tokens with a local key, for development and tests (`lifeguard dev token`). Lifeguard
//! never mints tokens in production paths; real tokens come from the identity provider.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::Value;

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("the key is not a PEM-encoded {0} private key")]
    BadKey(&'static str),
    #[error("signing failed: {0}")]
    Signing(String),
}

/// Signs `claims` with a PEM private key (Ed25519 for `EdDSA`, RSA for `RS256`/`PS256`, P-256
/// for `ES256`), setting `kid` in the header.
pub fn mint_token(
    key_pem: &[u8],
    alg: Algorithm,
    kid: Option<&str>,
    claims: &Value,
) -> Result<String, MintError> {
    let key = match alg {
        Algorithm::EdDSA => {
            EncodingKey::from_ed_pem(key_pem).map_err(|_| MintError::BadKey("Ed25519"))?
        }
        Algorithm::ES256 | Algorithm::ES384 => {
            EncodingKey::from_ec_pem(key_pem).map_err(|_| MintError::BadKey("EC"))?
        }
        _ => EncodingKey::from_rsa_pem(key_pem).map_err(|_| MintError::BadKey("RSA"))?,
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key).map_err(|e| MintError::Signing(e.to_string()))
}
