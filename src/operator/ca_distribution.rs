//! The CA ConfigMap: injected sidecars verify the operator's serving certificate with a CA
//! bundle they mount from a ConfigMap in their own namespace (a pod cannot mount a Secret or
//! ConfigMap of another namespace). The leader keeps that ConfigMap, a copy of one key of a
//! Secret in the operator's namespace, in every namespace that is opted in to injection
//! (label `lifeguard.dev/inject=enabled`) or holds an McpServerPolicy.
//!
//! fetch (watch caches of namespaces, policies, the Secret and the ConfigMaps of that name) →
//! pure [`plan`] (which ConfigMaps are missing or differ) → server-side apply of those.
//!
//! Guarantees:
//! - Only the leader writes; every replica keeps its caches warm and reports
//!   `lifeguard_operator_ca_source_usable`.
//! - A Secret that is missing or does not hold usable PEM certificates (or holds a private key)
//!   is never copied: the ConfigMaps keep the last good bundle, the problem is logged, counted
//!   and published as a Warning Event on the Secret.
//! - A ConfigMap edited or deleted by someone else is restored; other keys in it are left
//!   alone (server-side apply owns only the one key and the labels).
//! - Nothing is deleted: a namespace that opts out keeps its ConfigMap, because running pods
//!   mount it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::{PemObject, SectionKind};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::api::McpServerPolicy;

use super::config::CaDistribution;

/// Namespace label that opts a namespace's pods in to injection.
pub const INJECT_LABEL: &str = "lifeguard.dev/inject";
/// Labels of every ConfigMap this module writes.
pub const LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/part-of", "lifeguard"),
    ("app.kubernetes.io/managed-by", "lifeguard-operator"),
];

/// Why the Secret's content is not copied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CaSourceProblem {
    #[error("the Secret does not exist")]
    SecretMissing,
    #[error("the Secret has no key {0:?}")]
    KeyMissing(String),
    #[error("the Secret's key {0:?} is not text")]
    NotText(String),
    #[error("the Secret's key {0:?} holds a private key; it must hold only CA certificates")]
    PrivateKey(String),
    #[error("the Secret's key {0:?} holds no PEM certificate")]
    NoCertificate(String),
    #[error("the Secret's key {0:?}: no certificate in it is usable as a trust anchor")]
    Unusable(String),
}

impl CaSourceProblem {
    /// Bounded metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::SecretMissing => "secret_missing",
            Self::KeyMissing(_) => "key_missing",
            Self::NotText(_) => "not_text",
            Self::PrivateKey(_) => "private_key",
            Self::NoCertificate(_) => "no_certificate",
            Self::Unusable(_) => "unusable",
        }
    }
}

/// The PEM text of `key` in `secret`, when it is a bundle a sidecar can trust: text, at least
/// one certificate a rustls root store accepts (the test the sidecar's `--control-plane-ca`
/// applies), and no private key.
pub fn ca_bundle(secret: Option<&Secret>, key: &str) -> Result<String, CaSourceProblem> {
    let secret = secret.ok_or(CaSourceProblem::SecretMissing)?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            // Only seen before the API server converts it; harmless to honour.
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| CaSourceProblem::KeyMissing(key.to_owned()))?;
    let text = String::from_utf8(bytes).map_err(|_| CaSourceProblem::NotText(key.to_owned()))?;
    // Any key block (PKCS#8, PKCS#1, SEC1, encrypted) names itself "… PRIVATE KEY".
    if text.contains("PRIVATE KEY-----") {
        return Err(CaSourceProblem::PrivateKey(key.to_owned()));
    }
    let mut certificates = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text.as_bytes()) {
        match section {
            Ok((SectionKind::Certificate, der)) => certificates.push(CertificateDer::from(der)),
            // Other sections (CRLs, parameters) are not ours to judge; the sidecar skips them.
            Ok(_) => {}
            Err(_) => return Err(CaSourceProblem::NoCertificate(key.to_owned())),
        }
    }
    if certificates.is_empty() {
        return Err(CaSourceProblem::NoCertificate(key.to_owned()));
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certificates);
    if added == 0 {
        return Err(CaSourceProblem::Unusable(key.to_owned()));
    }
    Ok(text)
}

