//! A hardened HTTP/1.1 server for ports that face untrusted clients: an axum [`Router`] served
//! from our own accept loop, so every connection is admitted, timed and shut down on purpose.
//!
//! - **TLS** ([`serve_tls`]): an admitted connection must complete its TLS handshake within
//!   [`ServerLimits::handshake_timeout`] (a peer that never sends a ClientHello, or stalls in
//!   the middle, is closed and counted as `connections_timed_out_total{reason="handshake"}`);
//!   everything below then applies inside the TLS session.
//! - **Connection caps**: beyond [`ServerLimits::max_connections`] in total or
//!   [`ServerLimits::max_connections_per_peer`] from one IP address, a new connection is
//!   closed right after accept and counted (`connections_refused_total{reason}`).
//! - **Header-read and idle timeouts** (see [`conn`]): a request head must be complete within
//!   the header-read timeout (of the accept for a connection's first request, of its first
//!   byte for later ones); a kept-alive connection with no request for the idle timeout is
//!   closed. A request in flight (a long answer, an event stream) is never cut by either.
//! - **Bounded buffers**: a request head and each connection's read buffer are capped at
//!   [`ServerLimits::max_head_bytes`] (larger heads get 431).
//! - **Body reads** are the handler's business, on purpose (after authentication), with
//!   [`read_body`] under the [`BodyReadTimeout`] this server puts on every request.
//! - **Graceful shutdown**: when `shutdown` fires, accepting stops, idle connections close,
//!   requests in flight get [`ServerLimits::shutdown_grace`] to finish, then the rest are
//!   aborted. Connection errors are logged at debug level.
//! - **HTTP/2 by prior knowledge**, when [`ServerLimits::http2`] opts in: a connection that
//!   opens with the HTTP/2 preface is served by [`h2`] (every stream admitted against the
//!   port's stream caps, deadlines counted by streams open), any other by HTTP/1.1. Off by
//!   default.
//! - **Where connections run**: [`serve`] serves each connection as a task of the runtime it
//!   is called on; [`serve_on`] hands each one to the least loaded of a set of
//!   [`Workers`](super::workers::Workers), which serves it start to end on one thread.

mod admission;
mod body;
pub mod conn;
mod h2;
mod sniff;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::{Extension, Router};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use admission::{ConnectionLabels, ConnectionMetrics, Refusal};
pub use body::{BodyBudget, BodyError, BodyReadTimeout, BudgetExhausted, Reservation, read_body};
pub use h2::Http2Limits;

use admission::{Admission, Gate, StreamGate};
use conn::{ConnClock, HeadTimer, Tracked};

use super::workers::{Assignment, Workers};

/// What one server allows its clients. The defaults suit a sidecar facing a cluster network;
/// docs/sidecar.md ("Resource limits and what they bound") gives the reasons and the memory
/// they bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Time a TLS client has to complete its handshake, from the accept ([`serve_tls`] only;
    /// default 10 s).
    pub handshake_timeout: Duration,
    /// Time to receive a complete request head (default 10 s).
    pub header_read_timeout: Duration,
    /// Time a handler gives a request body once it starts reading it (default 30 s).
    pub body_read_timeout: Duration,
    /// Time a kept-alive connection may wait for its next request (default 120 s).
    pub idle_timeout: Duration,
    /// Connections served at once (default 1024).
    pub max_connections: usize,
    /// Connections served at once from one IP address (default 64).
    pub max_connections_per_peer: usize,
    /// Largest request head, and largest read or write buffer of a connection (default
    /// 32 KiB).
    pub max_head_bytes: usize,
    /// Time requests in flight get to finish after shutdown begins (default 10 s).
    pub shutdown_grace: Duration,
    /// Whether connections that open with the HTTP/2 preface are served, and how (default
    /// `None`: HTTP/1.1 only). Each stream also takes a slot of caps as large as the connection
    /// caps (see [`h2`]).
    pub http2: Option<Http2Limits>,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_connections: 1024,
            max_connections_per_peer: 64,
            max_head_bytes: 32 * 1024,
            shutdown_grace: Duration::from_secs(10),
            http2: None,
        }
    }
}

/// hyper's smallest allowed buffer.
const MIN_BUFFER: usize = 8 * 1024;
/// Pause after an accept error that is not about one connection (e.g. out of file
/// descriptors), so the loop does not spin while it lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` under `limits` until `shutdown` fires, then shuts down
/// gracefully (see the module documentation). Returns once every connection is closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let place = Placement {
        workers: None,
        tls: None,
    };
    serve_placed(listener, router, limits, metrics, shutdown, place).await
}

