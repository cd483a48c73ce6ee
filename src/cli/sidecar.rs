//! `lifeguard sidecar`.

use anyhow::{Context, Result, bail, ensure};
use lifeguard::ledger::{LedgerLocation, LedgerScope};
use lifeguard::runtime::http::{Http2Limits, ServerLimits};
use lifeguard::runtime::workers::Workers;
use lifeguard::sidecar::{AppProbes, PolicySourceConfig, SidecarConfig};

use super::SidecarArgs;

pub fn run(args: &SidecarArgs) -> Result<()> {
    // Kept to the end of the subcommand: dropping it flushes the last spans.
    let _traces = lifeguard::telemetry::init(args.log_format, "lifeguard-sidecar")?;
    let ledger = ledger_location(args)?;
    let config = SidecarConfig {
        policy: policy_source(args)?,
        upstream: args.upstream.clone(),
        listen: args.listen,
        ledger: ledger.clone(),
        ledger_scope: ledger_scope(args)?,
        internal_listen: args.internal_listen,
        internal_advertise: args.internal_advertise.clone(),
        heartbeat_ttl: args.heartbeat_ttl.get(),
        admin: args.admin,
        audit_file: args.audit_file.clone(),
        upstream_timeout: args.upstream_timeout.get(),
        upstream_http2: args.upstream_http2,
        cancel_confirm_timeout: args.cancel_confirm_timeout.get(),
        limits: limits(args)?,
        app_probes: match args.app_probes.as_deref().map(str::trim) {
            None | Some("") => AppProbes::default(),
            Some(json) => {
                AppProbes::parse(json).context("--app-probes (or $LIFEGUARD_APP_PROBES) refused")?
            }
        },
        workers: None,
    };
    // Client connections are served on workers of their own, one connection per thread from
    // start to end; the main runtime keeps what belongs to no connection (accept loops,
    // sweeps, policy and revocation watches, the admin port).
    let count = worker_count(args.worker_threads)?;
    let workers = Workers::start(count, "lifeguard-worker").context("starting worker threads")?;
    let config = SidecarConfig {
        workers: Some(workers.clone()),
        ..config
    };
    let runtime = lifeguard::runtime::tokio_runtime(Some(MAIN_THREADS.min(count)))?;
    let served = runtime.block_on(async move {
        let shutdown = lifeguard::runtime::shutdown_on_signals();
        lifeguard::sidecar::run(config, shutdown).await
    });
    drop(runtime);
    workers.stop();
    served
}

/// Threads of the main runtime (at most as many as there are workers): its work is off the
/// request path.
const MAIN_THREADS: usize = 2;

/// `--worker-threads`, else `$TOKIO_WORKER_THREADS` (what Tokio itself reads), else the CPUs
/// this process may use.
fn worker_count(flag: Option<usize>) -> Result<usize> {
    let from_env = || -> Result<Option<usize>> {
        match std::env::var("TOKIO_WORKER_THREADS") {
            Ok(value) => value.trim().parse().map(Some).map_err(|_| {
                anyhow::anyhow!("$TOKIO_WORKER_THREADS must be a whole number, got {value:?}")
            }),
            Err(_) => Ok(None),
        }
    };
    let count = match flag {
        Some(n) => n,
        None => from_env()?.unwrap_or_else(available_cores),
    };
    ensure!(
        count > 0,
        "--worker-threads (or $TOKIO_WORKER_THREADS) must be at least 1"
    );
    Ok(count)
}

/// CPUs this process may use (the container's CPU limit included, as Tokio counts them).
fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// `--ledger`, parsed. The error names what is wrong, never the value: a database URL may
/// carry a password.
fn ledger_location(args: &SidecarArgs) -> Result<LedgerLocation> {
    parse_ledger(&args.ledger)
}

/// A `--ledger` value, parsed (shared by every command that opens a ledger).
pub fn parse_ledger(value: &str) -> Result<LedgerLocation> {
    value
        .parse()
        .map_err(|e| anyhow::anyhow!("--ledger (or $LIFEGUARD_LEDGER) refused: {e}"))
}

/// The server a `--ledger-scope` value names (default `local`).
pub fn ledger_server(scope: Option<&str>) -> Result<String> {
    Ok(match scope.map(str::trim) {
        Some("") => bail!("--ledger-scope (or $LIFEGUARD_LEDGER_SCOPE) is empty"),
        Some(scope) => scope.to_owned(),
        None => "local".to_owned(),
    })
}

/// The ledger scope from `--ledger-scope` and `--replica-id` (or their defaults).
fn ledger_scope(args: &SidecarArgs) -> Result<LedgerScope> {
    let server = ledger_server(args.ledger_scope.as_deref())?;
    let replica = match (args.replica_id.as_deref(), args.pod_name.as_deref()) {
        (Some(id), _) if id.trim().is_empty() => bail!("--replica-id is empty"),
        (Some(id), _) => id.trim().to_owned(),
        (None, Some(pod)) if !pod.trim().is_empty() => pod.trim().to_owned(),
        _ => hostname().unwrap_or_else(|| "local".to_owned()),
    };
    Ok(LedgerScope { server, replica })
}

/// The machine's host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`).
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// Standalone (`--policy`) or cluster (`--control-plane`) mode; clap has checked that exactly
/// one is given.
fn policy_source(args: &SidecarArgs) -> Result<PolicySourceConfig> {
    if let Some(path) = &args.policy {
        return Ok(PolicySourceConfig::File {
            path: path.clone(),
            approver_keys: args.approver_keys.clone(),
        });
    }
    let (Some(url), Some(token_file)) = (&args.control_plane, &args.token_file) else {
        bail!("give --policy FILE (standalone) or --control-plane URL --token-file FILE (cluster)");
    };
    let Some(pod_namespace) = args.pod_namespace.clone().filter(|n| !n.is_empty()) else {
        bail!("--control-plane needs this pod's namespace: --pod-namespace or $POD_NAMESPACE");
    };
    let Some(pod_name) = args.pod_name.clone().filter(|n| !n.is_empty()) else {
        bail!("--control-plane needs this pod's name: --pod-name or $POD_NAME");
    };
    Ok(PolicySourceConfig::ControlPlane {
        url: url.clone(),
        ca_file: args.control_plane_ca.clone(),
        token_file: token_file.clone(),
        pod_namespace,
        pod_name,
        snapshot_path: lifeguard::sidecar::snapshot_path(
            &ledger_location(args)?,
            args.state_dir.as_deref(),
        )?,
    })
}

/// The client-facing port's limits from the flags.
fn limits(args: &SidecarArgs) -> Result<ServerLimits> {
    for (flag, value) in [
        ("--header-read-timeout", &args.header_read_timeout),
        ("--body-read-timeout", &args.body_read_timeout),
        ("--idle-timeout", &args.idle_timeout),
    ] {
        ensure!(!value.get().is_zero(), "{flag} must be longer than 0s");
    }
    Ok(ServerLimits {
        header_read_timeout: args.header_read_timeout.get(),
        body_read_timeout: args.body_read_timeout.get(),
        idle_timeout: args.idle_timeout.get(),
        max_connections: args.max_connections as usize,
        max_connections_per_peer: args.max_connections_per_peer as usize,
        http2: (args.client_http2 == super::ClientHttp2::On).then(|| Http2Limits {
            max_concurrent_streams: args.http2_max_concurrent_streams,
            ..Http2Limits::default()
        }),
        ..ServerLimits::default()
    })
}
