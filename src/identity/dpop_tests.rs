use serde_json::{Value, json};

use super::*;
use crate::api::JwsAlgorithm;
use crate::identity::dpop_mint::{DpopKey, DpopKeyError, ProofClaims};

const URI: &str = "https://reports.example.com/mcp";
const TOKEN: &str = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln";
const NOW: i64 = 1_800_000_000;

fn rules() -> DpopRules {
    DpopRules::default()
}

fn claims<'a>() -> ProofClaims<'a> {
    ProofClaims {
        method: "POST",
        uri: URI,
        access_token: Some(TOKEN),
        iat: NOW,
        jti: Some("jti-1"),
        nonce: None,
    }
}

fn check<'a>(key: &'a str, rules: &'a DpopRules) -> ProofCheck<'a> {
    ProofCheck {
        method: "POST",
        target_uri: URI,
        access_token: TOKEN,
        bound_jkt: key,
        now_secs: NOW,
        rules,
        nonce: None,
        keys: None,
    }
}

/// A proof of `key` whose header and claims are the standard ones changed by `edit`.
fn edited(key: &DpopKey, edit: impl FnOnce(&mut Value, &mut Value)) -> String {
    let mut header = json!({"typ": "dpop+jwt", "alg": "ES256", "jwk": key.public_jwk()});
    let mut body = json!({
        "jti": "jti-1", "htm": "POST", "htu": URI, "iat": NOW, "ath": token_hash(TOKEN),
    });
    edit(&mut header, &mut body);
    key.sign(&header, &body).unwrap()
}

#[test]
fn the_thumbprint_is_rfc_7638s() {
    // The key of RFC 9449's example proof (§4.1) and the `cnf.jkt` of its example token (§6.1).
    let jwk = json!({"kty": "EC", "crv": "P-256",
        "x": "l8tFrhx-34tV3hRICRDY9zCkDlpBhF42UQUfWVAWBFs",
        "y": "9VE4jf_Ok_o64zbTTlcuNJajHmt6v9TDVrU0CdvGRDA", "use": "sig"});
    assert_eq!(
        thumbprint(jwk.as_object().unwrap()).as_deref(),
        Some("0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I")
    );
    for not_a_public_key in [
        json!({"kty": "oct", "k": "c2VjcmV0"}),
        json!({"kty": "EC", "crv": "P-256", "x": "l8tFrhx-34tV3hRICRDY9zCkDlpBhF42UQUfWVAWBFs"}),
        json!({"kty": "RSA", "e": 65537, "n": "abc"}),
    ] {
        assert_eq!(thumbprint(not_a_public_key.as_object().unwrap()), None);
    }
}

#[test]
fn a_proper_proof_verifies_and_names_its_key() {
    let key = DpopKey::generate().unwrap();
    let jkt = key.thumbprint();
    let rules = rules();
    let proof = key.proof(&claims()).unwrap();
    let verified = verify_proof(&proof, &check(&jkt, &rules)).unwrap();
    assert_eq!(verified.jkt, jkt);
    assert_eq!(verified.jti, "jti-1");
    assert_eq!(verified.valid_until, NOW + 300);
    // Scheme and host case, the default port, the query and the fragment do not matter.
    let proof = edited(&key, |_, b| {
        b["htu"] = json!("HTTPS://Reports.Example.COM:443/mcp?x=1#f")
    });
    assert!(verify_proof(&proof, &check(&jkt, &rules)).is_ok());
}

