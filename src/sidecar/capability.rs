//! The capability gate: every server-to-client input request for a deprecated capability
//! (`sampling/createMessage`, `roots/list`) passes only under an Active, verified exception that
//! covers it and still has budget; anything else never reaches the client.
//!
//! Decisions are made once per (task, input key): a task repeats its outstanding input requests
//! on every poll and notification, and those repeats neither spend budget again nor change the
//! answer. Budgets that change with use (iterations per task, requests per minute per
//! exception) are spent in the ledger, atomically: concurrent tasks, restarts and the replicas
//! sharing a ledger can never overspend them, and a decision spent once is never charged again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::api::{CapabilityMode, ExceptionCapability};
use crate::audit::{AuditEvent, Decision, summarize};
use crate::exception::gate::{
    CapabilityRequest, Rejection, capability_of, covers, declares, verification_rejection,
};
use crate::exception::isolation::{SecretScanner, check_isolation};
use crate::exception::{ApproverTrust, grant_key, verify};
use crate::ledger::{BudgetOutcome, BudgetSpend, TaskLedger};
use crate::model::Owner;
use crate::policy::{EffectivePolicy, ObjectKey};
use crate::telemetry::metrics::{CapabilityLabels, SidecarMetrics};

/// What the gate decided about one input request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed {
        exception: ObjectKey,
        approval_id: String,
        /// The exception's approved model route (sampling), recorded with every use.
        model_route: Option<String>,
        /// When the exception expires (RFC 3339).
        expires_at: String,
        /// The exception's `purpose`, shown to the client with the request.
        purpose: String,
        /// What is left after this use; `None` when the decision had been spent before
        /// (another replica made it).
        budget_left: Option<BudgetLeft>,
    },
    Rejected(Rejection),
}

/// The budgets of a grant left after one use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetLeft {
    pub iterations: u32,
    pub per_minute: u32,
    /// Cost units left, when the grant has a cost budget (`maxCostUnits`).
    pub cost_units: Option<u64>,
}

/// The cost units of one input request: a sampling request costs the `maxTokens` it asks for
/// (the most the client's model may produce for it; reserved when it is allowed, whether or
/// not it is answered, since the sidecar cannot see what the model spent). Roots cost nothing.
pub fn cost_units(capability: ExceptionCapability, params: &Value) -> u64 {
    match capability {
        ExceptionCapability::Sampling => {
            params.get("maxTokens").and_then(Value::as_u64).unwrap_or(0)
        }
        _ => 0,
    }
}

/// Input requests of one message after screening.
#[derive(Debug, Default)]
pub struct Screened {
    /// Keys refused for the first time, with their method: the server should receive a decline
    /// for each.
    pub newly_rejected: Vec<(String, String, Rejection)>,
    /// Every key refused in this message (newly or by an earlier decision), with its method.
    pub refused: Vec<(String, String, Rejection)>,
    /// Audit events to write (decisions made now).
    pub events: Vec<AuditEvent>,
    /// Decisions made now, as metric labels.
    pub decisions: Vec<CapabilityLabels>,
}

impl Screened {
    /// Counts the decisions made now in `metrics`.
    pub fn count(&self, metrics: &SidecarMetrics) {
        for labels in &self.decisions {
            metrics.capability_decisions.get_or_create(labels).inc();
        }
    }
}

#[derive(Default)]
struct GateState {
    /// Decisions per scope (task), then input key.
    decided: HashMap<String, HashMap<String, Decided>>,
    /// Decisions held in `decided`.
    count: usize,
}

struct Decided {
    verdict: Verdict,
    /// A client's answer to this (allowed) request was forwarded to the server.
    answered: bool,
}

impl GateState {
    fn get(&self, scope: &str, key: &str) -> Option<&Decided> {
        self.decided.get(scope)?.get(key)
    }
}

/// An allowed input request whose task ended before any answer reached the server.
#[derive(Clone, Debug)]
pub struct Lapsed {
    pub key: String,
    pub allowance: Verdict,
}

/// The gate's memory of decisions. Budgets that change with use are kept in the ledger
/// ([`TaskLedger::spend_budget`]), so they hold across restarts and, on a shared ledger,
/// across every replica of the server.
#[derive(Default)]
pub struct CapabilityGate {
    state: Mutex<GateState>,
}

