//! The status each object should have, as pure functions of the plan and what sidecars
//! acknowledged. Conditions follow the Kubernetes conventions: every condition carries the
//! `observedGeneration` it describes, and `lastTransitionTime` moves only when the condition's
//! status flips (an unchanged condition keeps its previous time, so a status write is a no-op
//! when nothing changed and the reconcilers can skip it).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::conditions::{self, reasons};
use crate::api::{
    CapabilityExceptionStatus, ExceptionState, McpServerPolicyStatus, PrincipalRevocationStatus,
};

use super::plan::{ExceptionPlan, PolicyPlan};

/// One condition as the reconciler wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Builds the conditions, keeping `lastTransitionTime` of those whose status did not flip.
pub fn merge_conditions(
    previous: &[Condition],
    wanted: &[Want],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    wanted
        .iter()
        .map(|w| {
            let status = if w.ok { "True" } else { "False" };
            let last_transition_time = previous
                .iter()
                .find(|c| c.type_ == w.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: w.type_.to_owned(),
                status: status.to_owned(),
                reason: w.reason.to_owned(),
                message: w.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// The kstatus conditions (`Reconciling`, `Stalled`; "abnormal-true") that go with a `Ready`
/// condition: `stalled` when nothing changes without a new spec, `reconciling` while the
/// operator is still getting there. Both `False` (with `Ready`'s reason) when it is done.
fn progress(stalled: bool, reconciling: bool, ready: &Want) -> (Want, Want) {
    let condition = |type_, on: bool| Want {
        type_,
        ok: on,
        reason: ready.reason,
        message: if on {
            ready.message.clone()
        } else {
            String::new()
        },
    };
    (
        condition(conditions::RECONCILING, reconciling && !stalled),
        condition(conditions::STALLED, stalled),
    )
}

/// Sidecar counts of one policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicySidecars {
    /// Pods the policy wins (those whose sidecars enforce it).
    pub assigned: i32,
    /// Of those, the ones whose latest connection acknowledged the current hash.
    pub in_sync: i32,
}

/// Desired McpServerPolicy status.
pub fn policy_status(
    plan: &PolicyPlan,
    sidecars: PolicySidecars,
    previous: &McpServerPolicyStatus,
    now: Timestamp,
) -> McpServerPolicyStatus {
    let compiled = plan.compiled.as_ref();
    let compiled_want = match compiled {
        Some(c) => Want {
            type_: conditions::COMPILED,
            ok: true,
            reason: reasons::PROGRAMMED,
            message: format!(
                "compiled with {} exception(s) and {} revocation(s) in force",
                c.effective.exceptions.len(),
                c.revocations.len()
            ),
        },
        None => Want {
            type_: conditions::COMPILED,
            ok: false,
            reason: reasons::COMPILE_ERROR,
            message: plan.errors.join("; "),
        },
    };
    let sync_want = if sidecars.assigned == 0 {
        Want {
            type_: conditions::SIDECARS_IN_SYNC,
            ok: true,
            reason: reasons::NO_MATCHING_PODS,
            message: "no pod with a sidecar is selected".into(),
        }
    } else if sidecars.in_sync == sidecars.assigned && compiled.is_some() {
        Want {
            type_: conditions::SIDECARS_IN_SYNC,
            ok: true,
            reason: reasons::ALL_IN_SYNC,
            message: format!(
                "{} of {} sidecars run this policy",
                sidecars.in_sync, sidecars.assigned
            ),
        }
    } else {
        Want {
            type_: conditions::SIDECARS_IN_SYNC,
            ok: false,
            reason: reasons::PENDING,
            message: format!(
                "{} of {} sidecars run this policy",
                sidecars.in_sync, sidecars.assigned
            ),
        }
    };
    let conflict_want = match &plan.shadowed_by {
        Some(other) => Want {
            type_: conditions::CONFLICT,
            ok: true,
            reason: reasons::OVERLAPPING_SELECTOR,
            message: format!(
                "McpServerPolicy {} is older and selects some of the same pods; it wins them",
                other.name
            ),
        },
        None => Want {
            type_: conditions::CONFLICT,
            ok: false,
            reason: reasons::NO_CONFLICT,
            message: String::new(),
        },
    };
    let ready_want = Want {
        type_: conditions::READY,
        ok: compiled_want.ok && sync_want.ok,
        reason: if !compiled_want.ok {
            reasons::COMPILE_ERROR
        } else if !sync_want.ok {
            reasons::PENDING
        } else {
            reasons::PROGRAMMED
        },
        message: if !compiled_want.ok {
            compiled_want.message.clone()
        } else {
            sync_want.message.clone()
        },
    };
    let (reconciling, stalled) = progress(
        !compiled_want.ok,
        compiled_want.ok && !sync_want.ok,
        &ready_want,
    );
    McpServerPolicyStatus {
        observed_generation: plan.generation,
        conditions: merge_conditions(
            &previous.conditions,
            &[
                ready_want,
                compiled_want,
                sync_want,
                conflict_want,
                reconciling,
                stalled,
            ],
            plan.generation,
            now,
        ),
        matched_pods: Some(plan.matched_pods),
        sidecars_in_sync: Some(sidecars.in_sync),
        policy_hash: compiled.map(|c| c.hash.clone()),
    }
}

/// Desired CapabilityException status.
pub fn exception_status(
    plan: &ExceptionPlan,
    previous: &CapabilityExceptionStatus,
    now: Timestamp,
) -> CapabilityExceptionStatus {
    let signature = Want {
        type_: conditions::SIGNATURE_VERIFIED,
        ok: plan.signature_verified,
        reason: if plan.signature_verified {
            reasons::VERIFIED
        } else {
            plan.reason
        },
        message: if plan.signature_verified {
            format!(
                "signed by {}",
                plan.approver.as_deref().unwrap_or("a trusted approver")
            )
        } else {
            plan.message.clone()
        },
    };
    let ready = Want {
        type_: conditions::READY,
        ok: plan.state == ExceptionState::Active,
        reason: plan.reason,
        message: plan.message.clone(),
    };
    // Not yet valid: it becomes active by itself. Expired or invalid: only a new signed spec
    // (or deleting the object) changes anything.
    let (reconciling, stalled) = progress(
        matches!(
            plan.state,
            ExceptionState::Expired | ExceptionState::Invalid
        ),
        plan.state == ExceptionState::NotYetValid,
        &ready,
    );
    let duplicate = Want {
        type_: conditions::DUPLICATE_GRANT,
        ok: !plan.duplicates.is_empty(),
        reason: if plan.duplicates.is_empty() {
            reasons::UNIQUE_GRANT
        } else {
            reasons::DUPLICATE_GRANT
        },
        message: if plan.duplicates.is_empty() {
            String::new()
        } else {
            format!(
                "CapabilityException {} carries the same signed grant: copies share one budget and grant nothing more; delete the copies",
                plan.duplicates.join(", ")
            )
        },
    };
    CapabilityExceptionStatus {
        observed_generation: plan.generation,
        state: Some(plan.state),
        approver: plan.approver.clone(),
        conditions: merge_conditions(
            &previous.conditions,
            &[ready, signature, duplicate, reconciling, stalled],
            plan.generation,
            now,
        ),
    }
}

/// Propagation of one revocation as the operator tracks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Propagation {
    pub target: i32,
    pub acknowledged: i32,
    pub tasks_cancelled: i64,
    pub streams_closed: i64,
    /// When the last targeted sidecar acknowledged (kept once set).
    pub completed_at: Option<Timestamp>,
    pub propagation_millis: Option<i64>,
}

/// Desired PrincipalRevocation status.
pub fn revocation_status(
    generation: Option<i64>,
    propagation: &Propagation,
    previous: &PrincipalRevocationStatus,
    now: Timestamp,
) -> PrincipalRevocationStatus {
    let done = propagation.completed_at.is_some();
    let message = format!(
        "{} of {} targeted sidecars applied it",
        propagation.acknowledged, propagation.target
    );
    let propagated = Want {
        type_: conditions::PROPAGATED,
        ok: done,
        reason: if done {
            reasons::APPLIED
        } else {
            reasons::PROPAGATING
        },
        message: message.clone(),
    };
    let ready = Want {
        type_: conditions::READY,
        ..propagated.clone()
    };
    let (reconciling, stalled) = progress(false, !done, &ready);
    PrincipalRevocationStatus {
        observed_generation: generation,
        conditions: merge_conditions(
            &previous.conditions,
            &[ready, propagated, reconciling, stalled],
            generation,
            now,
        ),
        target_sidecars: Some(propagation.target),
        acknowledged_sidecars: Some(propagation.acknowledged),
        tasks_cancelled: Some(propagation.tasks_cancelled),
        streams_closed: Some(propagation.streams_closed),
        completed_at: propagation.completed_at.map(Time),
        propagation_millis: propagation.propagation_millis,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn want(ok: bool, reason: &'static str) -> Want {
        Want {
            type_: "Ready",
            ok,
            reason,
            message: "m".into(),
        }
    }

    #[test]
    fn last_transition_time_moves_only_when_the_status_flips() {
        let t1 = at("2026-12-01T00:00:00Z");
        let t2 = at("2026-12-01T00:05:00Z");
        let t3 = at("2026-12-01T00:09:00Z");
        let first = merge_conditions(&[], &[want(false, "Pending")], Some(1), t1);
        assert_eq!(first[0].last_transition_time, Time(t1));
        // Same status, new reason and generation: the time stays.
        let second = merge_conditions(&first, &[want(false, "Other")], Some(2), t2);
        assert_eq!(second[0].last_transition_time, Time(t1));
        assert_eq!(second[0].observed_generation, Some(2));
        assert_eq!(second[0].reason, "Other");
        // Flip: the time moves.
        let third = merge_conditions(&second, &[want(true, "Programmed")], Some(2), t3);
        assert_eq!(third[0].last_transition_time, Time(t3));
        assert_eq!(third[0].status, "True");
        // A repeated computation is identical (the reconciler then skips the write).
        assert_eq!(
            merge_conditions(
                &third,
                &[want(true, "Programmed")],
                Some(2),
                t3 + jiff::SignedDuration::from_secs(60)
            ),
            third
        );
    }

    #[test]
    fn revocation_status_reports_propagation_once_complete() {
        let now = at("2026-12-01T00:00:00Z");
        let pending = Propagation {
            target: 3,
            acknowledged: 2,
            tasks_cancelled: 4,
            streams_closed: 1,
            completed_at: None,
            propagation_millis: None,
        };
        let s = revocation_status(Some(1), &pending, &Default::default(), now);
        let propagated = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Propagated")
            .unwrap();
        assert_eq!(
            (propagated.status.as_str(), propagated.reason.as_str()),
            ("False", "Propagating")
        );
        let done = Propagation {
            acknowledged: 3,
            completed_at: Some(now),
            propagation_millis: Some(420),
            ..pending
        };
        let s = revocation_status(Some(1), &done, &s, now);
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Applied")
        );
        assert_eq!(s.propagation_millis, Some(420));
        assert_eq!(s.acknowledged_sidecars, Some(3));
    }
}

#[cfg(test)]
#[path = "status_kstatus_tests.rs"]
mod kstatus_tests;
