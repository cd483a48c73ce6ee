//! The enforcement sidecar: a reverse proxy in front of one MCP server that binds every task to
//! its owner, keeps a durable ledger of tasks, and audits every decision.
//!
//! Data flow: `POST /mcp` → [`pipeline`] (policy, Origin, token, envelope, protocol checks) →
//! [`tasks`] (task methods) or [`relay`] (everything else) → the server on loopback. Policy
//! arrives through a `watch` channel, fed by [`policy_file`] in standalone mode (the operator's
//! stream feeds the same channel in cluster mode).

pub mod admin;
pub mod capability;
pub mod decisions;
pub mod forward;
pub mod lifecycle;
pub mod listen;
pub mod pipeline;
pub mod policy_file;
pub mod relay;
pub mod respond;
pub mod state;
pub mod tasks;
pub mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::Response;
use axum::routing::{get, post};
use http::{StatusCode, Uri};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditLog, AuditTarget, TaskHasher};
use crate::identity::store::KeyRegistry;
use crate::ledger::{SqliteLedger, TaskLedger};
use crate::mcp::jsonrpc::MAX_REQUEST_BYTES;
use crate::telemetry::metrics::SidecarMetrics;

use state::AppState;
use upstream::Upstream;

/// Everything `lifeguard sidecar` is configured with.
#[derive(Clone, Debug)]
pub struct SidecarConfig {
    pub policy_file: PathBuf,
    pub upstream: Uri,
    pub listen: SocketAddr,
    pub ledger: PathBuf,
    pub admin: Option<SocketAddr>,
    pub audit_file: Option<PathBuf>,
    pub upstream_timeout: Duration,
    /// JWKS of the approvers whose signatures make CapabilityExceptions valid, with optional
    /// `revokedKeys` and `revokedApprovals` lists. Without it no exception is ever Active.
    pub approver_keys: Option<PathBuf>,
}

/// Name of the ledger secret that keys audit hashes of task IDs.
const AUDIT_HASH_SECRET: &str = "audit-task-id-hash";
/// Name of the ledger secret that keys idempotency hashes.
const IDEMPOTENCY_SECRET: &str = "idempotency-key-hash";

/// Runs the sidecar until `shutdown` fires.
pub async fn run(config: SidecarConfig, shutdown: CancellationToken) -> Result<()> {
    if config.upstream.scheme_str() != Some("http") {
        anyhow::bail!(
            "--upstream must be an http:// URL of the MCP container on loopback, got {}",
            config.upstream
        );
    }
    let ledger: Arc<dyn TaskLedger> = Arc::new(
        SqliteLedger::open(&config.ledger)
            .with_context(|| format!("opening the task ledger {}", config.ledger.display()))?,
    );
    let hasher = TaskHasher::new(
        ledger
            .secret(AUDIT_HASH_SECRET)
            .await
            .context("reading the audit key from the ledger")?,
    );
    let initial_target = match &config.audit_file {
        Some(path) => AuditTarget::File(path.clone()),
        None => AuditTarget::Stdout,
    };
    let idempotency_secret = ledger
        .secret(IDEMPOTENCY_SECRET)
        .await
        .context("reading the idempotency key from the ledger")?;
    let (audit, audit_writer) = AuditLog::open(initial_target).context("opening the audit file")?;
    let metrics = Arc::new(SidecarMetrics::new());
    let registry = Arc::new(KeyRegistry::new(shutdown.clone()));
    let (publish, policy) = watch::channel(None);
    if config.audit_file.is_none() {
        // Without --audit-file, the policy's audit.sink decides where the trail goes.
        tokio::spawn(follow_audit_sink(
            policy.clone(),
            audit.clone(),
            shutdown.clone(),
        ));
    }
    tokio::spawn(policy_file::watch_policy_file(
        config.policy_file.clone(),
        config.approver_keys.clone(),
        registry.clone(),
        publish,
        metrics.clone(),
        shutdown.clone(),
    ));
    let upstream = Upstream::new(
        config.upstream.clone(),
        config.upstream_timeout,
        Some(metrics.upstream_seconds.clone()),
    );
    let app = Arc::new(AppState {
        policy,
        ledger,
        upstream,
        audit,
        hasher,
        metrics,
        idempotency_secret,
        gate: capability::CapabilityGate::default(),
        polls: tasks::PollClock::default(),
        streams: Arc::new(listen::StreamRegistry::default()),
        shutdown: shutdown.clone(),
        upstream_timeout: config.upstream_timeout,
    });

    tokio::spawn(lifecycle::sweep(app.clone(), shutdown.clone()));
    tokio::spawn(lifecycle::apply_revocations(
        app.clone(),
        app.policy.clone(),
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
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let local = listener.local_addr()?;
    eprintln!("lifeguard: listening on http://{local}/mcp");
    tracing::info!(%local, upstream = %config.upstream, "sidecar listening");

    if let Some(admin_addr) = config.admin {
        let admin_listener = tokio::net::TcpListener::bind(admin_addr)
            .await
            .with_context(|| format!("binding the admin address {admin_addr}"))?;
        eprintln!(
            "lifeguard: admin on http://{}",
            admin_listener.local_addr()?
        );
        let admin_router = admin::router(app.clone());
        let admin_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let served = axum::serve(admin_listener, admin_router)
                .with_graceful_shutdown(admin_shutdown.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "admin server failed");
            }
        });
    }

    axum::serve(listener, mcp)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await
        .context("serving MCP")?;
    drop(app);
    let _ = tokio::time::timeout(Duration::from_secs(5), audit_writer).await;
    Ok(())
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

/// Points the audit trail at the policy's `audit.sink` whenever the policy changes.
async fn follow_audit_sink(
    mut policy: watch::Receiver<Option<Arc<state::ActivePolicy>>>,
    audit: AuditLog,
    shutdown: CancellationToken,
) {
    loop {
        let target = policy.borrow_and_update().as_ref().map(|p| {
            let rules = &p.effective.audit;
            match (rules.sink, &rules.path) {
                (crate::api::AuditSink::File, Some(path)) => AuditTarget::File(path.into()),
                _ => AuditTarget::Stdout,
            }
        });
        if let Some(target) = target {
            audit.retarget(target);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = policy.changed() => if changed.is_err() { return },
        }
    }
}
