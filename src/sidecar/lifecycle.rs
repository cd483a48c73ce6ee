//! What the sidecar does on its own, without a client asking: ending tasks past their deadline,
//! purging tasks past their retention, and applying revocations as soon as they arrive.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, Decision};
use crate::ledger::{EndReason, Ending, Finish, PrincipalFilter, TaskRecord, TaskStatus};
use crate::policy::RevocationRule;

use super::pipeline::new_correlation_id;
use super::state::{ActivePolicy, AppState};
use super::tasks::{cancel_at_server, now_ms, settle_terminal};

/// How often deadlines and retention are checked: deadlines take effect within this interval
/// (plus one ledger write), well inside the one-second promise.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(250);
/// Most tasks handled per sweep and kind; the rest follow on the next sweep.
const SWEEP_BATCH: usize = 200;

/// Ends tasks past their deadline and purges tasks past their retention, until shutdown.
pub async fn sweep(app: Arc<AppState>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
        let Some(policy) = app.policy() else { continue };
        let now = now_ms();
        match app.ledger.past_deadline(now, SWEEP_BATCH).await {
            Ok(due) => {
                for record in due {
                    end_at_deadline(&app, &policy, &record).await;
                }
            }
            Err(e) => tracing::error!(error = %e, "reading tasks past their deadline failed"),
        }
        match app.ledger.purge_expired(now, SWEEP_BATCH).await {
            Ok(purged) => {
                for id in purged {
                    app.audit.log(
                        AuditEvent::new(
                            "task.expired",
                            &new_correlation_id(),
                            &policy.name,
                            Decision::Record,
                            "retention",
                        )
                        .task(app.hasher.hash(&id)),
                    );
                }
            }
            Err(e) => tracing::error!(error = %e, "purging expired tasks failed"),
        }
    }
}

async fn end_at_deadline(app: &AppState, policy: &ActivePolicy, record: &TaskRecord) {
    let correlation = new_correlation_id();
    let limit = Duration::from_millis((record.deadline_at - record.created_at).max(0) as u64);
    let finish = Finish {
        status: TaskStatus::Failed,
        status_message: Some(format!(
            "Deadline exceeded: the task ran longer than its limit of {}",
            crate::api::PolicyDuration::from(limit)
        )),
        ending: Ending {
            reason: EndReason::Deadline,
            by: None,
            payload: Some(json!({"code": crate::mcp::codes::INTERNAL_ERROR,
                                 "message": "Deadline exceeded"})),
            at: now_ms(),
        },
    };
    if let Some(settled) = settle_terminal(app, policy, &correlation, record, finish).await
        && settled.applied
    {
        cancel_at_server(app, &correlation, record, "deadline").await;
    }
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

/// Applies every new revocation as soon as a policy carrying it is in force: cancels the tasks
/// the revoked tokens started (all the principal's tasks for account-level reasons), asks the
/// server to stop them, and writes one `revocation.applied` event with counts. Tokens are
/// refused by the request pipeline from the same moment.
pub async fn apply_revocations(
    app: Arc<AppState>,
    mut policy: watch::Receiver<Option<Arc<ActivePolicy>>>,
    shutdown: CancellationToken,
) {
    let mut applied: HashSet<String> = HashSet::new();
    loop {
        let current = policy.borrow_and_update().clone();
        if let Some(current) = current {
            for rule in &current.effective.revocations {
                let key = revocation_key(rule);
                if applied.contains(&key) {
                    continue;
                }
                apply_one(&app, &current, rule).await;
                applied.insert(key);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = policy.changed() => if changed.is_err() { return },
        }
    }
}

/// Whether a task falls under a revocation: same principal (and tenant/client when the
/// revocation names them), started by a token the revocation refuses.
pub fn revokes_task(rule: &RevocationRule, record: &TaskRecord) -> bool {
    let o = &record.owner;
    rule.covers(&o.issuer, &o.subject, &o.tenant, &o.client)
        && rule.refuses_token_issued_at(
            record
                .token_issued_at
                .and_then(|s| jiff::Timestamp::from_second(s).ok()),
        )
}

async fn apply_one(app: &AppState, policy: &ActivePolicy, rule: &RevocationRule) {
    let correlation = new_correlation_id();
    let started = std::time::Instant::now();
    let filter = PrincipalFilter {
        issuer: rule.issuer.clone(),
        subject: rule.subject.clone(),
        tenant: rule.tenant.clone(),
        client: rule.client.clone(),
    };
    let active = match app.ledger.active_for(&filter).await {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "listing a revoked principal's tasks failed");
            return;
        }
    };
    let mut cancelled = 0usize;
    for record in active.iter().filter(|r| revokes_task(rule, r)) {
        if cancel_for_revocation(app, policy, &correlation, record, rule).await {
            cancelled += 1;
        }
    }
    // Streams opened with a refused token end now (the listener must re-listen with a fresh
    // token, which the pipeline checks like any request).
    let streams_closed = app.streams.close_where(
        |owner, issued_at| {
            rule.covers(&owner.issuer, &owner.subject, &owner.tenant, &owner.client)
                && rule.refuses_token_issued_at(
                    issued_at.and_then(|s| jiff::Timestamp::from_second(s).ok()),
                )
        },
        super::listen::CloseReason::Revoked,
    );
    app.audit.log(
        AuditEvent::new(
            "revocation.applied",
            &correlation,
            &policy.name,
            Decision::Record,
            "revocation",
        )
        .detail("revocation", rule.name.clone())
        .detail("issuer", rule.issuer.clone())
        .detail("subject", rule.subject.clone())
        .detail("revocationReason", json!(rule.reason))
        .detail("tasksCancelled", cancelled)
        .detail("streamsClosed", streams_closed)
        .detail("elapsedMs", started.elapsed().as_millis() as u64),
    );
}

/// Cancels one task of a revoked principal; returns whether this call ended it.
pub async fn cancel_for_revocation(
    app: &AppState,
    policy: &ActivePolicy,
    correlation: &str,
    record: &TaskRecord,
    rule: &RevocationRule,
) -> bool {
    let finish = Finish {
        status: TaskStatus::Cancelled,
        status_message: Some(format!(
            "Cancelled: the owner's access was revoked ({})",
            serde_json::to_value(rule.reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        )),
        ending: Ending {
            reason: EndReason::Revocation,
            by: None,
            payload: None,
            at: now_ms(),
        },
    };
    let ended_here = settle_terminal(app, policy, correlation, record, finish)
        .await
        .is_some_and(|s| s.applied);
    if ended_here {
        cancel_at_server(app, correlation, record, "revocation").await;
    }
    ended_here
}
