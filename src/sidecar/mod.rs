//! The enforcement sidecar: a reverse proxy in front of one MCP server that binds every task to
//! its owner, keeps a durable ledger of tasks, and audits every decision.
//!
//! # How a request flows
//!
//! `POST /mcp` → [`pipeline`] (policy in force, Origin, token, envelope, protocol checks) →
//! one handler per kind of request: [`tasks`] (`tools/call`, `tasks/*`), [`listen`]
//! (`subscriptions/listen`) or [`relay`] (everything else) → the server on loopback.
//!
//! - A `tasks/get` walks `pipeline` → `tasks::get` → `decisions::plan_read` → (ledger or
//!   `upstream`) → `decisions::interpret_task_reply` → `task_state` (record what was learned)
//!   → `capability_screen` → `respond`.
//! - A task-creating `tools/call` walks `pipeline` → `tasks::create` (scopes → reserve a slot →
//!   `relay::send_and_relay` with the creation as its [`relay::FinalStep`] → confirm durably via
//!   `decisions::confirmation_terms` → answer). Relay names no task code.
//!
//! - On a shared (PostgreSQL) ledger with per-replica server state, a request about a task
//!   homed on another replica is authorized here, then forwarded over the signed internal hop
//!   ([`hop`]) from `tasks::authorized_task`; the home replica's [`hop_server`] runs it through
//!   `pipeline::serve` as if the client had asked it. Listen subscriptions to such tasks are
//!   forwarded the same way (`listen::remote`).
//!
//! Background jobs: [`sweeper`] (the cancellation outbox; deadlines, retention and orphaned
//! tasks under the sweep lease), [`revocation`] (applying new revocations) and the heartbeat
//! ([`replica`]). Policy arrives through a `watch` channel fed by a [`policy_source`]: the
//! policy file in standalone mode ([`policy_file`]), the operator's distribution stream in a
//! cluster ([`control_plane`], which keeps the last snapshot with [`snapshot_store`]). The
//! revocation applier reports on a second `watch` (defined in `policy_source`) when a policy's
//! revocations are all applied, which is when the control plane source acknowledges it.
//!
//! # Layers
//!
//! A module imports only from layers below its own, top to bottom; `tests/it/architecture.rs`
//! checks that, that no modules import each other in a cycle, and that this table and
//! docs/design.md's name every module here.
//!
//! | layer | modules |
//! |---|---|
//! | entry | `mod.rs` (`run`), `hop_server` |
//! | pipeline | `pipeline` |
//! | handlers | `tasks`, `listen`, `client_cancel` |
//! | relay | `relay` (everything else; `tasks` implements its `FinalStep`) |
//! | background | `sweeper`, `revocation` |
//! | task rules with IO | `cancellation`, `capability_screen`, `logging_gate` (the deprecated logging surface), `minimize` (`tasks.results` applied to every server-supplied text), `object_access` (`tasks.objects` per request) |
//! | task services | `delegate` (delegation assertions, identity lease), `server_tasks` |
//! | task record | `task_state` |
//! | policy sources | `policy_file`, `control_plane` (its own `apply`, `stream`, `framing`, `backoff`) |
//! | shared state | `state` |
//! | this replica | `replica` (home decisions, heartbeat, sweep lease) |
//! | replica parts | `hop` (the signed internal hop's client), `home_memory` (its unfinished tasks, as last read), `denials` |
//! | request context | `context` |
//! | source contract | `policy_source` (the policy, status and revocation-progress channels) |
//! | policy in force | `active_policy`, `error` |
//! | leaves | `decisions` (pure), `respond`, `forward`, `upstream` (with its bounded event bodies and HTTP/2 pool), `capability` + `capability_refusal` (its refusals: audit and metric), `objects` (`tasks.objects`: the authorizer and its cache), `stream_registry`, `in_flight` (requests in flight per caller), `snapshot_store`, `app_probes` (the app's probes on the admin port) |

mod active_policy;
mod app_probes;
mod cancellation;
mod capability;
mod capability_refusal;
mod capability_screen;
mod client_cancel;
mod context;
mod control_plane;
mod decisions;
mod delegate;
mod denials;
mod error;
mod forward;
mod home_memory;
mod hop;
mod hop_server;
mod in_flight;
mod listen;
mod logging_gate;
mod minimize;
mod object_access;
mod objects;
mod pipeline;
mod policy_file;
mod policy_source;
mod relay;
mod replica;
mod respond;
mod revocation;
mod server_tasks;
mod snapshot_store;
mod state;
mod stream_registry;
mod sweeper;
mod task_state;
mod tasks;
mod upstream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use http::{StatusCode, Uri};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditLog, AuditTarget, IdentityDigester, TaskHasher};
use crate::identity::store::KeyRegistry;
use crate::ledger::{LedgerLocation, LedgerScope, TaskLedger};
use crate::runtime::http::{ConnectionMetrics, ServerLimits};
use crate::runtime::workers::Workers;
use crate::runtime::{Health, Readiness};
use crate::telemetry::metrics::{ControlPlaneMetrics, SidecarMetrics};

