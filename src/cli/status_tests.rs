use super::*;
use serde_json::{Value, json};

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

const NOW: &str = "2026-12-01T12:00:00Z";

fn condition(type_: &str, status: &str, reason: &str, message: &str, generation: i64) -> Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "observedGeneration": generation, "lastTransitionTime": "2026-12-01T11:00:00Z",
    })
}

fn policy(namespace: &str, name: &str, generation: i64, status: Value) -> McpServerPolicy {
    serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
        "metadata": {"name": name, "namespace": namespace, "generation": generation},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "resource": "https://reports.example.com/mcp",
            "identity": {"issuers": [{"issuer": "https://idp.example.com", "jwksUri": "https://idp.example.com/jwks"}]},
        },
        "status": status,
    }))
    .unwrap()
}

fn exception(name: &str, expires_at: &str, status: Value) -> CapabilityException {
    serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
        "metadata": {"name": name, "namespace": "team-a", "generation": 1},
        "spec": {
            "policyRef": {"name": "reports"}, "capability": "sampling", "clients": ["console"],
            "purpose": "summaries", "modelRoute": "gateway/summaries", "limits": {"maxTokens": 10, "maxIterationsPerTask": 1, "maxRequestsPerMinute": 1},
            "notBefore": "2026-11-30T00:00:00Z", "expiresAt": expires_at,
            "approvalId": "CHG-1", "signature": "x..y",
        },
        "status": status,
    }))
    .unwrap()
}

fn revocation(name: &str, created: &str, status: Value) -> PrincipalRevocation {
    serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
        "metadata": {"name": name, "generation": 1, "creationTimestamp": created},
        "spec": {
            "issuer": "https://idp.example.com", "subject": name, "tenant": "tenant-a",
            "revokedBefore": created, "reason": "sessionRevoked", "source": {"kind": "manual"},
        },
        "status": status,
    }))
    .unwrap()
}

fn sample() -> StatusReport {
    let policies = [
        policy(
            "team-a",
            "reports",
            2,
            json!({"observedGeneration": 2, "matchedPods": 3, "sidecarsInSync": 3,
                   "policyHash": "3f9a0c12de45aa77bb",
                   "conditions": [condition("Ready", "True", "AllInSync", "3 of 3", 2)]}),
        ),
        policy(
            "team-a",
            "billing",
            1,
            json!({"observedGeneration": 1, "matchedPods": 2, "sidecarsInSync": 1,
                   "policyHash": "77aa",
                   "conditions": [condition("Ready", "False", "Pending", "1 of 2 sidecars run this policy", 1),
                                  condition("Conflict", "True", "OverlappingSelector", "policy reports selects pod x", 1)]}),
        ),
        policy("team-a", "fresh", 1, Value::Null),
    ];
    let exceptions = [
        exception(
            "summaries",
            "2026-12-03T14:30:00Z",
            json!({"state": "Active", "approver": "security-approver-1",
                   "conditions": [condition("Ready", "True", "Active", "", 1)]}),
        ),
        exception(
            "roots-old",
            "2026-11-30T12:00:00Z",
            json!({"state": "Expired"}),
        ),
        exception(
            "forged",
            "2026-12-01T12:45:00Z",
            json!({"state": "Invalid",
                   "conditions": [condition("Ready", "False", "BadSignature", "the signature does not verify", 1)]}),
        ),
    ];
    let revocations = [
        revocation(
            "alice",
            "2026-12-01T11:58:00Z",
            json!({"observedGeneration": 1, "targetSidecars": 10, "acknowledgedSidecars": 7,
                   "conditions": [condition("Propagated", "False", "Propagating", "7 of 10", 1)]}),
        ),
        revocation(
            "bob",
            "2026-12-01T10:00:00Z",
            json!({"observedGeneration": 1, "targetSidecars": 2, "acknowledgedSidecars": 2,
                   "completedAt": "2026-12-01T10:00:01Z",
                   "conditions": [condition("Propagated", "True", "Applied", "2 of 2", 1)]}),
        ),
        revocation("carol", "2026-12-01T11:59:30Z", Value::Null),
    ];
    StatusReport::new(
        Some("team-a".into()),
        &policies,
        &exceptions,
        &revocations,
        at(NOW),
    )
}

