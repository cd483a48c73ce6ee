//! The admin endpoint: liveness, readiness and Prometheus metrics, served on an address of its
//! own so it can stay inside the pod network while the main port faces clients.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use http::header::{self, HeaderValue};
use tokio_util::sync::CancellationToken;

/// Whether a server can take traffic, with a one-line reason either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready(String),
    NotReady(String),
}

/// What the admin endpoint asks of the server it reports on.
pub trait Health: Send + Sync + 'static {
    /// `/ready`: 200 with the text when ready, 503 otherwise.
    fn readiness(&self) -> Readiness;
    /// `/metrics`: the OpenMetrics text exposition.
    fn metrics(&self) -> String;
}

/// `/live`, `/ready`, `/metrics` for `health`; `/healthz` and `/readyz` are the same checks
/// under the names Kubernetes components use (the operator and webhook document those).
pub fn router(health: Arc<dyn Health>) -> Router {
    Router::new()
        .route("/live", get(|| async { "ok" }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(health)
}

async fn ready(State(health): State<Arc<dyn Health>>) -> Response {
    match health.readiness() {
        Readiness::Ready(text) => (StatusCode::OK, text).into_response(),
        Readiness::NotReady(text) => (StatusCode::SERVICE_UNAVAILABLE, text).into_response(),
    }
}

async fn metrics(State(health): State<Arc<dyn Health>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        health.metrics(),
    )
        .into_response()
}

/// Binds `addr` and serves the admin endpoint in the background until `shutdown`; returns the
/// bound address (useful with port 0).
pub async fn spawn(
    addr: SocketAddr,
    health: Arc<dyn Health>,
    shutdown: CancellationToken,
) -> Result<SocketAddr> {
    spawn_with(addr, health, Router::new(), shutdown).await
}

/// [`spawn`], also serving the routes of `extra` (paths other than the ones above).
pub async fn spawn_with(
    addr: SocketAddr,
    health: Arc<dyn Health>,
    extra: Router,
    shutdown: CancellationToken,
) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the admin address {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!("lifeguard: admin on http://{local}");
    tokio::spawn(async move {
        // Default limits; its connection metrics are not exported (the port is not public).
        let limits = super::http::ServerLimits::default();
        let metrics = super::http::ConnectionMetrics::default();
        let routes = router(health).merge(extra);
        let served = super::http::serve(listener, routes, limits, metrics, shutdown).await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin server failed");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct Fake(AtomicBool);

    impl Health for Fake {
        fn readiness(&self) -> Readiness {
            if self.0.load(Ordering::SeqCst) {
                Readiness::Ready("ready: yes".into())
            } else {
                Readiness::NotReady("not yet".into())
            }
        }
        fn metrics(&self) -> String {
            "# EOF\n".into()
        }
    }

    #[tokio::test]
    async fn serves_liveness_readiness_and_metrics() {
        let fake = Arc::new(Fake(AtomicBool::new(false)));
        let shutdown = CancellationToken::new();
        let addr = spawn(
            "127.0.0.1:0".parse().unwrap(),
            fake.clone(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        let get = |path: &'static str| async move {
            let r = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        };
        assert_eq!(get("/live").await, (200, "ok".into()));
        assert_eq!(get("/ready").await, (503, "not yet".into()));
        fake.0.store(true, Ordering::SeqCst);
        assert_eq!(get("/ready").await, (200, "ready: yes".into()));
        assert_eq!(get("/metrics").await, (200, "# EOF\n".into()));
        shutdown.cancel();
    }
}
