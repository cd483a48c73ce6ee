//! `lifeguard webhook`.

use std::path::PathBuf;

use anyhow::{Result, ensure};
use lifeguard::webhook::run::WebhookConfig;

/// Flags of `lifeguard webhook`.
#[derive(Debug, clap::Args)]
pub struct WebhookArgs {
    /// kubeconfig file (default: the in-cluster configuration, then $KUBECONFIG).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The webhook's own namespace: never mutated, and where the approver-keys Secret lives
    /// (default: the pod's, else lifeguard-system).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// HTTPS address of POST /inject and POST /validate.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443")]
    pub listen: std::net::SocketAddr,
    /// Serving certificate (PEM chain) for --listen; re-read when the file changes.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// Private key (PEM) of --tls-cert; re-read when the file changes.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// Plain HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    pub admin: std::net::SocketAddr,
    /// Injection settings (YAML): sidecar image and resources, control-plane URL and CA,
    /// approverKeys, defaults.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = lifeguard::telemetry::LogFormat::Text)]
    pub log_format: lifeguard::telemetry::LogFormat,
    #[command(flatten)]
    pub listener: super::listener::ListenerArgs,
    /// Largest AdmissionReview body read, in bytes (a larger one is answered 413 before it is
    /// read). The API server caps an object at 3 MiB and a review carries the new and the old
    /// object.
    #[arg(long, value_name = "BYTES", default_value_t = lifeguard::webhook::server::MAX_REVIEW_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(1024..))]
    pub max_review_bytes: u64,
    /// Memory for AdmissionReview bodies being read at once, in bytes: each review reserves its
    /// Content-Length first and waits (up to --body-read-timeout) for room. At least
    /// --max-review-bytes.
    #[arg(long, value_name = "BYTES", default_value_t = lifeguard::webhook::server::REVIEW_BUFFER_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(1024..))]
    pub review_buffer_bytes: u64,
}

pub fn run(args: &WebhookArgs) -> Result<()> {
    lifeguard::telemetry::init_logging(args.log_format);
    let config = WebhookConfig {
        kubeconfig: args.kubeconfig.clone(),
        namespace: args.namespace.clone(),
        listen: args.listen,
        tls_cert: args.tls_cert.clone(),
        tls_key: args.tls_key.clone(),
        admin: args.admin,
        config: args.config.clone(),
        limits: args
            .listener
            .limits(lifeguard::runtime::http::ServerLimits::default().max_connections)?,
        max_review_bytes: usize::try_from(args.max_review_bytes)?,
        review_buffer_bytes: usize::try_from(args.review_buffer_bytes)?,
    };
    ensure!(
        args.review_buffer_bytes >= args.max_review_bytes,
        "--review-buffer-bytes ({}) must be at least --max-review-bytes ({})",
        args.review_buffer_bytes,
        args.max_review_bytes
    );
    let runtime = lifeguard::runtime::tokio_runtime(None)?;
    runtime.block_on(async move {
        let shutdown = lifeguard::runtime::shutdown_on_signals();
        lifeguard::webhook::run::run(config, shutdown).await
    })
}
