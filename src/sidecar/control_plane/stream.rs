//! The HTTP side of the distribution protocol: opening the stream, reading its messages,
//! posting acks.

use std::path::Path;
use std::time::Duration;

use http::StatusCode;
use http::header::{ACCEPT, CONTENT_TYPE};
use url::Url;

use crate::distribution::{
    ACK_PATH, Ack, MAX_MESSAGE_BYTES, STREAM_CONTENT_TYPE, STREAM_PATH, StreamMessage,
};

use super::framing::{FrameError, LineFramer, decode_line};

/// Longest wait for the stream's response headers (the TCP and TLS handshakes included).
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for an ack's answer.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of an error answer kept for the log.
const ERROR_BODY_BYTES: usize = 2048;

/// Why the stream could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot read the token file {path}: {reason}")]
    Token { path: String, reason: String },
    #[error("cannot reach the control plane: {0}")]
    Unreachable(String),
    #[error("the control plane did not answer within {0:?}")]
    Timeout(Duration),
    #[error(
        "the control plane REFUSED this sidecar ({status}): {body}. Check that the token file \
         holds this pod's projected ServiceAccount token with audience `lifeguard` and that \
         --pod-namespace/--pod-name name this pod"
    )]
    Refused { status: StatusCode, body: String },
    #[error("the control plane answered {status}: {body}")]
    Status { status: StatusCode, body: String },
}

/// Why reading the stream stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading the stream failed: {0}")]
    Body(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// The bearer the sidecar presents: the token file's content, trimmed, read afresh at every
/// connection (the kubelet rotates projected tokens in place).
pub async fn read_token(path: &Path) -> Result<String, OpenError> {
    let fail = |reason: String| OpenError::Token {
        path: path.display().to_string(),
        reason,
    };
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(fail("it is empty".into()));
    }
    Ok(token.to_owned())
}

/// `STREAM_PATH?podNamespace=NS&podName=NAME` on the control plane at `base`.
pub fn stream_url(base: &Url, pod_namespace: &str, pod_name: &str) -> Url {
    let mut url = base.clone();
    url.set_path(STREAM_PATH);
    url.set_query(None);
    url.query_pairs_mut()
        .append_pair("podNamespace", pod_namespace)
        .append_pair("podName", pod_name);
    url
}

/// `ACK_PATH` on the control plane at `base`.
pub fn ack_url(base: &Url) -> Url {
    let mut url = base.clone();
    url.set_path(ACK_PATH);
    url.set_query(None);
    url
}

/// One open distribution stream.
pub struct Stream {
    response: reqwest::Response,
    framer: LineFramer,
}

impl Stream {
    /// Opens the stream with `token` as the bearer.
    pub async fn open(http: &reqwest::Client, url: Url, token: &str) -> Result<Self, OpenError> {
        let request = http
            .get(url)
            .bearer_auth(token)
            .header(ACCEPT, STREAM_CONTENT_TYPE)
            .send();
        let response = tokio::time::timeout(OPEN_TIMEOUT, request)
            .await
            .map_err(|_| OpenError::Timeout(OPEN_TIMEOUT))?
            .map_err(|e| OpenError::Unreachable(error_chain(&e)))?;
        let status = response.status();
        if !status.is_success() {
            let body = error_body(response).await;
            return Err(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    OpenError::Refused { status, body }
                }
                _ => OpenError::Status { status, body },
            });
        }
        tracing::debug!(version = ?response.version(), "distribution stream open");
        Ok(Self {
            response,
            framer: LineFramer::new(MAX_MESSAGE_BYTES),
        })
    }

    /// The HTTP version the stream runs on.
    pub fn version(&self) -> http::Version {
        self.response.version()
    }

    /// The next message; `Ok(None)` when the control plane ended the stream. Cancel safe: bytes
    /// already read stay in the framer.
    pub async fn next_message(&mut self) -> Result<Option<StreamMessage>, ReadError> {
        loop {
            while let Some(line) = self.framer.next_line()? {
                if let Some(message) = decode_line(&line)? {
                    return Ok(Some(message));
                }
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.framer.push(&bytes),
                Ok(None) => return Ok(None),
                Err(e) => return Err(ReadError::Body(error_chain(&e))),
            }
        }
    }
}

/// Posts `ack` with `token` as the bearer.
///
/// Only the operator replica holding this pod's stream accepts the acknowledgement (409
/// `no_stream` elsewhere). Over HTTP/2 (an operator that offers `h2` in ALPN) the request rides
/// the stream's own connection, which reaches that replica by construction and costs no
/// handshake; `Connection: close` is dropped there, as HTTP/2 has no such header. Over
/// HTTP/1.1 the stream's connection is busy, so the acknowledgement takes a connection of its
/// own and closes it: a kept-alive connection to another replica would carry every retry to the
/// same refusal where a balancer does not keep a pod on one replica (the chart's Service does,
/// `sessionAffinity: ClientIP`), while a fresh connection per attempt is balanced again.
pub async fn post_ack(
    http: &reqwest::Client,
    url: Url,
    token: &str,
    ack: &Ack,
) -> Result<(), String> {
    let body = serde_json::to_vec(ack).map_err(|e| e.to_string())?;
    let response = http
        .post(url)
        .bearer_auth(token)
        .header(CONTENT_TYPE, "application/json")
        .header(reqwest::header::CONNECTION, "close")
        .body(body)
        .timeout(ACK_TIMEOUT)
        .send()
        .await
        .map_err(|e| error_chain(&e))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("{status}: {}", error_body(response).await))
    }
}

