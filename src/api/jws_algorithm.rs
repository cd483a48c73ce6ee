//! The asymmetric JWS algorithms Lifeguard resources may name: for an issuer's tokens
//! (`identity.issuers[].algorithms`) and for DPoP proofs (`identity.dpop.algorithms`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Asymmetric JWS algorithms a JWKS issuer may use.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JwsAlgorithm {
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

impl JwsAlgorithm {
    /// The JOSE name (`ES256`, `EdDSA`, …), as tokens, proofs and metadata spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RS256 => "RS256",
            Self::RS384 => "RS384",
            Self::RS512 => "RS512",
            Self::PS256 => "PS256",
            Self::PS384 => "PS384",
            Self::PS512 => "PS512",
            Self::ES256 => "ES256",
            Self::ES384 => "ES384",
            Self::EdDSA => "EdDSA",
        }
    }
}