use control_plane::{ControlPlaneConfig, ControlPlaneSource};
use policy_file::FilePolicySource;
use policy_source::{PolicyChannels, PolicyPublisher, PolicySource};
use state::{AppState, PolicyWatch};
use upstream::Upstream;

pub use app_probes::{AppProbeError, AppProbes};
pub use upstream::UpstreamHttp2;

/// Which source feeds the sidecar's policy.
#[derive(Clone, Debug)]
pub enum PolicySourceConfig {
    /// Standalone mode: a file of CRD YAML (McpServerPolicy, CapabilityException,
    /// PrincipalRevocation), reloaded when it or the approver keys change.
    File {
        path: PathBuf,
        /// JWKS of the approvers whose signatures make CapabilityExceptions valid.
        approver_keys: Option<PathBuf>,
    },
    /// Cluster mode: snapshots streamed by the operator (`lifeguard operator`).
    ControlPlane {
        /// `https://HOST:PORT` of the operator's distribution endpoint.
        url: url::Url,
        /// A PEM bundle: the only roots the policy stream trusts when given (issuers' JWKS
        /// trust it besides the system roots and `SSL_CERT_FILE`).
        ca_file: Option<PathBuf>,
        /// The projected ServiceAccount token presented as the bearer, re-read at every dial.
        token_file: PathBuf,
        pod_namespace: String,
        pod_name: String,
        /// Where the last snapshot in force is kept (see [`snapshot_path_beside`]).
        snapshot_path: PathBuf,
    },
}

/// Where cluster mode keeps the last snapshot: in `state_dir` when given, else beside an
/// SQLite ledger's file; a shared (PostgreSQL) ledger has no file, so it needs `state_dir`.
pub fn snapshot_path(ledger: &LedgerLocation, state_dir: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = state_dir {
        return Ok(dir.join(snapshot_store::FILE_NAME));
    }
    match ledger {
        LedgerLocation::Sqlite(path) => Ok(snapshot_store::path_beside(path)),
        LedgerLocation::Postgres(_) => anyhow::bail!(
            "cluster mode with a postgres:// ledger needs --state-dir (or $LIFEGUARD_STATE_DIR): \
             a directory for the last policy snapshot"
        ),
    }
}

impl PolicySourceConfig {
    /// CA files outbound TLS trusts besides the system roots and `SSL_CERT_FILE`.
    fn ca_files(&self) -> Vec<PathBuf> {
        match self {
            Self::File { .. } => Vec::new(),
            Self::ControlPlane { ca_file, .. } => ca_file.iter().cloned().collect(),
        }
    }

    /// The source this configuration names; cluster mode registers its metrics in `metrics`.
    async fn into_source(
        self,
        registry: Arc<KeyRegistry>,
        tls: rustls::ClientConfig,
        metrics: &mut SidecarMetrics,
        ledger: &Arc<dyn TaskLedger>,
    ) -> Result<Box<dyn PolicySource>> {
        Ok(match self {
            Self::File {
                path,
                approver_keys,
            } => Box::new(FilePolicySource::new(path, approver_keys, registry)),
            Self::ControlPlane {
                url,
                ca_file,
                token_file,
                pod_namespace,
                pod_name,
                snapshot_path,
            } => {
                if url.scheme() != "https" {
                    anyhow::bail!("--control-plane must be an https:// URL, got {url}");
                }
                let snapshot_key = snapshot_store::SnapshotKey::new(
                    ledger
                        .secret(SNAPSHOT_SECRET)
                        .await
                        .context("reading the snapshot key from the ledger")?,
                );
                let config = ControlPlaneConfig {
                    url,
                    token_file,
                    pod_namespace,
                    pod_name,
                    snapshot_path,
                    snapshot_key,
                    snapshot_generations: snapshot_store::SnapshotGenerations::new(
                        Arc::clone(ledger),
                        &ledger.scope().replica,
                    ),
                    silence_timeout: control_plane::SILENCE_TIMEOUT,
                };
                // With --control-plane-ca the policy stream trusts that CA alone (issuers'
                // JWKS keep the system roots); without it, the shared configuration.
                let tls = match ca_file {
                    Some(ca) => crate::runtime::tls_client::pinned_client_config(&[ca])
                        .context("setting up TLS for the control plane")?,
                    None => tls,
                };
                let metrics = ControlPlaneMetrics::register(&mut metrics.registry);
                Box::new(
                    ControlPlaneSource::new(config, tls, registry, metrics)
                        .context("building the control plane client")?,
                )
            }
        })
    }
}

