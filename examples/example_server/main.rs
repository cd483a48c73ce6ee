//! A small, hand-written MCP server (revision 2026-07-28, stateless Streamable HTTP) with the
//! Tasks extension (`io.modelcontextprotocol/tasks`) and `subscriptions/listen`.
//!
//! It is the demo and test peer for Lifeguard: an independent protocol implementation that
//! deliberately does NOT use the `lifeguard` library crate, so that a misunderstanding of the
//! protocol on one side is not silently shared by the other.
//!
//! It is deliberately weak: sequential, guessable task IDs (`task-1`, `task-2`, ...), no
//! authentication, one shared task space for everybody. Those are exactly the gaps the sidecar
//! is meant to close. See README.md next to this file.
//!
//! Run: `cargo run --example example_server -- --listen 127.0.0.1:3000`

mod cancels;
mod debug;
mod inputs;
mod jobs;
mod listen;
mod mcp;
mod rogue;
mod rpc;
mod store;
mod streaming;
mod tools;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use clap::Parser;

use crate::debug::RequestLog;
use crate::store::Store;

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(
    name = "example_server",
    about = "Lifeguard's example MCP server (2026-07-28, tasks + subscriptions/listen)"
)]
struct Args {
    /// Address to listen on; port 0 picks a free port (the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Close every subscriptions/listen stream after this many seconds (graceful end).
    #[arg(long)]
    max_listen_secs: Option<u64>,
    /// pollIntervalMs advertised on every task.
    #[arg(long, default_value_t = 500)]
    poll_interval_ms: u64,
}

/// Shared state of the server, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<Store>,
    pub requests: Arc<RequestLog>,
    pub max_listen: Option<Duration>,
    /// Number of open subscriptions/listen streams.
    pub listeners: Arc<AtomicUsize>,
    /// Flips to `true` when the server shuts down; listen streams then end gracefully.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// The log level set with `logging/setLevel` (none: the server sends no log messages).
    pub log_level: Arc<std::sync::Mutex<Option<String>>>,
    /// Requests `notifications/cancelled` can stop, by id.
    pub cancels: Arc<cancels::Cancels>,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let args = Args::parse();
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);

    let state = AppState {
        store: Arc::new(Store::new(args.poll_interval_ms)),
        requests: Arc::new(RequestLog::default()),
        max_listen: args.max_listen_secs.map(Duration::from_secs),
        listeners: Arc::new(AtomicUsize::new(0)),
        shutdown: shutdown_rx,
        log_level: Arc::default(),
        cancels: Arc::default(),
    };
    let app = router(state);

    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    {
        // Tests wait for exactly this line.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://{addr}/mcp");
        let _ = out.flush();
    }
    tracing::info!(%addr, "example MCP server started");

    let shutdown = async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        let _ = shutdown_tx.send(true);
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        eprintln!("server error: {e}");
        std::process::exit(1);
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/mcp",
            post(mcp::post_mcp)
                .get(mcp::method_not_allowed)
                .delete(mcp::method_not_allowed),
        )
        .route("/_example/rows", get(debug::rows))
        .route("/_example/requests", get(debug::requests))
        .route("/_example/tasks", get(debug::tasks))
        .route("/_example/listeners", get(debug::listeners))
        .route("/_example/emit", post(debug::emit))
        .route("/_example/cancellations", get(cancels::cancellations))
        .route("/_example/rogue/requests", get(rogue::requests))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            rogue::intercept,
        ))
        .with_state(state)
}
