//! The operator's `--listen` port under connection and body abuse (issue 28, item 7).

use super::*;

// The `--listen` port's limits (docs/operations.md, "Listener limits"): the same server as the
// webhook's, wired with the operator's flags and metrics; bodies are read only after the token
// was checked.

fn listener_sample(name: &str, labels: &str) -> String {
    format!("lifeguard_operator_{name}{{{labels}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_closes_silent_connections_and_caps_each_peer() {
    use support::listener::{address, closed_by_server, tls};
    let emulator = KubeEmulator::start().await;
    // Timeouts long enough for both connections to be open when the third arrives.
    let limits = [
        "--handshake-timeout",
        "5s",
        "--header-read-timeout",
        "5s",
        "--max-connections-per-peer",
        "2",
    ];
    let operator = Operator::start_with_args(&emulator, None, &limits).await;
    let addr = address(&operator.url);
    let mut no_hello = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut silent = tls(&operator.ca.ca_pem, addr).await.expect("handshake");
    // Two connections from this address are open: a third is closed at accept.
    assert!(
        tls(&operator.ca.ca_pem, addr).await.is_none(),
        "a connection beyond the per-peer cap was served"
    );
    assert!(
        closed_by_server(&mut no_hello).await,
        "no ClientHello, still open"
    );
    assert!(
        closed_by_server(&mut silent).await,
        "silent session, still open"
    );
    for (name, labels) in [
        (
            "connections_refused_total",
            r#"reason="max_connections_per_peer""#,
        ),
        ("connections_timed_out_total", r#"reason="handshake""#),
        ("connections_timed_out_total", r#"reason="header_read""#),
    ] {
        let sample = listener_sample(name, labels);
        assert_eq!(operator.metric(&sample).await, Some(1.0), "{sample}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_ack_is_refused_before_its_body_is_sent() {
    use support::listener::{address, post_head_only, response_head, status, tls};
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    let addr = address(&operator.url);
    let json = ("Content-Type", "application/json");
    for headers in [
        vec![json],
        vec![json, ("Authorization", "Bearer not-a-token")],
    ] {
        let mut ack = tls(&operator.ca.ca_pem, addr).await.unwrap();
        post_head_only(&mut ack, "/distribution/v1/ack", &headers, 50 * 1024 * 1024).await;
        let head = response_head(&mut ack)
            .await
            .expect("no answer before the body was sent");
        assert!(matches!(status(&head), 401 | 403), "{head}");
    }
}

fn push_config() -> String {
    let jwks = std::fs::read_to_string(support::fixture("keys/issuer-b-jwks.json")).unwrap();
    let jwks: Value = serde_json::from_str(&jwks).unwrap();
    format!(
        "securityEvents:\n  audience: https://lifeguard.test\n  transmitters:\n    - issuer: https://transmitter.test\n      jwks: {jwks}\n      delivery: push\n      pushAuthorization: {{secretName: idp-push, key: token}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_without_the_transmitters_token_is_refused_before_its_body_is_sent() {
    use support::listener::{address, post_head_only, response_body, response_head, status, tls};
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, Some(&push_config())).await;
    let addr = address(&operator.url);
    let mut push = tls(&operator.ca.ca_pem, addr).await.unwrap();
    let set = [("Content-Type", "application/secevent+jwt")];
    post_head_only(&mut push, "/ssf/push", &set, 60 * 1024).await;
    let head = response_head(&mut push)
        .await
        .expect("no answer before the body was sent");
    assert_eq!(status(&head), 400, "{head}");
    let body = response_body(&mut push, &head).await.expect("a body");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["err"], "authentication_failed", "{body}");
}