/// Everything `lifeguard sidecar` is configured with.
#[derive(Clone, Debug)]
pub struct SidecarConfig {
    pub policy: PolicySourceConfig,
    pub upstream: Uri,
    pub listen: SocketAddr,
    pub ledger: LedgerLocation,
    /// Which server's tasks this sidecar's ledger rows belong to, and which replica it is.
    pub ledger_scope: LedgerScope,
    /// Where the internal hop listens for requests other replicas forward (shared ledgers).
    pub internal_listen: Option<SocketAddr>,
    /// How long a replica may go without a heartbeat before its unfinished tasks fail (it
    /// beats every sixth of it).
    pub heartbeat_ttl: Duration,
    /// How other replicas reach this one's hop (`host:port`); default: `internal_listen` when
    /// it names a specific address.
    pub internal_advertise: Option<String>,
    pub admin: Option<SocketAddr>,
    pub audit_file: Option<PathBuf>,
    pub upstream_timeout: Duration,
    /// Which requests reach the protected server over HTTP/2 (`--upstream-http2`).
    pub upstream_http2: upstream::UpstreamHttp2,
    /// How long a cancelled task waits for the server's confirmation.
    pub cancel_confirm_timeout: Duration,
    /// Connection caps and timeouts of the client-facing port.
    pub limits: ServerLimits,
    /// The app containers' probes answered at `/app-health/<container>/<kind>` on the admin
    /// port (`--app-probes`; empty when the pod's probes were not rewritten).
    pub app_probes: AppProbes,
    /// Threads that serve the client and hop connections, each connection start to end on
    /// one of them (`lifeguard sidecar` starts one per `--worker-threads`); `None` serves
    /// them as tasks of the runtime `run` is called on. They must outlive `run`.
    pub workers: Option<Workers>,
}

/// Name of the ledger secret that keys audit hashes of task IDs (and object digests).
pub const AUDIT_HASH_SECRET: &str = "audit-task-id-hash";
/// Name of the ledger secret that keys identity digests in the audit trail
/// (`audit.identityDigests`).
pub const AUDIT_IDENTITY_SECRET: &str = "audit-identity-digest";
/// Name of the ledger secret that authenticates the persisted policy snapshot (cluster mode).
const SNAPSHOT_SECRET: &str = "policy-snapshot-mac";
/// Name of the ledger secret that keys idempotency hashes.
const IDEMPOTENCY_SECRET: &str = "idempotency-key-hash";

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

