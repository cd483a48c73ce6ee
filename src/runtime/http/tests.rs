//! The server over real sockets. Assertions are about states and orderings: waits for a state
//! are generous, and "still open" is checked well past the deadline that must not apply.

use std::time::Duration;

use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use std::sync::Arc;

use super::*;

/// Longest wait for something that must happen (a guard against hangs, not a timing check).
const EVENTUALLY: Duration = Duration::from_secs(20);

async fn slow(Extension(started): Extension<Arc<tokio::sync::Notify>>) -> &'static str {
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    "slow"
}

/// Answers once the test adds a permit to `release` (one per request).
async fn hold(
    Extension(started): Extension<Arc<tokio::sync::Notify>>,
    Extension(release): Extension<Arc<tokio::sync::Semaphore>>,
) -> &'static str {
    started.notify_one();
    release.acquire().await.unwrap().forget();
    "held"
}

/// The thread serving the request, and the thread a task it spawns runs on.
async fn thread() -> String {
    let name = || std::thread::current().name().unwrap_or("?").to_owned();
    let spawned = tokio::spawn(async move { name() }).await.unwrap();
    format!("{} {spawned}", name())
}

async fn echo_len(timeout: BodyReadTimeout, body: axum::body::Body) -> String {
    match read_body(body, 16, timeout).await {
        Ok(bytes) => bytes.len().to_string(),
        Err(error) => format!("{error:?}"),
    }
}

struct Running {
    addr: SocketAddr,
    /// Released `/hold` requests answer.
    release: Arc<tokio::sync::Semaphore>,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
    served: tokio::task::JoinHandle<io::Result<()>>,
    /// Told when `/slow` starts.
    slow_started: Arc<tokio::sync::Notify>,
}

/// Where a test's server serves its connections.
#[derive(Clone, Copy, Debug)]
enum Placement {
    /// As tasks of the test's runtime ([`serve`]).
    Here,
    /// On two worker threads of their own ([`serve_on`]).
    Workers,
}

