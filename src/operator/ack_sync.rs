//! Sharing acknowledgements between operator replicas through the API server: each follower
//! keeps its [`AckTable`] in a ConfigMap of its own (`lifeguard-acks-<hash of its identity>`,
//! labelled `lifeguard.dev/ack-table=true`, in the operator's namespace), rewritten at most
//! once per [`COALESCE`] while its sidecars change and at least every [`REFRESH`]; every
//! replica watches the others' and feeds them to [`ClusterAcks`]. The leader reads its own
//! sidecars from memory and publishes nothing (so a single replica writes no ConfigMap at
//! all), and removes tables whose replica stopped writing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::ack_table::AckTable;
use super::cluster_acks::ClusterAcks;
use super::conventions::FIELD_MANAGER;

/// Label that marks the ConfigMaps holding ack tables.
pub const TABLE_LABEL: &str = "lifeguard.dev/ack-table";
/// Key of the table in the ConfigMap's data.
pub const TABLE_KEY: &str = "table.json";
/// Name prefix of those ConfigMaps.
pub const NAME_PREFIX: &str = "lifeguard-acks-";
/// A replica rewrites its table at least this often, so others can tell it is alive.
pub const REFRESH: Duration = Duration::from_secs(30);
/// Changes that arrive within this window are written together: a follower rewrites its
/// table at most this often (status may lag a follower's sidecars by about this much;
/// propagation to sidecars does not wait for it).
pub const COALESCE: Duration = Duration::from_secs(1);
/// The leader deletes tables not rewritten for this long.
const FORGET_AFTER: Duration = Duration::from_secs(300);

/// The ConfigMap name of `replica`'s table.
pub fn configmap_name(replica: &str) -> String {
    let digest = Sha256::digest(replica.as_bytes());
    let hex = hex::encode(&digest[..6]);
    format!("{NAME_PREFIX}{hex}")
}

/// Reads an ack table out of a ConfigMap (`None` when it is not one).
pub fn table_of(configmap: &ConfigMap) -> Option<AckTable> {
    let name = configmap.metadata.name.as_deref()?;
    if !name.starts_with(NAME_PREFIX) {
        return None;
    }
    let text = configmap.data.as_ref()?.get(TABLE_KEY)?;
    serde_json::from_str(text).ok()
}

/// The ConfigMap holding `table`.
pub fn configmap_for(table: &AckTable) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(&table.replica),
            "labels": {
                TABLE_LABEL: "true",
                "app.kubernetes.io/managed-by": "lifeguard",
                "app.kubernetes.io/part-of": "lifeguard",
            },
        },
        "data": { TABLE_KEY: serde_json::to_string(table).unwrap_or_default() },
    })
}

/// Writes this replica's table whenever its sidecars change while it follows, until
/// `shutdown`; then deletes it (best effort) so the others stop counting this replica at once.
pub async fn publish(
    api: Api<ConfigMap>,
    acks: Arc<ClusterAcks>,
    leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let name = configmap_name(&acks.replica);
    let mut last: Option<AckTable> = None;
    let mut last_write = Instant::now();
    let mut leading_changes = leading.clone();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = acks.local.changed.notified() => {}
            _ = leading_changes.changed() => {}
            _ = tokio::time::sleep(REFRESH) => {}
        }
        tokio::time::sleep(COALESCE).await;
        if *leading.borrow() {
            // The leader counts its own sidecars from memory. A table it published while it
            // followed is ignored by itself and read by nobody else; remove it.
            if last.take().is_some() {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
            continue;
        }
        let table = acks.local.table(&acks.replica, Timestamp::now());
        let unchanged = last.as_ref().is_some_and(|l| l.pods == table.pods);
        if unchanged && last_write.elapsed() < REFRESH {
            continue;
        }
        let patch = configmap_for(&table);
        match api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {
                last = Some(table);
                last_write = Instant::now();
            }
            Err(error) => {
                tracing::warn!(%error, "writing this replica's ack table failed; retrying");
                last = None;
                acks.local.changed.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    let _ = api.delete(&name, &DeleteParams::default()).await;
}

/// Watches the tables of every replica and hands the others' to `acks`; bumps `changed`
/// when another replica's table changed. The leader deletes tables of replicas gone for good.
pub async fn follow(
    api: Api<ConfigMap>,
    acks: Arc<ClusterAcks>,
    changed: watch::Sender<u64>,
    leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let (store, writer): (Store<ConfigMap>, _) = reflector::store();
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .boxed();
    let mut previous: Vec<AckTable> = Vec::new();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(error)) => {
                tracing::warn!(%error, "watching ack tables failed; retrying");
                continue;
            }
            Some(Ok(_)) => {}
        }
        let mut tables: Vec<AckTable> = store
            .state()
            .iter()
            .filter_map(|c| table_of(c))
            .filter(|t| t.replica != acks.replica)
            .collect();
        tables.sort_by(|a, b| a.replica.cmp(&b.replica));
        if *leading.borrow() {
            let forget = jiff::SignedDuration::try_from(FORGET_AFTER).unwrap_or_default();
            let now = Timestamp::now();
            for gone in tables.iter().filter(|t| t.updated_at + forget < now) {
                tracing::info!(replica = %gone.replica, "removing the ack table of a replica gone for {}s", FORGET_AFTER.as_secs());
                let _ = api
                    .delete(&configmap_name(&gone.replica), &DeleteParams::default())
                    .await;
            }
        }
        if tables != previous {
            acks.set_remote(tables.clone());
            previous = tables;
            changed.send_modify(|v| *v += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_round_trips_through_its_configmap() {
        let table = AckTable {
            replica: "lifeguard-operator-7d9_1".into(),
            updated_at: "2026-12-01T00:00:00Z".parse().unwrap(),
            pods: Default::default(),
        };
        let value = configmap_for(&table);
        let configmap: ConfigMap = serde_json::from_value(value).unwrap();
        assert_eq!(table_of(&configmap), Some(table.clone()));
        let name = configmap.metadata.name.unwrap();
        assert!(name.starts_with(NAME_PREFIX) && name.len() == NAME_PREFIX.len() + 12);
        assert_eq!(name, configmap_name("lifeguard-operator-7d9_1"));
    }
}
