//! The server shell the operator and the webhook share: their Kubernetes client and own
//! namespace, the admin endpoint, and the HTTPS listener (`--listen`) with its reloading
//! certificate and connection limits. Each component brings its routes, caches and readiness
//! ([`super::readiness`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::admin::Health;
use super::http::{ConnectionMetrics, ServerLimits};
use super::tls::{ReloadingCertificate, serve_tls};

/// What a control-plane server takes besides its own settings: where its cluster is, where it
/// serves, where its admin endpoint is (the `ClusterArgs`, `ServeArgs`, `AdminArgs` and
/// listener limits of its command line).
#[derive(Clone, Debug)]
pub struct ShellConfig {
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub admin: SocketAddr,
    /// Limits of the `--listen` port.
    pub limits: ServerLimits,
}

/// A started shell: the serving certificate loaded and the cluster client made.
pub struct Shell {
    pub client: kube::Client,
    /// The component's own namespace (see [`super::cluster::own_namespace`]).
    pub namespace: String,
    certificate: Arc<ReloadingCertificate>,
    listen: SocketAddr,
    admin: SocketAddr,
    limits: ServerLimits,
}

impl Shell {
    /// Loads the serving certificate, then connects to the cluster.
    pub async fn start(config: ShellConfig) -> Result<Self> {
        let certificate = Arc::new(
            ReloadingCertificate::load(&config.tls_cert, &config.tls_key)
                .context("loading the serving certificate (--tls-cert, --tls-key)")?,
        );
        let namespace = super::cluster::own_namespace(config.namespace.as_deref());
        let client = super::cluster::client(config.kubeconfig.as_deref()).await?;
        Ok(Self {
            client,
            namespace,
            certificate,
            listen: config.listen,
            admin: config.admin,
            limits: config.limits,
        })
    }

    /// Serves the admin endpoint (`--admin`) for `health` in the background until `shutdown`.
    pub async fn spawn_admin(
        &self,
        health: Arc<dyn Health>,
        shutdown: &CancellationToken,
    ) -> Result<SocketAddr> {
        super::admin::spawn(self.admin, health, shutdown.clone())
            .await
            .context("starting the admin endpoint")
    }

    /// Binds `--listen`; serve it with [`Shell::serve`].
    pub async fn bind(&self) -> Result<TcpListener> {
        TcpListener::bind(self.listen)
            .await
            .with_context(|| format!("binding --listen {}", self.listen))
    }

    /// The limits `--listen` is served under.
    pub fn limits(&self) -> &ServerLimits {
        &self.limits
    }

    /// Serves `router` over TLS on `listener` (from [`Shell::bind`]) under `limits` until
    /// `shutdown`; refusals and timeouts are counted in `connections`.
    pub fn serve(
        &self,
        listener: TcpListener,
        router: Router,
        limits: ServerLimits,
        connections: ConnectionMetrics,
        shutdown: CancellationToken,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
        serve_tls(
            listener,
            router,
            self.certificate.clone(),
            limits,
            connections,
            shutdown,
        )
    }
}
