//! DPoP keys and proofs made locally, for development, demos and tests (`lifeguard dev token
//! --dpop-key`, the benchmark). Lifeguard never makes proofs in production paths: clients do.
//!
//! A key is a P-256 key pair (ES256, the algorithm every DPoP client supports), kept as a
//! PKCS#8 PEM so the same key signs the proofs of several commands.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Map, Value, json};

use super::dpop::{PROOF_TYPE, thumbprint, token_hash};

/// Why a key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum DpopKeyError {
    #[error("the key is not a PEM-encoded PKCS#8 P-256 private key")]
    BadKey,
    #[error("no key could be generated or used: {0}")]
    Crypto(&'static str),
}

/// A client's DPoP key pair.
pub struct DpopKey {
    pkcs8: Vec<u8>,
    pair: EcdsaKeyPair,
}

/// What a proof says: the request it is for and its freshness.
pub struct ProofClaims<'a> {
    pub method: &'a str,
    pub uri: &'a str,
    /// The access token the proof accompanies (`ath`), if any.
    pub access_token: Option<&'a str>,
    pub iat: i64,
    /// A fresh random one when `None`.
    pub jti: Option<&'a str>,
    pub nonce: Option<&'a str>,
}

impl DpopKey {
    /// A new random key.
    pub fn generate() -> Result<Self, DpopKeyError> {
        let document =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .map_err(|_| DpopKeyError::Crypto("P-256 key generation failed"))?;
        Self::from_pkcs8(document.as_ref().to_vec())
    }

    /// Reads a key written by [`DpopKey::to_pem`] (any PKCS#8 P-256 PEM).
    pub fn from_pem(pem: &str) -> Result<Self, DpopKeyError> {
        let der =
            PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| DpopKeyError::BadKey)?;
        Self::from_pkcs8(der.secret_pkcs8_der().to_vec())
    }

    fn from_pkcs8(pkcs8: Vec<u8>) -> Result<Self, DpopKeyError> {
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8)
            .map_err(|_| DpopKeyError::BadKey)?;
        Ok(Self { pkcs8, pair })
    }

    /// The private key as a PKCS#8 PEM.
    pub fn to_pem(&self) -> String {
        let body = STANDARD.encode(&self.pkcs8);
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in body.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        pem
    }

    /// The public key as a JWK (`kty`, `crv`, `x`, `y`).
    pub fn public_jwk(&self) -> Map<String, Value> {
        // An uncompressed P-256 point: 0x04, then x and y of 32 bytes each.
        let point = self.pair.public_key().as_ref();
        let (x, y) = point[1..].split_at(32);
        let mut jwk = Map::new();
        for (member, value) in [
            ("kty", "EC".to_owned()),
            ("crv", "P-256".to_owned()),
            ("x", URL_SAFE_NO_PAD.encode(x)),
            ("y", URL_SAFE_NO_PAD.encode(y)),
        ] {
            jwk.insert(member.to_owned(), Value::String(value));
        }
        jwk
    }

    /// The key's RFC 7638 thumbprint: the `cnf.jkt` of tokens bound to it.
    pub fn thumbprint(&self) -> String {
        thumbprint(&self.public_jwk()).unwrap_or_default()
    }

    /// A DPoP proof for one request.
    pub fn proof(&self, claims: &ProofClaims<'_>) -> Result<String, DpopKeyError> {
        let jti = match claims.jti {
            Some(jti) => jti.to_owned(),
            None => random_jti()?,
        };
        let mut body = json!({
            "jti": jti,
            "htm": claims.method,
            "htu": claims.uri,
            "iat": claims.iat,
        });
        if let Some(token) = claims.access_token {
            body["ath"] = Value::String(token_hash(token));
        }
        if let Some(nonce) = claims.nonce {
            body["nonce"] = Value::String(nonce.to_owned());
        }
        let header = json!({"typ": PROOF_TYPE, "alg": "ES256", "jwk": self.public_jwk()});
        self.sign(&header, &body)
    }

    /// Signs any header and claims with this key (ES256): the way to make a proof that breaks
    /// a rule on purpose.
    pub fn sign(&self, header: &Value, claims: &Value) -> Result<String, DpopKeyError> {
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .map_err(|_| DpopKeyError::Crypto("signing failed"))?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }
}

fn random_jti() -> Result<String, DpopKeyError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|_| DpopKeyError::Crypto("no randomness"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}
