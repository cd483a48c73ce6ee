use serde_json::json;

use super::*;
use crate::operator::ssf::test_support::{ISS, NOW, SESSION_REVOKED};

const TTL: Duration = Duration::from_secs(24 * 3600);

fn set(subject: Value, events: Value) -> VerifiedSet {
    VerifiedSet {
        issuer: ISS.into(),
        jti: "jti-1".into(),
        iat: NOW,
        txn: Some("txn-1".into()),
        subject: SubjectId::parse(&subject).unwrap(),
        events: events.as_object().unwrap().clone().into_iter().collect(),
    }
}

fn alice() -> Value {
    json!({"format": "iss_sub", "iss": "https://idp.users", "sub": "alice"})
}

fn one(uri: &str, event: Value) -> Vec<RevocationAction> {
    actions_for(&set(alice(), json!({ uri: event })), TTL).unwrap()
}

fn created(actions: &[RevocationAction]) -> Vec<&PrincipalRevocation> {
    actions
        .iter()
        .filter_map(|a| match a {
            RevocationAction::Create(r) => Some(r.as_ref()),
            RevocationAction::RemoveAccountDisabled { .. } => None,
        })
        .collect()
}

fn reason_of(uri: &str, event: Value) -> Option<RevocationReason> {
    let actions = one(uri, event);
    created(&actions).first().map(|r| r.spec.reason)
}

fn at(seconds: i64) -> Time {
    Time(jiff::Timestamp::from_second(seconds).unwrap())
}

#[test]
fn session_revoked_creates_a_named_labelled_expiring_revocation() {
    let actions = one(SESSION_REVOKED, json!({"event_timestamp": NOW - 60}));
    let [revocation] = created(&actions)[..] else {
        panic!("{actions:?}")
    };
    assert_eq!(
        revocation.metadata.name.as_deref(),
        Some(object_name(ISS, "jti-1", None).as_str())
    );
    assert!(
        revocation
            .metadata
            .name
            .as_deref()
            .unwrap()
            .starts_with("ssf-")
    );
    assert_eq!(revocation.metadata.name.as_deref().unwrap().len(), 24);
    assert_eq!(
        revocation
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get(SOURCE_LABEL)
            .map(String::as_str),
        Some("security-event")
    );
    let spec = &revocation.spec;
    assert_eq!(
        (spec.issuer.as_str(), spec.subject.as_deref()),
        ("https://idp.users", Some("alice"))
    );
    assert_eq!(spec.tenant, None);
    assert_eq!(spec.reason, RevocationReason::SessionRevoked);
    assert_eq!(spec.revoked_before, at(NOW - 60));
    assert_eq!(spec.expires_at, Some(at(NOW - 60 + 24 * 3600)));
    assert_eq!(
        spec.source,
        RevocationSource {
            kind: RevocationSourceKind::SecurityEvent,
            event_type: Some(SESSION_REVOKED.into()),
            issuer: Some(ISS.into()),
            jti: Some("jti-1".into()),
            txn: Some("txn-1".into()),
        }
    );
    // The same SET again maps to the same object.
    assert_eq!(
        one(SESSION_REVOKED, json!({"event_timestamp": NOW - 60})),
        actions
    );
}

#[test]
fn revoked_before_is_the_event_time_else_iat_never_later_than_iat() {
    let revoked_before = |event: Value| {
        created(&one(SESSION_REVOKED, event))[0]
            .spec
            .revoked_before
            .clone()
    };
    assert_eq!(
        revoked_before(json!({"event_timestamp": NOW - 60})),
        at(NOW - 60)
    );
    assert_eq!(revoked_before(json!({})), at(NOW));
    assert_eq!(
        revoked_before(json!({"event_timestamp": NOW + 600})),
        at(NOW)
    );
    assert!(
        actions_for(
            &set(
                alice(),
                json!({SESSION_REVOKED: {"event_timestamp": "soon"}})
            ),
            TTL
        )
        .is_err()
    );
}

