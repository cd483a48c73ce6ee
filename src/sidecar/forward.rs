//! Which headers reach the protected container, and how the caller is identified to it. Pure.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::api::UpstreamIdentity;
use crate::identity::Identity;
use crate::mcp::header_value::encode_mirrored;
use crate::mcp::headers as mcp_headers;

/// Prefix of every header the sidecar sets for the container. Client-supplied headers with this
/// prefix are always removed, so the container can trust them.
pub const IDENTITY_HEADER_PREFIX: &str = "lifeguard-";
pub const ISSUER_HEADER: &str = "lifeguard-issuer";
pub const SUBJECT_HEADER: &str = "lifeguard-subject";
pub const TENANT_HEADER: &str = "lifeguard-tenant";
pub const CLIENT_HEADER: &str = "lifeguard-client";
pub const SCOPES_HEADER: &str = "lifeguard-scopes";
/// `client` for requests a client made, `sidecar` for requests the sidecar makes on its own.
pub const INITIATOR_HEADER: &str = "lifeguard-initiator";
/// The key the caller proved (`jkt:<thumbprint>` or `x5t#S256:<thumbprint>`), when its token
/// is key-bound; absent for bearer tokens.
pub const KEY_BINDING_HEADER: &str = "lifeguard-key-binding";
/// Why the sidecar made a request on its own (`deadline`, `revocation`, `admin_cancel`, …).
pub const INITIATOR_REASON_HEADER: &str = "lifeguard-initiator-reason";

/// Headers never forwarded: hop-by-hop headers (RFC 9110 §7.6.1), headers the sidecar
/// recomputes, session and resumption headers stateless MCP never honours, and cookies (MCP
/// authorization is by bearer token; ambient browser credentials must not reach the server).
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "cookie",
    mcp_headers::SESSION_ID,
    mcp_headers::LAST_EVENT_ID,
];

/// Builds the headers of a request forwarded for a client: the client's headers minus the
/// dropped ones, minus any `Lifeguard-*`, minus `Authorization` and `DPoP` (the proof is
/// recorded as used: it is no use to the server) unless the policy forwards tokens, plus the
/// identity headers.
pub fn client_request_headers(
    incoming: &HeaderMap,
    identity: &Identity,
    mode: UpstreamIdentity,
) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(incoming.len() + 6);
    // Names listed in a Connection header are hop-by-hop too.
    let connection_listed: Vec<String> = incoming
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    for (name, value) in incoming {
        // CGI/WSGI servers read `Lifeguard_Subject` as `Lifeguard-Subject`: names are compared
        // with `_` read as `-`.
        let normalized = if name.as_str().contains('_') {
            std::borrow::Cow::Owned(name.as_str().replace('_', "-"))
        } else {
            std::borrow::Cow::Borrowed(name.as_str())
        };
        let n = normalized.as_ref();
        if DROPPED.contains(&n)
            || n.starts_with(IDENTITY_HEADER_PREFIX)
            || connection_listed.iter().any(|c| c.replace('_', "-") == n)
            || ((n == "authorization" || n == "dpop") && mode != UpstreamIdentity::ForwardToken)
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    set_identity(&mut out, identity, "client", None);
    out
}

/// Headers of a request the sidecar makes on its own behalf about `identity`'s task: the MCP
/// headers are added by the caller; never a token.
pub fn sidecar_request_headers(identity: &Identity, reason: &str) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(10);
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    out.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    set_identity(&mut out, identity, "sidecar", Some(reason));
    out
}

fn set_identity(out: &mut HeaderMap, identity: &Identity, initiator: &str, reason: Option<&str>) {
    let scopes: Vec<&str> = identity.scopes.iter().map(String::as_str).collect();
    let pairs = [
        (ISSUER_HEADER, identity.owner.issuer.as_str()),
        (SUBJECT_HEADER, identity.owner.subject.as_str()),
        (TENANT_HEADER, identity.owner.tenant.as_str()),
        (CLIENT_HEADER, identity.owner.client.as_str()),
    ];
    for (name, value) in pairs {
        insert_encoded(out, name, value);
    }
    insert_encoded(out, SCOPES_HEADER, &scopes.join(" "));
    if let Some(binding) = &identity.binding {
        insert_encoded(out, KEY_BINDING_HEADER, &binding.to_stored());
    }
    insert_encoded(out, INITIATOR_HEADER, initiator);
    if let Some(reason) = reason {
        insert_encoded(out, INITIATOR_REASON_HEADER, reason);
    }
}

/// Inserts a value, base64-sentinel-encoded when it is not header-safe; empty values are sent
/// as empty headers so "no tenant" is explicit.
fn insert_encoded(out: &mut HeaderMap, name: &'static str, value: &str) {
    let encoded = if value.is_empty() {
        String::new()
    } else {
        encode_mirrored(value)
    };
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        out.insert(HeaderName::from_static(name), v);
    }
}

