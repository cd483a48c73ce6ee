//! The sidecars connected to this operator replica: one entry per pod (its latest
//! authenticated connection), what each acknowledged, and what each revocation did there.
//! Plain data behind a mutex; the stream and ack handlers write it, the status reconcilers
//! read it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::Timestamp;
use tokio::sync::{Notify, mpsc};

use crate::distribution::{Ack, PodIdentity, RevocationApplied};
use crate::policy::ObjectKey;

pub use super::ack_table::RevocationTotals;
use super::ack_table::{AckTable, PodAck};
use super::plan::PodKey;

/// What a pod's sidecar last acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    pub version: u64,
    pub policy_hash: Option<String>,
}

/// One pod's sidecar.
#[derive(Clone, Debug)]
pub struct SidecarSession {
    pub session: String,
    pub pod: PodIdentity,
    pub connected: bool,
    /// When this connection was authenticated (the latest connection of a pod wins across
    /// operator replicas).
    pub connected_at: Timestamp,
    /// Acknowledged through `session` (an older connection's acks are not counted).
    pub acknowledged: Option<Acknowledged>,
}

#[derive(Default)]
struct Inner {
    sidecars: HashMap<PodKey, SidecarSession>,
    /// revocation name → pod → what applying it did there. Kept across reconnects: a sidecar
    /// reports the counts of its first application every time it acknowledges.
    revocations: HashMap<String, BTreeMap<PodKey, RevocationApplied>>,
}

/// Why an acknowledgement was not recorded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AckRefused {
    #[error("the pod has no open stream on this replica")]
    NoStream,
    #[error("the acknowledgement names an older connection of this pod")]
    StaleSession,
}

/// The registry, with channels that tell the status reconcilers which objects to look at again.
pub struct Sessions {
    inner: Mutex<Inner>,
    /// Bumped by every change (a cache key for views built from the registry).
    version: AtomicU64,
    /// Woken by every change (the ack table publisher waits on it).
    pub changed: Notify,
    pods_changed: mpsc::UnboundedSender<PodKey>,
    revocations_acknowledged: mpsc::UnboundedSender<String>,
}

/// Receivers of the registry's change notifications.
pub struct SessionEvents {
    /// A pod connected, disconnected or acknowledged.
    pub pods: mpsc::UnboundedReceiver<PodKey>,
    /// A revocation was acknowledged by some pod.
    pub revocations: mpsc::UnboundedReceiver<String>,
}

fn pod_key(pod: &PodIdentity) -> PodKey {
    ObjectKey {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    }
}

impl Sessions {
    pub fn new() -> (Self, SessionEvents) {
        let (pods_tx, pods) = mpsc::unbounded_channel();
        let (rev_tx, revocations) = mpsc::unbounded_channel();
        (
            Self {
                inner: Mutex::new(Inner::default()),
                version: AtomicU64::new(0),
                changed: Notify::new(),
                pods_changed: pods_tx,
                revocations_acknowledged: rev_tx,
            },
            SessionEvents { pods, revocations },
        )
    }

    fn touched(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
    }

