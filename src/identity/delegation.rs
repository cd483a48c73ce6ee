//! Delegation assertions (`upstream.identity: delegation`): what the protected server gets
//! instead of the user's token. The sidecar signs, for each request about a task, a short-lived
//! JWT saying "the sidecar acts for this owner, on this task, with these scopes, until then";
//! the server verifies it with the keys the sidecar publishes (`/.well-known/jwks.json` on its
//! admin port) and can never replay the user's own token, which it never sees.
//!
//! Guarantees:
//! - `exp` is at most the task's deadline, at most the presenting token's own `exp`, and at
//!   most [`MAX_ASSERTION_LIFETIME`] after `iat`: an assertion never outlives the task, the
//!   user's session, or a few minutes. A longer delegation exists only when the owner comes
//!   back with a newer valid token (audited `task.identity_refreshed`).
//! - Keys are Ed25519, generated in memory (never written to disk), rotated every
//!   [`ROTATE_EVERY`]; a retired key stays published for [`MAX_ASSERTION_LIFETIME`] plus
//!   [`PUBLISH_MARGIN`], so every unexpired assertion verifies.

use std::sync::Mutex;
use std::time::Duration;

use aws_lc_rs::rand::SystemRandom;

use crate::model::KeyBinding;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Longest life of one assertion.
pub const MAX_ASSERTION_LIFETIME: Duration = Duration::from_secs(5 * 60);
/// How often the signing key changes.
pub const ROTATE_EVERY: Duration = Duration::from_secs(3600);
/// How long a retired key is published beyond the longest assertion it may have signed.
pub const PUBLISH_MARGIN: Duration = Duration::from_secs(60);
/// The JWT `typ` of an assertion, so it cannot be confused with an access token.
pub const ASSERTION_TYPE: &str = "lifeguard-delegation+jwt";

/// Why no assertion could be signed.
#[derive(Debug, thiserror::Error)]
pub enum DelegationError {
    #[error("generating a signing key failed")]
    KeyGeneration,
    #[error("signing the assertion failed: {0}")]
    Signing(String),
}

struct SigningKey {
    kid: String,
    pkcs8: Vec<u8>,
    public: Vec<u8>,
    /// Unix seconds it started signing.
    created_at: i64,
    /// Unix seconds it stopped signing (`None` while current).
    retired_at: Option<i64>,
}

impl SigningKey {
    fn generate(now: i64) -> Result<Self, DelegationError> {
        let document = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| DelegationError::KeyGeneration)?;
        let pair = Ed25519KeyPair::from_pkcs8(document.as_ref())
            .map_err(|_| DelegationError::KeyGeneration)?;
        let public = pair.public_key().as_ref().to_vec();
        let kid = URL_SAFE_NO_PAD.encode(&Sha256::digest(&public)[..12]);
        Ok(Self {
            kid,
            pkcs8: document.as_ref().to_vec(),
            public,
            created_at: now,
            retired_at: None,
        })
    }

    fn jwk(&self) -> Value {
        json!({"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
               "kid": self.kid, "x": URL_SAFE_NO_PAD.encode(&self.public)})
    }
}

/// What one assertion says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delegation<'a> {
    /// `iss`: the sidecar, `lifeguard:sidecar:<namespace>/<policy>`; also `act.sub`.
    pub sidecar: &'a str,
    /// `aud`: the protected server's canonical resource URI.
    pub audience: &'a str,
    /// The owner: `sub`, with `orig_iss` naming the issuer it belongs to.
    pub issuer: &'a str,
    pub subject: &'a str,
    /// `tenant` (omitted when empty) and `client_id`.
    pub tenant: &'a str,
    pub client: &'a str,
    /// `scope`: the tool's required scopes the owner holds.
    pub scopes: Vec<&'a str>,
    /// `lifeguard_task` (the task's keyed hash, as the audit trail names it) and `tool`.
    pub task: Option<&'a str>,
    pub tool: Option<&'a str>,
    /// The key the caller's token was bound to and the caller proved: `orig_cnf`, with the
    /// RFC 7800 member of the original token (`jkt` or `x5t#S256`). Absent for bearer callers.
    pub key_binding: Option<&'a KeyBinding>,
    /// Unix seconds: now, and the latest the assertion may run (deadline, token `exp`).
    pub issued_at: i64,
    pub not_after: i64,
}