#[test]
fn proofs_of_every_kind_of_local_key_verify_and_name_their_algorithm() {
    let rules = rules();
    let only_es256 = DpopRules {
        algorithms: vec![JwsAlgorithm::ES256],
        ..rules.clone()
    };
    for alg in [JwsAlgorithm::EdDSA, JwsAlgorithm::PS256] {
        let key = DpopKey::generate_for(alg).unwrap();
        let jkt = key.thumbprint();
        let proof = key.proof(&claims()).unwrap();
        let header: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(proof.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(header["alg"], alg.as_str());
        assert_eq!(verify_proof(&proof, &check(&jkt, &rules)).unwrap().jkt, jkt);
        // Only when the policy allows the algorithm.
        assert_eq!(
            verify_proof(&proof, &check(&jkt, &only_es256)),
            Err(ProofError::DisallowedAlgorithm),
            "{alg:?} where only ES256 is allowed"
        );
    }
}

#[test]
fn a_kept_key_still_checks_every_signature() {
    use crate::identity::dpop_signature::{MAX_PROOF_KEYS, ProofKeys};
    let kept = ProofKeys::default();
    let rules = rules();
    for alg in [JwsAlgorithm::ES256, JwsAlgorithm::PS256] {
        let key = DpopKey::generate_for(alg).unwrap();
        let jkt = key.thumbprint();
        let check = ProofCheck {
            keys: Some(&kept),
            ..check(&jkt, &rules)
        };
        assert!(verify_proof(&key.proof(&claims()).unwrap(), &check).is_ok());
        assert!(
            kept.get(alg, &jkt).is_some(),
            "{alg:?}: kept after it verified"
        );
        // The kept key verifies the next proof, and refuses a forged one.
        assert!(verify_proof(&key.proof(&claims()).unwrap(), &check).is_ok());
        let proof = key.proof(&claims()).unwrap();
        let (signed, _) = proof.rsplit_once('.').unwrap();
        let other = DpopKey::generate_for(alg).unwrap();
        let foreign = other.proof(&claims()).unwrap();
        let forged = format!("{signed}.{}", foreign.rsplit_once('.').unwrap().1);
        assert_eq!(verify_proof(&forged, &check), Err(ProofError::BadSignature));
        // Kept under its algorithm only.
        assert!(kept.get(JwsAlgorithm::RS256, &jkt).is_none());
    }
    assert_eq!(kept.len(), 2);
    // A key whose signature failed is not kept.
    let key = DpopKey::generate().unwrap();
    let jkt = key.thumbprint();
    let bad = edited(&key, |_, _| {});
    let (signed, _) = bad.rsplit_once('.').unwrap();
    let check = ProofCheck {
        keys: Some(&kept),
        ..check(&jkt, &rules)
    };
    assert_eq!(
        verify_proof(&format!("{signed}.AAAA"), &check),
        Err(ProofError::BadSignature)
    );
    assert!(kept.get(JwsAlgorithm::ES256, &jkt).is_none());
    // Bounded: when full it starts again empty.
    let any = kept
        .get(JwsAlgorithm::ES256, &kept_es256_jkt(&kept))
        .unwrap();
    for i in kept.len()..MAX_PROOF_KEYS {
        kept.insert(JwsAlgorithm::ES256, format!("k{i}"), any.clone());
    }
    assert_eq!(kept.len(), MAX_PROOF_KEYS);
    kept.insert(JwsAlgorithm::ES256, "one more".into(), any);
    assert_eq!(kept.len(), 1);
}

/// The thumbprint of the ES256 key [`a_kept_key_still_checks_every_signature`] kept first.
fn kept_es256_jkt(kept: &crate::identity::dpop_signature::ProofKeys) -> String {
    kept.thumbprints()
        .into_iter()
        .find(|(alg, _)| *alg == JwsAlgorithm::ES256)
        .map(|(_, jkt)| jkt)
        .unwrap()
}

#[test]
fn the_replay_digest_separates_keys_and_jtis() {
    let proof = |jkt: &str, jti: &str| VerifiedProof {
        jkt: jkt.into(),
        jti: jti.into(),
        valid_until: 0,
    };
    let base = proof("k", "j").replay_digest();
    assert_eq!(base, proof("k", "j").replay_digest());
    assert_ne!(base, proof("k2", "j").replay_digest());
    assert_ne!(base, proof("k", "j2").replay_digest());
    assert_ne!(
        proof("ab", "c").replay_digest(),
        proof("a", "bc").replay_digest()
    );
}

#[test]
fn every_rule_of_rfc_9449_section_4_3_refuses_its_violation() {
    let key = DpopKey::generate().unwrap();
    let jkt = key.thumbprint();
    let rules = rules();
    let cases: Vec<(&str, String, ProofError)> = vec![
        ("not a JWT", "abc".into(), ProofError::Malformed),
        (
            "four parts",
            format!("{}.x", key.proof(&claims()).unwrap()),
            ProofError::Malformed,
        ),
        (
            "typ JWT",
            edited(&key, |h, _| h["typ"] = json!("JWT")),
            ProofError::WrongType,
        ),
        (
            "no typ",
            edited(&key, |h, _| {
                h.as_object_mut().unwrap().remove("typ");
            }),
            ProofError::WrongType,
        ),
        (
            "alg none",
            edited(&key, |h, _| h["alg"] = json!("none")),
            ProofError::DisallowedAlgorithm,
        ),
        (
            "alg HS256",
            edited(&key, |h, _| h["alg"] = json!("HS256")),
            ProofError::DisallowedAlgorithm,
        ),
        (
            "no jwk",
            edited(&key, |h, _| {
                h.as_object_mut().unwrap().remove("jwk");
            }),
            ProofError::BadKey,
        ),
        (
            "a private key in jwk",
            edited(&key, |h, _| h["jwk"]["d"] = json!("c2VjcmV0")),
            ProofError::BadKey,
        ),
        (
            "a symmetric key",
            edited(&key, |h, _| {
                h["jwk"] = json!({"kty": "oct", "k": "c2VjcmV0"})
            }),
            ProofError::BadKey,
        ),
        (
            "another key in jwk",
            edited(&key, |h, _| {
                h["jwk"] = Value::Object(DpopKey::generate().unwrap().public_jwk())
            }),
            ProofError::KeyMismatch,
        ),
        (
            "htm GET",
            edited(&key, |_, b| b["htm"] = json!("GET")),
            ProofError::WrongMethod,
        ),
        (
            "htm lower case",
            edited(&key, |_, b| b["htm"] = json!("post")),
            ProofError::WrongMethod,
        ),
        (
            "no htm",
            edited(&key, |_, b| {
                b.as_object_mut().unwrap().remove("htm");
            }),
            ProofError::MissingClaim("htm"),
        ),
        (
            "htu of another server",
            edited(&key, |_, b| {
                b["htu"] = json!("https://other.example.com/mcp")
            }),
            ProofError::WrongUri,
        ),
        (
            "htu of another path",
            edited(&key, |_, b| {
                b["htu"] = json!("https://reports.example.com/mcp/x")
            }),
            ProofError::WrongUri,
        ),
        (
            "htu over http",
            edited(&key, |_, b| {
                b["htu"] = json!("http://reports.example.com/mcp")
            }),
            ProofError::WrongUri,
        ),
        (
            "htu with user info",
            edited(&key, |_, b| {
                b["htu"] = json!("https://u@reports.example.com/mcp")
            }),
            ProofError::WrongUri,
        ),
        (
            "iat too old",
            edited(&key, |_, b| b["iat"] = json!(NOW - 301)),
            ProofError::Stale,
        ),
        (
            "iat too far ahead",
            edited(&key, |_, b| b["iat"] = json!(NOW + 301)),
            ProofError::Stale,
        ),
        (
            "no iat",
            edited(&key, |_, b| {
                b.as_object_mut().unwrap().remove("iat");
            }),
            ProofError::MissingClaim("iat"),
        ),
        (
            "no jti",
            edited(&key, |_, b| {
                b.as_object_mut().unwrap().remove("jti");
            }),
            ProofError::MissingClaim("jti"),
        ),
        (
            "a jti too long",
            edited(&key, |_, b| b["jti"] = json!("j".repeat(MAX_JTI_BYTES + 1))),
            ProofError::MissingClaim("jti"),
        ),
        (
            "ath of another token",
            edited(&key, |_, b| b["ath"] = json!(token_hash("another"))),
            ProofError::WrongTokenHash,
        ),
        (
            "no ath",
            edited(&key, |_, b| {
                b.as_object_mut().unwrap().remove("ath");
            }),
            ProofError::MissingClaim("ath"),
        ),
    ];
    for (what, proof, expected) in cases {
        assert_eq!(
            verify_proof(&proof, &check(&jkt, &rules)),
            Err(expected),
            "{what}"
        );
    }
    // A tampered signature.
    let mut proof = key.proof(&claims()).unwrap();
    let last = proof.pop().unwrap();
    proof.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(
        verify_proof(&proof, &check(&jkt, &rules)),
        Err(ProofError::BadSignature)
    );
    // At the edges of the window the proof still verifies.
    for iat in [NOW - 300, NOW + 300] {
        let proof = edited(&key, |_, b| b["iat"] = json!(iat));
        assert!(verify_proof(&proof, &check(&jkt, &rules)).is_ok(), "{iat}");
    }
}

#[test]
fn the_proof_key_must_be_the_one_the_token_is_bound_to() {
    let key = DpopKey::generate().unwrap();
    let other = DpopKey::generate().unwrap();
    let rules = rules();
    let proof = key.proof(&claims()).unwrap();
    assert_eq!(
        verify_proof(&proof, &check(&other.thumbprint(), &rules)),
        Err(ProofError::KeyMismatch)
    );
}

#[test]
fn the_policy_decides_algorithms_and_the_window() {
    let key = DpopKey::generate().unwrap();
    let jkt = key.thumbprint();
    let only_eddsa = DpopRules {
        algorithms: vec![JwsAlgorithm::EdDSA],
        ..DpopRules::default()
    };
    let proof = key.proof(&claims()).unwrap();
    assert_eq!(
        verify_proof(&proof, &check(&jkt, &only_eddsa)),
        Err(ProofError::DisallowedAlgorithm)
    );
    let narrow = DpopRules {
        proof_window_secs: 10,
        ..DpopRules::default()
    };
    let proof = edited(&key, |_, b| b["iat"] = json!(NOW - 11));
    assert_eq!(
        verify_proof(&proof, &check(&jkt, &narrow)),
        Err(ProofError::Stale)
    );
}

#[test]
fn a_required_nonce_must_be_current() {
    let key = DpopKey::generate().unwrap();
    let jkt = key.thumbprint();
    let rules = rules();
    let current = |n: &str| n == "n-current";
    let with_nonce = |nonce: Option<&str>| {
        let proof = key.proof(&ProofClaims { nonce, ..claims() }).unwrap();
        verify_proof(
            &proof,
            &ProofCheck {
                nonce: Some(&current),
                keys: None,
                ..check(&jkt, &rules)
            },
        )
    };
    assert!(with_nonce(Some("n-current")).is_ok());
    assert_eq!(with_nonce(Some("n-old")), Err(ProofError::NonceRequired));
    assert_eq!(with_nonce(None), Err(ProofError::NonceRequired));
    assert_eq!(ProofError::NonceRequired.error_code(), "use_dpop_nonce");
    assert_eq!(ProofError::Stale.error_code(), "invalid_dpop_proof");
}

#[test]
fn a_key_survives_its_pem() {
    for alg in [
        JwsAlgorithm::ES256,
        JwsAlgorithm::EdDSA,
        JwsAlgorithm::PS256,
    ] {
        let key = DpopKey::generate_for(alg).unwrap();
        let again = DpopKey::from_pem(&key.to_pem()).unwrap();
        assert_eq!(again.thumbprint(), key.thumbprint(), "{alg:?}");
        assert_eq!(again.algorithm(), alg);
    }
    assert!(matches!(
        DpopKey::generate_for(JwsAlgorithm::RS256),
        Err(DpopKeyError::Unsupported("RS256"))
    ));
    assert!(
        DpopKey::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
            .is_err()
    );
}

/// A proof signed with jsonwebtoken (an independent signer) by the fixture issuer keys, whose
/// public JWKs are in the fixture JWKS: the EdDSA and RSA paths of the signature check.
fn signed_with_fixture(alg: jsonwebtoken::Algorithm, kid: &str, pem: &[u8]) -> (String, String) {
    let jwks: Value =
        serde_json::from_slice(include_bytes!("../../tests/fixtures/keys/issuer-jwks.json"))
            .unwrap();
    let mut jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid)
        .unwrap()
        .as_object()
        .unwrap()
        .clone();
    for member in ["kid", "alg", "use"] {
        jwk.remove(member);
    }
    let key = match alg {
        jsonwebtoken::Algorithm::EdDSA => jsonwebtoken::EncodingKey::from_ed_pem(pem).unwrap(),
        _ => jsonwebtoken::EncodingKey::from_rsa_pem(pem).unwrap(),
    };
    let header = json!({"typ": "dpop+jwt", "alg": format!("{alg:?}"), "jwk": jwk});
    let claims =
        json!({"jti": "j", "htm": "POST", "htu": URI, "iat": NOW, "ath": token_hash(TOKEN)});
    let input = format!(
        "{}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(header.to_string()),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &key, alg).unwrap();
    (format!("{input}.{signature}"), thumbprint(&jwk).unwrap())
}

/// `proof` with its header's `alg` replaced (the signature left as it was).
fn with_alg(proof: &str, alg: &str) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (head, rest) = proof.split_once('.').unwrap();
    let mut header: Value = serde_json::from_slice(&b64.decode(head).unwrap()).unwrap();
    header["alg"] = json!(alg);
    format!("{}.{rest}", b64.encode(header.to_string()))
}

