//! `--client-http2 on`, black-box: clients that speak HTTP/2 by prior knowledge to the real
//! sidecar, every request a stream of one connection; streams count against the connection
//! caps; without the flag the client port serves HTTP/1.1 only.

use crate::support;

use std::time::Duration;

use serde_json::json;

use support::User;
use support::client::McpClient;
use support::listen::ListenStream;
use support::process::{ExampleServer, Sidecar, SidecarOptions};

const SPEC: &str = r#"  tasks:
    minPollInterval: 50ms
  listen:
    notifications: [toolsListChanged]
    maxStreamsPerPrincipal: 3
    maxStreamDuration: 60s
"#;

const LONG: Duration = Duration::from_secs(10);

async fn start(extra: &[&str]) -> (ExampleServer, Sidecar) {
    let server = ExampleServer::start();
    let mut args = vec!["--client-http2".to_owned(), "on".to_owned()];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: SPEC.to_owned(),
            args,
            ..Default::default()
        },
    )
    .await;
    (server, sidecar)
}

/// Opens a listen stream for `user` on `client` and reads its acknowledgement.
async fn listen(client: &McpClient, user: &str) -> ListenStream {
    let token = User::new(user, "tenant-a", "console").token();
    let params = json!({"notifications": {"toolsListChanged": true},
        "_meta": support::client::request_meta(support::client::capabilities(true))});
    let mut stream = client
        .request("subscriptions/listen", params)
        .id(json!(user))
        .token(&token)
        .accept_sse()
        .stream()
        .await;
    assert_eq!(stream.status, 200, "{user}");
    let ack = stream.next(LONG).await.expect("acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    stream
}

#[tokio::test]
async fn calls_and_listen_streams_share_one_http2_connection_and_http1_still_works() {
    let (server, sidecar) = start(&[]).await;
    let h2 = McpClient::http2(&sidecar.url);
    let mut streams = vec![listen(&h2, "alice").await, listen(&h2, "bob").await];
    let token = User::new("alice", "tenant-a", "console").token();
    let reply = h2.call_tool(&token, "greet", json!({"name": "h2"})).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.result()["content"][0]["text"],
        "Hello, h2!",
        "{reply:?}"
    );
    // Two streams and a call, one connection.
    assert_eq!(sidecar.metric("lifeguard_connections_open").await, 1.0);

    server.emit(json!({"kind": "toolsListChanged"})).await;
    for stream in &mut streams {
        let event = stream.next(LONG).await.expect("an event");
        assert_eq!(event["method"], "notifications/tools/list_changed");
    }
    // The same port still serves HTTP/1.1.
    let h1 = McpClient::new(&sidecar.url);
    let reply = h1.call_tool(&token, "greet", json!({"name": "h1"})).await;
    assert_eq!(reply.status, 200, "{reply:?}");

    // A stream the client resets ends at the sidecar as a closed listener.
    drop(streams.pop());
    let closed = support::eventually(LONG, async || {
        server.emit(json!({"kind": "toolsListChanged"})).await;
        sidecar
            .audit()
            .into_iter()
            .find(|e| e["event"] == "listen.closed" && e["reason"] == "client_closed")
    })
    .await;
    assert!(closed.is_some(), "the reset stream was not noticed");
}

#[tokio::test]
async fn streams_count_against_the_per_peer_cap_and_are_refused_with_retry_after() {
    let (_server, sidecar) = start(&["--max-connections-per-peer", "2"]).await;
    let h2 = McpClient::http2(&sidecar.url);
    let mut streams = vec![listen(&h2, "alice").await, listen(&h2, "bob").await];
    let token = User::new("carol", "tenant-a", "console").token();
    let refused = h2
        .call_tool(&token, "greet", json!({"name": "third"}))
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(
        refused.headers.get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let counted = r#"lifeguard_http2_streams_refused_total{reason="max_streams_per_peer"}"#;
    assert_eq!(sidecar.metric(counted).await, 1.0);
    // One stream ends: its slot serves the next request.
    drop(streams.pop());
    let served = support::eventually(LONG, async || {
        let reply = h2
            .call_tool(&token, "greet", json!({"name": "third"}))
            .await;
        (reply.status == 200).then_some(reply)
    })
    .await;
    assert!(served.is_some(), "the freed stream slot was never used");
}

#[tokio::test]
async fn without_the_flag_an_http2_client_is_not_served() {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: SPEC.to_owned(),
            ..Default::default()
        },
    )
    .await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let answer = h2.post(&sidecar.url).body("{}").send().await;
    assert!(answer.is_err(), "{answer:?}");
    // HTTP/1.1 is served as before.
    let token = User::new("alice", "tenant-a", "console").token();
    let reply = McpClient::new(&sidecar.url)
        .call_tool(&token, "greet", json!({"name": "h1"}))
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
}
