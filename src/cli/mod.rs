//! The `lifeguard` command line: argument definitions and thin handlers over the library.

mod args;
pub mod audit;
pub mod cluster;
pub mod crdgen;
pub mod dev;
pub mod evidence;
pub mod exception;
pub mod operator;
pub mod plugin;
pub mod policy_check;
pub mod policy_diff;
mod policy_files;
mod present;
pub mod revoke;
pub mod sidecar;
pub mod status;
pub mod webhook;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Lifeguard: owner-bound, deadline-bounded, revocable MCP Tasks on Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "lifeguard", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once at startup: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Write the CustomResourceDefinitions derived from the Rust types.
    Crdgen(CrdgenArgs),
    /// Work with policy manifests.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run the enforcement sidecar in front of one MCP server.
    Sidecar(SidecarArgs),
    /// Run the control plane: reconcile Lifeguard resources, stream policy to sidecars,
    /// receive security events.
    Operator(operator::OperatorArgs),
    /// Run the admission webhook: inject the enforcing sidecar into MCP server pods and
    /// validate Lifeguard resources.
    Webhook(webhook::WebhookArgs),
    /// Sign and verify CapabilityExceptions.
    #[command(subcommand)]
    Exception(ExceptionCommand),
    /// Development helpers (never needed in production).
    #[command(subcommand)]
    Dev(DevCommand),
    /// Policies with their sidecars, unexpired capability exceptions, revocations in progress.
    Status(status::StatusArgs),
    /// Revoke a principal cluster-wide (creates a PrincipalRevocation); --wait follows it.
    Revoke(revoke::RevokeArgs),
    /// Work with the audit trail.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Run the adversarial evidence pack against a running sidecar and write a dated report.
    Evidence(evidence::EvidenceArgs),
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Print the digest `audit.identityDigests` writes for each subject or tenant given.
    Digest(audit::AuditDigestArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("policy_source").required(true).args(["policy", "control_plane"])))]
