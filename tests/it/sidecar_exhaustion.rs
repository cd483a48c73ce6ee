//! Unauthenticated resource exhaustion, black-box: the real sidecar with small limits (header
//! read 1 s, body read 1 s, 4 connections per peer), attacked over raw TCP. Assertions are
//! about outcomes and orderings; every wait has a generous bound that only guards against a
//! hang, never a claim about speed.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::client::{PROTOCOL_VERSION, capabilities, request_meta};
use support::{ExampleServer, Sidecar, SidecarOptions, User, eventually};

/// How long to wait for something that must happen (hang guard, not a timing check).
const GENEROUS: Duration = Duration::from_secs(30);
/// The per-peer cap the sidecars of these tests run with.
const PER_PEER: usize = 4;
const FOUR_MIB: usize = 4 * 1024 * 1024;

async fn start() -> (ExampleServer, Sidecar) {
    let server = ExampleServer::start();
    let args = [
        "--header-read-timeout",
        "1s",
        "--body-read-timeout",
        "1s",
        "--max-connections-per-peer",
        "4",
    ];
    let options = SidecarOptions {
        args: args.map(str::to_owned).to_vec(),
        ..Default::default()
    };
    let sidecar = Sidecar::start(&server.url, options).await;
    (server, sidecar)
}

fn addr(sidecar: &Sidecar) -> String {
    sidecar
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

/// The JSON body of a `greet` call.
fn greet_body() -> String {
    json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "greet", "arguments": {"name": "x"}, "_meta": request_meta(capabilities(false))},
    })
    .to_string()
}

/// The head of a `greet` call announcing `content_length` bytes, with `token` if given.
fn greet_head(token: Option<&str>, content_length: usize) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST /mcp HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {PROTOCOL_VERSION}\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: greet\r\n{auth}Content-Length: {content_length}\r\n\r\n"
    )
}

/// A request that needs no token and keeps the connection open: the protected resource
/// metadata.
const METADATA: &[u8] =
    b"GET /.well-known/oauth-protected-resource HTTP/1.1\r\nHost: sidecar\r\n\r\n";