/// The start of an error answer's body, as text.
async fn error_body(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_BYTES);
    String::from_utf8_lossy(&body).trim().to_owned()
}

/// An error with its causes (reqwest's own text rarely says what failed underneath).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_carry_the_pod_and_replace_any_path() {
        let base = Url::parse("https://lifeguard-operator.lifeguard.svc:8443/ignored?x=1").unwrap();
        assert_eq!(
            stream_url(&base, "team-a", "reports-0").as_str(),
            "https://lifeguard-operator.lifeguard.svc:8443/distribution/v1/stream?podNamespace=team-a&podName=reports-0"
        );
        assert_eq!(
            ack_url(&base).as_str(),
            "https://lifeguard-operator.lifeguard.svc:8443/distribution/v1/ack"
        );
    }

    #[tokio::test]
    async fn the_token_is_trimmed_and_must_not_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  abc.def.ghi\n").unwrap();
        assert_eq!(read_token(&path).await.unwrap(), "abc.def.ghi");
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            read_token(&path).await,
            Err(OpenError::Token { .. })
        ));
        assert!(read_token(&dir.path().join("missing")).await.is_err());
    }

    /// A replica that refuses an acknowledgement (it does not hold the pod's stream) keeps its
    /// connection open, as the operator does; the retry must still open a connection of its own,
    /// so that a balancer can send it to another replica.
    #[tokio::test]
    async fn every_ack_attempt_opens_its_own_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = requests.clone();
        let server = tokio::spawn(async move {
            let mut connections = 0;
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                connections += 1;
                let seen = seen.clone();
                tokio::spawn(async move {
                    // Answer every request on the connection with a 409, keeping it open.
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = socket.read(&mut chunk).await {
                        if n == 0 {
                            break;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buffer).into_owned();
                        let Some(head_end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length: usize = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if buffer.len() < head_end + 4 + length {
                            continue;
                        }
                        seen.lock()
                            .unwrap()
                            .push(text[..head_end].to_ascii_lowercase());
                        buffer.clear();
                        let answer = "HTTP/1.1 409 Conflict\r\ncontent-length: 9\r\n\r\nno_stream";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
                if connections == 2 {
                    return connections;
                }
            }
        });
        let ack = Ack {
            session: "s".into(),
            version: 1,
            policy_hash: None,
            revocations: Vec::new(),
        };
        let http = reqwest::Client::new();
        for _ in 0..2 {
            let refused = post_ack(&http, ack_url(&url), "token", &ack).await;
            assert_eq!(refused.unwrap_err(), "409 Conflict: no_stream");
        }
        let connections = tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("the second attempt came on a second connection")
            .unwrap();
        assert_eq!(connections, 2);
        let requests = requests.lock().unwrap();
        assert_eq!(requests.len(), 2);
        assert!(
            requests.iter().all(|r| r.contains("\r\nconnection: close")),
            "{requests:?}"
        );
    }

    /// Against a port that serves HTTP/2 (the operator's, over the same serving code), the
    /// sidecar's client negotiates it, and an acknowledgement rides the open stream's
    /// connection: while it is answered, the server has one connection open, not two.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_http2_an_ack_rides_the_open_streams_connection() {
        use std::sync::Arc;

        use axum::body::Body;
        use axum::routing::{get, post};
        use bytes::Bytes;
        use futures_util::StreamExt as _;

        use crate::runtime::http::{ConnectionMetrics, Http2Limits, ServerLimits};
        use crate::runtime::tls::ReloadingCertificate;

        let dir = tempfile::tempdir().unwrap();
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        let certificate = Arc::new(ReloadingCertificate::load(&cert, &key).unwrap());

        let metrics = ConnectionMetrics::default();
        let open = metrics.open.clone();
        let router = axum::Router::new()
            .route(
                STREAM_PATH,
                get(|| async {
                    let first = futures_util::stream::once(async {
                        Ok::<_, std::convert::Infallible>(Bytes::from_static(b"{}\n"))
                    });
                    Body::from_stream(first.chain(futures_util::stream::pending()))
                }),
            )
            .route(
                ACK_PATH,
                post(move || {
                    let open = open.get();
                    async move {
                        if open == 1 {
                            (StatusCode::NO_CONTENT, String::new())
                        } else {
                            (StatusCode::CONFLICT, format!("{open} connections open"))
                        }
                    }
                }),
            );
        let limits = ServerLimits {
            http2: Some(Http2Limits {
                max_concurrent_streams: 4,
                ..Http2Limits::default()
            }),
            ..ServerLimits::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(crate::runtime::tls::serve_tls(
            listener,
            router,
            certificate,
            limits,
            metrics.clone(),
            shutdown.clone(),
        ));

        let tls = crate::runtime::tls_client::client_config(std::slice::from_ref(&cert)).unwrap();
        let http = super::super::http_client(tls).unwrap();
        let base = Url::parse(&format!("https://localhost:{port}/")).unwrap();
        let mut stream = Stream::open(&http, stream_url(&base, "ns", "pod"), "token")
            .await
            .unwrap();
        assert_eq!(stream.version(), http::Version::HTTP_2);
        let _first = stream
            .response
            .chunk()
            .await
            .unwrap()
            .expect("the first line");
        assert_eq!(metrics.open.get(), 1);
        let ack = Ack {
            session: "s".into(),
            version: 1,
            policy_hash: None,
            revocations: Vec::new(),
        };
        for _ in 0..3 {
            post_ack(&http, ack_url(&base), "token", &ack)
                .await
                .unwrap();
        }
        assert_eq!(
            metrics.open.get(),
            1,
            "the acknowledgements opened no connection"
        );
        drop(stream);
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
