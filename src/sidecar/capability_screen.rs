//! Applying the capability gate to what the server sends: the input requests of a task state
//! (`tasks/get` results, `notifications/tasks`) and of an `input_required` answer outside a
//! task. Refused requests never reach the client; the server is told they were declined.

use serde_json::{Map, Value};

use crate::ledger::TaskRecord;
use crate::mcp::task::{
    ResultType, clear_input_requests, input_requests_mut, response_input_requests_mut,
    response_request_state, response_result_type, set_input_responses,
};

use super::active_policy::ActivePolicy;
use super::capability::{Carrier, decline};
use super::context::RequestContext;
use super::error::Error;
use super::server_tasks::send_input_responses;
use super::state::AppState;

/// What the request that will receive a task state declared.
pub struct Recipient<'a> {
    /// Client capabilities declared on that request.
    pub declared: &'a Value,
    pub protocol_version: &'a str,
    pub correlation_id: &'a str,
}

impl<'a> Recipient<'a> {
    pub fn of(ctx: &'a RequestContext) -> Self {
        Self {
            declared: &ctx.facts.capabilities,
            protocol_version: &ctx.facts.protocol_version,
            correlation_id: &ctx.correlation_id,
        }
    }
}

/// Screens the input requests of a task state in place: refused requests are removed, the
/// server is sent a decline for each newly refused one, and a task left with nothing to ask
/// reads `working`.
pub fn screen_task_state(
    app: &AppState,
    policy: &ActivePolicy,
    record: &TaskRecord,
    recipient: &Recipient<'_>,
    state: &mut Value,
) {
    let Some(requests) = input_requests_mut(state) else {
        return;
    };
    let carrier = Carrier {
        scope: record.id.as_str(),
        owner: &record.owner,
        declared: recipient.declared,
        protocol_version: recipient.protocol_version,
        correlation_id: recipient.correlation_id,
        policy_name: &policy.name,
    };
    let screened = app
        .gate
        .screen(&policy.effective, policy.trust.as_ref(), &carrier, requests);
    let nothing_left = requests.is_empty();
    screened.count(&app.metrics);
    let hashed = app.hasher.hash(&record.id);
    for event in screened.events {
        app.audit.log(event.tool(&record.tool).task(hashed.clone()));
    }
    if nothing_left {
        clear_input_requests(state);
    }
    if screened.newly_rejected.is_empty() {
        return;
    }
    let declines: Map<String, Value> = screened
        .newly_rejected
        .iter()
        .map(|(key, method, reason)| (key.clone(), decline(method, *reason)))
        .collect();
    send_input_responses(&app.upstream, record, recipient.correlation_id, declines);
}

/// Most times the sidecar answers refused input requests for the client before it gives up.
const MAX_DECLINE_ROUNDS: usize = 3;

/// Screens the input requests of an `input_required` answer outside a task (multi round-trip
/// requests). When the gate refuses any of them, the client sees none of this round: the
/// sidecar retries the request upstream itself, with a decline for each refused key and the
/// server's `requestState`, so the server learns the answer and can go on (complete, or ask
/// again for what it still needs). Decisions are scoped to this client request (its correlation
/// id), so a key asked again in a later round is not charged twice.
pub async fn screen_request_inputs(
    app: &AppState,
    ctx: &RequestContext,
    mut message: Value,
) -> Value {
    for _ in 0..=MAX_DECLINE_ROUNDS {
        let Some(requests) = response_input_requests_mut(&mut message) else {
            return message;
        };
        let carrier = Carrier {
            scope: &ctx.correlation_id,
            owner: &ctx.identity.owner,
            declared: &ctx.facts.capabilities,
            protocol_version: &ctx.facts.protocol_version,
            correlation_id: &ctx.correlation_id,
            policy_name: &ctx.policy.name,
        };
        let screened = app.gate.screen(
            &ctx.policy.effective,
            ctx.policy.trust.as_ref(),
            &carrier,
            requests,
        );
        screened.count(&app.metrics);
        for event in screened.events {
            app.audit.log(event);
        }
        if screened.refused.is_empty() {
            return message;
        }
        let declines: Map<String, Value> = screened
            .refused
            .into_iter()
            .map(|(key, method, reason)| (key, decline(&method, reason)))
            .collect();
        let Some(mut retry) = serde_json::from_slice::<Value>(&ctx.body)
            .ok()
            .filter(|r| r.get("params").is_some_and(Value::is_object))
        else {
            break;
        };
        // The client's request again, answering with the declines under the server's
        // requestState.
        set_input_responses(&mut retry, declines, Some(response_request_state(&message)));
        message = match app.upstream.call(ctx.upstream_headers(), &retry).await {
            Ok((_, answer)) => answer,
            Err(e) => {
                tracing::warn!(error = %e, "retrying with capability declines failed");
                break;
            }
        };
        if response_result_type(&message) != Some(ResultType::InputRequired) {
            return message;
        }
    }
    Error::CapabilityNotAllowed.message(&app.metrics, &ctx.id())
}
