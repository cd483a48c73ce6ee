use jiff::Timestamp;
use serde_json::json;

use super::gate::{CapabilityRequest, Rejection, covers};
use super::*;
use crate::api::{CapabilityException, ExceptionCapability};
use crate::model::Owner;
use crate::policy::{GrantedException, ObjectKey};

const APPROVER_KEY: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-ed25519.pem");
const OTHER_KEY: &[u8] = include_bytes!("../../tests/fixtures/keys/attacker-ed25519.pem");

fn trust() -> ApproverTrust {
    // The test issuer's JWKS doubles as an approver set: kid `test-ed-1` is the Ed25519 key.
    ApproverTrust::from_json(include_bytes!("../../tests/fixtures/keys/issuer-jwks.json")).unwrap()
}

fn exception() -> CapabilityException {
    serde_saphyr::from_str(
        r#"
apiVersion: lifeguard.dev/v1alpha1
kind: CapabilityException
metadata: {name: ex, namespace: team-a}
spec:
  policyRef: {name: reports}
  capability: sampling
  clients: [console]
  tenants: [{issuer: "https://idp", tenant: tenant-a}]
  purpose: summaries
  modelRoute: gateway/summaries
  limits: {maxTokens: 500, maxIterationsPerTask: 2, maxRequestsPerMinute: 10}
  allowedTools: [search]
  notBefore: "2026-12-01T00:00:00Z"
  expiresAt: "2026-12-15T00:00:00Z"
  approvalId: CHG-1
  signature: placeholder
"#,
    )
    .unwrap()
}

fn signed(key: &[u8], kid: &str, namespace: &str) -> CapabilityException {
    let mut e = exception();
    e.spec.signature = sign(&e.spec, namespace, key, kid).unwrap();
    e
}

fn at(t: &str) -> Timestamp {
    t.parse().unwrap()
}

const DURING: &str = "2026-12-05T00:00:00Z";

#[test]
fn a_signed_grant_verifies_and_is_active_in_its_window() {
    let e = signed(APPROVER_KEY, "test-ed-1", "team-a");
    let v = verify(&e.spec, "team-a", &trust(), at(DURING));
    assert_eq!(v.state, ExceptionState::Active, "{:?}", v.checks);
    assert_eq!(v.approver.as_deref(), Some("test-ed-1"));
    assert!(v.checks.iter().all(|c| c.result.is_ok()));
    assert_eq!(
        verify(&e.spec, "team-a", &trust(), at("2026-11-30T00:00:00Z")).state,
        ExceptionState::NotYetValid
    );
    assert_eq!(
        verify(&e.spec, "team-a", &trust(), at("2026-12-15T00:00:00Z")).state,
        ExceptionState::Expired,
        "expiresAt is exclusive"
    );
}

#[test]
fn a_genuine_approval_copied_to_another_server_is_wrong_server() {
    let e = signed(APPROVER_KEY, "test-ed-1", "team-a");
    // Copied to another namespace.
    let copied = verify(&e.spec, "team-b", &trust(), at(DURING));
    assert_eq!(copied.reason, "wrong_server");
    assert_eq!(copied.state, ExceptionState::Invalid);
    let binding = copied.checks.iter().find(|c| c.check == "binding").unwrap();
    assert!(
        binding
            .result
            .as_ref()
            .unwrap_err()
            .contains("namespace `team-a`"),
        "{binding:?}"
    );
    // Retargeted to another policy in the same namespace.
    let mut retargeted = e.clone();
    retargeted.spec.policy_ref.name = "billing".into();
    assert_eq!(
        verify(&retargeted.spec, "team-a", &trust(), at(DURING)).reason,
        "wrong_server"
    );
    // A header edited to claim the new binding no longer verifies.
    let mut relabelled = retargeted.clone();
    let (_, signature) = e.spec.signature.split_once("..").unwrap();
    let header = serde_json::json!({"alg": "EdDSA", "kid": "test-ed-1",
        "typ": "lifeguard-exception+jws", "lifeguard.dev/binding": "team-a/billing"});
    relabelled.spec.signature = format!(
        "{}..{signature}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).unwrap())
    );
    assert_eq!(
        verify(&relabelled.spec, "team-a", &trust(), at(DURING)).reason,
        "bad_signature"
    );
}

#[test]
fn any_edit_or_foreign_key_breaks_the_signature() {
    let e = signed(APPROVER_KEY, "test-ed-1", "team-a");
    // A budget raised after approval.
    let mut raised = e.clone();
    raised.spec.limits.max_tokens = 100_000;
    assert_eq!(
        verify(&raised.spec, "team-a", &trust(), at(DURING)).reason,
        "bad_signature"
    );
    // Signed by a key that merely claims a trusted kid.
    let forged = signed(OTHER_KEY, "test-ed-1", "team-a");
    assert_eq!(
        verify(&forged.spec, "team-a", &trust(), at(DURING)).reason,
        "bad_signature"
    );
    // An unknown kid.
    let unknown = signed(APPROVER_KEY, "nobody", "team-a");
    assert_eq!(
        verify(&unknown.spec, "team-a", &trust(), at(DURING)).reason,
        "unknown_key"
    );
}

