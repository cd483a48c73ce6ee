//! `lifeguard operator`.

use std::path::PathBuf;

use anyhow::Result;
use lifeguard::operator::OperatorConfig;

/// Flags of `lifeguard operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    /// kubeconfig file (default: the in-cluster configuration, then $KUBECONFIG).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The operator's own namespace: Lease, config Secrets, Events (default: the pod's, else
    /// lifeguard-system).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// HTTPS address of the sidecars' policy stream and POST /ssf/push.
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
    /// Operator configuration (YAML): approverKeys, securityEvents, bypassPrevention.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = lifeguard::telemetry::LogFormat::Text)]
    pub log_format: lifeguard::telemetry::LogFormat,
    #[command(flatten)]
    pub listener: super::listener::ListenerArgs,
}

pub fn run(args: &OperatorArgs) -> Result<()> {
    lifeguard::telemetry::init_logging(args.log_format);
    let config = OperatorConfig {
        kubeconfig: args.kubeconfig.clone(),
        namespace: args.namespace.clone(),
        listen: args.listen,
        tls_cert: args.tls_cert.clone(),
        tls_key: args.tls_key.clone(),
        admin: args.admin,
        config: args.config.clone(),
        limits: args
            .listener
            .limits(super::listener::OPERATOR_MAX_CONNECTIONS)?,
    };
    let runtime = lifeguard::runtime::tokio_runtime(None)?;
    runtime.block_on(async move {
        let shutdown = lifeguard::runtime::shutdown_on_signals();
        lifeguard::operator::run(config, shutdown).await
    })
}