#[test]
fn the_table_shows_policies_unexpired_exceptions_and_revocations_in_progress() {
    let expected = "\
McpServerPolicies in namespace team-a:
NAMESPACE   NAME      READY     REASON      PODS   IN-SYNC   VERSION
team-a      billing   False     Pending     2      1/2       77aa
team-a      fresh     Unknown   -           -      -         -
team-a      reports   True      AllInSync   3      3/3       3f9a0c12de45
  ! team-a/billing: 1 of 2 sidecars run this policy
  ! team-a/billing: conflict: policy reports selects pod x
  ! team-a/fresh: no status yet; is the Lifeguard operator running?

CapabilityExceptions in namespace team-a:
NAMESPACE   NAME        POLICY    CAPABILITY   STATE     EXPIRES                EXPIRES-IN   APPROVER
team-a      forged      reports   sampling     Invalid   2026-12-01T12:45:00Z   45m          -
team-a      summaries   reports   sampling     Active    2026-12-03T14:30:00Z   2d2h         security-approver-1
  ! team-a/forged: BadSignature: the signature does not verify
(1 expired exception not shown)

PrincipalRevocations in progress (cluster-wide):
NAME    ISSUER                    SUBJECT                   REASON           PROPAGATED   AGE
alice   https://idp.example.com   alice [tenant=tenant-a]   sessionRevoked   7/10         2m
carol   https://idp.example.com   carol [tenant=tenant-a]   sessionRevoked   -            30s
  ! carol: no status yet; is the Lifeguard operator running?
(1 completed revocation not shown)
";
    assert_eq!(sample().render(), expected);
}

#[test]
fn json_lists_everything_with_flags_for_what_the_table_leaves_out() {
    let json = serde_json::to_value(sample()).unwrap();
    assert_eq!(json["namespace"], "team-a");
    assert_eq!(json["policies"].as_array().unwrap().len(), 3);
    let reports = &json["policies"][2];
    assert_eq!(reports["name"], "reports");
    assert_eq!(reports["ready"], "True");
    assert_eq!(reports["matchedPods"], 3);
    assert_eq!(reports["sidecarsInSync"], 3);
    assert_eq!(reports["policyHash"], "3f9a0c12de45aa77bb");
    assert_eq!(reports["upToDate"], true);
    let exceptions = json["exceptions"].as_array().unwrap();
    assert_eq!(exceptions.len(), 3);
    assert_eq!(exceptions[0]["name"], "roots-old");
    assert_eq!(exceptions[0]["expired"], true);
    assert_eq!(
        exceptions[2]["expiresInSeconds"],
        2 * 86_400 + 2 * 3600 + 30 * 60
    );
    assert_eq!(exceptions[2]["expiresAt"], "2026-12-03T14:30:00Z");
    let revocations = json["revocations"].as_array().unwrap();
    let names: Vec<&str> = revocations
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bob", "alice", "carol"], "oldest first");
    assert_eq!(revocations[0]["complete"], true);
    assert_eq!(revocations[1]["acknowledgedSidecars"], 7);
    assert_eq!(revocations[1]["ageSeconds"], 120);
    assert_eq!(revocations[2]["observed"], false);
}

#[test]
fn a_status_for_an_older_generation_is_called_out() {
    let stale = policy(
        "team-a",
        "reports",
        3,
        json!({"observedGeneration": 2, "matchedPods": 1, "sidecarsInSync": 1,
               "conditions": [condition("Ready", "True", "AllInSync", "", 2)]}),
    );
    let row = PolicyRow::new(&stale);
    assert!(!row.up_to_date);
    let report = StatusReport::new(None, &[stale], &[], &[], at(NOW));
    let text = report.render();
    assert!(
        text.starts_with("McpServerPolicies in all namespaces:\n"),
        "{text}"
    );
    assert!(
        text.contains("  ! team-a/reports: the status describes an older generation"),
        "{text}"
    );
}

#[test]
fn empty_sections_say_so() {
    let text = StatusReport::new(Some("default".into()), &[], &[], &[], at(NOW)).render();
    assert_eq!(
        text,
        "No McpServerPolicies in namespace default.\n\n\
         No unexpired CapabilityExceptions in namespace default.\n\n\
         No PrincipalRevocations in progress (cluster-wide).\n"
    );
}

#[test]
fn durations_read_like_kubectl_ages() {
    let cases = [
        (0, "0s"),
        (59, "59s"),
        (60, "1m"),
        (450, "7m30s"),
        (600, "10m"),
        (3599, "59m"),
        (3600, "1h"),
        (7500, "2h5m"),
        (36_000 + 120, "10h"),
        (86_400 * 3 + 3600 * 4, "3d4h"),
        (86_400 * 40 + 5, "40d"),
        (-300, "expired 5m ago"),
    ];
    for (seconds, text) in cases {
        assert_eq!(human_duration(seconds), text, "{seconds}");
    }
}

#[test]
fn tables_pad_to_the_widest_cell_and_trim_line_ends() {
    let mut out = String::new();
    table(
        &mut out,
        &["A", "LONG-HEADER", "C"],
        &[
            vec!["wide-cell".into(), "x".into(), "".into()],
            vec!["é".into(), "y".into(), "z".into()],
        ],
    );
    assert_eq!(
        out,
        "A           LONG-HEADER   C\nwide-cell   x\né           y             z\n"
    );
}

#[test]
fn principals_show_their_narrowing() {
    assert_eq!(principal_label(Some("alice"), None, None), "alice");
    assert_eq!(
        principal_label(Some("alice"), Some("t1"), Some("console")),
        "alice [tenant=t1 client=console]"
    );
    assert_eq!(
        principal_label(Some("alice"), None, Some("c")),
        "alice [client=c]"
    );
}