/// [`serve`] over TLS: every admitted connection is handed to `acceptor` and must complete its
/// handshake within [`ServerLimits::handshake_timeout`]; the session then gets every
/// protection of [`serve`] (HTTP/1.1 only: offer only `http/1.1` in the acceptor's ALPN).
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
    acceptor: tokio_rustls::TlsAcceptor,
) -> io::Result<()> {
    let place = Placement {
        workers: None,
        tls: Some(acceptor),
    };
    serve_placed(listener, router, limits, metrics, shutdown, place).await
}

/// [`serve`], with each accepted connection served on the least loaded of `workers` (the
/// accept loop itself runs where this is called). The workers must outlive this call.
pub async fn serve_on(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
    workers: Workers,
) -> io::Result<()> {
    let place = Placement {
        workers: Some(workers),
        tls: None,
    };
    serve_placed(listener, router, limits, metrics, shutdown, place).await
}

/// Where and how accepted connections are served.
struct Placement {
    workers: Option<Workers>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

async fn serve_placed(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
    place: Placement,
) -> io::Result<()> {
    let Placement { workers, tls } = place;
    let gate = Gate::new(
        limits.max_connections,
        limits.max_connections_per_peer,
        metrics.clone(),
    );
    let streams = limits.http2.as_ref().map(|_| {
        StreamGate::new(
            limits.max_connections,
            limits.max_connections_per_peer,
            &metrics,
        )
    });
    let router = router.layer(Extension(BodyReadTimeout(limits.body_read_timeout)));
    let service = TowerToHyperService::new(router);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                if let Err(error) = joined {
                    tracing::debug!(%error, "connection task ended abnormally");
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match gate.admit(peer.ip()) {
                    Ok(admission) => {
                        let context = ConnectionContext {
                            peer, admission, service: service.clone(), limits: limits.clone(),
                            metrics: metrics.clone(), shutdown: shutdown.clone(), tls: tls.clone(),
                            streams: streams.clone(),
                        };
                        match &workers {
                            None => {
                                connections.spawn(serve_connection(stream, context));
                            }
                            Some(workers) => match stream.into_std() {
                                Ok(stream) => {
                                    let place = workers.assign();
                                    let handle = place.handle().clone();
                                    let served = serve_moved_connection(stream, place, context);
                                    connections.spawn_on(served, &handle);
                                }
                                Err(error) => {
                                    tracing::debug!(%peer, %error, "cannot hand a connection to a worker");
                                }
                            },
                        }
                    }
                    Err(refusal) => {
                        tracing::debug!(%peer, reason = refusal.label(), "connection refused");
                        drop(stream);
                    }
                },
                Err(error) => {
                    tracing::debug!(%error, "accept failed");
                    if !is_connection_error(&error) {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            },
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            connections = connections.len(),
            "closing connections still busy after the shutdown grace period"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Errors of one connection that was being accepted (the listener is fine).
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

type Service = TowerToHyperService<Router>;

/// The address of the peer a request's connection came from (a request extension; read it
/// with the [`PeerAddr`] extractor, `None` for requests that did not come over a connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for PeerAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get().copied())
    }
}

/// What serving one admitted connection needs besides its socket.
struct ConnectionContext {
    peer: SocketAddr,
    admission: Admission,
    service: Service,
    limits: ServerLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The port's HTTP/2 stream caps (`Some` when HTTP/2 is served).
    streams: Option<StreamGate>,
}

/// Serves a connection accepted on another runtime: the socket is registered with the
/// runtime this runs on (the worker's), so its I/O wakes this thread and no other.
async fn serve_moved_connection(
    stream: std::net::TcpStream,
    place: Assignment,
    context: ConnectionContext,
) {
    match TcpStream::from_std(stream) {
        Ok(stream) => serve_connection(stream, context).await,
        Err(error) => {
            tracing::debug!(peer = %context.peer, %error, "cannot serve a connection on its worker");
        }
    }
    drop(place);
}

/// Serves one admitted connection until it ends (or is shut down), then gives its slots back.
/// Everything that arms a timer or registers I/O is made inside, on the runtime serving it.
async fn serve_connection(stream: TcpStream, mut context: ConnectionContext) {
    let peer = context.peer;
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%peer, %error, "cannot set TCP_NODELAY");
    }
    let Some(acceptor) = context.tls.take() else {
        return serve_http(stream, context).await;
    };
    if let Some(tls) = handshake(stream, acceptor, &context).await {
        serve_http(tls, context).await;
    }
}