impl Delegation<'_> {
    /// `exp` of the assertion: the earliest of its bound and [`MAX_ASSERTION_LIFETIME`].
    pub fn expires_at(&self) -> i64 {
        self.not_after
            .min(self.issued_at + MAX_ASSERTION_LIFETIME.as_secs() as i64)
    }

    /// The JWT claims.
    pub fn claims(&self, jti: &str) -> Value {
        let mut claims = json!({
            "iss": self.sidecar,
            "aud": self.audience,
            "sub": self.subject,
            "orig_iss": self.issuer,
            "act": {"sub": self.sidecar},
            "client_id": self.client,
            "iat": self.issued_at,
            "nbf": self.issued_at,
            "exp": self.expires_at(),
            "jti": jti,
        });
        if !self.tenant.is_empty() {
            claims["tenant"] = json!(self.tenant);
        }
        if !self.scopes.is_empty() {
            claims["scope"] = json!(self.scopes.join(" "));
        }
        if let Some(task) = self.task {
            claims["lifeguard_task"] = json!(task);
        }
        if let Some(tool) = self.tool {
            claims["tool"] = json!(tool);
        }
        match self.key_binding {
            Some(KeyBinding::Dpop { jkt }) => claims["orig_cnf"] = json!({"jkt": jkt}),
            Some(KeyBinding::Mtls { x5t_s256 }) => {
                claims["orig_cnf"] = json!({"x5t#S256": x5t_s256});
            }
            None => {}
        }
        claims
    }
}

/// The sidecar's delegation signing keys.
pub struct DelegationKeys {
    keys: Mutex<Vec<SigningKey>>,
}

impl DelegationKeys {
    /// A key ring with one fresh key, created at `now` (Unix seconds).
    pub fn new(now: i64) -> Result<Self, DelegationError> {
        Ok(Self {
            keys: Mutex::new(vec![SigningKey::generate(now)?]),
        })
    }

