//! `reconcile_exception`: `state`, `approver` and the `Ready`/`SignatureVerified` conditions
//! with the reason of each outcome, an Event when Ready changes, and a requeue at the next
//! `notBefore`/`expiresAt` (for followers too, so a new leader is not late).

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::api::CapabilityException;
use crate::operator::controllers::reconcile_exception_at;
use crate::operator::plan::ApproverKeys;

use super::api_server::{Exchange, SSA_QUERY, mock_client};
use super::fixtures::{
    APPROVER_KID, Cluster, NS, Setup, approver_keys, at, event, events_url, exception, policy,
};

const NOW: &str = "2026-12-05T00:00:00Z";
/// Added to every requeue so the reconcile runs just after the flip, not just before.
const AFTER_FLIP: Duration = Duration::from_millis(5);

fn status_url() -> String {
    format!(
        "/apis/lifeguard.dev/v1alpha1/namespaces/{NS}/capabilityexceptions/ex/status{SSA_QUERY}"
    )
}

fn regarding() -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
        "name": "ex", "namespace": NS, "uid": "uid-ex"
    })
}

/// Each outcome of an exception, with what its status must say.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    Active,
    NotYetValid,
    Expired,
    PolicyNotFound,
    NoTrustedKeys,
    BadSignature,
    /// Signed as it is, but a sampling grant without `modelRoute` (stored before the CEL rule).
    InvalidSpec,
}

/// A condition as expected: status, reason, message.
type Expected = (&'static str, &'static str, String);

