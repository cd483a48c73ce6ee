use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde_json::json;

use super::*;
use crate::operator::ssf::test_receiver::{config, receiver};
use crate::operator::ssf::test_support::{AUD, ED_KEY, ISS, NOW, claims, sign, sign_with, with};

#[tokio::test]
async fn accepts_once_then_answers_duplicates_without_the_sink() {
    let (receiver, sink, _) = receiver(&config("push", ""));
    let token = sign(&claims());
    let accepted = Outcome::Accepted {
        jti: "jti-1".into(),
    };
    assert_eq!(receiver.receive(&token, Via::Push).await, accepted);
    assert_eq!(sink.jtis(), ["jti-1"]);
    let (_, actions) = sink.calls.lock().unwrap()[0].clone();
    assert!(matches!(&actions[..], [RevocationAction::Create(_)]));
    assert_eq!(
        receiver.receive(&token, Via::Push).await,
        Outcome::Duplicate {
            jti: "jti-1".into()
        }
    );
    assert_eq!(sink.jtis(), ["jti-1"]);
    assert_eq!(receiver.metrics().get("push", "accepted", "none"), 1);
    assert_eq!(receiver.metrics().get("push", "duplicate", "none"), 1);
}

#[tokio::test]
async fn a_sink_failure_defers_and_a_redelivery_then_succeeds() {
    let (receiver, sink, _) = receiver(&config("push", ""));
    let token = sign(&claims());
    sink.fail(true);
    assert!(matches!(
        receiver.receive(&token, Via::Push).await,
        Outcome::Deferred(Deferral::Sink(_))
    ));
    sink.fail(false);
    assert_eq!(
        receiver.receive(&token, Via::Push).await,
        Outcome::Accepted {
            jti: "jti-1".into()
        }
    );
    assert_eq!(receiver.metrics().get("push", "deferred", "sink_failed"), 1);
}

#[tokio::test]
async fn verification_events_reach_the_sink_without_actions() {
    let (receiver, sink, _) = receiver(&config("push", ""));
    let verification = with(
        claims(),
        "events",
        json!({"https://schemas.openid.net/secevent/ssf/event-type/verification": {"state": "s"}}),
    );
    let outcome = receiver.receive(&sign(&verification), Via::Push).await;
    assert_eq!(
        outcome,
        Outcome::Accepted {
            jti: "jti-1".into()
        }
    );
    assert!(sink.calls.lock().unwrap()[0].1.is_empty());
}

#[tokio::test]
async fn sets_must_arrive_the_way_their_transmitter_is_configured() {
    let token = sign(&claims());
    let (polling, sink, _) = receiver(&config("poll", "https://idp.test/poll"));
    let pushed = polling.receive(&token, Via::Push).await;
    assert_eq!(
        pushed,
        Outcome::Refused(SetError::WrongDelivery(ISS.into()))
    );
    assert_eq!(pushed.labels(), ("refused", "invalid_issuer"));
    let relayed = polling
        .receive(&token, Via::Poll("https://other.test"))
        .await;
    assert_eq!(relayed.labels(), ("refused", "invalid_issuer"));
    assert!(sink.jtis().is_empty());
}

#[tokio::test]
async fn refusals_are_counted_by_code() {
    let (receiver, sink, _) = receiver(&config("push", ""));
    let stale = sign(&with(claims(), "iat", json!(NOW - 7200)));
    assert_eq!(
        receiver.receive(&stale, Via::Push).await,
        Outcome::Refused(SetError::TooOld)
    );
    assert_eq!(
        receiver.metrics().get("push", "refused", "invalid_request"),
        1
    );
    assert!(sink.jtis().is_empty());
}

/// A JWKS endpoint serving `keys`, counting fetches.
struct JwksServer {
    keys: std::sync::Mutex<&'static [u8]>,
    fetches: AtomicUsize,
}

async fn serve_jwks(State(server): State<Arc<JwksServer>>) -> Vec<u8> {
    server.fetches.fetch_add(1, Ordering::SeqCst);
    server.keys.lock().unwrap().to_vec()
}

#[tokio::test]
async fn refetches_keys_for_an_unknown_kid_at_most_once_per_interval() {
    let server = Arc::new(JwksServer {
        keys: std::sync::Mutex::new(include_bytes!(
            "../../../tests/fixtures/keys/issuer-b-jwks.json"
        )),
        fetches: AtomicUsize::new(0),
    });
    let app = Router::new()
        .route("/jwks", get(serve_jwks))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let config: SecurityEventsConfig = serde_json::from_value(json!({
        "audience": AUD,
        "transmitters": [{"issuer": ISS, "jwksUri": format!("http://{address}/jwks"), "delivery": "push"}]
    }))
    .unwrap();
    let (receiver, sink, _) = crate::operator::ssf::test_receiver::receiver(&config);
    receiver.refresh_keys().await;
    assert_eq!(server.fetches.load(Ordering::SeqCst), 1);

    // The transmitter rotates in the key the SET is signed with.
    *server.keys.lock().unwrap() = include_bytes!("../../../tests/fixtures/keys/issuer-jwks.json");
    let token = sign(&claims());
    assert_eq!(
        receiver.receive(&token, Via::Push).await,
        Outcome::Accepted {
            jti: "jti-1".into()
        }
    );
    assert_eq!(server.fetches.load(Ordering::SeqCst), 2);

    // Another unknown kid right after: refused without another fetch.
    let unknown = sign_with(
        &with(claims(), "jti", json!("jti-2")),
        jsonwebtoken::Algorithm::EdDSA,
        ED_KEY,
        Some("next"),
        "secevent+jwt",
    );
    let outcome = receiver.receive(&unknown, Via::Push).await;
    assert_eq!(
        outcome,
        Outcome::Refused(SetError::UnknownKey(Some("next".into())))
    );
    assert_eq!(outcome.labels(), ("refused", "invalid_key"));
    assert_eq!(server.fetches.load(Ordering::SeqCst), 2);
    assert_eq!(sink.jtis(), ["jti-1"]);
}

