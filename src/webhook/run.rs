//! Wiring of `lifeguard webhook`: configuration, watch caches, the HTTPS endpoints and the
//! admin port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use crate::api::McpServerPolicy;
use crate::exception::approver_keys::ApproverKeys;
use crate::runtime::admin::{Health, Readiness};
use crate::runtime::http::{BodyBudget, ServerLimits};
use crate::runtime::tls::{ReloadingCertificate, serve_tls};

use super::config::{SecretKeyRef, WebhookFileConfig};
use super::metrics::WebhookMetrics;
use super::server::{ClusterReader, WebhookState, router};
use super::validate::ClusterView;

/// Everything `lifeguard webhook` takes on its command line.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub admin: SocketAddr,
    pub config: PathBuf,
    /// Limits of the `--listen` port.
    pub limits: ServerLimits,
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

struct WebhookHealth {
    metrics: Arc<WebhookMetrics>,
    synced: AtomicBool,
    serving: AtomicBool,
}

impl Health for WebhookHealth {
    fn readiness(&self) -> Readiness {
        match (
            self.synced.load(Ordering::Acquire),
            self.serving.load(Ordering::Acquire),
        ) {
            (true, true) => Readiness::Ready("ready: caches synced, serving admission".into()),
            (false, _) => Readiness::NotReady("watch caches are syncing".into()),
            (true, false) => Readiness::NotReady("the admission endpoint is starting".into()),
        }
    }

    fn metrics(&self) -> String {
        self.metrics.encode()
    }
}

/// A reflector over `api`, driven in the background until `shutdown`.
fn cache<K>(api: Api<K>, config: watcher::Config, shutdown: &CancellationToken) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let driver = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .for_each(|event| {
            if let Err(error) = event {
                tracing::warn!(%error, "watch error; retrying");
            }
            std::future::ready(())
        })
        .boxed();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = driver => {}
        }
    });
    reader
}

/// Runs the webhook until `shutdown`.
pub async fn run(config: WebhookConfig, shutdown: CancellationToken) -> Result<()> {
    let file = WebhookFileConfig::load(&config.config)?;
    let certificate = Arc::new(
        ReloadingCertificate::load(&config.tls_cert, &config.tls_key)
            .context("loading the serving certificate (--tls-cert, --tls-key)")?,
    );
    let namespace = crate::runtime::cluster::own_namespace(config.namespace.as_deref());
    let client = crate::runtime::cluster::client(config.kubeconfig.as_deref()).await?;

    let metrics = Arc::new(WebhookMetrics::new());
    let health = Arc::new(WebhookHealth {
        metrics: metrics.clone(),
        synced: AtomicBool::new(false),
        serving: AtomicBool::new(false),
    });
    let _admin = crate::runtime::admin::spawn(config.admin, health.clone(), shutdown.clone())
        .await
        .context("starting the admin endpoint")?;

    let namespaces = cache(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        &shutdown,
    );
    let policies = cache(
        Api::<McpServerPolicy>::all(client.clone()),
        watcher::Config::default(),
        &shutdown,
    );
    // Only the one Secret: the webhook's Role can then be limited to it.
    let secrets = file.approver_keys.clone().map(|reference| {
        let store = cache(
            Api::<Secret>::namespaced(client.clone(), &namespace),
            watcher::Config::default().fields(&format!("metadata.name={}", reference.secret_name)),
            &shutdown,
        );
        (store, reference, namespace.clone())
    });
    let caches = Arc::new(Caches {
        namespaces,
        policies,
        secrets,
    });

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding --listen {}", config.listen))?;
    let local = listener.local_addr()?;
    eprintln!("lifeguard: webhook on https://{local}");
    let connections = metrics.connections.clone();
    let review_buffer = BodyBudget::new(
        config.review_buffer_bytes,
        metrics.review_buffer_reserved.clone(),
    );
    let state = Arc::new(WebhookState {
        config: file,
        own_namespace: namespace,
        cluster: caches.clone(),
        metrics,
        max_review_bytes: config.max_review_bytes,
        review_buffer,
    });
    let serving = tokio::spawn(serve_tls(
        listener,
        router(state),
        certificate,
        config.limits.clone(),
        connections,
        shutdown.clone(),
    ));
    health.serving.store(true, Ordering::Release);

    // Ready once every cache has its first complete list.
    let wait_synced = {
        let caches = caches.clone();
        async move {
            caches.namespaces.wait_until_ready().await?;
            caches.policies.wait_until_ready().await?;
            if let Some((store, _, _)) = &caches.secrets {
                store.wait_until_ready().await?;
            }
            Ok::<(), reflector::store::WriterDropped>(())
        }
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        synced = wait_synced => {
            synced.context("a watch cache stopped before it synced")?;
            health.synced.store(true, Ordering::Release);
            eprintln!("lifeguard: webhook caches synced");
        }
    }
    serving
        .await
        .context("the admission server task failed")?
        .context("serving admission requests")?;
    Ok(())
}
