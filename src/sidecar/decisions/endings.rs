//! How tasks end: the ledger's terminal record for each way a task can end, and the audit
//! event each ending is reported as.

use std::time::Duration;

use serde_json::json;

use crate::api::{PolicyDuration, RevocationReason};
use crate::identity::Identity;
use crate::ledger::{EndReason, Ending, Finish, TaskRecord};
use crate::mcp::codes;
use crate::mcp::refusal::Refusal;
use crate::mcp::task::ReportedState;
use crate::model::TaskStatus;

use super::access::Access;

/// The error a task the sidecar ended carries: `message`, and the structured refusal with
/// `reason` and `remediation: none` (the task is over; no retry revives it).
fn ended_error(message: &str, reason: &'static str) -> serde_json::Value {
    json!({"code": codes::INTERNAL_ERROR, "message": message,
           "data": Refusal::final_(reason).data()})
}

/// The error of a task that ran past its deadline (`data.reason: deadline`, as the ending).
pub fn deadline_error() -> serde_json::Value {
    ended_error("Deadline exceeded", EndReason::Deadline.as_str())
}

/// The ledger's terminal record for a state the server reported, if it is terminal.
pub fn upstream_end(state: &ReportedState, now_ms: i64) -> Option<Finish> {
    state.status.is_terminal().then(|| Finish {
        status: state.status,
        status_message: state.status_message.clone(),
        ending: Ending {
            reason: EndReason::Upstream,
            by: None,
            payload: state.payload.clone(),
            at: now_ms,
        },
    })
}

/// The ledger's record for a task the server no longer knows.
pub fn upstream_lost(now_ms: i64) -> Finish {
    Finish {
        status: TaskStatus::Failed,
        status_message: Some("The MCP server no longer knows this task".into()),
        ending: Ending {
            reason: EndReason::UpstreamLost,
            by: None,
            payload: Some(ended_error(
                "The MCP server lost this task",
                EndReason::UpstreamLost.as_str(),
            )),
            at: now_ms,
        },
    }
}

/// The ledger's record for a task whose home replica is gone (its heartbeat expired): its
/// server state went with it, so it cannot finish. Recorded as lost upstream, saying why.
pub fn home_replica_gone(home: &str, now_ms: i64) -> Finish {
    let message = format!(
        "The replica that ran this task ({home}) stopped; the task's work was lost with it"
    );
    Finish {
        status: TaskStatus::Failed,
        status_message: Some(message.clone()),
        ending: Ending {
            reason: EndReason::UpstreamLost,
            by: None,
            payload: Some(ended_error(&message, "replica_gone")),
            at: now_ms,
        },
    }
}

/// The end of a task whose server asked for a capability the policy refuses and that cannot
/// be declined; `error` is the JSON-RPC error object that says so.
pub fn capability_refused(error: serde_json::Value, now_ms: i64) -> Finish {
    Finish {
        status: TaskStatus::Failed,
        status_message: error
            .get("message")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
        ending: Ending {
            reason: EndReason::CapabilityRefused,
            by: None,
            payload: Some(error),
            at: now_ms,
        },
    }
}

/// A cancellation by the task's owner or an administrator (`tasks/cancel`).
pub fn cancellation(access: Access, by: &Identity, now_ms: i64) -> Finish {
    let (reason, message) = match access {
        Access::Owner => (EndReason::OwnerCancel, "Cancelled by its owner"),
        Access::Admin => (EndReason::AdminCancel, "Cancelled by an administrator"),
    };
    Finish {
        status: TaskStatus::Cancelled,
        status_message: Some(message.into()),
        ending: Ending {
            reason,
            by: Some(by.owner.clone()),
            payload: None,
            at: now_ms,
        },
    }
}

/// The end of a task that ran past its server-enforced deadline.
pub fn deadline_exceeded(record: &TaskRecord, now_ms: i64) -> Finish {
    let limit = Duration::from_millis((record.deadline_at - record.created_at).max(0) as u64);
    Finish {
        status: TaskStatus::Failed,
        status_message: Some(format!(
            "Deadline exceeded: the task ran longer than its limit of {}",
            PolicyDuration::from(limit)
        )),
        ending: Ending {
            reason: EndReason::Deadline,
            by: None,
            payload: Some(deadline_error()),
            at: now_ms,
        },
    }
}

/// The end of a task whose owner presented no valid token within its identity lease.
pub fn identity_lease_expired(record: &TaskRecord, now_ms: i64) -> Finish {
    Finish {
        status: TaskStatus::Cancelled,
        status_message: Some(format!(
            "Cancelled: the owner presented no valid token since {} (tasks.identityLease)",
            crate::mcp::task::iso_millis(record.lease_until.unwrap_or(now_ms).min(now_ms))
        )),
        ending: Ending {
            reason: EndReason::IdentityLeaseExpired,
            by: None,
            payload: None,
            at: now_ms,
        },
    }
}