async fn start(limits: ServerLimits, placement: Placement) -> Running {
    let slow_started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let router = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/slow", get(slow))
        .route("/thread", get(thread))
        .route("/echo", post(echo_len))
        .route("/hold", get(hold))
        .layer(Extension(slow_started.clone()))
        .layer(Extension(release.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = ConnectionMetrics::default();
    let shutdown = CancellationToken::new();
    let served = match placement {
        Placement::Here => tokio::spawn(serve(
            listener,
            router,
            limits,
            metrics.clone(),
            shutdown.clone(),
        )),
        Placement::Workers => tokio::spawn(serve_on(
            listener,
            router,
            limits,
            metrics.clone(),
            shutdown.clone(),
            Workers::start(2, "http-test-worker").unwrap(),
        )),
    };
    Running {
        addr,
        release,
        metrics,
        shutdown,
        served,
        slow_started,
    }
}

/// Runs a test body once per [`Placement`]: the guarantees hold wherever connections run.
macro_rules! in_each_placement {
    ($(async fn $name:ident($placement:ident: Placement) $body:block)*) => {$(
        mod $name {
            use super::*;

            async fn body($placement: Placement) $body

            #[tokio::test]
            async fn on_this_runtime() {
                body(Placement::Here).await
            }

            #[tokio::test]
            async fn on_workers() {
                body(Placement::Workers).await
            }
        }
    )*};
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";

/// Sends `request` and reads one response (up to its end, for these small answers).
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> String {
    stream.write_all(request).await.unwrap();
    read_response(stream).await
}

async fn read_response(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(EVENTUALLY, stream.read(&mut chunk))
            .await
            .expect("a response")
            .unwrap_or(0);
        out.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&out);
        if n == 0 || response_complete(&text) {
            return text.into_owned();
        }
    }
}

fn response_complete(text: &str) -> bool {
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .and_then(|v| v.trim().parse::<usize>().ok());
    length.is_some_and(|n| body.len() >= n)
}

/// Whether the server closed `stream` (EOF or reset) within [`EVENTUALLY`].
async fn closed_eventually(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(EVENTUALLY, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

fn timed_out(metrics: &ConnectionMetrics, reason: &'static str) -> u64 {
    metrics
        .timed_out
        .get_or_create(&ConnectionLabels { reason })
        .get()
}

in_each_placement! {
async fn an_unfinished_first_head_is_closed_after_the_header_timeout(placement: Placement) {
    let server = start(ServerLimits {
        header_read_timeout: Duration::from_millis(200),
        ..ServerLimits::default()
    }, placement)
    .await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost").await.unwrap();
    assert!(closed_eventually(&mut stream).await);
    assert_eq!(timed_out(&server.metrics, "header_read"), 1);
}

async fn a_kept_alive_connection_outlives_the_header_timeout_until_the_idle_timeout(placement: Placement) {
    let server = start(ServerLimits {
        header_read_timeout: Duration::from_millis(100),
        idle_timeout: Duration::from_millis(1500),
        ..ServerLimits::default()
    }, placement)
    .await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    assert!(exchange(&mut stream, GET).await.ends_with("ok"));
    // Idle for several header timeouts: the connection is still served.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(exchange(&mut stream, GET).await.ends_with("ok"));
    // Then silence past the idle timeout closes it.
    assert!(closed_eventually(&mut stream).await);
    assert_eq!(timed_out(&server.metrics, "idle"), 1);
    assert_eq!(timed_out(&server.metrics, "header_read"), 0);
}

async fn a_later_head_that_stalls_is_closed_after_the_header_timeout(placement: Placement) {
    let server = start(ServerLimits {
        header_read_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(3600),
        ..ServerLimits::default()
    }, placement)
    .await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    assert!(exchange(&mut stream, GET).await.ends_with("ok"));
    stream.write_all(b"GET / HT").await.unwrap();
    assert!(closed_eventually(&mut stream).await);
    assert_eq!(timed_out(&server.metrics, "header_read"), 1);
}

async fn bodies_are_read_under_the_limits_of_the_server(placement: Placement) {
    let server = start(ServerLimits {
        body_read_timeout: Duration::from_millis(200),
        ..ServerLimits::default()
    }, placement)
    .await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let post = |len: usize, body: &str| {
        format!("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\n\r\n{body}")
    };
    assert!(
        exchange(&mut stream, post(5, "hello").as_bytes())
            .await
            .ends_with("\r\n5")
    );
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let answer = exchange(&mut stream, post(17, "").as_bytes()).await;
    assert!(answer.ends_with("TooLarge"), "{answer}");
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let answer = exchange(&mut stream, post(10, "hel").as_bytes()).await;
    assert!(answer.ends_with("TimedOut"), "{answer}");
}

async fn caps_connections_per_peer_and_serves_again_once_they_close(placement: Placement) {
    let server = start(ServerLimits {
        max_connections_per_peer: 2,
        ..ServerLimits::default()
    }, placement)
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        assert!(exchange(&mut stream, GET).await.ends_with("ok"));
        held.push(stream);
    }
    let mut refused = TcpStream::connect(server.addr).await.unwrap();
    assert!(closed_eventually(&mut refused).await);
    for stream in &mut held {
        assert!(exchange(stream, GET).await.ends_with("ok"));
    }
    drop(held);
    let mut served = None;
    for _ in 0..200 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let _ = stream.write_all(GET).await;
        if read_response(&mut stream).await.ends_with("ok") {
            served = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        served.is_some(),
        "never served again after the held connections closed"
    );
}

async fn shutdown_lets_requests_in_flight_finish_and_stops_accepting(placement: Placement) {
    let server = start(ServerLimits::default(), placement).await;
    let mut busy = TcpStream::connect(server.addr).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    assert!(exchange(&mut idle, GET).await.ends_with("ok"));
    server.slow_started.notified().await;
    server.shutdown.cancel();
    assert!(read_response(&mut busy).await.ends_with("slow"));
    assert!(closed_eventually(&mut idle).await);
    let result = tokio::time::timeout(EVENTUALLY, server.served).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
    assert!(TcpStream::connect(server.addr).await.is_err());
}
}

#[path = "tests_h2.rs"]
mod h2;

#[tokio::test]
async fn each_connection_is_served_start_to_end_by_one_worker_and_connections_spread() {
    let server = start(ServerLimits::default(), Placement::Workers).await;
    let mut threads = Vec::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..5 {
            let answer = exchange(&mut stream, b"GET /thread HTTP/1.1\r\nHost: t\r\n\r\n").await;
            let (_, names) = answer.split_once("\r\n\r\n").unwrap();
            seen.insert(names.to_owned());
        }
        // Every request, and what it spawned, ran on the same worker thread.
        assert_eq!(seen.len(), 1, "{seen:?}");
        let names = seen.pop_first().unwrap();
        let (served, spawned) = names.split_once(' ').unwrap();
        assert!(served.starts_with("http-test-worker-"), "{names}");
        assert_eq!(served, spawned);
        threads.push(served.to_owned());
        held.push(stream);
    }
    // Two connections at once go to the two workers.
    threads.sort();
    assert_eq!(threads, ["http-test-worker-0", "http-test-worker-1"]);
}

/// The size of the future `serve` returns, without calling it.
fn returned_future_size<A, B, F: std::future::Future>(_serve: impl Fn(A, B) -> F) -> usize {
    std::mem::size_of::<F>()
}

/// Every open connection's task is this future (plus the spawn's header): the operator with
/// 1,000 sidecar streams holds 1,000 of them, and a flood is bounded by their number. It holds
/// no protocol's state and no TLS session inline, only pointers to the one a connection uses
/// (`serve_http`, `handshake`): 1,832 bytes in the test build, against 4,240 with the HTTP/1.1
/// path inline, 8,496 with only the HTTP/2 path boxed and 13,200 with nothing boxed. The
/// bound leaves room for compiler versions, not for a path or a session kept inline.
#[test]
fn a_connections_task_holds_no_protocol_or_tls_state_inline() {
    let size = returned_future_size(serve_connection);
    assert!(
        size <= 3 * 1024,
        "a connection's task is {size} bytes: something large is kept inline in \
         serve_connection's future (box it, as serve_http boxes each protocol's path and \
         handshake boxes the TLS session)"
    );
}
