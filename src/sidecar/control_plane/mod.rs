//! Cluster mode: the policy comes from the operator's distribution stream
//! ([`crate::distribution`]).
//!
//! The source dials the control plane with the pod's projected ServiceAccount token (re-read at
//! every dial), puts every snapshot it receives in force (a snapshot without policy makes the
//! sidecar stand by: configured, ready, enabling nothing), keeps the last one next to the
//! ledger, and acknowledges each snapshot once the revocation applier has applied the
//! revocations it carries. While the control plane is unreachable the last snapshot stays in
//! force (the one persisted by an earlier run, after a restart) and the source dials again with
//! [`backoff`]; nothing ever fails open.

mod apply;
mod backoff;
mod framing;
#[cfg(test)]
mod source_tests;
mod stream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use url::Url;

pub use crate::distribution::SILENCE_TIMEOUT;
use crate::distribution::{Snapshot, StreamMessage};
use crate::identity::store::KeyRegistry;
use crate::telemetry::metrics::ControlPlaneMetrics;

use super::policy_source::{PolicyPublisher, PolicySource};
use super::snapshot_store::{SnapshotGenerations, SnapshotKey, SnapshotStore};
use apply::{OwedAck, SnapshotError, build_policy, check_pod};
use backoff::Backoff;
use stream::{OpenError, Stream, ack_url, post_ack, read_token, stream_url};

/// How soon a snapshot whose issuer keys could not be loaded is tried again.
const RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// How soon a failed ack is sent again.
const ACK_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Where the control plane is and who this sidecar is.
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    /// `https://HOST:PORT` of the operator.
    pub url: Url,
    /// File holding the bearer (the projected ServiceAccount token).
    pub token_file: PathBuf,
    pub pod_namespace: String,
    pub pod_name: String,
    /// Where the last snapshot in force is kept.
    pub snapshot_path: PathBuf,
    /// Authenticates that file (a ledger secret; see [`super::snapshot_store`]).
    pub snapshot_key: SnapshotKey,
    /// Numbers that file's saves (a ledger counter), so an older copy is refused.
    pub snapshot_generations: SnapshotGenerations,
    /// Silence after which the stream is dropped and dialled again
    /// ([`SILENCE_TIMEOUT`] outside tests).
    pub silence_timeout: Duration,
}

/// The distribution stream as a [`PolicySource`].
pub struct ControlPlaneSource {
    config: ControlPlaneConfig,
    http: reqwest::Client,
    registry: Arc<KeyRegistry>,
    metrics: ControlPlaneMetrics,
}

impl ControlPlaneSource {
    /// A source dialling with `tls` (which must trust the control plane's certificate).
    pub fn new(
        config: ControlPlaneConfig,
        tls: rustls::ClientConfig,
        registry: Arc<KeyRegistry>,
        metrics: ControlPlaneMetrics,
    ) -> anyhow::Result<Self> {
        let http = http_client(tls)?;
        Ok(Self {
            config,
            http,
            registry,
            metrics,
        })
    }
}

