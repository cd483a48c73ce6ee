use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use super::*;
use crate::operator::ssf::test_support::{
    ATTACKER_KEY, AUD, ED_KEY, ISS, JWKS, NOW, RSA_KEY, SESSION_REVOKED, claims, sign, sign_with,
    unsigned, with,
};

const RULES: SetRules<'static> = SetRules {
    issuer: ISS,
    audience: AUD,
    max_event_age: Duration::from_secs(3600),
};

fn verify(token: &str) -> Result<VerifiedSet, SetError> {
    verify_set(token, &RULES, &KeySet::from_jwks(JWKS).unwrap(), NOW)
}

fn code(token: &str) -> &'static str {
    verify(token).unwrap_err().err_code()
}

#[test]
fn accepts_a_valid_set() {
    let set = verify(&sign(&claims())).unwrap();
    assert_eq!(set.issuer, ISS);
    assert_eq!(set.jti, "jti-1");
    assert_eq!(set.iat, NOW - 10);
    assert_eq!(set.txn.as_deref(), Some("txn-1"));
    assert_eq!(
        set.subject,
        SubjectId::IssSub {
            iss: ISS.into(),
            sub: "alice".into()
        }
    );
    assert_eq!(set.events.len(), 1);
    assert_eq!(set.events[0].0, SESSION_REVOKED);
}

#[test]
fn accepts_rsa_an_audience_array_and_typ_spellings() {
    let c = with(claims(), "aud", json!(["https://other", AUD]));
    for typ in ["secevent+jwt", "application/secevent+jwt", "SecEvent+JWT"] {
        let token = sign_with(&c, Algorithm::RS256, RSA_KEY, Some("test-rsa-1"), typ);
        assert!(verify(&token).is_ok(), "{typ}");
    }
    // Without a kid every key of the algorithm's family is tried.
    let token = sign_with(&c, Algorithm::RS256, RSA_KEY, None, "secevent+jwt");
    assert!(verify(&token).is_ok());
    // The RSA key is pinned to RS256: the same key under PS256 is not a candidate.
    let token = sign_with(
        &c,
        Algorithm::PS256,
        RSA_KEY,
        Some("test-rsa-1"),
        "secevent+jwt",
    );
    assert_eq!(
        verify(&token),
        Err(SetError::UnknownKey(Some("test-rsa-1".into())))
    );
}

#[test]
fn key_problems_are_invalid_key() {
    let forged = sign_with(
        &claims(),
        Algorithm::EdDSA,
        ATTACKER_KEY,
        Some("test-ed-1"),
        "secevent+jwt",
    );
    assert_eq!(verify(&forged), Err(SetError::BadSignature));
    assert_eq!(code(&forged), "invalid_key");

    let unknown_kid = sign_with(
        &claims(),
        Algorithm::EdDSA,
        ED_KEY,
        Some("rotated"),
        "secevent+jwt",
    );
    assert_eq!(
        verify(&unknown_kid),
        Err(SetError::UnknownKey(Some("rotated".into())))
    );
    assert_eq!(code(&unknown_kid), "invalid_key");

    let none = unsigned(&json!({"alg": "none", "typ": "secevent+jwt"}), &claims());
    assert_eq!(code(&none), "invalid_key");

    let hmac = sign_with(
        &claims(),
        Algorithm::HS256,
        b"shared-secret",
        None,
        "secevent+jwt",
    );
    assert_eq!(
        verify(&hmac),
        Err(SetError::DisallowedAlgorithm("HS256".into()))
    );
    assert_eq!(code(&hmac), "invalid_key");

    // A signature of the EdDSA key presented as RS256 matches no RSA key with that kid.
    let signed = sign(&claims());
    let rest = &signed[signed.find('.').unwrap()..];
    let header = br#"{"alg":"RS256","typ":"secevent+jwt","kid":"test-ed-1"}"#;
    let mismatched = format!("{}{rest}", URL_SAFE_NO_PAD.encode(header));
    assert_eq!(code(&mismatched), "invalid_key");
}