pub struct SidecarArgs {
    /// Standalone mode: a multi-document YAML file with one McpServerPolicy and any
    /// CapabilityExceptions and PrincipalRevocations. Reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Cluster mode: the operator's distribution endpoint, https://HOST:PORT. The sidecar
    /// enforces the snapshots it streams (the last one is kept beside the ledger).
    #[arg(long, value_name = "URL", requires = "token_file")]
    pub control_plane: Option<url::Url>,
    /// PEM bundle trusted for the control plane (and issuers' JWKS) besides the system roots
    /// and $SSL_CERT_FILE.
    #[arg(long, value_name = "FILE", requires = "control_plane")]
    pub control_plane_ca: Option<PathBuf>,
    /// The projected ServiceAccount token (audience `lifeguard`) presented to the control
    /// plane; re-read at every connection.
    #[arg(long, value_name = "FILE", requires = "control_plane")]
    pub token_file: Option<PathBuf>,
    /// This pod's namespace (cluster mode), usually from the downward API.
    #[arg(long, value_name = "NS", env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// This pod's name (cluster mode), usually from the downward API.
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// MCP endpoint of the protected server, e.g. http://127.0.0.1:3000/mcp.
    #[arg(long, value_name = "URL")]
    pub upstream: http::Uri,
    /// Address clients connect to; the MCP endpoint is /mcp.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: std::net::SocketAddr,
    /// Task ledger: a SQLite file path (created if missing), also written sqlite://PATH, or a
    /// postgres:// URL shared by the replicas of one server.
    #[arg(
        long,
        value_name = "LOCATION",
        env = "LIFEGUARD_LEDGER",
        hide_env_values = true
    )]
    // Parsed after clap (see `sidecar::ledger_location`): clap's error for an invalid value
    // repeats it, and a database URL may carry a password.
    pub ledger: String,
    /// Cluster mode: a directory for the last policy snapshot in force. Default: beside an
    /// SQLite ledger's file; needed with a postgres:// ledger.
    #[arg(long, value_name = "DIR", env = "LIFEGUARD_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The MCP server whose tasks this sidecar's ledger rows belong to (one database can hold
    /// many servers' tasks, each scope seeing only its own). Default `local`.
    #[arg(long, value_name = "NAME", env = "LIFEGUARD_LEDGER_SCOPE")]
    pub ledger_scope: Option<String>,
    /// Shared ledgers: where the internal hop listens for the requests other replicas forward
    /// about tasks homed here (signed with a key the replicas share through the ledger).
    #[arg(long, value_name = "ADDR")]
    pub internal_listen: Option<std::net::SocketAddr>,
    /// How other replicas reach this one's internal hop (`host:port`). Default: the
    /// --internal-listen address when it is a specific one.
    #[arg(long, value_name = "HOST:PORT", env = "LIFEGUARD_INTERNAL_ADVERTISE")]
    pub internal_advertise: Option<String>,
    /// Shared ledgers: how long a replica may go without a heartbeat before its unfinished
    /// tasks fail (their server state is gone with it). Replicas beat every sixth of it.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub heartbeat_ttl: lifeguard::api::PolicyDuration,
    /// This replica's name, recorded as the home of the tasks it creates. Default: the pod name
    /// ($POD_NAME), else the host name.
    #[arg(long, value_name = "NAME")]
    pub replica_id: Option<String>,
    /// Address of /live, /ready and /metrics.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<std::net::SocketAddr>,
    /// The app containers' probes, answered on --admin at /app-health/<container>/<kind>: a
    /// JSON object keyed <container>/<livez|readyz|startupz> of httpGet or tcpSocket probes
    /// (set by the injecting webhook).
    #[arg(long, value_name = "JSON", env = "LIFEGUARD_APP_PROBES")]
    pub app_probes: Option<String>,
    /// Write audit events (JSON lines) to this file instead of stdout.
    #[arg(long, value_name = "PATH")]
    pub audit_file: Option<PathBuf>,
    /// How long to wait for the server's response headers.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub upstream_timeout: lifeguard::api::PolicyDuration,
    /// Which requests reach the MCP server over HTTP/2 without an upgrade (prior knowledge;
    /// only for servers that accept it): `listen` multiplexes subscriptions/listen streams
    /// over a few connections, `always` sends everything so.
    #[arg(long, value_enum, value_name = "WHEN", env = "LIFEGUARD_UPSTREAM_HTTP2",
          default_value_t = lifeguard::sidecar::UpstreamHttp2::Never)]
    pub upstream_http2: lifeguard::sidecar::UpstreamHttp2,
    /// How long a cancelled task waits for the server to confirm it stopped before it ends as
    /// unconfirmed (and frees its quota slot).
    #[arg(long, value_name = "DURATION", default_value = "1m")]
    pub cancel_confirm_timeout: lifeguard::api::PolicyDuration,
    /// Log format (logs go to stderr).
    #[arg(long, value_enum, default_value_t = lifeguard::telemetry::LogFormat::Text)]
    pub log_format: lifeguard::telemetry::LogFormat,
    /// Standalone mode: JWKS of the approvers of CapabilityExceptions (optionally with
    /// `revokedKeys` and `revokedApprovals` lists). Without it, no exception is valid. In
    /// cluster mode the approver keys come with each snapshot.
    #[arg(long, value_name = "FILE", conflicts_with = "control_plane")]
    pub approver_keys: Option<PathBuf>,
    /// Worker threads serving client connections, each connection on one of them. Default:
    /// $TOKIO_WORKER_THREADS if set, else one per CPU the container may use.
    #[arg(long, value_name = "N")]
    pub worker_threads: Option<usize>,
    /// Client connections served at once; beyond it a new connection is closed at accept.
    #[arg(long, value_name = "N", default_value_t = default_limits().max_connections as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Client connections served at once from one IP address (a proxy in front of the sidecar
    /// counts as one address).
    #[arg(long, value_name = "N", default_value_t = default_limits().max_connections_per_peer as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_peer: u32,
    /// Time a client has to send a complete request head (from accepting the connection for
    /// its first request, from the first byte of the head for later ones).
    #[arg(long, value_name = "DURATION",
          default_value_t = default_limits().header_read_timeout.into())]
    pub header_read_timeout: lifeguard::api::PolicyDuration,
    /// Time an authenticated client has to send a request body.
    #[arg(long, value_name = "DURATION",
          default_value_t = default_limits().body_read_timeout.into())]
    pub body_read_timeout: lifeguard::api::PolicyDuration,
    /// Time a kept-alive connection may wait for its next request before it is closed.
    #[arg(long, value_name = "DURATION",
          default_value_t = default_limits().idle_timeout.into())]
    pub idle_timeout: lifeguard::api::PolicyDuration,
    /// Whether clients may speak HTTP/2 by prior knowledge (cleartext, RFC 9113 §3.3) on the
    /// client port besides HTTP/1.1: `on` serves a connection that opens with the HTTP/2
    /// preface as HTTP/2, every stream counted against --max-connections and
    /// --max-connections-per-peer as a connection would be.
    #[arg(long, value_enum, value_name = "off|on", env = "LIFEGUARD_CLIENT_HTTP2",
          default_value_t = ClientHttp2::Off)]
    pub client_http2: ClientHttp2,
    /// HTTP/2: requests one client connection may have open at once
    /// (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, value_name = "N", env = "LIFEGUARD_HTTP2_MAX_CONCURRENT_STREAMS",
          default_value_t = lifeguard::runtime::http::Http2Limits::default().max_concurrent_streams,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,
}

