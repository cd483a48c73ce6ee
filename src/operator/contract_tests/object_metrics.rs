//! The per-object gauges (`object_metrics`): what a scrape of the leader shows for policies,
//! exceptions and revocations, that a follower shows only the descriptors, and the pure state
//! behind them.

use jiff::Timestamp;

use crate::operator::controllers::Context;
use crate::operator::object_metrics::{ExceptionExpiry, object_state, sidecars_of};
use crate::operator::propagation::FirstSight;
use crate::operator::status::PolicySidecars;

use super::api_server::mock_client;
use super::fixtures::{
    Cluster, NS, Setup, acknowledged, approver_keys, at, compiled_hash, exception, key, pod, policy,
};

const NOW: &str = "2026-12-05T00:00:00Z";
/// Far enough ahead that the collector's own clock still finds the exception usable.
const EXPIRES: &str = "2099-01-01T00:00:00Z";
const OBSERVED: &str = "2026-12-04T23:59:59.5Z";

/// Policy `reports` winning pods `reports-0` and `reports-1` (only `reports-0` acknowledged
/// its hash), exception `ex` for it, revocation `rev` waiting for `reports-1`, and `done`,
/// a revocation whose only target acknowledged it.
fn setup(leading: bool) -> Setup {
    let cluster = Cluster {
        policies: vec![policy("reports")],
        exceptions: vec![exception("reports", "2026-12-01T00:00:00Z", EXPIRES)],
        pods: vec![pod("reports-0"), pod("reports-1")],
        keys: approver_keys(),
        ..Default::default()
    };
    let plan = cluster.plan(at(NOW));
    let hash = compiled_hash(&plan, "reports");
    let mut setup = Setup::new(plan, leading);
    let first = FirstSight {
        created: Some(at(OBSERVED)),
        recorded_completion: None,
    };
    setup.tracker.observe("rev", &first, at(OBSERVED), || {
        [key("reports-0"), key("reports-1")].into()
    });
    setup
        .tracker
        .observe("done", &first, at(OBSERVED), || [key("reports-0")].into());
    acknowledged(
        &setup.sessions,
        "reports-0",
        Some(&hash),
        &[("rev", 1, 0), ("done", 0, 0)],
    );
    setup.pods = vec![pod("reports-0"), pod("reports-1")];
    setup
}

/// Lets the tracker see `done` complete, as a reconcile would.
fn progress(ctx: &Context) {
    let reported = [key("reports-0")].into();
    let pods = [key("reports-0"), key("reports-1")].into();
    let mut tracker = ctx.tracker.lock().unwrap_or_else(|e| e.into_inner());
    tracker.progress("done", &reported, &pods, 0, 0, at(NOW));
    tracker.progress("rev", &reported, &pods, 1, 0, at(NOW));
}

fn samples(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.contains("_policy_sidecars_")
                    || l.contains("_exception_expiry_")
                    || l.contains("_revocation_pending_"))
        })
        .collect()
}

#[tokio::test]
async fn the_leader_exports_sidecars_per_policy_exception_expiry_and_pending_revocations() {
    let (client, _server) = mock_client();
    let ctx = setup(true).context(client);
    progress(&ctx);
    let text = ctx.metrics.encode();
    let expires = at(EXPIRES).as_second();
    let observed = at(OBSERVED).as_millisecond() as f64 / 1000.0;
    assert_eq!(
        samples(&text),
        vec![
            format!(
                "lifeguard_operator_policy_sidecars_selected{{namespace=\"{NS}\",policy=\"reports\"}} 2"
            ),
            format!(
                "lifeguard_operator_policy_sidecars_in_sync{{namespace=\"{NS}\",policy=\"reports\"}} 1"
            ),
            format!(
                "lifeguard_operator_exception_expiry_timestamp_seconds{{namespace=\"{NS}\",exception=\"ex\",capability=\"sampling\"}} {expires}.0"
            ),
            // `done` completed: only `rev` is pending.
            format!(
                "lifeguard_operator_revocation_pending_since_timestamp_seconds{{revocation=\"rev\"}} {observed}"
            ),
        ],
        "{text}"
    );
}

#[tokio::test]
async fn a_follower_exports_the_descriptors_without_series() {
    let (client, _server) = mock_client();
    let ctx = setup(false).context(client);
    let text = ctx.metrics.encode();
    assert_eq!(samples(&text), Vec::<&str>::new(), "{text}");
    for name in [
        "policy_sidecars_selected",
        "policy_sidecars_in_sync",
        "exception_expiry_timestamp_seconds",
        "revocation_pending_since_timestamp_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE lifeguard_operator_{name} gauge")),
            "{name} missing:\n{text}"
        );
    }
}

#[test]
fn only_usable_unexpired_exceptions_have_an_expiry_and_empty_policies_show_zeros() {
    let mut expired = exception("reports", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z");
    expired.metadata.name = Some("old".into());
    let mut unsigned = exception("reports", "2026-12-01T00:00:00Z", EXPIRES);
    unsigned.metadata.name = Some("unsigned".into());
    unsigned.spec.signature = "not-a-signature".into();
    let mut usable = exception("reports", "2026-12-06T00:00:00Z", "2026-12-07T00:00:00Z");
    usable.metadata.name = Some("later".into());
    let cluster = Cluster {
        policies: vec![policy("reports")],
        exceptions: vec![expired, unsigned, usable],
        keys: approver_keys(),
        ..Default::default()
    };
    let now = at(NOW);
    let plan = cluster.plan(now);
    let pending = vec![
        ("b".to_owned(), at(OBSERVED)),
        ("a".to_owned(), at(OBSERVED)),
    ];
    let state = object_state(&plan, |_, _| true, pending, now);
    assert_eq!(
        state.policies.get(&key("reports")),
        Some(&PolicySidecars {
            assigned: 0,
            in_sync: 0
        })
    );
    // Not yet valid still warns about its end; expired and unverifiable ones do not.
    assert_eq!(
        state.exceptions,
        vec![ExceptionExpiry {
            exception: key("later"),
            capability: crate::api::ExceptionCapability::Sampling,
            expires_at: at("2026-12-07T00:00:00Z"),
        }]
    );
    let names: Vec<&str> = state
        .pending_revocations
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    // At the instant it expires, an exception is gone from the gauge.
    let state = object_state(&plan, |_, _| true, vec![], at("2026-12-07T00:00:00Z"));
    assert_eq!(state.exceptions, Vec::<ExceptionExpiry>::new());
    let _: Option<Timestamp> = None;
}

#[test]
fn the_gauges_count_sidecars_as_the_status_does() {
    let mut other = policy("other");
    other.metadata.name = Some("other".into());
    let cluster = Cluster {
        policies: vec![policy("reports"), other],
        pods: vec![pod("reports-0"), pod("reports-1"), pod("reports-2")],
        ..Default::default()
    };
    let plan = cluster.plan(at(NOW));
    let in_sync = |pod: &crate::policy::ObjectKey, _: &str| pod.name != "reports-1";
    let state = object_state(&plan, in_sync, vec![], at(NOW));
    assert_eq!(state.policies.len(), 2);
    for (key, counts) in &state.policies {
        assert_eq!(*counts, sidecars_of(&plan, key, in_sync), "{key:?}");
    }
    let total: i32 = state.policies.values().map(|c| c.assigned).sum();
    assert_eq!(total, 3, "each pod counts for the one policy that wins it");
}
