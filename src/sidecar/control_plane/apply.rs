//! What a snapshot means to the sidecar: the [`ActivePolicy`] it puts in force, and the
//! [`Ack`] owed once its revocations are applied.

use std::path::Path;

use crate::distribution::{Ack, RevocationApplied, Snapshot};
use crate::exception::{ApproverTrust, TrustError};
use crate::identity::store::{KeyLoadError, KeyRegistry};
use crate::policy::KeySource;

use super::super::active_policy::ActivePolicy;
use super::super::policy_source::RevocationProgress;

/// Why a snapshot was not put in force (the previous one stays).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("the snapshot is for pod {found}, not for this pod {expected}")]
    OtherPod { found: String, expected: String },
    #[error(
        "issuer {issuer} names a jwksFile; in a cluster, keys come from jwksUri (a file of the \
         operator's machine means nothing here)"
    )]
    KeyFile { issuer: String },
    #[error("cannot load issuer keys: {0}")]
    IssuerKeys(#[source] KeyLoadError),
    #[error("the snapshot's approver keys: {0}")]
    ApproverKeys(#[source] TrustError),
}

impl SnapshotError {
    /// Whether trying the same snapshot again later may succeed (keys may become reachable).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::IssuerKeys(_))
    }
}

/// Refuses a snapshot the operator addressed to another pod.
pub fn check_pod(snapshot: &Snapshot, namespace: &str, name: &str) -> Result<(), SnapshotError> {
    if snapshot.pod.namespace == namespace && snapshot.pod.name == name {
        Ok(())
    } else {
        Err(SnapshotError::OtherPod {
            found: format!("{}/{}", snapshot.pod.namespace, snapshot.pod.name),
            expected: format!("{namespace}/{name}"),
        })
    }
}

/// The policy a snapshot puts in force, with its issuers' keys loaded (so it is usable as soon
/// as it is published) and its approver trust. `Ok(None)`: the snapshot carries no policy.
pub async fn build_policy(
    snapshot: &Snapshot,
    registry: &KeyRegistry,
) -> Result<Option<ActivePolicy>, SnapshotError> {
    let Some(effective) = snapshot.policy.clone() else {
        return Ok(None);
    };
    if let Some(issuer) = effective
        .issuers
        .iter()
        .find(|i| matches!(i.keys, KeySource::JwksFile(_)))
    {
        return Err(SnapshotError::KeyFile {
            issuer: issuer.issuer.clone(),
        });
    }
    // No key file can be named (checked above), so no path is ever resolved against this.
    let keys = registry
        .prepare(&effective, Path::new("/"))
        .await
        .map_err(SnapshotError::IssuerKeys)?;
    registry.retain(&keys);
    let trust = match &snapshot.approver_keys {
        None => None,
        Some(jwks) => {
            // Serializing a JSON value cannot fail.
            let bytes = serde_json::to_vec(jwks).unwrap_or_default();
            Some(ApproverTrust::from_json(&bytes).map_err(SnapshotError::ApproverKeys)?)
        }
    };
    let policy = ActivePolicy::new(effective, keys, trust)
        .with_revocation_traces(snapshot.revocation_traces.clone());
    policy.report_exceptions();
    Ok(Some(policy))
}

/// A snapshot in force whose ack is owed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwedAck {
    pub session: String,
    pub version: u64,
    pub policy_hash: Option<String>,
}

impl OwedAck {
    pub fn of(snapshot: &Snapshot) -> Self {
        Self {
            session: snapshot.session.clone(),
            version: snapshot.version,
            policy_hash: snapshot.policy_hash(),
        }
    }

    /// The ack, once the revocation applier has applied every revocation of this snapshot's
    /// policy (at once for a snapshot without policy: it carries no revocations).
    pub fn ready(&self, progress: &RevocationProgress) -> Option<Ack> {
        let revocations = match &self.policy_hash {
            None => Vec::new(),
            Some(hash) if progress.policy_hash.as_ref() == Some(hash) => progress
                .revocations
                .iter()
                .map(|r| RevocationApplied {
                    name: r.name.clone(),
                    tasks_cancelled: r.tasks_cancelled,
                    streams_closed: r.streams_closed,
                })
                .collect(),
            Some(_) => return None,
        };
        Some(Ack {
            session: self.session.clone(),
            version: self.version,
            policy_hash: self.policy_hash.clone(),
            revocations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distribution::PodIdentity;
    use crate::sidecar::policy_source::RevocationCounts;

    fn snapshot(policy: bool) -> Snapshot {
        Snapshot {
            session: "s1".into(),
            version: 9,
            pod: PodIdentity {
                namespace: "team-a".into(),
                name: "reports-0".into(),
                uid: "u".into(),
                service_account: "reports".into(),
            },
            policy: policy.then(|| crate::policy::testing::with_tasks("    enabled: true\n")),
            approver_keys: None,
            issued_at: jiff::Timestamp::UNIX_EPOCH,
            revocation_traces: Default::default(),
        }
    }

    #[test]
    fn a_snapshot_for_another_pod_is_refused() {
        let s = snapshot(false);
        assert!(check_pod(&s, "team-a", "reports-0").is_ok());
        assert!(matches!(
            check_pod(&s, "team-a", "reports-1"),
            Err(SnapshotError::OtherPod { .. })
        ));
    }

    #[test]
    fn the_ack_waits_for_the_revocations_of_its_own_policy() {
        let s = snapshot(true);
        let owed = OwedAck::of(&s);
        let hash = s.policy_hash().unwrap();
        let earlier = RevocationProgress {
            policy_hash: Some("another".into()),
            revocations: vec![],
        };
        assert_eq!(owed.ready(&earlier), None);
        let applied = RevocationProgress {
            policy_hash: Some(hash.clone()),
            revocations: vec![RevocationCounts {
                name: "alice-session".into(),
                tasks_cancelled: 2,
                streams_closed: 1,
            }],
        };
        let ack = owed.ready(&applied).expect("ack ready");
        assert_eq!(ack.version, 9);
        assert_eq!(ack.session, "s1");
        assert_eq!(ack.policy_hash, Some(hash));
        assert_eq!(
            ack.revocations,
            vec![RevocationApplied {
                name: "alice-session".into(),
                tasks_cancelled: 2,
                streams_closed: 1
            }]
        );
    }

    #[test]
    fn a_snapshot_without_policy_is_acked_at_once() {
        let owed = OwedAck::of(&snapshot(false));
        let ack = owed
            .ready(&RevocationProgress::default())
            .expect("nothing to wait for");
        assert_eq!(ack.policy_hash, None);
        assert!(ack.revocations.is_empty());
    }
}
