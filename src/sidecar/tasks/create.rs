//! `tools/call`: the one way a task comes into being. It reads top to bottom: check scopes →
//! reserve a slot in the ledger (quotas, idempotency) → forward to the server → confirm the
//! task durably when the server created one (before the client sees the `CreateTaskResult`) →
//! answer with the sidecar's own task ID.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

use crate::audit::{Decision, summarize};
use crate::ledger::{Confirmed, IdempotencyClaim, Reservation, ReserveOutcome, TaskLedger};
use crate::mcp::jsonrpc::{ErrorObject, result_message};
use crate::mcp::refusal::{Refusal, Remediation};
use crate::mcp::task::{iso_millis, parse_created_task, present_task};
use crate::mcp::{TASKS_EXTENSION, codes};
use crate::model::TaskId;
use crate::policy::TaskRules;

use super::super::active_policy::TaskNumbers;
use super::super::capability_screen::{Recipient, Screening, screen_task_state};
use super::super::context::RequestContext;
use super::super::decisions::{confirmation_terms, missing_scopes, task_view};
use super::super::delegate::{self, TaskBinding};
use super::super::error::Error;
use super::super::object_access::object_digest;
use super::super::objects::{self, Action, Verdict, object_of};
use super::super::relay::{FinalStep, RefuseTasks, send_and_relay};
use super::super::respond;
use super::super::revocation::cancel_if_revoked;
use super::super::server_tasks::cancel_orphan;
use super::super::state::AppState;
use super::super::task_state::now_ms;
use super::idempotency;
use super::reconcile::reconcile_principal;

/// How long a reservation outlives the upstream timeout before it is considered abandoned.
const RESERVATION_GRACE: Duration = Duration::from_secs(60);

/// Handles `tools/call`.
pub async fn call_tool(app: Arc<AppState>, ctx: RequestContext, tool: String) -> Response {
    let policy = &ctx.policy;
    // Scopes a tool requires apply to every call of it, task or not.
    if let Some(tasks) = &policy.effective.tasks {
        let missing = missing_scopes(tasks.scopes_for(&tool), &ctx.identity);
        if !missing.is_empty() {
            app.metrics.denial("scope");
            app.audit.log(
                ctx.audit("task.denied", Decision::Deny, "scope")
                    .tool(&tool)
                    .detail("missingScopes", json!(missing)),
            );
            return respond::insufficient_scope(
                &policy.resource_metadata_url,
                &ctx.id(),
                &missing,
                &policy.name,
            );
        }
    }
    // The object the call acts on, when the tool names one: the authorizer decides first.
    let object = match authorize_object(&app, &ctx, &tool).await {
        Ok(object) => object,
        Err(refusal) => return refusal,
    };
    let mut headers = ctx.upstream_headers();
    let task_terms = policy
        .effective
        .tasks
        .as_ref()
        .zip(policy.tasks.as_ref())
        .filter(|(rules, _)| ctx.facts.declares_tasks && rules.allows_tool(&tool));
    let Some((rules, numbers)) = task_terms else {
        // The server must not create a task it was not offered; a task result is refused.
        let body = if ctx.facts.declares_tasks {
            let mut message = ctx.request.message.clone();
            strip_tasks_extension(&mut message);
            Bytes::from(serde_json::to_vec(&message).unwrap_or_default())
        } else {
            ctx.body.clone()
        };
        delegate::attach(&app, &ctx, &mut headers, None, Some(&tool));
        return send_and_relay(app, Arc::new(ctx), headers, body, RefuseTasks).await;
    };
    let rules = rules.clone();
    let numbers = numbers.clone();
    if app.audit_blocks(&ctx.policy) {
        // What cannot be audited is not done (audit.onFailure: failClosed).
        app.metrics.denial("audit_unavailable");
        return Error::AuditUnavailable.respond(&app.metrics, &ctx.id());
    }

    let pending = match reserve(&app, &ctx, &tool, &rules, &numbers, object).await {
        Ok(Reserved::Pending(pending)) => pending,
        Ok(Reserved::Answered(response)) => return response,
        Err(e) => return e.respond(&app.metrics, &ctx.id()),
    };
    // The server learns whom it works for from an assertion bound to this very task.
    let binding = TaskBinding {
        id: &pending.id,
        tool: &tool,
        deadline_at: pending.deadline_at,
    };
    delegate::attach(&app, &ctx, &mut headers, Some(binding), None);
    let creation = TaskCreation {
        pending,
        rules,
        min_poll_ms: numbers.min_poll_ms,
    };
    let body = Bytes::from(serde_json::to_vec(&ctx.request.message).unwrap_or_default());
    let ctx = Arc::new(ctx);
    // Run to completion even if the client disconnects, so a task the server created is
    // either recorded (and subject to deadlines) or released — never silently lost.
    let app2 = app.clone();
    let work = async move { send_and_relay(app2, ctx, headers, body, creation).await };
    // In the request's span (when traces are exported), so the hop upstream is its child.
    let work = if crate::telemetry::otel::exporting() {
        tokio::spawn(opentelemetry::trace::FutureExt::with_context(
            work,
            opentelemetry::Context::current(),
        ))
    } else {
        tokio::spawn(work)
    };
    work.await
        .unwrap_or_else(|_| respond::status(StatusCode::INTERNAL_SERVER_ERROR))
}