/// What [`plan`] reads of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceFacts {
    pub name: String,
    pub opted_in: bool,
    /// Being deleted: the API server refuses new objects in it.
    pub terminating: bool,
}

impl NamespaceFacts {
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            name: meta.name.clone().unwrap_or_default(),
            opted_in: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(INJECT_LABEL))
                .is_some_and(|v| v == "enabled"),
            terminating: meta.deletion_timestamp.is_some(),
        }
    }
}

/// Namespaces that should hold the ConfigMap: existing, not terminating, and opted in or
/// holding a policy. A policy in a namespace the cache does not (yet) know waits for it.
pub fn target_namespaces(
    namespaces: &[NamespaceFacts],
    policy_namespaces: &BTreeSet<String>,
) -> BTreeSet<String> {
    namespaces
        .iter()
        .filter(|n| !n.terminating && (n.opted_in || policy_namespaces.contains(&n.name)))
        .map(|n| n.name.clone())
        .collect()
}

/// The ConfigMap for `namespace` carrying `bundle`.
pub fn desired_config_map(namespace: &str, config: &CaDistribution, bundle: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(config.config_map.name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                LABELS
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        data: Some([(config.config_map.key.clone(), bundle.to_owned())].into()),
        ..ConfigMap::default()
    }
}

/// Whether `observed` already carries what `desired` says: its key with the same text and
/// the labels (other keys and labels are someone else's business).
pub fn up_to_date(observed: &ConfigMap, desired: &ConfigMap) -> bool {
    let contains = |have: &Option<BTreeMap<String, String>>,
                    want: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    contains(&observed.data, &desired.data)
        && contains(&observed.metadata.labels, &desired.metadata.labels)
}

/// What one pass should do.
#[derive(Debug, PartialEq)]
pub enum CaPlan {
    /// Apply these ConfigMaps (missing or different); empty when everything is in place.
    Apply(Vec<ConfigMap>),
    /// The source is unusable: write nothing, report this.
    SourceUnusable(CaSourceProblem),
}

