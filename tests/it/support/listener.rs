//! Raw probes of a control-plane HTTPS listener (the operator's or the webhook's `--listen`):
//! TCP connections that never start TLS, TLS sessions that never send a request, trickled
//! request heads, and request heads whose body is held back, to see what the server does
//! before the client has sent everything.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Longest wait for something that must happen (a guard against hangs, not a timing check).
pub const EVENTUALLY: Duration = Duration::from_secs(20);

/// The socket address of an `https://HOST:PORT` URL.
pub fn address(url: &str) -> SocketAddr {
    url.trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// A TLS session (ALPN `http/1.1`) with the server at `addr`, trusting `ca_pem`; `None` when
/// the server closed the connection instead of completing the handshake.
pub async fn tls(ca_pem: &str, addr: SocketAddr) -> Option<TlsStream<TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(EVENTUALLY, connector.connect(name, tcp))
        .await
        .expect("the handshake neither completed nor failed")
        .ok()
}

/// Whether the server closes `stream` (end of stream or an error) within [`EVENTUALLY`];
/// whatever it sends before is discarded.
pub async fn closed_by_server<S: AsyncRead + Unpin>(stream: &mut S) -> bool {
    let drain = async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(EVENTUALLY, drain).await.is_ok()
}

/// Whether the server has closed `stream` already or does within `grace`: used to check that a
/// connection is still open well past a deadline that must not apply to it.
pub async fn still_open<S: AsyncRead + Unpin>(stream: &mut S, grace: Duration) -> bool {
    let mut byte = [0u8; 1];
    tokio::time::timeout(grace, stream.read(&mut byte))
        .await
        .is_err()
}

/// Reads a response head (up to the blank line) within [`EVENTUALLY`]; `None` when the
/// connection closed or nothing complete came in time.
pub async fn response_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let read = async {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return None,
            }
        }
        Some(String::from_utf8_lossy(&head).into_owned())
    };
    tokio::time::timeout(EVENTUALLY, read).await.ok().flatten()
}

/// The status code of a response head.
pub fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Sends a POST head to `path` announcing a body of `length` bytes, and none of the body.
pub async fn post_head_only(
    stream: &mut TlsStream<TcpStream>,
    path: &str,
    headers: &[(&str, &str)],
    length: usize,
) {
    let mut head =
        format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {length}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
}

/// Sends a request head one byte at a time, `pause` apart, until the server closes the
/// connection; returns whether it did before the head was complete (a head of `length`
/// header bytes, far more than the server's header-read timeout can take at this pace).
pub async fn trickle_head(
    stream: &mut TlsStream<TcpStream>,
    pause: Duration,
    length: usize,
) -> bool {
    let mut head = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', length));
    for byte in head {
        if stream.write_all(&[byte]).await.is_err() || stream.flush().await.is_err() {
            return true;
        }
        let mut probe = [0u8; 1];
        match tokio::time::timeout(pause, stream.read(&mut probe)).await {
            Ok(Ok(0) | Err(_)) => return true,
            // A response (e.g. 408) before the connection is closed.
            Ok(Ok(_)) => return closed_by_server(stream).await,
            Err(_) => {}
        }
    }
    false
}

/// Reads the body of a response whose head was read with [`response_head`] (by its
/// `Content-Length`), within [`EVENTUALLY`].
pub async fn response_body<S: AsyncRead + Unpin>(stream: &mut S, head: &str) -> Option<String> {
    let length: usize = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())
            .flatten()
    })?;
    let mut body = vec![0u8; length];
    tokio::time::timeout(EVENTUALLY, stream.read_exact(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}
