//! Test fixtures shared by the SSF tests: keys, a transmitter's claims, signed SETs.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

pub const ED_KEY: &[u8] = include_bytes!("../../../tests/fixtures/keys/issuer-ed25519.pem");
pub const RSA_KEY: &[u8] = include_bytes!("../../../tests/fixtures/keys/issuer-rsa.pem");
pub const ATTACKER_KEY: &[u8] = include_bytes!("../../../tests/fixtures/keys/attacker-ed25519.pem");
pub const JWKS: &[u8] = include_bytes!("../../../tests/fixtures/keys/issuer-jwks.json");

pub const ISS: &str = "https://idp.test";
pub const AUD: &str = "https://lifeguard.test/ssf";
pub const NOW: i64 = 1_800_000_000;

pub const SESSION_REVOKED: &str =
    "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

/// A valid CAEP session-revoked SET's claims, issued 10 s before [`NOW`].
pub fn claims() -> Value {
    json!({
        "iss": ISS, "aud": AUD, "iat": NOW - 10, "jti": "jti-1", "txn": "txn-1",
        "sub_id": {"format": "iss_sub", "iss": ISS, "sub": "alice"},
        "events": {SESSION_REVOKED: {"event_timestamp": NOW - 60, "initiating_entity": "policy"}}
    })
}

/// `claims` with `key` replaced, or removed when `value` is null.
pub fn with(mut claims: Value, key: &str, value: Value) -> Value {
    if let Some(object) = claims.as_object_mut() {
        if value.is_null() {
            object.remove(key);
        } else {
            object.insert(key.to_owned(), value);
        }
    }
    claims
}

/// Signs with the issuer's Ed25519 key (kid `test-ed-1`) and `typ: secevent+jwt`.
pub fn sign(claims: &Value) -> String {
    sign_with(
        claims,
        Algorithm::EdDSA,
        ED_KEY,
        Some("test-ed-1"),
        "secevent+jwt",
    )
}

pub fn sign_with(
    claims: &Value,
    alg: Algorithm,
    pem: &[u8],
    kid: Option<&str>,
    typ: &str,
) -> String {
    let key = match alg {
        Algorithm::EdDSA => EncodingKey::from_ed_pem(pem),
        Algorithm::HS256 => EncodingKey::from_secret(pem),
        _ => EncodingKey::from_rsa_pem(pem),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    header.typ = Some(typ.to_owned());
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

/// An unsigned token with an arbitrary header.
pub fn unsigned(header: &Value, claims: &Value) -> String {
    let encode = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
    format!("{}.{}.", encode(header), encode(claims))
}
