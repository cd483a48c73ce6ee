//! Objects, keys and a cluster view for the validation tests.

use std::sync::Arc;

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::api::{CapabilityException, McpServerPolicy, PrincipalRevocation};
use crate::exception::{ApproverKeys, sign};
use crate::policy::compile::namespace_of;
use crate::webhook::validate::{ClusterView, Verdict};

pub const NS: &str = "team-a";
/// The Ed25519 key behind kid `test-ed-1` of [`JWKS`].
pub const APPROVER_KEY: &[u8] =
    include_bytes!("../../../../tests/fixtures/keys/issuer-ed25519.pem");
pub const APPROVER_KID: &str = "test-ed-1";
/// A key nobody trusts.
pub const OTHER_KEY: &[u8] = include_bytes!("../../../../tests/fixtures/keys/attacker-ed25519.pem");
pub const JWKS: &[u8] = include_bytes!("../../../../tests/fixtures/keys/issuer-jwks.json");

pub fn at(t: &str) -> Timestamp {
    t.parse().unwrap_or_else(|e| panic!("{t}: {e}"))
}

/// Inside the window of [`exception`].
pub const DURING: &str = "2026-12-05T00:00:00Z";

/// The approver keys of [`JWKS`].
pub fn keys() -> ApproverKeys {
    keys_with(json!({}))
}

/// [`JWKS`] with `extra` members (`revokedKeys`, `revokedApprovals`) merged in.
pub fn keys_with(extra: Value) -> ApproverKeys {
    let mut document: Value = serde_json::from_slice(JWKS).unwrap_or_else(|e| panic!("{e}"));
    if let (Some(doc), Some(extra)) = (document.as_object_mut(), extra.as_object()) {
        doc.extend(extra.clone());
    }
    let keys = ApproverKeys::from_document(document.to_string().as_bytes());
    assert!(keys.trust().is_some(), "{keys:?}");
    keys
}

/// A policy named `name` in [`NS`] with `selector`, valid otherwise.
pub fn policy_json(name: &str, selector: Value) -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "McpServerPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": selector,
            "resource": "https://mcp.example.com/mcp",
            "identity": {"issuers": [{
                "issuer": "https://idp.example.com",
                "audiences": ["https://mcp.example.com/mcp"],
                "jwksUri": "https://idp.example.com/jwks"
            }]}
        }
    })
}

pub fn policy(name: &str, selector: Value) -> Arc<McpServerPolicy> {
    Arc::new(
        serde_json::from_value(policy_json(name, selector))
            .unwrap_or_else(|e| panic!("test policy: {e}")),
    )
}

/// An unsigned exception for policy `reports` in [`NS`], valid in December 2026.
pub fn exception_json() -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "CapabilityException",
        "metadata": {"name": "ex", "namespace": NS},
        "spec": {
            "policyRef": {"name": "reports"},
            "capability": "sampling",
            "clients": ["console"],
            "purpose": "summaries", "modelRoute": "gateway/summaries",
            "limits": {"maxTokens": 500, "maxIterationsPerTask": 2, "maxRequestsPerMinute": 10},
            "notBefore": "2026-12-01T00:00:00Z",
            "expiresAt": "2026-12-15T00:00:00Z",
            "approvalId": "CHG-1",
            "signature": "placeholder"
        }
    })
}

pub fn exception() -> CapabilityException {
    serde_json::from_value(exception_json()).unwrap_or_else(|e| panic!("test exception: {e}"))
}

/// `e` signed with `key` under `kid` for `namespace`.
pub fn signed_with(
    mut e: CapabilityException,
    key: &[u8],
    kid: &str,
    namespace: &str,
) -> CapabilityException {
    e.spec.signature = sign(&e.spec, namespace, key, kid).unwrap_or_else(|e| panic!("{e}"));
    e
}

/// `e` signed by the trusted approver for [`NS`].
pub fn signed(e: CapabilityException) -> CapabilityException {
    signed_with(e, APPROVER_KEY, APPROVER_KID, NS)
}

/// A manual `reason` revocation of alice cut off at `revoked_before`.
pub fn revocation_json(revoked_before: &str, reason: &str) -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "PrincipalRevocation",
        "metadata": {"name": "alice"},
        "spec": {
            "issuer": "https://idp.example.com",
            "subject": "alice",
            "revokedBefore": revoked_before,
            "reason": reason,
            "source": {"kind": "manual"}
        }
    })
}

pub fn revocation(revoked_before: &str, reason: &str) -> PrincipalRevocation {
    serde_json::from_value(revocation_json(revoked_before, reason))
        .unwrap_or_else(|e| panic!("test revocation: {e}"))
}

/// A cluster of fixed policies and keys.
pub struct View {
    pub policies: Vec<Arc<McpServerPolicy>>,
    pub keys: ApproverKeys,
}

impl ClusterView for View {
    fn policies_in(&self, namespace: &str) -> Vec<Arc<McpServerPolicy>> {
        self.policies
            .iter()
            .filter(|p| namespace_of(&p.metadata) == namespace)
            .cloned()
            .collect()
    }

    fn approver_keys(&self) -> ApproverKeys {
        self.keys.clone()
    }
}

/// Asserts `v` is denied with `reason` and a message containing every one of `needles`.
#[track_caller]
pub fn assert_denied(v: &Verdict, reason: &str, needles: &[&str]) {
    assert!(!v.allowed, "expected a denial ({reason}), got {v:?}");
    assert_eq!(v.reason, reason, "{v:?}");
    let message = v.message.as_deref().unwrap_or_default();
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` not in `{message}`");
    }
}

/// Asserts `v` is allowed with `reason` and a warning containing each of `needles`.
#[track_caller]
pub fn assert_warned(v: &Verdict, reason: &str, needles: &[&str]) {
    assert!(
        v.allowed,
        "expected an allowed request ({reason}), got {v:?}"
    );
    assert_eq!(v.reason, reason, "{v:?}");
    for needle in needles {
        assert!(
            v.warnings.iter().any(|w| w.contains(needle)),
            "`{needle}` not in {:?}",
            v.warnings
        );
    }
}

/// Asserts `v` is allowed with no warning.
#[track_caller]
pub fn assert_clean(v: &Verdict) {
    assert_eq!(v, &Verdict::allow("ok"), "expected a clean allowed request");
}
