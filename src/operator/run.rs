//! Wiring: the Kubernetes client, the watch caches, the distribution endpoint, the
//! controllers, leader election and the admin endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::Router;
use axum::routing::{get, post};
use futures_util::{FutureExt, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::api::{CapabilityException, McpServerPolicy, PrincipalRevocation};
use crate::distribution::{ACK_PATH, STREAM_PATH};
use crate::runtime::tls::{ReloadingCertificate, serve_tls};
use crate::runtime::{Health, Readiness};

use super::auth::SidecarAuthenticator;
use super::ca_distribution::CaDistributor;
use super::cluster_acks::ClusterAcks;
use super::config::OperatorFileConfig;
use super::controllers::{self, Context};
use super::distributor::{Caches, Distributor};
use super::metrics::OperatorMetrics;
use super::plan::Plan;
use super::propagation::PropagationTracker;
use super::revocation_sink::{KubeRevocationSink, KubeSecretReader};
use super::sessions::Sessions;
use super::ssf::SsfReceiver;
use super::ssf::poll::PollClient;
use super::stream::{self, Distribution, StreamContext};

/// Everything `lifeguard operator` is configured with.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub admin: SocketAddr,
    pub config: Option<PathBuf>,
    /// Limits of the `--listen` port.
    pub limits: crate::runtime::http::ServerLimits,
}

/// Identity of this replica in the Lease.
fn replica_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "lifeguard-operator".into());
    format!("{host}_{}", std::process::id())
}

/// What of an object the plan depends on, as a fingerprint: a change elsewhere (the status
/// the operator itself writes, a pod's phase) does not wake the distributor. Without this the
/// operator's own status writes fed back into replanning, and each replan reconciled every
/// object again.
type Relevant<K> = fn(&K) -> u64;

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

/// A watch cache that wakes the distributor when something the plan depends on changed.
/// Nothing else consumes its stream, so nothing slow can hold it back.
fn cache<K>(
    api: Api<K>,
    changes: Arc<Notify>,
    relevant: Relevant<K>,
) -> (
    Store<K>,
    impl std::future::Future<Output = ()> + Send + 'static,
)
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
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let driver = async move {
        let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        events
            .reflect(writer)
            .for_each(|event| {
                let key = |o: &K| {
                    let m = o.meta();
                    format!(
                        "{}/{}",
                        m.namespace.as_deref().unwrap_or(""),
                        m.name.as_deref().unwrap_or("")
                    )
                };
                let wake = match &event {
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
                std::future::ready(())
            })
            .await;
    };
    (reader, driver)
}

struct OperatorHealth {
    metrics: Arc<OperatorMetrics>,
    synced: AtomicBool,
    serving: AtomicBool,
}

impl Health for OperatorHealth {
    fn readiness(&self) -> Readiness {
        match (
            self.synced.load(Ordering::Acquire),
            self.serving.load(Ordering::Acquire),
        ) {
            (true, true) => Readiness::Ready("ready: caches synced, serving sidecars".into()),
            (false, _) => Readiness::NotReady("watch caches are syncing".into()),
            (true, false) => Readiness::NotReady("the distribution endpoint is starting".into()),
        }
    }

    fn metrics(&self) -> String {
        self.metrics.encode()
    }
}

