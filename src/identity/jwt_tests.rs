use std::sync::Arc;

use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use super::*;
use crate::identity::mint::mint_token;
use crate::policy::{EffectivePolicy, load_standalone};

const ED_KEY: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-ed25519.pem");
const RSA_KEY: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-rsa.pem");
const ATTACKER_KEY: &[u8] = include_bytes!("../../tests/fixtures/keys/attacker-ed25519.pem");
const JWKS: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-jwks.json");

const NOW: u64 = 1_800_000_000;
const ISS: &str = "https://idp.test";
const AUD: &str = "https://mcp.test/mcp";

fn policy(algorithms: &str) -> EffectivePolicy {
    let yaml = format!(
        r#"
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: p}}
spec:
  selector: {{}}
  resource: {AUD}
  identity:
    issuers:
      - issuer: {ISS}
        jwksFile: keys.json
        {algorithms}
"#
    );
    load_standalone("p.yaml", &yaml, jiff::Timestamp::now())
        .unwrap()
        .0
}

fn claims() -> Value {
    json!({"iss": ISS, "aud": AUD, "sub": "alice", "tid": "tenant-a", "client_id": "console",
           "scope": "reports:run reports:read", "iat": NOW - 10, "exp": NOW + 600})
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    if value.is_null() {
        claims.as_object_mut().unwrap().remove(key);
    } else {
        claims[key] = value;
    }
    claims
}

fn ed(claims: &Value) -> String {
    mint_token(ED_KEY, Algorithm::EdDSA, Some("test-ed-1"), claims).unwrap()
}

fn validate(token: &str, policy: &EffectivePolicy) -> Result<Identity, AuthError> {
    let keys = Arc::new(KeySet::from_jwks(JWKS).unwrap());
    validate_token(token, policy, &|_| Some(keys.clone()), NOW)
}

#[test]
fn a_valid_token_yields_the_owner_key_and_scopes() {
    let id = validate(&ed(&claims()), &policy("")).unwrap();
    assert_eq!(id.owner.issuer, ISS);
    assert_eq!(id.owner.subject, "alice");
    assert_eq!(id.owner.tenant, "tenant-a");
    assert_eq!(id.owner.client, "console");
    assert!(id.has_scope("reports:run") && id.has_scope("reports:read"));
    assert_eq!(id.issued_at, Some(NOW as i64 - 10));
    assert_eq!(id.expires_at, NOW as i64 + 600);
}

#[test]
fn rsa_tokens_and_array_scopes_and_azp_work() {
    let c = with(
        with(claims(), "scope", json!(["a", "b"])),
        "client_id",
        Value::Null,
    );
    let c = with(c, "azp", json!("fallback-client"));
    let token = mint_token(RSA_KEY, Algorithm::RS256, Some("test-rsa-1"), &c).unwrap();
    let id = validate(&token, &policy("")).unwrap();
    assert!(id.has_scope("a") && id.has_scope("b"));
    assert_eq!(id.owner.client, "fallback-client");
}

#[test]
fn missing_tenant_and_client_mean_empty_not_wildcard() {
    let c = with(with(claims(), "tid", Value::Null), "client_id", Value::Null);
    let id = validate(&ed(&c), &policy("")).unwrap();
    assert_eq!(id.owner.tenant, "");
    assert_eq!(id.owner.client, "");
}

#[test]
fn each_kind_of_bad_token_is_refused_with_its_reason() {
    let p = policy("");
    let cases: Vec<(String, AuthError)> = vec![
        (
            ed(&with(claims(), "exp", json!(NOW - 31))),
            AuthError::Expired,
        ),
        (
            ed(&with(claims(), "nbf", json!(NOW + 60))),
            AuthError::NotYetValid,
        ),
        (
            ed(&with(claims(), "aud", json!("https://other/mcp"))),
            AuthError::WrongAudience,
        ),
        (
            ed(&with(claims(), "iss", json!("https://evil.test"))),
            AuthError::UntrustedIssuer,
        ),
        (
            ed(&with(claims(), "sub", Value::Null)),
            AuthError::MissingClaim("sub".into()),
        ),
        (
            ed(&with(claims(), "exp", Value::Null)),
            AuthError::MissingClaim("exp".into()),
        ),
        (
            mint_token(ATTACKER_KEY, Algorithm::EdDSA, Some("test-ed-1"), &claims()).unwrap(),
            AuthError::BadSignature,
        ),
        (
            mint_token(ED_KEY, Algorithm::EdDSA, Some("rotated-away"), &claims()).unwrap(),
            AuthError::UnknownKey {
                issuer: ISS.into(),
                kid: Some("rotated-away".into()),
            },
        ),
        ("not.a.jwt".into(), AuthError::Malformed),
    ];
    for (token, expected) in cases {
        assert_eq!(validate(&token, &p), Err(expected.clone()), "{expected}");
    }
}