/// The ConfigMaps to write, given the namespaces, the namespaces holding policies, the Secret
/// and the ConfigMaps of that name as observed (by namespace).
pub fn plan(
    config: &CaDistribution,
    namespaces: &[NamespaceFacts],
    policy_namespaces: &BTreeSet<String>,
    secret: Option<&Secret>,
    observed: &BTreeMap<String, ConfigMap>,
) -> CaPlan {
    let bundle = match ca_bundle(secret, &config.secret_key) {
        Ok(bundle) => bundle,
        Err(problem) => return CaPlan::SourceUnusable(problem),
    };
    CaPlan::Apply(
        target_namespaces(namespaces, policy_namespaces)
            .into_iter()
            .map(|ns| desired_config_map(&ns, config, &bundle))
            .filter(|want| {
                let ns = want.metadata.namespace.as_deref().unwrap_or_default();
                !observed.get(ns).is_some_and(|have| up_to_date(have, want))
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// IO: watch caches, the leader's apply loop, metrics and Events.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// `lifeguard_operator_ca_*`.
#[derive(Clone)]
struct CaMetrics {
    usable: Gauge,
    problems: Family<ReasonLabels, Counter>,
    writes: Family<ResultLabels, Counter>,
}

impl CaMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            usable: Gauge::default(),
            problems: Family::default(),
            writes: Family::default(),
        };
        registry.register(
            "ca_source_usable",
            "1 while the caDistribution Secret holds a usable CA bundle, 0 otherwise",
            metrics.usable.clone(),
        );
        registry.register(
            "ca_source_problems",
            "Versions of the caDistribution Secret (or its absence) found unusable, by reason",
            metrics.problems.clone(),
        );
        registry.register(
            "ca_configmap_writes",
            "CA ConfigMaps applied, by result",
            metrics.writes.clone(),
        );
        metrics
    }
}

/// The CA reconciler, configured and with its metrics registered; [`CaDistributor::spawn`]
/// starts it.
pub struct CaDistributor {
    config: CaDistribution,
    metrics: CaMetrics,
}

/// What the running reconciler holds.
struct Running {
    config: CaDistribution,
    metrics: CaMetrics,
    client: Client,
    /// The operator's namespace (where the Secret is).
    namespace: String,
    recorder: Recorder,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    policies: Store<PartialObjectMeta<McpServerPolicy>>,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    /// The problem last logged and counted, with the Secret version it was found in.
    reported: Option<(CaSourceProblem, Option<String>)>,
    /// The problem last published as an Event (by this replica, while leading).
    announced: Option<(CaSourceProblem, Option<String>)>,
}

impl CaDistributor {
    /// `None` when `caDistribution` is not configured; registers the metrics otherwise.
    pub fn new(config: Option<&CaDistribution>, registry: &mut Registry) -> Option<Self> {
        let config = config?.clone();
        Some(Self {
            config,
            metrics: CaMetrics::register(registry),
        })
    }

    /// Starts the watches (on every replica, so a new leader acts at once) and the loop that
    /// writes while `leading` is true, until `shutdown`.
    pub fn spawn(
        self,
        client: Client,
        namespace: String,
        replica: String,
        leading: watch::Receiver<bool>,
        shutdown: CancellationToken,
    ) {
        let changes = Arc::new(Notify::new());
        let by_name =
            |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (namespaces, ns_driver) = cache(
            watcher(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
            ),
            changes.clone(),
        );
        let (policies, policy_driver) = cache(
            watcher(
                Api::<PartialObjectMeta<McpServerPolicy>>::all(client.clone()),
                watcher::Config::default(),
            ),
            changes.clone(),
        );
        let (secrets, secret_driver) = cache(
            watcher(
                Api::<Secret>::namespaced(client.clone(), &namespace),
                by_name(&self.config.secret_name),
            ),
            changes.clone(),
        );
        let (config_maps, cm_driver) = cache(
            watcher(
                Api::<ConfigMap>::all(client.clone()),
                by_name(&self.config.config_map.name),
            ),
            changes.clone(),
        );
        for driver in [ns_driver, policy_driver, secret_driver, cm_driver] {
            let stop = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = driver => {}
                }
            });
        }
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: super::conventions::FIELD_MANAGER.into(),
                instance: Some(replica),
            },
        );
        let running = Running {
            config: self.config,
            metrics: self.metrics,
            client,
            namespace,
            recorder,
            namespaces,
            policies,
            secrets,
            config_maps,
            reported: None,
            announced: None,
        };
        tokio::spawn(running.run(changes, leading, shutdown));
    }
}

/// A reflector over `events` that wakes `changes` on every event.
fn cache<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    changes: Arc<Notify>,
) -> (Store<K>, futures_util::future::BoxFuture<'static, ()>)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let driver = events
        .default_backoff()
        .reflect(writer)
        .for_each(move |event| {
            match event {
                Ok(_) => changes.notify_one(),
                Err(error) => tracing::warn!(%error, "CA distribution watch failed; retrying"),
            }
            std::future::ready(())
        });
    (reader, driver.boxed())
}

/// Delay before retrying after `failures` failed passes in a row: 1 s doubling to 60 s.
fn retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