/// The client of the control plane: its stream and its acknowledgements share it, so where the
/// operator offers HTTP/2 (ALPN `h2`, which `tls` offers first) an acknowledgement rides the
/// stream's connection ([`stream::post_ack`]).
///
/// An HTTP/2 connection outlives the stream on it (a stream dropped after
/// [`crate::distribution::SILENCE_TIMEOUT`] is only reset), so PINGs check it: one unanswered
/// for [`H2_PING_TIMEOUT`] closes it, and the next stream dials afresh instead of waiting on a
/// connection a partition or a vanished replica left dead.
fn http_client(tls: rustls::ClientConfig) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("lifeguard-sidecar/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .tls_backend_preconfigured(tls)
        .connect_timeout(Duration::from_secs(5))
        .tcp_keepalive(Duration::from_secs(30))
        .http2_keep_alive_interval(H2_PING_INTERVAL)
        .http2_keep_alive_timeout(H2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build()
}

/// How often an HTTP/2 connection to the control plane is PINGed.
const H2_PING_INTERVAL: Duration = Duration::from_secs(10);
/// How long a PING's answer may take; interval and timeout together stay under the silence
/// timeout, so a dead connection is gone before the stream on it is given up.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

const _: () = assert!(
    H2_PING_INTERVAL.as_secs() + H2_PING_TIMEOUT.as_secs()
        < crate::distribution::SILENCE_TIMEOUT.as_secs()
);

#[async_trait]
impl PolicySource for ControlPlaneSource {
    async fn run(self: Box<Self>, publisher: PolicyPublisher, shutdown: CancellationToken) {
        let store = SnapshotStore::new(
            self.config.snapshot_path.clone(),
            self.config.pod_namespace.clone(),
            self.config.pod_name.clone(),
            self.config.snapshot_key.clone(),
            self.config.snapshot_generations.clone(),
        );
        let mut runner = Runner {
            source: *self,
            store,
            publisher,
            in_force: None,
            link: Link::Connecting,
        };
        runner.run(shutdown).await;
    }
}

/// The state of the connection, for `/ready`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// Not connected yet, and no attempt failed.
    Connecting,
    Connected,
    Unreachable {
        since: Timestamp,
    },
}

/// The snapshot in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InForce {
    version: u64,
    /// Loaded from disk at startup; no snapshot has arrived since.
    persisted: bool,
}

/// The `/ready` line of a connection state.
fn describe(link: Link, in_force: Option<InForce>) -> String {
    let enforcing = match in_force {
        Some(InForce {
            version,
            persisted: true,
        }) => format!(", enforcing the persisted snapshot version {version}"),
        Some(InForce { version, .. }) => format!(", enforcing snapshot version {version}"),
        None => ", no snapshot received yet".to_owned(),
    };
    match link {
        Link::Connecting => format!("connecting to the control plane{enforcing}"),
        Link::Connected => match in_force {
            Some(InForce { version, .. }) => {
                format!("control plane connected, snapshot version {version}")
            }
            None => "control plane connected, waiting for the first snapshot".to_owned(),
        },
        Link::Unreachable { since } => {
            format!("control plane unreachable since {since}{enforcing}")
        }
    }
}

/// Why a connection ended.
enum End {
    Shutdown,
    Lost(String),
}

struct Runner {
    source: ControlPlaneSource,
    store: SnapshotStore,
    publisher: PolicyPublisher,
    in_force: Option<InForce>,
    link: Link,
}