#[test]
fn wrong_type_and_malformed_tokens_are_invalid_request() {
    let jwt = sign_with(
        &claims(),
        Algorithm::EdDSA,
        ED_KEY,
        Some("test-ed-1"),
        "JWT",
    );
    assert_eq!(verify(&jwt), Err(SetError::WrongType(Some("JWT".into()))));
    assert_eq!(code(&jwt), "invalid_request");
    let untyped = unsigned(&json!({"alg": "EdDSA", "kid": "test-ed-1"}), &claims());
    assert_eq!(code(&untyped), "invalid_request");
    let crit = unsigned(
        &json!({"alg": "EdDSA", "typ": "secevent+jwt", "crit": ["b64"], "b64": false}),
        &claims(),
    );
    assert_eq!(verify(&crit), Err(SetError::CriticalExtension));
    for garbage in ["", "a.b", "a.b.c.d", "!!!.###.$$$", "e30.e30."] {
        assert_eq!(code(garbage), "invalid_request", "{garbage}");
    }
}

#[test]
fn claim_problems_are_invalid_request() {
    let cases: [(Value, SetError); 9] = [
        (
            with(claims(), "sub_id", Value::Null),
            SetError::MissingClaim("sub_id"),
        ),
        (
            with(claims(), "sub", json!("alice")),
            SetError::ForbiddenClaim("sub"),
        ),
        (
            with(claims(), "exp", json!(NOW + 60)),
            SetError::ForbiddenClaim("exp"),
        ),
        (with(claims(), "iat", json!(NOW - 3601)), SetError::TooOld),
        (
            with(claims(), "iat", json!(NOW + 301)),
            SetError::FromTheFuture,
        ),
        (
            with(claims(), "iat", Value::Null),
            SetError::MissingClaim("iat"),
        ),
        (
            with(claims(), "jti", Value::Null),
            SetError::MissingClaim("jti"),
        ),
        (
            with(claims(), "aud", Value::Null),
            SetError::MissingClaim("aud"),
        ),
        (
            with(claims(), "events", json!({})),
            SetError::InvalidEvent("must be an object with at least one event".into()),
        ),
    ];
    for (claims, expected) in cases {
        let token = sign(&claims);
        assert_eq!(verify(&token).as_ref(), Err(&expected));
        assert_eq!(expected.err_code(), "invalid_request", "{expected}");
    }
    let bad_subject = sign(&with(claims(), "sub_id", json!({"format": "email"})));
    assert_eq!(code(&bad_subject), "invalid_request");
    let bad_event = sign(&with(
        claims(),
        "events",
        json!({SESSION_REVOKED: "revoked"}),
    ));
    assert_eq!(code(&bad_event), "invalid_request");
    // The window's edges are inside.
    assert!(verify(&sign(&with(claims(), "iat", json!(NOW - 3600)))).is_ok());
    assert!(verify(&sign(&with(claims(), "iat", json!(NOW + 300)))).is_ok());
}

#[test]
fn issuer_and_audience_have_their_own_codes() {
    let other_issuer = sign(&with(claims(), "iss", json!("https://evil.test")));
    assert_eq!(code(&other_issuer), "invalid_issuer");
    let other_audience = sign(&with(claims(), "aud", json!("https://someone-else")));
    assert_eq!(verify(&other_audience), Err(SetError::WrongAudience));
    assert_eq!(code(&other_audience), "invalid_audience");
    let not_ours = sign(&with(claims(), "aud", json!(["https://a", "https://b"])));
    assert_eq!(code(&not_ours), "invalid_audience");
    assert_eq!(
        SetError::AuthenticationFailed("no bearer token").err_code(),
        "authentication_failed"
    );
}

#[test]
fn unverified_issuer_reads_only_iss() {
    assert_eq!(unverified_issuer(&sign(&claims())), Ok(ISS.to_owned()));
    assert_eq!(
        unverified_issuer(&sign(&with(claims(), "iss", Value::Null))),
        Err(SetError::MissingClaim("iss"))
    );
}
