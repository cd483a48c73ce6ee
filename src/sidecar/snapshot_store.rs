//! The last snapshot put in force, kept next to the ledger, so a sidecar restarted while the
//! operator is down enforces the last known policy instead of failing closed until the operator
//! is back.
//!
//! The file is written atomically (temporary file, fsync, rename, fsync of the directory) with
//! mode 0600, and it is *authenticated*: `{"mac": HEX, "generation": N, "snapshot": SNAPSHOT}`,
//! where `mac` is HMAC-SHA256, under a [`SnapshotKey`] kept in the ledger (never in the state
//! directory), of a domain tag, the generation and the snapshot's exact bytes. Whoever can write
//! the state directory but not read the ledger's secrets (another container sharing the volume,
//! a file restored from elsewhere, a hand edit) cannot produce a file this sidecar accepts: a
//! file whose MAC does not verify, or without one (written before the MAC existed, or before
//! the generation), is refused loudly and the sidecar fails closed until the operator answers.
//! So an edit can never lift a revocation the snapshot carried.
//!
//! The generation tells the last file written from an older one this same sidecar wrote (a
//! restored backup of the state directory), which the MAC alone cannot: every save first
//! advances a ledger counter ([`SnapshotGenerations`], one per replica) and writes its new
//! value into the file; a load accepts only a file whose generation equals the counter. An
//! older file is refused like an unauthenticated one. A crash between advancing the counter
//! and writing the file leaves a file one generation behind: it is refused too, and the
//! sidecar fails closed until the operator answers (the safe side). The counter lives in the
//! ledger, so this holds as long as the ledger is not rolled back with the file: restoring an
//! SQLite ledger file together with its snapshot restores a matching older pair.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::Sha256;

use crate::distribution::Snapshot;
use crate::ledger::{LedgerError, TaskLedger};

/// Separates this MAC from every other use of HMAC in Lifeguard.
/// v2: the MAC covers the generation too (v1 files, without one, are refused).
const MAC_DOMAIN: &[u8] = b"lifeguard persisted policy snapshot v2\0";

/// The key that authenticates the persisted snapshot (a ledger secret).
#[derive(Clone)]
pub struct SnapshotKey([u8; 32]);

impl SnapshotKey {
    pub fn new(key: [u8; 32]) -> Self {
        Self(key)
    }

    fn mac(&self, generation: u64, snapshot: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(MAC_DOMAIN);
        mac.update(&generation.to_be_bytes());
        mac.update(snapshot);
        mac
    }
}

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotKey(..)")
    }
}

/// The ledger counter that numbers the saves of one replica's snapshot.
#[derive(Clone)]
pub struct SnapshotGenerations {
    ledger: Arc<dyn TaskLedger>,
    name: String,
}

impl SnapshotGenerations {
    /// The counter of `replica` (the ledger scope's replica: on a shared ledger each replica
    /// keeps a file of its own).
    pub fn new(ledger: Arc<dyn TaskLedger>, replica: &str) -> Self {
        Self {
            ledger,
            name: format!("policy-snapshot-generation/{replica}"),
        }
    }
}

impl std::fmt::Debug for SnapshotGenerations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotGenerations")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The file as written.
#[derive(Serialize)]
struct Envelope<'a> {
    mac: String,
    generation: u64,
    snapshot: &'a RawValue,
}

/// The file as read: the snapshot's exact bytes, to check the MAC over.
#[derive(Deserialize)]
struct ReadEnvelope {
    mac: String,
    generation: u64,
    snapshot: Box<RawValue>,
}

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
        "{path} is not authenticated by this sidecar's ledger key (edited, written by someone \
         else, or by a Lifeguard version before persisted snapshots were authenticated); \
         ignoring it and refusing every request until the control plane sends a snapshot"
    )]
    NotAuthenticated { path: PathBuf },
    #[error(
        "{path} is generation {found} of this sidecar's snapshot but the ledger's last is \
         {expected} (an older copy restored, or a crash between numbering and writing it); \
         ignoring it and refusing every request until the control plane sends a snapshot"
    )]
    StaleGeneration {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("cannot read or advance the snapshot's generation in the ledger: {0}")]
    Ledger(#[source] LedgerError),
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
    key: SnapshotKey,
    generations: SnapshotGenerations,
}

