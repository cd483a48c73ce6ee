//! The pool against a real HTTP/2 server (hyper's, cleartext) that allows few streams at once.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::*;

/// A server that answers `/stream` with an event stream that stays open until the client goes
/// away, `/json` with a short body, and allows `max_streams` streams per connection. Returns
/// its address and a receiver of the number of every connection it accepts.
async fn server(max_streams: u32) -> (SocketAddr, mpsc::UnboundedReceiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (accepted, accepted_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for n in 1.. {
            let (socket, _) = listener.accept().await.unwrap();
            accepted.send(n).unwrap();
            tokio::spawn(async move {
                let service =
                    service_fn(|request: http::Request<hyper::body::Incoming>| async move {
                        let body = if request.uri().path() == "/stream" {
                            let first = futures_util::stream::once(async {
                                Ok::<_, Infallible>(Frame::data(Bytes::from_static(
                                    b"data: open\n\n",
                                )))
                            });
                            BodyExt::boxed(StreamBody::new(StreamExt::chain(
                                first,
                                futures_util::stream::pending(),
                            )))
                        } else {
                            Full::new(Bytes::from_static(b"{}"))
                                .map_err(|never| match never {})
                                .boxed()
                        };
                        Ok::<_, Infallible>(http::Response::new(body))
                    });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(max_streams)
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    (address, accepted_rx)
}

/// Longer than any healthy request here takes: past it, a request waits for something.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn request(address: SocketAddr, path: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{address}{path}"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// Reads the first data frame of an open stream.
async fn first_frame(response: http::Response<Incoming>) -> (Bytes, Incoming) {
    let mut body = response.into_body();
    loop {
        let frame = body.frame().await.expect("the stream ended").unwrap();
        if let Ok(data) = frame.into_data() {
            return (data, body);
        }
    }
}

#[tokio::test]
async fn streams_beyond_the_servers_limit_get_a_new_connection_instead_of_waiting() {
    let (address, mut accepted) = server(2).await;
    let pool = MultiplexedPool::default();
    let mut open = Vec::new();
    for _ in 0..5 {
        let sent = tokio::time::timeout(TIMEOUT, pool.send(request(address, "/stream")));
        let (response, lease) = sent.await.expect("a stream waited for a place").unwrap();
        let (data, body) = first_frame(response).await;
        assert_eq!(data, Bytes::from_static(b"data: open\n\n"));
        open.push((body, lease));
    }
    // Two streams per connection: five open streams need three connections.
    assert_eq!(pool.connection_count().await, 3);
    let mut connections = Vec::new();
    while let Ok(n) = accepted.try_recv() {
        connections.push(n);
    }
    assert_eq!(connections, vec![1, 2, 3]);

    // A stream that ends gives its place back: the next request reuses that connection.
    drop(open.remove(0));
    let (response, _lease) = pool.send(request(address, "/json")).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"{}"));
    assert_eq!(pool.connection_count().await, 3);
    assert!(accepted.try_recv().is_err(), "no fourth connection");
}

#[tokio::test]
async fn short_requests_share_one_connection() {
    let (address, mut accepted) = server(100).await;
    let pool = MultiplexedPool::default();
    let answers = futures_util::future::join_all((0..20).map(|_| {
        let pool = pool.clone();
        async move {
            let (response, _lease) = pool.send(request(address, "/json")).await?;
            let bytes = response.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error>>(bytes)
        }
    }))
    .await;
    for answer in answers {
        assert_eq!(answer.unwrap(), Bytes::from_static(b"{}"));
    }
    assert_eq!(pool.connection_count().await, 1);
    assert_eq!(accepted.try_recv().unwrap(), 1);
    assert!(accepted.try_recv().is_err());
}

#[tokio::test]
async fn a_server_that_is_not_there_is_an_error_that_names_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let pool = MultiplexedPool::default();
    let error = pool.send(request(address, "/json")).await.unwrap_err();
    assert!(error.to_string().contains(&address.to_string()), "{error}");
    assert_eq!(pool.connection_count().await, 0);
}

#[tokio::test]
async fn a_server_that_speaks_only_http1_is_refused_not_hung() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = service_fn(|_request| async {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    let pool = MultiplexedPool::default();
    let sent = tokio::time::timeout(TIMEOUT, pool.send(request(address, "/json")))
        .await
        .expect("an HTTP/1.1 server answers the HTTP/2 preface with an error, not silence");
    assert!(sent.is_err());
}
