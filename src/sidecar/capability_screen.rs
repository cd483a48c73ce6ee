//! Applying the capability gate to what the server sends: the input requests of a task state
//! (`tasks/get` results, `notifications/tasks`) and of an `input_required` answer outside a
//! task. Refused requests never reach the client; the server is told they were declined.

use serde_json::{Map, Value, json};

use crate::audit::Decision;

use crate::ledger::TaskRecord;
use crate::mcp::task::{
    ResultType, clear_input_requests, input_requests_mut, response_input_requests_mut,
    response_request_state, response_result_type, set_input_responses,
};

use super::active_policy::ActivePolicy;
use super::capability::{Budget, Carrier};
use super::capability_refusal::{Refusal, refusal, unanswerable_error};
use super::context::RequestContext;
use super::decisions::capability_refused;
use super::error::Error;
use super::server_tasks::{cancel_at_server, send_input_responses};
use super::state::AppState;
use super::task_state::{now_ms, settle_terminal};

/// What the request that will receive a task state declared.
pub struct Recipient<'a> {
    /// Client capabilities declared on that request.
    pub declared: &'a Value,
    pub protocol_version: &'a str,
    pub correlation_id: &'a str,
    /// That request's bearer token (the secret scanner refuses it in sampling requests).
    pub bearer: Option<&'a str>,
}

impl<'a> Recipient<'a> {
    pub fn of(ctx: &'a RequestContext) -> Self {
        Self {
            declared: &ctx.facts.capabilities,
            protocol_version: &ctx.facts.protocol_version,
            correlation_id: &ctx.correlation_id,
            bearer: ctx.bearer(),
        }
    }
}

/// What screening a task state led to.
pub enum Screening {
    /// The state (with what the gate let through) may be delivered.
    Deliver,
    /// The server asked for something that cannot be declined: the task failed; report this
    /// record instead.
    TaskFailed(Box<TaskRecord>),
}

/// Screens the input requests of a task state in place: refused requests are removed and the
/// server is told, and a task left with nothing to ask reads `working`. A refusal the server
/// can take (`roots/list` → no roots) is sent as a `tasks/update`; a refused request that
/// cannot be declined (sampling) fails the task with a status message naming the policy, and
/// the server is asked to cancel it.
pub async fn screen_task_state(
    app: &AppState,
    policy: &ActivePolicy,
    record: &TaskRecord,
    recipient: &Recipient<'_>,
    state: &mut Value,
) -> Screening {
    let Some(requests) = input_requests_mut(state) else {
        return Screening::Deliver;
    };
    let carrier = Carrier {
        scope: record.id.as_str(),
        budget: Budget::Task(record.id.as_str().to_owned()),
        audit_ok: !app.audit_blocks(policy),
        owner: &record.owner,
        declared: recipient.declared,
        protocol_version: recipient.protocol_version,
        correlation_id: recipient.correlation_id,
        policy: policy.stamp(),
        scanner: &policy.secret_scanner,
        bearer: recipient.bearer,
    };
    let screened = app
        .gate
        .screen(
            app.ledger.as_ref(),
            &policy.effective,
            policy.trust.as_ref(),
            &carrier,
            requests,
        )
        .await;
    let nothing_left = requests.is_empty();
    screened.count(&app.metrics);
    for event in screened.events {
        app.audit.log(event.tool(&record.tool).for_task(
            &app.hasher,
            &record.id,
            &record.correlation_id,
        ));
    }
    if nothing_left {
        clear_input_requests(state);
    }
    let mut answers = Map::new();
    for (key, method, reason) in &screened.refused {
        match refusal(method) {
            Refusal::Answer(answer) => {
                // Sent once, when the gate first refuses the key.
                if screened.newly_rejected.iter().any(|(k, _, _)| k == key) {
                    answers.insert(key.clone(), answer);
                }
            }
            Refusal::Unanswerable => {
                let error = unanswerable_error(
                    method,
                    *reason,
                    &policy.effective.capabilities,
                    &policy.name,
                );
                let finish = capability_refused(error, now_ms());
                let settled =
                    settle_terminal(app, policy, recipient.correlation_id, record, finish).await;
                if let Some(settled) = settled {
                    if settled.applied {
                        // Boxed: a refusal's path, held inline it would size every poll's future.
                        Box::pin(cancel_at_server(
                            app,
                            recipient.correlation_id,
                            record,
                            "capability_refused",
                        ))
                        .await;
                    }
                    return Screening::TaskFailed(Box::new(settled.record));
                }
            }
        }
    }
    if !answers.is_empty() {
        send_input_responses(app, record, recipient.correlation_id, answers);
    }
    Screening::Deliver
}