#[tokio::test]
async fn unreachable_keys_defer_instead_of_refusing() {
    let config: SecurityEventsConfig = serde_json::from_value(json!({
        "audience": AUD,
        "transmitters": [{"issuer": ISS, "jwksUri": "http://127.0.0.1:9/jwks", "delivery": "push"}]
    }))
    .unwrap();
    let (receiver, _, _) = crate::operator::ssf::test_receiver::receiver(&config);
    let outcome = receiver.receive(&sign(&claims()), Via::Push).await;
    assert_eq!(outcome, Outcome::Deferred(Deferral::KeysUnavailable));
}

#[tokio::test]
async fn a_jti_reused_for_another_subject_is_refused_and_the_first_event_stays() {
    let (receiver, sink, _) = receiver(&config("push", ""));
    assert!(matches!(
        receiver.receive(&sign(&claims()), Via::Push).await,
        Outcome::Accepted { .. }
    ));
    let bob = json!({"format": "iss_sub", "iss": ISS, "sub": "bob"});
    let outcome = receiver
        .receive(&sign(&with(claims(), "sub_id", bob)), Via::Push)
        .await;
    assert_eq!(
        outcome,
        Outcome::Refused(SetError::JtiReused("jti-1".into()))
    );
    assert_eq!(outcome.labels(), ("refused", "invalid_request"));
    assert_eq!(sink.jtis(), ["jti-1"]);
    // Signed anew (another iat), the same event is still a redelivery.
    let resigned = with(claims(), "iat", json!(NOW - 5));
    assert!(matches!(
        receiver.receive(&sign(&resigned), Via::Push).await,
        Outcome::Duplicate { .. }
    ));
}

#[tokio::test]
async fn account_enabled_lifts_only_with_lift_revocations() {
    let enabled = with(
        claims(),
        "events",
        json!({"https://schemas.openid.net/secevent/risc/event-type/account-enabled": {}}),
    );
    let (receiver, sink, _) = receiver(&config("push", ""));
    assert!(matches!(
        receiver.receive(&sign(&enabled), Via::Push).await,
        Outcome::Accepted { .. }
    ));
    assert!(
        sink.calls.lock().unwrap()[0].1.is_empty(),
        "no lift by default"
    );

    let mut lifting = config("push", "");
    lifting.transmitters[0].lift_revocations = true;
    let (receiver, sink, _) = super::super::test_receiver::receiver(&lifting);
    receiver.receive(&sign(&enabled), Via::Push).await;
    let (_, actions) = sink.calls.lock().unwrap()[0].clone();
    assert!(matches!(
        &actions[..],
        [RevocationAction::RemoveAccountDisabled { transmitter, .. }] if transmitter == ISS
    ));
}

#[tokio::test]
async fn creating_revocations_beyond_the_burst_is_deferred_not_dropped() {
    let mut limited = config("push", "");
    limited.transmitters[0].revocation_burst = Some(2);
    limited.transmitters[0].revocations_per_minute = Some(1);
    let (receiver, sink, _) = receiver(&limited);
    let set = |jti: &str| sign(&with(claims(), "jti", json!(jti)));
    for jti in ["a", "b"] {
        assert!(matches!(
            receiver.receive(&set(jti), Via::Push).await,
            Outcome::Accepted { .. }
        ));
    }
    let third = receiver.receive(&set("c"), Via::Push).await;
    assert!(
        matches!(third, Outcome::Deferred(Deferral::RateLimited(_))),
        "{third:?}"
    );
    assert_eq!(third.labels(), ("deferred", "rate_limited"));
    // A redelivery of an accepted SET and a SET that creates nothing cost no token.
    assert!(matches!(
        receiver.receive(&set("a"), Via::Push).await,
        Outcome::Duplicate { .. }
    ));
    let verification = with(
        with(claims(), "jti", json!("v")),
        "events",
        json!({"https://schemas.openid.net/secevent/ssf/event-type/verification": {}}),
    );
    assert!(matches!(
        receiver.receive(&sign(&verification), Via::Push).await,
        Outcome::Accepted { .. }
    ));
    assert_eq!(sink.jtis(), ["a", "b", "v"]);
}
