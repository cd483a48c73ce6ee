//! `KubeRevocationSink::apply`: a security event becomes a POST of a PrincipalRevocation
//! (a redelivery's AlreadyExists is success), and `account-enabled` lists the revocations and
//! deletes only the matching `accountDisabled` ones the receiver created.

use serde_json::{Value, json};

use crate::api::PrincipalRevocation;
use crate::operator::revocation_sink::KubeRevocationSink;
use crate::operator::ssf::{RevocationAction, RevocationSink, SubjectId, VerifiedSet};

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
    let (client, server) = mock_client();
    let served = server.serve(script);
    let sink = KubeRevocationSink { client };
    let result = sink.apply(&set(), &actions).await;
    drop(sink);
    served.verify().await;
    result.map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_revocation_is_created_as_sent() {
    let script = vec![Exchange::post(format!("{COLLECTION}?"), created_json()).created()];
    assert_eq!(apply(vec![create()], script).await, Ok(()));
}

#[tokio::test]
async fn a_redelivered_event_finds_its_revocation_and_succeeds() {
    let script = vec![Exchange::post(format!("{COLLECTION}?"), created_json()).already_exists()];
    assert_eq!(apply(vec![create()], script).await, Ok(()));
}

#[tokio::test]
async fn a_refused_create_is_an_error_so_the_event_is_not_acknowledged() {
    let script =
        vec![Exchange::post(format!("{COLLECTION}?"), created_json()).fail(403, "Forbidden")];
    assert!(apply(vec![create()], script).await.is_err());
}

/// A stored revocation of `subject` at [`ISSUER`].
fn stored(
    name: &str,
    subject: &str,
    reason: &str,
    revoked_before: &str,
    source: Option<&str>,
) -> Value {
    let mut metadata = json!({"name": name, "uid": format!("uid-{name}"), "resourceVersion": "3"});
    if let Some(value) = source {
        metadata["labels"] = json!({"lifeguard.dev/source": value});
    }
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
        "metadata": metadata,
        "spec": {
            "issuer": ISSUER, "subject": subject, "revokedBefore": revoked_before,
            "reason": reason, "source": {"kind": "manual"}
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
    }
}

#[tokio::test]
async fn account_enabled_deletes_only_the_receivers_older_account_disabled_revocations() {
    let list = json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocationList",
        "metadata": {"resourceVersion": "9"},
        "items": [
            stored("sse-disabled", "alice", "accountDisabled", "2026-12-01T00:00:00Z", Some("security-event")),
            // Same instant as the enabling event: lifted too.
            stored("sse-disabled-at-enable", "alice", "accountDisabled", "2026-12-03T00:00:00Z", Some("security-event")),
            // A person's block stays.
            stored("manual-disabled", "alice", "accountDisabled", "2026-12-01T00:00:00Z", None),
            stored("labelled-manual", "alice", "accountDisabled", "2026-12-01T00:00:00Z", Some("manual")),
            // A newer disable stays.
            stored("sse-newer", "alice", "accountDisabled", "2026-12-04T00:00:00Z", Some("security-event")),
            // Another principal, another reason: stay.
            stored("sse-bob", "bob", "accountDisabled", "2026-12-01T00:00:00Z", Some("security-event")),
            stored("sse-session", "alice", "sessionRevoked", "2026-12-01T00:00:00Z", Some("security-event")),
        ]
    });
    let script = vec![
        Exchange::get(format!("{COLLECTION}?")).ok(list),
        Exchange::delete(format!("{COLLECTION}/sse-disabled?")).ok(stored(
            "sse-disabled",
            "alice",
            "accountDisabled",
            "2026-12-01T00:00:00Z",
            Some("security-event"),
        )),
        // Deleted meanwhile by someone else: fine.
        Exchange::delete(format!("{COLLECTION}/sse-disabled-at-enable?")).not_found(),
    ];
    assert_eq!(apply(vec![enable()], script).await, Ok(()));
}

#[tokio::test]
async fn a_failed_list_is_an_error() {
    let script = vec![Exchange::get(format!("{COLLECTION}?")).server_error()];
    assert!(apply(vec![enable()], script).await.is_err());
}