/// The end of a task whose owner's access was revoked.
pub fn revocation(reason: RevocationReason, now_ms: i64) -> Finish {
    let reason = serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    Finish {
        status: TaskStatus::Cancelled,
        status_message: Some(format!(
            "Cancelled: the owner's access was revoked ({reason})"
        )),
        ending: Ending {
            reason: EndReason::Revocation,
            by: None,
            payload: None,
            at: now_ms,
        },
    }
}

/// The audit event of a terminal transition: ends the sidecar imposed (owner, admin, deadline,
/// revocation) are cancellations whatever status they leave; the rest follow the status.
pub fn lifecycle_event(status: TaskStatus, reason: EndReason) -> &'static str {
    match (reason, status) {
        (EndReason::AdminCancel, _) => "task.admin_cancelled",
        (
            EndReason::OwnerCancel
            | EndReason::Deadline
            | EndReason::Revocation
            | EndReason::IdentityLeaseExpired,
            _,
        ) => "task.cancelled",
        (_, TaskStatus::Completed) => "task.completed",
        (_, TaskStatus::Cancelled) => "task.cancelled",
        _ => "task.failed",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::Owner;

    fn state(status: TaskStatus) -> ReportedState {
        ReportedState {
            status,
            status_message: Some("m".into()),
            input_keys: vec![],
            payload: Some(json!({"content": []})),
        }
    }

    #[test]
    fn only_terminal_reports_end_a_task() {
        assert!(upstream_end(&state(TaskStatus::Working), 1).is_none());
        assert!(upstream_end(&state(TaskStatus::InputRequired), 1).is_none());
        let end = upstream_end(&state(TaskStatus::Completed), 7).expect("terminal");
        assert_eq!(end.status, TaskStatus::Completed);
        assert_eq!(end.ending.reason, EndReason::Upstream);
        assert_eq!(end.ending.payload, Some(json!({"content": []})));
        assert_eq!(end.ending.at, 7);
    }

    #[test]
    fn cancellations_name_who_cancelled() {
        let by = Identity {
            owner: Owner {
                issuer: "i".into(),
                subject: "ops".into(),
                tenant: "t".into(),
                client: "c".into(),
            },
            scopes: BTreeSet::new(),
            issued_at: None,
            expires_at: 0,
            binding: None,
        };
        let owner = cancellation(Access::Owner, &by, 1);
        assert_eq!(owner.ending.reason, EndReason::OwnerCancel);
        assert_eq!(
            owner.ending.by.as_ref().map(|o| o.subject.as_str()),
            Some("ops")
        );
        let admin = cancellation(Access::Admin, &by, 1);
        assert_eq!(admin.ending.reason, EndReason::AdminCancel);
        assert_eq!(
            admin.status_message.as_deref(),
            Some("Cancelled by an administrator")
        );
    }

    #[test]
    fn deadline_and_revocation_ends_say_why() {
        let owner = Owner {
            issuer: "i".into(),
            subject: "s".into(),
            tenant: String::new(),
            client: String::new(),
        };
        let record = TaskRecord {
            created_at: 1_000,
            last_updated_at: 1_000,
            ttl_ms: 600_000,
            deadline_at: 91_000,
            ..crate::sidecar::decisions::test_task(owner)
        };
        let d = deadline_exceeded(&record, 91_000);
        assert_eq!(d.status, TaskStatus::Failed);
        assert!(
            d.status_message
                .as_deref()
                .unwrap()
                .contains("limit of 90s"),
            "{:?}",
            d.status_message
        );
        let r = revocation(RevocationReason::CredentialCompromise, 5);
        assert_eq!(r.status, TaskStatus::Cancelled);
        assert_eq!(
            r.status_message.as_deref(),
            Some("Cancelled: the owner's access was revoked (credentialCompromise)")
        );
        assert_eq!(upstream_lost(3).ending.reason, EndReason::UpstreamLost);
        let refused = capability_refused(json!({"code": -32603, "message": "no sampling"}), 4);
        assert_eq!(refused.status, TaskStatus::Failed);
        assert_eq!(refused.status_message.as_deref(), Some("no sampling"));
        assert_eq!(
            lifecycle_event(refused.status, refused.ending.reason),
            "task.failed"
        );
    }

    #[test]
    fn sidecar_imposed_ends_are_cancellations() {
        assert_eq!(
            lifecycle_event(TaskStatus::Failed, EndReason::Deadline),
            "task.cancelled"
        );
        assert_eq!(
            lifecycle_event(TaskStatus::Cancelled, EndReason::AdminCancel),
            "task.admin_cancelled"
        );
        assert_eq!(
            lifecycle_event(TaskStatus::Completed, EndReason::Upstream),
            "task.completed"
        );
        assert_eq!(
            lifecycle_event(TaskStatus::Failed, EndReason::UpstreamLost),
            "task.failed"
        );
    }
}