impl Running {
    async fn run(
        mut self,
        changes: Arc<Notify>,
        mut leading: watch::Receiver<bool>,
        shutdown: CancellationToken,
    ) {
        let synced = async {
            self.namespaces.wait_until_ready().await?;
            self.policies.wait_until_ready().await?;
            self.secrets.wait_until_ready().await?;
            self.config_maps.wait_until_ready().await
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            synced = synced => if synced.is_err() { return },
        }
        let mut failures = 0u32;
        loop {
            let is_leader = *leading.borrow_and_update();
            let failed = self.pass(is_leader).await;
            failures = if failed { failures + 1 } else { 0 };
            let retry = async {
                if failed {
                    tokio::time::sleep(retry_delay(failures)).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changes.notified() => {}
                changed = leading.changed() => if changed.is_err() { return },
                _ = retry => {}
            }
        }
    }

    /// Plans and, when leading, applies. Returns whether a write failed (retry later).
    async fn pass(&mut self, is_leader: bool) -> bool {
        let namespaces: Vec<NamespaceFacts> = self
            .namespaces
            .state()
            .iter()
            .map(|n| NamespaceFacts::of(&n.metadata))
            .collect();
        let policy_namespaces: BTreeSet<String> = self
            .policies
            .state()
            .iter()
            .filter_map(|p| p.metadata.namespace.clone())
            .collect();
        let secret = self.secrets.state().into_iter().find(|s| {
            s.metadata.name.as_deref() == Some(self.config.secret_name.as_str())
                && s.metadata.namespace.as_deref() == Some(self.namespace.as_str())
        });
        let observed: BTreeMap<String, ConfigMap> = self
            .config_maps
            .state()
            .iter()
            .filter(|c| c.metadata.name.as_deref() == Some(self.config.config_map.name.as_str()))
            .filter_map(|c| Some((c.metadata.namespace.clone()?, (**c).clone())))
            .collect();
        let decided = plan(
            &self.config,
            &namespaces,
            &policy_namespaces,
            secret.as_deref(),
            &observed,
        );
        match decided {
            CaPlan::SourceUnusable(problem) => {
                self.metrics.usable.set(0);
                let version = secret.and_then(|s| s.metadata.resource_version.clone());
                self.report(problem, version, is_leader).await;
                false
            }
            CaPlan::Apply(config_maps) => {
                self.metrics.usable.set(1);
                if self.reported.take().is_some() {
                    tracing::info!(secret = %self.config.secret_name, "CA source usable again");
                }
                if !is_leader {
                    return false;
                }
                if self.announced.take().is_some() {
                    self.publish(
                        EventType::Normal,
                        "CaSourceUsable",
                        "the CA bundle is usable again; distributing it",
                    )
                    .await;
                }
                let mut failed = false;
                for config_map in config_maps {
                    failed |= !self.apply(config_map).await;
                }
                failed
            }
        }
    }

    /// Logs and counts an unusable source once per problem and Secret version, and publishes
    /// it once per problem and version while leading (also when leadership came later).
    async fn report(&mut self, problem: CaSourceProblem, version: Option<String>, is_leader: bool) {
        let current = Some((problem.clone(), version));
        let message = format!(
            "caDistribution: Secret {}/{}: {problem}; the CA ConfigMaps keep their current content",
            self.namespace, self.config.secret_name
        );
        if is_leader && self.announced != current {
            self.announced = current.clone();
            self.publish(EventType::Warning, "CaSourceUnusable", &message)
                .await;
        }
        if self.reported == current {
            return;
        }
        self.reported = current;
        self.metrics
            .problems
            .get_or_create(&ReasonLabels {
                reason: problem.metric_label(),
            })
            .inc();
        tracing::warn!(reason = problem.metric_label(), "{message}");
    }

    /// An Event about the Secret; failures are logged (Events are for people).
    async fn publish(&self, type_: EventType, reason: &str, note: &str) {
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Secret".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.config.secret_name.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "DistributeCA".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &regarding).await {
            tracing::debug!(%error, "publishing an Event failed");
        }
    }

    /// Server-side applies one ConfigMap; returns whether it succeeded.
    async fn apply(&self, config_map: ConfigMap) -> bool {
        let namespace = config_map.metadata.namespace.clone().unwrap_or_default();
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &namespace);
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": config_map.metadata,
            "data": config_map.data,
        });
        let result = api
            .patch(
                &self.config.config_map.name,
                &PatchParams::apply(super::conventions::FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await;
        let ok = result.is_ok();
        self.metrics
            .writes
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
        match result {
            Ok(_) => {
                tracing::info!(%namespace, config_map = %self.config.config_map.name, "CA ConfigMap applied")
            }
            Err(error) => {
                tracing::warn!(%namespace, %error, "applying the CA ConfigMap failed; retrying")
            }
        }
        ok
    }
}

#[cfg(test)]
#[path = "ca_distribution_tests.rs"]
mod tests;
