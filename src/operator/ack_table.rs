//! What every operator replica knows about its sidecars, merged into one view for the leader.
//!
//! Every replica serves sidecar streams, but only the leader writes status. So each replica
//! publishes its [`AckTable`] (which pods are connected to it, what each acknowledged, what
//! each revocation did there) to a ConfigMap in the operator's namespace (see
//! [`super::ack_sync`]), and the leader merges its own live table with the others' into a
//! [`SidecarView`]. A pod counts once, through its latest authenticated connection on any
//! replica; revocation counts are kept per pod across reconnects (a sidecar reports the counts
//! of its first application every time). Tables of replicas that stopped publishing for
//! [`STALE_AFTER`] are ignored: their sidecars reconnect elsewhere within seconds.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::policy::ObjectKey;

use super::plan::PodKey;

/// Totals of one revocation over the pods that reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RevocationTotals {
    pub tasks_cancelled: u64,
    pub streams_closed: u64,
}

/// A replica's table older than this is not counted.
pub const STALE_AFTER: Duration = Duration::from_secs(90);

/// One replica's sidecars.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AckTable {
    /// The replica's Lease identity.
    pub replica: String,
    /// When the replica wrote the table (it rewrites it at least every 30 s).
    pub updated_at: Timestamp,
    /// `namespace/name` → what that pod's sidecar did through this replica.
    pub pods: BTreeMap<String, PodAck>,
}

/// One pod's sidecar as one replica knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAck {
    pub connected_at: Timestamp,
    pub connected: bool,
    /// Policy hash acknowledged through the latest connection.
    pub policy_hash: Option<String>,
    /// Revocation name → [tasks cancelled, streams closed].
    #[serde(default)]
    pub revocations: BTreeMap<String, [u64; 2]>,
}

/// Every replica's tables merged.
#[derive(Debug, Default)]
pub struct SidecarView {
    /// The latest connection of each pod.
    latest: HashMap<PodKey, PodAck>,
    /// Revocation counts per pod, the largest any replica saw.
    counts: HashMap<String, HashMap<PodKey, [u64; 2]>>,
}

fn parse_key(key: &str) -> Option<PodKey> {
    let (namespace, name) = key.split_once('/')?;
    Some(ObjectKey {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

impl SidecarView {
    /// Merges `tables`, skipping those older than [`STALE_AFTER`] at `now`.
    pub fn merge<'a>(tables: impl IntoIterator<Item = &'a AckTable>, now: Timestamp) -> Self {
        let stale = jiff::SignedDuration::try_from(STALE_AFTER).unwrap_or_default();
        let mut view = Self::default();
        for table in tables {
            if table.updated_at + stale < now {
                continue;
            }
            for (key, ack) in &table.pods {
                let Some(pod) = parse_key(key) else { continue };
                for (name, counts) in &ack.revocations {
                    let slot = view
                        .counts
                        .entry(name.clone())
                        .or_default()
                        .entry(pod.clone())
                        .or_default();
                    slot[0] = slot[0].max(counts[0]);
                    slot[1] = slot[1].max(counts[1]);
                }
                let newer = view.latest.get(&pod).is_none_or(|current| {
                    (ack.connected_at, ack.connected) > (current.connected_at, current.connected)
                });
                if newer {
                    view.latest.insert(pod, ack.clone());
                }
            }
        }
        view
    }

    /// Pods whose latest connection is open.
    pub fn connected(&self) -> Vec<PodKey> {
        self.latest
            .iter()
            .filter(|(_, a)| a.connected)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether `pod`'s latest connection is open and acknowledged `policy_hash`.
    pub fn in_sync(&self, pod: &PodKey, policy_hash: &str) -> bool {
        self.latest
            .get(pod)
            .is_some_and(|a| a.connected && a.policy_hash.as_deref() == Some(policy_hash))
    }

    /// Pods that reported applying `revocation`.
    pub fn reported(&self, revocation: &str) -> Vec<PodKey> {
        self.counts
            .get(revocation)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What `revocation` did, summed over pods.
    pub fn totals(&self, revocation: &str) -> RevocationTotals {
        let mut totals = RevocationTotals::default();
        for counts in self
            .counts
            .get(revocation)
            .into_iter()
            .flat_map(|m| m.values())
        {
            totals.tasks_cancelled = totals.tasks_cancelled.saturating_add(counts[0]);
            totals.streams_closed = totals.streams_closed.saturating_add(counts[1]);
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn ack(connected_at: &str, connected: bool, hash: &str, revoked: &[(&str, u64)]) -> PodAck {
        PodAck {
            connected_at: at(connected_at),
            connected,
            policy_hash: Some(hash.into()),
            revocations: revoked
                .iter()
                .map(|(n, t)| ((*n).into(), [*t, 0]))
                .collect(),
        }
    }

    fn table(replica: &str, updated: &str, pods: &[(&str, PodAck)]) -> AckTable {
        AckTable {
            replica: replica.into(),
            updated_at: at(updated),
            pods: pods.iter().map(|(k, a)| ((*k).into(), a.clone())).collect(),
        }
    }

    fn pod(name: &str) -> PodKey {
        ObjectKey {
            namespace: "team-a".into(),
            name: name.into(),
        }
    }

    const NOW: &str = "2026-12-01T01:00:00Z";

    #[test]
    fn a_pod_counts_once_through_its_latest_connection_on_any_replica() {
        // Pod a moved from replica one to replica two; replica one still lists it, closed.
        let one = table(
            "one",
            NOW,
            &[
                (
                    "team-a/a",
                    ack("2026-12-01T00:50:00Z", false, "old", &[("rev", 3)]),
                ),
                ("team-a/b", ack("2026-12-01T00:50:00Z", true, "h", &[])),
            ],
        );
        let two = table(
            "two",
            NOW,
            &[(
                "team-a/a",
                ack("2026-12-01T00:55:00Z", true, "h", &[("rev", 3)]),
            )],
        );
        let view = SidecarView::merge([&one, &two], at(NOW));
        assert!(view.in_sync(&pod("a"), "h"));
        assert!(view.in_sync(&pod("b"), "h"));
        let mut connected = view.connected();
        connected.sort();
        assert_eq!(connected, vec![pod("a"), pod("b")]);
        // The same first-application counts reported through both replicas count once.
        assert_eq!(view.totals("rev").tasks_cancelled, 3);
        assert_eq!(view.reported("rev"), vec![pod("a")]);
    }

    #[test]
    fn tables_of_replicas_that_stopped_publishing_are_ignored() {
        let dead = table(
            "dead",
            "2026-12-01T00:50:00Z",
            &[(
                "team-a/a",
                ack("2026-12-01T00:49:00Z", true, "h", &[("rev", 1)]),
            )],
        );
        let view = SidecarView::merge([&dead], at(NOW));
        assert!(view.connected().is_empty());
        assert_eq!(view.totals("rev").tasks_cancelled, 0);
    }
}
