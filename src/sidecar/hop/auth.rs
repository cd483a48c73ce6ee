//! Authentication of the internal hop between replicas. Pure: signing and checking only.
//!
//! A forwarded request carries, besides the client's own headers and body:
//! `Lifeguard-Hop-From` (sending replica), `Lifeguard-Hop-To` (receiving replica),
//! `Lifeguard-Hop-Time` (Unix ms), `Lifeguard-Hop-Nonce` (128 random bits, hex) and
//! `Lifeguard-Hop-Signature`: HMAC-SHA256, keyed by the ledger secret every replica of the
//! server shares, over a canonical text of all of the above, every other forwarded header
//! (names lowercased, sorted) and the SHA-256 of the body. The receiver accepts a request only
//! for itself, within [`MAX_SKEW_MS`] of its clock, with a nonce it has not seen, and with a
//! valid signature (compared in constant time). A request changed in any header or byte, sent
//! to another replica, replayed, or made without the key is refused.

use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};

pub const FROM: &str = "lifeguard-hop-from";
pub const TO: &str = "lifeguard-hop-to";
pub const TIME: &str = "lifeguard-hop-time";
pub const NONCE: &str = "lifeguard-hop-nonce";
pub const SIGNATURE: &str = "lifeguard-hop-signature";

/// The hop's own headers: never taken from a client, never covered by the header digest.
pub const HOP_HEADERS: [&str; 5] = [FROM, TO, TIME, NONCE, SIGNATURE];

/// Headers the transport sets or changes on the way (the HTTP client adds `host` and
/// `content-length`; proxies may rewrite the others): left out of the signed text on both
/// sides. The body is covered by its digest, the hop by its own headers.
pub const UNSIGNED: [&str; 10] = [
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "accept-encoding",
];

/// Largest accepted difference between the sender's clock and the receiver's.
pub const MAX_SKEW_MS: i64 = 30_000;

/// The facts a signature covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HopClaims {
    pub from: String,
    pub to: String,
    pub time_ms: i64,
    pub nonce: String,
}

/// Why a hop request was refused (logged and counted; the sender gets 401 without detail).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HopRefusal {
    #[error("hop headers missing or malformed")]
    Malformed,
    #[error("the request is for another replica")]
    WrongReplica,
    #[error("the request's time is outside the accepted skew")]
    Stale,
    #[error("the nonce was seen before (replay)")]
    Replayed,
    #[error("bad signature")]
    BadSignature,
}

impl HopRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::WrongReplica => "wrong_replica",
            Self::Stale => "stale",
            Self::Replayed => "replayed",
            Self::BadSignature => "bad_signature",
        }
    }
}

fn mac(key: &[u8; 32]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length")
}

/// The canonical text the signature covers.
fn canonical(claims: &HopClaims, headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let mut lines: Vec<String> = headers
        .iter()
        .filter(|(name, _)| {
            !HOP_HEADERS.contains(&name.as_str()) && !UNSIGNED.contains(&name.as_str())
        })
        .map(|(name, value)| format!("{}:{}", name.as_str(), hex::encode(value.as_bytes())))
        .collect();
    lines.sort();
    let mut text = format!(
        "lifeguard-hop-v1\n{}\n{}\n{}\n{}\n",
        claims.from, claims.to, claims.time_ms, claims.nonce
    );
    for line in lines {
        text.push_str(&line);
        text.push('\n');
    }
    text.push_str(&hex::encode(Sha256::digest(body)));
    text.into_bytes()
}

/// The signature for a request, hex.
pub fn sign(key: &[u8; 32], claims: &HopClaims, headers: &HeaderMap, body: &[u8]) -> String {
    let mut mac = mac(key);
    mac.update(&canonical(claims, headers, body));
    hex::encode(mac.finalize().into_bytes())
}

/// Reads the hop's claims and signature from `headers`.
pub fn read(headers: &HeaderMap) -> Result<(HopClaims, Vec<u8>), HopRefusal> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or(HopRefusal::Malformed)
    };
    let claims = HopClaims {
        from: text(FROM)?.to_owned(),
        to: text(TO)?.to_owned(),
        time_ms: text(TIME)?.parse().map_err(|_| HopRefusal::Malformed)?,
        nonce: text(NONCE)?.to_owned(),
    };
    if claims.nonce.len() != 32 || !claims.nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HopRefusal::Malformed);
    }
    let signature = hex::decode(text(SIGNATURE)?).map_err(|_| HopRefusal::Malformed)?;
    Ok((claims, signature))
}