/// Most decisions remembered before the memory starts over (bounded memory; a forgotten
/// decision is made again, but the ledger knows it was spent and charges nothing).
const MAX_DECISIONS: usize = 100_000;

/// How long the iterations of multi round-trip exchanges (outside tasks) of one principal and
/// tool count against an exception's `maxIterationsPerTask`: each retry is a new request, so
/// without a window a client could spend the budget anew on every retry.
pub const EXCHANGE_ITERATION_WINDOW: Duration = Duration::from_secs(600);

/// What an exception's `maxIterationsPerTask` is counted over.
pub enum Budget {
    /// One task (its ID): counted for the task's life.
    Task(String),
    /// Multi round-trip exchanges outside tasks: per principal (issuer, subject, tenant,
    /// client) and tool, within [`EXCHANGE_ITERATION_WINDOW`].
    Exchange { tool: String },
}

/// The context of the request that carries input requests.
pub struct Carrier<'a> {
    /// The task the input requests belong to, or a per-request scope for results outside
    /// tasks: decisions are remembered per (scope, input key).
    pub scope: &'a str,
    pub budget: Budget,
    pub owner: &'a Owner,
    /// Client capabilities declared on *this* request.
    pub declared: &'a Value,
    pub protocol_version: &'a str,
    pub correlation_id: &'a str,
    pub policy: crate::audit::PolicyStamp<'a>,
    /// The policy's secret scanner, and the caller's own bearer token (never allowed into a
    /// sampling request).
    pub scanner: &'a SecretScanner,
    pub bearer: Option<&'a str>,
    /// The audit trail can be written, or the policy does not require it
    /// (`audit.onFailure`). When it cannot, nothing is allowed: undecided and allowed
    /// requests are withheld (not decided, so they come back once the trail recovers).
    pub audit_ok: bool,
}

/// What the first pass over a message found for one gated key.
enum Pending {
    /// Decided before (and still valid): apply it.
    Known(Verdict),
    /// To decide now (with the reason an earlier allowance lapsed, if it did).
    Decide {
        capability: ExceptionCapability,
        params: Value,
        lapsed: Option<Rejection>,
    },
}

impl CapabilityGate {
    /// Screens `requests` (an `inputRequests` map) in place: refused entries are removed.
    /// Budgets are spent in `ledger`; when it cannot be asked, undecided requests are withheld
    /// (not decided: they come back on the next poll).
    pub async fn screen(
        &self,
        ledger: &dyn TaskLedger,
        policy: &EffectivePolicy,
        trust: Option<&ApproverTrust>,
        carrier: &Carrier<'_>,
        requests: &mut Map<String, Value>,
    ) -> Screened {
        let mut screened = Screened::default();
        let Some(pending) = self.first_pass(policy, trust, carrier, requests) else {
            // A poisoned lock means a panic mid-decision: refuse everything gated.
            requests.retain(|_, r| gated(r).is_none());
            return screened;
        };
        for (key, pending) in pending {
            let verdict = match pending {
                Pending::Known(verdict) => verdict,
                Pending::Decide {
                    capability,
                    params,
                    lapsed,
                } => {
                    let verdict = match lapsed {
                        Some(reason) => Verdict::Rejected(reason),
                        None => {
                            match decide(ledger, policy, trust, carrier, capability, &params, &key)
                                .await
                            {
                                Ok(verdict) => verdict,
                                Err(e) => {
                                    tracing::error!(error = %e, "spending a capability budget failed");
                                    requests.remove(&key);
                                    continue;
                                }
                            }
                        }
                    };
                    let Some(verdict) = self.record(carrier, &key, verdict.clone()) else {
                        requests.remove(&key);
                        continue;
                    };
                    screened
                        .events
                        .extend(audit_events(carrier, capability, &params, &verdict));
                    screened.decisions.push(CapabilityLabels {
                        capability: crate::exception::gate::capability_key(capability),
                        decision: match verdict {
                            Verdict::Allowed { .. } => "allow",
                            Verdict::Rejected(_) => "deny",
                        },
                        reason: match &verdict {
                            Verdict::Allowed { .. } => "exception",
                            Verdict::Rejected(r) => r.as_str(),
                        },
                        exception: match &verdict {
                            Verdict::Allowed { exception, .. } => exception.name.clone(),
                            Verdict::Rejected(_) => String::new(),
                        },
                    });
                    if let Verdict::Rejected(reason) = verdict {
                        let method = requests.get(&key).map(method_of).unwrap_or_default();
                        screened.newly_rejected.push((key.clone(), method, reason));
                    }
                    verdict
                }
            };
            let method = requests.get(&key).map(method_of).unwrap_or_default();
            let declared = requests
                .get(&key)
                .and_then(gated)
                .is_some_and(|c| declares(carrier.declared, c));
            match verdict {
                Verdict::Rejected(reason) => {
                    screened.refused.push((key.clone(), method, reason));
                    requests.remove(&key);
                }
                // Allowed once, but the capability must be declared on every request that
                // carries it: a request without the declaration does not see it (nothing is
                // declined: the next poll that declares it will).
                Verdict::Allowed { .. } if !declared => {
                    requests.remove(&key);
                }
                allowed @ Verdict::Allowed { .. } => {
                    if let Some(request) = requests.get_mut(&key) {
                        show_allowance(request, &allowed, carrier.policy.name);
                    }
                }
            }
        }
        screened
    }