/// The TLS session of `stream`, once its handshake completed within the handshake timeout.
/// Boxed, as the protocol paths are ([`serve_http`]): the connection's task holds a pointer,
/// not rustls' connection state, for as long as the connection lives.
async fn handshake(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    context: &ConnectionContext,
) -> Option<Box<tokio_rustls::server::TlsStream<TcpStream>>> {
    let peer = context.peer;
    let handshake = Box::pin(tokio::time::timeout(
        context.limits.handshake_timeout,
        acceptor.accept(stream),
    ));
    let tls = tokio::select! {
        done = handshake => done,
        _ = context.shutdown.cancelled() => return None,
    };
    match tls {
        Ok(Ok(tls)) => Some(Box::new(tls)),
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            context.metrics.time_out("handshake");
            tracing::debug!(%peer, reason = "handshake", "connection timed out");
            None
        }
    }
}

/// Serves one admitted connection (plain or inside TLS): HTTP/1.1, or HTTP/2 when the port
/// serves it and the connection opens with its preface.
async fn serve_http<S>(stream: S, context: ConnectionContext)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let clock = ConnClock::new();
    // Both paths boxed: the task spawned at accept is sized for the largest state its future
    // can be in, for as long as the connection lives. Inline, the HTTP/1.1 path would size
    // every task (an HTTP/2 connection's too, which holds its own state besides), and the
    // HTTP/2 path every task of a port that does not even serve it. Boxed, a connection holds
    // the task (the TLS handshake's state, then a pointer) and the one path it takes.
    match (context.limits.http2.clone(), context.streams.clone()) {
        (Some(http2), Some(streams)) => {
            Box::pin(serve_sniffed(stream, clock, context, http2, streams)).await;
        }
        _ => Box::pin(serve_http1(stream, clock, context)).await,
    }
}

/// Serves a connection of a port that also serves HTTP/2: HTTP/2 when it opens with the
/// preface, else HTTP/1.1.
async fn serve_sniffed<S>(
    mut stream: S,
    clock: std::sync::Arc<ConnClock>,
    context: ConnectionContext,
    http2: Http2Limits,
    streams: StreamGate,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let peer = context.peer;
    let deadline =
        tokio::time::Instant::from_std(clock.accepted()) + context.limits.header_read_timeout;
    let sniffed = tokio::select! {
        sniffed = tokio::time::timeout_at(deadline, sniff::sniff(&mut stream)) => sniffed,
        _ = context.shutdown.cancelled() => return,
    };
    let (protocol, prefix) = match sniffed {
        Ok(Ok(Some(decided))) => decided,
        Ok(Ok(None)) => return,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "connection ended with an error");
            return;
        }
        Err(_) => {
            context.metrics.time_out(conn::Expiry::Header.label());
            tracing::debug!(%peer, reason = "header_read", "connection timed out");
            return;
        }
    };
    let stream = sniff::Rewound::new(prefix, stream);
    match protocol {
        sniff::Protocol::Http1 => serve_http1(stream, clock, context).await,
        sniff::Protocol::Http2 => {
            let ConnectionContext {
                peer,
                admission,
                service,
                limits,
                metrics,
                shutdown,
                ..
            } = context;
            let connection = h2::Http2Connection {
                peer,
                service,
                limits,
                http2,
                streams,
                metrics,
                shutdown,
                accepted: tokio::time::Instant::from_std(clock.accepted()),
            };
            h2::serve(stream, connection).await;
            drop(admission);
        }
    }
}

/// Serves HTTP/1.1 on one admitted connection; `clock` started when it was accepted.
async fn serve_http1<S>(stream: S, clock: std::sync::Arc<ConnClock>, context: ConnectionContext)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let ConnectionContext {
        peer,
        admission,
        service,
        limits,
        metrics,
        shutdown,
        ..
    } = context;
    let buffer = limits.max_head_bytes.max(MIN_BUFFER);
    let mut builder = http1::Builder::new();
    builder
        .timer(HeadTimer::new(
            clock.clone(),
            limits.header_read_timeout,
            limits.idle_timeout,
        ))
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(buffer);
    let io = TokioIo::new(Tracked::new(stream, clock.clone()));
    // Every request of the connection knows where it came from.
    let service =
        hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(PeerAddr(peer));
            hyper::service::Service::call(&service, request)
        });
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = served {
        match clock.expiry().filter(|_| error.is_timeout()) {
            Some(expiry) => {
                metrics.time_out(expiry.label());
                tracing::debug!(%peer, reason = expiry.label(), "connection timed out");
            }
            None => tracing::debug!(%peer, %error, "connection ended with an error"),
        }
    }
    drop(admission);
}

#[cfg(test)]
mod tests;
