//! What a revocation covers (principals, their tokens, the tasks those tokens started), and
//! what a server's report becomes once the owner of a task is revoked: whatever the server
//! says afterwards, the task ends cancelled for the revocation, and no result is kept for the
//! revoked owner.

use crate::ledger::{EndReason, Finish, TaskRecord};
use crate::model::Owner;
use crate::policy::RevocationRule;

use super::cancellation::intended_end;
use super::endings::revocation;

fn issued(seconds: Option<i64>) -> Option<jiff::Timestamp> {
    seconds.and_then(|s| jiff::Timestamp::from_second(s).ok())
}

/// Whether a revocation covers a principal's token issued at `issued_at` (Unix seconds).
pub fn revokes_token(rule: &RevocationRule, owner: &Owner, issued_at: Option<i64>) -> bool {
    rule.covers(&owner.issuer, &owner.subject, &owner.tenant, &owner.client)
        && rule.refuses_token_issued_at(issued(issued_at))
}

/// Whether a task falls under a revocation: same principal (and tenant/client when the
/// revocation names them), started by a token the revocation refuses.
pub fn revokes_task(rule: &RevocationRule, record: &TaskRecord) -> bool {
    revokes_token(rule, &record.owner, record.token_issued_at)
}

/// The first of `rules` that covers `record`.
pub fn revocation_over<'a>(
    rules: &'a [RevocationRule],
    record: &TaskRecord,
) -> Option<&'a RevocationRule> {
    rules.iter().find(|r| revokes_task(r, record))
}

/// The end to record for `finish`, a server's report (completed, failed, cancelled, forgotten)
/// about `record`, when `record`'s owner is revoked — by the revocation cancel the record
/// carries, or by `covering`, a revocation in force now (one applied a moment ago, whose
/// cancel is not recorded yet). A report that arrives after the revocation (a poll or a
/// listen frame already in flight, the outbox's confirmation) never stores a result for the
/// revoked owner: the task ends cancelled for the revocation. The sidecar's own ends pass.
pub fn end_after_revocation(
    record: &TaskRecord,
    covering: Option<&RevocationRule>,
    finish: Finish,
    now_ms: i64,
) -> Finish {
    if !matches!(
        finish.ending.reason,
        EndReason::Upstream | EndReason::UpstreamLost
    ) {
        return finish;
    }
    match (&record.cancel, covering) {
        (Some(intent), _) if intent.reason == EndReason::Revocation => {
            intended_end(intent, now_ms, "")
        }
        (_, Some(rule)) => revocation(rule.reason, now_ms),
        _ => finish,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::RevocationReason;
    use crate::ledger::{Ending, TaskStatus};

    fn owner(subject: &str) -> Owner {
        Owner {
            issuer: "https://idp".into(),
            subject: subject.into(),
            tenant: "t1".into(),
            client: "c".into(),
        }
    }

    fn rule(reason: RevocationReason) -> RevocationRule {
        RevocationRule {
            name: "r".into(),
            issuer: "https://idp".into(),
            subject: Some("alice".into()),
            tenant: None,
            client: None,
            revoked_before: jiff::Timestamp::from_second(1_000).unwrap(),
            reason,
        }
    }

    fn completed() -> Finish {
        Finish {
            status: TaskStatus::Completed,
            status_message: None,
            ending: Ending {
                reason: EndReason::Upstream,
                by: None,
                payload: Some(json!({"content": [{"type": "text", "text": "secret"}]})),
                at: 5,
            },
        }
    }

    #[test]
    fn session_revocations_refuse_older_tokens_of_that_principal_only() {
        let r = rule(RevocationReason::SessionRevoked);
        assert!(revokes_token(&r, &owner("alice"), Some(999)));
        assert!(!revokes_token(&r, &owner("alice"), Some(1_001)));
        assert!(!revokes_token(&r, &owner("bob"), Some(999)));
    }

    #[test]
    fn account_revocations_refuse_every_token() {
        let r = rule(RevocationReason::AccountDisabled);
        assert!(revokes_token(&r, &owner("alice"), Some(5_000)));
        assert!(revokes_token(&r, &owner("alice"), None));
    }

    #[test]
    fn a_result_reported_after_the_revocation_is_not_kept() {
        let r = rule(RevocationReason::AccountDisabled);
        let record = super::super::test_task(owner("alice"));
        assert!(revocation_over(std::slice::from_ref(&r), &record).is_some());
        let end = end_after_revocation(&record, Some(&r), completed(), 9);
        assert_eq!(end.status, TaskStatus::Cancelled);
        assert_eq!(end.ending.reason, EndReason::Revocation);
        assert!(end.ending.payload.is_none());
        assert_eq!(end.ending.at, 9);
    }

    #[test]
    fn a_recorded_revocation_cancel_wins_over_a_late_result() {
        let revoke_end = revocation(RevocationReason::SessionRevoked, 1);
        let record = crate::ledger::TaskRecord {
            cancel: Some(super::super::intent_for(&revoke_end, 1, 10)),
            ..super::super::test_task(owner("alice"))
        };
        // The revocation is no longer in force (e.g. a newer policy), but the task's cancel is.
        let end = end_after_revocation(&record, None, completed(), 9);
        assert_eq!(end.ending.reason, EndReason::Revocation);
        assert!(end.ending.payload.is_none());
        assert_eq!(end.status_message, revoke_end.status_message);
    }

    #[test]
    fn other_owners_and_the_sidecars_own_ends_pass() {
        let r = rule(RevocationReason::AccountDisabled);
        let bob = super::super::test_task(owner("bob"));
        assert!(revocation_over(std::slice::from_ref(&r), &bob).is_none());
        let end = end_after_revocation(&bob, None, completed(), 9);
        assert_eq!(end.status, TaskStatus::Completed);
        let alice = super::super::test_task(owner("alice"));
        let deadline = super::super::deadline_exceeded(&alice, 9);
        let end = end_after_revocation(&alice, Some(&r), deadline.clone(), 9);
        assert_eq!(end.ending.reason, deadline.ending.reason);
    }
}