#[test]
fn revoked_keys_and_approvals_invalidate() {
    let e = signed(APPROVER_KEY, "test-ed-1", "team-a");
    let mut t = trust();
    t.revoked_approvals.insert("CHG-1".into());
    assert_eq!(
        verify(&e.spec, "team-a", &t, at(DURING)).reason,
        "approval_revoked"
    );
    let mut t = trust();
    t.revoked_keys.insert("test-ed-1".into());
    assert_eq!(
        verify(&e.spec, "team-a", &t, at(DURING)).reason,
        "key_revoked"
    );
}

#[test]
fn the_payload_is_canonical_and_bound() {
    let e = exception();
    let payload = String::from_utf8(signing_payload(&e.spec, "team-a").unwrap()).unwrap();
    assert!(payload.starts_with("{\"allowedTools\":[\"search\"],\"approvalId\":\"CHG-1\""));
    assert!(payload.contains("\"namespace\":\"team-a\""));
    assert!(payload.contains("\"policy\":\"reports\""));
    assert!(!payload.contains("signature"));
    assert!(!payload.contains(' '), "no insignificant whitespace");
}

fn granted(e: &CapabilityException) -> GrantedException {
    GrantedException {
        exception: ObjectKey {
            namespace: "team-a".into(),
            name: "ex".into(),
        },
        spec: e.spec.clone(),
        not_before: e.spec.not_before.0,
        expires_at: e.spec.expires_at.0,
    }
}

fn owner(client: &str, tenant: &str) -> Owner {
    Owner {
        issuer: "https://idp".into(),
        subject: "alice".into(),
        tenant: tenant.into(),
        client: client.into(),
    }
}

fn check(
    g: &GrantedException,
    v: &Verification,
    capability: ExceptionCapability,
    owner: &Owner,
    declared: serde_json::Value,
    params: serde_json::Value,
) -> Result<(), Rejection> {
    covers(
        g,
        || v.clone(),
        &CapabilityRequest {
            capability,
            params: &params,
            owner,
            declared: &declared,
            protocol_version: "2026-07-28",
        },
    )
}

#[test]
fn the_gate_checks_client_tenant_declaration_tokens_and_tools() {
    let e = signed(APPROVER_KEY, "test-ed-1", "team-a");
    let g = granted(&e);
    let v = verify(&e.spec, "team-a", &trust(), at(DURING));
    let sampling = ExceptionCapability::Sampling;
    let console = owner("console", "tenant-a");
    let declared = || json!({"sampling": {}});
    assert_eq!(
        check(
            &g,
            &v,
            sampling,
            &console,
            declared(),
            json!({"maxTokens": 500, "tools": [{"name": "search"}]})
        ),
        Ok(())
    );
    let small = || json!({"maxTokens": 10});
    let cases = [
        (
            check(
                &g,
                &v,
                sampling,
                &owner("cli", "tenant-a"),
                declared(),
                small(),
            ),
            Rejection::WrongClient,
        ),
        (
            check(
                &g,
                &v,
                sampling,
                &owner("console", "tenant-b"),
                declared(),
                small(),
            ),
            Rejection::WrongTenant,
        ),
        (
            check(
                &g,
                &v,
                sampling,
                &Owner {
                    issuer: "https://other-idp".into(),
                    ..owner("console", "tenant-a")
                },
                declared(),
                small(),
            ),
            // The same tenant id from another issuer is another tenant.
            Rejection::WrongTenant,
        ),
        (
            check(&g, &v, sampling, &console, json!({}), small()),
            Rejection::UndeclaredCapability,
        ),
        (
            check(
                &g,
                &v,
                sampling,
                &console,
                declared(),
                json!({"maxTokens": 501}),
            ),
            Rejection::TokenBudget,
        ),
        (
            check(&g, &v, sampling, &console, declared(), json!({})),
            Rejection::TokenBudget,
        ),
        (
            check(
                &g,
                &v,
                sampling,
                &console,
                declared(),
                json!({"maxTokens": 10, "tools": [{"name": "shell"}]}),
            ),
            Rejection::ToolNotAllowed,
        ),
        (
            check(
                &g,
                &v,
                ExceptionCapability::Roots,
                &console,
                json!({"roots": {}}),
                json!({}),
            ),
            Rejection::NoException,
        ),
    ];
    for (got, expected) in cases {
        assert_eq!(got, Err(expected));
    }
    let expired = verify(&e.spec, "team-a", &trust(), at("2027-01-01T00:00:00Z"));
    assert_eq!(
        check(&g, &expired, sampling, &console, declared(), small()),
        Err(Rejection::Expired)
    );
}

#[test]
fn a_grant_key_is_the_same_for_copies_and_changes_with_the_grant() {
    let original = signed(APPROVER_KEY, "approver-1", "team-a");
    let mut copy = original.clone();
    copy.metadata.name = Some("a-copy".into());
    let key = grant_key(&original.spec, "team-a");
    assert!(key.starts_with("sha256:"), "{key}");
    assert_eq!(
        grant_key(&copy.spec, "team-a"),
        key,
        "the name is not signed"
    );
    let resigned = signed(OTHER_KEY, "approver-2", "team-a");
    assert_eq!(
        grant_key(&resigned.spec, "team-a"),
        key,
        "the grant is what was signed, not who signed it"
    );
    let mut edited = original.clone();
    edited.spec.limits.max_requests_per_minute += 1;
    assert_ne!(grant_key(&edited.spec, "team-a"), key);
    assert_ne!(
        grant_key(&original.spec, "team-b"),
        key,
        "bound to its namespace"
    );
}