#[test]
fn expiry_within_leeway_is_accepted() {
    let token = ed(&with(claims(), "exp", json!(NOW - 20)));
    assert!(validate(&token, &policy("")).is_ok());
}

#[test]
fn hmac_and_none_algorithms_are_never_accepted() {
    let hs = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &claims(),
        &jsonwebtoken::EncodingKey::from_secret(b"secret").unwrap(),
    )
    .unwrap();
    assert_eq!(
        validate(&hs, &policy("")),
        Err(AuthError::DisallowedAlgorithm)
    );
    // `alg: none` with an empty signature.
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let none = format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(claims().to_string())
    );
    assert_eq!(validate(&none, &policy("")), Err(AuthError::Malformed));
}

#[test]
fn algorithms_outside_the_issuers_list_are_refused() {
    let p = policy("algorithms: [EdDSA]");
    let rsa = mint_token(RSA_KEY, Algorithm::RS256, Some("test-rsa-1"), &claims()).unwrap();
    assert_eq!(validate(&rsa, &p), Err(AuthError::DisallowedAlgorithm));
    assert!(validate(&ed(&claims()), &p).is_ok());
}

#[test]
fn bearer_header_parsing() {
    assert_eq!(bearer_token(Some(b"Bearer abc")), Ok("abc"));
    assert_eq!(bearer_token(Some(b"bearer  abc ")), Ok("abc"));
    assert_eq!(bearer_token(None), Err(AuthError::Missing));
    assert_eq!(
        bearer_token(Some(b"Basic dXNlcg==")),
        Err(AuthError::Missing)
    );
    assert_eq!(bearer_token(Some(b"Bearer")), Err(AuthError::Malformed));
    assert_eq!(bearer_token(Some(b"Bearer ")), Err(AuthError::Malformed));
}

#[test]
fn a_cnf_claim_binds_the_identity_to_its_key() {
    let p = policy("");
    let bound = |cnf: Value| validate(&ed(&with(claims(), "cnf", cnf)), &p);
    assert_eq!(validate(&ed(&claims()), &p).unwrap().binding, None);
    assert_eq!(
        bound(json!({"jkt": "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I"}))
            .unwrap()
            .binding,
        Some(KeyBinding::Dpop {
            jkt: "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I".into()
        })
    );
    assert_eq!(
        bound(json!({"x5t#S256": "bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2"}))
            .unwrap()
            .binding,
        Some(KeyBinding::Mtls {
            x5t_s256: "bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2".into()
        })
    );
    // A binding this server cannot check is never dropped into a bearer token.
    for cnf in [
        json!({"jwk": {"kty": "EC"}}),
        json!({"jkt": "a", "x5t#S256": "b"}),
        json!({"jkt": 7}),
        json!({"jkt": ""}),
        json!("jkt"),
        json!({}),
    ] {
        assert_eq!(
            bound(cnf.clone()),
            Err(AuthError::UnsupportedConfirmation),
            "{cnf}"
        );
    }
}

#[test]
fn the_authorization_scheme_is_bearer_or_dpop() {
    assert_eq!(credential(Some(b"Bearer abc")), Ok((Scheme::Bearer, "abc")));
    assert_eq!(credential(Some(b"bearer abc")), Ok((Scheme::Bearer, "abc")));
    assert_eq!(credential(Some(b"DPoP abc")), Ok((Scheme::Dpop, "abc")));
    assert_eq!(credential(Some(b"dpop abc")), Ok((Scheme::Dpop, "abc")));
    assert_eq!(credential(Some(b"Basic abc")), Err(AuthError::Missing));
    assert_eq!(credential(Some(b"DPoP ")), Err(AuthError::Malformed));
    assert_eq!(credential(None), Err(AuthError::Missing));
}
