//! HTTP/2 to the protected server (cleartext, prior knowledge: RFC 9113 §3.3), for servers
//! that speak it: many requests and event streams share a few connections instead of holding
//! one HTTP/1.1 connection each.
//!
//! What it is for: a `subscriptions/listen` stream is open for hours, and over HTTP/1.1 each
//! one pins a connection with its read and write buffers on both ends (hyper's 8 KiB minimum
//! each, docs/performance.md). Over HTTP/2 a stream is a few hundred bytes of state on a
//! shared connection.
//!
//! How connections are chosen: each thread keeps its own connections to an upstream (like the
//! HTTP/1.1 pools, so a connection is driven on the thread whose requests use it). A request
//! takes the first connection with a free stream, counting a stream as open until its response
//! body is dropped ([`StreamLease`]), against the server's `SETTINGS_MAX_CONCURRENT_STREAMS`
//! as last read from the connection; when every connection is full, or none is open, a new one
//! is made. A request never waits in a connection's queue for a stream the server has not
//! granted, so one server limit of 100 streams cannot stall the 101st listen stream.
//!
//! Flow control bounds what a stalled reader can make the sidecar hold: each stream's window
//! is [`STREAM_WINDOW`] bytes (the server may send that much before the sidecar reads), and a
//! connection's window is large enough that stalled streams never hold up the others.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

/// Bytes the server may send on one stream before the sidecar reads them (the RFC's default
/// window, 64 KiB − 1, rounded up).
pub const STREAM_WINDOW: u32 = 64 * 1024;
/// A connection's window: as many full stream windows as streams a server commonly allows
/// (RFC 9113 recommends at least 100; hyper's servers allow 200), so streams whose readers
/// stall cannot use up the window the others need.
const CONNECTION_WINDOW: u32 = 256 * STREAM_WINDOW;
/// Time to open the TCP connection (the HTTP/1.1 client's connect timeout too).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

type Sender = http2::SendRequest<Full<Bytes>>;
type Driver = http2::Connection<TokioIo<TcpStream>, Full<Bytes>, TokioExecutor>;

/// Why a request could not be sent over HTTP/2.
#[derive(Debug, thiserror::Error)]
pub enum MultiplexError {
    #[error("{0}")]
    Connect(String),
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// A connection's open streams and how many its server allows at once.
#[derive(Debug)]
struct StreamCount {
    open: AtomicUsize,
    allowed: AtomicUsize,
}

/// Holds one stream's place on its connection until dropped (with the response body).
#[derive(Debug)]
pub struct StreamLease(Arc<StreamCount>);

impl Drop for StreamLease {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Connection {
    sender: Sender,
    streams: Arc<StreamCount>,
}

impl Connection {
    /// A place for one more stream, if the server allows it.
    fn lease(&self) -> Option<StreamLease> {
        let allowed = self.streams.allowed.load(Ordering::Acquire);
        self.streams
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < allowed).then_some(open + 1)
            })
            .ok()
            .map(|_| StreamLease(self.streams.clone()))
    }
}

/// One thread's HTTP/2 connections to one upstream.
#[derive(Clone, Default)]
pub struct MultiplexedPool {
    /// Held while a connection is chosen or made, so requests that arrive together while
    /// every connection is full share the one new connection instead of each making its own.
    connections: Arc<tokio::sync::Mutex<Vec<Connection>>>,
}

impl MultiplexedPool {
    /// Sends `request` (its URI absolute: `http://host:port/path`) on a connection with a free
    /// stream; the lease must be kept as long as the response body is read.
    pub async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<(http::Response<Incoming>, StreamLease), MultiplexError> {
        let (mut sender, lease) = self.checkout(request.uri()).await?;
        let response = sender.send_request(request).await?;
        Ok((response, lease))
    }

    async fn checkout(&self, uri: &Uri) -> Result<(Sender, StreamLease), MultiplexError> {
        let mut connections = self.connections.lock().await;
        connections.retain(|c| !c.sender.is_closed());
        if let Some((sender, lease)) = connections
            .iter()
            .find_map(|c| c.lease().map(|lease| (c.sender.clone(), lease)))
        {
            return Ok((sender, lease));
        }
        let connection = connect(uri).await?;
        let lease = connection
            .lease()
            .ok_or_else(|| MultiplexError::Connect("the server allows no stream".into()))?;
        let sender = connection.sender.clone();
        connections.push(connection);
        Ok((sender, lease))
    }

    /// Connections open now.
    #[cfg(test)]
    pub async fn connection_count(&self) -> usize {
        let mut connections = self.connections.lock().await;
        connections.retain(|c| !c.sender.is_closed());
        connections.len()
    }
}

/// Opens a connection to `uri`'s authority and starts driving it on this runtime.
async fn connect(uri: &Uri) -> Result<Connection, MultiplexError> {
    let authority = uri
        .authority()
        .ok_or_else(|| MultiplexError::Connect(format!("{uri} names no host")))?;
    let port = authority.port_u16().unwrap_or(80);
    let address = (authority.host().trim_matches(['[', ']']), port);
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
        .await
        .map_err(|_| MultiplexError::Connect(format!("connecting to {authority} timed out")))?
        .map_err(|e| MultiplexError::Connect(format!("connecting to {authority}: {e}")))?;
    stream
        .set_nodelay(true)
        .map_err(|e| MultiplexError::Connect(e.to_string()))?;
    let (sender, driver) = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .adaptive_window(false)
        .handshake(TokioIo::new(stream))
        .await?;
    let streams = Arc::new(StreamCount {
        open: AtomicUsize::new(0),
        allowed: AtomicUsize::new(driver.current_max_send_streams().max(1)),
    });
    tokio::spawn(Drive {
        driver,
        streams: streams.clone(),
    });
    Ok(Connection { sender, streams })
}

/// Drives one connection and keeps its stream allowance current: the server's SETTINGS can
/// change it at any time.
struct Drive {
    driver: Driver,
    streams: Arc<StreamCount>,
}

impl Future for Drive {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.driver).poll(cx);
        this.streams.allowed.store(
            this.driver.current_max_send_streams().max(1),
            Ordering::Release,
        );
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(error)) => {
                tracing::debug!(%error, "HTTP/2 connection to the MCP server ended");
                Poll::Ready(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
