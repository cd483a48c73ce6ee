//! Where a PostgreSQL ledger lives: the `postgres://` URL and the settings Lifeguard reads from
//! it.
//!
//! The URL is libpq's URI syntax (`postgres://user:password@host:port/db?param=value…`, also
//! `postgresql://`, several `host:port` pairs separated by commas). tokio-postgres parses it; the
//! parameters it does not know are handled here and taken out first:
//!
//! - `sslmode`: `disable`, `prefer` (the default, as in libpq), `require` (encrypted, server not
//!   verified), `verify-ca` (the server's chain ends at a trusted root) or `verify-full` (the chain
//!   and the host name). See [`super::tls`].
//! - `sslrootcert`: a PEM file of roots trusted besides the system's (`system`: only those).
//! - `passfile`: the password file to read instead of `PGPASSFILE` (see [`super::passfile`]).
//! - `pool_max_size`: pooled connections per ledger (Lifeguard's own; default
//!   [`DEFAULT_POOL_SIZE`]).
//!
//! Client certificates (`sslcert`, `sslkey`, …) are refused rather than ignored.
//!
//! A location carries a password: [`fmt::Display`] shows `postgres://user@host:port/db` (no
//! password, no parameters), [`fmt::Debug`] the same, and parse errors never repeat the text.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::Host;

/// Pooled connections per ledger instance unless `pool_max_size` says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long opening one connection may take unless `connect_timeout` says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive idle time unless `keepalives_idle` says otherwise (the kernel's default, two
/// hours, would leave a dead peer unnoticed for that long).
const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(30);
/// How long sent data may stay unacknowledged before the connection is given up unless
/// `tcp_user_timeout` says otherwise (Linux `TCP_USER_TIMEOUT`). Without it a database cut off
/// by a silent partition (no RST, no ICMP) holds every statement in flight, and the request
/// waiting on it, for the kernel's retransmission limit, about fifteen minutes; with it the
/// statement fails as "out of reach" (a retryable 503) and the pool opens a new connection.
/// A slow server still acknowledges at the TCP level, so this never cuts a long query.
const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// The PostgreSQL port when the URL names none.
const DEFAULT_PORT: u16 = 5432;

/// How a connection uses TLS (libpq's `sslmode`, without `allow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Never.
    Disable,
    /// When the server offers it, without verifying the server.
    Prefer,
    /// Always, without verifying the server.
    Require,
    /// Always; the server's certificate must chain to a trusted root (any name).
    VerifyCa,
    /// Always; the certificate must chain to a trusted root and name the host.
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }

    /// What tokio-postgres itself is told: the verifying modes are `require` plus a verifier.
    fn transport(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Tp;
        match self {
            Self::Disable => Tp::Disable,
            Self::Prefer => Tp::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => Tp::Require,
        }
    }
}

/// Why a PostgreSQL URL was refused. The message never contains the URL or its password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidPostgresUrl(String);

/// Where trusted roots come from besides the system store (`sslrootcert`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    /// The system store only (`sslrootcert=system`, or no `sslrootcert`).
    System,
    /// The system store plus this PEM file.
    File(PathBuf),
}

/// A parsed `postgres://` ledger location: connection settings, TLS, pool size.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresLocation {
    /// Everything tokio-postgres understands, password included (boxed: it is large).
    pg: Box<tokio_postgres::Config>,
    ssl_mode: SslMode,
    root_cert: RootCert,
    passfile: Option<PathBuf>,
    pool_size: usize,
    /// Every form of the password found in the text (raw and decoded), for [`Self::redact`].
    secrets: Vec<String>,
}

impl PostgresLocation {
    /// The tokio-postgres configuration (holds the password, if the URL had one).
    pub(super) fn pg(&self) -> &tokio_postgres::Config {
        &self.pg
    }

    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    pub fn root_cert(&self) -> &RootCert {
        &self.root_cert
    }

    /// The password file named by the URL's `passfile`, if any.
    pub fn passfile(&self) -> Option<&PathBuf> {
        self.passfile.as_ref()
    }

    /// Pooled connections per ledger instance.
    pub fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// The same location with another pool size (at least 1).
    pub fn with_pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long opening one connection may take.
    pub fn connect_timeout(&self) -> Duration {
        self.pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
    }

