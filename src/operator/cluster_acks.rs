//! This replica's live registry plus the other replicas' latest ack tables, merged into one
//! [`SidecarView`] (cached until either side changes). See [`super::ack_table`] for the rules.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;

use super::ack_table::{AckTable, SidecarView};
use super::conventions::locked;
use super::sessions::Sessions;

struct Cached {
    key: (u64, u64),
    view: Arc<SidecarView>,
}

/// The local registry plus the other replicas' latest tables, with the merged view cached
/// until either changes.
pub struct ClusterAcks {
    pub local: Arc<Sessions>,
    pub replica: String,
    remote: Mutex<(u64, BTreeMap<String, AckTable>)>,
    cached: Mutex<Option<Cached>>,
}

impl ClusterAcks {
    pub fn new(local: Arc<Sessions>, replica: String) -> Self {
        Self {
            local,
            replica,
            remote: Mutex::new((0, BTreeMap::new())),
            cached: Mutex::new(None),
        }
    }

    /// Replaces the other replicas' tables (this replica's own published copy is ignored:
    /// the live registry is fresher).
    pub fn set_remote(&self, tables: Vec<AckTable>) {
        let mut remote = locked(&self.remote);
        remote.0 += 1;
        remote.1 = tables
            .into_iter()
            .filter(|t| t.replica != self.replica)
            .map(|t| (t.replica.clone(), t))
            .collect();
    }

    /// The merged view now.
    pub fn view(&self) -> Arc<SidecarView> {
        let remote = locked(&self.remote);
        let key = (self.local.version(), remote.0);
        let mut cached = locked(&self.cached);
        if let Some(c) = cached.as_ref()
            && c.key == key
        {
            return c.view.clone();
        }
        let now = Timestamp::now();
        let local = self.local.table(&self.replica, now);
        let view = Arc::new(SidecarView::merge(
            std::iter::once(&local).chain(remote.1.values()),
            now,
        ));
        *cached = Some(Cached {
            key,
            view: view.clone(),
        });
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::ack_table::PodAck;
    use crate::policy::ObjectKey;

    fn ack(at: &str) -> PodAck {
        PodAck {
            connected_at: at.parse().unwrap(),
            connected: true,
            policy_hash: Some("h".into()),
            revocations: BTreeMap::new(),
        }
    }

    fn table(replica: &str, at: &str, pod: &str) -> AckTable {
        AckTable {
            replica: replica.into(),
            updated_at: at.parse().unwrap(),
            pods: [(pod.to_owned(), ack(at))].into(),
        }
    }

    fn pod(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: "team-a".into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_local_registry_and_remote_tables_merge_and_the_own_copy_is_ignored() {
        let (sessions, _events) = Sessions::new();
        let sessions = Arc::new(sessions);
        let acks = ClusterAcks::new(sessions.clone(), "me".into());
        sessions.connect(
            crate::distribution::PodIdentity {
                namespace: "team-a".into(),
                name: "local".into(),
                uid: "u".into(),
                service_account: "sa".into(),
            },
            "s".into(),
            None,
        );
        let now = Timestamp::now().to_string();
        acks.set_remote(vec![
            table("other", &now, "team-a/remote"),
            // Our own published copy, stale: must not resurrect anything.
            table("me", &now, "team-a/ghost"),
        ]);
        let mut connected = acks.view().connected();
        connected.sort();
        assert_eq!(connected, vec![pod("local"), pod("remote")]);
        // Cached until something changes.
        assert!(Arc::ptr_eq(&acks.view(), &acks.view()));
    }
}