    /// Sorts the gated keys of `requests` into known verdicts and decisions to make, removing
    /// the ones this request cannot be shown at all. `None` if the memory is poisoned.
    fn first_pass(
        &self,
        policy: &EffectivePolicy,
        trust: Option<&ApproverTrust>,
        carrier: &Carrier<'_>,
        requests: &mut Map<String, Value>,
    ) -> Option<Vec<(String, Pending)>> {
        let mut state = self.state.lock().ok()?;
        if state.count > MAX_DECISIONS {
            state.decided.clear();
            state.count = 0;
        }
        let mut pending = Vec::new();
        let keys: Vec<String> = requests.keys().cloned().collect();
        for key in keys {
            let Some(request) = requests.get(&key) else {
                continue;
            };
            let Some(capability) = gated(request) else {
                continue;
            };
            let previous = state.get(carrier.scope, &key).map(|d| d.verdict.clone());
            if !carrier.audit_ok && !matches!(previous, Some(Verdict::Rejected(_))) {
                requests.remove(&key);
                continue;
            }
            // A request that does not declare the capability is not shown it, and does not
            // decide it either when an exception could allow it: a poll from a client that
            // cannot answer must not end the task for the one that can. (Under `deny` the
            // outcome does not depend on the client: it is decided at once.)
            if previous.is_none()
                && !declares(carrier.declared, capability)
                && policy.capabilities.mode(capability) != CapabilityMode::Deny
            {
                requests.remove(&key);
                continue;
            }
            // An allowance is re-verified at every use: an exception withdrawn, expired, or
            // signed by a key revoked since the decision no longer covers the request.
            let lapsed = match &previous {
                Some(Verdict::Allowed { exception, .. }) => revalidate(policy, trust, exception),
                _ => None,
            };
            let entry = match (previous, lapsed) {
                (Some(verdict), None) => Pending::Known(verdict),
                (_, lapsed) => Pending::Decide {
                    capability,
                    params: request.get("params").cloned().unwrap_or(Value::Null),
                    lapsed,
                },
            };
            pending.push((key, entry));
        }
        Some(pending)
    }

    /// Remembers a decision made now. (Two screenings deciding one key at once reach the same
    /// verdict: the ledger charges the decision once and answers the other with `Repeated`.)
    /// `None` if the memory is poisoned.
    fn record(&self, carrier: &Carrier<'_>, key: &str, verdict: Verdict) -> Option<Verdict> {
        let mut state = self.state.lock().ok()?;
        let decided = Decided {
            verdict: verdict.clone(),
            answered: false,
        };
        let added = state
            .decided
            .entry(carrier.scope.to_owned())
            .or_default()
            .insert(key.to_owned(), decided)
            .is_none();
        if added {
            state.count += 1;
        }
        Some(verdict)
    }

    /// Notes that a client's answer to `key` of `scope` was forwarded to the server.
    pub fn note_answered(&self, scope: &str, key: &str) {
        if let Ok(mut state) = self.state.lock()
            && let Some(decided) = state.decided.get_mut(scope).and_then(|s| s.get_mut(key))
        {
            decided.answered = true;
        }
    }

