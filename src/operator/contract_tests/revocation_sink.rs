//! `KubeRevocationSink::apply`: a security event becomes a POST of a PrincipalRevocation
//! (a redelivery's AlreadyExists is success when the existing object records the same event,
//! a conflict when the `jti` was reused), and `account-enabled` lists the revocations and
//! deletes only the matching `accountDisabled` ones the same transmitter's events created.

use serde_json::{Value, json};

use crate::api::PrincipalRevocation;
use crate::operator::revocation_sink::KubeRevocationSink;
use crate::operator::ssf::events::object_name;
use crate::operator::ssf::{RevocationAction, RevocationSink, SinkError, SubjectId, VerifiedSet};

use super::api_server::{Exchange, mock_client};
use super::fixtures::{ISSUER, at};

const COLLECTION: &str = "/apis/lifeguard.dev/v1alpha1/principalrevocations";
const TRANSMITTER: &str = "https://transmitter.example.com";

fn set() -> VerifiedSet {
    VerifiedSet {
        issuer: TRANSMITTER.into(),
        jti: "jti-1".into(),
        iat: 1_796_083_200,
        txn: None,
        subject: SubjectId::IssSub {
            iss: ISSUER.into(),
            sub: "alice".into(),
        },
        events: vec![],
    }
}

/// A revocation as the receiver creates it.
fn created_json() -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
        "metadata": {
            "name": "ssf-0123456789abcdef0123",
            "labels": {"lifeguard.dev/source": "security-event"}
        },
        "spec": {
            "issuer": ISSUER, "subject": "alice",
            "revokedBefore": "2026-12-01T00:00:00Z",
            "reason": "sessionRevoked",
            "source": {
                "kind": "securityEvent",
                "eventType": "https://schemas.openid.net/secevent/caep/event-type/session-revoked",
                "issuer": TRANSMITTER, "jti": "jti-1"
            },
            "expiresAt": "2026-12-02T00:00:00Z"
        }
    })
}

fn create() -> RevocationAction {
    let revocation: PrincipalRevocation =
        serde_json::from_value(created_json()).unwrap_or_else(|e| panic!("{e}"));
    RevocationAction::Create(Box::new(revocation))
}

async fn apply(actions: Vec<RevocationAction>, script: Vec<Exchange>) -> Result<(), String> {
    apply_raw(actions, script).await.map_err(|e| e.to_string())
}

async fn apply_raw(actions: Vec<RevocationAction>, script: Vec<Exchange>) -> Result<(), SinkError> {
    let (client, server) = mock_client();
    let served = server.serve(script);
    let sink = KubeRevocationSink { client };
    let result = sink.apply(&set(), &actions).await;
    drop(sink);
    served.verify().await;
    result
}

#[tokio::test]
async fn a_revocation_is_created_as_sent() {
    let script = vec![Exchange::post(format!("{COLLECTION}?"), created_json()).created()];
    assert_eq!(apply(vec![create()], script).await, Ok(()));
}

const CREATED: &str = "ssf-0123456789abcdef0123";

#[tokio::test]
async fn a_redelivered_event_finds_its_revocation_and_succeeds() {
    let script = vec![
        Exchange::post(format!("{COLLECTION}?"), created_json()).already_exists(),
        Exchange::get(format!("{COLLECTION}/{CREATED}")).ok(created_json()),
    ];
    assert_eq!(apply(vec![create()], script).await, Ok(()));
}

#[tokio::test]
async fn a_reused_jti_finds_a_different_revocation_and_is_a_conflict() {
    let mut other = created_json();
    other["spec"]["subject"] = json!("bob");
    let script = vec![
        Exchange::post(format!("{COLLECTION}?"), created_json()).already_exists(),
        Exchange::get(format!("{COLLECTION}/{CREATED}")).ok(other),
    ];
    assert!(matches!(
        apply_raw(vec![create()], script).await,
        Err(SinkError::Conflict(_))
    ));
}

#[tokio::test]
async fn a_refused_create_is_an_error_so_the_event_is_not_acknowledged() {
    let script =
        vec![Exchange::post(format!("{COLLECTION}?"), created_json()).fail(403, "Forbidden")];
    assert!(apply(vec![create()], script).await.is_err());
}

