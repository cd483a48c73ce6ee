//! Revocations: which tasks and streams a revocation covers, and applying each new revocation
//! as soon as a policy carrying it is in force.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::audit::{AuditEvent, Decision};
use crate::identity::Identity;
use crate::ledger::{PrincipalFilter, TaskRecord};
use crate::policy::RevocationRule;
use crate::telemetry::revocation_spans;

use super::active_policy::ActivePolicy;
use super::cancellation::{self, Requested};
use super::context::new_correlation_id;
use super::decisions::{revocation, revokes_task, revokes_token};
use super::policy_source::{RevocationCounts, RevocationProgress};
use super::server_tasks::cancel_at_server;
use super::state::{AppState, PolicyWatch};
use super::stream_registry::CloseReason;
use super::task_state::now_ms;

/// The revocation in force that refuses `identity`'s token, if any.
pub fn revocation_of<'a>(
    policy: &'a ActivePolicy,
    identity: &Identity,
) -> Option<&'a RevocationRule> {
    policy
        .effective
        .revocations
        .iter()
        .find(|r| revokes_token(r, &identity.owner, identity.issued_at))
}

/// Identity of one revocation version: a changed `revokedBefore` or reason is applied anew.
fn revocation_key(rule: &RevocationRule) -> String {
    format!(
        "{}|{}|{:?}|{}|{}",
        rule.name,
        rule.revoked_before,
        rule.reason,
        rule.tenant.as_deref().unwrap_or("*"),
        rule.client.as_deref().unwrap_or("*")
    )
}

/// How soon a revocation whose application failed (the ledger could not list the principal's
/// tasks) is tried again.
const RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Applies every new revocation as soon as a policy carrying it is in force: cancels the tasks
/// the revoked tokens started (all the principal's tasks for account-level reasons), asks the
/// server to stop them, closes the streams those tokens opened, and writes one
/// `revocation.applied` event with counts. Tokens are refused by the request pipeline from the
/// same moment.
///
/// Once every revocation of a policy version has been applied, `progress` says so (with the
/// counts of each revocation's first application in this process), so a source can
/// acknowledge the version. A revocation whose application failed is tried again.
pub async fn apply_revocations(
    app: Arc<AppState>,
    mut policy: PolicyWatch,
    progress: watch::Sender<RevocationProgress>,
    shutdown: CancellationToken,
) {
    let mut applied: HashMap<String, RevocationCounts> = HashMap::new();
    loop {
        let current = policy.borrow_and_update().clone();
        let mut incomplete = false;
        if let Some(current) = current {
            let mut counts = Vec::with_capacity(current.effective.revocations.len());
            for rule in &current.effective.revocations {
                let key = revocation_key(rule);
                if !applied.contains_key(&key) {
                    match apply_traced(&app, &current, rule).await {
                        Some(done) => {
                            applied.insert(key.clone(), done);
                        }
                        None => incomplete = true,
                    }
                }
                counts.extend(applied.get(&key).cloned());
            }
            if !incomplete {
                progress.send_replace(RevocationProgress {
                    policy_hash: Some(current.hash.clone()),
                    revocations: counts,
                });
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = policy.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY_INTERVAL), if incomplete => {}
        }
    }
}

/// [`apply_one`] inside the revocation's `lifeguard.revocation.apply` span when the snapshot
/// names its trace, so the cancellations it sends upstream are in that trace.
async fn apply_traced(
    app: &AppState,
    policy: &ActivePolicy,
    rule: &RevocationRule,
) -> Option<RevocationCounts> {
    let span = revocation_spans::apply(&rule.name, policy.revocation_trace(&rule.name));
    let done = apply_one(app, policy, rule).instrument(span.clone()).await;
    revocation_spans::applied(
        &span,
        done.as_ref().map(|d| (d.tasks_cancelled, d.streams_closed)),
    );
    done
}

/// Applies one revocation; `None` when the principal's tasks could not be listed (nothing was
/// counted, and the caller tries again).
async fn apply_one(
    app: &AppState,
    policy: &ActivePolicy,
    rule: &RevocationRule,
) -> Option<RevocationCounts> {
    let correlation = new_correlation_id();
    let started = std::time::Instant::now();
    if !rule.names_someone() {
        // Covers nobody (validation refuses it): never a scan of the whole issuer's tasks.
        return Some(RevocationCounts {
            name: rule.name.clone(),
            tasks_cancelled: 0,
            streams_closed: 0,
        });
    }
    let filter = PrincipalFilter {
        issuer: rule.issuer.clone(),
        subject: rule.subject.clone(),
        tenant: rule.tenant.clone(),
        client: rule.client.clone(),
    };
    let active = match app.ledger.active_for(&filter).await {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, revocation = %rule.name, "listing a revoked principal's tasks failed; retrying");
            return None;
        }
    };
    let mut cancelled = 0u64;
    for record in active.iter().filter(|r| revokes_task(rule, r)) {
        if cancel_for_revocation(app, policy, &correlation, record, rule).await {
            cancelled += 1;
        }
    }
    // Streams opened with a refused token end now (the listener must re-listen with a fresh
    // token, which the pipeline checks like any request).
    let streams_closed = app.streams.close_where(
        |owner, issued_at| revokes_token(rule, owner, issued_at),
        CloseReason::Revoked,
    );
    app.audit.log(
        AuditEvent::new(
            "revocation.applied",
            &correlation,
            policy.stamp(),
            Decision::Record,
            "revocation",
        )
        .detail("revocation", rule.name.clone())
        .detail("issuer", rule.issuer.clone())
        .detail("subject", rule.subject.clone())
        .detail("tenant", rule.tenant.clone())
        .detail("client", rule.client.clone())
        .detail("revocationReason", json!(rule.reason))
        .detail("tasksCancelled", cancelled)
        .detail("streamsClosed", streams_closed)
        .detail("elapsedMs", started.elapsed().as_millis() as u64),
    );
    Some(RevocationCounts {
        name: rule.name.clone(),
        tasks_cancelled: cancelled,
        streams_closed: u64::try_from(streams_closed).unwrap_or(u64::MAX),
    })
}

/// Cancels one task of a revoked principal; returns whether this call asked for it (the task
/// ends once the server confirms, or when the sidecar stops waiting).
pub async fn cancel_for_revocation(
    app: &AppState,
    policy: &ActivePolicy,
    correlation: &str,
    record: &TaskRecord,
    rule: &RevocationRule,
) -> bool {
    let end = revocation(rule.reason, now_ms());
    let send = async || cancel_at_server(app, correlation, record, "revocation").await;
    matches!(
        cancellation::request(app, policy, correlation, record, end, None, send).await,
        Requested::Recorded
    )
}

/// Cancels `record` if a revocation in force now covers it (a revocation that arrived while
/// the server was creating the task must not slip through the gap between the token check and
/// the ledger write).
pub async fn cancel_if_revoked(app: &AppState, correlation: &str, record: &TaskRecord) {
    if let Some(current) = app.policy()
        && let Some(rule) = current
            .effective
            .revocations
            .iter()
            .find(|r| revokes_task(r, record))
    {
        cancel_for_revocation(app, &current, correlation, record, rule).await;
    }
}
