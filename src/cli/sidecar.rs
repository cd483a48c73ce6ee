//! `lifeguard sidecar`.

use anyhow::Result;
use lifeguard::sidecar::{PolicySourceConfig, SidecarConfig};

use super::SidecarArgs;

pub fn run(args: &SidecarArgs) -> Result<()> {
    lifeguard::telemetry::init_logging(args.log_format);
    let config = SidecarConfig {
        policy: PolicySourceConfig::File {
            path: args.policy.clone(),
            approver_keys: args.approver_keys.clone(),
        },
        upstream: args.upstream.clone(),
        listen: args.listen,
        ledger: args.ledger.clone(),
        admin: args.admin,
        audit_file: args.audit_file.clone(),
        upstream_timeout: args.upstream_timeout.get(),
        cancel_confirm_timeout: args.cancel_confirm_timeout.get(),
    };
    let runtime = lifeguard::runtime::tokio_runtime(args.worker_threads)?;
    runtime.block_on(async move {
        let shutdown = lifeguard::runtime::shutdown_on_signals();
        lifeguard::sidecar::run(config, shutdown).await
    })
}
