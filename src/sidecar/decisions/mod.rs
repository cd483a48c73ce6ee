//! The sidecar's decisions as pure functions: facts in (a ledger record, a clock reading, the
//! policy's numbers, an upstream reply), a verdict out. No IO, no shared state; the handlers
//! gather the facts, call these, and carry out the verdict. Each file is tested on its own.

mod access;
mod cancellation;
mod creation;
mod endings;
mod reads;
mod replies;
mod results;
mod revoked;

pub use access::{Access, Operation, authorize, holds_scopes, missing_scopes};
pub use cancellation::{
    Report, end_for_report, intent_for, may_confirm_unseen_intent, next_attempt_at, unconfirmed_end,
};
pub use creation::confirmation_terms;
pub use endings::{
    cancellation, capability_refused, deadline_exceeded, home_replica_gone, identity_lease_expired,
    lifecycle_event, revocation,
};
pub use reads::{ReadPlan, deliver_result, plan_read, task_view};
pub use replies::{
    FinalAnswer, JsonAnswer, Outstanding, TaskReply, classify_final, forwardable_inputs,
    interpret_task_reply, judge_json_answer,
};
pub use results::{Minimized, ResultMinimizer};
pub use revoked::{end_after_revocation, revocation_over, revokes_task, revokes_token};

/// A working task of `owner` for unit tests (created at 0, 60 s retention, 30 s deadline);
/// tests change the fields they are about with struct update syntax.
#[cfg(test)]
pub(crate) fn test_task(owner: crate::model::Owner) -> crate::ledger::TaskRecord {
    crate::ledger::TaskRecord {
        id: crate::model::TaskId::from_string("lgt_x"),
        upstream_id: "up".into(),
        owner,
        tool: "t".into(),
        scopes: vec![],
        status: crate::model::TaskStatus::Working,
        status_message: None,
        created_at: 0,
        last_updated_at: 0,
        ttl_ms: 60_000,
        deadline_at: 30_000,
        poll_interval_ms: None,
        ended: None,
        result_reads: 0,
        token_issued_at: None,
        home: String::new(),
        correlation_id: String::new(),
        object: None,
        lease_until: None,
        delegated_until: None,
        cancel: None,
        trace: None,
        binding: None,
    }
}