/// One HTTP response: status and body (framed by Content-Length).
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Reads one response; `None` if the connection ends (or fails) before a whole one arrived.
async fn read_answer(stream: &mut TcpStream) -> Option<Answer> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(answer) = parse_answer(&got) {
            return Some(answer);
        }
        match tokio::time::timeout(GENEROUS, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
            Ok(_) => return None,
            Err(_) => panic!(
                "no answer and no close within {GENEROUS:?}; got so far: {}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

fn parse_answer(bytes: &[u8]) -> Option<Answer> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    (body.len() >= length).then(|| Answer {
        status,
        body: body[..length].to_owned(),
    })
}

/// Whether the sidecar closes `stream` (EOF or reset) without answering.
async fn closed_without_answer(stream: &mut TcpStream) -> bool {
    let mut chunk = [0u8; 1024];
    matches!(
        tokio::time::timeout(GENEROUS, stream.read(&mut chunk)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_token_less_request_is_refused_before_its_body_is_read() {
    let (_server, sidecar) = start().await;
    let mut stream = TcpStream::connect(addr(&sidecar)).await.unwrap();
    // Announce 4 MiB, send a few bytes of it, and withhold the rest.
    stream
        .write_all(greet_head(None, FOUR_MIB).as_bytes())
        .await
        .unwrap();
    stream.write_all(b"{\"jsonrpc\":").await.unwrap();
    let answer = read_answer(&mut stream).await.expect("an answer");
    assert_eq!(answer.status, 401, "{answer:?}");
    let denied = sidecar
        .audit_event(|e| e["event"] == "auth.denied" && e["reason"] == "missing_token")
        .await;
    assert!(denied.is_some(), "no auth.denied audit line");
    // The sidecar does not wait for the rest of the body: it closes the connection.
    assert!(closed_without_answer(&mut stream).await);
}

#[tokio::test]
async fn a_half_sent_request_head_is_closed_after_the_header_read_timeout() {
    let (_server, sidecar) = start().await;
    let mut stream = TcpStream::connect(addr(&sidecar)).await.unwrap();
    let head = greet_head(None, 10);
    // Headers never finished.
    stream
        .write_all(&head.as_bytes()[..head.len() / 2])
        .await
        .unwrap();
    assert!(
        closed_without_answer(&mut stream).await,
        "the half-sent request was still held after {GENEROUS:?}"
    );
    let timed_out = r#"lifeguard_connections_timed_out_total{reason="header_read"}"#;
    assert!(sidecar.metric(timed_out).await >= 1.0);
}

#[tokio::test]
async fn beyond_the_per_peer_cap_new_connections_are_closed_and_held_ones_keep_working() {
    let (_server, sidecar) = start().await;
    let addr = addr(&sidecar);
    let mut held = Vec::new();
    for _ in 0..PER_PEER {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        stream.write_all(METADATA).await.unwrap();
        let answer = read_answer(&mut stream).await.expect("served");
        assert_eq!(answer.status, 200, "{answer:?}");
        held.push(stream);
    }
    // One more from the same address: closed at once, unanswered.
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    let _ = extra.write_all(METADATA).await;
    assert!(closed_without_answer(&mut extra).await);
    let refused = r#"lifeguard_connections_refused_total{reason="max_connections_per_peer"}"#;
    assert!(sidecar.metric(refused).await >= 1.0);
    // The held connections still work, and an authenticated call on one of them succeeds.
    for stream in &mut held {
        stream.write_all(METADATA).await.unwrap();
        let answer = read_answer(stream).await.expect("still served");
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let token = User::new("alice", "t1", "c1").token();
    let body = greet_body();
    held[0]
        .write_all(format!("{}{body}", greet_head(Some(&token), body.len())).as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut held[0]).await.expect("greet answered");
    assert_eq!(answer.status, 200, "{answer:?}");
    // Once they are closed, new connections are served again.
    drop(held);
    let served = eventually(GENEROUS, async || {
        let mut stream = TcpStream::connect(&addr).await.ok()?;
        stream.write_all(METADATA).await.ok()?;
        read_answer(&mut stream).await.filter(|a| a.status == 200)
    })
    .await;
    assert!(
        served.is_some(),
        "never served again after the held connections closed"
    );
}

#[tokio::test]
async fn a_slow_body_from_an_authenticated_caller_gets_408() {
    let (_server, sidecar) = start().await;
    let token = User::new("alice", "t1", "c1").token();
    let body = greet_body();
    let mut stream = TcpStream::connect(addr(&sidecar)).await.unwrap();
    stream
        .write_all(greet_head(Some(&token), body.len()).as_bytes())
        .await
        .unwrap();
    // Half the body, and the rest never.
    stream
        .write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    let answer = read_answer(&mut stream).await.expect("an answer");
    assert_eq!(answer.status, 408, "{answer:?}");
    assert_eq!(answer.json()["error"]["code"], -32600, "{answer:?}");
    assert!(
        sidecar
            .metric(r#"lifeguard_denials_total{reason="body_timeout"}"#)
            .await
            >= 1.0
    );
    // The same call sent whole on a new connection succeeds.
    let mut stream = TcpStream::connect(addr(&sidecar)).await.unwrap();
    stream
        .write_all(format!("{}{body}", greet_head(Some(&token), body.len())).as_bytes())
        .await
        .unwrap();
    let answer = read_answer(&mut stream).await.expect("an answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.json()["result"].is_object(), "{answer:?}");
}

#[tokio::test]
async fn an_oversized_body_from_an_authenticated_caller_gets_a_json_rpc_413_unread() {
    let (_server, sidecar) = start().await;
    let token = User::new("alice", "t1", "c1").token();
    let mut stream = TcpStream::connect(addr(&sidecar)).await.unwrap();
    stream
        .write_all(greet_head(Some(&token), FOUR_MIB + 1).as_bytes())
        .await
        .unwrap();
    stream.write_all(b"{\"jsonrpc\":").await.unwrap();
    let answer = read_answer(&mut stream).await.expect("an answer");
    assert_eq!(answer.status, 413, "{answer:?}");
    assert_eq!(answer.json()["error"]["code"], -32600, "{answer:?}");
    assert_eq!(answer.json()["jsonrpc"], "2.0", "{answer:?}");
}
