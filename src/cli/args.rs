//! The flag groups the control plane's subcommands (`lifeguard operator`, `lifeguard webhook`)
//! share, flattened into each: the cluster ([`ClusterArgs`]), the HTTPS listener
//! ([`ServeArgs`] and its connection limits, [`ListenerArgs`]) and the admin endpoint
//! ([`AdminArgs`]); together they make the server shell's [`ShellConfig`]. Where a flag means
//! something particular to one subcommand (what lives in `--namespace`, what `--listen`
//! serves), that subcommand words its help itself with `mut_arg`. Listener defaults and
//! reasons: docs/operations.md, "Listener limits".

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Result, ensure};
use lifeguard::api::PolicyDuration;
use lifeguard::runtime::http::ServerLimits;
use lifeguard::runtime::shell::ShellConfig;

/// Where the cluster is, and the subcommand's own namespace.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// kubeconfig file (default: the in-cluster configuration, then $KUBECONFIG).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    // Help worded by each subcommand (what it keeps in its namespace).
    /// The component's own namespace (default: the pod's, else lifeguard-system).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
}

/// The HTTPS listener and its certificate.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    // Help worded by each subcommand (what it serves there).
    /// HTTPS address of the component's endpoints.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Serving certificate (PEM chain) for --listen; re-read when the file changes.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// Private key (PEM) of --tls-cert; re-read when the file changes.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
}

/// The admin endpoint.
#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    /// Plain HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    pub admin: SocketAddr,
}

/// The server shell's configuration from the shared flags; `--listen` takes at most
/// `max_connections` connections unless --max-connections is given.
pub fn shell_config(
    cluster: &ClusterArgs,
    serve: &ServeArgs,
    admin: &AdminArgs,
    listener: &ListenerArgs,
    max_connections: usize,
) -> Result<ShellConfig> {
    Ok(ShellConfig {
        kubeconfig: cluster.kubeconfig.clone(),
        namespace: cluster.namespace.clone(),
        listen: serve.listen,
        tls_cert: serve.tls_cert.clone(),
        tls_key: serve.tls_key.clone(),
        admin: admin.admin,
        limits: listener.limits(max_connections)?,
    })
}

fn default_limits() -> ServerLimits {
    ServerLimits::default()
}

/// Limits of the `--listen` HTTPS port.
#[derive(Debug, clap::Args)]
pub struct ListenerArgs {
    /// Connections served at once on --listen; beyond it a new connection is closed at accept.
    /// Default: 8192 on the operator (a sidecar holds up to two), 1024 on the webhook.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,
    /// Connections served at once on --listen from one IP address (a proxy or ingress in front
    /// counts as one address).
    #[arg(long, value_name = "N", default_value_t = default_limits().max_connections_per_peer as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections_per_peer: u32,
    /// Time a client has to complete its TLS handshake, from the accept.
    #[arg(long, value_name = "DURATION",
          default_value_t = default_limits().handshake_timeout.into())]
    pub handshake_timeout: PolicyDuration,
    /// Time a client has to send a complete request head (after the handshake for its first
    /// request, from the first byte of the head for later ones).
    #[arg(long, value_name = "DURATION",
          default_value_t = default_limits().header_read_timeout.into())]
    pub header_read_timeout: PolicyDuration,
    /// Time a client has to send a request body (read only after its token was checked, where
    /// the endpoint takes one).
    #[arg(long, value_name = "DURATION",
          default_value_t = default_limits().body_read_timeout.into())]
    pub body_read_timeout: PolicyDuration,
    /// Time a kept-alive connection may wait for its next request before it is closed.
    #[arg(long, value_name = "DURATION",
          default_value_t = default_limits().idle_timeout.into())]
    pub idle_timeout: PolicyDuration,
}

impl ListenerArgs {
    /// The limits, refusing a zero timeout (it would close every connection);
    /// `max_connections` unless --max-connections is given.
    pub fn limits(&self, max_connections: usize) -> Result<ServerLimits> {
        for (flag, value) in [
            ("--handshake-timeout", &self.handshake_timeout),
            ("--header-read-timeout", &self.header_read_timeout),
            ("--body-read-timeout", &self.body_read_timeout),
            ("--idle-timeout", &self.idle_timeout),
        ] {
            ensure!(!value.get().is_zero(), "{flag} must be longer than 0s");
        }
        Ok(ServerLimits {
            handshake_timeout: self.handshake_timeout.get(),
            header_read_timeout: self.header_read_timeout.get(),
            body_read_timeout: self.body_read_timeout.get(),
            idle_timeout: self.idle_timeout.get(),
            max_connections: self.max_connections.map_or(max_connections, |n| n as usize),
            max_connections_per_peer: self.max_connections_per_peer as usize,
            ..ServerLimits::default()
        })
    }
}
