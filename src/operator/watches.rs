//! The distributor's watch caches: the three Lifeguard resources, every pod and the Secrets of
//! the operator's namespace, each waking the distributor only when something the plan reads
//! changed.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::Notify;

use crate::api::{CapabilityException, McpServerPolicy, PrincipalRevocation};
use crate::runtime::watch::{WatchCaches, WatchEvent};

use super::distributor::Caches;

/// The caches the plan reads, not yet filling (start them with [`WatchCaches::spawn`]); a
/// change the plan depends on notifies `changes`.
pub fn caches(
    client: &kube::Client,
    namespace: &str,
    changes: &Arc<Notify>,
) -> (Caches, WatchCaches) {
    let mut watches = WatchCaches::new();
    let all = watcher::Config::default;
    let caches = Caches {
        policies: watches.cache(
            Api::<McpServerPolicy>::all(client.clone()),
            all(),
            wake_on_change(changes, spec_fingerprint),
        ),
        exceptions: watches.cache(
            Api::<CapabilityException>::all(client.clone()),
            all(),
            wake_on_change(changes, spec_fingerprint),
        ),
        revocations: watches.cache(
            Api::<PrincipalRevocation>::all(client.clone()),
            all(),
            wake_on_change(changes, spec_fingerprint),
        ),
        pods: watches.cache(
            Api::<Pod>::all(client.clone()),
            all(),
            wake_on_change(changes, pod_fingerprint),
        ),
        secrets: watches.cache(
            Api::<Secret>::namespaced(client.clone(), namespace),
            all(),
            wake_on_change(changes, version_fingerprint),
        ),
    };
    (caches, watches)
}

/// What of an object the plan depends on, as a fingerprint: a change elsewhere (the status
/// the operator itself writes, a pod's phase) does not wake the distributor. Without this the
/// operator's own status writes fed back into replanning, and each replan reconciled every
/// object again.
type Relevant<K> = fn(&K) -> u64;

/// Wakes the distributor (`changes`) when an object's `relevant` fingerprint changed, when one
/// is deleted and when a (re)list begins or ends. Nothing else consumes the watch, so nothing
/// slow can hold it back.
fn wake_on_change<K: kube::Resource + 'static>(
    changes: &Arc<Notify>,
    relevant: Relevant<K>,
) -> impl FnMut(&WatchEvent<K>) + Send + 'static {
    let changes = changes.clone();
    let mut seen: HashMap<String, u64> = HashMap::new();
    move |event| {
        let key = |o: &K| {
            let m = o.meta();
            format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or(""),
                m.name.as_deref().unwrap_or("")
            )
        };
        let wake = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let print = relevant(o);
                seen.insert(key(o), print) != Some(print)
            }
            Ok(watcher::Event::Delete(o)) => {
                seen.remove(&key(o));
                true
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => true,
            Err(error) => {
                tracing::warn!(%error, "watch failed; retrying");
                false
            }
        };
        if wake {
            changes.notify_one();
        }
    }
}

fn fingerprint(parts: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// Custom resources: their spec (`generation`) and labels/annotations.
fn spec_fingerprint<K: kube::Resource>(object: &K) -> u64 {
    let meta = object.meta();
    fingerprint(&(
        meta.uid.as_deref(),
        meta.generation,
        meta.labels.as_ref(),
        meta.annotations.as_ref(),
    ))
}

/// Pods: identity, service account and labels (what selection and authentication read).
fn pod_fingerprint(pod: &Pod) -> u64 {
    fingerprint(&(
        pod.metadata.uid.as_deref(),
        pod.metadata.labels.as_ref(),
        pod.spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref()),
    ))
}

/// Secrets: any change of their content (`resourceVersion`).
fn version_fingerprint<K: kube::Resource>(object: &K) -> u64 {
    let meta = object.meta();
    fingerprint(&(meta.uid.as_deref(), meta.resource_version.as_deref()))
}