impl Scenario {
    /// The exception and the cluster around it.
    fn objects(self) -> (CapabilityException, Cluster) {
        let (not_before, expires) = match self {
            Self::NotYetValid => ("2026-12-06T00:00:00Z", "2026-12-10T00:00:00Z"),
            Self::Expired => ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"),
            _ => ("2026-12-01T00:00:00Z", "2026-12-10T00:00:00Z"),
        };
        let policy_name = match self {
            Self::PolicyNotFound => "elsewhere",
            _ => "reports",
        };
        let mut object = exception(policy_name, not_before, expires);
        if let Self::BadSignature = self {
            // Edited after approval.
            object.spec.purpose = "everything".into();
        }
        if let Self::InvalidSpec = self {
            object.spec.model_route = None;
            object.spec.signature = crate::exception::sign(
                &object.spec,
                NS,
                super::fixtures::APPROVER_KEY,
                APPROVER_KID,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
        let cluster = Cluster {
            policies: vec![policy("reports")],
            exceptions: vec![object.clone()],
            keys: match self {
                Self::NoTrustedKeys => ApproverKeys::Missing,
                _ => approver_keys(),
            },
            ..Default::default()
        };
        (object, cluster)
    }

    fn state(self) -> &'static str {
        match self {
            Self::Active => "Active",
            Self::NotYetValid => "NotYetValid",
            Self::Expired => "Expired",
            _ => "Invalid",
        }
    }

    fn ready(self) -> Expected {
        match self {
            Self::Active => (
                "True",
                "Active",
                "in force until 2026-12-10T00:00:00Z".into(),
            ),
            Self::NotYetValid => (
                "False",
                "NotYetValid",
                "valid from 2026-12-06T00:00:00Z".into(),
            ),
            Self::Expired => ("False", "Expired", "expired at 2026-12-01T00:00:00Z".into()),
            Self::PolicyNotFound | Self::NoTrustedKeys | Self::BadSignature | Self::InvalidSpec => {
                self.signature()
            }
        }
    }

    fn signature(self) -> Expected {
        match self {
            Self::Active | Self::NotYetValid | Self::Expired => {
                ("True", "Verified", format!("signed by {APPROVER_KID}"))
            }
            Self::PolicyNotFound => (
                "False",
                "PolicyNotFound",
                format!("McpServerPolicy {NS}/elsewhere does not exist"),
            ),
            Self::NoTrustedKeys => (
                "False",
                "NoTrustedKeys",
                "the operator has no approver keys (approverKeys Secret missing)".into(),
            ),
            Self::InvalidSpec => (
                "False",
                "InvalidSpec",
                format!(
                    "spec.modelRoute: {}",
                    crate::api::rules::SAMPLING_NEEDS_MODEL_ROUTE
                ),
            ),
            Self::BadSignature => (
                "False",
                "BadSignature",
                "signature: does not verify over this grant (edited after approval, or signed \
                 by another key)"
                    .into(),
            ),
        }
    }

    fn verified(self) -> bool {
        matches!(self, Self::Active | Self::NotYetValid | Self::Expired)
    }

    /// The next flip after [`NOW`].
    fn requeue(self) -> Action {
        match self {
            Self::NotYetValid => Action::requeue(Duration::from_secs(86_400) + AFTER_FLIP),
            Self::Expired => Action::await_change(),
            _ => Action::requeue(Duration::from_secs(5 * 86_400) + AFTER_FLIP),
        }
    }

    /// The status the reconcile applies, with condition times `since`.
    fn status(self, since: &str) -> Value {
        let condition = |type_: &str, (status, reason, message): Expected| {
            json!({
                "type": type_, "status": status, "reason": reason, "message": message,
                "observedGeneration": 2, "lastTransitionTime": since
            })
        };
        // kstatus: Reconciling while not yet valid, Stalled once expired or invalid; each
        // with Ready's reason, and Ready's message while True.
        let (_, reason, message) = self.ready();
        let flag = |on: bool| -> Expected {
            (
                if on { "True" } else { "False" },
                reason,
                if on { message.clone() } else { String::new() },
            )
        };
        let stalled = !matches!(self, Self::Active | Self::NotYetValid);
        let mut status = json!({
            "observedGeneration": 2,
            "state": self.state(),
            "conditions": [
                condition("Ready", self.ready()),
                condition("SignatureVerified", self.signature()),
                condition("DuplicateGrant", ("False", "UniqueGrant", String::new())),
                condition("Reconciling", flag(matches!(self, Self::NotYetValid))),
                condition("Stalled", flag(stalled)),
            ]
        });
        if self.verified() {
            status["approver"] = json!(APPROVER_KID);
        }
        status
    }
}

fn with_status(object: &CapabilityException, status: &Value) -> CapabilityException {
    let mut object = object.clone();
    object.status = Some(serde_json::from_value(status.clone()).unwrap_or_else(|e| panic!("{e}")));
    object
}

async fn reconcile(
    object: CapabilityException,
    setup: Setup,
    now: &str,
    script: Vec<Exchange>,
) -> Result<Action, String> {
    let (client, server) = mock_client();
    let served = server.serve(script);
    let result = reconcile_exception_at(Arc::new(object), setup.context(client), at(now)).await;
    served.verify().await;
    result.map_err(|e| e.to_string())
}

/// The apply of `status` and the Event announcing its Ready condition.
fn writes(object: &CapabilityException, scenario: Scenario, status: Value) -> Vec<Exchange> {
    let (ready, reason, message) = scenario.ready();
    let answer = serde_json::to_value(with_status(object, &status)).unwrap_or_default();
    vec![
        Exchange::apply(
            status_url(),
            json!({
                "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
                "status": status
            }),
        )
        .ok(answer),
        Exchange::post(
            events_url(NS),
            event(
                regarding(),
                if ready == "True" { "Normal" } else { "Warning" },
                reason,
                &message,
            ),
        )
        .created(),
    ]
}

const ALL: [Scenario; 7] = [
    Scenario::Active,
    Scenario::NotYetValid,
    Scenario::Expired,
    Scenario::PolicyNotFound,
    Scenario::NoTrustedKeys,
    Scenario::BadSignature,
    Scenario::InvalidSpec,
];

#[tokio::test]
async fn each_outcome_is_written_with_its_reason_and_requeued_at_the_next_flip() {
    for scenario in ALL {
        eprintln!("scenario {scenario:?}");
        let (object, cluster) = scenario.objects();
        let setup = Setup::new(cluster.plan(at(NOW)), true);
        let script = writes(&object, scenario, scenario.status(NOW));
        let action = reconcile(object, setup, NOW, script).await;
        assert_eq!(action, Ok(scenario.requeue()), "{scenario:?}");
    }
}

#[tokio::test]
async fn a_status_that_is_already_right_is_not_written() {
    for scenario in ALL {
        eprintln!("scenario {scenario:?}");
        let (object, cluster) = scenario.objects();
        let setup = Setup::new(cluster.plan(at(NOW)), true);
        let current = with_status(&object, &scenario.status("2026-12-04T00:00:00Z"));
        let action = reconcile(current, setup, NOW, vec![]).await;
        assert_eq!(action, Ok(scenario.requeue()), "{scenario:?}");
    }
}

#[tokio::test]
async fn a_follower_writes_nothing_but_still_requeues_at_the_flip() {
    for scenario in ALL {
        eprintln!("scenario {scenario:?}");
        let (object, cluster) = scenario.objects();
        let setup = Setup::new(cluster.plan(at(NOW)), false);
        let action = reconcile(object, setup, NOW, vec![]).await;
        assert_eq!(action, Ok(scenario.requeue()), "{scenario:?}");
    }
}

#[tokio::test]
async fn the_clock_wins_over_a_plan_computed_just_before_the_flip() {
    // Planned while not yet valid; reconciled right after notBefore, before the next plan.
    let (object, cluster) = Scenario::NotYetValid.objects();
    let planned = cluster.plan(at("2026-12-05T23:59:59Z"));
    let now = "2026-12-06T00:00:00.005Z";
    // `metav1.Time` is written to the second.
    let status = json!({
        "observedGeneration": 2,
        "state": "Active",
        "approver": APPROVER_KID,
        "conditions": [
            {
                "type": "Ready", "status": "True", "reason": "Active",
                "message": "in force until 2026-12-10T00:00:00Z",
                "observedGeneration": 2, "lastTransitionTime": "2026-12-06T00:00:00Z"
            },
            {
                "type": "SignatureVerified", "status": "True", "reason": "Verified",
                "message": format!("signed by {APPROVER_KID}"),
                "observedGeneration": 2, "lastTransitionTime": "2026-12-06T00:00:00Z"
            },
            {
                "type": "DuplicateGrant", "status": "False", "reason": "UniqueGrant",
                "message": "", "observedGeneration": 2,
                "lastTransitionTime": "2026-12-06T00:00:00Z"
            },
            {
                "type": "Reconciling", "status": "False", "reason": "Active", "message": "",
                "observedGeneration": 2, "lastTransitionTime": "2026-12-06T00:00:00Z"
            },
            {
                "type": "Stalled", "status": "False", "reason": "Active", "message": "",
                "observedGeneration": 2, "lastTransitionTime": "2026-12-06T00:00:00Z"
            }
        ]
    });
    let script = writes(&object, Scenario::Active, status);
    let action = reconcile(object, Setup::new(planned, true), now, script).await;
    // Next flip: expiresAt, 3 days 23:59:59.995 away.
    assert_eq!(
        action,
        Ok(Action::requeue(
            Duration::from_secs(4 * 86_400) - Duration::from_millis(5) + AFTER_FLIP
        ))
    );
}

#[tokio::test]
async fn a_copy_of_a_signed_grant_under_another_name_is_flagged_on_both() {
    // The same signed spec under a second name verifies (the name is not signed): both
    // objects are flagged DuplicateGrant, naming the other; both stay Active (they share one
    // budget, so the copy grants nothing more).
    let (object, mut cluster) = Scenario::Active.objects();
    let mut copy = object.clone();
    copy.metadata.name = Some("ex-copy".into());
    copy.metadata.uid = Some("uid-ex-copy".into());
    cluster.exceptions.push(copy);
    let setup = Setup::new(cluster.plan(at(NOW)), true);
    let mut status = Scenario::Active.status(NOW);
    status["conditions"][2] = json!({
        "type": "DuplicateGrant", "status": "True", "reason": "DuplicateGrant",
        "message": "CapabilityException ex-copy carries the same signed grant: copies share one budget and grant nothing more; delete the copies",
        "observedGeneration": 2, "lastTransitionTime": NOW
    });
    let script = writes(&object, Scenario::Active, status);
    let action = reconcile(object, setup, NOW, script).await;
    assert_eq!(action, Ok(Scenario::Active.requeue()));
}
