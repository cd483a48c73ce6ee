//! The sidecar's wiring, one named step of [`super::run`] each: check the configuration, open
//! the ledger and its keys, join the replicas sharing it, build the state every request reads,
//! bind the servers (MCP port, admin port, internal hop), start the background work, serve.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use http::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditLog, AuditTarget, IdentityDigester, TaskHasher};
use crate::identity::store::KeyRegistry;
use crate::ledger::{LedgerLocation, TaskLedger};
use crate::runtime::http::{ConnectionMetrics, ServerLimits};
use crate::runtime::workers::Workers;
use crate::telemetry::metrics::SidecarMetrics;

use super::home_memory::HomeMemory;
use super::policy_source::{PolicyChannels, PolicyPublisher, PolicySource, RevocationProgress};
use super::replica::{OwnHeartbeat, Replica};
use super::state::{AppState, PolicyWatch};
use super::upstream::Upstream;
use super::{
    AUDIT_HASH_SECRET, AUDIT_IDENTITY_SECRET, DELEGATION_JWKS_PATH, IDEMPOTENCY_SECRET,
    SidecarConfig,
};
use super::{
    app_probes, capability, denials, hop, hop_server, objects, pipeline, rate_limit, replica,
    respond, revocation, state, stream_registry, sweeper,
};

/// Refuses flag combinations that cannot work, before anything is opened.
pub(super) fn check(config: &SidecarConfig) -> Result<()> {
    if config.admin.is_none() && !config.app_probes.is_empty() {
        anyhow::bail!("--app-probes needs --admin: the probes are answered on the admin port");
    }
    if config.upstream.scheme_str() != Some("http") {
        anyhow::bail!(
            "--upstream must be an http:// URL of the MCP container on loopback, got {}",
            config.upstream
        );
    }
    Ok(())
}

/// The task ledger and the keys the sidecar keeps in it.
pub(super) struct LedgerKeys {
    ledger: Arc<dyn TaskLedger>,
    hasher: TaskHasher,
    identity_digester: IdentityDigester,
    idempotency_secret: [u8; 32],
    possession: super::possession::Possession,
}

/// Opens the ledger and reads (or makes) its keys.
pub(super) async fn open_ledger(config: &SidecarConfig) -> Result<LedgerKeys> {
    let ledger = config
        .ledger
        .open(config.ledger_scope.clone())
        .await
        .with_context(|| format!("opening the task ledger {}", config.ledger))?;
    // Each ledger operation of a request becomes a child span, when spans are exported.
    let ledger: Arc<dyn TaskLedger> = if crate::telemetry::otel::exporting() {
        Arc::new(crate::ledger::traced::TracedLedger::new(ledger))
    } else {
        ledger
    };
    let hasher = TaskHasher::new(
        ledger
            .secret(AUDIT_HASH_SECRET)
            .await
            .context("reading the audit key from the ledger")?,
    );
    let identity_digester = IdentityDigester::new(
        ledger
            .secret(AUDIT_IDENTITY_SECRET)
            .await
            .context("reading the audit identity key from the ledger")?,
    );
    let idempotency_secret = ledger
        .secret(IDEMPOTENCY_SECRET)
        .await
        .context("reading the idempotency key from the ledger")?;
    let possession = super::possession::Possession::for_ledger(&ledger)
        .await
        .context("reading the DPoP nonce key from the ledger")?;
    Ok(LedgerKeys {
        ledger,
        hasher,
        identity_digester,
        idempotency_secret,
        possession,
    })
}

/// This sidecar as one replica of its server: the hop port bound, the first heartbeat
/// recorded.
pub(super) struct Membership {
    replica: Replica,
    /// The internal hop's port (`--internal-listen`), served with the other servers.
    hop_listener: Option<TcpListener>,
    /// Where other replicas reach this one's hop, as the heartbeat says.
    advertise: Option<String>,
    own_beats: Arc<OwnHeartbeat>,
}

