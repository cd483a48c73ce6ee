//! The sidecar's decisions as pure functions: facts in (a ledger record, a clock reading, the
//! policy's numbers, an upstream reply), a verdict out. No IO, no shared state; the handlers
//! gather the facts, call these, and carry out the verdict. Each file is tested on its own.

mod access;
mod cancellation;
mod creation;
mod endings;
mod reads;
mod replies;

pub use access::{Access, Operation, authorize, holds_scopes, missing_scopes};
pub use cancellation::{Report, end_for_report, intent_for, next_attempt_at, unconfirmed_end};
pub use creation::confirmation_terms;
pub use endings::{
    cancellation, capability_refused, deadline_exceeded, lifecycle_event, revocation,
};
pub use reads::{ReadPlan, deliver_result, plan_read, task_view};
pub use replies::{
    FinalAnswer, JsonAnswer, Outstanding, TaskReply, classify_final, forwardable_inputs,
    interpret_task_reply, judge_json_answer,
};
