//! Wiring of `lifeguard operator`, one named step each: the watch caches and the admin
//! endpoint; once the caches have synced, leader election, the distributor (which starts
//! revocation traces while this replica leads), the CA distribution, the shared
//! acknowledgements and the controllers; last the distribution endpoint.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::Router;
use axum::routing::{get, post};
use futures_util::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::api::{CapabilityException, McpServerPolicy, PrincipalRevocation};
use crate::distribution::{ACK_PATH, STREAM_PATH};
use crate::runtime::http::Http2Limits;
use crate::runtime::readiness::{ReadinessTexts, SyncedAndServing};
use crate::runtime::shell::{Shell, ShellConfig};

use super::auth::SidecarAuthenticator;
use super::ca_distribution::CaDistributor;
use super::cluster_acks::ClusterAcks;
use super::config::OperatorFileConfig;
use super::controllers::{self, Context};
use super::distributor::{Caches, Distributor};
use super::metrics::OperatorMetrics;
use super::object_metrics::ObjectSources;
use super::plan::Plan;
use super::propagation::PropagationTracker;
use super::revocation_sink::{KubeRevocationSink, KubeSecretReader};
use super::sessions::{SessionEvents, Sessions};
use super::ssf::SsfReceiver;
use super::ssf::poll::PollClient;
use super::stream::{self, Distribution, StreamContext};
use super::watches;

/// Everything `lifeguard operator` is configured with.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Cluster, `--listen` and `--admin`.
    pub shell: ShellConfig,
    pub config: Option<PathBuf>,
}

/// How the operator words its readiness.
const READINESS: ReadinessTexts = ReadinessTexts {
    ready: "ready: caches synced, serving sidecars",
    starting: "the distribution endpoint is starting",
};

/// Runs the operator until `shutdown`. Nothing but the watches, the admin endpoint and
/// security events starts before the caches have synced: the first plan exists before any
/// sidecar can connect, so a sidecar never receives a snapshot computed from half-filled
/// caches.
pub async fn run(config: OperatorConfig, shutdown: CancellationToken) -> Result<()> {
    let file = match &config.config {
        Some(path) => OperatorFileConfig::load(path)?,
        None => OperatorFileConfig::default(),
    };
    let shell = Shell::start(config.shell).await?;

    // Caches, and what reads them before they fill.
    let changes = Arc::new(Notify::new());
    let (caches, watches) = watches::caches(&shell.client, &shell.namespace, &changes);
    let mut metrics = OperatorMetrics::new();
    let security_events = security_events(&file, &shell, &caches, &mut metrics)?;
    let ca_distributor = CaDistributor::new(file.ca_distribution.as_ref(), &mut metrics.registry);
    let metrics = Arc::new(metrics);
    let health = spawn_admin(&shell, &metrics, &shutdown).await?;
    let caches_synced = watches.spawn(&shutdown);
    if let Some(receiver) = &security_events {
        spawn_security_events(receiver, &shutdown)?;
    }
    tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        synced = caches_synced.wait() => synced.context("a watch cache stopped before it synced")?,
    }
    tracing::info!("watch caches synced");

    // Background work, once the caches are whole.
    let operator = Operator {
        shell,
        file,
        metrics,
        replica: replica_identity(),
        shutdown,
    };
    let pods = caches.pods.clone();
    let leading = operator.spawn_leader_election();
    let (distributing, session_events) = operator.spawn_distributor(caches, changes, &leading);
    health.mark_synced();
    if let Some(ca) = ca_distributor {
        operator.spawn_ca_distribution(ca, &leading);
    }
    let remote_changed = operator.spawn_ack_sync(&distributing.acks, &leading);
    let ctx = operator.spawn_controllers(
        &distributing,
        session_events,
        pods,
        &leading,
        &remote_changed,
    );

    // The distribution endpoint (and security events).
    operator
        .serve_sidecars(ctx, distributing, security_events, &health)
        .await
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

/// The security events receiver when `securityEvents` is configured, its metrics registered
/// in `metrics`.
fn security_events(
    file: &OperatorFileConfig,
    shell: &Shell,
    caches: &Caches,
    metrics: &mut OperatorMetrics,
) -> Result<Option<Arc<SsfReceiver>>> {
    let Some(events) = &file.security_events else {
        return Ok(None);
    };
    let receiver = SsfReceiver::new(
        events,
        Arc::new(KubeSecretReader {
            client: shell.client.clone(),
            namespace: shell.namespace.clone(),
            cache: caches.secrets.clone(),
        }),
        Arc::new(KubeRevocationSink {
            client: shell.client.clone(),
        }),
    )
    .context("securityEvents")?;
    receiver.metrics().register(&mut metrics.registry);
    Ok(Some(Arc::new(receiver)))
}

