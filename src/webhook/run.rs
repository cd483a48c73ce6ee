//! Wiring of `lifeguard webhook`: configuration, watch caches, the HTTPS endpoints and the
//! admin port.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::api::McpServerPolicy;
use crate::exception::approver_keys::ApproverKeys;
use crate::runtime::http::BodyBudget;
use crate::runtime::readiness::{ReadinessTexts, SyncedAndServing};
use crate::runtime::shell::{Shell, ShellConfig};
use crate::runtime::watch::{WatchCaches, WatchEvent};

use super::config::{SecretKeyRef, WebhookFileConfig};
use super::metrics::WebhookMetrics;
use super::server::{ClusterReader, WebhookState, router};
use super::validate::ClusterView;

/// Everything `lifeguard webhook` takes on its command line.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Cluster, `--listen` and `--admin`.
    pub shell: ShellConfig,
    pub config: PathBuf,
    /// Largest AdmissionReview body read (`--max-review-bytes`).
    pub max_review_bytes: usize,
    /// Memory for review bodies being read at once (`--review-buffer-bytes`).
    pub review_buffer_bytes: usize,
}

/// The watch caches behind [`ClusterReader`].
struct Caches {
    namespaces: Store<Namespace>,
    policies: Store<McpServerPolicy>,
    secrets: Option<(Store<Secret>, SecretKeyRef, String)>,
}

impl ClusterView for Caches {
    fn policies_in(&self, namespace: &str) -> Vec<Arc<McpServerPolicy>> {
        self.policies
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    fn approver_keys(&self) -> ApproverKeys {
        let Some((store, reference, namespace)) = &self.secrets else {
            return ApproverKeys::Missing;
        };
        store
            .get(&ObjectRef::new(&reference.secret_name).within(namespace))
            .map_or(ApproverKeys::Missing, |secret| {
                ApproverKeys::from_secret(&secret, &reference.key)
            })
    }
}

impl ClusterReader for Caches {
    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces
            .get(&ObjectRef::new(namespace))
            .map(|ns| ns.metadata.labels.clone().unwrap_or_default())
    }
}

/// How the webhook words its readiness.
const READINESS: ReadinessTexts = ReadinessTexts {
    ready: "ready: caches synced, serving admission",
    starting: "the admission endpoint is starting",
};

/// The watch caches of the namespaces, the policies and (when `approverKeys` is configured)
/// the one approver-keys Secret, not yet filling.
fn caches(file: &WebhookFileConfig, shell: &Shell) -> (Caches, WatchCaches) {
    let client = &shell.client;
    let mut watches = WatchCaches::new();
    let namespaces = watches.cache(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        log_errors,
    );
    let policies = watches.cache(
        Api::<McpServerPolicy>::all(client.clone()),
        watcher::Config::default(),
        log_errors,
    );
    // Only the one Secret: the webhook's Role can then be limited to it.
    let secrets = file.approver_keys.clone().map(|reference| {
        let store = watches.cache(
            Api::<Secret>::namespaced(client.clone(), &shell.namespace),
            watcher::Config::default().fields(&format!("metadata.name={}", reference.secret_name)),
            log_errors,
        );
        (store, reference, shell.namespace.clone())
    });
    let caches = Caches {
        namespaces,
        policies,
        secrets,
    };
    (caches, watches)
}

fn log_errors<K>(event: &WatchEvent<K>) {
    if let Err(error) = event {
        tracing::warn!(%error, "watch error; retrying");
    }
}

/// Runs the webhook until `shutdown`.
pub async fn run(config: WebhookConfig, shutdown: CancellationToken) -> Result<()> {
    let file = WebhookFileConfig::load(&config.config)?;
    let shell = Shell::start(config.shell).await?;
    let metrics = Arc::new(WebhookMetrics::new());
    let health = Arc::new(SyncedAndServing::new(READINESS, {
        let metrics = metrics.clone();
        move || metrics.encode()
    }));
    shell.spawn_admin(health.clone(), &shutdown).await?;

    let (caches, watches) = caches(&file, &shell);
    let caches_synced = watches.spawn(&shutdown);
    let caches = Arc::new(caches);

    let listener = shell.bind().await?;
    let local = listener.local_addr()?;
    eprintln!("lifeguard: webhook on https://{local}");
    let connections = metrics.connections.clone();
    let review_buffer = BodyBudget::new(
        config.review_buffer_bytes,
        metrics.review_buffer_reserved.clone(),
    );
    let state = Arc::new(WebhookState {
        config: file,
        own_namespace: shell.namespace.clone(),
        cluster: caches,
        metrics,
        max_review_bytes: config.max_review_bytes,
        review_buffer,
    });
    let serving = tokio::spawn(shell.serve(
        listener,
        router(state),
        shell.limits().clone(),
        connections,
        shutdown.clone(),
    ));
    health.mark_serving();

    // Ready once every cache has its first complete list.
    tokio::select! {
        _ = shutdown.cancelled() => {}
        synced = caches_synced.wait() => {
            synced.context("a watch cache stopped before it synced")?;
            health.mark_synced();
            eprintln!("lifeguard: webhook caches synced");
        }
    }
    serving
        .await
        .context("the admission server task failed")?
        .context("serving admission requests")?;
    Ok(())
}
