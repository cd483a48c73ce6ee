use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::PrincipalRevocationStatus;

const OURS: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const THEIRS: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn now() -> Timestamp {
    "2026-12-01T12:00:00Z".parse().unwrap()
}

fn revocation(name: &str, annotation: Option<&str>) -> PrincipalRevocation {
    let mut r: PrincipalRevocation = serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "12"},
        "spec": {
            "issuer": "https://idp.example.com", "subject": "alice",
            "revokedBefore": "2026-12-01T00:00:00Z", "reason": "sessionRevoked",
            "source": {"kind": "manual"}
        }
    }))
    .unwrap();
    if let Some(value) = annotation {
        r.metadata.annotations = Some(BTreeMap::from([(
            TRACEPARENT_ANNOTATION.to_owned(),
            value.to_owned(),
        )]));
    }
    r
}

fn shared(items: Vec<PrincipalRevocation>) -> Vec<Arc<PrincipalRevocation>> {
    items.into_iter().map(Arc::new).collect()
}

fn names(found: &[&PrincipalRevocation]) -> Vec<String> {
    found.iter().map(|r| name_of(r).to_owned()).collect()
}

#[test]
fn the_annotation_is_a_hint_only_when_it_is_a_traceparent() {
    assert_eq!(hint(&revocation("a", None)), TraceHint::Missing);
    assert_eq!(
        hint(&revocation("a", Some(OURS))),
        TraceHint::Valid(OURS.into())
    );
    for bad in ["", "yes", "00-zz", &OURS.to_uppercase()] {
        assert_eq!(
            hint(&revocation("a", Some(bad))),
            TraceHint::Invalid,
            "{bad}"
        );
    }
}

#[test]
fn only_unannotated_revocations_in_flight_need_a_trace_and_each_object_gets_one() {
    let mut completed = revocation("done", None);
    completed.status = Some(PrincipalRevocationStatus {
        completed_at: Some(Time(now())),
        ..PrincipalRevocationStatus::default()
    });
    let mut expired = revocation("expired", None);
    expired.spec.expires_at = Some(Time(now()));
    let all = shared(vec![
        revocation("fresh", None),
        revocation("annotated", Some(THEIRS)),
        revocation("garbage", Some("not a traceparent")),
        completed,
        expired,
    ]);
    let mut started = StartedTraces::default();
    assert_eq!(names(&started.needing_trace(&all, now())), ["fresh"]);

    started.record(&all[0], OURS.into());
    assert!(started.needing_trace(&all, now()).is_empty());
    // The same name for a new object (deleted and re-created) is a new revocation.
    let mut recreated = revocation("fresh", None);
    recreated.metadata.uid = Some("uid-fresh-2".into());
    let again = shared(vec![recreated]);
    assert_eq!(names(&started.needing_trace(&again, now())), ["fresh"]);
}

#[test]
fn snapshots_carry_the_annotation_else_the_trace_started_here_and_nothing_for_garbage() {
    let all = shared(vec![
        revocation("fresh", None),
        revocation("annotated", Some(THEIRS)),
        revocation("garbage", Some("not a traceparent")),
        revocation("untraced", None),
    ]);
    let mut started = StartedTraces::default();
    started.record(&all[0], OURS.into());
    assert_eq!(
        started.traces(&all, now()),
        BTreeMap::from([
            ("annotated".to_owned(), THEIRS.to_owned()),
            ("fresh".to_owned(), OURS.to_owned()),
        ])
    );
}

#[test]
fn an_annotation_written_meanwhile_wins_over_the_trace_started_here() {
    let mut started = StartedTraces::default();
    started.record(&revocation("r", None), OURS.into());
    // Someone annotated the object before the leader's patch landed: theirs is kept, and ours
    // is forgotten.
    let annotated = shared(vec![revocation("r", Some(THEIRS))]);
    assert_eq!(started.traces(&annotated, now())["r"], THEIRS);
    started.settle(&annotated, now());
    assert!(started.started.is_empty());
}

#[test]
fn settling_forgets_traces_of_objects_gone_or_replaced() {
    let mut started = StartedTraces::default();
    started.record(&revocation("kept", None), OURS.into());
    started.record(&revocation("gone", None), OURS.into());
    started.record(&revocation("replaced", None), OURS.into());
    let mut replaced = revocation("replaced", None);
    replaced.metadata.uid = Some("uid-replaced-2".into());
    let now_there = shared(vec![revocation("kept", None), replaced]);
    started.settle(&now_there, now());
    assert_eq!(
        started.started.keys().collect::<Vec<_>>(),
        [&"kept".to_owned()]
    );
    assert_eq!(started.traces(&now_there, now()).len(), 1);
}

#[test]
fn an_unusable_annotation_is_reported_once_per_object() {
    let all = shared(vec![
        revocation("garbage", Some("not a traceparent")),
        revocation("fine", Some(OURS)),
    ]);
    let mut started = StartedTraces::default();
    assert_eq!(names(&started.newly_ignored(&all)), ["garbage"]);
    assert!(started.newly_ignored(&all).is_empty());
    // Once the object is gone it is forgotten: a new one of that name is reported again.
    started.settle(&[], now());
    assert_eq!(names(&started.newly_ignored(&all)), ["garbage"]);
}

#[test]
fn the_patch_adds_the_annotation_only_and_is_preconditioned_on_the_object_read() {
    assert_eq!(
        annotation_patch("uid-1", "42", OURS),
        json!({"metadata": {
            "uid": "uid-1", "resourceVersion": "42",
            "annotations": {"lifeguard.dev/traceparent": OURS}
        }})
    );
}

#[test]
fn spans_name_the_reason_as_the_object_spells_it() {
    assert_eq!(reason_label(&revocation("r", None)), "sessionRevoked");
}

#[test]
fn a_revocations_trace_is_its_annotation_else_the_plans_and_never_garbage() {
    let plan = BTreeMap::from([("r".to_owned(), OURS.to_owned())]);
    assert_eq!(
        trace_of(&revocation("r", None), &plan).as_deref(),
        Some(OURS)
    );
    assert_eq!(
        trace_of(&revocation("r", Some(THEIRS)), &plan).as_deref(),
        Some(THEIRS)
    );
    assert_eq!(trace_of(&revocation("r", Some("junk")), &plan), None);
    assert_eq!(trace_of(&revocation("other", None), &plan), None);
}
