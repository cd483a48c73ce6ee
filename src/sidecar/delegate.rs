//! `upstream.identity: delegation` on the request path: which assertion a request to the
//! protected server carries, and what the ledger remembers of a task's identity (its lease
//! under `tasks.identityLease`, how long it is delegated). The signing itself is
//! [`crate::identity::delegation`].

use http::HeaderValue;
use http::header::{AUTHORIZATION, HeaderMap};
use serde_json::json;

use crate::api::UpstreamIdentity;
use crate::audit::Decision;
use crate::identity::delegation::Delegation;
use crate::ledger::TaskRecord;
use crate::mcp::task::iso_millis;
use crate::model::TaskId;

use super::context::RequestContext;
use super::state::AppState;
use super::task_state::{identity_revoked, now_ms};

/// The task a request is about, as an assertion names it.
#[derive(Clone, Copy)]
pub struct TaskBinding<'a> {
    pub id: &'a TaskId,
    pub tool: &'a str,
    /// Unix ms.
    pub deadline_at: i64,
}

impl<'a> From<&'a TaskRecord> for TaskBinding<'a> {
    fn from(record: &'a TaskRecord) -> Self {
        Self {
            id: &record.id,
            tool: &record.tool,
            deadline_at: record.deadline_at,
        }
    }
}

/// Whether the policy in force hands the server delegation assertions.
pub fn delegates(ctx: &RequestContext) -> bool {
    ctx.policy.effective.upstream_identity == UpstreamIdentity::Delegation
}

/// How long a task `task` is delegated by this request's token: until its deadline or the
/// token's expiry, whichever comes first (Unix ms).
pub fn delegated_until(ctx: &RequestContext, deadline_at: i64) -> i64 {
    deadline_at.min(ctx.identity.expires_at.saturating_mul(1000))
}

/// Adds `Authorization: Bearer <assertion>` for a request a client made, when the policy
/// delegates; `tool` names the tool of a `tools/call` that is not (yet) a task. Returns the
/// assertion's `exp` (Unix seconds).
pub fn attach(
    app: &AppState,
    ctx: &RequestContext,
    headers: &mut HeaderMap,
    task: Option<TaskBinding<'_>>,
    tool: Option<&str>,
) -> Option<i64> {
    if !delegates(ctx) {
        return None;
    }
    if identity_revoked(app, &ctx.identity) {
        // Revoked after this request was authenticated: no assertion is signed for it, and
        // the server refuses the request as it would one without a token.
        app.metrics.anomaly("revoked_owner_request_withheld");
        return None;
    }
    let sidecar = sidecar_name(ctx);
    let task_hash = task.map(|t| app.hasher.hash(t.id));
    let tool = task.map(|t| t.tool).or(tool);
    let scopes: Vec<&str> = match (tool, ctx.policy.effective.tasks.as_ref()) {
        (Some(tool), Some(rules)) => rules
            .scopes_for(tool)
            .filter(|s| ctx.identity.has_scope(s))
            .collect(),
        _ => Vec::new(),
    };
    let issued_at = now_ms() / 1000;
    let not_after = match task {
        Some(t) => delegated_until(ctx, t.deadline_at) / 1000,
        None => ctx.identity.expires_at,
    };
    let owner = &ctx.identity.owner;
    let delegation = Delegation {
        sidecar: &sidecar,
        audience: &ctx.policy.effective.resource,
        issuer: &owner.issuer,
        subject: &owner.subject,
        tenant: &owner.tenant,
        client: &owner.client,
        scopes,
        task: task_hash.as_deref(),
        tool,
        key_binding: ctx.identity.binding.as_ref(),
        issued_at,
        not_after,
    };
    match app.delegation.sign(&delegation) {
        Ok((token, exp)) => {
            if let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) {
                headers.insert(AUTHORIZATION, value);
            }
            Some(exp)
        }
        Err(e) => {
            // The request goes on without an assertion: the server refuses it, as it would
            // a request without a token.
            tracing::error!(error = %e, "signing a delegation assertion failed");
            app.metrics.anomaly("delegation_signing_failed");
            None
        }
    }
}

/// `iss` and `act.sub` of this sidecar's assertions.
pub fn sidecar_name(ctx: &RequestContext) -> String {
    format!("lifeguard:sidecar:{}", ctx.policy.name)
}

/// After the owner made a request about `record` with a valid token: moves the task's identity
/// lease forward (at most ten writes per lease period) and, under delegation, extends the
/// delegation to what this token allows, audited as `task.identity_refreshed`.
pub async fn renew(app: &AppState, ctx: &RequestContext, record: &TaskRecord) {
    if record.status.is_terminal() || identity_revoked(app, &ctx.identity) {
        return;
    }
    let now = now_ms();
    let lease = ctx
        .policy
        .effective
        .tasks
        .as_ref()
        .and_then(|t| t.identity_lease.as_ref())
        .map(|l| l.get().as_millis() as i64);
    let lease_until = lease.and_then(|lease| {
        let next = now.saturating_add(lease);
        let stale = record
            .lease_until
            .is_none_or(|stored| next - stored >= (lease / 10).max(1));
        stale.then_some(next)
    });
    let delegated = delegates(ctx)
        .then(|| delegated_until(ctx, record.deadline_at))
        .filter(|until| record.delegated_until.is_none_or(|stored| *until > stored));
    if lease_until.is_none() && delegated.is_none() {
        return;
    }
    match app
        .ledger
        .renew_identity(&record.id, lease_until, delegated)
        .await
    {
        Ok(true) => {
            // A write about the task: a remembered read of it is stale now.
            app.replica.forget_home(&record.id);
            if let Some(until) = delegated {
                app.audit.log(
                    ctx.audit("task.identity_refreshed", Decision::Allow, "owner_token")
                        .tool(&record.tool)
                        .for_task(&app.hasher, &record.id, &record.correlation_id)
                        .detail("delegatedUntil", iso_millis(until))
                        .detail(
                            "previousUntil",
                            record
                                .delegated_until
                                .map(iso_millis)
                                .map_or(json!(null), |t| json!(t)),
                        ),
                );
            }
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "renewing a task's identity lease failed"),
    }
}
