//! The argument checks every backend makes before it touches storage (the trait's
//! `InvalidArgument` cases), in one place so the backends refuse exactly the same requests.

use super::{CancelIntent, Finish, LedgerError, Result, TaskStatus};

/// `confirm` and `observe` take non-terminal statuses only: a task becomes terminal through
/// `finish`.
pub(crate) fn require_nonterminal(status: TaskStatus, operation: &str) -> Result<()> {
    if status.is_terminal() {
        return Err(LedgerError::InvalidArgument(format!(
            "{operation} takes a non-terminal status, got {}; use finish",
            status.as_str()
        )));
    }
    Ok(())
}

/// `finish` takes a terminal status.
pub(crate) fn check_finish(finish: &Finish) -> Result<()> {
    if !finish.status.is_terminal() {
        return Err(LedgerError::InvalidArgument(format!(
            "finish takes a terminal status, got {}",
            finish.status.as_str()
        )));
    }
    Ok(())
}

/// `request_cancel` takes a cancellation reason and a give-up time not before the request.
pub(crate) fn check_intent(intent: &CancelIntent) -> Result<()> {
    if !intent.reason.is_cancellation() {
        return Err(LedgerError::InvalidArgument(format!(
            "request_cancel takes a cancellation reason (owner_cancel, admin_cancel, \
             deadline, revocation), got {}",
            intent.reason.as_str()
        )));
    }
    if intent.give_up_at < intent.requested_at {
        return Err(LedgerError::InvalidArgument(format!(
            "request_cancel: give_up_at ({}) is before requested_at ({})",
            intent.give_up_at, intent.requested_at
        )));
    }
    Ok(())
}
