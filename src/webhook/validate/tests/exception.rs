use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jiff::ToSpan;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::fixtures::*;
use crate::api::{CapabilityException, McpServerPolicy};
use crate::exception::ApproverKeys;
use crate::webhook::validate::{Verdict, validate_exception};

fn policies() -> Vec<Arc<McpServerPolicy>> {
    vec![policy(
        "reports",
        json!({"matchLabels": {"app": "reports"}}),
    )]
}

fn check(e: &CapabilityException, keys: &ApproverKeys) -> Verdict {
    validate_exception(e, None, NS, keys, &policies(), at(DURING))
}

#[test]
fn a_genuine_active_exception_for_an_existing_policy_is_admitted_cleanly() {
    assert_clean(&check(&signed(exception()), &keys()));
}

#[test]
fn without_usable_approver_keys_every_exception_is_denied() {
    let e = signed(exception());
    assert_denied(
        &check(&e, &ApproverKeys::Missing),
        "no_approver_keys",
        &["spec.signature", "no approver keys", "fail closed"],
    );
    assert_denied(
        &check(&e, &ApproverKeys::Unusable("not a JWKS".into())),
        "no_approver_keys",
        &["unusable (not a JWKS)", "fail closed"],
    );
}

#[test]
fn a_malformed_signature_is_bad_structure() {
    let v = check(&exception(), &keys());
    assert_denied(&v, "bad_structure", &["spec.signature: structure:"]);
    assert_eq!(
        v.message
            .as_deref()
            .map(|m| m.matches("spec.signature").count()),
        Some(1),
        "the compiler's own signature-shape error is not repeated: {v:?}"
    );
}

#[test]
fn a_forged_or_edited_grant_is_bad_signature() {
    let forged = signed_with(exception(), OTHER_KEY, APPROVER_KID, NS);
    assert_denied(
        &check(&forged, &keys()),
        "bad_signature",
        &["spec.signature: signature: does not verify"],
    );
    let mut raised = signed(exception());
    raised.spec.limits.max_tokens = 100_000;
    assert_denied(
        &check(&raised, &keys()),
        "bad_signature",
        &["does not verify"],
    );
}

#[test]
fn an_unknown_or_revoked_key_and_a_revoked_approval_are_denied() {
    let unknown = signed_with(exception(), APPROVER_KEY, "nobody", NS);
    assert_denied(
        &check(&unknown, &keys()),
        "unknown_key",
        &["spec.signature: approver key: kid `nobody` is not a trusted approver key"],
    );
    let e = signed(exception());
    assert_denied(
        &check(&e, &keys_with(json!({"revokedKeys": ["test-ed-1"]}))),
        "revoked_key",
        &["key `test-ed-1` has been revoked"],
    );
    assert_denied(
        &check(&e, &keys_with(json!({"revokedApprovals": ["CHG-1"]}))),
        "revoked_approval",
        &["approval `CHG-1` has been revoked"],
    );
}

#[test]
fn an_approval_for_another_namespace_or_policy_is_a_binding_mismatch() {
    let copied = signed_with(exception(), APPROVER_KEY, APPROVER_KID, "team-b");
    assert_denied(
        &check(&copied, &keys()),
        "binding_mismatch",
        &[
            "spec.signature: binding:",
            "namespace `team-b`",
            "namespace `team-a`",
        ],
    );
    let mut retargeted = signed(exception());
    retargeted.spec.policy_ref.name = "billing".into();
    let policies = vec![policy(
        "billing",
        json!({"matchLabels": {"app": "billing"}}),
    )];
    assert_denied(
        &validate_exception(&retargeted, None, NS, &keys(), &policies, at(DURING)),
        "binding_mismatch",
        &["approved for policy `reports`"],
    );
    // A header rewritten to claim the new binding no longer verifies.
    let (_, sig) = retargeted.spec.signature.split_once("..").unwrap();
    let header = json!({"alg": "EdDSA", "kid": APPROVER_KID,
        "typ": "lifeguard-exception+jws", "lifeguard.dev/binding": "team-a/billing"});
    retargeted.spec.signature = format!(
        "{}..{sig}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).unwrap())
    );
    assert_denied(
        &validate_exception(&retargeted, None, NS, &keys(), &policies, at(DURING)),
        "bad_signature",
        &[],
    );
}