impl Runner {
    async fn run(&mut self, shutdown: CancellationToken) {
        self.report();
        let mut persisted = self.load_persisted().await;
        let mut backoff = Backoff::default();
        let mut last_failure = String::new();
        let mut attempts: u64 = 0;
        loop {
            if attempts > 0 {
                self.source.metrics.reconnects.inc();
                // A persisted snapshot whose keys were unreachable at startup is tried again
                // while nothing newer is in force.
                if let Some(snapshot) = persisted.take()
                    && self.in_force.is_none()
                {
                    persisted = self.put_persisted_in_force(snapshot).await;
                }
            }
            attempts += 1;
            match self.connection(&shutdown, &mut backoff).await {
                End::Shutdown => return,
                End::Lost(reason) => {
                    // Repeats of the same failure are not worth a warning each.
                    if reason != last_failure {
                        tracing::warn!(%reason, "no connection to the control plane; the snapshot in force (if any) stays in force");
                    } else {
                        tracing::debug!(%reason, "control plane still unreachable");
                    }
                    last_failure = reason;
                }
            }
            if !matches!(self.link, Link::Unreachable { .. }) {
                let now = Timestamp::now();
                let since = Timestamp::from_second(now.as_second()).unwrap_or(now);
                self.link = Link::Unreachable { since };
                self.report();
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    /// Puts the snapshot an earlier run left in force, before the first dial. Returns it when
    /// it failed for a reason that may pass (its issuers' keys were unreachable).
    async fn load_persisted(&mut self) -> Option<Snapshot> {
        match self.store.load().await {
            Ok(None) => {
                tracing::info!(file = %self.store.path().display(), "no persisted snapshot; refusing every request until the control plane sends one");
                None
            }
            Ok(Some(snapshot)) => self.put_persisted_in_force(snapshot).await,
            Err(error) => {
                tracing::error!(%error, "ignoring the persisted snapshot");
                None
            }
        }
    }

    async fn put_persisted_in_force(&mut self, snapshot: Snapshot) -> Option<Snapshot> {
        let path = self.store.path().display().to_string();
        match self.put_in_force(&snapshot).await {
            Ok(()) => {
                self.in_force = Some(InForce {
                    version: snapshot.version,
                    persisted: true,
                });
                self.report();
                tracing::info!(file = %path, version = snapshot.version, "enforcing the persisted snapshot until the control plane answers");
                None
            }
            Err(error) if error.is_transient() => {
                tracing::error!(file = %path, %error, "the persisted snapshot cannot be put in force yet; trying again at the next dial");
                Some(snapshot)
            }
            Err(error) => {
                tracing::error!(file = %path, %error, "the persisted snapshot cannot be put in force; ignoring it");
                None
            }
        }
    }

    /// One connection: dial, then put every snapshot in force and ack it, until the stream
    /// ends, falls silent, or the sidecar shuts down.
    async fn connection(&mut self, shutdown: &CancellationToken, backoff: &mut Backoff) -> End {
        let token = match read_token(&self.source.config.token_file).await {
            Ok(token) => token,
            Err(error) => return End::Lost(error.to_string()),
        };
        let config = &self.source.config;
        let url = stream_url(&config.url, &config.pod_namespace, &config.pod_name);
        let opened = tokio::select! {
            _ = shutdown.cancelled() => return End::Shutdown,
            opened = Stream::open(&self.source.http, url, &token) => opened,
        };
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(error @ OpenError::Refused { .. }) => {
                tracing::error!(%error, "control plane refused this sidecar; retrying (nothing is enabled beyond the snapshot in force)");
                return End::Lost(error.to_string());
            }
            Err(error) => return End::Lost(error.to_string()),
        };
        tracing::info!(url = %config.url, version = ?stream.version(), "connected to the control plane");
        self.link = Link::Connected;
        self.source.metrics.connected.set(1);
        self.report();
        let end = self.follow(&mut stream, &token, shutdown, backoff).await;
        self.source.metrics.connected.set(0);
        end
    }

    async fn follow(
        &mut self,
        stream: &mut Stream,
        token: &str,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> End {
        let mut progress = self.publisher.revocation_progress();
        let mut progress_open = true;
        let mut owed: Option<OwedAck> = None;
        let mut ack_retry_at: Option<Instant> = None;
        let mut retry: Option<(Box<Snapshot>, Instant)> = None;
        let silence = self.source.config.silence_timeout;
        let mut silent_after = Instant::now() + silence;
        loop {
            let retry_at = retry.as_ref().map(|(_, at)| *at);
            tokio::select! {
                _ = shutdown.cancelled() => return End::Shutdown,
                _ = sleep_until(silent_after) => {
                    return End::Lost(format!("nothing heard for {silence:?}"));
                }
                message = stream.next_message() => match message {
                    Ok(Some(message)) => {
                        silent_after = Instant::now() + silence;
                        if let StreamMessage::Snapshot(snapshot) = message {
                            backoff.reset();
                            retry = None;
                            match self.receive(&snapshot).await {
                                Ok(()) => {
                                    owed = Some(OwedAck::of(&snapshot));
                                    ack_retry_at = None;
                                }
                                Err(error) if error.is_transient() => {
                                    retry = Some((snapshot, Instant::now() + RETRY_INTERVAL));
                                }
                                Err(_) => {}
                            }
                        }
                    }
                    Ok(None) => return End::Lost("the control plane closed the stream".into()),
                    Err(error) => return End::Lost(error.to_string()),
                },
                changed = progress.changed(), if owed.is_some() && progress_open => {
                    progress_open = changed.is_ok();
                }
                _ = sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some() => {
                    if let Some((snapshot, _)) = retry.take() {
                        match self.receive(&snapshot).await {
                            Ok(()) => {
                                owed = Some(OwedAck::of(&snapshot));
                                ack_retry_at = None;
                            }
                            Err(_) => retry = Some((snapshot, Instant::now() + RETRY_INTERVAL)),
                        }
                    }
                }
                _ = sleep_until(ack_retry_at.unwrap_or_else(Instant::now)), if ack_retry_at.is_some() => {
                    ack_retry_at = None;
                }
            }
            let ack = match &owed {
                Some(owed) if ack_retry_at.is_none() => owed.ready(&progress.borrow_and_update()),
                _ => None,
            };
            if let Some(ack) = ack {
                let url = ack_url(&self.source.config.url);
                match post_ack(&self.source.http, url, token, &ack).await {
                    Ok(()) => {
                        tracing::info!(
                            version = ack.version,
                            revocations = ack.revocations.len(),
                            "snapshot acknowledged"
                        );
                        owed = None;
                    }
                    Err(error) => {
                        tracing::warn!(%error, version = ack.version, "acknowledging the snapshot failed; retrying");
                        ack_retry_at = Some(Instant::now() + ACK_RETRY_INTERVAL);
                    }
                }
            }
        }
    }

    /// Puts a snapshot that arrived on the stream in force and persists it.
    async fn receive(&mut self, snapshot: &Snapshot) -> Result<(), SnapshotError> {
        if let Some(current) = self.in_force
            && snapshot.version < current.version
        {
            tracing::warn!(
                version = snapshot.version,
                previous = current.version,
                "the control plane sent an older snapshot version than the one in force (a restarted operator?); applying it"
            );
        }
        if let Err(error) = self.put_in_force(snapshot).await {
            tracing::error!(%error, version = snapshot.version, "snapshot refused; the previous one stays in force");
            self.publisher.rejected();
            return Err(error);
        }
        self.in_force = Some(InForce {
            version: snapshot.version,
            persisted: false,
        });
        self.report();
        if let Err(error) = self.store.save(snapshot).await {
            tracing::warn!(%error, "cannot persist the snapshot; a restart without the control plane will not enforce it");
        }
        Ok(())
    }

    /// Publishes what `snapshot` enables.
    async fn put_in_force(&mut self, snapshot: &Snapshot) -> Result<(), SnapshotError> {
        let config = &self.source.config;
        check_pod(snapshot, &config.pod_namespace, &config.pod_name)?;
        match build_policy(snapshot, &self.source.registry).await? {
            Some(policy) => self.publisher.publish(policy),
            None => self.publisher.stand_by(format!(
                "no McpServerPolicy selects this pod ({}/{})",
                config.pod_namespace, config.pod_name
            )),
        }
        let version = i64::try_from(snapshot.version).unwrap_or(i64::MAX);
        self.source.metrics.snapshot_version.set(version);
        Ok(())
    }

    fn report(&self) {
        self.publisher
            .set_connection(describe(self.link, self.in_force));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_says_how_the_control_plane_is_and_what_is_enforced() {
        let live = Some(InForce {
            version: 7,
            persisted: false,
        });
        let persisted = Some(InForce {
            version: 7,
            persisted: true,
        });
        assert_eq!(
            describe(Link::Connected, live),
            "control plane connected, snapshot version 7"
        );
        let since = Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(
            describe(Link::Unreachable { since }, live),
            "control plane unreachable since 2023-11-14T22:13:20Z, enforcing snapshot version 7"
        );
        assert_eq!(
            describe(Link::Connecting, persisted),
            "connecting to the control plane, enforcing the persisted snapshot version 7"
        );
        assert_eq!(
            describe(Link::Unreachable { since }, None),
            "control plane unreachable since 2023-11-14T22:13:20Z, no snapshot received yet"
        );
    }
}
