//! Fuzz target: what a caller controls of proof of possession — the `DPoP` proof
//! (`identity::dpop::verify_proof`) and the client-certificate header a proxy passes on
//! (`identity::client_cert::certificate_thumbprint`).
//!
//! Modes (first byte mod 3):
//! - 0: the rest is a `DPoP` header value, checked against a fixed request and token;
//! - 1: the rest is a header JSON and a claims JSON (NUL-separated), signed with a fixed
//!   client key, so the checks after the signature run (the key in the header is whatever
//!   the input says);
//! - 2: the rest is a certificate header value, read as `xfcc` and as `pem`.
//!
//! Asserts: a proof never verifies unless it was signed by the key the token is bound to, its
//! `typ` is `dpop+jwt`, `htm` is the request's method, `ath` the token's hash and `iat` within
//! the window; a verified proof's `valid_until` is its `iat` plus the window and its `jti` is
//! non-empty; a certificate thumbprint is 43 base64url characters (a SHA-256).
#![no_main]

use std::sync::LazyLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use libfuzzer_sys::fuzz_target;
use lifeguard::api::CertificateHeaderFormat;
use lifeguard::identity::client_cert::certificate_thumbprint;
use lifeguard::identity::dpop::{ProofCheck, token_hash, verify_proof};
use lifeguard::identity::dpop_mint::DpopKey;
use lifeguard::policy::DpopRules;
use lifeguard_fuzz::{AUDIENCE, NOW, fields, mode};
use serde_json::Value;

const TOKEN: &str = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl";

/// The client key the token is bound to (fixed, so inputs replay the same way).
static KEY: LazyLock<DpopKey> = LazyLock::new(|| {
    DpopKey::from_pem(include_str!(
        "../../tests/fixtures/keys/dpop-client-p256.pem"
    ))
    .expect("the fixture DPoP key reads")
});
static RULES: LazyLock<DpopRules> = LazyLock::new(DpopRules::default);

fn check(proof: &str) {
    let bound = KEY.thumbprint();
    let result = verify_proof(
        proof,
        &ProofCheck {
            method: "POST",
            target_uri: AUDIENCE,
            access_token: TOKEN,
            bound_jkt: &bound,
            now_secs: NOW,
            rules: &RULES,
            nonce: None,
            keys: None,
        },
    );
    let Ok(verified) = result else {
        let error = result.unwrap_err();
        assert!(!error.reason().is_empty() && !error.to_string().is_empty());
        return;
    };
    assert_eq!(verified.jkt, bound);
    assert!(!verified.jti.is_empty());
    let mut parts = proof.split('.');
    let header: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts.next().unwrap()).unwrap()).unwrap();
    let claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts.next().unwrap()).unwrap()).unwrap();
    assert!(
        header["typ"]
            .as_str()
            .unwrap()
            .eq_ignore_ascii_case("dpop+jwt")
    );
    assert_eq!(claims["htm"], "POST");
    assert_eq!(claims["ath"].as_str(), Some(token_hash(TOKEN).as_str()));
    let iat = verified.valid_until - RULES.proof_window_secs as i64;
    assert!((iat - NOW).abs() <= RULES.proof_window_secs as i64);
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = mode(data) else {
        return;
    };
    match mode % 3 {
        0 => {
            if let Ok(proof) = std::str::from_utf8(rest) {
                check(proof);
            }
        }
        1 => {
            let [header, claims] = fields::<2>(rest);
            let (Ok(header), Ok(claims)) = (
                serde_json::from_slice::<Value>(header),
                serde_json::from_slice::<Value>(claims),
            ) else {
                return;
            };
            let proof = KEY.sign(&header, &claims).expect("any JSON signs");
            check(&proof);
        }
        _ => {
            let Ok(value) = std::str::from_utf8(rest) else {
                return;
            };
            for format in [CertificateHeaderFormat::Xfcc, CertificateHeaderFormat::Pem] {
                if let Ok(thumbprint) = certificate_thumbprint(value, format) {
                    assert_eq!(thumbprint.len(), 43, "{thumbprint}");
                    assert!(URL_SAFE_NO_PAD.decode(&thumbprint).is_ok());
                }
            }
        }
    }
});
