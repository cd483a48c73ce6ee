//! Server plumbing every long-running subcommand shares (sidecar, operator, webhook): the Tokio
//! runtime, shutdown on signals, the hardened HTTP server ([`http`]: connection caps,
//! header-read, idle and body-read timeouts, graceful shutdown) and the admin endpoint (`/live`,
//! `/ready`, `/metrics`), HTTPS with certificates re-read on change ([`tls`]), the outbound TLS
//! configuration ([`tls_client`]) and the connection-affine worker threads that serve client
//! connections ([`workers`]). The operator and the webhook also share one server shell
//! ([`shell`]: cluster client, admin endpoint, HTTPS listener), their watch caches ([`watch`])
//! and their readiness, synced caches and a serving listener ([`readiness`]).
//! Nothing here knows what the server does.

pub mod admin;
pub mod cluster;
pub mod http;
pub mod readiness;
pub mod shell;
pub mod signals;
pub mod tls;
pub mod tls_client;
pub mod watch;
pub mod workers;

pub use admin::{Health, Readiness};
pub use signals::shutdown_on_signals;

/// A multi-threaded Tokio runtime with `worker_threads` workers (Tokio's default, one per
/// core, when `None`).
pub fn tokio_runtime(worker_threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n.max(1));
    }
    builder.enable_all().build()
}