/// Sets the MCP mirrored headers of a request the sidecar rewrote or built.
pub fn set_mcp_headers(out: &mut HeaderMap, method: &str, name: Option<&str>) {
    if let Ok(v) = HeaderValue::from_str(crate::mcp::PROTOCOL_VERSION) {
        out.insert(HeaderName::from_static(mcp_headers::PROTOCOL_VERSION), v);
    }
    if let Ok(v) = HeaderValue::from_str(method) {
        out.insert(HeaderName::from_static(mcp_headers::METHOD), v);
    }
    match name.and_then(|n| HeaderValue::from_str(&encode_mirrored(n)).ok()) {
        Some(v) => {
            out.insert(HeaderName::from_static(mcp_headers::NAME), v);
        }
        None => {
            out.remove(mcp_headers::NAME);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::Owner;

    fn identity() -> Identity {
        Identity {
            owner: Owner {
                issuer: "https://idp".into(),
                subject: "alice".into(),
                tenant: "t1".into(),
                client: "console".into(),
            },
            scopes: BTreeSet::from(["a".to_owned(), "b".to_owned()]),
            issued_at: None,
            expires_at: 0,
            binding: None,
        }
    }

    fn incoming() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer secret"));
        h.insert("lifeguard-subject", HeaderValue::from_static("mallory"));
        h.insert("lifeguard_subject", HeaderValue::from_static("mallory"));
        h.insert("Lifeguard_Tenant", HeaderValue::from_static("other"));
        h.insert("mcp_session_id", HeaderValue::from_static("s"));
        h.insert("Lifeguard-Tenant", HeaderValue::from_static("other"));
        h.insert("mcp-session-id", HeaderValue::from_static("s"));
        h.insert("last-event-id", HeaderValue::from_static("9"));
        h.insert("cookie", HeaderValue::from_static("session=1"));
        h.insert("connection", HeaderValue::from_static("x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("mcp-method", HeaderValue::from_static("tools/call"));
        h.insert("traceparent", HeaderValue::from_static("00-abc-def-01"));
        h
    }

    #[test]
    fn client_supplied_identity_headers_never_reach_the_server() {
        let out =
            client_request_headers(&incoming(), &identity(), UpstreamIdentity::IdentityHeaders);
        assert_eq!(out.get(SUBJECT_HEADER).unwrap(), "alice");
        assert_eq!(out.get(TENANT_HEADER).unwrap(), "t1");
        assert_eq!(out.get_all(SUBJECT_HEADER).iter().count(), 1);
        assert_eq!(out.get(SCOPES_HEADER).unwrap(), "a b");
        assert_eq!(out.get(INITIATOR_HEADER).unwrap(), "client");
        assert!(
            out.get("authorization").is_none(),
            "token withheld by default"
        );
        for dropped in [
            "lifeguard_subject",
            "lifeguard_tenant",
            "mcp_session_id",
            "mcp-session-id",
            "last-event-id",
            "cookie",
            "connection",
            "x-hop",
        ] {
            assert!(out.get(dropped).is_none(), "{dropped} forwarded");
        }
        assert_eq!(out.get("mcp-method").unwrap(), "tools/call");
        assert_eq!(out.get("traceparent").unwrap(), "00-abc-def-01");
    }

    #[test]
    fn forward_token_mode_passes_the_validated_token() {
        let out = client_request_headers(&incoming(), &identity(), UpstreamIdentity::ForwardToken);
        assert_eq!(out.get("authorization").unwrap(), "Bearer secret");
        assert_eq!(out.get(SUBJECT_HEADER).unwrap(), "alice");
    }

    #[test]
    fn a_proof_is_withheld_with_the_token_and_the_proven_key_is_named() {
        let mut headers = incoming();
        headers.insert("authorization", HeaderValue::from_static("DPoP secret"));
        headers.insert("dpop", HeaderValue::from_static("proof"));
        headers.insert(
            "lifeguard-key-binding",
            HeaderValue::from_static("jkt:forged"),
        );
        let bound = Identity {
            binding: Some(crate::model::KeyBinding::Dpop { jkt: "k1".into() }),
            ..identity()
        };
        let out = client_request_headers(&headers, &bound, UpstreamIdentity::IdentityHeaders);
        assert!(out.get("authorization").is_none() && out.get("dpop").is_none());
        assert_eq!(out.get(KEY_BINDING_HEADER).unwrap(), "jkt:k1");
        let out = client_request_headers(&headers, &bound, UpstreamIdentity::ForwardToken);
        assert_eq!(out.get("authorization").unwrap(), "DPoP secret");
        assert_eq!(out.get("dpop").unwrap(), "proof");
        let out = client_request_headers(&headers, &identity(), UpstreamIdentity::IdentityHeaders);
        assert!(
            out.get(KEY_BINDING_HEADER).is_none(),
            "a bearer caller proved no key"
        );
    }

    #[test]
    fn sidecar_requests_say_so_and_carry_no_token() {
        let out = sidecar_request_headers(&identity(), "deadline");
        assert_eq!(out.get(INITIATOR_HEADER).unwrap(), "sidecar");
        assert_eq!(out.get(INITIATOR_REASON_HEADER).unwrap(), "deadline");
        assert!(out.get("authorization").is_none());
    }

    #[test]
    fn non_ascii_identity_values_are_encoded() {
        let mut id = identity();
        id.owner.subject = "zoë".into();
        let out = sidecar_request_headers(&id, "deadline");
        let raw = out.get(SUBJECT_HEADER).unwrap().as_bytes();
        assert_eq!(
            crate::mcp::header_value::decode_mirrored(raw).as_deref(),
            Some("zoë")
        );
    }
}
