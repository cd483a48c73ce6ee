//! Bringing the ledger up to date with the server for tasks nobody is polling: a task that
//! finished at the server keeps its quota slot until the ledger learns it ended.

use crate::ledger::PrincipalFilter;
use crate::model::Owner;

use super::super::active_policy::ActivePolicy;
use super::super::server_tasks::refresh_from_upstream;
use super::super::state::AppState;

/// Most tasks refreshed per reconciliation.
const MAX_REFRESHED: usize = 64;

/// Refreshes every unfinished task of a principal; returns how many turned out to be finished.
pub async fn reconcile_principal(
    app: &AppState,
    policy: &ActivePolicy,
    correlation_id: &str,
    owner: &Owner,
) -> usize {
    let filter = PrincipalFilter {
        issuer: owner.issuer.clone(),
        subject: Some(owner.subject.clone()),
        tenant: None,
        client: None,
    };
    let Ok(active) = app.ledger.active_for(&filter).await else {
        return 0;
    };
    // Only tasks this replica's server holds: another replica's are its to refresh (asking
    // this server about them would hear "unknown task" and end them as lost).
    let refreshed = futures_util::future::join_all(
        active
            .iter()
            .filter(|record| app.replica.remote_home(policy, record).is_none())
            .take(MAX_REFRESHED)
            .map(|record| refresh_from_upstream(app, policy, correlation_id, record, "reconcile")),
    )
    .await;
    refreshed
        .into_iter()
        .flatten()
        .filter(|r| r.status.is_terminal())
        .count()
}