    /// Forgets the decisions of `scope` (its task ended) and returns the allowed requests no
    /// answer was ever forwarded for: they lapsed, and are audited as such.
    pub fn end_scope(&self, scope: &str) -> Vec<Lapsed> {
        let Ok(mut state) = self.state.lock() else {
            return Vec::new();
        };
        let Some(decided) = state.decided.remove(scope) else {
            return Vec::new();
        };
        state.count = state.count.saturating_sub(decided.len());
        let mut lapsed: Vec<Lapsed> = decided
            .into_iter()
            .filter(|(_, d)| !d.answered && matches!(d.verdict, Verdict::Allowed { .. }))
            .map(|(key, d)| Lapsed {
                key,
                allowance: d.verdict,
            })
            .collect();
        lapsed.sort_by(|a, b| a.key.cmp(&b.key));
        lapsed
    }

    /// Whether the gate allowed `key` of `scope`: only then may a client's answer to that
    /// input request reach the server. Undecided and refused keys are not allowed.
    pub fn allowed(&self, scope: &str, key: &str) -> bool {
        self.allowance(scope, key).is_some()
    }

    /// The allowance of `key` of `scope`, if the gate allowed it.
    pub fn allowance(&self, scope: &str, key: &str) -> Option<Verdict> {
        let state = self.state.lock().ok()?;
        state
            .get(scope, key)
            .map(|d| &d.verdict)
            .filter(|v| matches!(v, Verdict::Allowed { .. }))
            .cloned()
    }
}

/// The `_meta` key under which an allowed input request tells the client who asks and why.
pub const ALLOWANCE_META: &str = "lifeguard.dev/exception";

/// Puts the allowance into the input request's `params._meta` (under [`ALLOWANCE_META`]), so
/// a client can show who is asking for its model and why: the requesting server (its policy,
/// `namespace/name`), the exception's purpose, name, approval, expiry and model route.
fn show_allowance(request: &mut Value, allowed: &Verdict, server: &str) {
    let Verdict::Allowed {
        exception,
        approval_id,
        model_route,
        expires_at,
        purpose,
        ..
    } = allowed
    else {
        return;
    };
    let Some(request) = request.as_object_mut() else {
        return;
    };
    let params = request.entry("params").or_insert_with(|| json!({}));
    let Some(params) = params.as_object_mut() else {
        return;
    };
    let meta = params.entry("_meta").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(
            ALLOWANCE_META.to_owned(),
            json!({
                "server": server,
                "purpose": purpose,
                "exception": exception.to_string(),
                "approvalId": approval_id,
                "expiresAt": expires_at,
                "modelRoute": model_route,
            }),
        );
    }
}