/// Most times the sidecar answers refused input requests for the client before it gives up.
const MAX_DECLINE_ROUNDS: usize = 3;

/// Screens the input requests of an `input_required` answer outside a task (multi round-trip
/// requests). When the gate refuses any of them, the client sees none of this round: the
/// sidecar retries the request upstream itself, with a refusal for each refused key (no roots)
/// and the server's `requestState`, so the server learns the answer and can go on (complete,
/// or ask again for what it still needs). A refused sampling request cannot be declined: the
/// call ends with the documented error instead. Decisions are scoped to this client request (its correlation
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
            budget: Budget::Exchange {
                tool: format!(
                    "{} {}",
                    ctx.request.method,
                    ctx.request.param_str("name").unwrap_or_default()
                ),
            },
            owner: &ctx.identity.owner,
            declared: &ctx.facts.capabilities,
            protocol_version: &ctx.facts.protocol_version,
            correlation_id: &ctx.correlation_id,
            policy: ctx.policy.stamp(),
            audit_ok: !app.audit_blocks(&ctx.policy),
            scanner: &ctx.policy.secret_scanner,
            bearer: ctx.bearer(),
        };
        let screened = app
            .gate
            .screen(
                app.ledger.as_ref(),
                &ctx.policy.effective,
                ctx.policy.trust.as_ref(),
                &carrier,
                requests,
            )
            .await;
        screened.count(&app.metrics);
        for event in screened.events {
            app.audit.log(event);
        }
        if screened.refused.is_empty() {
            return message;
        }
        // A refusal the server cannot take ends the call: nothing is retried upstream (the
        // server keeps no state between rounds) and the client gets the documented error.
        if let Some((_, method, reason)) = screened
            .refused
            .iter()
            .find(|(_, method, _)| refusal(method) == Refusal::Unanswerable)
        {
            let error = unanswerable_error(
                method,
                *reason,
                &ctx.policy.effective.capabilities,
                &ctx.policy.name,
            );
            app.audit.log(
                ctx.audit("request.failed", Decision::Deny, "capability_refused")
                    .detail("capability", method.clone()),
            );
            return json!({"jsonrpc": "2.0", "id": ctx.id(), "error": error});
        }
        let declines: Map<String, Value> = screened
            .refused
            .into_iter()
            .filter_map(|(key, method, _)| match refusal(&method) {
                Refusal::Answer(answer) => Some((key, answer)),
                Refusal::Unanswerable => None,
            })
            .collect();
        let Some(mut retry) = serde_json::from_slice::<Value>(&ctx.body)
            .ok()
            .filter(|r| r.get("params").is_some_and(Value::is_object))
        else {
            break;
        };
        // The client's request again, answering with the refusals under the server's
        // requestState.
        set_input_responses(&mut retry, declines, Some(response_request_state(&message)));
        let mut headers = ctx.upstream_headers();
        let tool = ctx
            .request
            .params()
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str);
        if super::task_state::identity_revoked(app, &ctx.identity) {
            break; // revoked meanwhile: nothing more goes out on the caller's behalf
        }
        super::delegate::attach(app, ctx, &mut headers, None, tool);
        // Boxed: only a declined input request gets here, and held inline the call would size
        // every forwarded request's future.
        message = match Box::pin(app.upstream.call(headers, &retry)).await {
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
