//! `lifeguard operator`.

use std::path::PathBuf;

use anyhow::Result;
use lifeguard::operator::OperatorConfig;

use super::args::{AdminArgs, ClusterArgs, ListenerArgs, ServeArgs};

/// The operator's default `--max-connections`: each sidecar holds its stream and, while it
/// acknowledges, a second connection.
pub const OPERATOR_MAX_CONNECTIONS: usize = 8192;

/// Flags of `lifeguard operator`.
#[derive(Debug, clap::Args)]
#[command(
    mut_arg("namespace", |arg| arg.help(
        "The operator's own namespace: Lease, config Secrets, Events (default: the pod's, else \
         lifeguard-system)"
    )),
    mut_arg("listen", |arg| arg.help(
        "HTTPS address of the sidecars' policy stream and POST /ssf/push"
    )),
)]
pub struct OperatorArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Operator configuration (YAML): approverKeys, securityEvents, bypassPrevention.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = lifeguard::telemetry::LogFormat::Text)]
    pub log_format: lifeguard::telemetry::LogFormat,
    #[command(flatten)]
    pub listener: ListenerArgs,
}

pub fn run(args: &OperatorArgs) -> Result<()> {
    // Kept to the end of the subcommand: dropping it flushes the last spans.
    let _traces = lifeguard::telemetry::init(args.log_format, "lifeguard-operator")?;
    let config = OperatorConfig {
        shell: super::args::shell_config(
            &args.cluster,
            &args.serve,
            &args.admin,
            &args.listener,
            OPERATOR_MAX_CONNECTIONS,
        )?,
        config: args.config.clone(),
    };
    let runtime = lifeguard::runtime::tokio_runtime(None)?;
    runtime.block_on(async move {
        let shutdown = lifeguard::runtime::shutdown_on_signals();
        lifeguard::operator::run(config, shutdown).await
    })
}
