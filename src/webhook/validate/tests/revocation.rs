use jiff::ToSpan;
use serde_json::json;

use super::fixtures::*;
use crate::api::PrincipalRevocation;
use crate::webhook::validate::validate_revocation;

const NOW: &str = "2026-12-01T10:00:00Z";

fn cut_off(offset: jiff::Span) -> String {
    (at(NOW) + offset).to_string()
}

#[test]
fn a_cut_off_now_or_shortly_before_is_admitted_cleanly() {
    for offset in [0.seconds(), (-1).hours(), (-24).hours(), 5.minutes()] {
        let r = revocation(&cut_off(offset), "sessionRevoked");
        assert_clean(&validate_revocation(&r, None, at(NOW)));
    }
}

#[test]
fn a_cut_off_more_than_five_minutes_ahead_is_denied() {
    let r = revocation(&cut_off(5.minutes().seconds(1)), "sessionRevoked");
    let v = validate_revocation(&r, None, at(NOW));
    assert_denied(
        &v,
        "revoked_before_in_future",
        &[
            "spec.revokedBefore:",
            "more than 5 minutes ahead",
            "tokens not issued yet",
        ],
    );
    // Whatever the reason: a future cut-off is a mistyped date.
    let r = revocation("2027-12-01T10:00:00Z", "accountDisabled");
    assert_denied(
        &validate_revocation(&r, None, at(NOW)),
        "revoked_before_in_future",
        &[],
    );
}

#[test]
fn an_update_is_judged_only_on_the_cut_off_it_changes() {
    // Stored before the webhook existed, with a future cut-off: a label edit passes.
    let old = revocation("2027-01-01T00:00:00Z", "sessionRevoked");
    let mut relabelled = old.clone();
    relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_clean(&validate_revocation(&relabelled, Some(&old), at(NOW)));
    // Moving the cut-off later, into the future, is denied.
    let mut later = old.clone();
    later.spec.revoked_before.0 = at("2027-02-01T00:00:00Z");
    assert_denied(
        &validate_revocation(&later, Some(&old), at(NOW)),
        "revoked_before_in_future",
        &[],
    );
}

#[test]
fn a_cut_off_older_than_any_token_warns_unless_every_token_is_refused() {
    let stale = cut_off((-24).hours().seconds(-1));
    assert_warned(
        &validate_revocation(&revocation(&stale, "credentialCompromise"), None, at(NOW)),
        "revoked_before_stale",
        &["spec.revokedBefore:", "more than 24h ago"],
    );
    for reason in ["accountDisabled", "accountPurged"] {
        assert_clean(&validate_revocation(
            &revocation(&stale, reason),
            None,
            at(NOW),
        ));
    }
}

#[test]
fn an_expiry_already_passed_warns() {
    let mut r = revocation(&cut_off((-2).hours()), "sessionRevoked");
    r.spec.expires_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        at(NOW) - 1.hours(),
    ));
    assert_warned(
        &validate_revocation(&r, None, at(NOW)),
        "already_expired",
        &["spec.expiresAt:", "revokes nothing"],
    );
    // Unchanged by an update: no news.
    let mut relabelled = r.clone();
    relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_clean(&validate_revocation(&relabelled, Some(&r), at(NOW)));
}

#[test]
fn whitespace_around_an_identity_field_warns() {
    let mut r = revocation(NOW, "sessionRevoked");
    r.spec.subject = Some("alice ".into());
    r.spec.client = Some(" console".into());
    let v = validate_revocation(&r, None, at(NOW));
    assert_warned(
        &v,
        "whitespace",
        &[
            "spec.subject: has leading or trailing whitespace",
            "spec.client",
        ],
    );
}

#[test]
fn compiler_errors_deny() {
    let mut value = revocation_json(NOW, "sessionRevoked");
    value["spec"]["source"] = json!({"kind": "securityEvent", "issuer": "https://idp.example.com"});
    let r: PrincipalRevocation = serde_json::from_value(value).unwrap();
    assert_denied(
        &validate_revocation(&r, None, at(NOW)),
        "invalid_spec",
        &["spec.source:"],
    );
    let mut r = revocation(NOW, "sessionRevoked");
    r.spec.subject = Some("   ".into());
    assert_denied(
        &validate_revocation(&r, None, at(NOW)),
        "invalid_spec",
        &["spec.subject: must not be empty when set"],
    );
    let mut nobody = revocation(NOW, "sessionRevoked");
    nobody.spec.subject = None;
    assert_denied(
        &validate_revocation(&nobody, None, at(NOW)),
        "invalid_spec",
        &["spec: name at least one of subject, tenant and client"],
    );
}

#[test]
fn a_whole_tenant_or_client_application_may_be_revoked() {
    let mut tenant = revocation(NOW, "adminAction");
    tenant.spec.subject = None;
    tenant.spec.tenant = Some("tenant-a".into());
    assert_clean(&validate_revocation(&tenant, None, at(NOW)));
    let mut client = revocation(NOW, "adminAction");
    client.spec.subject = None;
    client.spec.client = Some("console".into());
    assert_clean(&validate_revocation(&client, None, at(NOW)));
}
