//! Sender-constrained tokens in an McpServerPolicy: whether an issuer's tokens must be bound to
//! a key (`spec.identity.issuers[].proofOfPossession`) and how DPoP proofs (RFC 9449) are
//! checked (`spec.identity.dpop`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::PolicyDuration;
use super::jws_algorithm::JwsAlgorithm;

/// Whether an issuer's tokens must prove possession of a key.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum ProofOfPossession {
    /// Bearer tokens are accepted; a token bound to a key (a `cnf` claim) must still prove it.
    #[default]
    Optional,
    /// Every token must be bound to a key and prove it on every request (DPoP); a plain
    /// bearer token gets HTTP 401 with a `WWW-Authenticate: DPoP` challenge.
    Required,
}

/// How DPoP proofs are checked, for every issuer of the policy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DpopSpec {
    /// Signature algorithms accepted for proofs (asymmetric only; `none` and HMAC never).
    /// Defaults to ES256, ES384, EdDSA, PS256 and RS256. Advertised as
    /// `dpop_signing_alg_values_supported` in the protected resource metadata and as `algs`
    /// in `WWW-Authenticate: DPoP` challenges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 9))]
    pub algorithms: Option<Vec<JwsAlgorithm>>,

    /// How far a proof's `iat` may lie from the sidecar's clock, in either direction; a proof
    /// is refused outside it, and its `jti` is remembered (against replay) for as long. Default
    /// `5m`; from `10s` to `15m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof_window: Option<PolicyDuration>,

    /// When true, every proof must carry a nonce this server issued: a proof without one (or
    /// with one no longer current) gets HTTP 401 `use_dpop_nonce` with a fresh `DPoP-Nonce`
    /// header, which the client puts in its next proof. Nonces are valid for one to two
    /// minutes, the same on every replica. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_nonce: Option<bool>,
}

/// Client certificates a trusted proxy passes on, for certificate-bound tokens (RFC 8705,
/// `cnf["x5t#S256"]`). TLS ends before the sidecar (at the ingress or the mesh), so the
/// certificate can only arrive in a header the proxy sets.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificatesSpec {
    /// The header the proxy sets, e.g. `x-forwarded-client-cert` (Envoy, Istio). The proxy
    /// must overwrite any value the client sent (Envoy: `forward_client_cert_details:
    /// SANITIZE_SET`).
    #[schemars(length(min = 1, max = 128))]
    pub header: String,
    /// `xfcc`: Envoy's `x-forwarded-client-cert` (one element; its `Hash`, or else its `Cert`);
    /// `pem`: the URL-encoded PEM certificate (nginx `$ssl_client_escaped_cert`).
    pub format: CertificateHeaderFormat,
    /// Peers whose header is believed, as CIDR ranges. Default: loopback only
    /// (`127.0.0.0/8`, `::1/128`), where a mesh proxy in the same pod connects from. From any
    /// other peer the header is removed before anything reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub trusted_proxies: Option<Vec<String>>,
}

/// How the proxy writes the certificate.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum CertificateHeaderFormat {
    Xfcc,
    Pem,
}