/// For a tool whose arguments name an object (`tasks.objects`): the object, once the authorizer
/// allowed the caller to `create` with it. `Ok(None)` for tools that name none; `Err` is the
/// answer to a call refused here (no object in the arguments, refused, or no decision).
async fn authorize_object(
    app: &AppState,
    ctx: &RequestContext,
    tool: &str,
) -> Result<Option<String>, Response> {
    let Some(rules) = ctx.policy.effective.object_rules() else {
        return Ok(None);
    };
    let Some(pointer) = rules.for_tool(tool) else {
        return Ok(None);
    };
    let object = match object_of(&ctx.tool_arguments(), &pointer.pointer) {
        Ok(object) => object,
        Err(e) => {
            app.metrics.denial("object_missing");
            app.audit.log(
                ctx.audit("task.denied", Decision::Deny, "object_missing")
                    .tool(tool)
                    .detail("pointer", pointer.pointer.clone()),
            );
            return Err(respond::refuse(
                StatusCode::BAD_REQUEST,
                &ctx.id(),
                ErrorObject::new(codes::INVALID_PARAMS, e.to_string()),
                &Refusal::final_("object_missing").policy(&ctx.policy.name),
            ));
        }
    };
    let question = objects::question(
        &ctx.identity,
        tool,
        &pointer.resource_type,
        &object,
        Action::Create,
    );
    let verdict = app
        .objects
        .decide(&rules.authorizer, &ctx.policy.name, question, &app.metrics)
        .await;
    if verdict.allowed() {
        return Ok(Some(object));
    }
    let reason = verdict.reason();
    app.metrics.denial(reason);
    app.audit.log(
        ctx.audit("task.denied", Decision::Deny, reason)
            .tool(tool)
            .detail(
                "object",
                app.hasher.object_digest(&pointer.resource_type, &object),
            ),
    );
    // Refused at creation the caller learns nothing it did not send: the object is its own
    // argument, so the policy is named (unlike the uniform refusal about an existing task).
    Err(match verdict {
        Verdict::Unavailable(_) => respond::authorizer_unavailable(&ctx.id(), &ctx.policy.name),
        _ => respond::refuse(
            StatusCode::FORBIDDEN,
            &ctx.id(),
            ErrorObject::new(
                codes::OBJECT_FORBIDDEN,
                "Access to the object this call names is denied",
            ),
            &Refusal::final_(reason).policy(&ctx.policy.name),
        ),
    })
}

fn strip_tasks_extension(message: &mut Value) {
    if let Some(extensions) = message
        .pointer_mut("/params/_meta/io.modelcontextprotocol~1clientCapabilities/extensions")
        .and_then(Value::as_object_mut)
    {
        extensions.remove(TASKS_EXTENSION);
    }
}

