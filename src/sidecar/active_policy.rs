//! The policy in force, with everything derived from it once per policy version: issuer keys,
//! the token cache, the approver trust, and the numbers every task request needs.

use std::collections::BTreeMap;

use crate::exception::ApproverTrust;
use crate::identity::cache::TokenCache;
use crate::identity::store::IssuerKeys;
use crate::ledger::QuotaLimits;
use crate::policy::{EffectivePolicy, TaskRules};

use super::decisions::ResultMinimizer;
use super::respond::resource_metadata_url;
use crate::exception::isolation::SecretScanner;

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
    pub trust: Option<ApproverTrust>,
    /// The task numbers of this version; `None` when no request may become a task.
    pub tasks: Option<TaskNumbers>,
    /// What completed results become before they are stored; `None` keeps them as given.
    pub results: Option<ResultMinimizer>,
    /// Refuses sampling requests that carry credentials (built-in shapes and
    /// `capabilities.secretPatterns`).
    pub secret_scanner: SecretScanner,
    /// Revocation name → the `traceparent` its application joins (cluster mode: the snapshot's
    /// `revocationTraces`). A trace hint only: never part of the policy or its hash.
    pub revocation_traces: BTreeMap<String, String>,
}

impl ActivePolicy {
    pub fn new(effective: EffectivePolicy, keys: IssuerKeys, trust: Option<ApproverTrust>) -> Self {
        Self {
            hash: effective.hash(),
            name: effective.policy.to_string(),
            resource_metadata_url: resource_metadata_url(&effective.resource),
            tasks: effective.tasks.as_ref().map(TaskNumbers::from_rules),
            results: effective
                .tasks
                .as_ref()
                .and_then(|t| ResultMinimizer::from_rules(&t.results)),
            secret_scanner: SecretScanner::new(&effective.capabilities.secret_patterns)
                .unwrap_or_else(|e| {
                    // The compiler refused invalid patterns; keep the built-in ones.
                    tracing::error!(error = %e, "secret patterns do not compile; using the built-in ones");
                    SecretScanner::default()
                }),
            effective,
            keys,
            tokens: TokenCache::default(),
            trust,
            revocation_traces: BTreeMap::new(),
        }
    }

    /// The policy with the traces its revocations' applications join.
    pub fn with_revocation_traces(self, revocation_traces: BTreeMap<String, String>) -> Self {
        Self {
            revocation_traces,
            ..self
        }
    }

    /// The `traceparent` the application of revocation `name` joins, if it is traced.
    pub fn revocation_trace(&self, name: &str) -> Option<&str> {
        self.revocation_traces.get(name).map(String::as_str)
    }

    /// Verifies every exception once at load and logs its state. Exceptions that do not verify
    /// stay in the policy (the gate verifies again at every use and refuses them with the
    /// precise reason, and a NotYetValid one becomes usable at `notBefore` without a reload).
    pub fn report_exceptions(&self) {
        let empty = ApproverTrust::default();
        let trust = self.trust.as_ref().unwrap_or(&empty);
        let now = jiff::Timestamp::now();
        for exception in &self.effective.exceptions {
            let v = crate::exception::verify(
                &exception.spec,
                &exception.exception.namespace,
                trust,
                now,
            );
            if v.state == crate::api::ExceptionState::Active {
                tracing::info!(exception = %exception.exception, approver = ?v.approver, expires_at = %exception.spec.expires_at.0, "capability exception active");
            } else {
                tracing::warn!(exception = %exception.exception, state = ?v.state, reason = v.reason, "capability exception not in force");
            }
        }
    }

    /// What audit events decided under this version name: the policy and its hash.
    pub fn stamp(&self) -> crate::audit::PolicyStamp<'_> {
        crate::audit::PolicyStamp {
            name: &self.name,
            hash: &self.hash,
        }
    }

    /// The policy's `minPollInterval` in milliseconds (0 without a tasks section).
    pub fn min_poll_ms(&self) -> i64 {
        self.tasks.as_ref().map_or(0, |t| t.min_poll_ms)
    }
}

/// Numbers of a tasks section in the units requests use, computed once per policy version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskNumbers {
    pub quota: QuotaLimits,
    pub min_poll_ms: i64,
    pub idempotency_window_ms: i64,
    /// The suggested wait (`data.retryAfterMs`; `Retry-After` is it in whole seconds, rounded
    /// up) of a concurrency-quota refusal: one poll interval, at least a second.
    pub quota_retry_after_ms: u64,
    /// `deleteResultAfterRetrieval`.
    pub read_once: bool,
}

impl TaskNumbers {
    pub fn from_rules(rules: &TaskRules) -> Self {
        let c = &rules.concurrency;
        Self {
            quota: QuotaLimits {
                per_principal: c.per_principal,
                per_tenant: c.per_tenant,
                per_client: c.per_client,
                per_server: c.per_server,
            },
            min_poll_ms: millis(rules.min_poll_interval.get()),
            idempotency_window_ms: millis(rules.idempotency_window.get()),
            quota_retry_after_ms: u64::try_from(rules.min_poll_interval.get().as_millis())
                .unwrap_or(u64::MAX)
                .max(1000),
            read_once: rules.delete_result_after_retrieval,
        }
    }
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks_of(yaml_tasks: &str) -> TaskNumbers {
        let policy = crate::policy::testing::with_tasks(yaml_tasks);
        TaskNumbers::from_rules(policy.tasks.as_ref().expect("tasks"))
    }

    #[test]
    fn numbers_follow_the_tasks_section() {
        let n = tasks_of(
            "    enabled: true\n    minPollInterval: 2500ms\n    concurrency: {perPrincipal: 3, perTenant: 7}\n    idempotency: {window: 2m}\n    retention: {defaultTtl: 1m, maxTtl: 1h, deleteResultAfterRetrieval: true}\n",
        );
        assert_eq!(n.min_poll_ms, 2_500);
        assert_eq!(n.quota_retry_after_ms, 2_500);
        assert_eq!(n.quota.per_principal, 3);
        assert_eq!(n.quota.per_tenant, 7);
        assert_eq!(n.idempotency_window_ms, 120_000);
        assert!(n.read_once);
    }

    #[test]
    fn retry_after_is_at_least_a_second() {
        let n = tasks_of("    enabled: true\n    minPollInterval: 100ms\n");
        assert_eq!(n.quota_retry_after_ms, 1_000);
    }
}
