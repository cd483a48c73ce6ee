//! HTTP/2 on a port that opted in, with hyper's own HTTP/2 client over real sockets.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::*;

fn with_http2(limits: ServerLimits) -> ServerLimits {
    ServerLimits {
        http2: Some(Http2Limits::default()),
        ..limits
    }
}

/// An HTTP/2 client connection; `driver` ends when the server closes it.
struct Client {
    send: SendRequest<Empty<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

async fn connect(addr: SocketAddr) -> Client {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (send, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Client { send, driver }
}

type Send = SendRequest<Empty<Bytes>>;

/// GETs `path` on a stream of `send`'s connection: the status, `Retry-After` and the body.
async fn get(mut send: Send, path: &str) -> (u16, Option<String>, String) {
    let request = http::Request::get(format!("http://t{path}"))
        .body(Empty::new())
        .unwrap();
    let response = tokio::time::timeout(EVENTUALLY, send.send_request(request))
        .await
        .expect("an answer")
        .unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

impl Client {
    async fn get(&self, path: &str) -> (u16, Option<String>, String) {
        get(self.send.clone(), path).await
    }

    /// Whether the server closed the connection within [`EVENTUALLY`].
    async fn closed_eventually(self) -> bool {
        tokio::time::timeout(EVENTUALLY, self.driver).await.is_ok()
    }
}

/// Reads `stream` until the server closes it (whatever frames come first).
async fn drained_until_closed(stream: &mut TcpStream) -> bool {
    let mut chunk = [0u8; 1024];
    loop {
        match tokio::time::timeout(EVENTUALLY, stream.read(&mut chunk)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

fn streams_refused(metrics: &ConnectionMetrics, reason: &'static str) -> u64 {
    metrics
        .streams_refused
        .get_or_create(&ConnectionLabels { reason })
        .get()
}

in_each_placement! {
async fn http2_and_http1_share_the_port(placement: Placement) {
    let server = start(with_http2(ServerLimits::default()), placement).await;
    let client = connect(server.addr).await;
    for _ in 0..3 {
        assert_eq!(client.get("/").await, (200, None, "ok".to_owned()));
    }
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    assert!(exchange(&mut stream, GET).await.ends_with("ok"));
    // Both connections are counted as connections.
    assert_eq!(server.metrics.open.get(), 2);
}

async fn streams_beyond_the_per_peer_cap_are_refused_with_retry_after(placement: Placement) {
    let server = start(with_http2(ServerLimits {
        max_connections_per_peer: 2,
        ..ServerLimits::default()
    }), placement)
    .await;
    let client = connect(server.addr).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tokio::spawn(get(client.send.clone(), "/hold")));
        server.slow_started.notified().await;
    }
    let (status, retry, _) = client.get("/").await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")));
    assert_eq!(streams_refused(&server.metrics, "max_streams_per_peer"), 1);
    // The held streams are served to the end, and then their slots are free again.
    server.release.add_permits(2);
    for answer in held {
        assert_eq!(answer.await.unwrap().2, "held");
    }
    let mut served = false;
    for _ in 0..200 {
        if client.get("/").await.0 == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "never served again after the held streams ended");
}

async fn a_silent_http2_connection_is_closed_after_the_header_timeout(placement: Placement) {
    let server = start(with_http2(ServerLimits {
        header_read_timeout: Duration::from_millis(200),
        ..ServerLimits::default()
    }), placement)
    .await;
    // The preface and nothing else: no request ever comes.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(sniff::PREFACE).await.unwrap();
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    assert!(drained_until_closed(&mut stream).await);
    // Half a preface: the protocol is never decided.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(&sniff::PREFACE[..10]).await.unwrap();
    assert!(drained_until_closed(&mut stream).await);
    assert_eq!(timed_out(&server.metrics, "header_read"), 2);
}

async fn a_stream_in_flight_holds_the_connection_then_idleness_closes_it(placement: Placement) {
    let server = start(with_http2(ServerLimits {
        header_read_timeout: Duration::from_millis(100),
        idle_timeout: Duration::from_millis(300),
        ..ServerLimits::default()
    }), placement)
    .await;
    let client = connect(server.addr).await;
    let held = tokio::spawn(get(client.send.clone(), "/hold"));
    server.slow_started.notified().await;
    // Well past both timeouts, the open stream keeps its connection.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!client.driver.is_finished());
    server.release.add_permits(1);
    assert_eq!(held.await.unwrap().2, "held");
    // With no stream left, the idle timeout closes it.
    assert!(client.closed_eventually().await);
    assert_eq!(timed_out(&server.metrics, "idle"), 1);
    assert_eq!(timed_out(&server.metrics, "header_read"), 0);
}
}

#[tokio::test]
async fn without_http2_the_preface_is_not_served() {
    let server = start(ServerLimits::default(), Placement::Here).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let handshake =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await;
    let (mut send, connection) = handshake.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = http::Request::get("http://t/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let answer = tokio::time::timeout(EVENTUALLY, send.send_request(request))
        .await
        .expect("an outcome");
    assert!(answer.is_err(), "{answer:?}");
}

#[tokio::test]
async fn streams_of_a_connection_run_on_its_worker() {
    let server = start(with_http2(ServerLimits::default()), Placement::Workers).await;
    let client = connect(server.addr).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..5 {
        seen.insert(client.get("/thread").await.2);
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    let names = seen.pop_first().unwrap();
    let (served, spawned) = names.split_once(' ').unwrap();
    assert!(served.starts_with("http-test-worker-"), "{names}");
    assert_eq!(served, spawned);
}