/// `--client-http2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientHttp2 {
    /// HTTP/1.1 only.
    Off,
    /// HTTP/1.1, and HTTP/2 by prior knowledge.
    On,
}

fn default_limits() -> lifeguard::runtime::http::ServerLimits {
    lifeguard::runtime::http::ServerLimits::default()
}

#[derive(Debug, Subcommand)]
pub enum ExceptionCommand {
    /// Fill in `signature` of the CapabilityException in FILE (one per file) with an approver's
    /// Ed25519 key. Prints the file with the signature line replaced, or rewrites it.
    Sign {
        /// The approver's PEM Ed25519 private key.
        #[arg(long, value_name = "PEM")]
        key: PathBuf,
        /// Key id of the approver key, as published in the approver JWKS.
        #[arg(long)]
        kid: String,
        /// Rewrite FILE instead of printing it.
        #[arg(long)]
        in_place: bool,
        file: PathBuf,
    },
    /// Explain every check of each CapabilityException in the files: structure, approver key,
    /// revocation lists, signature, validity window. Exits 1 unless all are Active.
    Verify {
        /// JWKS of the trusted approvers (optionally with revokedKeys / revokedApprovals).
        #[arg(long, value_name = "JWKS")]
        keys: PathBuf,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the exact bytes an approver signs (RFC 8785 canonical JSON of the grant and its
    /// binding), for signing with any JOSE tool.
    Payload { file: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Sign a JWT with a local private key, for trying Lifeguard with a development issuer.
    Token(Box<DevTokenArgs>),
    /// Make a DPoP proof (RFC 9449) with a client key, for one request to a server whose
    /// tokens `dev token --dpop-key` bound to that key.
    DpopProof(DevDpopProofArgs),
}

#[derive(Debug, clap::Args)]
pub struct DevDpopProofArgs {
    /// The client's DPoP key: a PKCS#8 PEM of a P-256 (ES256), Ed25519 (EdDSA) or RSA (PS256)
    /// key, as `dev token --dpop-key` writes it. The proof's `alg` follows the key.
    #[arg(long, value_name = "PEM")]
    pub dpop_key: PathBuf,
    /// The URI the request is for (`htu`): the policy's `resource`.
    #[arg(long)]
    pub htu: String,
    /// The request's HTTP method (`htm`).
    #[arg(long, default_value = "POST")]
    pub htm: String,
    /// The access token the proof accompanies (its hash becomes `ath`).
    #[arg(long)]
    pub token: Option<String>,
    /// A server nonce (`DPoP-Nonce` of an earlier response).
    #[arg(long)]
    pub nonce: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct DevTokenArgs {
    /// PEM private key (Ed25519 for EdDSA, RSA for RS256/PS256, P-256 for ES256).
    #[arg(long, value_name = "PEM")]
    pub key: PathBuf,
    /// Signature algorithm.
    #[arg(long, default_value = "EdDSA")]
    pub alg: String,
    /// Key id written into the header.
    #[arg(long)]
    pub kid: Option<String>,
    #[arg(long)]
    pub issuer: String,
    /// Audience (the server's canonical URI).
    #[arg(long)]
    pub audience: String,
    #[arg(long)]
    pub subject: String,
    #[arg(long)]
    pub tenant: Option<String>,
    #[arg(long)]
    pub client: Option<String>,
    /// Space-separated scopes.
    #[arg(long, default_value = "")]
    pub scope: String,
    /// Lifetime of the token.
    #[arg(long, default_value = "1h")]
    pub ttl: lifeguard::api::PolicyDuration,
    /// Shift `iat` (and `exp`) into the past, e.g. 2h, to make an old token.
    #[arg(long, default_value = "0s")]
    pub issued_ago: lifeguard::api::PolicyDuration,
    /// Bind the token to this DPoP key (`cnf.jkt`): a PKCS#8 PEM (P-256, Ed25519 or RSA),
    /// created (mode 0600) when the file does not exist. Present the token as
    /// `Authorization: DPoP <token>` with a proof from `lifeguard dev dpop-proof`.
    #[arg(long, value_name = "PEM")]
    pub dpop_key: Option<PathBuf>,
    /// The kind of key `--dpop-key` creates when the file does not exist: ES256 (P-256),
    /// EdDSA (Ed25519) or PS256 (RSA-2048). An existing key keeps its kind.
    #[arg(long, requires = "dpop_key", value_enum, default_value = "ES256")]
    pub dpop_alg: DpopKeyAlg,
}

/// The kinds of DPoP key `dev token` can create.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DpopKeyAlg {
    #[value(name = "ES256")]
    Es256,
    #[value(name = "EdDSA")]
    EdDsa,
    #[value(name = "PS256")]
    Ps256,
}

#[derive(Debug, clap::Args)]
pub struct CrdgenArgs {
    /// Directory to write one YAML file per CRD into.
    #[arg(long, default_value = "crds")]
    pub out_dir: PathBuf,
    /// Print all CRDs as one multi-document YAML stream instead of writing files.
    #[arg(long, conflicts_with = "out_dir")]
    pub stdout: bool,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check manifest files (McpServerPolicy, CapabilityException, PrincipalRevocation) the way
    /// the API server and Lifeguard would, and compile every policy found. Exits 1 on any error.
    Check(PolicyCheckArgs),
    /// Compare the effective policies of two sets of manifests (`OLD... -- NEW...`, files or
    /// directories): each change in words, and exit status 1 when a change loosens security
    /// (2 when either side does not check).
    Diff(PolicyDiffArgs),
}

#[derive(Debug, clap::Args)]
pub struct PolicyDiffArgs {
    /// The manifests before the change (files or directories of *.yaml / *.yml).
    #[arg(required = true, value_name = "OLD")]
    pub old: Vec<PathBuf>,
    /// The manifests after the change, after `--`.
    #[arg(last = true, required = true, value_name = "NEW")]
    pub new: Vec<PathBuf>,
    /// Where the policies will run: `cluster` refuses `jwksFile`, `standalone` allows it.
    #[arg(long, value_enum, default_value_t = CheckMode::Cluster)]
    pub mode: CheckMode,
    /// Output format (`json`: the stable schema in docs/gitops.md).
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    pub output: DiffFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct PolicyCheckArgs {
    /// Multi-document YAML files, as you would `kubectl apply -f`, or directories (searched
    /// recursively for *.yaml and *.yml).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Where the policy will run: `cluster` refuses `jwksFile`, `standalone` allows it.
    #[arg(long, value_enum, default_value_t = CheckMode::Cluster)]
    pub mode: CheckMode,
    /// Output format: `text`; `json` (the stable schema in docs/gitops.md); `github`
    /// (workflow-command annotations that mark each finding's line in a pull request).
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckMode {
    Cluster,
    Standalone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
    Github,
}
