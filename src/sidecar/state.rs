//! What every request handler shares.

use std::sync::Arc;

use tokio::sync::watch;

use crate::audit::{AuditLog, TaskHasher};
use crate::identity::cache::TokenCache;
use crate::identity::store::IssuerKeys;
use crate::ledger::TaskLedger;
use crate::policy::EffectivePolicy;
use crate::telemetry::metrics::SidecarMetrics;

use super::respond::resource_metadata_url;
use super::upstream::Upstream;

/// The policy in force with everything derived from it.
pub struct ActivePolicy {
    pub effective: EffectivePolicy,
    pub keys: IssuerKeys,
    pub hash: String,
    /// `namespace/name`, for audit lines.
    pub name: String,
    pub resource_metadata_url: String,
    /// Tokens that validated under this policy version.
    pub tokens: TokenCache,
    /// Trusted approvers of capability exceptions (`--approver-keys`), when configured.
    pub trust: Option<crate::exception::ApproverTrust>,
}

impl ActivePolicy {
    pub fn new(
        effective: EffectivePolicy,
        keys: IssuerKeys,
        trust: Option<crate::exception::ApproverTrust>,
    ) -> Self {
        Self {
            hash: effective.hash(),
            name: effective.policy.to_string(),
            resource_metadata_url: resource_metadata_url(&effective.resource),
            effective,
            keys,
            tokens: TokenCache::default(),
            trust,
        }
    }
}

/// Shared state of the sidecar.
pub struct AppState {
    /// `None` until a policy is loaded: then the sidecar refuses everything (fail closed).
    pub policy: watch::Receiver<Option<Arc<ActivePolicy>>>,
    pub ledger: Arc<dyn TaskLedger>,
    pub upstream: Upstream,
    pub audit: AuditLog,
    pub hasher: TaskHasher,
    pub metrics: Arc<SidecarMetrics>,
    /// Keys idempotency hashes (a ledger secret, shared by replicas).
    pub idempotency_secret: [u8; 32],
    /// Decisions and budgets of the capability gate.
    pub gate: super::capability::CapabilityGate,
    /// When each task's state was last asked of the server.
    pub polls: super::tasks::PollClock,
    /// Open listen streams.
    pub streams: Arc<super::listen::StreamRegistry>,
    /// Fires when the sidecar shuts down (listen streams end gracefully).
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Bound on waiting for the server's response headers.
    pub upstream_timeout: std::time::Duration,
}

impl AppState {
    /// The policy in force now.
    pub fn policy(&self) -> Option<Arc<ActivePolicy>> {
        self.policy.borrow().clone()
    }
}
