//! DPoP keys and proofs made locally, for development, demos and tests (`lifeguard dev token
//! --dpop-key`, the benchmark). Lifeguard never makes proofs in production paths: clients do.
//!
//! A key is a P-256 (ES256, the algorithm every DPoP client supports), Ed25519 (EdDSA) or
//! RSA-2048 (PS256) key pair, kept as a PKCS#8 PEM so the same key signs the proofs of several
//! commands; the PEM says which kind it is.

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RSA_PSS_SHA256,
    RsaKeyPair,
};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Map, Value, json};

use super::dpop::{PROOF_TYPE, thumbprint, token_hash};
use crate::api::JwsAlgorithm;

/// Why a key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum DpopKeyError {
    #[error(
        "the key is not a PEM-encoded PKCS#8 private key of P-256 (ES256), Ed25519 (EdDSA) or \
         RSA of 2048 to 8192 bits (PS256)"
    )]
    BadKey,
    #[error("DPoP keys are made for ES256, EdDSA or PS256, not {0}")]
    Unsupported(&'static str),
    #[error("no key could be generated or used: {0}")]
    Crypto(&'static str),
}

/// The key pair, by kind.
enum Pair {
    Es256(EcdsaKeyPair),
    EdDsa(Ed25519KeyPair),
    Ps256(RsaKeyPair),
}

/// A client's DPoP key pair.
pub struct DpopKey {
    pkcs8: Vec<u8>,
    pair: Pair,
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
    /// A new random P-256 key (ES256).
    pub fn generate() -> Result<Self, DpopKeyError> {
        Self::generate_for(JwsAlgorithm::ES256)
    }

    /// A new random key for `alg`: ES256 (P-256), EdDSA (Ed25519) or PS256 (RSA-2048).
    pub fn generate_for(alg: JwsAlgorithm) -> Result<Self, DpopKeyError> {
        let failed = |_| DpopKeyError::Crypto("key generation failed");
        let pkcs8 = match alg {
            JwsAlgorithm::ES256 => {
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                    .map_err(failed)?
                    .as_ref()
                    .to_vec()
            }
            JwsAlgorithm::EdDSA => Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
                .map_err(failed)?
                .as_ref()
                .to_vec(),
            JwsAlgorithm::PS256 => RsaKeyPair::generate(KeySize::Rsa2048)
                .map_err(failed)?
                .as_der()
                .map_err(failed)?
                .as_ref()
                .to_vec(),
            other => return Err(DpopKeyError::Unsupported(other.as_str())),
        };
        Self::from_pkcs8(pkcs8)
    }

    /// Reads a key written by [`DpopKey::to_pem`] (any PKCS#8 PEM of a P-256, Ed25519 or RSA
    /// key).
    pub fn from_pem(pem: &str) -> Result<Self, DpopKeyError> {
        let der =
            PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| DpopKeyError::BadKey)?;
        Self::from_pkcs8(der.secret_pkcs8_der().to_vec())
    }

    fn from_pkcs8(pkcs8: Vec<u8>) -> Result<Self, DpopKeyError> {
        let pair =
            if let Ok(pair) = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8) {
                Pair::Es256(pair)
            } else if let Ok(pair) = Ed25519KeyPair::from_pkcs8(&pkcs8) {
                Pair::EdDsa(pair)
            } else if let Ok(pair) = RsaKeyPair::from_pkcs8(&pkcs8) {
                Pair::Ps256(pair)
            } else {
                return Err(DpopKeyError::BadKey);
            };
        Ok(Self { pkcs8, pair })
    }

    /// The algorithm this key signs proofs with.
    pub fn algorithm(&self) -> JwsAlgorithm {
        match self.pair {
            Pair::Es256(_) => JwsAlgorithm::ES256,
            Pair::EdDsa(_) => JwsAlgorithm::EdDSA,
            Pair::Ps256(_) => JwsAlgorithm::PS256,
        }
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

    /// The public key as a JWK: `kty` EC (`crv`, `x`, `y`), OKP (`crv`, `x`) or RSA (`n`, `e`).
    pub fn public_jwk(&self) -> Map<String, Value> {
        let members: Vec<(&str, String)> = match &self.pair {
            Pair::Es256(pair) => {
                // An uncompressed P-256 point: 0x04, then x and y of 32 bytes each.
                let point = pair.public_key().as_ref();
                let (x, y) = point[1..].split_at(32);
                vec![
                    ("kty", "EC".to_owned()),
                    ("crv", "P-256".to_owned()),
                    ("x", URL_SAFE_NO_PAD.encode(x)),
                    ("y", URL_SAFE_NO_PAD.encode(y)),
                ]
            }
            Pair::EdDsa(pair) => vec![
                ("kty", "OKP".to_owned()),
                ("crv", "Ed25519".to_owned()),
                ("x", URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())),
            ],
            Pair::Ps256(pair) => {
                let public = pair.public_key();
                vec![
                    ("kty", "RSA".to_owned()),
                    (
                        "n",
                        URL_SAFE_NO_PAD.encode(public.modulus().big_endian_without_leading_zero()),
                    ),
                    (
                        "e",
                        URL_SAFE_NO_PAD.encode(public.exponent().big_endian_without_leading_zero()),
                    ),
                ]
            }
        };
        members
            .into_iter()
            .map(|(member, value)| (member.to_owned(), Value::String(value)))
            .collect()
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
        let header = json!({
            "typ": PROOF_TYPE,
            "alg": self.algorithm().as_str(),
            "jwk": self.public_jwk(),
        });
        self.sign(&header, &body)
    }

    /// Signs any header and claims with this key, in its algorithm: the way to make a proof
    /// that breaks a rule on purpose.
    pub fn sign(&self, header: &Value, claims: &Value) -> Result<String, DpopKeyError> {
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let message = signing_input.as_bytes();
        let failed = |_| DpopKeyError::Crypto("signing failed");
        let signature = match &self.pair {
            Pair::Es256(pair) => pair
                .sign(&SystemRandom::new(), message)
                .map_err(failed)?
                .as_ref()
                .to_vec(),
            Pair::EdDsa(pair) => pair.sign(message).as_ref().to_vec(),
            Pair::Ps256(pair) => {
                let mut signature = vec![0; pair.public_modulus_len()];
                pair.sign(
                    &RSA_PSS_SHA256,
                    &SystemRandom::new(),
                    message,
                    &mut signature,
                )
                .map_err(failed)?;
                signature
            }
        };
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }
}

fn random_jti() -> Result<String, DpopKeyError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|_| DpopKeyError::Crypto("no randomness"))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}
