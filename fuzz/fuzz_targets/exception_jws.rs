//! Fuzz target: the CapabilityException detached-JWS verification path
//! (`policy::jws_shape::parse_detached_jws`, `exception::verify`, `exception::sign`) and the
//! approver trust document (`exception::ApproverTrust::from_json`).
//!
//! Modes (first byte mod 3):
//! - 0: the rest is a `signature` value;
//! - 1: the rest is a CapabilityException `spec` as JSON (its own `signature` included);
//! - 2: the rest is an approver trust document.
//!
//! Asserts: a signature of the right shape re-encodes to itself; `verify` of any grant ends in
//! one documented reason, `Active` only with every check passed and an approver named; a grant signed with the approver key
//! verifies as `Active` in its window, as `wrong_server` in another namespace and as
//! `bad_signature` once edited.
#![no_main]

use std::sync::LazyLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use lifeguard::api::{CapabilityExceptionSpec, ExceptionState};
use lifeguard::exception::{ApproverKeys, ApproverTrust, Verification, sign, verify};
use lifeguard::policy::jws_shape::parse_detached_jws;
use lifeguard_fuzz::{ISSUER_ED25519, ISSUER_JWKS, ISSUER_KID, NOW, mode};

static TRUST: LazyLock<ApproverTrust> =
    LazyLock::new(|| ApproverTrust::from_json(ISSUER_JWKS).expect("the test JWKS parses"));
const NAMESPACE: &str = "team-a";
const REASONS: &[&str] = &[
    "ok",
    "bad_signature",
    "unknown_key",
    "key_revoked",
    "wrong_server",
    "approval_revoked",
    "not_yet_valid",
    "expired",
];

fn consistent(v: &Verification) {
    assert!(REASONS.contains(&v.reason), "{v:?}");
    match v.state {
        ExceptionState::Active => {
            assert_eq!(v.reason, "ok");
            assert!(v.approver.is_some());
            assert!(v.checks.iter().all(|c| c.result.is_ok()), "{v:?}");
        }
        ExceptionState::Invalid => {
            assert!(v.approver.is_none());
            assert!(v.checks.last().is_some_and(|c| c.result.is_err()), "{v:?}");
        }
        ExceptionState::NotYetValid | ExceptionState::Expired => assert!(v.approver.is_some()),
    }
}

fn grant(spec: CapabilityExceptionSpec) {
    let now = Timestamp::from_second(NOW).unwrap();
    let as_sent = verify(&spec, NAMESPACE, &TRUST, now);
    consistent(&as_sent);

    let signature = sign(&spec, NAMESPACE, ISSUER_ED25519, ISSUER_KID)
        .expect("a grant that deserialized can be signed");
    let mut signed = spec.clone();
    signed.signature = signature;
    let start = signed.not_before.0;
    let v = verify(&signed, NAMESPACE, &TRUST, start);
    consistent(&v);
    if start < signed.expires_at.0 {
        assert_eq!(v.state, ExceptionState::Active, "{:?}", v.checks);
        assert_eq!(v.approver.as_deref(), Some(ISSUER_KID));
    } else {
        assert_eq!(v.reason, "expired");
    }
    let elsewhere = verify(&signed, "team-b", &TRUST, start);
    consistent(&elsewhere);
    assert_eq!(elsewhere.reason, "wrong_server", "{:?}", elsewhere.checks);
    let mut edited = signed.clone();
    edited.approval_id.push('x');
    let v = verify(&edited, NAMESPACE, &TRUST, start);
    consistent(&v);
    assert_eq!(v.reason, "bad_signature", "{:?}", v.checks);
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = mode(data) else {
        return;
    };
    match mode % 3 {
        0 => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            match parse_detached_jws(text) {
                Ok(jws) => {
                    assert_eq!(jws.signature.len(), 64);
                    assert!(!jws.kid.trim().is_empty());
                    let again = format!(
                        "{}..{}",
                        jws.encoded_header,
                        URL_SAFE_NO_PAD.encode(&jws.signature)
                    );
                    assert_eq!(parse_detached_jws(&again), Ok(jws));
                }
                Err(error) => assert!(!error.to_string().is_empty()),
            }
        }
        1 => {
            if let Ok(spec) = serde_json::from_slice::<CapabilityExceptionSpec>(rest) {
                grant(spec);
            }
        }
        _ => {
            if let Ok(trust) = ApproverTrust::from_json(rest) {
                let _ = trust.keys.len();
            }
            let _ = ApproverKeys::from_document(rest).trust();
        }
    }
});