    /// The same location with another connect timeout.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.pg.connect_timeout(timeout);
        self
    }

    /// Whether the URL itself carries a password.
    pub fn has_password(&self) -> bool {
        self.pg.get_password().is_some_and(|p| !p.is_empty())
    }

    /// `text` with every form of the URL's password replaced by `***`.
    pub(super) fn redact(&self, text: &str) -> String {
        redact(text, &self.secrets)
    }

    /// The first host, as a password file names it: Unix sockets are `localhost`.
    pub(super) fn first_host(&self) -> String {
        match self.pg.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            #[cfg(unix)]
            Some(Host::Unix(_)) => "localhost".into(),
            None => self
                .pg
                .get_hostaddrs()
                .first()
                .map_or_else(|| "localhost".into(), ToString::to_string),
        }
    }

    /// The port of the first host.
    pub(super) fn first_port(&self) -> u16 {
        self.pg.get_ports().first().copied().unwrap_or(DEFAULT_PORT)
    }

    /// The user the connection logs in as, when the URL names one.
    pub(super) fn user(&self) -> Option<&str> {
        self.pg.get_user()
    }

    /// The database, when the URL names one (else PostgreSQL uses the user's name).
    pub(super) fn dbname(&self) -> Option<&str> {
        self.pg.get_dbname()
    }

    /// `self` with `password` as the connection's password (from a password source).
    pub(super) fn with_password(&self, password: &str) -> Self {
        let mut out = self.clone();
        out.pg.password(password);
        if !password.is_empty() {
            out.secrets.push(password.to_owned());
        }
        out
    }

    /// The same location on another database (tests make one per test).
    #[cfg(test)]
    pub(super) fn with_dbname(&self, dbname: &str) -> Self {
        let mut out = self.clone();
        out.pg.dbname(dbname);
        out
    }

    /// The same location reached at `host:port` instead (tests put a proxy in between).
    #[cfg(test)]
    pub(super) fn with_endpoint(&self, host: &str, port: u16) -> Self {
        let mut pg = tokio_postgres::Config::new();
        pg.host(host).port(port);
        if let Some(user) = self.pg.get_user() {
            pg.user(user);
        }
        if let Some(password) = self.pg.get_password() {
            pg.password(password);
        }
        if let Some(dbname) = self.pg.get_dbname() {
            pg.dbname(dbname);
        }
        if let Some(options) = self.pg.get_options() {
            pg.options(options);
        }
        pg.application_name(self.pg.get_application_name().unwrap_or("lifeguard"))
            .ssl_mode(self.pg.get_ssl_mode())
            .connect_timeout(self.connect_timeout());
        Self {
            pg: Box::new(pg),
            ..self.clone()
        }
    }

    /// Adds `-c name=value` to the options sent at connection start.
    pub(super) fn add_option(&mut self, option: &str) {
        let options = match self.pg.get_options() {
            Some(existing) if !existing.is_empty() => format!("{existing} {option}"),
            _ => option.to_owned(),
        };
        self.pg.options(options);
    }
}

/// Replaces every non-empty secret in `text` with `***`.
pub(super) fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret.as_str(), "***");
    }
    out
}

/// Decodes `%XX` escapes (no `+` for space: libpq URIs are not form data).
fn percent_decode(s: &str) -> Result<String, InvalidPostgresUrl> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| InvalidPostgresUrl("invalid percent-encoding in the URL".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| InvalidPostgresUrl("the URL is not valid UTF-8".into()))
}

/// The password in the URL's authority (`user:password@`), raw, if any.
fn authority_password(body: &str) -> Option<&str> {
    let authority = body.split('/').next().unwrap_or("");
    let (userinfo, _) = authority.rsplit_once('@')?;
    userinfo.split_once(':').map(|(_, password)| password)
}

impl FromStr for PostgresLocation {
    type Err = InvalidPostgresUrl;

