//! Request-rate limits (`spec.rateLimits`): every request a client sends is charged one token
//! against each bucket its policy names for it ([`crate::policy::rate_limits`]), before
//! anything reaches the server; without a token it is refused with 429 and when to retry.
//!
//! - [`local`]: buckets in this sidecar's memory — the limits of a sidecar with a SQLite
//!   ledger (each sidecar enforces the whole limit).
//! - [`shared`]: buckets in the PostgreSQL ledger, shared by the replicas of a server (the limit
//!   holds for the server as a whole, within one lease; see there). When the database cannot
//!   be reached, the sidecar falls back to its memory buckets (each replica then enforces the
//!   whole limit by itself) until it can again.
//!
//! Requests forwarded by another replica over the internal hop were charged there and are not
//! charged again.

pub mod charges;
pub mod local;
pub mod shared;

use std::sync::Arc;
use std::time::Instant;

use self::charges::Charge;
use crate::ledger::TaskLedger;
use crate::telemetry::metrics::{ReasonLabels, SidecarMetrics};

pub use local::Refused;

/// The buckets of one sidecar.
#[derive(Default)]
pub struct RateLimiter {
    local: local::LocalBuckets,
    shared: Option<shared::SharedBuckets>,
}

impl RateLimiter {
    /// Buckets in memory, and in `ledger` when it is shared by replicas.
    pub fn for_ledger(ledger: &Arc<dyn TaskLedger>) -> Self {
        Self {
            local: local::LocalBuckets::default(),
            shared: ledger
                .is_shared()
                .then(|| shared::SharedBuckets::new(ledger.clone())),
        }
    }

    /// Charges a request against `charges` (all or none); the refusal names the bucket with
    /// the longest wait.
    pub async fn admit(&self, charges: &[Charge], metrics: &SidecarMetrics) -> Result<(), Refused> {
        if charges.is_empty() {
            return Ok(());
        }
        if let Some(shared) = &self.shared {
            match shared.admit(charges).await {
                Ok(verdict) => return verdict,
                Err(error) => {
                    metrics
                        .errors
                        .get_or_create(&ReasonLabels {
                            reason: "rate_limit_store",
                        })
                        .inc();
                    tracing::warn!(%error, "shared rate-limit buckets unreachable; this replica limits by itself meanwhile");
                }
            }
        }
        self.local.admit(charges, Instant::now())
    }
}