#[test]
fn a_missing_policy_is_a_warning() {
    let e = signed(exception());
    let v = validate_exception(&e, None, NS, &keys(), &[], at(DURING));
    assert_warned(
        &v,
        "policy_missing",
        &["spec.policyRef.name: no McpServerPolicy `reports` in namespace `team-a`"],
    );
    // Another policy in the namespace does not count.
    let other = vec![policy(
        "billing",
        json!({"matchLabels": {"app": "billing"}}),
    )];
    let v = validate_exception(&e, None, NS, &keys(), &other, at(DURING));
    assert_eq!(v.reason, "policy_missing");
}

#[test]
fn outside_its_window_an_exception_is_admitted_with_a_warning() {
    let e = signed(exception());
    let before = validate_exception(
        &e,
        None,
        NS,
        &keys(),
        &policies(),
        at("2026-11-30T00:00:00Z"),
    );
    assert_warned(
        &before,
        "not_yet_valid",
        &["spec.notBefore: the exception is not valid before 2026-12-01T00:00:00Z"],
    );
    // `expiresAt` is exclusive, as in the operator and the sidecar.
    let after = validate_exception(
        &e,
        None,
        NS,
        &keys(),
        &policies(),
        at("2026-12-15T00:00:00Z"),
    );
    assert_warned(
        &after,
        "expired",
        &["spec.expiresAt: the exception expired at"],
    );
}

#[test]
fn a_validity_over_90_days_is_a_warning() {
    let with_window = |days: i64, extra_seconds: i64| {
        let mut e = exception();
        e.spec.expires_at = Time(e.spec.not_before.0 + (days * 24).hours().seconds(extra_seconds));
        signed(e)
    };
    assert_clean(&check(&with_window(90, 0), &keys()));
    assert_warned(
        &check(&with_window(90, 1), &keys()),
        "long_validity",
        &["spec.expiresAt:", "more than 90 days"],
    );
}

#[test]
fn compiler_errors_deny_and_every_failed_check_is_listed() {
    let mut e = exception();
    e.spec.clients = vec!["console".into(), "console".into()];
    let genuine = signed(e.clone());
    assert_denied(&check(&genuine, &keys()), "invalid_spec", &["spec.clients"]);
    let forged = signed_with(e, OTHER_KEY, APPROVER_KID, NS);
    let v = check(&forged, &keys());
    assert_denied(&v, "bad_signature", &["does not verify", "; spec.clients"]);
}

#[test]
fn an_update_that_leaves_the_spec_alone_is_not_denied_for_what_it_did_not_introduce() {
    let e = signed(exception());
    let revoked = keys_with(json!({"revokedKeys": ["test-ed-1"]}));
    // A label edit (or finalizer removal) on an exception whose key was revoked since.
    let mut relabelled = e.clone();
    relabelled.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
    let v = validate_exception(&relabelled, Some(&e), NS, &revoked, &policies(), at(DURING));
    assert_warned(
        &v,
        "revoked_key",
        &["has been revoked", "(unchanged by this update)"],
    );
    let v = validate_exception(
        &relabelled,
        Some(&e),
        NS,
        &ApproverKeys::Missing,
        &policies(),
        at(DURING),
    );
    assert_warned(&v, "no_approver_keys", &["(unchanged by this update)"]);
    // Changing the spec is judged in full.
    let mut edited = e.clone();
    edited.spec.purpose = "more summaries".into();
    assert_denied(
        &validate_exception(&edited, Some(&e), NS, &keys(), &policies(), at(DURING)),
        "bad_signature",
        &[],
    );
}
