//! `lifeguard webhook`.

use std::path::PathBuf;

use anyhow::{Result, ensure};
use lifeguard::webhook::run::WebhookConfig;

use super::args::{AdminArgs, ClusterArgs, ListenerArgs, ServeArgs};

/// Flags of `lifeguard webhook`.
#[derive(Debug, clap::Args)]
#[command(
    mut_arg("namespace", |arg| arg.help(
        "The webhook's own namespace: never mutated, and where the approver-keys Secret lives \
         (default: the pod's, else lifeguard-system)"
    )),
    mut_arg("listen", |arg| arg.help("HTTPS address of POST /inject and POST /validate")),
)]
pub struct WebhookArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Injection settings (YAML): sidecar image and resources, control-plane URL and CA,
    /// approverKeys, defaults.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = lifeguard::telemetry::LogFormat::Text)]
    pub log_format: lifeguard::telemetry::LogFormat,
    #[command(flatten)]
    pub listener: ListenerArgs,
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
    // Kept to the end of the subcommand: dropping it flushes the last spans.
    let _traces = lifeguard::telemetry::init(args.log_format, "lifeguard-webhook")?;
    let config = WebhookConfig {
        shell: super::args::shell_config(
            &args.cluster,
            &args.serve,
            &args.admin,
            &args.listener,
            lifeguard::runtime::http::ServerLimits::default().max_connections,
        )?,
        config: args.config.clone(),
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
