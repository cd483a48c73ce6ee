//! `lifeguard sidecar`.

use anyhow::Result;
use lifeguard::sidecar::SidecarConfig;
use tokio_util::sync::CancellationToken;

use super::SidecarArgs;

pub fn run(args: &SidecarArgs) -> Result<()> {
    lifeguard::telemetry::init_logging(args.log_format);
    let config = SidecarConfig {
        policy_file: args.policy.clone(),
        upstream: args.upstream.clone(),
        listen: args.listen,
        ledger: args.ledger.clone(),
        admin: args.admin,
        audit_file: args.audit_file.clone(),
        upstream_timeout: args.upstream_timeout.get(),
        approver_keys: args.approver_keys.clone(),
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.worker_threads {
        builder.worker_threads(n.max(1));
    }
    let runtime = builder.enable_all().build()?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            signals.cancel();
        });
        lifeguard::sidecar::run(config, shutdown).await
    })
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
