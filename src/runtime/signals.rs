//! Graceful shutdown on SIGINT or SIGTERM (what Kubernetes sends a container it stops).

use tokio_util::sync::CancellationToken;

/// A token cancelled when the process receives SIGINT or SIGTERM. Must be called inside a
/// Tokio runtime.
pub fn shutdown_on_signals() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        signals.cancel();
    });
    shutdown
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