/// Runs the operator until `shutdown`.
pub async fn run(config: OperatorConfig, shutdown: CancellationToken) -> Result<()> {
    let file = match &config.config {
        Some(path) => OperatorFileConfig::load(path)?,
        None => OperatorFileConfig::default(),
    };
    let certificate = Arc::new(
        ReloadingCertificate::load(&config.tls_cert, &config.tls_key)
            .context("loading the serving certificate (--tls-cert, --tls-key)")?,
    );
    let namespace = crate::runtime::cluster::own_namespace(config.namespace.as_deref());
    let client = crate::runtime::cluster::client(config.kubeconfig.as_deref()).await?;
    // Watch caches.
    let changes = Arc::new(Notify::new());
    let (policies, policy_driver) = cache(
        Api::<McpServerPolicy>::all(client.clone()),
        changes.clone(),
        spec_fingerprint,
    );
    let (exceptions, exception_driver) = cache(
        Api::<CapabilityException>::all(client.clone()),
        changes.clone(),
        spec_fingerprint,
    );
    let (revocations, revocation_driver) = cache(
        Api::<PrincipalRevocation>::all(client.clone()),
        changes.clone(),
        spec_fingerprint,
    );
    let (pods, pod_driver) = cache(
        Api::<Pod>::all(client.clone()),
        changes.clone(),
        pod_fingerprint,
    );
    let (secrets, secret_driver) = cache(
        Api::<Secret>::namespaced(client.clone(), &namespace),
        changes.clone(),
        version_fingerprint,
    );
    // Security events (optional): built before the metrics registry is shared.
    let mut metrics = OperatorMetrics::new();
    let security_events = match &file.security_events {
        None => None,
        Some(events) => {
            let receiver = SsfReceiver::new(
                events,
                Arc::new(KubeSecretReader {
                    client: client.clone(),
                    namespace: namespace.clone(),
                    cache: secrets.clone(),
                }),
                Arc::new(KubeRevocationSink {
                    client: client.clone(),
                }),
            )
            .context("securityEvents")?;
            receiver.metrics().register(&mut metrics.registry);
            Some(Arc::new(receiver))
        }
    };
    let ca_distributor = CaDistributor::new(file.ca_distribution.as_ref(), &mut metrics.registry);
    let metrics = Arc::new(metrics);
    let health = Arc::new(OperatorHealth {
        metrics: metrics.clone(),
        synced: AtomicBool::new(false),
        serving: AtomicBool::new(false),
    });
    let _admin = crate::runtime::admin::spawn(config.admin, health.clone(), shutdown.clone())
        .await
        .context("starting the admin endpoint")?;

    for driver in [
        policy_driver.boxed(),
        exception_driver.boxed(),
        revocation_driver.boxed(),
        pod_driver.boxed(),
        secret_driver.boxed(),
    ] {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = driver => {}
            }
        });
    }
    let caches = Caches {
        policies: policies.clone(),
        exceptions: exceptions.clone(),
        revocations: revocations.clone(),
        pods: pods.clone(),
        secrets,
    };
    if let Some(receiver) = &security_events {
        receiver.spawn_key_refresh(shutdown.clone());
        for transmitter in receiver.poll_transmitters() {
            PollClient::new(receiver.clone(), &transmitter)
                .context("securityEvents poll transmitter")?
                .spawn(shutdown.clone());
        }
    }
    tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        synced = async {
            caches.policies.wait_until_ready().await?;
            caches.exceptions.wait_until_ready().await?;
            caches.revocations.wait_until_ready().await?;
            caches.pods.wait_until_ready().await?;
            caches.secrets.wait_until_ready().await
        } => synced.context("a watch cache stopped before it synced")?,
    }
    tracing::info!("watch caches synced");

    // The first plan exists before any sidecar can connect: a sidecar never receives a
    // snapshot computed from half-filled caches.
    let (sessions, session_events) = Sessions::new();
    let sessions = Arc::new(sessions);
    let tracker = Arc::new(Mutex::new(PropagationTracker::new(Timestamp::now())));
    let (publish, distribution) = watch::channel(Arc::new(Distribution {
        version: 0,
        plan: Arc::new(Plan::default()),
        approver_keys: None,
        approver_keys_hash: None,
    }));
    let replica = replica_identity();
    let acks = Arc::new(ClusterAcks::new(sessions.clone(), replica.clone()));
    let distributor = Distributor {
        caches: caches.clone(),
        approver_keys: file.approver_keys.clone(),
        namespace: namespace.clone(),
        changes: changes.clone(),
        publish,
        tracker: tracker.clone(),
        acks: acks.clone(),
        metrics: metrics.clone(),
    };
    tokio::spawn(distributor.run(shutdown.clone()));
    health.synced.store(true, Ordering::Release);

    // Leader election.
    let (leading_tx, leading) = watch::channel(false);
    {
        let api: Api<Lease> = Api::namespaced(client.clone(), &namespace);
        let metrics = metrics.clone();
        let mut observed = leading.clone();
        tokio::spawn(async move {
            while observed.changed().await.is_ok() {
                metrics.leader.set(i64::from(*observed.borrow()));
            }
        });
        tokio::spawn(super::lease::run(
            api,
            replica.clone(),
            leading_tx,
            shutdown.clone(),
        ));
    }
    if let Some(ca) = ca_distributor {
        let (client, ns) = (client.clone(), namespace.clone());
        ca.spawn(
            client,
            ns,
            replica.clone(),
            leading.clone(),
            shutdown.clone(),
        );
    }

    // Acknowledgements shared between replicas.
    let (remote_tx, remote_changed) = watch::channel(0u64);
    {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        tokio::spawn(super::ack_sync::publish(
            api.clone(),
            acks.clone(),
            leading.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(super::ack_sync::follow(
            api,
            acks.clone(),
            remote_tx,
            leading.clone(),
            shutdown.clone(),
        ));
    }

    // Controllers.
    metrics
        .objects
        .attach(Box::new(super::object_metrics::ObjectSources {
            distribution: distribution.clone(),
            acks: acks.clone(),
            tracker: tracker.clone(),
            leading: leading.clone(),
        }));
    let ctx = Arc::new(Context {
        client: client.clone(),
        distribution: distribution.clone(),
        sessions: sessions.clone(),
        acks,
        tracker,
        leading: leading.clone(),
        pods,
        metrics: metrics.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "lifeguard-operator".into(),
                instance: Some(replica.clone()),
            },
        ),
        bypass: file.bypass_prevention.clone(),
        network_policies: Default::default(),
    });
    let everything = || {
        futures_util::stream::select(
            futures_util::stream::select(
                controllers::changes(distribution.clone()),
                controllers::changes(leading.clone()),
            ),
            controllers::changes(remote_changed.clone()),
        )
    };
    let controller_config = ControllerConfig::default().debounce(Duration::from_millis(50));
    // The controllers keep watches of their own rather than subscribing to the distributor's
    // caches: a shared reflector waits for its slowest subscriber, and status writes (bounded
    // by the API server's latency) must never hold back a policy change on its way to the
    // sidecars.
    let policy_controller = Controller::new(
        Api::<McpServerPolicy>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(controller_config.clone())
    .reconcile_all_on(everything())
    .reconcile_on(controllers::policies_of_pods(
        session_events.pods,
        distribution.clone(),
    ))
    .graceful_shutdown_on(shutdown.clone().cancelled_owned())
    .run(
        controllers::reconcile_policy,
        controllers::retry,
        ctx.clone(),
    )
    .for_each(|_| std::future::ready(()));
    let exception_controller = Controller::new(
        Api::<CapabilityException>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(controller_config.clone())
    .reconcile_all_on(everything())
    .graceful_shutdown_on(shutdown.clone().cancelled_owned())
    .run(
        controllers::reconcile_exception,
        controllers::retry,
        ctx.clone(),
    )
    .for_each(|_| std::future::ready(()));
    let revocation_controller = Controller::new(
        Api::<PrincipalRevocation>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(controller_config)
    .reconcile_all_on(everything())
    .reconcile_on(
        controllers::received(session_events.revocations).map(|name| ObjectRef::new(&name)),
    )
    .graceful_shutdown_on(shutdown.clone().cancelled_owned())
    .run(
        controllers::reconcile_revocation,
        controllers::retry,
        ctx.clone(),
    )
    .for_each(|_| std::future::ready(()));
    tokio::spawn(policy_controller);
    tokio::spawn(exception_controller);
    tokio::spawn(revocation_controller);

    // The distribution endpoint (and security events).
    let stream_ctx = Arc::new(StreamContext {
        authenticator: SidecarAuthenticator::new(client.clone(), ctx.pods.clone()),
        sessions,
        distribution,
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        pods: ctx.pods.clone(),
    });
    let mut router = Router::new()
        .route(STREAM_PATH, get(stream::open_stream))
        .route(ACK_PATH, post(stream::acknowledge))
        .with_state(stream_ctx);
    if let Some(receiver) = security_events {
        router = router.merge(super::ssf::push::router(receiver));
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding --listen {}", config.listen))?;
    let local = listener.local_addr()?;
    eprintln!("lifeguard operator: serving sidecars on https://{local}");
    tracing::info!(%local, %namespace, "operator serving");
    health.serving.store(true, Ordering::Release);
    serve_tls(
        listener,
        router,
        certificate,
        crate::runtime::http::ServerLimits {
            // Streams end themselves at shutdown; acks are short.
            shutdown_grace: Duration::from_secs(5),
            ..config.limits.clone()
        },
        metrics.connections.clone(),
        shutdown.clone(),
    )
    .await
    .context("serving the distribution endpoint")?;
    Ok(())
}
