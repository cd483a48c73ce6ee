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
//! | entry | `mod.rs` (`run`), `startup` (its steps: ledger, replicas, state, servers, background work) |
//! | internal hop | `hop_server` |
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
//! | leaves | `decisions` (pure), `respond`, `forward`, `upstream` (with its bounded event bodies and HTTP/2 pool), `capability` + `capability_refusal` (its refusals: audit and metric), `objects` (`tasks.objects`: the authorizer and its cache), `stream_registry`, `in_flight` (requests in flight per caller), `rate_limit` (request-rate buckets: in memory, or shared through the ledger), `possession` (proof of possession for key-bound tokens: DPoP proofs, their replay cache and nonces), `snapshot_store`, `app_probes` (the app's probes on the admin port) |

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
mod possession;
mod rate_limit;
mod relay;
mod replica;
mod respond;
mod revocation;
mod server_tasks;
mod snapshot_store;
mod startup;
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
use http::Uri;
use tokio_util::sync::CancellationToken;

use crate::identity::store::KeyRegistry;
use crate::ledger::{LedgerLocation, LedgerScope, TaskLedger};
use crate::runtime::http::ServerLimits;
use crate::runtime::workers::Workers;
use crate::runtime::{Health, Readiness};
use crate::telemetry::metrics::{ControlPlaneMetrics, SidecarMetrics};

use control_plane::{ControlPlaneConfig, ControlPlaneSource};
use policy_file::FilePolicySource;
use policy_source::PolicySource;
use state::AppState;

pub use app_probes::{AppProbeError, AppProbes};
pub use upstream::{UpstreamHttp2, largest_upstream_event};

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

/// Runs the sidecar until `shutdown` fires: the ledger and the shared state first, then the
/// servers, then the background work, then MCP is served. Nothing runs in the background
/// before every port is bound.
pub async fn run(config: SidecarConfig, shutdown: CancellationToken) -> Result<()> {
    startup::check(&config)?;
    let keys = startup::open_ledger(&config).await?;
    let membership = startup::join_replicas(&config, &keys).await?;
    let (mut built, background) =
        startup::build_state(&config, keys, membership, &shutdown).await?;
    let servers = startup::bind_servers(&config, &mut built, &shutdown).await?;
    startup::spawn_background(&built.app, background, &shutdown);
    startup::serve(&config, servers, built, shutdown).await
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

/// Path of the delegation keys on the admin port.
pub const DELEGATION_JWKS_PATH: &str = "/.well-known/jwks.json";