/// A stored revocation of `subject` at [`ISSUER`]. With `event: Some((transmitter, jti))` its
/// source names that event; `name: None` derives the name from it as the receiver does.
fn stored(
    name: Option<&str>,
    subject: &str,
    reason: &str,
    revoked_before: &str,
    label: Option<&str>,
    event: Option<(&str, &str)>,
) -> Value {
    let name = match (name, event) {
        (Some(name), _) => name.to_owned(),
        (None, Some((transmitter, jti))) => object_name(transmitter, jti, None),
        (None, None) => panic!("a name or an event"),
    };
    let mut metadata = json!({"name": name, "uid": format!("uid-{name}"), "resourceVersion": "3"});
    if let Some(value) = label {
        metadata["labels"] = json!({"lifeguard.dev/source": value});
    }
    let source = match event {
        None => json!({"kind": "manual"}),
        Some((transmitter, jti)) => json!({
            "kind": "securityEvent", "issuer": transmitter, "jti": jti,
            "eventType": "https://schemas.openid.net/secevent/risc/event-type/account-disabled"
        }),
    };
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
        "metadata": metadata,
        "spec": {
            "issuer": ISSUER, "subject": subject, "revokedBefore": revoked_before,
            "reason": reason, "source": source
        }
    })
}

fn enable() -> RevocationAction {
    RevocationAction::RemoveAccountDisabled {
        issuer: ISSUER.into(),
        subject: "alice".into(),
        enabled_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(
            "2026-12-03T00:00:00Z",
        )),
        transmitter: TRANSMITTER.into(),
    }
}

#[tokio::test]
async fn account_enabled_deletes_only_the_same_transmitters_older_account_disabled_revocations() {
    const SSE: Option<&str> = Some("security-event");
    const OTHER: &str = "https://other-transmitter.example.com";
    let old = "2026-12-01T00:00:00Z";
    let disabled = stored(
        None,
        "alice",
        "accountDisabled",
        old,
        SSE,
        Some((TRANSMITTER, "d1")),
    );
    let list = json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocationList",
        "metadata": {"resourceVersion": "9"},
        "items": [
            disabled.clone(),
            // Same instant as the enabling event: lifted too.
            stored(None, "alice", "accountDisabled", "2026-12-03T00:00:00Z", SSE, Some((TRANSMITTER, "d2"))),
            // A person's block stays, even dressed up as this transmitter's event.
            stored(Some("manual-disabled"), "alice", "accountDisabled", old, None, None),
            stored(Some("labelled-manual"), "alice", "accountDisabled", old, Some("manual"), None),
            stored(Some("forged-source"), "alice", "accountDisabled", old, SSE, Some((TRANSMITTER, "d1"))),
            // Another transmitter's disable stays.
            stored(None, "alice", "accountDisabled", old, SSE, Some((OTHER, "d3"))),
            // A newer disable stays.
            stored(None, "alice", "accountDisabled", "2026-12-04T00:00:00Z", SSE, Some((TRANSMITTER, "d4"))),
            // Another principal, another reason: stay.
            stored(None, "bob", "accountDisabled", old, SSE, Some((TRANSMITTER, "d5"))),
            stored(None, "alice", "sessionRevoked", old, SSE, Some((TRANSMITTER, "d6"))),
        ]
    });
    let script = vec![
        Exchange::get(format!("{COLLECTION}?")).ok(list),
        Exchange::delete(format!(
            "{COLLECTION}/{}?",
            object_name(TRANSMITTER, "d1", None)
        ))
        .ok(disabled),
        // Deleted meanwhile by someone else: fine.
        Exchange::delete(format!(
            "{COLLECTION}/{}?",
            object_name(TRANSMITTER, "d2", None)
        ))
        .not_found(),
    ];
    assert_eq!(apply(vec![enable()], script).await, Ok(()));
}

#[tokio::test]
async fn a_failed_list_is_an_error() {
    let script = vec![Exchange::get(format!("{COLLECTION}?")).server_error()];
    assert!(apply(vec![enable()], script).await.is_err());
}