/// Checks a received request's claims (not the nonce: the caller's memory does that) and
/// signature. `me` is the receiving replica, `now_ms` its clock.
pub fn verify(
    key: &[u8; 32],
    me: &str,
    now_ms: i64,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<HopClaims, HopRefusal> {
    let (claims, signature) = read(headers)?;
    if claims.to != me {
        return Err(HopRefusal::WrongReplica);
    }
    if (now_ms - claims.time_ms).abs() > MAX_SKEW_MS {
        return Err(HopRefusal::Stale);
    }
    let mut mac = mac(key);
    mac.update(&canonical(&claims, headers, body));
    mac.verify_slice(&signature)
        .map_err(|_| HopRefusal::BadSignature)?;
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const KEY: [u8; 32] = [7; 32];

    fn signed(claims: &HopClaims, headers: &HeaderMap, body: &[u8]) -> HeaderMap {
        let mut out = headers.clone();
        let set = |h: &mut HeaderMap, n: &'static str, v: String| {
            h.insert(n, HeaderValue::from_str(&v).unwrap());
        };
        set(&mut out, FROM, claims.from.clone());
        set(&mut out, TO, claims.to.clone());
        set(&mut out, TIME, claims.time_ms.to_string());
        set(&mut out, NONCE, claims.nonce.clone());
        set(&mut out, SIGNATURE, sign(&KEY, claims, headers, body));
        out
    }

    fn claims() -> HopClaims {
        HopClaims {
            from: "pod-b".into(),
            to: "pod-a".into(),
            time_ms: 1_000_000,
            nonce: "0123456789abcdef0123456789abcdef".into(),
        }
    }

    fn client_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        h.insert("mcp-method", HeaderValue::from_static("tasks/get"));
        h.append("x-multi", HeaderValue::from_static("1"));
        h.append("x-multi", HeaderValue::from_static("2"));
        h
    }

    #[test]
    fn a_signed_request_verifies() {
        let headers = signed(&claims(), &client_headers(), b"{}");
        assert_eq!(
            verify(&KEY, "pod-a", 1_000_000 + MAX_SKEW_MS, &headers, b"{}"),
            Ok(claims())
        );
    }

    #[test]
    fn anything_changed_is_refused() {
        let headers = signed(&claims(), &client_headers(), b"{}");
        let at = 1_000_000;
        assert_eq!(
            verify(&KEY, "pod-a", at, &headers, b"{ }"),
            Err(HopRefusal::BadSignature),
            "body"
        );
        assert_eq!(
            verify(&[8; 32], "pod-a", at, &headers, b"{}"),
            Err(HopRefusal::BadSignature),
            "key"
        );
        assert_eq!(
            verify(&KEY, "pod-c", at, &headers, b"{}"),
            Err(HopRefusal::WrongReplica)
        );
        assert_eq!(
            verify(&KEY, "pod-a", at + MAX_SKEW_MS + 1, &headers, b"{}"),
            Err(HopRefusal::Stale)
        );
        assert_eq!(
            verify(&KEY, "pod-a", at - MAX_SKEW_MS - 1, &headers, b"{}"),
            Err(HopRefusal::Stale)
        );
        for (name, value) in [
            ("authorization", "Bearer other"),
            ("mcp-method", "tasks/cancel"),
            ("x-added", "1"),
            (FROM, "pod-x"),
            (TIME, "1000001"),
            (NONCE, "ffffffffffffffffffffffffffffffff"),
        ] {
            let mut changed = headers.clone();
            changed.insert(
                http::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
            assert_eq!(
                verify(&KEY, "pod-a", at, &changed, b"{}"),
                Err(HopRefusal::BadSignature),
                "{name}"
            );
        }
        // What the transport adds or changes is not signed.
        let mut transported = headers.clone();
        transported.insert("host", HeaderValue::from_static("10.0.0.7:15021"));
        transported.insert("content-length", HeaderValue::from_static("2"));
        assert!(verify(&KEY, "pod-a", at, &transported, b"{}").is_ok());
        let mut dropped = headers.clone();
        dropped.remove("mcp-method");
        assert_eq!(
            verify(&KEY, "pod-a", at, &dropped, b"{}"),
            Err(HopRefusal::BadSignature)
        );
    }

    #[test]
    fn missing_or_malformed_hop_headers_are_refused() {
        assert_eq!(
            verify(&KEY, "pod-a", 0, &client_headers(), b""),
            Err(HopRefusal::Malformed)
        );
        let mut short_nonce = signed(&claims(), &client_headers(), b"");
        short_nonce.insert(NONCE, HeaderValue::from_static("abc"));
        assert_eq!(
            verify(&KEY, "pod-a", 1_000_000, &short_nonce, b""),
            Err(HopRefusal::Malformed)
        );
        let mut bad_sig = signed(&claims(), &client_headers(), b"");
        bad_sig.insert(SIGNATURE, HeaderValue::from_static("zz"));
        assert_eq!(
            verify(&KEY, "pod-a", 1_000_000, &bad_sig, b""),
            Err(HopRefusal::Malformed)
        );
    }
}
