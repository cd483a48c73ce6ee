//! Proof of possession: a token bound to a key (its `cnf` claim) is accepted only with proof
//! of that key, and an issuer that requires binding (`proofOfPossession: required`) has no
//! plain bearer tokens accepted.
//!
//! | scheme | token | outcome |
//! |---|---|---|
//! | `Bearer` | unbound | accepted, unless its issuer requires binding (`pop_required`) |
//! | `Bearer` | bound to a DPoP key (`jkt`) | refused (`bound_token_as_bearer`): a stolen copy is useless |
//! | `Bearer` | bound to a certificate (`x5t#S256`) | the certificate a trusted proxy passed on must be that one (`mtls_no_certificate`, `mtls_certificate_mismatch`) |
//! | `DPoP` | bound to a DPoP key (`jkt`) | the `DPoP` proof is verified ([`crate::identity::dpop`]), then recorded against replay ([`replay`]) |
//! | `DPoP` | unbound, or bound to a certificate | refused (`dpop_unbound_token`) |
//!
//! Certificate-bound tokens (RFC 8705) need the client's certificate, which the sidecar does
//! not see itself: the TLS connection ends at the ingress or the mesh before it. A proxy the
//! policy trusts (`identity.clientCertificates`) passes it on in a header; without that
//! configuration they are refused.
//!
//! The proof's `htu` must name the policy's `resource`: the URI clients address, whether or
//! not an ingress stands in front, and the same on every replica. A request forwarded by
//! another replica over the internal hop is verified again but not recorded again (it was
//! there).

pub mod replay;

use std::sync::Arc;

use http::HeaderMap;

use crate::api::ProofOfPossession;
use crate::identity::client_cert::certificate_thumbprint;
use crate::identity::dpop::{ProofCheck, ProofError, verify_proof};
use crate::identity::dpop_nonce::NonceKey;
use crate::identity::dpop_signature::ProofKeys;
use crate::identity::{AuthError, Identity, Scheme};
use crate::ledger::TaskLedger;
use crate::model::KeyBinding;
use crate::policy::EffectivePolicy;

use self::replay::{ProofUse, ReplayCache};

/// The request header carrying a DPoP proof.
pub const DPOP: &str = "dpop";
/// Name of the ledger secret that keys DPoP nonces (shared by every replica of a server).
pub const NONCE_KEY_SECRET: &str = "dpop-nonce-key";
/// The only method `/mcp` serves, so the only `htm` a proof can have here.
const METHOD: &str = "POST";

/// Why a request did not prove possession.
#[derive(Debug, PartialEq, Eq)]
pub enum Unproven {
    /// HTTP 401 with a challenge.
    Refused(AuthError),
    /// The proof could not be recorded against replay: HTTP 503, retry shortly.
    Unavailable,
}

impl From<AuthError> for Unproven {
    fn from(error: AuthError) -> Self {
        Self::Refused(error)
    }
}

impl From<ProofError> for Unproven {
    fn from(error: ProofError) -> Self {
        Self::Refused(AuthError::Proof(error))
    }
}

/// What proving possession needs beyond the request: the replay cache, the nonce key, and
/// the keys of proofs that verified (a client signs its proofs with one key).
pub struct Possession {
    replay: ReplayCache,
    nonces: NonceKey,
    keys: ProofKeys,
}

impl Possession {
    /// Proofs remembered where `ledger` says ([`ReplayCache::for_ledger`]); nonces keyed by the
    /// ledger's shared secret.
    pub async fn for_ledger(ledger: &Arc<dyn TaskLedger>) -> crate::ledger::Result<Self> {
        Ok(Self {
            replay: ReplayCache::for_ledger(ledger),
            nonces: NonceKey::new(ledger.secret(NONCE_KEY_SECRET).await?),
            keys: ProofKeys::default(),
        })
    }

    /// A fresh nonce, when the policy requires them.
    pub fn nonce(&self, policy: &EffectivePolicy, now_secs: i64) -> Option<String> {
        policy
            .dpop_rules()
            .require_nonce
            .then(|| self.nonces.issue(now_secs))
    }

    /// Checks that the caller proved the key its token is bound to (see the module's table).
    /// `record` is false for requests another replica forwarded (it recorded their proof).
    pub async fn check(
        &self,
        policy: &EffectivePolicy,
        headers: &HeaderMap,
        presented: (Scheme, &str),
        identity: &Identity,
        record: bool,
        now_secs: i64,
    ) -> Result<(), Unproven> {
        let (scheme, token) = presented;
        let required = policy
            .issuer(&identity.owner.issuer)
            .is_some_and(|i| i.proof_of_possession == ProofOfPossession::Required);
        let jkt = match (scheme, &identity.binding) {
            (Scheme::Bearer, None) if required => {
                return Err(AuthError::ProofOfPossessionRequired.into());
            }
            (Scheme::Bearer, None) => return Ok(()),
            (Scheme::Bearer, Some(KeyBinding::Mtls { x5t_s256 })) => {
                return client_certificate(policy, headers, x5t_s256).map_err(Unproven::from);
            }
            (Scheme::Bearer, Some(KeyBinding::Dpop { .. })) => {
                return Err(AuthError::BoundTokenAsBearer.into());
            }
            (Scheme::Dpop, Some(KeyBinding::Dpop { jkt })) => jkt,
            (Scheme::Dpop, _) => return Err(AuthError::UnboundDpopToken.into()),
        };
        let mut proofs = headers.get_all(DPOP).iter();
        let proof = proofs.next().ok_or(ProofError::Missing)?;
        if proofs.next().is_some() {
            return Err(ProofError::Multiple.into());
        }
        let proof = proof.to_str().map_err(|_| ProofError::Malformed)?;
        let rules = policy.dpop_rules();
        let is_current = |nonce: &str| self.nonces.is_current(nonce, now_secs);
        let verified = verify_proof(
            proof,
            &ProofCheck {
                method: METHOD,
                target_uri: &policy.resource,
                access_token: token,
                bound_jkt: jkt,
                now_secs,
                rules,
                nonce: rules
                    .require_nonce
                    .then_some(&is_current as &dyn Fn(&str) -> bool),
                keys: Some(&self.keys),
            },
        )?;
        if !record {
            return Ok(());
        }
        match self
            .replay
            .remember(&verified.replay_digest(), verified.valid_until, now_secs)
            .await
        {
            ProofUse::First => Ok(()),
            ProofUse::Replayed => Err(ProofError::Replayed.into()),
            ProofUse::Unavailable => Err(Unproven::Unavailable),
        }
    }
}

/// Checks that the client certificate a trusted proxy passed on (see
/// `pipeline::drop_untrusted_certificate`) is the one a certificate-bound token names.
fn client_certificate(
    policy: &EffectivePolicy,
    headers: &HeaderMap,
    bound: &str,
) -> Result<(), AuthError> {
    let Some(rules) = &policy.client_certificates else {
        // Nobody passes certificates on: the binding cannot be checked.
        return Err(AuthError::BoundTokenAsBearer);
    };
    let mut values = headers.get_all(rules.header.as_str()).iter();
    let value = values.next().ok_or(AuthError::NoClientCertificate)?;
    if values.next().is_some() {
        return Err(AuthError::NoClientCertificate);
    }
    let value = value.to_str().map_err(|_| AuthError::NoClientCertificate)?;
    match certificate_thumbprint(value, rules.format) {
        Ok(thumbprint) if thumbprint == bound => Ok(()),
        Ok(_) => Err(AuthError::CertificateMismatch),
        Err(_) => Err(AuthError::NoClientCertificate),
    }
}
