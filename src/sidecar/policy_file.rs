//! Standalone mode: the policy comes from a file of CRD YAML, reloaded when it changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::exception::{ApproverTrust, TrustError};
use crate::identity::store::{KeyLoadError, KeyRegistry};
use crate::policy::{StandaloneError, load_standalone};

use super::active_policy::ActivePolicy;
use super::policy_source::{PolicyPublisher, PolicySource};

/// Why a policy file version was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Compile(#[from] StandaloneError),
    #[error("cannot load issuer keys: {0}")]
    IssuerKeys(#[source] KeyLoadError),
    #[error("approver keys {path}: {source}")]
    ApproverKeys {
        path: PathBuf,
        #[source]
        source: TrustError,
    },
    #[error("cannot read the approver keys {path}: {source}")]
    ReadApproverKeys {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

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
) -> Result<ActivePolicy, PolicyFileError> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|source| PolicyFileError::Read {
            path: path.to_owned(),
            source,
        })?;
    let (effective, warnings) =
        load_standalone(&path.display().to_string(), &text, jiff::Timestamp::now())?;
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
        .map_err(PolicyFileError::IssuerKeys)?;
    registry.retain(&keys);
    let trust = match approver_keys {
        None => None,
        Some(file) => {
            let bytes = tokio::fs::read(file).await.map_err(|source| {
                PolicyFileError::ReadApproverKeys {
                    path: file.to_owned(),
                    source,
                }
            })?;
            Some(ApproverTrust::from_json(&bytes).map_err(|source| {
                PolicyFileError::ApproverKeys {
                    path: file.to_owned(),
                    source,
                }
            })?)
        }
    };
    let policy = ActivePolicy::new(effective, keys, trust);
    policy.report_exceptions();
    Ok(policy)
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Retry interval for a version that failed to load for reasons outside the file (keys).
const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The policy file as a [`PolicySource`].
pub struct FilePolicySource {
    path: PathBuf,
    approver_keys: Option<PathBuf>,
    registry: Arc<KeyRegistry>,
}

impl FilePolicySource {
    pub fn new(path: PathBuf, approver_keys: Option<PathBuf>, registry: Arc<KeyRegistry>) -> Self {
        Self {
            path,
            approver_keys,
            registry,
        }
    }
}

#[async_trait]
impl PolicySource for FilePolicySource {
    async fn run(self: Box<Self>, publisher: PolicyPublisher, shutdown: CancellationToken) {
        watch_policy_file(*self, publisher, shutdown).await;
    }
}

/// Watches the policy file and publishes every good version. Compares contents rather than
/// modification times, so atomic replacements (Kubernetes' symlink swap, editors' rename) and
/// sub-second edits are all seen. A bad version is logged and ignored; the last good policy
/// stays in force. A version that failed is retried every few seconds (its keys may become
/// reachable).
async fn watch_policy_file(
    source: FilePolicySource,
    publisher: PolicyPublisher,
    shutdown: CancellationToken,
) {
    let FilePolicySource {
        path,
        approver_keys,
        registry,
    } = source;
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
                            publisher.publish(policy);
                            applied = Some(current);
                            failed = None;
                        }
                        Err(error) => {
                            tracing::error!(
                                file = %path.display(),
                                %error,
                                "policy file rejected; the previous policy stays in force"
                            );
                            publisher.rejected();
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn load(path: &Path, approvers: Option<&Path>) -> Result<ActivePolicy, PolicyFileError> {
        let registry = KeyRegistry::new(CancellationToken::new());
        load_policy_file(path, approvers, &registry).await
    }

    #[tokio::test]
    async fn each_failure_keeps_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.yaml");
        let err = load(&missing, None)
            .await
            .err()
            .expect("missing file refused");
        assert!(matches!(err, PolicyFileError::Read { .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());

        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "kind: McpServerPolicy\napiVersion: lifeguard.dev/v1alpha1\nmetadata: {name: p, namespace: team-a}\nspec: {}\n").unwrap();
        let err = load(&bad, None)
            .await
            .err()
            .expect("invalid policy refused");
        assert!(matches!(err, PolicyFileError::Compile(_)), "{err}");

        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/standalone/policy.yaml");
        let approvers = dir.path().join("approvers.json");
        std::fs::write(&approvers, "not json").unwrap();
        let err = load(&demo, Some(&approvers))
            .await
            .err()
            .expect("bad approver keys refused");
        assert!(matches!(err, PolicyFileError::ApproverKeys { .. }), "{err}");
    }

    #[tokio::test]
    async fn the_demo_policy_loads_with_its_numbers() {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/standalone/policy.yaml");
        let policy = load(&demo, None).await.expect("demo policy loads");
        assert_eq!(policy.name, policy.effective.policy.to_string());
        assert_eq!(
            policy.tasks.is_some(),
            policy.effective.tasks.is_some(),
            "task numbers are derived once with the policy"
        );
    }
}
