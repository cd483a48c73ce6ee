//! Idempotent task creation: a key (the client's `Idempotency-Key` header, or one derived from
//! the request) maps to one task per owner within the policy's window.

use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use serde_json::Value;
use sha2::Sha256;

use crate::mcp::headers;
use crate::model::{KeyBinding, Owner};

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Idempotency-Key must be 1 to 255 visible ASCII characters")]
pub struct BadIdempotencyKey;

/// What identifies "the same creation": the header's key, or (when the policy derives keys) the
/// canonical arguments. `None`: no deduplication for this request.
pub fn key_material(
    request_headers: &HeaderMap,
    derive_from_request: bool,
    arguments: &Value,
) -> Result<Option<String>, BadIdempotencyKey> {
    if let Some(value) = request_headers.get(headers::IDEMPOTENCY_KEY) {
        let bytes = value.as_bytes();
        let valid = !bytes.is_empty()
            && bytes.len() <= 255
            && bytes.iter().all(|b| (0x21..=0x7e).contains(b));
        if !valid {
            return Err(BadIdempotencyKey);
        }
        // Valid ASCII, so this cannot fail.
        return Ok(Some(format!("header:{}", String::from_utf8_lossy(bytes))));
    }
    if derive_from_request {
        let mut canonical = String::new();
        write_canonical(arguments, &mut canonical);
        return Ok(Some(format!("derived:{canonical}")));
    }
    Ok(None)
}

/// JSON with object keys sorted at every level, whatever map order the parser kept: the same
/// arguments always give the same text.
pub fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The ledger key: HMAC-SHA-256 (keyed by a ledger secret) over the owner (issuer, subject,
/// tenant, client), the tool, the key material and the key the creating token is bound to (if
/// any), so the same key from another principal, client or proof key never collides, and
/// stored hashes reveal nothing. Unbound callers hash as they did before bindings existed.
pub fn claim_hash(
    secret: &[u8; 32],
    owner: &Owner,
    binding: Option<&KeyBinding>,
    tool: &str,
    material: &str,
) -> [u8; 32] {
    // HMAC accepts keys of any length.
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes any key length");
    let bound = binding.map(KeyBinding::to_stored);
    let parts = [
        owner.issuer.as_str(),
        owner.subject.as_str(),
        owner.tenant.as_str(),
        owner.client.as_str(),
        tool,
        material,
    ];
    // Each part is length-prefixed, so six parts never hash like seven.
    for part in parts.into_iter().chain(bound.as_deref()) {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part.as_bytes());
    }
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn owner(subject: &str) -> Owner {
        Owner {
            issuer: "https://idp".into(),
            subject: subject.into(),
            tenant: "t".into(),
            client: "c".into(),
        }
    }

    #[test]
    fn header_keys_win_and_are_validated() {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from_static("order-42"));
        assert_eq!(
            key_material(&h, true, &json!({"a": 1})),
            Ok(Some("header:order-42".into()))
        );
        h.insert("idempotency-key", HeaderValue::from_static("has space"));
        assert_eq!(key_material(&h, false, &json!({})), Err(BadIdempotencyKey));
        assert_eq!(key_material(&HeaderMap::new(), false, &json!({})), Ok(None));
    }

    #[test]
    fn derived_keys_ignore_key_order_but_not_values() {
        let none = HeaderMap::new();
        let a = key_material(&none, true, &json!({"b": [1, {"y": 2, "x": 1}], "a": "s"}));
        let b = key_material(&none, true, &json!({"a": "s", "b": [1, {"x": 1, "y": 2}]}));
        let c = key_material(&none, true, &json!({"a": "s", "b": [1, {"x": 1, "y": 3}]}));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn hashes_bind_the_owner_and_tool() {
        let k = [7u8; 32];
        let base = claim_hash(&k, &owner("alice"), None, "t", "header:x");
        assert_eq!(base, claim_hash(&k, &owner("alice"), None, "t", "header:x"));
        assert_ne!(base, claim_hash(&k, &owner("bob"), None, "t", "header:x"));
        assert_ne!(base, claim_hash(&k, &owner("alice"), None, "u", "header:x"));
        let key = KeyBinding::Dpop { jkt: "k1".into() };
        let bound = claim_hash(&k, &owner("alice"), Some(&key), "t", "header:x");
        assert_ne!(base, bound, "a key-bound creation is not a bearer one");
        let other = KeyBinding::Dpop { jkt: "k2".into() };
        assert_ne!(
            bound,
            claim_hash(&k, &owner("alice"), Some(&other), "t", "header:x")
        );
        assert_ne!(
            base,
            claim_hash(&[8u8; 32], &owner("alice"), None, "t", "header:x")
        );
        // Length prefixes keep field boundaries: ("ab","c") differs from ("a","bc").
        let mut o1 = owner("ab");
        o1.tenant = "c".into();
        let mut o2 = owner("a");
        o2.tenant = "bc".into();
        assert_ne!(
            claim_hash(&k, &o1, None, "t", "m"),
            claim_hash(&k, &o2, None, "t", "m")
        );
    }
}
