//! Where the sidecar's policy comes from. A source publishes each good version into the watch
//! channel every request reads; the last good version stays in force when a new one is bad or
//! the source goes quiet. Standalone mode reads a file ([`super::policy_file`]); in a cluster
//! the operator's distribution stream will be a second source behind the same trait.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::telemetry::metrics::{ResultLabels, SidecarMetrics};

use super::active_policy::ActivePolicy;
use super::state::PolicyWatch;

/// A producer of policy versions.
#[async_trait]
pub trait PolicySource: Send + 'static {
    /// Publishes versions until `shutdown` fires.
    async fn run(self: Box<Self>, publisher: PolicyPublisher, shutdown: CancellationToken);
}

/// The sending half of the policy channel, counting what a source loads and rejects.
pub struct PolicyPublisher {
    sender: watch::Sender<Option<Arc<ActivePolicy>>>,
    metrics: Arc<SidecarMetrics>,
}

impl PolicyPublisher {
    /// A channel with no policy yet (the sidecar refuses everything until the first version).
    pub fn channel(metrics: Arc<SidecarMetrics>) -> (Self, PolicyWatch) {
        let (sender, receiver) = watch::channel(None);
        (Self { sender, metrics }, receiver)
    }

    /// Puts `policy` in force.
    pub fn publish(&self, policy: ActivePolicy) {
        tracing::info!(policy = %policy.name, hash = %policy.hash, "policy loaded");
        self.count("success");
        self.metrics.policy_loaded.set(1);
        self.sender.send_replace(Some(Arc::new(policy)));
    }

    /// Counts a version the source refused (the previous policy stays in force).
    pub fn rejected(&self) {
        self.count("rejected");
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .policy_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}