/// Binds the hop port (before the heartbeat says where it is) and records the first
/// heartbeat.
pub(super) async fn join_replicas(config: &SidecarConfig, keys: &LedgerKeys) -> Result<Membership> {
    let ledger = &keys.ledger;
    let hop_listener = match config.internal_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the internal hop {addr}"))?,
        ),
        None => None,
    };
    let hop_bound = hop_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    let advertise = hop_address(config, hop_bound)?;
    let hop = if ledger.is_shared() {
        Some(
            hop::Hop::new(
                ledger.as_ref(),
                config.upstream_timeout + Duration::from_secs(5),
            )
            .await
            .context("reading the internal hop key from the ledger")?,
        )
    } else {
        None
    };
    let own_beats = Arc::new(OwnHeartbeat::new(
        Arc::new(HomeMemory::default()),
        config.heartbeat_ttl,
    ));
    replica::beat_once(ledger.as_ref(), advertise.as_deref(), &own_beats)
        .await
        .context("recording this replica's heartbeat in the ledger")?;
    Ok(Membership {
        replica: Replica::new(ledger.as_ref(), hop, own_beats.clone()),
        hop_listener,
        advertise,
        own_beats,
    })
}

/// Where other replicas reach this one's internal hop, checked against the ledger in use.
fn hop_address(config: &SidecarConfig, bound: Option<SocketAddr>) -> Result<Option<String>> {
    let Some(listen) = bound else {
        if config.internal_advertise.is_some() {
            anyhow::bail!("--internal-advertise needs --internal-listen");
        }
        return Ok(None);
    };
    if matches!(config.ledger, LedgerLocation::Sqlite(_)) {
        anyhow::bail!(
            "--internal-listen needs a ledger shared by the replicas (postgres://…): with an \
             SQLite ledger every task is answered by the replica that holds its file"
        );
    }
    match &config.internal_advertise {
        Some(address) => Ok(Some(address.clone())),
        None if listen.ip().is_unspecified() => anyhow::bail!(
            "--internal-listen {listen} listens on every address: say with \
             --internal-advertise (or $LIFEGUARD_INTERNAL_ADVERTISE) which one other replicas use"
        ),
        // The bound address: a port of 0 says which one the system chose.
        None => Ok(Some(listen.to_string())),
    }
}

/// The state every request reads, and what the servers take besides.
pub(super) struct Built {
    pub(super) app: Arc<AppState>,
    /// The audit trail's writer, given a moment to flush after the last request.
    audit_writer: JoinHandle<()>,
    /// Counts refusals and timeouts of the MCP port (registered in the sidecar's metrics).
    connections: ConnectionMetrics,
    hop_listener: Option<TcpListener>,
}

/// Work that runs beside the servers until shutdown, not started yet.
pub(super) struct Background {
    advertise: Option<String>,
    own_beats: Arc<OwnHeartbeat>,
    follow: AuditFollow,
    source: Box<dyn PolicySource>,
    publisher: PolicyPublisher,
    progress: watch::Sender<RevocationProgress>,
}