    /// Changes so far.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// This replica's table: every pod's latest connection and what it reported.
    pub fn table(&self, replica: &str, now: Timestamp) -> AckTable {
        let inner = self.lock();
        let mut pods: BTreeMap<String, PodAck> = BTreeMap::new();
        for (key, s) in &inner.sidecars {
            pods.insert(
                key.to_string(),
                PodAck {
                    connected_at: s.connected_at,
                    connected: s.connected,
                    policy_hash: s.acknowledged.as_ref().and_then(|a| a.policy_hash.clone()),
                    revocations: BTreeMap::new(),
                },
            );
        }
        for (name, by_pod) in &inner.revocations {
            for (key, applied) in by_pod {
                if let Some(entry) = pods.get_mut(&key.to_string()) {
                    entry.revocations.insert(
                        name.clone(),
                        [applied.tasks_cancelled, applied.streams_closed],
                    );
                }
            }
        }
        AckTable {
            replica: replica.to_owned(),
            updated_at: now,
            pods,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The data stays consistent across a panic elsewhere: every write is a single insert.
        super::locked(&self.inner)
    }

    /// Records a new authenticated connection; it replaces any earlier one of the same pod.
    pub fn connect(&self, pod: PodIdentity, session: String) {
        let key = pod_key(&pod);
        self.lock().sidecars.insert(
            key.clone(),
            SidecarSession {
                session,
                pod,
                connected: true,
                connected_at: Timestamp::now(),
                acknowledged: None,
            },
        );
        self.touched();
        let _ = self.pods_changed.send(key);
    }

    /// Marks a connection closed (only if it is still the pod's latest).
    pub fn disconnect(&self, pod: &PodIdentity, session: &str) {
        let key = pod_key(pod);
        let mut inner = self.lock();
        if let Some(entry) = inner.sidecars.get_mut(&key)
            && entry.session == session
        {
            entry.connected = false;
            drop(inner);
            self.touched();
            let _ = self.pods_changed.send(key);
        }
    }

    /// Records an acknowledgement from `pod`.
    pub fn acknowledge(&self, pod: &PodIdentity, ack: &Ack) -> Result<(), AckRefused> {
        let key = pod_key(pod);
        let mut inner = self.lock();
        let entry = inner.sidecars.get_mut(&key).ok_or(AckRefused::NoStream)?;
        if entry.session != ack.session {
            return Err(AckRefused::StaleSession);
        }
        if entry
            .acknowledged
            .as_ref()
            .is_some_and(|a| a.version > ack.version)
        {
            // A late ack of an older version changes nothing.
            return Ok(());
        }
        entry.acknowledged = Some(Acknowledged {
            version: ack.version,
            policy_hash: ack.policy_hash.clone(),
        });
        for applied in &ack.revocations {
            inner
                .revocations
                .entry(applied.name.clone())
                .or_default()
                .insert(key.clone(), applied.clone());
        }
        drop(inner);
        self.touched();
        let _ = self.pods_changed.send(key);
        for applied in &ack.revocations {
            let _ = self.revocations_acknowledged.send(applied.name.clone());
        }
        Ok(())
    }

    /// Connected pods.
    pub fn connected(&self) -> Vec<PodKey> {
        self.lock()
            .sidecars
            .iter()
            .filter(|(_, s)| s.connected)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether the pod's latest connection is open and acknowledged `policy_hash`.
    pub fn in_sync(&self, pod: &PodKey, policy_hash: &str) -> bool {
        self.lock().sidecars.get(pod).is_some_and(|s| {
            s.connected
                && s.acknowledged
                    .as_ref()
                    .is_some_and(|a| a.policy_hash.as_deref() == Some(policy_hash))
        })
    }

    /// Pods that reported applying `revocation`.
    pub fn reported(&self, revocation: &str) -> Vec<PodKey> {
        self.lock()
            .revocations
            .get(revocation)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What `revocation` did, summed over the pods that reported it.
    pub fn totals(&self, revocation: &str) -> RevocationTotals {
        let inner = self.lock();
        let mut totals = RevocationTotals::default();
        if let Some(pods) = inner.revocations.get(revocation) {
            for applied in pods.values() {
                totals.tasks_cancelled += applied.tasks_cancelled;
                totals.streams_closed += applied.streams_closed;
            }
        }
        totals
    }

    /// Forgets a revocation (after it was deleted).
    pub fn forget_revocation(&self, revocation: &str) {
        self.lock().revocations.remove(revocation);
        self.touched();
    }

    /// Number of pods with an open connection.
    pub fn connected_count(&self) -> usize {
        self.lock()
            .sidecars
            .values()
            .filter(|s| s.connected)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> PodIdentity {
        PodIdentity {
            namespace: "team-a".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            service_account: "reports".into(),
        }
    }

    fn ack(session: &str, version: u64, hash: &str, revoked: &[(&str, u64)]) -> Ack {
        Ack {
            session: session.into(),
            version,
            policy_hash: Some(hash.into()),
            revocations: revoked
                .iter()
                .map(|(name, tasks)| RevocationApplied {
                    name: (*name).into(),
                    tasks_cancelled: *tasks,
                    streams_closed: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn only_the_latest_connection_of_a_pod_counts() {
        let (sessions, mut events) = Sessions::new();
        sessions.connect(pod("a"), "s1".into());
        sessions.connect(pod("a"), "s2".into());
        assert_eq!(
            sessions.acknowledge(&pod("a"), &ack("s1", 1, "h", &[])),
            Err(AckRefused::StaleSession)
        );
        sessions
            .acknowledge(&pod("a"), &ack("s2", 1, "h", &[]))
            .unwrap();
        let key = pod_key(&pod("a"));
        assert!(sessions.in_sync(&key, "h"));
        assert!(!sessions.in_sync(&key, "other"));
        // The first connection closing later does not mark the pod disconnected.
        sessions.disconnect(&pod("a"), "s1");
        assert_eq!(sessions.connected_count(), 1);
        sessions.disconnect(&pod("a"), "s2");
        assert_eq!(sessions.connected_count(), 0);
        assert!(!sessions.in_sync(&key, "h"));
        assert!(events.pods.try_recv().is_ok());
    }

    #[test]
    fn revocation_counts_sum_over_pods_and_survive_reconnects() {
        let (sessions, mut events) = Sessions::new();
        sessions.connect(pod("a"), "s1".into());
        sessions.connect(pod("b"), "s2".into());
        sessions
            .acknowledge(&pod("a"), &ack("s1", 5, "h", &[("rev", 2)]))
            .unwrap();
        sessions
            .acknowledge(&pod("b"), &ack("s2", 5, "h", &[("rev", 3)]))
            .unwrap();
        // Pod a reconnects and reports the same first-application counts again.
        sessions.connect(pod("a"), "s3".into());
        sessions
            .acknowledge(&pod("a"), &ack("s3", 6, "h", &[("rev", 2)]))
            .unwrap();
        assert_eq!(
            sessions.totals("rev"),
            RevocationTotals {
                tasks_cancelled: 5,
                streams_closed: 2
            }
        );
        assert_eq!(sessions.reported("rev").len(), 2);
        assert_eq!(events.revocations.try_recv().unwrap(), "rev");
    }

    #[test]
    fn an_ack_from_a_pod_without_a_stream_is_refused() {
        let (sessions, _events) = Sessions::new();
        assert_eq!(
            sessions.acknowledge(&pod("x"), &ack("s", 1, "h", &[])),
            Err(AckRefused::NoStream)
        );
    }
}