/// What reserving a slot led to.
enum Reserved {
    /// A slot is held: forward the request.
    Pending(PendingTask),
    /// The request is answered without the server: over quota, a duplicate of a task that
    /// exists, an identical request still in flight, or a bad idempotency key.
    Answered(Response),
}

/// Reserves a slot for the task this call may create.
async fn reserve(
    app: &AppState,
    ctx: &RequestContext,
    tool: &str,
    rules: &TaskRules,
    numbers: &TaskNumbers,
    object: Option<String>,
) -> Result<Reserved, Error> {
    let id = ctx.id();
    let derive = rules.derive_idempotency_key;
    let material = match idempotency::key_material(&ctx.headers, derive, &ctx.tool_arguments()) {
        Ok(m) => m,
        Err(e) => {
            return Ok(Reserved::Answered(respond::refuse(
                StatusCode::BAD_REQUEST,
                &id,
                ErrorObject::new(codes::INVALID_PARAMS, e.to_string()),
                &Refusal::final_("invalid_idempotency_key").policy(&ctx.policy.name),
            )));
        }
    };
    let task_id = TaskId::generate()?;
    let now = now_ms();
    // The latest deadline the task can get: its tool's, never past the longest retention (the
    // confirmation may shorten it further when the server states a shorter TTL).
    let longest = rules.deadline_for(tool).min(rules.max_ttl.get());
    let deadline_at = now.saturating_add(longest.as_millis() as i64);
    let reservation = Reservation {
        id: task_id.clone(),
        owner: ctx.identity.owner.clone(),
        tool: tool.to_owned(),
        scopes: ctx.identity.scopes.iter().cloned().collect(),
        idempotency: material.map(|m| IdempotencyClaim {
            key_hash: idempotency::claim_hash(
                &app.idempotency_secret,
                &ctx.identity.owner,
                ctx.identity.binding.as_ref(),
                tool,
                &m,
            ),
            window_ms: numbers.idempotency_window_ms,
        }),
        limits: numbers.quota,
        now,
        reservation_expires_at: now + (app.upstream_timeout + RESERVATION_GRACE).as_millis() as i64,
        token_issued_at: ctx.identity.issued_at,
        correlation_id: ctx.correlation_id.clone(),
        object,
        delegated_until: delegate::delegates(ctx)
            .then(|| delegate::delegated_until(ctx, deadline_at)),
        lease_until: rules
            .identity_lease
            .as_ref()
            .map(|lease| now.saturating_add(lease.get().as_millis() as i64)),
        // The request's span: every later span about the task links to it.
        trace: crate::telemetry::task_spans::current_traceparent(),
        binding: ctx.identity.binding.clone(),
    };
    Ok(match reserve_slot(app, ctx, reservation).await? {
        ReserveOutcome::Reserved => Reserved::Pending(PendingTask {
            id: task_id,
            tool: tool.to_owned(),
            started_ms: now,
            deadline_at,
            ledger: app.ledger.clone(),
            armed: true,
        }),
        ReserveOutcome::OverQuota(scope) => {
            app.metrics.denial("quota");
            app.audit.log(
                ctx.audit("task.denied", Decision::Deny, "quota")
                    .tool(tool)
                    .detail("scope", scope.as_str()),
            );
            // The slot frees when one of the caller's tasks ends, which no clock predicts:
            // `retryAfterMs` is a suggestion (one poll interval, at least a second).
            let refusal = Refusal::new(
                "quota",
                Remediation::Retry {
                    after_ms: numbers.quota_retry_after_ms,
                },
            )
            .policy(&ctx.policy.name);
            Reserved::Answered(respond::refuse(
                StatusCode::TOO_MANY_REQUESTS,
                &id,
                ErrorObject::new(
                    codes::QUOTA_EXCEEDED,
                    format!("Concurrent task quota per {} exhausted", scope.as_str()),
                )
                .with_data(json!({"scope": scope.as_str()})),
                &refusal,
            ))
        }
        ReserveOutcome::Existing(record) => {
            app.audit.log(
                ctx.audit("task.deduplicated", Decision::Allow, "idempotency_key")
                    .tool(tool)
                    .for_task(&app.hasher, &record.id, &record.correlation_id),
            );
            let view = task_view(&record, numbers.min_poll_ms);
            Reserved::Answered(respond::rpc_result(&id, view.create_result()))
        }
        ReserveOutcome::InFlight(_) => Reserved::Answered(respond::refuse(
            StatusCode::CONFLICT,
            &id,
            ErrorObject::new(
                codes::INTERNAL_ERROR,
                "An identical request is still being processed; retry",
            ),
            &Refusal::new(
                "duplicate_in_flight",
                Remediation::Retry {
                    after_ms: numbers.quota_retry_after_ms,
                },
            )
            .policy(&ctx.policy.name),
        )),
    })
}

