//! The Rust floor of one proxy hop, for `sidecar_bench --bare-hop`: a reverse proxy on hyper
//! that forwards every request as it came to one upstream, over pooled keep-alive
//! connections, and streams the answer back. No token check, no policy, no ledger, no audit,
//! no logs: what any Rust proxy in front of an MCP server costs before it decides anything.
//!
//! `bare_proxy --listen 127.0.0.1:0 --upstream http://127.0.0.1:8080` prints
//! `bare_proxy: listening on http://ADDR/mcp` once it accepts connections.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;
use http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Parser)]
struct Args {
    /// Address to accept connections on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The server every request goes to (scheme and authority; paths are kept).
    #[arg(long)]
    upstream: Uri,
    /// Runtime worker threads (default: one per core, as the sidecar's).
    #[arg(long)]
    workers: Option<usize>,
}

type Body = Either<Incoming, Full<Bytes>>;

fn main() -> Result<()> {
    let args = Args::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.workers {
        runtime.worker_threads(n);
    }
    runtime
        .enable_all()
        .build()
        .context("building the runtime")?
        .block_on(serve(args))
}

async fn serve(args: Args) -> Result<()> {
    let upstream = args.upstream;
    let authority = upstream
        .authority()
        .context("--upstream needs a host and port")?
        .clone();
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!(
        "bare_proxy: listening on http://{}/mcp",
        listener.local_addr()?
    );
    loop {
        let (stream, _) = listener.accept().await.context("accepting")?;
        let _ = stream.set_nodelay(true);
        let (client, authority) = (client.clone(), authority.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                forward(client.clone(), authority.clone(), request)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The request to the upstream with its scheme and authority, the answer back unchanged; 502
/// when the upstream cannot be reached.
async fn forward(
    client: Client<HttpConnector, Incoming>,
    authority: http::uri::Authority,
    request: Request<Incoming>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let uri = Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query(path)
        .build();
    let Ok(uri) = uri else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    parts.uri = uri;
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        parts.headers.insert(header::HOST, host);
    }
    parts.headers.remove(header::CONNECTION);
    match client.request(Request::from_parts(parts, body)).await {
        Ok(answer) => Ok(answer.map(Either::Left)),
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    *response.status_mut() = code;
    response
}