#[test]
fn every_event_type_maps_to_its_reason() {
    let caep = |name: &str| format!("https://schemas.openid.net/secevent/caep/event-type/{name}");
    let risc = |name: &str| format!("https://schemas.openid.net/secevent/risc/event-type/{name}");
    let change = |change: &str, credential: &str| {
        reason_of(
            &caep("credential-change"),
            json!({"change_type": change, "credential_type": credential}),
        )
    };
    use RevocationReason::*;
    assert_eq!(change("revoke", "fido2-roaming"), Some(CredentialChange));
    assert_eq!(change("delete", "x509"), Some(CredentialChange));
    assert_eq!(change("update", "password"), Some(CredentialChange));
    assert_eq!(change("update", "pin"), None);
    assert_eq!(change("create", "password"), None);
    assert_eq!(
        reason_of(&risc("account-disabled"), json!({"reason": "hijacking"})),
        Some(AccountDisabled)
    );
    assert_eq!(
        reason_of(&risc("account-purged"), json!({})),
        Some(AccountPurged)
    );
    assert_eq!(
        reason_of(
            &risc("credential-compromise"),
            json!({"credential_type": "password"})
        ),
        Some(CredentialCompromise)
    );
    assert_eq!(
        reason_of(&risc("sessions-revoked"), json!({})),
        Some(SessionRevoked)
    );
    for uri in SUPPORTED_EVENT_TYPES {
        let event = json!({"change_type": "revoke", "credential_type": "password"});
        assert!(
            actions_for(&set(alice(), json!({ uri: event })), TTL).is_ok(),
            "{uri}"
        );
    }
}

#[test]
fn blocking_reasons_never_expire() {
    let uri = "https://schemas.openid.net/secevent/risc/event-type/account-disabled";
    assert_eq!(created(&one(uri, json!({})))[0].spec.expires_at, None);
}

#[test]
fn account_enabled_removes_older_disables() {
    let uri = "https://schemas.openid.net/secevent/risc/event-type/account-enabled";
    assert_eq!(
        one(uri, json!({"event_timestamp": NOW - 5})),
        vec![RevocationAction::RemoveAccountDisabled {
            issuer: "https://idp.users".into(),
            subject: "alice".into(),
            enabled_at: at(NOW - 5),
            transmitter: ISS.into(),
        }]
    );
}

#[test]
fn created_by_believes_the_source_only_under_the_name_derived_from_it() {
    let uri = "https://schemas.openid.net/secevent/risc/event-type/account-disabled";
    let mine = created(&one(uri, json!({})))[0].clone();
    assert_eq!(created_by(&mine), Some(ISS));
    // A second revoking event of one SET gets an indexed name: still proven.
    let mut indexed = mine.clone();
    indexed.metadata.name = Some(object_name(ISS, "jti-1", Some(3)));
    assert_eq!(created_by(&indexed), Some(ISS));
    // The source moved onto another transmitter: the name no longer matches it.
    let mut moved = mine.clone();
    moved.spec.source.issuer = Some("https://other.transmitter".into());
    assert_eq!(created_by(&moved), None);
    // A person's revocation dressed up as an event's, under its own name.
    let mut dressed = mine.clone();
    dressed.metadata.name = Some("block-alice".into());
    assert_eq!(created_by(&dressed), None);
    let mut manual = mine;
    manual.spec.source.kind = RevocationSourceKind::Manual;
    assert_eq!(created_by(&manual), None);
}

#[test]
fn same_event_compares_principal_reason_and_source_but_not_times() {
    let uri = "https://schemas.openid.net/secevent/risc/event-type/account-disabled";
    let first = created(&one(uri, json!({})))[0].clone();
    let mut resigned = first.clone();
    resigned.spec.revoked_before = at(NOW - 100);
    assert!(same_event(&first, &resigned));
    let mut other = first.clone();
    other.spec.subject = Some("bob".into());
    assert!(!same_event(&first, &other));
    let mut other = first.clone();
    other.spec.reason = RevocationReason::SessionRevoked;
    assert!(!same_event(&first, &other));
}