/// Reserves a slot, resolving the two outcomes that can change by waiting or asking:
/// an identical request in flight (wait for it to become a task or be released) and an
/// exhausted quota (ask the server whether the caller's unpolled tasks finished).
async fn reserve_slot(
    app: &AppState,
    ctx: &RequestContext,
    reservation: Reservation,
) -> Result<ReserveOutcome, Error> {
    let deadline = Instant::now() + app.upstream_timeout;
    let mut reconciled = false;
    loop {
        let started = Instant::now();
        let outcome = app.ledger.reserve(reservation.clone()).await?;
        app.metrics
            .ledger_write_seconds
            .observe(started.elapsed().as_secs_f64());
        match outcome {
            ReserveOutcome::InFlight(other) => {
                // Wait (bounded) for the identical request to become a task or be released;
                // the ledger wakes us, nothing polls it.
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    return Ok(ReserveOutcome::InFlight(other));
                };
                match tokio::time::timeout(left, app.ledger.wait_settled(&other)).await {
                    Err(_) => return Ok(ReserveOutcome::InFlight(other)),
                    Ok(settled) => settled?,
                }
                if let Some(record) = app.ledger.get(&other).await? {
                    return Ok(ReserveOutcome::Existing(Box::new(record)));
                }
                // Released: reserve again (this request may now take the slot).
            }
            ReserveOutcome::OverQuota(_)
                if !reconciled && app.reconciles.begin(&ctx.identity.owner) =>
            {
                reconciled = true;
                let freed =
                    reconcile_principal(app, &ctx.policy, &ctx.correlation_id, &ctx.identity.owner)
                        .await;
                if freed == 0 {
                    return Ok(outcome);
                }
                // Some of the caller's tasks had finished at the server without anyone
                // polling them; their slots are free now.
            }
            other => return Ok(other),
        }
    }
}

/// A reserved task slot waiting for the server's answer. Dropping it without confirming
/// releases the slot (the server answered without a task, failed, or the client went away).
struct PendingTask {
    id: TaskId,
    tool: String,
    started_ms: i64,
    /// The deadline the task will be given (Unix ms).
    deadline_at: i64,
    ledger: Arc<dyn TaskLedger>,
    armed: bool,
}

impl Drop for PendingTask {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ledger = self.ledger.clone();
        let id = self.id.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = ledger.release(&id).await {
                    tracing::warn!(error = %e, "releasing a task reservation failed; it expires on its own");
                }
            });
        }
    }
}

/// The final step of a `tools/call` allowed to become a task: a task answer is confirmed in
/// the ledger and rewritten; any other answer releases the reservation (when this drops).
struct TaskCreation {
    pending: PendingTask,
    rules: TaskRules,
    min_poll_ms: i64,
}

#[async_trait]
impl FinalStep for TaskCreation {
    async fn on_task(
        &mut self,
        app: &AppState,
        ctx: &RequestContext,
        message: Value,
    ) -> Result<Value, Error> {
        self.confirm(app, ctx, message).await
    }
}