    /// Rotates the current key when it is older than [`ROTATE_EVERY`] and drops retired keys
    /// no unexpired assertion can name any more.
    pub fn rotate_if_due(&self, now: i64) -> Result<(), DelegationError> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let keep = (MAX_ASSERTION_LIFETIME + PUBLISH_MARGIN).as_secs() as i64;
        keys.retain(|k| k.retired_at.is_none_or(|r| now - r < keep));
        let due = keys
            .iter()
            .find(|k| k.retired_at.is_none())
            .is_none_or(|k| now - k.created_at >= ROTATE_EVERY.as_secs() as i64);
        if due {
            let fresh = SigningKey::generate(now)?;
            for k in keys.iter_mut().filter(|k| k.retired_at.is_none()) {
                k.retired_at = Some(now);
            }
            keys.push(fresh);
        }
        Ok(())
    }

    /// The published key set: the current key and the retired ones still needed.
    pub fn jwks(&self) -> Value {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        json!({"keys": keys.iter().rev().map(SigningKey::jwk).collect::<Vec<_>>()})
    }

    /// Signs `delegation` with the current key; returns the JWT and its `exp`.
    pub fn sign(&self, delegation: &Delegation<'_>) -> Result<(String, i64), DelegationError> {
        let (kid, pkcs8) = {
            let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            let current = keys
                .iter()
                .rev()
                .find(|k| k.retired_at.is_none())
                .ok_or(DelegationError::KeyGeneration)?;
            (current.kid.clone(), current.pkcs8.clone())
        };
        let mut jti = [0u8; 16];
        getrandom::fill(&mut jti).map_err(|e| DelegationError::Signing(e.to_string()))?;
        let claims = delegation.claims(&URL_SAFE_NO_PAD.encode(jti));
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid);
        header.typ = Some(ASSERTION_TYPE.to_owned());
        let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ed_der(&pkcs8))
            .map_err(|e| DelegationError::Signing(e.to_string()))?;
        Ok((token, delegation.expires_at()))
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};

    use super::*;

    fn delegation(issued_at: i64, not_after: i64) -> Delegation<'static> {
        Delegation {
            sidecar: "lifeguard:sidecar:team-a/reports",
            audience: "https://reports.example/mcp",
            issuer: "https://idp.example",
            subject: "alice",
            tenant: "acme",
            client: "console",
            scopes: vec!["reports:run"],
            task: Some("h:0123"),
            tool: Some("generate_report"),
            key_binding: None,
            issued_at,
            not_after,
        }
    }

    /// Verifies `token` against the published key set, as a server would.
    fn verify(keys: &DelegationKeys, token: &str, now: i64) -> Result<Value, String> {
        let kid = decode_header(token)
            .map_err(|e| e.to_string())?
            .kid
            .unwrap();
        let jwks = keys.jwks();
        let jwk = jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["kid"] == kid.as_str())
            .ok_or("kid not published")?;
        let key = DecodingKey::from_ed_components(jwk["x"].as_str().unwrap())
            .map_err(|e| e.to_string())?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&["https://reports.example/mcp"]);
        validation.set_issuer(&["lifeguard:sidecar:team-a/reports"]);
        validation.validate_nbf = false;
        validation.leeway = 0;
        let _ = now;
        decode::<Value>(token, &key, &validation)
            .map(|d| d.claims)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn an_assertion_names_owner_actor_task_and_scopes_and_verifies_with_the_published_keys() {
        let now = jiff::Timestamp::now().as_second();
        let keys = DelegationKeys::new(now).unwrap();
        let (token, exp) = keys.sign(&delegation(now, now + 3600)).unwrap();
        let header = decode_header(&token).unwrap();
        assert_eq!(header.typ.as_deref(), Some(ASSERTION_TYPE));
        let claims = verify(&keys, &token, now).unwrap();
        assert_eq!(claims["sub"], "alice");
        assert_eq!(claims["orig_iss"], "https://idp.example");
        assert_eq!(claims["act"]["sub"], "lifeguard:sidecar:team-a/reports");
        assert_eq!(claims["tenant"], "acme");
        assert_eq!(claims["client_id"], "console");
        assert_eq!(claims["scope"], "reports:run");
        assert_eq!(claims["lifeguard_task"], "h:0123");
        assert_eq!(claims["exp"], exp);
        assert!(
            claims.get("orig_cnf").is_none(),
            "a bearer caller proved no key"
        );
        let key = KeyBinding::Dpop { jkt: "k1".into() };
        let bound = Delegation {
            key_binding: Some(&key),
            ..delegation(now, now + 3600)
        };
        let (token, _) = keys.sign(&bound).unwrap();
        assert_eq!(
            verify(&keys, &token, now).unwrap()["orig_cnf"],
            json!({"jkt": "k1"})
        );
        assert_eq!(exp, now + MAX_ASSERTION_LIFETIME.as_secs() as i64);
    }

    #[test]
    fn an_assertion_never_outlives_the_deadline_or_the_owners_token() {
        let d = delegation(1_000, 1_030);
        assert_eq!(d.expires_at(), 1_030);
        let d = delegation(1_000, 100_000);
        assert_eq!(
            d.expires_at(),
            1_000 + MAX_ASSERTION_LIFETIME.as_secs() as i64
        );
        let mut no_tenant = delegation(1_000, 2_000);
        no_tenant.tenant = "";
        no_tenant.scopes.clear();
        let claims = no_tenant.claims("j");
        assert!(claims.get("tenant").is_none() && claims.get("scope").is_none());
    }

    #[test]
    fn rotation_keeps_retired_keys_published_while_their_assertions_can_be_valid() {
        let t0 = jiff::Timestamp::now().as_second();
        let keys = DelegationKeys::new(t0).unwrap();
        let (old_token, _) = keys.sign(&delegation(t0, t0 + 3600)).unwrap();
        keys.rotate_if_due(t0 + 10).unwrap();
        assert_eq!(
            keys.jwks()["keys"].as_array().unwrap().len(),
            1,
            "not due yet"
        );
        let rotated_at = t0 + ROTATE_EVERY.as_secs() as i64;
        keys.rotate_if_due(rotated_at).unwrap();
        let published = keys.jwks()["keys"].as_array().unwrap().clone();
        assert_eq!(published.len(), 2, "{published:?}");
        assert!(
            verify(&keys, &old_token, t0).is_ok(),
            "the retired key still verifies"
        );
        let (new_token, _) = keys.sign(&delegation(t0, t0 + 3600)).unwrap();
        assert_ne!(
            decode_header(&new_token).unwrap().kid,
            decode_header(&old_token).unwrap().kid,
            "new assertions use the new key"
        );
        let gone = rotated_at + (MAX_ASSERTION_LIFETIME + PUBLISH_MARGIN).as_secs() as i64;
        keys.rotate_if_due(gone).unwrap();
        assert_eq!(keys.jwks()["keys"].as_array().unwrap().len(), 1);
        assert!(verify(&keys, &old_token, t0).is_err(), "{}", keys.jwks());
    }
}