#[test]
fn stream_events_and_unrevoking_changes_do_nothing() {
    for uri in [
        "https://schemas.openid.net/secevent/ssf/event-type/verification",
        "https://schemas.openid.net/secevent/ssf/event-type/stream-updated",
    ] {
        // Stream-level events name the stream, not a principal.
        let stream = json!({"format": "opaque", "id": "stream-1"});
        let event = json!({"state": "abc"});
        assert_eq!(
            actions_for(&set(stream, json!({ uri: event })), TTL),
            Ok(vec![])
        );
    }
}

#[test]
fn unsupported_events_and_malformed_changes_are_refused() {
    for uri in [
        "https://schemas.openid.net/secevent/caep/event-type/token-claims-change",
        "https://schemas.openid.net/secevent/risc/event-type/identifier-recycled",
        "https://example.com/custom",
    ] {
        let error = actions_for(&set(alice(), json!({ uri: {} })), TTL).unwrap_err();
        assert_eq!(error, SetError::UnsupportedEvent(uri.into()));
        assert_eq!(error.err_code(), "invalid_request");
        assert!(error.description().contains("unsupported event"));
    }
    // One unsupported event refuses the whole SET, revoking ones included.
    let mixed = json!({SESSION_REVOKED: {}, "https://example.com/custom": {}});
    assert!(actions_for(&set(alice(), mixed), TTL).is_err());
    let change = "https://schemas.openid.net/secevent/caep/event-type/credential-change";
    for event in [json!({}), json!({"change_type": "melt"})] {
        let error = actions_for(&set(alice(), json!({ change: event })), TTL).unwrap_err();
        assert_eq!(error.err_code(), "invalid_request");
    }
}

#[test]
fn subjects_of_every_format() {
    let principal = |subject: Value| {
        let actions = actions_for(&set(subject, json!({SESSION_REVOKED: {}})), TTL).unwrap();
        let spec = created(&actions)[0].spec.clone();
        (spec.issuer, spec.subject.unwrap_or_default(), spec.tenant)
    };
    let own = |s: &str| (ISS.to_owned(), s.to_owned(), None);
    assert_eq!(
        principal(json!({"format": "email", "email": "a@example.com"})),
        own("a@example.com")
    );
    assert_eq!(
        principal(json!({"format": "opaque", "id": "u-7"})),
        own("u-7")
    );
    assert_eq!(
        principal(json!({"format": "account", "uri": "acct:a@example.com"})),
        own("acct:a@example.com")
    );
    assert_eq!(
        principal(json!({"subject_type": "email", "email": "legacy@example.com"})),
        own("legacy@example.com")
    );
    assert_eq!(
        principal(json!({"format": "complex",
            "user": {"format": "iss_sub", "iss": "https://idp.users", "sub": "alice"},
            "tenant": {"format": "opaque", "id": "tenant-a"}})),
        (
            "https://idp.users".to_owned(),
            "alice".to_owned(),
            Some("tenant-a".to_owned())
        )
    );
    let phone = json!({"format": "phone_number", "phone_number": "+12065550100"});
    let error = actions_for(&set(phone, json!({SESSION_REVOKED: {}})), TTL).unwrap_err();
    assert_eq!(error.err_code(), "invalid_request");
}

#[test]
fn several_revoking_events_get_distinct_names() {
    let events = json!({
        SESSION_REVOKED: {},
        "https://schemas.openid.net/secevent/risc/event-type/account-disabled": {},
        "https://schemas.openid.net/secevent/ssf/event-type/verification": {}
    });
    let actions = actions_for(&set(alice(), events), TTL).unwrap();
    let names: Vec<_> = created(&actions)
        .iter()
        .map(|r| r.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1]);
    assert!(!names.contains(&object_name(ISS, "jti-1", None)));
    // The name depends on issuer and jti.
    assert_ne!(
        object_name(ISS, "jti-1", None),
        object_name(ISS, "jti-2", None)
    );
    assert_ne!(
        object_name("https://a", "b", None),
        object_name("https://ab", "", None)
    );
}