    fn from_str(s: &str) -> Result<Self, InvalidPostgresUrl> {
        let invalid = |why: &str| InvalidPostgresUrl(why.to_owned());
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| invalid("a PostgreSQL ledger location is a postgres:// URL"))?;
        if !scheme.eq_ignore_ascii_case("postgres") && !scheme.eq_ignore_ascii_case("postgresql") {
            return Err(invalid(
                "a PostgreSQL ledger location starts with postgres:// or postgresql://",
            ));
        }
        let (body, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut secrets = Vec::new();
        if let Some(password) = authority_password(body) {
            secrets.push(password.to_owned());
            secrets.extend(percent_decode(password).ok());
        }

        let mut ssl_mode = SslMode::Prefer;
        let mut root_cert = RootCert::System;
        let mut passfile = None;
        let mut pool_size = DEFAULT_POOL_SIZE;
        let mut passthrough = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(raw_key)?;
            if key == "password" {
                secrets.push(raw_value.to_owned());
                secrets.extend(percent_decode(raw_value).ok());
            }
            let value = || percent_decode(raw_value);
            match key.as_str() {
                "sslmode" => {
                    ssl_mode = SslMode::parse(&value()?).ok_or_else(|| {
                        invalid(
                            "sslmode must be disable, prefer, require, verify-ca or verify-full",
                        )
                    })?;
                }
                "sslrootcert" => {
                    let value = value()?;
                    root_cert = match value.as_str() {
                        "" | "system" => RootCert::System,
                        path => RootCert::File(PathBuf::from(path)),
                    };
                }
                "passfile" => {
                    passfile = Some(PathBuf::from(value()?)).filter(|p| !p.as_os_str().is_empty());
                }
                "pool_max_size" => {
                    pool_size = value()?
                        .parse::<usize>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| invalid("pool_max_size must be a positive integer"))?;
                }
                "sslcert"
                | "sslkey"
                | "sslpassword"
                | "sslcrl"
                | "sslcrldir"
                | "sslsni"
                | "sslcertmode"
                | "ssl_min_protocol_version"
                | "ssl_max_protocol_version"
                | "requiressl"
                | "gssencmode"
                | "krbsrvname"
                | "service" => {
                    return Err(InvalidPostgresUrl(format!(
                        "the PostgreSQL ledger does not support the `{key}` parameter"
                    )));
                }
                "user"
                | "password"
                | "dbname"
                | "options"
                | "application_name"
                | "sslnegotiation"
                | "host"
                | "hostaddr"
                | "port"
                | "connect_timeout"
                | "tcp_user_timeout"
                | "keepalives"
                | "keepalives_idle"
                | "keepalives_interval"
                | "keepalives_retries"
                | "target_session_attrs"
                | "channel_binding"
                | "load_balance_hosts" => passthrough.push(pair),
                _ => {
                    return Err(InvalidPostgresUrl(format!(
                        "unknown PostgreSQL URL parameter `{key}`"
                    )));
                }
            }
        }

        let mut rebuilt = format!("postgresql://{body}");
        if !passthrough.is_empty() {
            rebuilt.push('?');
            rebuilt.push_str(&passthrough.join("&"));
        }
        let mut pg = tokio_postgres::Config::from_str(&rebuilt).map_err(|e| {
            InvalidPostgresUrl(redact(&format!("invalid PostgreSQL URL: {e}"), &secrets))
        })?;
        pg.ssl_mode(ssl_mode.transport());
        if pg.get_hosts().is_empty() && pg.get_hostaddrs().is_empty() {
            pg.host("localhost");
        }
        if pg.get_application_name().is_none() {
            pg.application_name("lifeguard");
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let given = |key: &str| {
            passthrough
                .iter()
                .any(|pair| pair.split('=').next() == Some(key))
        };
        if !given("keepalives_idle") {
            pg.keepalives_idle(DEFAULT_KEEPALIVES_IDLE);
        }
        if !given("tcp_user_timeout") {
            pg.tcp_user_timeout(DEFAULT_TCP_USER_TIMEOUT);
        }
        Ok(Self {
            pg: Box::new(pg),
            ssl_mode,
            root_cert,
            passfile,
            pool_size,
            secrets,
        })
    }
}

impl fmt::Display for PostgresLocation {
    /// `postgres://user@host:port,host:port/db`: no password, no parameters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        let mut out = String::from("postgres://");
        if let Some(user) = self.pg.get_user() {
            let _ = write!(out, "{user}@");
        }
        let ports = self.pg.get_ports();
        let port = |i: usize| match ports {
            [] => DEFAULT_PORT,
            [one] => *one,
            many => many.get(i).copied().unwrap_or(DEFAULT_PORT),
        };
        let hosts: Vec<String> = if self.pg.get_hosts().is_empty() {
            self.pg
                .get_hostaddrs()
                .iter()
                .map(|a| match a {
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                    v4 => v4.to_string(),
                })
                .collect()
        } else {
            self.pg
                .get_hosts()
                .iter()
                .map(|h| match h {
                    Host::Tcp(name) if name.contains(':') => format!("[{name}]"),
                    Host::Tcp(name) => name.clone(),
                    #[cfg(unix)]
                    Host::Unix(path) => path.display().to_string(),
                })
                .collect()
        };
        for (i, host) in hosts.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{host}:{}", port(i));
        }
        let db = self.pg.get_dbname().or(self.pg.get_user()).unwrap_or("");
        let _ = write!(out, "/{db}");
        // Never the password, even if someone used it as a user or database name.
        f.write_str(&self.redact(&out))
    }
}

impl fmt::Debug for PostgresLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLocation")
            .field("url", &self.to_string())
            .field("password", &self.has_password().then_some("***"))
            .field("ssl_mode", &self.ssl_mode)
            .field("root_cert", &self.root_cert)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