fn method_of(request: &Value) -> String {
    request
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Whether an input request is one the gate governs (sampling, roots).
pub fn is_gated(request: &Value) -> bool {
    gated(request).is_some()
}

/// The capability an input request needs, when it is one the gate governs.
fn gated(request: &Value) -> Option<ExceptionCapability> {
    request
        .get("method")
        .and_then(Value::as_str)
        .and_then(capability_of)
}

/// Why the exception named `key` no longer covers anything (`None`: still Active in the policy
/// in force).
fn revalidate(
    policy: &EffectivePolicy,
    trust: Option<&ApproverTrust>,
    key: &ObjectKey,
) -> Option<Rejection> {
    let Some(exception) = policy.exceptions.iter().find(|e| &e.exception == key) else {
        return Some(Rejection::NoException);
    };
    let empty = ApproverTrust::default();
    let verification = verify(
        &exception.spec,
        &exception.exception.namespace,
        trust.unwrap_or(&empty),
        jiff::Timestamp::now(),
    );
    verification_rejection(&verification)
}

async fn decide(
    ledger: &dyn TaskLedger,
    policy: &EffectivePolicy,
    trust: Option<&ApproverTrust>,
    carrier: &Carrier<'_>,
    capability: ExceptionCapability,
    params: &Value,
    key: &str,
) -> crate::ledger::Result<Verdict> {
    if policy.capabilities.mode(capability) == CapabilityMode::Deny {
        return Ok(Verdict::Rejected(Rejection::NoException));
    }
    let now = jiff::Timestamp::now();
    let empty_trust = ApproverTrust::default();
    let trust = trust.unwrap_or(&empty_trust);
    let request = CapabilityRequest {
        capability,
        params,
        owner: carrier.owner,
        declared: carrier.declared,
        protocol_version: carrier.protocol_version,
    };
    let (budget_scope, task, window) = match &carrier.budget {
        Budget::Task(task) => (
            format!("task\n{task}"),
            Some(crate::model::TaskId::from_string(task.clone())),
            None,
        ),
        Budget::Exchange { tool } => {
            let o = carrier.owner;
            (
                format!(
                    "exchange\n{}\n{}\n{}\n{}\n{tool}",
                    o.issuer, o.subject, o.tenant, o.client
                ),
                None,
                Some(EXCHANGE_ITERATION_WINDOW.as_millis() as i64),
            )
        }
    };
    let mut best = Rejection::NoException;
    // Scanned once, and only when an exception would otherwise cover the request.
    let mut carries_secret = None;
    for exception in policy
        .exceptions
        .iter()
        .filter(|e| e.spec.capability == capability)
    {
        // Verified at every use: expiry and withdrawn keys or approvals take effect at once.
        let verification = || verify(&exception.spec, &exception.exception.namespace, trust, now);
        if let Err(reason) = covers(exception, verification, &request) {
            best = best.most_specific(reason);
            continue;
        }
        if capability == ExceptionCapability::Sampling {
            if let Err(reason) = check_isolation(&exception.spec, params) {
                best = best.most_specific(reason);
                continue;
            }
            let literals: Vec<&str> = carrier.bearer.into_iter().collect();
            if *carries_secret.get_or_insert_with(|| carrier.scanner.finds(params, &literals)) {
                best = best.most_specific(Rejection::SecretInContext);
                continue;
            }
        }
        let limits = &exception.spec.limits;
        let spend = BudgetSpend {
            exception: exception.exception.to_string(),
            // Budgets belong to the signed grant: copies of one approval share them.
            grant: grant_key(&exception.spec, &exception.exception.namespace),
            cost: cost_units(capability, params),
            max_cost: limits
                .max_cost_units
                .filter(|_| capability == ExceptionCapability::Sampling),
            cost_until: exception.expires_at.as_millisecond(),
            scope: budget_scope.clone(),
            decision: format!("{}\n{key}", carrier.scope),
            task: task.clone(),
            max_iterations: limits.max_iterations_per_task,
            iteration_window_ms: window,
            max_per_minute: limits.max_requests_per_minute,
            now: now.as_millisecond(),
        };
        let budget_left = match ledger.spend_budget(&spend).await? {
            BudgetOutcome::Spent {
                iterations_left,
                per_minute_left,
                cost_left,
            } => Some(BudgetLeft {
                iterations: iterations_left,
                per_minute: per_minute_left,
                cost_units: cost_left,
            }),
            // Spent before, for this very decision (by another replica, or before a restart).
            BudgetOutcome::Repeated => None,
            BudgetOutcome::IterationBudget => {
                best = best.most_specific(Rejection::IterationBudget);
                continue;
            }
            BudgetOutcome::Rate => {
                best = best.most_specific(Rejection::Rate);
                continue;
            }
            BudgetOutcome::CostBudget => {
                best = best.most_specific(Rejection::CostBudget);
                continue;
            }
        };
        return Ok(Verdict::Allowed {
            exception: exception.exception.clone(),
            approval_id: exception.spec.approval_id.clone(),
            model_route: exception.spec.model_route.clone(),
            expires_at: exception.spec.expires_at.0.to_string(),
            purpose: exception.spec.purpose.clone(),
            budget_left,
        });
    }
    Ok(Verdict::Rejected(best))
}

fn audit_events(
    carrier: &Carrier<'_>,
    capability: ExceptionCapability,
    params: &Value,
    verdict: &Verdict,
) -> Vec<AuditEvent> {
    let name = crate::exception::gate::capability_key(capability);
    let base = |event: &'static str, decision: Decision, reason: &'static str| {
        AuditEvent::new(
            event,
            carrier.correlation_id,
            carrier.policy,
            decision,
            reason,
        )
        .owner(carrier.owner)
        .detail("capability", name)
    };
    let requested = base("capability.requested", Decision::Record, "input_request")
        .detail("request", summarize(params));
    let outcome = match verdict {
        Verdict::Allowed {
            exception,
            approval_id,
            model_route,
            expires_at,
            budget_left,
            ..
        } => base("capability.allowed", Decision::Allow, "exception")
            .detail("exception", exception.to_string())
            .detail("approvalId", approval_id.clone())
            .detail("modelRoute", json!(model_route))
            .detail("exceptionExpiresAt", expires_at.clone())
            .detail(
                "budgetLeft",
                match budget_left {
                    Some(left) => {
                        let mut value =
                            json!({"iterations": left.iterations, "perMinute": left.per_minute});
                        if let Some(cost) = left.cost_units {
                            value["costUnits"] = json!(cost);
                        }
                        value
                    }
                    None => Value::Null,
                },
            ),
        Verdict::Rejected(reason) => base("capability.rejected", Decision::Deny, reason.as_str()),
    };
    vec![requested, outcome]
}

/// `capability.answered`: a client's answer to an allowed input request is on its way to the
/// server. The answer itself never appears: its size and SHA-256 do, with the allowance it
/// answers (exception, approval, model route, expiry), so a reviewer can match what the model
/// said to what was approved.
pub fn answered_event(
    base: AuditEvent,
    allowance: &Verdict,
    capability_method: &str,
    answer: &Value,
) -> Option<AuditEvent> {
    let Verdict::Allowed {
        exception,
        approval_id,
        model_route,
        expires_at,
        ..
    } = allowance
    else {
        return None;
    };
    Some(
        base.detail("capability", capability_method)
            .detail("exception", exception.to_string())
            .detail("approvalId", approval_id.clone())
            .detail("modelRoute", json!(model_route))
            .detail("exceptionExpiresAt", expires_at.clone())
            .detail("answer", summarize(answer)),
    )
}

/// `capability.lapsed`: an allowed input request whose task ended (`end_reason`) before any
/// answer reached the server. Names the allowance it was given, like `capability.answered`.
pub fn lapsed_event(base: AuditEvent, lapsed: &Lapsed, end_reason: &str) -> Option<AuditEvent> {
    let Verdict::Allowed {
        exception,
        approval_id,
        model_route,
        expires_at,
        ..
    } = &lapsed.allowance
    else {
        return None;
    };
    Some(
        base.detail("inputKey", lapsed.key.clone())
            .detail("exception", exception.to_string())
            .detail("approvalId", approval_id.clone())
            .detail("modelRoute", json!(model_route))
            .detail("exceptionExpiresAt", expires_at.clone())
            .detail("endReason", end_reason.to_owned()),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn owner() -> Owner {
        Owner {
            issuer: "https://idp.example.com".into(),
            subject: "alice".into(),
            tenant: "t1".into(),
            client: "console".into(),
        }
    }

    #[tokio::test]
    async fn denied_capabilities_are_refused_once_and_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = crate::ledger::SqliteLedger::open(&dir.path().join("l.db")).unwrap();
        let policy = crate::policy::testing::with_tasks("    enabled: true\n");
        let gate = CapabilityGate::default();
        let owner = owner();
        let declared = json!({"sampling": {}});
        let carrier = Carrier {
            scope: "lgt_task",
            budget: Budget::Task("lgt_task".into()),
            audit_ok: true,
            owner: &owner,
            declared: &declared,
            protocol_version: crate::mcp::PROTOCOL_VERSION,
            correlation_id: "c1",
            policy: crate::audit::PolicyStamp {
                name: "team-a/reports",
                hash: "h",
            },
            scanner: &SecretScanner::default(),
            bearer: None,
        };
        let mut requests = json!({
            "s1": {"method": "sampling/createMessage", "params": {}},
            "e1": {"method": "elicitation/create", "params": {}},
        })
        .as_object()
        .cloned()
        .unwrap();
        let first = gate
            .screen(&ledger, &policy, None, &carrier, &mut requests)
            .await;
        assert_eq!(
            requests.keys().collect::<Vec<_>>(),
            ["e1"],
            "elicitation is not gated"
        );
        assert_eq!(first.newly_rejected.len(), 1);
        assert_eq!(first.newly_rejected[0].0, "s1");
        assert_eq!(first.events.len(), 2, "requested + rejected");
        assert!(!gate.allowed("lgt_task", "s1"), "refused");
        assert!(!gate.allowed("lgt_task", "e1"), "never decided: not gated");
        assert!(
            !gate.allowed("lgt_other", "s1"),
            "never decided for that task"
        );

        // The same key asked again (every poll repeats it) is refused without a new decision.
        let mut again = json!({"s1": {"method": "sampling/createMessage", "params": {}}})
            .as_object()
            .cloned()
            .unwrap();
        let second = gate
            .screen(&ledger, &policy, None, &carrier, &mut again)
            .await;
        assert!(again.is_empty());
        assert!(second.newly_rejected.is_empty());
        assert_eq!(second.refused.len(), 1);
        assert!(second.events.is_empty());
    }
}