/// The audit trail, the metrics, the policy source and the state every request reads.
pub(super) async fn build_state(
    config: &SidecarConfig,
    keys: LedgerKeys,
    membership: Membership,
    shutdown: &CancellationToken,
) -> Result<(Built, Background)> {
    let initial_target = match &config.audit_file {
        Some(path) => AuditTarget::File(path.clone()),
        None => AuditTarget::Stdout,
    };
    let (audit, audit_writer) = AuditLog::open(initial_target).context("opening the audit file")?;
    let connections = ConnectionMetrics::default();
    let mut metrics = SidecarMetrics::new();
    connections.register(&mut metrics.registry);
    metrics.registry.register(
        "audit_write_errors",
        "Failed writes of the audit trail",
        audit.health().write_errors.clone(),
    );
    metrics.registry.register(
        "audit_dropped",
        "Audit events dropped because the writer's queue was full or stopped",
        audit.health().dropped.clone(),
    );
    let tls = crate::runtime::tls_client::client_config(&config.policy.ca_files())
        .context("setting up outbound TLS")?;
    let registry = Arc::new(KeyRegistry::with_tls(shutdown.clone(), tls.clone()));
    let source = config
        .policy
        .clone()
        .into_source(registry, tls, &mut metrics, &keys.ledger)
        .await?;
    let metrics = Arc::new(metrics);
    let PolicyChannels {
        publisher,
        policy,
        status,
        progress,
    } = PolicyPublisher::channel(metrics.clone());
    let upstream = Upstream::new(
        config.upstream.clone(),
        config.upstream_timeout,
        Some(metrics.upstream_seconds.clone()),
    )
    .with_http2(config.upstream_http2);
    let rate_limits = rate_limit::RateLimiter::for_ledger(&keys.ledger);
    let app = Arc::new(AppState {
        policy,
        source: status,
        ledger: keys.ledger,
        upstream,
        audit,
        hasher: keys.hasher,
        metrics,
        idempotency_secret: keys.idempotency_secret,
        possession: keys.possession,
        objects: objects::ObjectGate::default(),
        rate_limits,
        delegation: crate::identity::delegation::DelegationKeys::new(
            jiff::Timestamp::now().as_second(),
        )
        .context("generating the delegation signing key")?,
        gate: capability::CapabilityGate::default(),
        polls: state::PollClock::default(),
        reconciles: state::ReconcileClock::default(),
        denials: denials::DenialAudit::default(),
        streams: Arc::new(stream_registry::StreamRegistry::default()),
        in_flight: Arc::default(),
        replica: membership.replica,
        shutdown: shutdown.clone(),
        upstream_timeout: config.upstream_timeout,
        cancel_confirm_timeout: config.cancel_confirm_timeout,
    });
    let background = Background {
        advertise: membership.advertise,
        own_beats: membership.own_beats,
        follow: AuditFollow {
            // Without --audit-file, the policy's audit.sink decides where the trail goes.
            sink: config.audit_file.is_none(),
            digester: keys.identity_digester,
        },
        source,
        publisher,
        progress,
    };
    let built = Built {
        app,
        audit_writer,
        connections,
        hop_listener: membership.hop_listener,
    };
    Ok((built, background))
}

/// The bound MCP port, served by [`serve`] once the background work runs.
pub(super) struct Servers {
    listener: TcpListener,
    mcp: Router,
}

