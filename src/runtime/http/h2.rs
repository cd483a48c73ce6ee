//! HTTP/2 (cleartext, prior knowledge) on a port that opted in ([`Http2Limits`]): one connection
//! carries many requests, so everything [`super`] bounds per HTTP/1.1 connection is bounded
//! here per connection *and* per stream.
//!
//! - **Streams count like connections**: every stream takes a slot of the port's
//!   [`StreamGate`] (as many in total, and per peer address, as the connection caps allow
//!   connections), so multiplexing gives a client no more concurrent requests than HTTP/1.1
//!   would. A stream beyond a cap is answered `503` with `Retry-After: 1` without reaching the
//!   router. `SETTINGS_MAX_CONCURRENT_STREAMS` caps one connection on top.
//! - **Deadlines without a request head**: hyper's HTTP/2 server has no header-read or idle
//!   timeout, so the connection's streams are counted here: a connection with no stream open is
//!   closed (GOAWAY, then dropped after the header-read timeout if the peer does not let it
//!   finish) when its first request has not arrived within the header-read timeout of the
//!   accept (a silent peer, a preface and nothing else, a header block left unfinished) or,
//!   later, after the idle timeout without a stream. A stream in flight (an event stream) is
//!   never cut by either; keep-alive PINGs close a connection whose peer stopped answering.
//! - **Bounded buffers**: a header list is at most the port's head limit (`431`-equivalent:
//!   the stream is refused), a connection may have 64 KiB of request data unread, over all its
//!   streams (flow-control windows), and a stream's answer queues at most 32 KiB for a peer that
//!   does not read.
//! - **Reset floods**: streams the peer resets before they are served (CVE-2023-44487) and
//!   streams this server resets for protocol errors (CVE-2025-8671) are capped per connection;
//!   past the cap the connection is closed with GOAWAY.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures_util::future::{Either, Ready, ready};
use http::{HeaderValue, Response, StatusCode, header};
use hyper::body::{Frame, SizeHint};
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Instant;

use super::admission::{StreamGate, StreamSlot};
use super::conn::Expiry;
use super::{ConnectionMetrics, PeerAddr, ServerLimits, Service};

/// How a port serves HTTP/2 besides HTTP/1.1 (`None` in [`ServerLimits::http2`]: HTTP/1.1
/// only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Http2Limits {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`: requests one connection may have open at once
    /// (default 100, the least RFC 9113 recommends).
    pub max_concurrent_streams: u32,
    /// Streams the peer may reset before they are served, per connection, before GOAWAY
    /// (default 20).
    pub max_pending_accept_reset_streams: usize,
    /// Streams this server may reset for the peer's errors, per connection, before GOAWAY
    /// (default 1024).
    pub max_local_error_reset_streams: usize,
    /// Unread request data a stream may have (default 64 KiB).
    pub stream_window: u32,
    /// Unread request data a connection may have, over all its streams (default 64 KiB).
    pub connection_window: u32,
    /// Answer data a stream may queue for a peer that does not read (default 32 KiB).
    pub max_send_buffer: usize,
    /// Interval of keep-alive PINGs (default 60 s).
    pub keep_alive_interval: Duration,
    /// Time a PING's acknowledgement may take before the connection is closed (default 20 s).
    pub keep_alive_timeout: Duration,
}

impl Default for Http2Limits {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
            stream_window: 64 * 1024,
            connection_window: 64 * 1024,
            max_send_buffer: 32 * 1024,
            keep_alive_interval: Duration::from_secs(60),
            keep_alive_timeout: Duration::from_secs(20),
        }
    }
}

/// What serving one HTTP/2 connection needs.
pub(super) struct Http2Connection {
    pub peer: SocketAddr,
    pub service: Service,
    pub limits: ServerLimits,
    pub http2: Http2Limits,
    pub streams: StreamGate,
    pub metrics: ConnectionMetrics,
    pub shutdown: tokio_util::sync::CancellationToken,
    /// When the connection was accepted (after its TLS handshake, if any).
    pub accepted: Instant,
}