/// Runs the sidecar until `shutdown` fires.
pub async fn run(config: SidecarConfig, shutdown: CancellationToken) -> Result<()> {
    if config.admin.is_none() && !config.app_probes.is_empty() {
        anyhow::bail!("--app-probes needs --admin: the probes are answered on the admin port");
    }
    if config.upstream.scheme_str() != Some("http") {
        anyhow::bail!(
            "--upstream must be an http:// URL of the MCP container on loopback, got {}",
            config.upstream
        );
    }
    let ledger = config
        .ledger
        .open(config.ledger_scope.clone())
        .await
        .with_context(|| format!("opening the task ledger {}", config.ledger))?;
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
    // The hop's port is bound before the heartbeat says where it is.
    let hop_listener = match config.internal_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the internal hop {addr}"))?,
        ),
        None => None,
    };
    let hop_bound = hop_listener
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;
    let advertise = hop_address(&config, hop_bound)?;
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
    let heartbeat_ttl = config.heartbeat_ttl;
    let home_tasks = Arc::new(home_memory::HomeMemory::default());
    replica::beat_once(
        ledger.as_ref(),
        advertise.as_deref(),
        heartbeat_ttl,
        &home_tasks,
    )
    .await
    .context("recording this replica's heartbeat in the ledger")?;
    tokio::spawn(replica::heartbeat(
        ledger.clone(),
        advertise.clone(),
        heartbeat_ttl,
        home_tasks.clone(),
        shutdown.clone(),
    ));
    let replica = replica::Replica::new(ledger.as_ref(), hop, home_tasks);
    let initial_target = match &config.audit_file {
        Some(path) => AuditTarget::File(path.clone()),
        None => AuditTarget::Stdout,
    };
    let (audit, audit_writer) = AuditLog::open(initial_target).context("opening the audit file")?;
    let connection_metrics = ConnectionMetrics::default();
    let mut metrics = SidecarMetrics::new();
    connection_metrics.register(&mut metrics.registry);
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
        .into_source(registry, tls, &mut metrics, &ledger)
        .await?;
    let metrics = Arc::new(metrics);
    let PolicyChannels {
        publisher,
        policy,
        status,
        progress,
    } = PolicyPublisher::channel(metrics.clone());
    tokio::spawn(follow_audit_settings(
        policy.clone(),
        audit.clone(),
        AuditFollow {
            // Without --audit-file, the policy's audit.sink decides where the trail goes.
            sink: config.audit_file.is_none(),
            digester: identity_digester,
        },
        shutdown.clone(),
    ));
    tokio::spawn(source.run(publisher, shutdown.clone()));
    let upstream = Upstream::new(
        config.upstream.clone(),
        config.upstream_timeout,
        Some(metrics.upstream_seconds.clone()),
    )
    .with_http2(config.upstream_http2);
    let app = Arc::new(AppState {
        policy,
        source: status,
        ledger,
        upstream,
        audit,
        hasher,
        metrics,
        idempotency_secret,
        objects: objects::ObjectGate::default(),
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
        replica,
        shutdown: shutdown.clone(),
        upstream_timeout: config.upstream_timeout,
        cancel_confirm_timeout: config.cancel_confirm_timeout,
    });

    tokio::spawn(sweeper::sweep(app.clone(), shutdown.clone()));
    tokio::spawn(revocation::apply_revocations(
        app.clone(),
        app.policy.clone(),
        progress,
        shutdown.clone(),
    ));

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
    let listener = tokio::net::TcpListener::bind(config.listen)
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

    if let Some(hop_listener) = hop_listener {
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

    let limits = config.limits.clone();
    serve_placed(
        listener,
        mcp,
        limits,
        connection_metrics,
        shutdown.clone(),
        config.workers.clone(),
    )
    .await
    .context("serving MCP")?;
    drop(app);
    let _ = tokio::time::timeout(Duration::from_secs(5), audit_writer).await;
    Ok(())
}

impl Health for AppState {
    /// Ready once a policy is in force (the ledger is opened before the server starts), or
    /// once the source holds a configuration that deliberately enables nothing; not while the
    /// audit trail fails under `audit.onFailure: failClosed`. The source's connection state
    /// (cluster mode) follows after a `;`.
    fn readiness(&self) -> Readiness {
        let status = self.source.borrow().clone();
        let connection = status
            .connection
            .map(|c| format!("; {c}"))
            .unwrap_or_default();
        match (self.policy(), status.standby) {
            (Some(policy), _) if self.audit_blocks(&policy) => Readiness::NotReady(format!(
                "audit trail cannot be written (audit.onFailure: failClosed){connection}"
            )),
            (Some(policy), _) => Readiness::Ready(format!(
                "ready: policy {} {}{connection}",
                policy.name, policy.hash
            )),
            (None, Some(reason)) => Readiness::Ready(format!(
                "ready: {reason}; every MCP request is refused{connection}"
            )),
            (None, None) => Readiness::NotReady(format!("no policy loaded{connection}")),
        }
    }

    fn metrics(&self) -> String {
        self.metrics
            .listen_streams
            .set(i64::try_from(self.streams.len()).unwrap_or(i64::MAX));
        self.metrics.encode()
    }
}

/// Serves `router` on the workers if there are any, else on this runtime.
async fn serve_placed(
    listener: tokio::net::TcpListener,
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

/// Path of the delegation keys on the admin port.
pub const DELEGATION_JWKS_PATH: &str = "/.well-known/jwks.json";

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
/// issue tokens for this server.
async fn protected_resource_metadata(State(app): State<Arc<AppState>>) -> Response {
    match app.policy() {
        Some(policy) => respond::json(
            StatusCode::OK,
            &serde_json::json!({
                "resource": policy.effective.resource,
                "authorization_servers": policy.effective.issuers.iter().map(|i| &i.issuer).collect::<Vec<_>>(),
                "bearer_methods_supported": ["header"],
            }),
        ),
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