/// The admin endpoint: ready once the caches have synced and the distribution endpoint
/// serves.
async fn spawn_admin(
    shell: &Shell,
    metrics: &Arc<OperatorMetrics>,
    shutdown: &CancellationToken,
) -> Result<Arc<SyncedAndServing>> {
    let health = Arc::new(SyncedAndServing::new(READINESS, {
        let metrics = metrics.clone();
        move || metrics.encode()
    }));
    shell.spawn_admin(health.clone(), shutdown).await?;
    Ok(health)
}

/// The receiver's signing-key refresh and one client per poll transmitter.
fn spawn_security_events(receiver: &Arc<SsfReceiver>, shutdown: &CancellationToken) -> Result<()> {
    receiver.spawn_key_refresh(shutdown.clone());
    for transmitter in receiver.poll_transmitters() {
        PollClient::new(receiver.clone(), &transmitter)
            .context("securityEvents poll transmitter")?
            .spawn(shutdown.clone());
    }
    Ok(())
}

/// What every step after the caches have synced reads.
struct Operator {
    shell: Shell,
    file: OperatorFileConfig,
    metrics: Arc<OperatorMetrics>,
    /// This replica's identity in the Lease, the ack tables and Events.
    replica: String,
    shutdown: CancellationToken,
}

/// The published distribution, the sidecars' sessions and what they acknowledged.
struct Distributing {
    distribution: watch::Receiver<Arc<Distribution>>,
    sessions: Arc<Sessions>,
    tracker: Arc<Mutex<PropagationTracker>>,
    acks: Arc<ClusterAcks>,
}

impl Operator {
    /// The distributor: plans from the caches on every change and publishes the distribution.
    fn spawn_distributor(
        &self,
        caches: Caches,
        changes: Arc<Notify>,
        leading: &watch::Receiver<bool>,
    ) -> (Distributing, SessionEvents) {
        let (sessions, session_events) = Sessions::new();
        let sessions = Arc::new(sessions);
        let tracker = Arc::new(Mutex::new(PropagationTracker::new(Timestamp::now())));
        let (publish, distribution) = watch::channel(Arc::new(Distribution {
            version: 0,
            plan: Arc::new(Plan::default()),
            approver_keys: None,
            approver_keys_hash: None,
        }));
        let acks = Arc::new(ClusterAcks::new(sessions.clone(), self.replica.clone()));
        let distributor = Distributor {
            caches,
            approver_keys: self.file.approver_keys.clone(),
            namespace: self.shell.namespace.clone(),
            changes,
            publish,
            tracker: tracker.clone(),
            acks: acks.clone(),
            metrics: self.metrics.clone(),
            client: self.shell.client.clone(),
            leading: leading.clone(),
            started_traces: Mutex::default(),
        };
        tokio::spawn(distributor.run(self.shutdown.clone()));
        let distributing = Distributing {
            distribution,
            sessions,
            tracker,
            acks,
        };
        (distributing, session_events)
    }

    /// Leader election on the Lease; the receiver says whether this replica leads.
    fn spawn_leader_election(&self) -> watch::Receiver<bool> {
        let (leading_tx, leading) = watch::channel(false);
        let api: Api<Lease> = Api::namespaced(self.shell.client.clone(), &self.shell.namespace);
        let metrics = self.metrics.clone();
        let mut observed = leading.clone();
        tokio::spawn(async move {
            while observed.changed().await.is_ok() {
                metrics.leader.set(i64::from(*observed.borrow()));
            }
        });
        tokio::spawn(super::lease::run(
            api,
            self.replica.clone(),
            leading_tx,
            self.shutdown.clone(),
        ));
        leading
    }

    /// The CA ConfigMap in every opted-in namespace, written while this replica leads.
    fn spawn_ca_distribution(&self, ca: CaDistributor, leading: &watch::Receiver<bool>) {
        ca.spawn(
            self.shell.client.clone(),
            self.shell.namespace.clone(),
            self.replica.clone(),
            leading.clone(),
            self.shutdown.clone(),
        );
    }

    /// Acknowledgements shared between replicas: this replica's table published, the others'
    /// followed; the receiver changes when another replica's table did.
    fn spawn_ack_sync(
        &self,
        acks: &Arc<ClusterAcks>,
        leading: &watch::Receiver<bool>,
    ) -> watch::Receiver<u64> {
        let (remote_tx, remote_changed) = watch::channel(0u64);
        let api: Api<ConfigMap> = Api::namespaced(self.shell.client.clone(), &self.shell.namespace);
        tokio::spawn(super::ack_sync::publish(
            api.clone(),
            acks.clone(),
            leading.clone(),
            self.shutdown.clone(),
        ));
        tokio::spawn(super::ack_sync::follow(
            api,
            acks.clone(),
            remote_tx,
            leading.clone(),
            self.shutdown.clone(),
        ));
        remote_changed
    }

