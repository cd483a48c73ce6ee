//! What the sidecar does on a timer, without a client asking: carrying pending cancellations
//! to the server, ending tasks past their deadline, failing the tasks of replicas that are
//! gone, and purging tasks past their retention. On a shared ledger the last three run on one
//! replica at a time, the holder of the sweep lease (another takes over within 15 s when it
//! dies: its [`super::replica::LEASE_TTL`] and a second); the outbox runs on every replica for
//! the tasks homed there.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::audit::{AuditEvent, Decision};
use crate::ledger::TaskRecord;

use super::active_policy::ActivePolicy;
use super::cancellation::{self, drive_outbox};
use super::context::new_correlation_id;
use super::decisions::{deadline_exceeded, identity_lease_expired};
use super::server_tasks::cancel_at_server;
use super::state::AppState;
use super::task_state::{fail_orphaned, now_ms};
use crate::api::UpstreamTaskState;

/// How often deadlines and retention are checked: deadlines take effect within this interval
/// (plus one ledger write), well inside the one-second promise.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(250);
// The documented 15 s sweep-lease takeover (tested in `replica`) counts on it.
const _: () = assert!(SWEEP_INTERVAL.as_millis() <= 250);
/// Most tasks handled per sweep and kind; the rest follow on the next sweep.
const SWEEP_BATCH: usize = 200;
/// Most expired DPoP proof uses deleted from a shared ledger per sweep: four sweeps a second
/// keep up with 20 000 DPoP requests a second across the replicas.
const PROOF_PURGE_BATCH: usize = 5_000;

/// Ends tasks past their deadline and purges tasks past their retention, until shutdown.
pub async fn sweep(app: Arc<AppState>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
        app.denials.flush(&app.audit, std::time::Instant::now());
        if let Err(e) = app.delegation.rotate_if_due(now_ms() / 1000) {
            tracing::error!(error = %e, "rotating the delegation signing key failed; the current key signs on");
        }
        let Some(policy) = app.policy() else { continue };
        // Cancellations waiting for the server's confirmation: asked again, or given up. Every
        // replica drives the intents of its own tasks.
        drive_outbox(&app, &policy, &new_correlation_id()).await;
        // Server-wide work runs on one replica at a time (a lease in a shared ledger).
        if !app.replica.leads_sweeps(app.ledger.as_ref()).await {
            continue;
        }
        let now = now_ms();
        match app.ledger.past_deadline(now, SWEEP_BATCH).await {
            Ok(due) => {
                for record in due {
                    if record.deadline_at <= now {
                        end_at_deadline(&app, &policy, &record).await;
                    } else {
                        end_at_lease(&app, &policy, &record).await;
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "reading tasks past their deadline failed"),
        }
        if app.replica.shared {
            fail_orphans(&app, &policy, now).await;
        }
        match app.ledger.purge_expired(now, SWEEP_BATCH).await {
            Ok(purged) => {
                let sweep = new_correlation_id();
                for task in purged {
                    let mut event = AuditEvent::new(
                        "task.expired",
                        &sweep,
                        policy.stamp(),
                        Decision::Record,
                        "retention",
                    )
                    .task(app.hasher.hash(&task.id));
                    if !task.correlation_id.is_empty() {
                        event.correlation_id = task.correlation_id;
                    }
                    app.audit.log(event);
                }
            }
            Err(e) => tracing::error!(error = %e, "purging expired tasks failed"),
        }
        // Proof uses past their window (a ledger without a proof cache has none).
        if let Err(e) = app.ledger.purge_proofs(now, PROOF_PURGE_BATCH).await {
            tracing::error!(error = %e, "purging expired DPoP proof uses failed");
        }
    }
}

/// Fails the unfinished tasks of replicas that stopped beating: their server state is gone.
/// (With shared server state any replica's server still knows them: they are left alone.)
/// Not until this replica's own heartbeats show the ledger was writable for a whole TTL: after
/// a database outage every heartbeat has lapsed, and the live replicas need that long to beat
/// again.
async fn fail_orphans(app: &AppState, policy: &ActivePolicy, now: i64) {
    if policy.effective.upstream_task_state != UpstreamTaskState::PerReplica
        || !app.replica.may_declare_dead()
    {
        return;
    }
    match app.ledger.orphaned(now, SWEEP_BATCH).await {
        Ok(orphans) => {
            for record in orphans {
                fail_orphaned(app, policy, &new_correlation_id(), &record).await;
            }
        }
        Err(e) => tracing::error!(error = %e, "reading tasks of gone replicas failed"),
    }
}

/// Cancels a task whose owner presented no valid token within its identity lease: it ends
/// (cancelled, `identity_lease_expired`) once the server confirms it stopped, or when the
/// sidecar stops waiting.
async fn end_at_lease(app: &AppState, policy: &ActivePolicy, record: &TaskRecord) {
    let correlation = new_correlation_id();
    let end = identity_lease_expired(record, now_ms());
    let send = async || cancel_at_server(app, &correlation, record, "identity_lease").await;
    cancellation::request(app, policy, &correlation, record, end, None, send).await;
}

/// Cancels a task past its deadline: it ends (failed, "Deadline exceeded") once the server
/// confirms it stopped, or when the sidecar stops waiting.
async fn end_at_deadline(app: &AppState, policy: &ActivePolicy, record: &TaskRecord) {
    let correlation = new_correlation_id();
    let end = deadline_exceeded(record, now_ms());
    let send = async || cancel_at_server(app, &correlation, record, "deadline").await;
    cancellation::request(app, policy, &correlation, record, end, None, send).await;
}
