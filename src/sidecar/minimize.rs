//! Where `tasks.results` meets the server's output on its way to a client: the hooks the
//! relay, `tasks/get`, `tasks/update` and listen streams call. Each does nothing (and costs
//! nothing) when the policy in force has no `tasks.results` rules; the rules themselves are
//! the pure [`ResultMinimizer`](super::decisions::ResultMinimizer).

use serde_json::Value;

use crate::mcp::methods;
use crate::mcp::task::result_type;

use super::active_policy::ActivePolicy;
use super::context::RequestContext;

/// Whether answers to this request are rewritten: a `tools/call` under `tasks.results` rules
/// that change a synchronous answer (not `maxBytes` alone). Such answers never take the
/// byte-for-byte path.
pub fn rewrites_answer(ctx: &RequestContext) -> bool {
    ctx.policy
        .results
        .as_ref()
        .is_some_and(|m| m.changes_sync())
        && ctx.request.method == methods::TOOLS_CALL
}

/// The final answer to a `tools/call` as the client receives it: a result that makes a task
/// (or asks for input) has its task state masked, a plain result is minimized as a synchronous
/// CallToolResult, an error has its texts masked.
pub fn call_answer(ctx: &RequestContext, mut message: Value) -> Value {
    if !rewrites_answer(ctx) {
        return message;
    }
    let Some(minimizer) = &ctx.policy.results else {
        return message;
    };
    if let Some(error) = message.get_mut("error") {
        minimizer.mask_error(error);
        return message;
    }
    let Some(result) = message.get_mut("result") else {
        return message;
    };
    if result_type(result).needs_inspection() {
        minimizer.mask_task_state(result);
    } else {
        *result = minimizer.minimize_sync(result.take());
    }
    message
}

/// A notification on a `tools/call` response stream (progress, log messages), masked.
pub fn call_notification(ctx: &RequestContext, message: &mut Value) {
    if rewrites_answer(ctx)
        && let Some(minimizer) = &ctx.policy.results
    {
        minimizer.mask_notification(message);
    }
}

/// A task state the client is about to receive (a `tasks/get` result, the params of a
/// `notifications/tasks` frame), masked.
pub fn task_state(policy: &ActivePolicy, state: &mut Value) {
    if let Some(minimizer) = &policy.results {
        minimizer.mask_task_state(state);
    }
}

/// The server's JSON-RPC response about a task, passed on: its error's texts masked.
pub fn task_reply_error(policy: &ActivePolicy, reply: &mut Value) {
    if let (Some(minimizer), Some(error)) = (&policy.results, reply.get_mut("error")) {
        minimizer.mask_error(error);
    }
}

/// Whether a task state must be masked, so a poll cannot be translated on the wire.
pub fn masks_task_states(policy: &ActivePolicy) -> bool {
    policy.results.as_ref().is_some_and(|m| m.masks_text())
}