impl SnapshotStore {
    pub fn new(
        path: PathBuf,
        pod_namespace: String,
        pod_name: String,
        key: SnapshotKey,
        generations: SnapshotGenerations,
    ) -> Self {
        Self {
            path,
            pod_namespace,
            pod_name,
            key,
            generations,
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
        let not_authenticated = || SnapshotStoreError::NotAuthenticated {
            path: self.path.clone(),
        };
        let envelope: ReadEnvelope =
            serde_json::from_slice(&bytes).map_err(|_| not_authenticated())?;
        let tag = hex::decode(&envelope.mac).map_err(|_| not_authenticated())?;
        let raw = envelope.snapshot.get().as_bytes();
        self.key
            .mac(envelope.generation, raw)
            .verify_slice(&tag)
            .map_err(|_| not_authenticated())?;
        let expected = self
            .generations
            .ledger
            .counter(&self.generations.name)
            .await
            .map_err(SnapshotStoreError::Ledger)?;
        if envelope.generation != expected {
            return Err(SnapshotStoreError::StaleGeneration {
                path: self.path.clone(),
                found: envelope.generation,
                expected,
            });
        }
        let snapshot: Snapshot =
            serde_json::from_slice(raw).map_err(|source| SnapshotStoreError::Parse {
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

    /// Replaces the persisted snapshot with `snapshot`, atomically, under the next generation
    /// (advanced in the ledger first: from then on, every earlier file is refused).
    pub async fn save(&self, snapshot: &Snapshot) -> Result<(), SnapshotStoreError> {
        let fail = |e: serde_json::Error| SnapshotStoreError::Write {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        };
        let raw = serde_json::value::to_raw_value(snapshot).map_err(fail)?;
        let generation = self
            .generations
            .ledger
            .advance_counter(&self.generations.name)
            .await
            .map_err(SnapshotStoreError::Ledger)?;
        let mac = hex::encode(
            self.key
                .mac(generation, raw.get().as_bytes())
                .finalize()
                .into_bytes(),
        );
        let bytes = serde_json::to_vec(&Envelope {
            mac,
            generation,
            snapshot: &raw,
        })
        .map_err(fail)?;
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

    fn key() -> SnapshotKey {
        SnapshotKey::new([7; 32])
    }

    /// A ledger in `dir` and the generation counter of replica `reports-0` in it.
    fn generations(dir: &Path) -> SnapshotGenerations {
        let ledger = crate::ledger::SqliteLedger::open(&dir.join("ledger.db")).unwrap();
        SnapshotGenerations::new(Arc::new(ledger), "reports-0")
    }

    fn store(path: PathBuf, pod: &str, key: SnapshotKey, g: &SnapshotGenerations) -> SnapshotStore {
        SnapshotStore::new(path, "team-a".into(), pod.into(), key, g.clone())
    }

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
            revocation_traces: Default::default(),
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
        let g = generations(dir.path());
        let store = store(
            path_beside(&dir.path().join("ledger.db")),
            "reports-0",
            key(),
            &g,
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
        assert!(
            leftovers.iter().all(|f| !f.ends_with(".tmp")),
            "{leftovers:?}"
        );
    }

    #[tokio::test]
    async fn the_snapshot_of_another_pod_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db.snapshot.json");
        let g = generations(dir.path());
        let other = store(path.clone(), "reports-1", key(), &g);
        other
            .save(&snapshot("team-a", "reports-1", 5))
            .await
            .unwrap();
        let store = store(path, "reports-0", key(), &g);
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
        let store = store(path, "reports-0", key(), &generations(dir.path()));
        assert!(matches!(
            store.load().await,
            Err(SnapshotStoreError::NotAuthenticated { .. })
        ));
    }

    #[tokio::test]
    async fn an_edited_forged_or_unauthenticated_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db.snapshot.json");
        let g = generations(dir.path());
        let store = store(path.clone(), "reports-0", key(), &g);
        let genuine = snapshot("team-a", "reports-0", 5);
        store.save(&genuine).await.unwrap();
        assert_eq!(store.load().await.unwrap(), Some(genuine.clone()));
        let written = std::fs::read_to_string(&path).unwrap();

        let refused = async |text: String| {
            std::fs::write(&path, text).unwrap();
            matches!(
                store.load().await,
                Err(SnapshotStoreError::NotAuthenticated { .. })
            )
        };
        // An edit inside the authenticated snapshot (here: its version).
        assert!(refused(written.replace("\"version\":5", "\"version\":6")).await);
        // The plain snapshot of earlier versions, without a MAC.
        assert!(refused(serde_json::to_string(&genuine).unwrap()).await);
        // An edit of the generation.
        assert!(refused(written.replace("\"generation\":1", "\"generation\":7")).await);
        // A file of the previous format (v1: no generation, the MAC over the snapshot alone).
        let mut v1 = <Hmac<Sha256> as KeyInit>::new_from_slice(&[7; 32]).unwrap();
        v1.update(b"lifeguard persisted policy snapshot v1\0");
        let raw = serde_json::to_string(&genuine).unwrap();
        v1.update(raw.as_bytes());
        let v1_mac = hex::encode(v1.finalize().into_bytes());
        assert!(refused(format!("{{\"mac\":\"{v1_mac}\",\"snapshot\":{raw}}}")).await);
        // A file authenticated under another key.
        let other = store_of(path.clone(), SnapshotKey::new([8; 32]), &g);
        other.save(&genuine).await.unwrap();
        assert!(matches!(
            store.load().await,
            Err(SnapshotStoreError::NotAuthenticated { .. })
        ));
    }

    fn store_of(path: PathBuf, key: SnapshotKey, g: &SnapshotGenerations) -> SnapshotStore {
        store(path, "reports-0", key, g)
    }

    #[tokio::test]
    async fn an_older_genuine_file_or_one_behind_after_a_crash_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db.snapshot.json");
        let g = generations(dir.path());
        let store = store(path.clone(), "reports-0", key(), &g);
        store
            .save(&snapshot("team-a", "reports-0", 1))
            .await
            .unwrap();
        let older = std::fs::read(&path).unwrap();
        let newer = snapshot("team-a", "reports-0", 2);
        store.save(&newer).await.unwrap();
        assert_eq!(store.load().await.unwrap(), Some(newer.clone()));

        // A restored copy of the first file: genuine, but generation 1 of 2.
        let latest = std::fs::read(&path).unwrap();
        std::fs::write(&path, &older).unwrap();
        let err = store.load().await.unwrap_err();
        assert!(
            matches!(
                err,
                SnapshotStoreError::StaleGeneration {
                    found: 1,
                    expected: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("ledger.db.snapshot.json"), "{err}");

        // The generation advanced but the file was never written (a crash in between).
        std::fs::write(&path, &latest).unwrap();
        assert_eq!(store.load().await.unwrap(), Some(newer));
        g.ledger.advance_counter(&g.name).await.unwrap();
        assert!(matches!(
            store.load().await,
            Err(SnapshotStoreError::StaleGeneration {
                found: 2,
                expected: 3,
                ..
            })
        ));
    }
}