/// Binds the MCP port, then starts the admin port (with the app's probes and the delegation
/// keys) and the internal hop.
pub(super) async fn bind_servers(
    config: &SidecarConfig,
    built: &mut Built,
    shutdown: &CancellationToken,
) -> Result<Servers> {
    let app = &built.app;
    let mcp = Router::new()
        .route("/mcp", post(pipeline::handle_mcp))
        .route(
            "/.well-known/oauth-protected-resource/{*path}",
            get(protected_resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource",
            get(protected_resource_metadata),
        )
        .with_state(app.clone());
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let local = listener.local_addr()?;
    eprintln!("lifeguard: listening on http://{local}/mcp");
    tracing::info!(%local, upstream = %config.upstream, "sidecar listening");

    if let Some(admin_addr) = config.admin {
        let probes = app_probes::router(Arc::new(config.app_probes.clone()))
            .merge(delegation_keys_router(app.clone()));
        crate::runtime::admin::spawn_with(admin_addr, app.clone(), probes, shutdown.clone())
            .await?;
    }

    if let Some(hop_listener) = built.hop_listener.take() {
        let hop_local = hop_listener.local_addr()?;
        eprintln!("lifeguard: internal hop on http://{hop_local}{}", hop::PATH);
        let router = hop_server::router(app.clone());
        let limits = config.limits.clone();
        let hop_shutdown = shutdown.clone();
        let hop_workers = config.workers.clone();
        tokio::spawn(async move {
            let metrics = ConnectionMetrics::default();
            if let Err(e) = serve_placed(
                hop_listener,
                router,
                limits,
                metrics,
                hop_shutdown,
                hop_workers,
            )
            .await
            {
                tracing::error!(error = %e, "the internal hop stopped");
            }
        });
    }
    Ok(Servers { listener, mcp })
}

/// Starts the heartbeat, the audit settings' follower, the policy source, the sweeper and
/// the revocation applier, each until `shutdown`.
pub(super) fn spawn_background(
    app: &Arc<AppState>,
    background: Background,
    shutdown: &CancellationToken,
) {
    let Background {
        advertise,
        own_beats,
        follow,
        source,
        publisher,
        progress,
    } = background;
    tokio::spawn(replica::heartbeat(
        app.ledger.clone(),
        advertise,
        own_beats,
        shutdown.clone(),
    ));
    tokio::spawn(follow_audit_settings(
        app.policy.clone(),
        app.audit.clone(),
        follow,
        shutdown.clone(),
    ));
    tokio::spawn(source.run(publisher, shutdown.clone()));
    tokio::spawn(sweeper::sweep(app.clone(), shutdown.clone()));
    tokio::spawn(revocation::apply_revocations(
        app.clone(),
        app.policy.clone(),
        progress,
        shutdown.clone(),
    ));
}

/// Serves MCP until `shutdown`, then gives the audit trail up to five seconds to flush.
pub(super) async fn serve(
    config: &SidecarConfig,
    servers: Servers,
    built: Built,
    shutdown: CancellationToken,
) -> Result<()> {
    let Built {
        app,
        audit_writer,
        connections,
        ..
    } = built;
    serve_placed(
        servers.listener,
        servers.mcp,
        config.limits.clone(),
        connections,
        shutdown,
        config.workers.clone(),
    )
    .await
    .context("serving MCP")?;
    drop(app);
    let _ = tokio::time::timeout(Duration::from_secs(5), audit_writer).await;
    Ok(())
}

/// Serves `router` on the workers if there are any, else on this runtime.
async fn serve_placed(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
    workers: Option<Workers>,
) -> std::io::Result<()> {
    match workers {
        Some(workers) => {
            crate::runtime::http::serve_on(listener, router, limits, metrics, shutdown, workers)
                .await
        }
        None => crate::runtime::http::serve(listener, router, limits, metrics, shutdown).await,
    }
}

/// The public keys of the sidecar's delegation assertions (`upstream.identity: delegation`),
/// for the protected server to verify them with; served on the admin port, which only the pod
/// reaches. Not cacheable beyond a minute: keys rotate.
fn delegation_keys_router(app: Arc<AppState>) -> Router {
    Router::new()
        .route(
            DELEGATION_JWKS_PATH,
            get(async |State(app): State<Arc<AppState>>| {
                let mut response = respond::json(StatusCode::OK, &app.delegation.jwks());
                response.headers_mut().insert(
                    http::header::CACHE_CONTROL,
                    http::HeaderValue::from_static("max-age=60"),
                );
                response
            }),
        )
        .with_state(app)
}

/// RFC 9728 protected resource metadata, so clients can discover which authorization servers
/// issue tokens for this server, which DPoP proof algorithms it accepts and whether it requires
/// DPoP-bound tokens (RFC 9449 §5.1: true when every trusted issuer requires them).
async fn protected_resource_metadata(State(app): State<Arc<AppState>>) -> Response {
    match app.policy() {
        Some(policy) => {
            let effective = &policy.effective;
            let algorithms: Vec<&str> = effective
                .dpop_rules()
                .algorithms
                .iter()
                .map(|a| a.as_str())
                .collect();
            respond::json(
                StatusCode::OK,
                &serde_json::json!({
                    "resource": effective.resource,
                    "authorization_servers": effective.issuers.iter().map(|i| &i.issuer).collect::<Vec<_>>(),
                    "bearer_methods_supported": ["header"],
                    "dpop_signing_alg_values_supported": algorithms,
                    "dpop_bound_access_tokens_required": effective.requires_proof_of_possession(),
                }),
            )
        }
        None => respond::status(StatusCode::SERVICE_UNAVAILABLE),
    }
}

/// What of the policy's audit settings the trail follows.
struct AuditFollow {
    /// `audit.sink` (unless `--audit-file` fixed the target).
    sink: bool,
    /// Applied while `audit.identityDigests` is on.
    digester: IdentityDigester,
}

/// Applies the policy's audit settings whenever the policy changes: the sink, and whether
/// subjects and tenants are written as digests.
async fn follow_audit_settings(
    mut policy: PolicyWatch,
    audit: AuditLog,
    follow: AuditFollow,
    shutdown: CancellationToken,
) {
    loop {
        let rules = policy
            .borrow_and_update()
            .as_ref()
            .map(|p| p.effective.audit.clone());
        if let Some(rules) = rules {
            audit.set_identity_digests(rules.identity_digests.then(|| follow.digester.clone()));
            if follow.sink {
                audit.retarget(match (rules.sink, &rules.path) {
                    (crate::api::AuditSink::File, Some(path)) => AuditTarget::File(path.into()),
                    _ => AuditTarget::Stdout,
                });
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = policy.changed() => if changed.is_err() { return },
        }
    }
}