    /// The per-object metrics and the three status controllers (leader only: they write
    /// nothing while another replica leads); returns their context.
    fn spawn_controllers(
        &self,
        distributing: &Distributing,
        session_events: SessionEvents,
        pods: Store<Pod>,
        leading: &watch::Receiver<bool>,
        remote_changed: &watch::Receiver<u64>,
    ) -> Arc<Context> {
        let client = &self.shell.client;
        self.metrics.objects.attach(Box::new(ObjectSources {
            distribution: distributing.distribution.clone(),
            acks: distributing.acks.clone(),
            tracker: distributing.tracker.clone(),
            leading: leading.clone(),
        }));
        let ctx = Arc::new(Context {
            client: client.clone(),
            distribution: distributing.distribution.clone(),
            sessions: distributing.sessions.clone(),
            acks: distributing.acks.clone(),
            tracker: distributing.tracker.clone(),
            leading: leading.clone(),
            pods,
            metrics: self.metrics.clone(),
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "lifeguard-operator".into(),
                    instance: Some(self.replica.clone()),
                },
            ),
            bypass: self.file.bypass_prevention.clone(),
            network_policies: Default::default(),
        });
        let everything = || {
            futures_util::stream::select(
                futures_util::stream::select(
                    controllers::changes(distributing.distribution.clone()),
                    controllers::changes(leading.clone()),
                ),
                controllers::changes(remote_changed.clone()),
            )
        };
        let controller_config = ControllerConfig::default()
            .debounce(Duration::from_millis(50))
            .concurrency(controllers::RECONCILE_CONCURRENCY);
        let shutdown = &self.shutdown;
        // The controllers keep watches of their own rather than subscribing to the
        // distributor's caches: a shared reflector waits for its slowest subscriber, and status
        // writes (bounded by the API server's latency) must never hold back a policy change on
        // its way to the sidecars.
        let policy_controller = Controller::new(
            Api::<McpServerPolicy>::all(client.clone()),
            watcher::Config::default(),
        )
        .with_config(controller_config.clone())
        .reconcile_all_on(everything())
        .reconcile_on(controllers::policies_of_pods(
            session_events.pods,
            distributing.distribution.clone(),
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
        ctx
    }

    /// Serves the distribution endpoint (and the security events push) until `shutdown`.
    async fn serve_sidecars(
        self,
        ctx: Arc<Context>,
        distributing: Distributing,
        security_events: Option<Arc<SsfReceiver>>,
        health: &SyncedAndServing,
    ) -> Result<()> {
        let Self {
            shell,
            metrics,
            shutdown,
            ..
        } = self;
        let stream_ctx = Arc::new(StreamContext {
            authenticator: SidecarAuthenticator::new(shell.client.clone(), ctx.pods.clone()),
            sessions: distributing.sessions,
            distribution: distributing.distribution,
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
        let listener = shell.bind().await?;
        let local = listener.local_addr()?;
        eprintln!("lifeguard operator: serving sidecars on https://{local}");
        tracing::info!(%local, namespace = %shell.namespace, "operator serving");
        health.mark_serving();
        let limits = crate::runtime::http::ServerLimits {
            // Streams end themselves at shutdown; acks are short.
            shutdown_grace: Duration::from_secs(5),
            http2: Some(distribution_http2()),
            ..shell.limits().clone()
        };
        shell
            .serve(
                listener,
                router,
                limits,
                metrics.connections.clone(),
                shutdown,
            )
            .await
            .context("serving the distribution endpoint")?;
        Ok(())
    }
}

/// HTTP/2 on the distribution port (offered in ALPN before HTTP/1.1): a sidecar's policy stream
/// and its acknowledgements share one connection, so a revocation's acknowledgements from a
/// connected fleet open no connections (each was a TLS handshake and about 30 KiB of the
/// operator's memory while it lasted, a thousand at once when a revocation reaches a thousand
/// sidecars), and an acknowledgement reaches the replica holding its stream by construction.
/// Every stream is admitted against the port's connection caps as a connection would be.
fn distribution_http2() -> Http2Limits {
    Http2Limits {
        max_concurrent_streams: STREAMS_PER_CONNECTION,
        ..Http2Limits::default()
    }
}

/// Requests one sidecar connection may have open at once: its stream and an acknowledgement
/// are two; the rest is room for a retry overlapping an answer still on its way.
const STREAMS_PER_CONNECTION: u32 = 4;