/// Serves HTTP/2 on `io` (its preface not yet read by hyper) until the connection ends.
pub(super) async fn serve<S>(io: S, connection: Http2Connection)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Http2Connection {
        peer,
        service,
        limits,
        http2: settings,
        streams,
        metrics,
        shutdown,
        accepted,
    } = connection;
    let (activity, watched) = watch::channel(Activity::default());
    let activity = Arc::new(activity);
    let service = hyper::service::service_fn(move |request| {
        route(&service, &streams, &activity, peer, request)
    });
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .max_pending_accept_reset_streams(settings.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(settings.max_local_error_reset_streams)
        .initial_stream_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_send_buf_size(settings.max_send_buffer)
        .max_header_list_size(u32::try_from(limits.max_head_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(settings.keep_alive_interval)
        .keep_alive_timeout(settings.keep_alive_timeout);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    let mut connection = std::pin::pin!(connection);
    let deadlines = Deadlines {
        accepted,
        header: limits.header_read_timeout,
        idle: limits.idle_timeout,
    };
    let served = tokio::select! {
        served = connection.as_mut() => served,
        expiry = deadlines.expiry(watched) => {
            metrics.time_out(expiry.label());
            tracing::debug!(%peer, reason = expiry.label(), "connection timed out");
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(limits.header_read_timeout, connection.as_mut()).await {
                Ok(served) => served,
                Err(_) => return,
            }
        }
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = served {
        tracing::debug!(%peer, %error, "HTTP/2 connection ended with an error");
    }
}

type Routed = Either<
    Ready<Result<Response<Counted>, Infallible>>,
    Pin<Box<dyn Future<Output = Result<Response<Counted>, Infallible>> + Send>>,
>;

/// One stream: admitted against the stream caps, counted while it is served.
fn route(
    service: &Service,
    streams: &StreamGate,
    activity: &Arc<watch::Sender<Activity>>,
    peer: SocketAddr,
    mut request: http::Request<hyper::body::Incoming>,
) -> Routed {
    let slot = match streams.admit(peer.ip()) {
        Ok(slot) => slot,
        Err(refusal) => {
            tracing::debug!(%peer, reason = refusal.stream_label(), "stream refused");
            return Either::Left(ready(Ok(too_busy())));
        }
    };
    request.extensions_mut().insert(PeerAddr(peer));
    let in_flight = InFlight::start(activity.clone(), slot);
    let answer = hyper::service::Service::call(service, request);
    Either::Right(Box::pin(async move {
        let response = answer.await?;
        Ok(response.map(|body| Counted {
            body,
            _in_flight: Some(in_flight),
        }))
    }))
}

fn too_busy() -> Response<Counted> {
    let mut response = Response::new(Counted {
        body: Body::from("too many concurrent requests; retry\n"),
        _in_flight: None,
    });
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The streams of one connection being served, as its deadlines need them.
#[derive(Clone, Copy, Debug)]
struct Activity {
    open: usize,
    /// Whether a stream was ever served.
    served: bool,
    /// When the last stream ended (meaningful when `open` is 0 and `served`).
    idle_since: Instant,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            open: 0,
            served: false,
            idle_since: Instant::now(),
        }
    }
}

/// A stream being served: its cap slot and its place in the connection's [`Activity`], both
/// given back when the answer's body is dropped (sent, or the stream reset).
struct InFlight {
    activity: Arc<watch::Sender<Activity>>,
    _slot: StreamSlot,
}

impl InFlight {
    fn start(activity: Arc<watch::Sender<Activity>>, slot: StreamSlot) -> Self {
        activity.send_modify(|a| {
            a.open += 1;
            a.served = true;
        });
        Self {
            activity,
            _slot: slot,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.send_modify(|a| {
            a.open = a.open.saturating_sub(1);
            if a.open == 0 {
                a.idle_since = Instant::now();
            }
        });
    }
}

/// An answer's body that keeps its stream counted until it is dropped.
pub(super) struct Counted {
    body: Body,
    _in_flight: Option<InFlight>,
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The deadlines of a connection without a stream open.
struct Deadlines {
    accepted: Instant,
    header: Duration,
    idle: Duration,
}

impl Deadlines {
    /// When a connection in `activity` must close if nothing changes, and why; `None` while a
    /// stream is open.
    fn due(&self, activity: &Activity) -> Option<(Instant, Expiry)> {
        match activity {
            Activity { open: 1.., .. } => None,
            Activity { served: false, .. } => Some((self.accepted + self.header, Expiry::Header)),
            Activity { idle_since, .. } => Some((*idle_since + self.idle, Expiry::Idle)),
        }
    }

    /// Resolves when a deadline passes with no stream open.
    async fn expiry(&self, mut activity: watch::Receiver<Activity>) -> Expiry {
        loop {
            let now = *activity.borrow_and_update();
            match self.due(&now) {
                None => {
                    if activity.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
                Some((deadline, expiry)) => tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => return expiry,
                    changed = activity.changed() => if changed.is_err() {
                        return std::future::pending().await;
                    },
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadlines() -> Deadlines {
        Deadlines {
            accepted: Instant::now(),
            header: Duration::from_secs(10),
            idle: Duration::from_secs(120),
        }
    }

    #[test]
    fn the_first_stream_is_due_within_the_header_timeout_then_idleness_counts() {
        let d = deadlines();
        let fresh = Activity::default();
        assert_eq!(d.due(&fresh), Some((d.accepted + d.header, Expiry::Header)));
        let busy = Activity {
            open: 2,
            served: true,
            ..fresh
        };
        assert_eq!(d.due(&busy), None);
        let later = d.accepted + Duration::from_secs(300);
        let idle = Activity {
            open: 0,
            served: true,
            idle_since: later,
        };
        assert_eq!(d.due(&idle), Some((later + d.idle, Expiry::Idle)));
    }

    #[tokio::test(start_paused = true)]
    async fn streams_in_flight_hold_the_deadline_and_their_end_restarts_it() {
        let d = deadlines();
        let (activity, watched) = watch::channel(Activity::default());
        let activity = Arc::new(activity);
        let gate = StreamGate::new(4, 4, &ConnectionMetrics::default());
        let stream = InFlight::start(activity.clone(), gate.admit([10, 0, 0, 1].into()).unwrap());
        let expiry = tokio::spawn(async move { d.expiry(watched).await });
        // Well past both timeouts, a stream still open keeps the connection.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!expiry.is_finished());
        let ended = Instant::now();
        drop(stream);
        assert_eq!(expiry.await.unwrap(), Expiry::Idle);
        assert!(Instant::now() >= ended + Duration::from_secs(120));
    }
}
