//! Standalone mode: the policy comes from a file of CRD YAML, reloaded when it changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::identity::store::KeyRegistry;
use crate::policy::load_standalone;
use crate::telemetry::metrics::{ResultLabels, SidecarMetrics};

use super::state::ActivePolicy;

/// How often the file is checked. A new version is applied once two consecutive reads agree
/// (so a file caught half-written is never loaded), i.e. within two intervals plus the time to
/// load new keys: well inside the one-second promise.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Loads `path` once: compile it (any error refuses the whole file), load its issuers' keys and
/// the approver keys.
pub async fn load_policy_file(
    path: &Path,
    approver_keys: Option<&Path>,
    registry: &KeyRegistry,
) -> Result<ActivePolicy, String> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (effective, warnings) =
        load_standalone(&path.display().to_string(), &text, jiff::Timestamp::now())
            .map_err(|e| e.to_string())?;
    for warning in warnings {
        tracing::warn!(%warning, "policy warning");
    }
    let base_dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let keys = registry
        .prepare(&effective, &base_dir)
        .await
        .map_err(|e| format!("cannot load issuer keys: {e}"))?;
    registry.retain(&keys);
    let trust = match approver_keys {
        None => None,
        Some(file) => {
            let bytes = tokio::fs::read(file)
                .await
                .map_err(|e| format!("cannot read the approver keys {}: {e}", file.display()))?;
            Some(
                crate::exception::ApproverTrust::from_json(&bytes)
                    .map_err(|e| format!("approver keys {}: {e}", file.display()))?,
            )
        }
    };
    report_exceptions(&effective, trust.as_ref());
    Ok(ActivePolicy::new(effective, keys, trust))
}

/// Verifies every exception once at load and logs its state. Exceptions that do not verify stay
/// in the policy (the gate verifies again at every use and refuses them with the precise reason,
/// and a NotYetValid one becomes usable at `notBefore` without a reload).
fn report_exceptions(
    effective: &crate::policy::EffectivePolicy,
    trust: Option<&crate::exception::ApproverTrust>,
) {
    let empty = crate::exception::ApproverTrust::default();
    let trust = trust.unwrap_or(&empty);
    let now = jiff::Timestamp::now();
    for exception in &effective.exceptions {
        let v =
            crate::exception::verify(&exception.spec, &exception.exception.namespace, trust, now);
        if v.state == crate::api::ExceptionState::Active {
            tracing::info!(exception = %exception.exception, approver = ?v.approver, expires_at = %exception.spec.expires_at.0, "capability exception active");
        } else {
            tracing::warn!(exception = %exception.exception, state = ?v.state, reason = v.reason, "capability exception not in force");
        }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Retry interval for a version that failed to load for reasons outside the file (keys).
const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// Watches the policy file and publishes every good version. Compares contents rather than
/// modification times, so atomic replacements (Kubernetes' symlink swap, editors' rename) and
/// sub-second edits are all seen. A bad version is logged and ignored; the last good policy
/// stays in force. A version that failed is retried every few seconds (its keys may become
/// reachable).
pub async fn watch_policy_file(
    path: PathBuf,
    approver_keys: Option<PathBuf>,
    registry: Arc<KeyRegistry>,
    publish: watch::Sender<Option<Arc<ActivePolicy>>>,
    metrics: Arc<SidecarMetrics>,
    shutdown: CancellationToken,
) {
    let mut applied: Option<[u8; 32]> = None;
    // The digest seen on the previous poll: a version must be read twice in a row to count.
    let mut previous: Option<[u8; 32]> = None;
    let mut failed: Option<([u8; 32], std::time::Instant)> = None;
    let mut unreadable_reported = false;
    loop {
        let read = match tokio::fs::read(&path).await {
            // The approver keys count as part of the policy: a change to either reloads both.
            Ok(mut bytes) => match &approver_keys {
                Some(keys) => tokio::fs::read(keys).await.map(|k| {
                    bytes.extend_from_slice(&k);
                    bytes
                }),
                None => Ok(bytes),
            },
            Err(e) => Err(e),
        };
        match read {
            Ok(bytes) => {
                unreadable_reported = false;
                let current = digest(&bytes);
                let stable = previous == Some(current);
                previous = Some(current);
                let retry_due = match failed {
                    Some((d, at)) if d == current => at.elapsed() >= RETRY_INTERVAL,
                    _ => true,
                };
                if stable && applied != Some(current) && retry_due {
                    match load_policy_file(&path, approver_keys.as_deref(), &registry).await {
                        Ok(policy) => {
                            tracing::info!(policy = %policy.name, hash = %policy.hash, "policy loaded");
                            metrics
                                .policy_reloads
                                .get_or_create(&ResultLabels { result: "success" })
                                .inc();
                            metrics.policy_loaded.set(1);
                            publish.send_replace(Some(Arc::new(policy)));
                            applied = Some(current);
                            failed = None;
                        }
                        Err(error) => {
                            tracing::error!(
                                file = %path.display(),
                                %error,
                                "policy file rejected; the previous policy stays in force"
                            );
                            metrics
                                .policy_reloads
                                .get_or_create(&ResultLabels { result: "rejected" })
                                .inc();
                            failed = Some((current, std::time::Instant::now()));
                        }
                    }
                }
            }
            Err(e) => {
                previous = None;
                if !unreadable_reported {
                    tracing::error!(file = %path.display(), error = %e, "cannot read the policy file; the previous policy (if any) stays in force");
                    unreadable_reported = true;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}
