//! What every request handler and background task shares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::AuditFailureMode;
use crate::audit::{AuditLog, TaskHasher};
use crate::ledger::TaskLedger;
use crate::model::TaskId;
use crate::telemetry::metrics::SidecarMetrics;

use super::active_policy::ActivePolicy;
use super::capability::CapabilityGate;
pub use super::policy_source::PolicyWatch;
use super::policy_source::StatusWatch;
use super::stream_registry::StreamRegistry;
use super::upstream::Upstream;

/// Shared state of the sidecar.
pub struct AppState {
    /// `None` until a policy is loaded: then the sidecar refuses everything (fail closed).
    pub policy: PolicyWatch,
    /// What the policy source says about itself (standby reason, connection).
    pub source: StatusWatch,
    pub ledger: Arc<dyn TaskLedger>,
    pub upstream: Upstream,
    pub audit: AuditLog,
    pub hasher: TaskHasher,
    pub metrics: Arc<SidecarMetrics>,
    /// Keys idempotency hashes (a ledger secret, shared by replicas).
    pub idempotency_secret: [u8; 32],
    /// Proof of possession for key-bound tokens: the DPoP replay cache and nonce key.
    pub possession: super::possession::Possession,
    /// Signs delegation assertions (`upstream.identity: delegation`); its public keys are
    /// served at `/.well-known/jwks.json` on the admin port.
    pub delegation: crate::identity::delegation::DelegationKeys,
    /// Request-rate limits' buckets (`spec.rateLimits`).
    pub rate_limits: super::rate_limit::RateLimiter,
    /// Asks the object authorizer (`tasks.objects`).
    pub objects: super::objects::ObjectGate,
    /// Decisions and budgets of the capability gate.
    pub gate: CapabilityGate,
    /// When each task's state was last asked of the server.
    pub polls: PollClock,
    /// When each principal's unfinished tasks were last reconciled with the server.
    pub reconciles: ReconcileClock,
    /// Rate-limited audit lines of refusals anyone can cause.
    pub denials: super::denials::DenialAudit,
    /// Open listen streams.
    pub streams: Arc<StreamRegistry>,
    /// Client requests in flight to this replica's server (who may cancel which).
    pub in_flight: Arc<super::in_flight::InFlight>,
    /// This sidecar as a replica of its server (home of its tasks, internal hop, sweep lease).
    pub replica: super::replica::Replica,
    /// Fires when the sidecar shuts down (listen streams end gracefully).
    pub shutdown: CancellationToken,
    /// Bound on waiting for the server's response headers.
    pub upstream_timeout: Duration,
    /// How long a cancelled task waits for the server to confirm it stopped.
    pub cancel_confirm_timeout: Duration,
}

impl AppState {
    /// The policy in force now.
    pub fn policy(&self) -> Option<Arc<ActivePolicy>> {
        self.policy.borrow().clone()
    }

    /// Why nothing is enabled on purpose, when the source holds such a configuration.
    pub fn standby(&self) -> Option<String> {
        self.source.borrow().standby.clone()
    }

    /// Whether the audit trail's failure stops what must be audited (new tasks, capability
    /// allowances): it is failing and the policy says `audit.onFailure: failClosed`.
    pub fn audit_blocks(&self, policy: &ActivePolicy) -> bool {
        policy.effective.audit.on_failure == AuditFailureMode::FailClosed
            && !self.audit.health().is_healthy()
    }
}

/// When the server was last asked about each task (in memory: it only paces polls, and
/// forgetting it on restart costs one extra upstream call).
#[derive(Default)]
pub struct PollClock {
    last: Mutex<HashMap<TaskId, i64>>,
}

impl PollClock {
    /// Most tasks remembered; beyond it the clock starts over.
    const MAX: usize = 100_000;

    pub fn touch(&self, id: &TaskId, now: i64) {
        if let Ok(mut last) = self.last.lock() {
            if last.len() >= Self::MAX {
                last.clear();
            }
            last.insert(id.clone(), now);
        }
    }

    pub fn last(&self, id: &TaskId) -> Option<i64> {
        self.last.lock().ok().and_then(|l| l.get(id).copied())
    }
}

/// Paces reconciliations (asking the server about every unfinished task of a principal whose
/// creation was refused over quota): at most one per principal per [`Self::INTERVAL`], so
/// refused creations cannot make the sidecar flood the server.
#[derive(Default)]
pub struct ReconcileClock {
    last: Mutex<HashMap<(String, String), std::time::Instant>>,
}

impl ReconcileClock {
    pub const INTERVAL: Duration = Duration::from_secs(5);
    /// Most principals remembered; beyond it entries older than the interval are dropped.
    const MAX: usize = 10_000;

    /// Whether `owner`'s tasks may be reconciled now; if so, records that they are.
    pub fn begin(&self, owner: &crate::model::Owner) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        if last.len() >= Self::MAX {
            last.retain(|_, at| at.elapsed() < Self::INTERVAL);
        }
        let key = (owner.issuer.clone(), owner.subject.clone());
        match last.get(&key) {
            Some(at) if at.elapsed() < Self::INTERVAL => false,
            _ => {
                last.insert(key, std::time::Instant::now());
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciliations_are_paced_per_principal() {
        let clock = ReconcileClock::default();
        let owner = |subject: &str| crate::model::Owner {
            issuer: "i".into(),
            subject: subject.into(),
            tenant: "t".into(),
            client: "c".into(),
        };
        assert!(clock.begin(&owner("alice")));
        assert!(!clock.begin(&owner("alice")), "again within the interval");
        assert!(clock.begin(&owner("bob")), "another principal");
    }

    #[test]
    fn the_poll_clock_remembers_the_last_ask_per_task() {
        let clock = PollClock::default();
        let a = TaskId::from_string("lgt_a");
        assert_eq!(clock.last(&a), None);
        clock.touch(&a, 10);
        clock.touch(&a, 20);
        assert_eq!(clock.last(&a), Some(20));
        assert_eq!(clock.last(&TaskId::from_string("lgt_b")), None);
    }

    #[test]
    fn the_poll_clock_starts_over_when_full() {
        let clock = PollClock::default();
        for i in 0..PollClock::MAX {
            clock.touch(&TaskId::from_string(format!("lgt_{i}")), 1);
        }
        let first = TaskId::from_string("lgt_0");
        assert_eq!(clock.last(&first), Some(1));
        clock.touch(&TaskId::from_string("lgt_new"), 2);
        assert_eq!(clock.last(&first), None, "memory stays bounded");
        assert_eq!(clock.last(&TaskId::from_string("lgt_new")), Some(2));
    }
}
