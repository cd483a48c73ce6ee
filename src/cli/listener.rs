//! The connection limits of the control plane's HTTPS listeners (`lifeguard operator` and
//! `lifeguard webhook` `--listen`): the flags both take, turned into the shared server's
//! [`ServerLimits`]. Defaults and reasons: docs/operations.md, "Listener limits".

use anyhow::{Result, ensure};
use lifeguard::api::PolicyDuration;
use lifeguard::runtime::http::ServerLimits;

fn default_limits() -> ServerLimits {
    ServerLimits::default()
}

/// The operator's default `--max-connections`: each sidecar holds its stream and, while it
/// acknowledges, a second connection.
pub const OPERATOR_MAX_CONNECTIONS: usize = 8192;

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