impl TaskCreation {
    /// Confirms the task the server created durably, then rewrites the answer to name the
    /// sidecar's task ID and terms.
    async fn confirm(
        &mut self,
        app: &AppState,
        ctx: &RequestContext,
        mut message: Value,
    ) -> Result<Value, Error> {
        let pending = &mut self.pending;
        let Some(created) = message.get("result").and_then(parse_created_task) else {
            app.metrics.anomaly("malformed_task_result");
            return Err(Error::MalformedTask);
        };
        let terms = confirmation_terms(
            &created,
            &self.rules,
            self.min_poll_ms,
            &pending.tool,
            pending.started_ms,
            now_ms(),
        );
        let started = Instant::now();
        // With per-replica server state on a shared ledger, this replica's server numbers its
        // tasks on its own: its upstream IDs live in this replica's space.
        let confirmed = if app.replica.separate_server_state(&ctx.policy) {
            app.ledger
                .confirm_in_replica(&pending.id, terms.confirmation)
                .await
        } else {
            app.ledger.confirm(&pending.id, terms.confirmation).await
        };
        app.metrics
            .ledger_write_seconds
            .observe(started.elapsed().as_secs_f64());
        let record = match confirmed {
            Ok(Confirmed::New(record)) => record,
            Ok(Confirmed::SameOwner(record)) => {
                // The server handed this owner a task it already has (it deduplicates): the
                // existing task, as it stands, is the answer.
                pending.armed = false;
                app.audit.log(
                    ctx.audit("task.deduplicated", Decision::Allow, "upstream_task_id")
                        .tool(&pending.tool)
                        .for_task(&app.hasher, &record.id, &record.correlation_id),
                );
                return Ok(result_message(
                    &ctx.id(),
                    task_view(&record, self.min_poll_ms).create_result(),
                ));
            }
            Ok(Confirmed::HeldByAnotherOwner) => {
                // Another owner's upstream task: never recorded, presented or cancelled.
                app.metrics.anomaly("upstream_task_of_another_owner");
                app.audit.log(
                    ctx.audit(
                        "task.anomaly",
                        Decision::Deny,
                        "upstream_task_of_another_owner",
                    )
                    .tool(&pending.tool),
                );
                return Err(Error::UpstreamTaskTaken);
            }
            Err(e) => {
                tracing::error!(error = %e, "could not record a task; cancelling it upstream");
                cancel_orphan(
                    &app.upstream,
                    &ctx.identity,
                    &created.upstream_id,
                    &ctx.correlation_id,
                    "ledger_failure",
                );
                return Err(Error::NotRecorded(e));
            }
        };
        pending.armed = false;
        app.metrics.tasks_created.inc();
        cancel_if_revoked(app, &ctx.correlation_id, &record).await;
        let mut created_event = ctx
            .audit("task.created", Decision::Allow, "created")
            .tool(&pending.tool)
            .for_task(&app.hasher, &record.id, &record.correlation_id)
            // The protocol has no queued state: a task is `working` (or `input_required`) from
            // the answer that creates it, so creation is its start (no `task.started`).
            .detail("status", record.status.as_str())
            .detail("ttlMs", record.ttl_ms)
            .detail("deadlineAt", iso_millis(record.deadline_at))
            .detail("arguments", summarize(&ctx.tool_arguments()));
        if let Some(digest) = object_digest(app, ctx, &record) {
            created_event = created_event.detail("object", digest);
        }
        app.audit.log(created_event);
        if let Some(until) = record.delegated_until {
            let scopes: Vec<&str> = self
                .rules
                .scopes_for(&record.tool)
                .filter(|s| ctx.identity.has_scope(s))
                .collect();
            app.audit.log(
                ctx.audit("task.delegated", Decision::Allow, "delegation")
                    .tool(&record.tool)
                    .for_task(&app.hasher, &record.id, &record.correlation_id)
                    .detail("actor", delegate::sidecar_name(ctx))
                    .detail("delegatedUntil", iso_millis(until))
                    .detail("scopes", json!(scopes)),
            );
        }
        if let Some(result) = message.get_mut("result") {
            present_task(
                result,
                &created.upstream_id,
                record.id.as_str(),
                record.ttl_ms,
                Some(self.min_poll_ms),
            );
            // A task born input_required carries input requests: they pass the gate too.
            let screening =
                screen_task_state(app, &ctx.policy, &record, &Recipient::of(ctx), result).await;
            if let Screening::TaskFailed(failed) = screening {
                *result = task_view(&failed, self.min_poll_ms).create_result();
            }
        }
        Ok(message)
    }
}
