use serde_json::{Value, json};

use super::*;
use crate::operator::ssf::test_receiver::{PUSH_TOKEN, RecordingSink, config, receiver};
use crate::operator::ssf::test_support::{ATTACKER_KEY, claims, sign, sign_with, unsigned, with};

struct Endpoint {
    url: String,
    sink: Arc<RecordingSink>,
    receiver: Arc<SsfReceiver>,
    http: reqwest::Client,
}

async fn endpoint() -> Endpoint {
    let (receiver, sink, _) = receiver(&config("push", ""));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{PUSH_PATH}", listener.local_addr().unwrap());
    let app = router(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Endpoint {
        url,
        sink,
        receiver,
        http: reqwest::Client::new(),
    }
}

impl Endpoint {
    async fn post(&self, body: &str, content_type: &str, bearer: Option<&str>) -> (u16, Value) {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", content_type)
            .body(body.to_owned());
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        };
        (status, body)
    }

    async fn push(&self, token: &str) -> (u16, Value) {
        self.post(token, "application/secevent+jwt", Some(PUSH_TOKEN))
            .await
    }

    async fn err(&self, token: &str) -> String {
        let (status, body) = self.push(token).await;
        assert_eq!(status, 400, "{body}");
        assert!(body["description"].as_str().is_some_and(|d| !d.is_empty()));
        body["err"].as_str().unwrap().to_owned()
    }
}

#[tokio::test]
async fn accepts_with_202_once_recorded_and_duplicates_without_the_sink() {
    let endpoint = endpoint().await;
    let token = sign(&claims());
    assert_eq!(endpoint.push(&token).await, (202, Value::Null));
    assert_eq!(endpoint.sink.jtis(), ["jti-1"]);
    assert_eq!(
        endpoint.push(&format!("{token}\r\n")).await,
        (202, Value::Null)
    );
    assert_eq!(endpoint.sink.jtis(), ["jti-1"]);
    let metrics = endpoint.receiver.metrics();
    assert_eq!(metrics.get("push", "accepted", "none"), 1);
    assert_eq!(metrics.get("push", "duplicate", "none"), 1);
}

#[tokio::test]
async fn a_sink_failure_answers_503_so_the_transmitter_retries() {
    let endpoint = endpoint().await;
    endpoint.sink.fail(true);
    let token = sign(&claims());
    assert_eq!(endpoint.push(&token).await.0, 503);
    endpoint.sink.fail(false);
    assert_eq!(endpoint.push(&token).await.0, 202);
    assert_eq!(endpoint.sink.jtis(), ["jti-1"]);
}

#[tokio::test]
async fn bearer_problems_are_authentication_failed() {
    let endpoint = endpoint().await;
    let token = sign(&claims());
    for bearer in [None, Some("wrong-token"), Some("")] {
        let (status, body) = endpoint
            .post(&token, "application/secevent+jwt", bearer)
            .await;
        assert_eq!(status, 400, "{bearer:?}");
        assert_eq!(body["err"], "authentication_failed", "{bearer:?}");
    }
    assert!(endpoint.sink.jtis().is_empty());
    assert_eq!(
        endpoint
            .receiver
            .metrics()
            .get("push", "refused", "authentication_failed"),
        3
    );
}

#[tokio::test]
async fn every_refusal_carries_its_code() {
    let endpoint = endpoint().await;
    let forged = sign_with(
        &claims(),
        jsonwebtoken::Algorithm::EdDSA,
        ATTACKER_KEY,
        Some("test-ed-1"),
        "secevent+jwt",
    );
    assert_eq!(endpoint.err(&forged).await, "invalid_key");
    let stranger = sign(&with(claims(), "iss", json!("https://stranger.test")));
    assert_eq!(endpoint.err(&stranger).await, "invalid_issuer");
    let elsewhere = sign(&with(claims(), "aud", json!("https://elsewhere.test")));
    assert_eq!(endpoint.err(&elsewhere).await, "invalid_audience");
    let with_sub = sign(&with(claims(), "sub", json!("alice")));
    assert_eq!(endpoint.err(&with_sub).await, "invalid_request");
    let unsupported = sign(&with(
        claims(),
        "events",
        json!({"https://example.com/custom": {}}),
    ));
    assert_eq!(endpoint.err(&unsupported).await, "invalid_request");
    assert_eq!(endpoint.err("not a jwt").await, "invalid_request");
    let none = unsigned(&json!({"alg": "none", "typ": "secevent+jwt"}), &claims());
    assert_eq!(endpoint.err(&none).await, "invalid_key");
    let hmac = sign_with(
        &claims(),
        jsonwebtoken::Algorithm::HS256,
        b"shared",
        None,
        "secevent+jwt",
    );
    assert_eq!(endpoint.err(&hmac).await, "invalid_key");
    let (_, body) = endpoint
        .push(&sign(&with(claims(), "iss", json!("x".repeat(1000)))))
        .await;
    assert!(body["description"].as_str().unwrap().len() < 300, "{body}");
    assert!(endpoint.sink.jtis().is_empty());
}

#[tokio::test]
async fn requires_the_set_media_type_and_a_small_body() {
    let endpoint = endpoint().await;
    let token = sign(&claims());
    let (status, body) = endpoint
        .post(&token, "application/jwt", Some(PUSH_TOKEN))
        .await;
    assert_eq!(
        (status, body["err"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, _) = endpoint
        .post(
            &token,
            "Application/SecEvent+JWT; charset=utf-8",
            Some(PUSH_TOKEN),
        )
        .await;
    assert_eq!(status, 202);
    let huge = "a".repeat(MAX_PUSH_BODY + 1);
    let (status, body) = endpoint
        .post(&huge, "application/secevent+jwt", Some(PUSH_TOKEN))
        .await;
    assert_eq!(
        (status, body["err"].as_str()),
        (400, Some("invalid_request"))
    );
}

#[test]
fn secrets_compare_equal_only_when_equal() {
    assert!(same_secret("abc", "abc"));
    assert!(!same_secret("abc", "abd"));
    assert!(!same_secret("abc", "abcd"));
    assert!(!same_secret("", "abc"));
}
