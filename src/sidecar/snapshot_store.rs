//! The last snapshot put in force, kept next to the ledger, so a sidecar restarted while the
//! operator is down enforces the last known policy instead of failing closed until the operator
//! is back.
//!
//! The file is the snapshot as it came over the wire (JSON), written atomically (temporary
//! file, fsync, rename, fsync of the directory) with mode 0600.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::distribution::Snapshot;

/// Where the snapshot of a sidecar whose ledger file is `ledger` is kept:
/// `<ledger's directory>/<ledger's file name>.snapshot.json`.
/// The snapshot's file name in a `--state-dir`.
pub const FILE_NAME: &str = "snapshot.json";

pub fn path_beside(ledger: &Path) -> PathBuf {
    let mut name = ledger
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "ledger".into());
    name.push(".snapshot.json");
    ledger.with_file_name(name)
}

/// Why a persisted snapshot was not used or not written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotStoreError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a snapshot: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path} holds the snapshot of pod {found}, not of this pod {expected}; ignoring it \
         (was the ledger volume moved between pods?)"
    )]
    OtherPod {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot store's background task failed: {0}")]
    Join(String),
}

/// The persisted snapshot of one pod.
#[derive(Clone, Debug)]
pub struct SnapshotStore {
    path: PathBuf,
    pod_namespace: String,
    pod_name: String,
}

impl SnapshotStore {
    pub fn new(path: PathBuf, pod_namespace: String, pod_name: String) -> Self {
        Self {
            path,
            pod_namespace,
            pod_name,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The persisted snapshot of this pod; `Ok(None)` when there is none yet.
    pub async fn load(&self) -> Result<Option<Snapshot>, SnapshotStoreError> {
        let bytes = match tokio::fs::read(&self.path).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(SnapshotStoreError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let snapshot: Snapshot =
            serde_json::from_slice(&bytes).map_err(|source| SnapshotStoreError::Parse {
                path: self.path.clone(),
                source,
            })?;
        if snapshot.pod.namespace != self.pod_namespace || snapshot.pod.name != self.pod_name {
            return Err(SnapshotStoreError::OtherPod {
                path: self.path.clone(),
                found: format!("{}/{}", snapshot.pod.namespace, snapshot.pod.name),
                expected: format!("{}/{}", self.pod_namespace, self.pod_name),
            });
        }
        Ok(Some(snapshot))
    }

    /// Replaces the persisted snapshot with `snapshot`, atomically.
    pub async fn save(&self, snapshot: &Snapshot) -> Result<(), SnapshotStoreError> {
        let bytes = serde_json::to_vec(snapshot).map_err(|e| SnapshotStoreError::Write {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            write_atomically(&path, &bytes).map_err(|source| SnapshotStoreError::Write {
                path: path.clone(),
                source,
            })
        })
        .await
        .map_err(|e| SnapshotStoreError::Join(e.to_string()))?
    }
}

/// Writes `bytes` to a temporary file beside `path` (mode 0600), flushes it to disk, renames it
/// over `path` and flushes the directory, so a crash leaves either the old or the new file.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temp_name = path.file_name().unwrap_or_default().to_os_string();
    temp_name.push(".tmp");
    let temp = path.with_file_name(temp_name);
    // A leftover of an interrupted write is stale by definition.
    match std::fs::remove_file(&temp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, path)?;
    if let Some(dir) = path.parent() {
        // Makes the rename durable; not every platform can open a directory, and the data is
        // already safe in the file.
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(dir) = std::fs::File::open(dir) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distribution::PodIdentity;

    fn snapshot(namespace: &str, name: &str, version: u64) -> Snapshot {
        Snapshot {
            session: "s1".into(),
            version,
            pod: PodIdentity {
                namespace: namespace.into(),
                name: name.into(),
                uid: "u1".into(),
                service_account: "reports".into(),
            },
            policy: Some(crate::policy::testing::with_tasks("    enabled: true\n")),
            approver_keys: Some(serde_json::json!({"keys": []})),
            issued_at: jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        }
    }

    #[test]
    fn the_snapshot_lives_beside_the_ledger() {
        assert_eq!(
            path_beside(Path::new("/var/lib/lifeguard/ledger.db")),
            Path::new("/var/lib/lifeguard/ledger.db.snapshot.json")
        );
        assert_eq!(
            path_beside(Path::new("ledger.db")),
            Path::new("ledger.db.snapshot.json")
        );
    }

    #[tokio::test]
    async fn a_saved_snapshot_loads_back_and_replaces_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(
            path_beside(&dir.path().join("ledger.db")),
            "team-a".into(),
            "reports-0".into(),
        );
        assert!(store.load().await.unwrap().is_none(), "nothing saved yet");
        store
            .save(&snapshot("team-a", "reports-0", 1))
            .await
            .unwrap();
        let second = snapshot("team-a", "reports-0", 2);
        store.save(&second).await.unwrap();
        assert_eq!(store.load().await.unwrap(), Some(second));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(store.path())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(leftovers, vec!["ledger.db.snapshot.json".to_owned()]);
    }

    #[tokio::test]
    async fn the_snapshot_of_another_pod_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db.snapshot.json");
        let other = SnapshotStore::new(path.clone(), "team-a".into(), "reports-1".into());
        other
            .save(&snapshot("team-a", "reports-1", 5))
            .await
            .unwrap();
        let store = SnapshotStore::new(path, "team-a".into(), "reports-0".into());
        let err = store.load().await.unwrap_err();
        assert!(
            matches!(err, SnapshotStoreError::OtherPod { ref found, .. } if found == "team-a/reports-1"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_damaged_file_is_an_error_not_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db.snapshot.json");
        std::fs::write(&path, "{\"type\": \"snap").unwrap();
        let store = SnapshotStore::new(path, "team-a".into(), "reports-0".into());
        assert!(matches!(
            store.load().await,
            Err(SnapshotStoreError::Parse { .. })
        ));
    }
}