#[test]
fn eddsa_rsa_and_p384_proofs_verify_with_their_own_algorithms_only() {
    use base64::Engine as _;
    use jsonwebtoken::Algorithm;
    let ed = include_bytes!("../../tests/fixtures/keys/issuer-ed25519.pem");
    let rsa = include_bytes!("../../tests/fixtures/keys/issuer-rsa.pem");
    let rules = rules();
    for (alg, kid, pem) in [
        (Algorithm::EdDSA, "test-ed-1", &ed[..]),
        (Algorithm::RS256, "test-rsa-1", &rsa[..]),
        (Algorithm::PS256, "test-rsa-1", &rsa[..]),
    ] {
        let (proof, jkt) = signed_with_fixture(alg, kid, pem);
        assert!(
            verify_proof(&proof, &check(&jkt, &rules)).is_ok(),
            "{alg:?}"
        );
        // The same bytes claimed under another algorithm of the same key type do not verify.
        let swapped = match alg {
            Algorithm::RS256 => Some("PS256"),
            Algorithm::PS256 => Some("RS256"),
            _ => None,
        };
        if let Some(other) = swapped {
            let forged = with_alg(&proof, other);
            assert_eq!(
                verify_proof(&forged, &check(&jkt, &rules)),
                Err(ProofError::BadSignature),
                "{alg:?} as {other}"
            );
        }
        // An algorithm of another key type names a key it cannot be.
        let forged = with_alg(
            &proof,
            if alg == Algorithm::EdDSA {
                "ES256"
            } else {
                "EdDSA"
            },
        );
        assert_eq!(
            verify_proof(&forged, &check(&jkt, &rules)),
            Err(ProofError::BadKey),
            "{alg:?} key under another type's algorithm"
        );
    }
    // ES384 with a P-384 key made here.
    use aws_lc_rs::signature::{ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P384_SHA384_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_FIXED_SIGNING, pkcs8.as_ref()).unwrap();
    let point = pair.public_key().as_ref();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let jwk = json!({"kty": "EC", "crv": "P-384", "x": b64(&point[1..49]), "y": b64(&point[49..])});
    let header = json!({"typ": "dpop+jwt", "alg": "ES384", "jwk": jwk});
    let claims =
        json!({"jti": "j", "htm": "POST", "htu": URI, "iat": NOW, "ath": token_hash(TOKEN)});
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let signature = pair.sign(&rng, input.as_bytes()).unwrap();
    let proof = format!("{input}.{}", b64(signature.as_ref()));
    let jkt = thumbprint(jwk.as_object().unwrap()).unwrap();
    assert!(verify_proof(&proof, &check(&jkt, &rules)).is_ok(), "ES384");
}
