//! Fuzz target: Security Event Tokens and SSF subject identifiers (`operator::ssf::set`,
//! `operator::ssf::subject`, `operator::ssf::events::actions_for`).
//!
//! Modes (first byte mod 3):
//! - 0: the rest is a compact SET as pushed or polled;
//! - 1: the rest is a SET payload (any bytes), signed with the test transmitter's key under a
//!   valid header, so the claim checks and the event mapping run;
//! - 2: the rest is a `sub_id` JSON value.
//!
//! Asserts: every refusal has an RFC 8935 error code and a description; a SET without the
//! transmitter's signature is never accepted; an accepted SET is the configured transmitter's,
//! has a `jti` of 1 to 1024 bytes, an `iat` in the accepted window and 1 to 8 event objects,
//! and maps to revocations with valid object names; a parsed subject parses the same again and
//! names its format.
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;
use lifeguard::identity::KeySet;
use lifeguard::operator::ssf::events::{RevocationAction, actions_for};
use lifeguard::operator::ssf::set::{self, MAX_FUTURE_SKEW, SetError, SetRules, verify_set};
use lifeguard::operator::ssf::subject::SubjectId;
use lifeguard_fuzz::{AUDIENCE, ISSUER, ISSUER_ED25519, ISSUER_JWKS, ISSUER_KID, NOW, mode};
use serde_json::Value;

static KEYS: LazyLock<KeySet> =
    LazyLock::new(|| KeySet::from_jwks(ISSUER_JWKS).expect("the test JWKS parses"));
static SIGNER: LazyLock<EncodingKey> =
    LazyLock::new(|| EncodingKey::from_ed_pem(ISSUER_ED25519).expect("the test key parses"));
const MAX_AGE: Duration = Duration::from_secs(3600);
const CODES: &[&str] = &[
    "invalid_key",
    "invalid_issuer",
    "invalid_audience",
    "authentication_failed",
    "invalid_request",
];

fn rules() -> SetRules<'static> {
    SetRules {
        issuer: ISSUER,
        audience: AUDIENCE,
        max_event_age: MAX_AGE,
    }
}

fn refused(error: &SetError) {
    assert!(CODES.contains(&error.err_code()), "{error:?}");
    assert!(!error.description().is_empty());
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn subject(value: &Value) {
    match SubjectId::parse(value) {
        Ok(id) => {
            assert_eq!(SubjectId::parse(value).as_ref(), Ok(&id));
            assert!(!id.format().is_empty());
            if let Some(principal) = id.principal() {
                assert!(
                    (1..=1024).contains(&principal.subject.len()),
                    "{principal:?}"
                );
            }
        }
        Err(message) => assert!(!message.is_empty()),
    }
}

fn verify(token: &str, signed: bool) {
    if let Err(error) = set::parse_header(token) {
        refused(&error);
    }
    if let Err(error) = set::unverified_issuer(token) {
        refused(&error);
    }
    let verified = match verify_set(token, &rules(), &KEYS, NOW) {
        Ok(verified) => verified,
        Err(error) => return refused(&error),
    };
    assert!(
        signed,
        "a SET without the transmitter's signature was accepted"
    );
    assert_eq!(verified.issuer, ISSUER);
    assert!((1..=1024).contains(&verified.jti.len()));
    assert!(verified.iat >= NOW - MAX_AGE.as_secs() as i64);
    assert!(verified.iat <= NOW + MAX_FUTURE_SKEW.as_secs() as i64);
    assert!((1..=8).contains(&verified.events.len()));
    assert!(verified.events.iter().all(|(_, event)| event.is_object()));
    match actions_for(&verified, Duration::from_secs(86_400)) {
        Ok(actions) => {
            for action in actions {
                if let RevocationAction::Create(revocation) = action {
                    let name = revocation.metadata.name.as_deref().unwrap_or_default();
                    assert!(is_dns_subdomain(name), "object name {name:?}");
                }
            }
        }
        Err(error) => refused(&error),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = mode(data) else {
        return;
    };
    match mode % 3 {
        0 => {
            if let Ok(token) = std::str::from_utf8(rest) {
                verify(token, false);
            }
        }
        1 => {
            let header = format!(r#"{{"alg":"EdDSA","typ":"secevent+jwt","kid":"{ISSUER_KID}"}}"#);
            let message = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(rest)
            );
            let signature =
                jsonwebtoken::crypto::sign(message.as_bytes(), &SIGNER, Algorithm::EdDSA)
                    .expect("Ed25519 signs");
            verify(&format!("{message}.{signature}"), true);
        }
        _ => {
            if let Ok(value) = serde_json::from_slice::<Value>(rest) {
                subject(&value);
            }
        }
    }
});
