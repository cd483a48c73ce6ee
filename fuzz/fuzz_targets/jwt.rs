//! Fuzz target: bearer-token extraction and JWT validation (`identity::bearer_token`,
//! `identity::validate_token`), the header and unverified-claims parsing in particular.
//!
//! Modes (first byte mod 3):
//! - 0: the rest is an `Authorization` header value;
//! - 1: the rest is a header JSON and a claims JSON (NUL-separated), base64url-encoded into a
//!   token with a made-up signature;
//! - 2: the rest is a claims JSON, signed with the test issuer's key, so validation runs to the
//!   end (claims, owner key, scopes).
//!
//! Asserts: an extracted token is non-empty, trimmed and part of the header; the issuer's keys
//! are asked for only after the header, `iss` and algorithm passed (nothing reaches the crypto
//! before); a made-up signature never validates; a validated token is the trusted issuer's and
//! not expired.
#![no_main]

use std::cell::Cell;
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use libfuzzer_sys::fuzz_target;
use lifeguard::identity::mint::mint_token;
use lifeguard::identity::{AuthError, KeySet, bearer_token, validate_token};
use lifeguard::policy::{EffectivePolicy, load_standalone};
use lifeguard_fuzz::{
    AUDIENCE, ISSUER, ISSUER_ED25519, ISSUER_JWKS, ISSUER_KID, NOW, fields, mode,
};
use serde_json::Value;

static POLICY: LazyLock<EffectivePolicy> = LazyLock::new(|| {
    let yaml = format!(
        "apiVersion: lifeguard.dev/v1alpha1\nkind: McpServerPolicy\nmetadata: {{name: p}}\n\
         spec:\n  selector: {{}}\n  resource: {AUDIENCE}\n  identity:\n    issuers:\n      \
         - issuer: {ISSUER}\n        jwksFile: keys.json\n"
    );
    let now = jiff::Timestamp::from_second(NOW).unwrap();
    load_standalone("p.yaml", &yaml, now)
        .expect("the fuzz policy compiles")
        .0
});
static KEYS: LazyLock<Arc<KeySet>> =
    LazyLock::new(|| Arc::new(KeySet::from_jwks(ISSUER_JWKS).expect("the test JWKS parses")));

/// Validates `token`; returns the result and whether the issuer's keys were asked for.
fn validate(token: &str) -> (Result<lifeguard::identity::Identity, AuthError>, bool) {
    let asked = Cell::new(false);
    let keys = |_: &_| {
        asked.set(true);
        Some(KEYS.clone())
    };
    let result = validate_token(token, &POLICY, &keys, NOW as u64);
    (result, asked.get())
}

fn check(token: &str, signed: bool) {
    let (result, asked) = validate(token);
    if !asked {
        assert!(
            matches!(
                result,
                Err(AuthError::Malformed
                    | AuthError::UntrustedIssuer
                    | AuthError::DisallowedAlgorithm)
            ) || result == Err(AuthError::MissingClaim("iss".into())),
            "refused without the keys for another reason: {result:?}"
        );
    }
    match result {
        Ok(identity) => {
            assert!(
                signed,
                "a token with a made-up signature validated: {token}"
            );
            assert_eq!(identity.owner.issuer, ISSUER);
            assert!(
                identity.expires_at + 30 >= NOW,
                "an expired token validated"
            );
        }
        Err(error) => assert!(!error.reason().is_empty() && !error.to_string().is_empty()),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = mode(data) else {
        return;
    };
    match mode % 3 {
        0 => {
            if let Ok(token) = bearer_token(Some(rest)) {
                let header = std::str::from_utf8(rest).expect("a token comes from UTF-8");
                assert!(!token.is_empty() && token.trim() == token && header.contains(token));
                assert!(header[..6].eq_ignore_ascii_case("bearer"));
                check(token, false);
            }
        }
        1 => {
            let [header, claims] = fields::<2>(rest);
            let token = format!(
                "{}.{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(claims),
                URL_SAFE_NO_PAD.encode([7u8; 64])
            );
            check(&token, false);
        }
        _ => {
            let Ok(claims) = serde_json::from_slice::<Value>(rest) else {
                return;
            };
            let token = mint_token(ISSUER_ED25519, Algorithm::EdDSA, Some(ISSUER_KID), &claims)
                .expect("any JSON value signs");
            check(&token, true);
        }
    }
});
