//! Where the sidecar's policy comes from. A source publishes each good version into the watch
//! channel every request reads; the last good version stays in force when a new one is bad or
//! the source goes quiet. Standalone mode reads a file ([`super::policy_file`]); in a cluster
//! the operator's distribution stream ([`super::control_plane`]) is a second source behind the
//! same trait.
//!
//! Besides policies, a source reports its [`SourceStatus`] (for `/ready` and for refusals while
//! nothing is enabled), and it can follow the revocation applier's [`RevocationProgress`] (the
//! control plane acknowledges a snapshot only once its revocations have been applied).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::telemetry::metrics::{ResultLabels, SidecarMetrics};

use super::active_policy::ActivePolicy;

/// The channel the policy in force travels on: `None` until a policy is loaded (and while the
/// source stands by).
pub type PolicyWatch = watch::Receiver<Option<Arc<ActivePolicy>>>;

/// A producer of policy versions.
#[async_trait]
pub trait PolicySource: Send + 'static {
    /// Publishes versions until `shutdown` fires.
    async fn run(self: Box<Self>, publisher: PolicyPublisher, shutdown: CancellationToken);
}

/// What a source says about itself besides the policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceStatus {
    /// Set while the source holds a configuration that deliberately enables nothing (cluster
    /// mode: no McpServerPolicy selects this pod). Every MCP request is refused with this text,
    /// and the sidecar is ready (it is configured, not broken).
    pub standby: Option<String>,
    /// How the source is connected, appended to `/ready` (cluster mode).
    pub connection: Option<String>,
}

/// The receiving side of a source's status.
pub type StatusWatch = watch::Receiver<SourceStatus>;

/// What applying one revocation did, counted the first time this process applied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevocationCounts {
    /// `metadata.name` of the PrincipalRevocation.
    pub name: String,
    pub tasks_cancelled: u64,
    pub streams_closed: u64,
}

/// How far the revocation applier has got: every revocation of the policy whose hash is
/// `policy_hash` has been applied, with these counts (one per revocation of that policy, in
/// its order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevocationProgress {
    /// `None` until the first policy's revocations are all applied.
    pub policy_hash: Option<String>,
    pub revocations: Vec<RevocationCounts>,
}

/// Everything [`PolicyPublisher::channel`] makes: the publisher for the source, and the
/// receivers (and the progress sender) for the rest of the sidecar.
pub struct PolicyChannels {
    pub publisher: PolicyPublisher,
    pub policy: PolicyWatch,
    pub status: StatusWatch,
    /// For the revocation applier.
    pub progress: watch::Sender<RevocationProgress>,
}

/// The sending half of the policy channel, counting what a source loads and rejects.
pub struct PolicyPublisher {
    sender: watch::Sender<Option<Arc<ActivePolicy>>>,
    status: watch::Sender<SourceStatus>,
    progress: watch::Receiver<RevocationProgress>,
    metrics: Arc<SidecarMetrics>,
}

impl PolicyPublisher {
    /// Channels with no policy yet (the sidecar refuses everything until the first version).
    pub fn channel(metrics: Arc<SidecarMetrics>) -> PolicyChannels {
        let (sender, policy) = watch::channel(None);
        let (status_sender, status) = watch::channel(SourceStatus::default());
        let (progress, progress_receiver) = watch::channel(RevocationProgress::default());
        PolicyChannels {
            publisher: Self {
                sender,
                status: status_sender,
                progress: progress_receiver,
                metrics,
            },
            policy,
            status,
            progress,
        }
    }

    /// Puts `policy` in force (ending a standby).
    pub fn publish(&self, policy: ActivePolicy) {
        tracing::info!(policy = %policy.name, hash = %policy.hash, "policy loaded");
        self.count("success");
        self.metrics.policy_loaded.set(1);
        self.sender.send_replace(Some(Arc::new(policy)));
        self.status.send_if_modified(|s| s.standby.take().is_some());
    }

    /// Withdraws any policy and enables nothing, on purpose: requests are refused with
    /// `reason`, and the sidecar counts as ready.
    pub fn stand_by(&self, reason: String) {
        tracing::warn!(%reason, "no policy in force; every request is refused");
        self.count("success");
        self.status.send_modify(|s| s.standby = Some(reason));
        self.sender.send_replace(None);
        self.metrics.policy_loaded.set(0);
    }

    /// Counts a version the source refused (the previous policy stays in force).
    pub fn rejected(&self) {
        self.count("rejected");
    }

    /// Sets the connection line of `/ready`.
    pub fn set_connection(&self, connection: String) {
        self.status.send_if_modified(|s| {
            let changed = s.connection.as_ref() != Some(&connection);
            s.connection = Some(connection);
            changed
        });
    }

    /// Follows the revocation applier.
    pub fn revocation_progress(&self) -> watch::Receiver<RevocationProgress> {
        self.progress.clone()
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .policy_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}
